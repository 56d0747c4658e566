"""
The operator's listener (L{jesync.protocols.admin}): C{force-release} and
C{end-session}, over the same lock table as the other protocols, on a
L{Clock} and L{StringTransport}s.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

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
