"""
The HTTP API's input rules on a Clock, through twisted.web's channel: a
number is finite and at most what the line protocols accept (a lock that
expires at infinity would wedge its key and its session), a list of keys
holds strings, a body nested too deeply is not JSON; a long poll whose
session ends while it waits answers C{404 no_such_session}; and a fuzz of
every field of every POST route with arbitrary JSON values: never a
C{500}, every reply as the OpenAPI document says.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from jesync.http import coordination, locks, status, streams
from jesync.wire import LARGEST_NUMBER
from tests.http_unit import UnitApi

ROUTES = locks.ROUTES + coordination.ROUTES + streams.ROUTES + status.ROUTES


class NumberTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)
        self.session = self.server.session(ttl=10)

    def assertInvalid(self, path: str, body: Any, parameter: str) -> None:
        response = self.server.ask("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode())
        self.assertEqual((response.status, response.json()["code"]), (400, "invalid_parameter"), response.body)
        self.assertEqual(response.json()["parameter"], parameter)

    def test_huge_expires_wedges_nothing(self) -> None:
        """
        The reviewer's scenario: an acquire with C{expires} 1e308 (or
        Infinity, 1e309, 10**400) and a renew with Infinity are refused;
        the key stays free for others, and the session's TTL still ends it.
        """
        session = f'"session":"{self.session}"'.encode()
        for expires in (b"1e308", b"Infinity", b"1e309", b"1" + b"0" * 400, str(LARGEST_NUMBER + 1).encode()):
            self.assertInvalid("/v1/acquire", b'{' + session + b',"key":"k","expires":' + expires + b"}", "expires")
        self.assertEqual(self.server.locks.holders("k"), [])
        acquired = self.server.ask("POST", "/v1/acquire", {"session": self.session, "key": "k", "expires": LARGEST_NUMBER})
        self.assertEqual(acquired.status, 200)
        self.assertEqual(acquired.json()["grants"][0]["expires_in"], LARGEST_NUMBER)
        self.assertInvalid("/v1/renew", b'{' + session + b',"key":"k","expires":Infinity}', "expires")
        self.assertEqual(self.server.ask("POST", "/v1/renew", {"session": self.session, "key": "k", "expires": 1e9}).status, 200)
        other = self.server.session(ttl=100)
        self.assertEqual(self.server.ask("POST", "/v1/acquire", {"session": other, "key": "k"}).status, 409)
        self.assertEqual(self.server.ask("GET", "/v1/locks/k").status, 200)
        self.server.clock.advance(10)
        self.assertIsNone(self.server.sessions.find(self.session))
        self.assertEqual(len(self.server.sessions), 1)
        self.assertEqual(self.server.ask("POST", "/v1/acquire", {"session": other, "key": "k"}).status, 200)
        self.assertEqual(self.server.ask("POST", "/v1/release", {"session": other, "key": "k"}).status, 200)

    def test_every_number_bounded(self) -> None:
        """ttl, wait and max_concurrent: finite and at most what JESync accepts, else 400 invalid_parameter."""
        self.assertInvalid("/v1/sessions", b'{"ttl":Infinity}', "ttl")
        self.assertInvalid("/v1/sessions", {"ttl": 1e308}, "ttl")
        self.assertInvalid("/v1/acquire", {"session": self.session, "key": "k", "max_concurrent": 10**400}, "max_concurrent")
        self.assertInvalid(
            "/v1/acquire", {"session": self.session, "key": "k", "max_concurrent": LARGEST_NUMBER + 1}, "max_concurrent"
        )
        self.assertInvalid("/v1/acquire", {"session": self.session, "key": "k", "wait": 1e308}, "wait")
        self.assertInvalid("/v1/acquire", b'{"session":"%s","key":"k","wait":-Infinity}' % self.session.encode(), "wait")
        self.assertEqual(len(self.server.sessions), 1)
        self.assertEqual(self.server.locks.holders("k"), [])

    def test_keys_are_strings(self) -> None:
        """C{{"keys":[1]}}: 400 invalid_parameter (not a key at all), nothing granted."""
        self.assertInvalid("/v1/acquire", {"session": self.session, "keys": [1]}, "keys")
        self.assertInvalid("/v1/acquire", {"session": self.session, "keys": ["a", None]}, "keys")
        self.assertInvalid("/v1/release", {"session": self.session, "keys": [["a"]]}, "keys")
        self.assertEqual(self.server.locks.holders("a"), [])

    def test_deeply_nested_body(self) -> None:
        """A body nested deeper than the parser recurses: 400 invalid_json."""
        for body in (b"[" * 100_000, b'{"a":' * 100_000):
            response = self.server.ask("POST", "/v1/sessions", body)
            self.assertEqual((response.status, response.json()["code"]), (400, "invalid_json"))


class SessionEndsDuringWaitTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)
        self.holder = self.server.session(ttl=100)
        self.waiter = self.server.session(ttl=5)
        self.server.ask("POST", "/v1/acquire", {"session": self.holder, "key": "k"})
        self.server.ask("POST", "/v1/elections/e/campaign", {"session": self.holder})

    def assertNoSuchSession(self, path: str, body: Any, end: Any) -> None:
        client = self.server.connect()
        client.send("POST", path, body)
        self.assertIsNone(client.response())
        end()
        response = client.checked()
        self.assertEqual((response.status, response.json()["code"]), (404, "no_such_session"), response.body)

    def test_ended(self) -> None:
        """The session ends (POST /v1/sessions/end) while its acquire waits: 404 no_such_session."""
        self.assertNoSuchSession(
            "/v1/acquire",
            {"session": self.waiter, "key": "k", "wait": 30},
            lambda: self.server.ask("POST", "/v1/sessions/end", {"session": self.waiter}),
        )
        self.assertEqual(self.server.locks.status("k").waiting, 0)

    def test_ttl_runs_out(self) -> None:
        """The session's TTL runs out while its campaign waits: 404 no_such_session."""
        self.assertNoSuchSession(
            "/v1/elections/e/campaign", {"session": self.waiter, "wait": 30}, lambda: self.server.clock.advance(5)
        )

    def test_client_gone_still_not_granted(self) -> None:
        """A wait that runs out, its session live: 409 not_granted, as before."""
        client = self.server.connect()
        client.send("POST", "/v1/acquire", {"session": self.waiter, "key": "k", "wait": 1})
        self.server.clock.advance(1)
        self.assertEqual(client.checked().status, 409)


# Every field any POST route reads, and a few it does not.
FIELDS = (
    "session",
    "ttl",
    "key",
    "keys",
    "wait",
    "expires",
    "max_concurrent",
    "shared",
    "value",
    "member",
    "capabilities",
    "other",
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**400 // 10**380)
    | st.sampled_from([0, -1, 1, 10**400, LARGEST_NUMBER, LARGEST_NUMBER + 1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["k", "", "a b", "x" * 300, "\x00"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
POST_PATHS = sorted(
    {
        route.template.replace("{name}", "n").replace("{key}", "k")
        for route in ROUTES
        if route.method in ("POST", "DELETE")
    }
)


class FuzzTests(SynchronousTestCase):
    """Arbitrary JSON values in every field of every POST route: never a 500, every reply documented."""

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from(POST_PATHS),
        st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
        st.booleans(),
    )
    @example("/v1/acquire", {"keys": [1]}, True)
    @example("/v1/acquire", {"key": "k", "expires": float("inf")}, True)
    @example("/v1/sessions", {"ttl": 1e308}, False)
    @example("/v1/acquire", {"key": "k", "max_concurrent": 10**400}, True)
    def test_post_routes(self, path: str, fields: Any, live: bool) -> None:
        server = UnitApi(ROUTES)
        server.ask("POST", "/v1/groups/n")
        if live:
            fields["session"] = server.session()
        body = json.dumps(fields, allow_nan=True).encode()
        for method in ("POST", "DELETE") if path == "/v1/groups/n" else ("POST",):
            response = server.ask(method, path, body)  # (checked against the OpenAPI document)
            self.assertNotEqual(response.status, 500, (path, body, response.body))
            self.assertTrue(response.complete)
