"""
The operator's listener (L{jesync.protocols.admin}): C{force-release},
C{end-session} and the C{sessions} listing, over the same lock table as the other protocols, on a
L{Clock} and L{StringTransport}s.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.listings import ListingBudget
from jesync.protocols.admin import AdminFactory
from tests.support import UnitClient, UnitServer


class AdminTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitServer()
        self.admin_factory = AdminFactory(
            self.server.service, policy=self.server.policy, sessions=self.server.elock_factory.sessions
        )

    def admin(self) -> UnitClient:
        peer = IPv4Address("TCP", "127.0.0.1", 49999)
        transport = StringTransport(peerAddress=peer)
        protocol = self.admin_factory.buildProtocol(peer)
        protocol.makeConnection(transport)
        return UnitClient(protocol, transport)

    def test_force_release_hands_the_key_on(self) -> None:
        hung = self.server.connect()
        other = self.server.connect()
        self.assertEqual(hung.ask(b"lock k 3 -1 0\n"), b"GRANTED 1 0 k 0\n")
        self.assertEqual(self.server.connect().ask(b"lock k 3 -1 0\n"), b"GRANTED 2 0 k 0\n")
        other.send(b"lock k\n")  # a mutex: waits for both semaphore holders
        self.assertEqual(other.take(), b"")
        self.assertEqual(self.admin().ask(b"force-release k\n"), b"FORCE-RELEASED 2 k\n")
        self.assertEqual(other.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(hung.ask(b"release k\n"), b"NOT_RELEASED 1 0 k\n")

    def test_force_release_of_a_free_key(self) -> None:
        self.assertEqual(self.admin().ask(b"force-release nothing\n"), b"FORCE-RELEASED 0 nothing\n")

    def test_end_a_detached_session(self) -> None:
        client = self.server.connect_elock()
        session_id = client.ask(b"conn_id\r\n").split()[1]
        self.assertEqual(client.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        admin = self.admin()
        # attached: not ended
        self.assertEqual(
            admin.ask(b"end-session " + session_id + b"\n"),
            b"INVALID_PARAMETER: no detached session " + session_id + b"\n",
        )
        client.lose()
        self.assertEqual(self.server.service.status("k").granted, 1)  # held through the grace period
        self.assertEqual(admin.ask(b"end-session " + session_id + b"\n"), b"SESSION-ENDED " + session_id + b"\n")
        self.assertEqual(self.server.service.status("k").granted, 0)
        self.assertEqual(self.server.elock_factory.sessions.detached_count(), 0)

    def test_the_commands_are_only_on_the_admin_listener(self) -> None:
        self.assertEqual(self.server.connect().ask(b"force-release k\n"), b"INVALID_COMMAND\n")
        self.assertEqual(self.admin().ask(b"status k\n"), b"STATUS 0 0 k\n")

    def end_session(self, session_id: bytes) -> bytes:
        return self.admin().ask(b"end-session " + session_id + b"\n")

    def test_end_sessions_whose_ids_are_any_bytes(self) -> None:
        # elock keeps a chosen id as UTF-8 with surrogate escapes: any bytes but whitespace
        for session_id in ["s\u00e9ance-\u6f22".encode(), b"\xff\xfe-not-utf-8", b"ctl\x01\x7f"]:
            client = self.server.connect_elock()
            self.assertEqual(
                client.ask(b"conn_id " + session_id + b"\r\nlock k\r\n"), b"200 conn id set\r\n200 Acquired\r\n"
            )
            client.lose()
            self.assertEqual(self.end_session(session_id), b"SESSION-ENDED " + session_id + b"\n")
            self.assertEqual(self.server.service.status("k").granted, 0)
            self.assertEqual(len(self.server.elock_factory.sessions), 0)

    def test_end_session_of_an_unknown_id_shows_it_escaped(self) -> None:
        self.assertEqual(
            self.end_session(b"\xff\xc3\xa9"), b"INVALID_PARAMETER: no detached session \\xff\xc3\xa9\n"
        )
        self.assertEqual(self.end_session(b"a b"), b"INVALID_PARAMETER: too many arguments\n")

    def test_sessions_listing(self) -> None:
        clock = self.server.clock
        idle = self.server.connect_elock()
        idle.ask(b"conn_id idle\r\nset_timeout 5000\r\n")
        holder = self.server.connect_elock()
        holder.ask(b"conn_id \xff\xc3\xa9\r\nlock k\r\nlock j\r\n")
        waiter = self.server.connect_elock()
        waiter.ask(b"conn_id waiter\r\n")
        waiter.send(b"lock k 60\r\n")
        holder_peer = holder.transport.getPeer()
        holder.lose()
        clock.advance(10)
        self.assertEqual(
            self.admin().ask(b"sessions\n"),
            b"SESSION idle 127.0.0.1:%d 0 attached 5000\n"
            b"SESSION \xff\xc3\xa9 127.0.0.1:%d 2 detached 20000\n"
            b"SESSION waiter 127.0.0.1:%d 1 attached 30000\n"
            b"END\n" % (idle.transport.getPeer().port, holder_peer.port, waiter.transport.getPeer().port),
        )
        # the id as listed is the id end-session takes
        self.assertEqual(self.end_session(b"\xff\xc3\xa9"), b"SESSION-ENDED \xff\xc3\xa9\n")
        self.assertEqual(waiter.take(), b"200 Acquired\r\n")

    def test_no_sessions(self) -> None:
        self.assertEqual(self.admin().ask(b"sessions\n"), b"END\n")
        self.assertEqual(self.admin().ask(b"sessions now\n"), b"INVALID_PARAMETER: too many arguments\n")
        no_elock = AdminFactory(self.server.service, policy=self.server.policy)
        self.admin_factory = no_elock
        self.assertEqual(self.admin().ask(b"sessions\n"), b"END\n")
        self.assertEqual(self.end_session(b"x"), b"INVALID_PARAMETER: no detached session x\n")

    def test_the_listing_is_charged_to_the_listing_budget(self) -> None:
        for n in range(3):
            self.server.connect_elock().ask(b"conn_id s%d\r\n" % n)
        self.server.policy.listings = budget = ListingBudget(limit=10)
        stalled = self.admin()
        budget.charge(1)  # something else is held
        # Less than a piece: written at once, charged nothing.
        self.assertRegex(stalled.ask(b"sessions\n"), rb"^SESSION s0 .*\nSESSION s1 .*\nSESSION s2 .*\nEND\n$")
        # More: streamed, charged; past the limit, refused.
        for n in range(80):
            elock = self.server.connect_elock()
            self.assertEqual(elock.ask(b"conn_id %s%02d\r\n" % (b"x" * 250, n)), b"200 conn id set\r\n")
        self.assertEqual(stalled.ask(b"sessions\n"), b"INVALID_PARAMETER: max-listing-memory exceeded (10)\n")
        self.assertEqual((budget.held, budget.refused), (1, 1))
