"""
Who may connect: protected mode (L{jesync.connections.policy.ConnectionPolicy.protected}):
a server without an auth token refuses clients that are neither on loopback
nor on a UNIX socket, each in its own protocol's words, before they count
toward max-connections; local clients are served as usual.  And the auth
token rotated while the server runs (L{ConnectionPolicy.rotate}): the new
one accepted at once by every protocol, the old one for a grace period.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.policy import ConnectionPolicy, Connections, is_local
from jesync.errors import ProtectedMode
from jesync.protocols.dlock import DlockFactory
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.protocols.memcache import MemcacheFactory
from jesync.service import LockService
from jesync.store import ObjectStore
from tests.support import UnitClient

REMOTE = IPv4Address("TCP", "192.0.2.7", 50000)
MESSAGE = ProtectedMode.MESSAGE.encode()


class IsLocalTests(SynchronousTestCase):
    def test_local(self) -> None:
        for address in (
            IPv4Address("TCP", "127.0.0.1", 1),
            IPv4Address("TCP", "127.8.9.10", 1),
            IPv6Address("TCP", "::1", 1),
            IPv6Address("TCP", "::ffff:127.0.0.1", 1),
            UNIXAddress(b"/run/jesync.sock"),
            UNIXAddress(None),
        ):
            self.assertTrue(is_local(address), address)

    def test_not_local(self) -> None:
        for address in (
            REMOTE,
            IPv4Address("TCP", "10.0.0.1", 1),
            IPv6Address("TCP", "2001:db8::1", 1),
            IPv6Address("TCP", "::ffff:192.0.2.7", 1),
            IPv6Address("TCP", "fe80::1%eth0", 1),
            IPv4Address("TCP", "not-an-address", 1),
        ):
            self.assertFalse(is_local(address), address)


class RefusalTests(SynchronousTestCase):
    """Each listener's refusal of a remote client, in its protocol."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.connections = Connections(limit=1)
        self.policy = ConnectionPolicy(protected=True, connections=self.connections)

    def connect(self, factory, peer=REMOTE) -> UnitClient:
        transport = StringTransport(peerAddress=peer)
        protocol = factory.buildProtocol(peer)
        protocol.makeConnection(transport)
        return UnitClient(protocol, transport)

    def assertRefused(self, factory, expected: bytes) -> None:
        client = self.connect(factory)
        self.assertEqual(client.take(), expected)
        self.assertTrue(client.closing)
        self.assertEqual(len(self.connections), 0)

    def test_jesync(self) -> None:
        self.assertRefused(JESyncFactory(self.service, policy=self.policy), b"INVALID_PARAMETER: " + MESSAGE + b"\n")

    def test_elock(self) -> None:
        self.assertRefused(ELockFactory(self.service, policy=self.policy), b"503 " + MESSAGE + b"\r\n")

    def test_memcache(self) -> None:
        factory = MemcacheFactory(ObjectStore(self.service), policy=self.policy)
        self.assertRefused(factory, b"SERVER_ERROR " + MESSAGE + b"\r\n")

    def test_dlock(self) -> None:
        from tests.test_dlock import parse_responses

        client = self.connect(DlockFactory(self.service, policy=self.policy))
        [response] = parse_responses(client.take())
        self.assertEqual((response.request_id, response.error_text), (0, ProtectedMode.MESSAGE))
        self.assertTrue(client.closing)

    def test_local_clients_are_served_and_remote_ones_do_not_count(self) -> None:
        factory = JESyncFactory(self.service, policy=self.policy)
        self.connect(factory)  # refused: not counted toward max-connections (1)
        local = self.connect(factory, IPv4Address("TCP", "127.0.0.1", 50001))
        self.assertEqual(local.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(len(self.connections), 1)

    def test_off(self) -> None:
        factory = JESyncFactory(self.service, policy=ConnectionPolicy())
        self.assertEqual(self.connect(factory).ask(b"status k\n"), b"STATUS 0 0 k\n")


class TokenRotationTests(SynchronousTestCase):
    """A token file read again (SIGHUP): the new token works at once, the old one for a grace period."""

    def test_rotate(self) -> None:
        policy = ConnectionPolicy(auth_token=b"old")
        self.assertTrue(policy.accepts(b"old", 0))
        self.assertFalse(policy.rotate(b"old", 0, 60))  # the same token: nothing changes
        self.assertTrue(policy.rotate(b"new", 100, 60))
        self.assertEqual([policy.accepts(token, 159.9) for token in (b"new", b"old", b"other", None)], [True, True, False, False])
        self.assertEqual([policy.accepts(token, 160) for token in (b"new", b"old")], [True, False])

    def test_no_token_accepts_anything_and_cannot_be_rotated_into(self) -> None:
        policy = ConnectionPolicy()
        self.assertTrue(policy.accepts(None, 0))
        self.assertFalse(policy.rotate(b"new", 0, 60))
        self.assertIsNone(policy.auth_token)

    def test_every_protocol_follows_the_rotation(self) -> None:
        from tests.test_dlock import parse_responses, ping
        from tests.test_dlock import dlock_frame

        clock = Clock()
        service = LockService(clock)
        policy = ConnectionPolicy(auth_token=b"old")
        jesync = JESyncFactory(service, policy=policy)
        dlock = DlockFactory(service, policy=policy)
        policy.rotate(b"new", clock.seconds(), 30)

        def ask(factory, data: bytes, port: int) -> bytes:
            peer = IPv4Address("TCP", "127.0.0.1", port)
            transport = StringTransport(peerAddress=peer)
            protocol = factory.buildProtocol(peer)
            protocol.makeConnection(transport)
            return UnitClient(protocol, transport).ask(data)

        self.assertEqual(ask(jesync, b"auth old\nstatus k\n", 1), b"OK\nSTATUS 0 0 k\n")
        self.assertEqual(ask(jesync, b"auth new\nstatus k\n", 2), b"OK\nSTATUS 0 0 k\n")
        [answer] = parse_responses(ask(dlock, dlock_frame(ping(id=1, access_token="old")), 3))
        self.assertEqual(answer.error_text, "")
        clock.advance(30)
        self.assertEqual(ask(jesync, b"auth old\nstatus k\n", 4), b"INVALID_PARAMETER: auth failed\n")
        [refused] = parse_responses(ask(dlock, dlock_frame(ping(id=2, access_token="old")), 5))
        self.assertEqual(refused.error_text, "access token refused")
