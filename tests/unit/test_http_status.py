"""
The status document (L{jesync.http.status}) on a Clock: its fields, its
top (most waiters, then most holders), found again only when the table
changed and, when finding it is costly, not more often than its cost
allows; and the two files served without a token.
"""

from __future__ import annotations

import gc
import weakref
from importlib import resources

from twisted.trial.unittest import SynchronousTestCase

from jesync.http import coordination, status, streams
from jesync.http.state import CHEAP_PASS, PASS_SHARE
from jesync.service import LockService
from jesync.wire import SHARED
from tests.http_unit import UnitApi

ROUTES = streams.ROUTES + coordination.ROUTES + status.ROUTES


def package_file(name: str) -> bytes:
    return resources.files("jesync.http").joinpath(name).read_bytes()


class StatusDocumentTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)
        self.locks = self.server.locks

    def test_fields(self) -> None:
        """The server's own part (describe), with totals, sessions, connections and the top."""
        self.locks.request("a", "x", 2, 0, 0)
        self.locks.request("a", "y", 2, 0, 0)
        self.locks.request("a", "z", 1, -1, 0)
        self.server.session()
        document = self.server.ask("GET", "/v1/status").json()
        self.assertEqual(document["server"], self.server.describe()["server"])
        self.assertEqual(document["limits"], {"max_connections": None, "http_max_wait": 60.0})
        self.assertEqual(document["totals"], {"keys": 1, "holders": 2, "waiters": 1})
        self.assertEqual(document["sessions"], {"total": 1, "detached": 1})
        self.assertEqual(document["connections"], 0)
        self.assertEqual(document["top"], [{"key": "a", "mode": "exclusive", "holders": 2, "waiters": 1}])

    def test_top_order(self) -> None:
        """Most waiters first, then most holders, then by key; at most 20; a shared key's mode; waiters only: null."""
        for index in range(25):
            self.locks.request(f"held{index:02}", "x", 1, 0, 0)
        self.locks.request("shared", "x", 1, 0, 0, SHARED)
        self.locks.request("shared", "y", 1, 0, 0, SHARED)
        self.locks.request_many(["held03", "waited"], "w", -1, 0)
        self.locks.request("held07", "v", 1, -1, 0)
        self.locks.request("held07", "u", 1, -1, 0)
        top = self.server.ask("GET", "/v1/status").json()["top"]
        self.assertEqual(len(top), 20)
        self.assertEqual(
            top[:4],
            [
                {"key": "held07", "mode": "exclusive", "holders": 1, "waiters": 2},
                {"key": "held03", "mode": "exclusive", "holders": 1, "waiters": 1},
                {"key": "waited", "mode": None, "holders": 0, "waiters": 1},
                {"key": "shared", "mode": "shared", "holders": 2, "waiters": 0},
            ],
        )
        self.assertEqual({row["holders"] for row in top[4:]}, {1})

    def test_top_kept_per_version(self) -> None:
        """The table not changed (a renewal is no change): no new pass; changed: a new one."""
        passes = []
        busiest = self.locks.busiest

        def counted(count: int):
            passes.append(count)
            return busiest(count)

        self.locks.busiest = counted  # type: ignore[method-assign]
        self.locks.request("a", "x", 1, 0, 10)
        self.server.ask("GET", "/v1/status")
        self.locks.request("a", "x", 1, 0, 10)
        self.server.ask("GET", "/v1/status")
        self.assertEqual(passes, [20])
        self.locks.request("b", "x", 1, 0, 10)
        self.assertEqual([row["key"] for row in self.server.ask("GET", "/v1/status").json()["top"]], ["a", "b"])
        self.assertEqual(passes, [20, 20])

    def test_costly_top_throttled(self) -> None:
        """
        A pass that took long is not redone within 20 times its time; its
        keys are shown meanwhile with their counts of now.
        """
        self.locks.request("a", "x", 1, 0, 0)
        self.locks.request("a", "y", 1, -1, 0)
        self.server.ask("GET", "/v1/status")
        busiest = self.server.context.busiest_keys
        busiest.cost = 0.1  # (as at a million keys or so)
        self.locks.request("b", "x", 1, 0, 0)
        self.locks.request("a", "z", 1, -1, 0)
        top = self.server.ask("GET", "/v1/status").json()["top"]
        self.assertEqual(top, [{"key": "a", "mode": "exclusive", "holders": 1, "waiters": 2}])
        self.server.clock.advance(0.1 * PASS_SHARE)
        top = self.server.ask("GET", "/v1/status").json()["top"]
        self.assertEqual([row["key"] for row in top], ["a", "b"])
        self.assertLessEqual(busiest.cost, CHEAP_PASS)

    def test_each_server_its_own_top(self) -> None:
        """
        Two servers in one process keep a top each: two tables at the same
        version show their own keys (a top shared would show the first's).
        """
        other = UnitApi(ROUTES)
        self.locks.request("here", "x", 1, 0, 0)
        other.locks.request("there", "x", 1, 0, 0)
        self.assertEqual(self.locks.version, other.locks.version)
        tops = [[row["key"] for row in server.ask("GET", "/v1/status").json()["top"]] for server in (self.server, other)]
        self.assertEqual(tops, [["here"], ["there"]])

    def test_gone_with_its_server(self) -> None:
        """
        What a server's API keeps (its top, its last status document, its
        election's observers) goes with it: once its streams have ended,
        nothing else holds its context.
        """
        server = UnitApi(ROUTES)
        server.locks.request("k", "x", 1, 0, 0)
        self.assertEqual(len(server.ask("GET", "/v1/status").json()["top"]), 1)
        streams = [server.connect(), server.connect()]
        streams[0].send("GET", "/v1/status/stream")
        streams[1].send("GET", "/v1/elections/e/observe")
        self.assertEqual([client.response().events()[0][0] for client in streams], ["status", "leader"])
        for client in streams:
            client.lose()
        context = weakref.ref(server.context)
        del server, streams, client
        gc.collect()
        self.assertIsNone(context())

    def test_busiest(self) -> None:
        """LockService.busiest: one pass, most waiters then most holders."""
        locks = LockService(self.server.clock)
        for key, holders, waiters in [("a", 1, 0), ("b", 3, 0), ("c", 1, 2), ("d", 2, 2)]:
            for index in range(holders):
                locks.request(key, f"h{index}", holders, 0, 0)
            for index in range(waiters):
                locks.request(key, f"w{index}", holders, -1, 0)
        self.assertEqual([tuple(row) for row in locks.busiest(3)], [("d", 2, 2), ("c", 1, 2), ("b", 3, 0)])
        self.assertEqual(locks.busiest(0), [])


class PackageFileTests(SynchronousTestCase):
    """GET / and GET /v1/openapi.json: package data, served without a token, while the status needs one."""

    def setUp(self) -> None:
        self.server = UnitApi(ROUTES, auth_token=b"secret")

    def test_page(self) -> None:
        response = self.server.ask("GET", "/")
        self.assertEqual((response.status, response.headers["content-type"]), (200, "text/html; charset=utf-8"))
        self.assertEqual(response.body, package_file("status.html"))

    def test_openapi(self) -> None:
        response = self.server.ask("GET", "/v1/openapi.json")
        self.assertEqual((response.status, response.headers["content-type"]), (200, "application/json"))
        self.assertEqual(response.json(), __import__("json").loads(package_file("openapi.json")))

    def test_status_needs_the_token(self) -> None:
        for path in ("/v1/status", "/v1/status/stream", "/v1/watch?key=k", "/v1/groups", "/v1/elections/e"):
            response = self.server.ask("GET", path)
            self.assertEqual((response.status, response.json()["code"]), (401, "unauthorized"), path)
        self.assertEqual(self.server.ask("GET", "/v1/status", token="secret").status, 200)
