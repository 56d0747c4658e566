"""
The HTTP API's listener and routes without a socket: L{http_factory}'s
site over a L{StringTransport} on a L{Clock} (protected mode, the body cap,
the auth deadline, the server stopping with a long poll pending, the
listing pages of a large table), and L{LockService.waiters}.
"""

from __future__ import annotations

import json

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import directlyProvides

from jesync.connections.listings import ROW_BYTES, ListingBudget
from jesync.connections.policy import ConnectionPolicy, Connections
from jesync.groups import GroupTable
from jesync.http import locks as http_locks
from jesync.http.api import ApiContext, HttpApi
from jesync.http.listener import MAX_BODY, REFUSED_LINGER, ApiClosing, authorized, http_factory
from jesync.http.state import SNAPSHOT_KEPT
from jesync.interfaces import IOwnerChanges
from jesync.service import LockService
from jesync.sessions import SessionTable
from tests.support import connect_unit

LOCAL = IPv4Address("TCP", "127.0.0.1", 40001)
REMOTE = IPv4Address("TCP", "192.0.2.1", 40001)


class HalfClosingTransport(StringTransport):
    """A StringTransport whose write side can be closed alone (as TCP's)."""

    write_closed = False

    def loseWriteConnection(self) -> None:
        self.write_closed = True


def http_request(method: bytes, path: bytes, body: bytes = b"", headers: bytes = b"") -> bytes:
    return (
        method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n" + headers
        + (b"Content-Length: %d\r\n" % len(body) if body else b"") + b"\r\n" + body
    )


def parse_response(data: bytes) -> tuple:
    """(status, headers (lower-case names), the JSON body) of one response."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode()] = value.strip().decode()
    return status, headers, json.loads(body) if body else None


class ApiCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.locks = LockService(self.clock)
        self.connections = Connections(10)
        self.sessions = SessionTable(self.clock, self.locks)

    def serve(self, routes=http_locks.ROUTES, **policy_options) -> None:
        self.policy = ConnectionPolicy(connections=self.connections, **policy_options)
        context = ApiContext(self.locks, self.sessions, GroupTable(self.locks), self.policy, self.clock, max_wait=60)
        self.api = HttpApi(context, routes, on_authorized=authorized)
        self.factory = http_factory(self.api, self.policy, self.clock)
        self.factory.doStart()
        self.addCleanup(self.factory.doStop)

    def connect(self, peer=LOCAL):
        return connect_unit(self.factory, peer, HalfClosingTransport())

    def call(self, client, method: bytes, path: bytes, document=None, headers: bytes = b"") -> tuple:
        body = json.dumps(document).encode() if document is not None else b""
        return parse_response(client.ask(http_request(method, path, body, headers)))


class ListenerTests(ApiCase):
    def test_protected_mode(self) -> None:
        """A client that is not local: 403 with the API's JSON error, closed, not counted."""
        self.serve(protected=True)
        client = self.connect(REMOTE)
        status, headers, document = parse_response(client.take())
        self.assertEqual((status, headers["content-type"], document["code"]), (403, "application/json", "protected_mode"))
        self.assertIn("--auth-token-file", document["message"])
        self.assertTrue(client.closing)
        self.assertEqual(len(self.connections), 0)
        local = self.connect()
        self.assertEqual(self.call(local, b"GET", b"/v1/sessions")[0], 200)

    def test_content_length_over_the_cap(self) -> None:
        """
        A Content-Length over 64 KiB: 413 at once, before the body is sent;
        the write side closes (a FIN after the reply), what the client still
        sends is thrown away, and the connection is aborted a little later
        if the client has not closed it.
        """
        self.serve()
        client = self.connect()
        client.send(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        status, headers, document = parse_response(client.take())
        self.assertEqual((status, headers["connection"], document["code"]), (413, "close", "request_too_large"))
        self.assertEqual((client.transport.write_closed, client.closing), (True, False))
        client.send(b"{" * (MAX_BODY + 1))
        self.assertEqual((client.take(), len(self.sessions)), (b"", 0))
        self.clock.advance(REFUSED_LINGER)
        self.assertTrue(client.closing)

    def test_refused_client_that_closes(self) -> None:
        """A refused client that closes first: nothing is left to abort."""
        self.serve()
        client = self.connect()
        client.send(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        client.lose()
        self.assertNotIn(REFUSED_LINGER, [call.getTime() for call in self.clock.getDelayedCalls()])  # (no abort due)
        self.assertEqual(len(self.connections), 0)

    def test_expect_continue_over_the_cap(self) -> None:
        """A client that asks to continue a body over the cap is not told to."""
        self.serve()
        client = self.connect()
        client.send(
            b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1)
        )
        self.assertTrue(client.take().startswith(b"HTTP/1.1 413 "))

    def test_chunked_body_over_the_cap(self) -> None:
        """A chunked body is counted as it comes: 413 once it passes 64 KiB."""
        self.serve()
        client = self.connect()
        client.send(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"x" * 40_000
        client.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.assertEqual(client.take(), b"")
        client.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(piece), piece))
        status, _, document = parse_response(client.take())
        self.assertEqual((status, document["code"]), (413, "request_too_large"))
        self.assertTrue(client.transport.write_closed)
        self.assertEqual(len(self.sessions), 0)

    def test_body_at_the_cap_is_read(self) -> None:
        self.serve()
        client = self.connect()
        body = b'{"ttl": 5, "pad": "' + b"x" * (MAX_BODY - 21) + b'"}'
        self.assertEqual(len(body), MAX_BODY)
        self.assertEqual(parse_response(client.ask(http_request(b"POST", b"/v1/sessions", body)))[0], 201)

    def test_auth_deadline(self) -> None:
        """With a token: closed at --auth-timeout unless a request carried the token; authorized, it stays."""
        self.serve(auth_token=b"sesame", auth_timeout=10.0)
        silent, wrong, good = self.connect(), self.connect(), self.connect()
        self.assertEqual(self.call(wrong, b"GET", b"/v1/sessions", headers=b"Authorization: Bearer nope\r\n")[0], 401)
        self.assertEqual(self.call(good, b"GET", b"/v1/sessions", headers=b"Authorization: Bearer sesame\r\n")[0], 200)
        self.assertEqual(good.protocol.auth_generation, self.policy.generation)
        self.assertTrue(good.protocol.authenticated)
        self.clock.advance(10)
        self.assertEqual([client.closing for client in (silent, wrong, good)], [True, True, False])

    def test_rotated_out(self) -> None:
        """A connection authorized with a token rotated out is closed by the policy when its grace ends."""
        self.serve(auth_token=b"old", auth_timeout=10.0)
        old, new = self.connect(), self.connect()
        self.call(old, b"GET", b"/v1/sessions", headers=b"Authorization: Bearer old\r\n")
        self.policy.rotate(b"new", self.clock.seconds(), 5)
        self.call(new, b"GET", b"/v1/sessions", headers=b"Authorization: Bearer new\r\n")
        self.clock.advance(5)
        self.assertEqual(self.policy.close_rotated_out(self.clock.seconds()), 1)
        self.assertEqual((old.closing, new.closing), (True, False))


class StoppingTests(ApiCase):
    def test_long_poll_answered_when_the_server_stops(self) -> None:
        """HttpApi.close: a pending long poll is answered 409 not_granted saying why; nothing is granted."""
        self.serve()
        self.successResultOf(self.locks.acquire("k", "someone", 1, 0, 0))
        client = self.connect()
        _, _, created = self.call(client, b"POST", b"/v1/sessions", {"ttl": 30})
        client.send(http_request(b"POST", b"/v1/acquire", json.dumps({"session": created["session"], "key": "k", "wait": 30}).encode()))
        self.assertEqual((client.take(), self.locks.status("k").waiting), (b"", 1))
        self.api.close("the server is stopping")
        status, _, document = parse_response(client.take())
        self.assertEqual((status, document["code"]), (409, "not_granted"))
        self.assertIn("stopping", document["message"])
        self.assertEqual(self.locks.status("k").waiting, 0)
        self.assertEqual(self.call(client, b"GET", b"/v1/sessions")[2]["code"], "unavailable")

    def test_gone_client_granted_nothing(self) -> None:
        """A grant made as the client goes is released (the reply's undo)."""
        self.serve()
        self.successResultOf(self.locks.acquire("k", "someone", 1, 0, 0))
        client = self.connect()
        _, _, created = self.call(client, b"POST", b"/v1/sessions", {"ttl": 30})
        client.send(http_request(b"POST", b"/v1/acquire", json.dumps({"session": created["session"], "key": "k", "wait": 30}).encode()))
        client.lose()
        self.assertEqual(self.locks.status("k").waiting, 0)
        self.locks.release("k", "someone")
        self.assertEqual(self.locks.listing(), [])


class ListingTests(ApiCase):
    def test_pages_cover_the_table_once(self) -> None:
        """3,000 keys in pages of 1,000 (the most): every key once, in key order; a prefix's pages too."""
        self.serve()
        self.check_pages()

    def test_table_larger_than_the_budget(self) -> None:
        """
        A table whose snapshot would take more than half the listing budget:
        the same pages in key order, each made by one bounded pass over the
        table, no snapshot held or kept (none to keep the line protocols'
        listing from the budget); a page by waiters reads one and gives it back.
        """
        self.serve(listings=ListingBudget(limit=3000 * ROW_BYTES * 2 - 1))
        self.check_pages()
        self.assertEqual((self.policy.listings.held, self.api.context.listing_snapshots.kept), (0, {}))
        _, _, page = self.call(self.connect(), b"GET", b"/v1/locks?order=waiters&limit=2&prefix=c/")
        self.assertEqual(([row["key"] for row in page["locks"]], page["keys"]), (["c/00000", "c/00001"], 1000))
        self.assertEqual((self.policy.listings.held, self.api.context.listing_snapshots.kept), (0, {}))

    def test_kept_snapshot_leaves_room(self) -> None:
        """
        A snapshot is kept between pages only if at most half the budget: a
        line protocol's listing of the table (once it has changed) still fits.
        """
        for limit, kept in ((10 * ROW_BYTES * 2, 10 * ROW_BYTES), (10 * ROW_BYTES * 2 - 1, 0)):
            self.serve(listings=ListingBudget(limit=limit))
            for number in range(10):
                self.locks.request(f"k{number}", "owner", 1, 0, 0)
            self.call(self.connect(), b"GET", b"/v1/locks?order=waiters&limit=2")
            self.assertEqual(self.policy.listings.held, kept)
            self.policy.listings.charge(10 * ROW_BYTES).release()
            self.api.context.listing_snapshots.drop_all()

    def check_pages(self) -> None:
        keys = [f"{group}/{number:05d}" for group in ("a", "b", "c") for number in range(1000)]
        for key in keys:
            self.locks.request(key, "owner", 1, 0, 0)
        client = self.connect()
        seen, after = [], None
        while True:
            path = b"/v1/locks?limit=1000" + (b"&after=" + after.encode() if after else b"")
            _, _, page = self.call(client, b"GET", path)
            self.assertLessEqual(len(page["locks"]), 1000)
            self.assertEqual(page["keys"], 3000)
            seen += [row["key"] for row in page["locks"]]
            after = page["next"]
            if after is None:
                break
        self.assertEqual(seen, sorted(keys))
        _, _, prefixed = self.call(client, b"GET", b"/v1/locks?prefix=b/&limit=10&after=b/00995")
        self.assertEqual([row["key"] for row in prefixed["locks"]], [f"b/{n:05d}" for n in range(996, 1000)])
        self.assertEqual((prefixed["keys"], prefixed["next"]), (1000, None))
        _, _, prefixed = self.call(client, b"GET", b"/v1/locks?prefix=b/&limit=3&after=a/5")
        self.assertEqual([row["key"] for row in prefixed["locks"]], ["b/00000", "b/00001", "b/00002"])
        self.assertEqual(prefixed["next"], "b/00002")
        self.assertEqual(self.call(client, b"GET", b"/v1/locks?limit=1001")[0], 400)

    def test_snapshot_kept_while_unchanged_and_charged(self) -> None:
        """Paging through an unchanged table reads one snapshot (charged to the listing budget), dropped later."""
        self.serve()
        for number in range(10):
            self.locks.request(f"k{number}", "owner", 1, 0, 0)
        client = self.connect()
        self.call(client, b"GET", b"/v1/locks?limit=2")
        held = self.policy.listings.held
        self.assertGreater(held, 0)
        self.call(client, b"GET", b"/v1/locks?limit=2&after=k1")
        self.assertEqual(self.policy.listings.held, held)
        self.clock.advance(SNAPSHOT_KEPT)
        self.assertEqual(self.policy.listings.held, 0)

    def test_snapshots_released_when_the_server_stops(self) -> None:
        """The snapshots kept for the next pages are given back when the server stops, their timers with them."""
        self.serve()
        for number in range(10):
            self.locks.request(f"k{number}", "owner", 1, 0, 0)
        client = self.connect()
        self.call(client, b"GET", b"/v1/locks?limit=2")
        self.call(client, b"GET", b"/v1/locks?order=waiters&limit=2")
        self.assertEqual(sorted(self.api.context.listing_snapshots.kept), ["key", "requests"])
        calls = len(self.clock.getDelayedCalls())
        ApiClosing(self.api, self.sessions).stopService()
        self.assertEqual((self.policy.listings.held, self.api.context.listing_snapshots.kept), (0, {}))
        self.assertEqual(len(self.clock.getDelayedCalls()), calls - 2)

    def test_most_waiters_first(self) -> None:
        self.serve()
        for key, waiting in (("few", 1), ("many", 3), ("none", 0)):
            self.locks.request(key, "holder", 1, 0, 0)
            for number in range(waiting):
                self.locks.request(key, f"waiter{number}", 1, -1, 0).addErrback(lambda failure: None)
        client = self.connect()
        _, _, page = self.call(client, b"GET", b"/v1/locks?order=waiters&limit=2")
        self.assertEqual([(row["key"], row["waiters"]) for row in page["locks"]], [("many", 3), ("few", 1)])
        _, _, rest = self.call(client, b"GET", b"/v1/locks?order=waiters&after=" + page["next"].encode())
        self.assertEqual(([row["key"] for row in rest["locks"]], rest["next"]), (["none"], None))


class WaitersTests(SynchronousTestCase):
    def test_queue_order_skipping_those_gone(self) -> None:
        """LockService.waiters: the live waiters of a key in queue order (a multi-key one included), the first `limit`."""
        clock = Clock()
        locks = LockService(clock)
        locks.request("k", "holder", 1, 0, 0)
        clock.advance(1)
        first = locks.request("k", "first", 1, -1, 0)
        locks.request("k", "reader", 1, -1, 0, mode="shared")
        clock.advance(1)
        locks.request_many(["j", "k"], "both", -1, 0)
        first.cancel()
        self.failureResultOf(first)
        waiting = locks.waiters("k")
        self.assertEqual(
            [(each.owner, each.mode, each.max_concurrent, each.since) for each in waiting],
            [("reader", "shared", 1, 1.0), ("both", "exclusive", 1, 2.0)],
        )
        self.assertEqual([each.owner for each in locks.waiters("k", limit=1)], ["reader"])
        self.assertEqual(locks.waiters("nothing"), [])
        self.assertEqual([each.owner for each in locks.waiters("j")], ["both"])


class RecordingJournal:
    """Cluster mode's journal, as the API sees it: everything durable already, the changes it is told recorded."""

    def __init__(self) -> None:
        self.told: list = []

    def durable(self):
        return None

    def session_changed(self, session) -> None:
        self.told.append(("session", session.id))

    def held_changed(self, session, key: str) -> None:
        self.told.append(("held", session.id, key))

    def timed_changed(self, key: str) -> None:
        self.told.append(("timed", key))

    # (the lock table's events: the journal records a grant's owner from them)
    def granted(self, grant, waited: float) -> None:
        pass

    def released(self, grant) -> None:
        pass

    def expired(self, grant) -> None:
        pass

    def timed_out(self, key: str) -> None:
        pass


class ClusterModeTests(ApiCase):
    def test_journal_told_of_sessions_and_renewals(self) -> None:
        """
        In cluster mode the journal (the lock table's observer) is told of a
        session opened, and of its grants renewed (by renew, or by acquiring
        a key it holds), with their expiry and value: the lock table tells it
        of grants, not renewals.
        """
        journal = RecordingJournal()
        directlyProvides(journal, IOwnerChanges)
        self.locks.observer = journal
        self.serve(durability=journal)
        client = self.connect()
        _, _, created = self.call(client, b"POST", b"/v1/sessions", {"ttl": 30})
        session = created["session"]
        self.assertEqual(journal.told, [("session", session)])
        self.assertEqual(self.call(client, b"POST", b"/v1/acquire", {"session": session, "key": "k", "expires": 5})[0], 200)
        self.assertEqual(len(journal.told), 1)  # (a grant: the lock table tells the observer itself)
        self.call(client, b"POST", b"/v1/renew", {"session": session, "key": "k", "expires": 9, "value": "v"})
        self.call(client, b"POST", b"/v1/acquire", {"session": session, "keys": ["k", "j"], "expires": 9})
        self.assertEqual(journal.told[1:], [("held", session, "k"), ("held", session, "k")])
        self.assertEqual(self.locks.grant_of("k", self.sessions.find(session)).value, b"v")

    def test_journal_told_of_coordination_renewals(self) -> None:
        """
        A proclaim, a campaign by the leader with a new value and a group
        update renew a grant (its value): the journal is told of each, so
        that the next leader restores the value the client was told of.
        """
        from jesync.http import coordination
        from jesync.wire import election_key, member_key

        journal = RecordingJournal()
        directlyProvides(journal, IOwnerChanges)
        self.locks.observer = journal
        self.serve(durability=journal, routes=http_locks.ROUTES + coordination.ROUTES)
        client = self.connect()
        session = self.call(client, b"POST", b"/v1/sessions", {"ttl": 30})[2]["session"]
        self.assertEqual(self.call(client, b"POST", b"/v1/elections/e/campaign", {"session": session})[0], 200)
        self.assertEqual(self.call(client, b"POST", b"/v1/groups/g", {})[0], 201)
        self.assertEqual(self.call(client, b"POST", b"/v1/groups/g/join", {"session": session, "member": "m"})[0], 200)
        del journal.told[:]
        self.assertEqual(self.call(client, b"POST", b"/v1/elections/e/proclaim", {"session": session, "value": "a"})[0], 200)
        self.assertEqual(self.call(client, b"POST", b"/v1/elections/e/campaign", {"session": session, "value": "b"})[0], 200)
        update = {"session": session, "member": "m", "capabilities": "c"}
        self.assertEqual(self.call(client, b"POST", b"/v1/groups/g/update", update)[0], 200)
        self.assertEqual(
            journal.told,
            [("held", session, election_key("e")), ("held", session, election_key("e")), ("held", session, member_key("g", "m"))],
        )


class WiringTests(SynchronousTestCase):
    """What build_lock_server makes of --http-port and --http-max-wait (nothing listens: no socket)."""

    def build(self, *argv: str):
        from jesync.server import build_lock_server
        from jesync.tap import settings_from
        from tests.support import parse

        self.clock = Clock()
        self.clock.advance(1000)
        settings = settings_from(parse("--http-port", "tcp:0:interface=127.0.0.1", *argv))
        server = build_lock_server(self.clock, settings)
        (api,) = [
            child.factory.wrappedFactory.resource
            for child in server.listeners()
            if hasattr(child.factory, "wrappedFactory")
        ]
        return server, api

    def test_describe(self) -> None:
        """The server's part of the status: version, role, term, uptime, listeners, every limit (None: none)."""
        import jesync

        server, api = self.build("--max-keys", "5", "--max-held", "0", "--http-max-wait", "7", "--elock-port", "11401")
        self.assertIn("; HTTP on tcp:0:interface=127.0.0.1", server.summary)
        self.assertEqual(api.context.max_wait, 7.0)
        self.clock.advance(2.5)
        described = api.context.describe()
        self.assertEqual(
            {name: described["server"][name] for name in ("version", "role", "term", "uptime")},
            {"version": jesync.__version__, "role": "standalone", "term": None, "uptime": 2.5},
        )
        self.assertEqual(len(described["server"]["listeners"]), 3)
        self.assertIn("tcp:0:interface=127.0.0.1", described["server"]["listeners"])
        limits = described["limits"]
        self.assertEqual((limits["max_keys"], limits["max_held"], limits["http_max_wait"]), (5, None, 7.0))
        self.assertEqual(
            sorted(limits),
            sorted(
                [
                    "max_connections", "max_keys", "max_waiters", "max_held", "max_total_waits", "max_watches",
                    "max_total_watches", "max_sessions", "max_session_grace", "max_groups", "max_members",
                    "max_key_length", "max_unsent", "http_max_wait",
                ]
            ),
        )

    def test_one_session_table(self) -> None:
        """The API's sessions are elock's table, and its connections the server's one registry."""
        server, api = self.build()
        self.assertIs(api.context.sessions, server.factories["elock"].sessions)
        self.assertIs(api.context.policy, server.policy)
