"""
Who may connect: protected mode (L{jesync.connections.policy.ConnectionPolicy.protected}):
a server without an auth token refuses clients that are neither on loopback
nor on a UNIX socket, each in its own protocol's words, before they count
toward max-connections; local clients are served as usual.  And the auth
token rotated while the server runs (L{ConnectionPolicy.rotate}): the new
one accepted at once by every protocol, the old one for a grace period, at
whose end the connections still on it are closed.  All of it over
StringTransport with a Clock; a real process reading its token file again on
SIGHUP is L{tests.process.test_access_rules_sighup}.
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
from tests.support import UnitClient, connect_unit, parse

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
        return connect_unit(factory, peer)

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
        from tests.dlock_messages import parse_responses

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
        from tests.dlock_messages import parse_responses, ping
        from tests.support import dlock_frame

        clock = Clock()
        service = LockService(clock)
        policy = ConnectionPolicy(auth_token=b"old")
        jesync = JESyncFactory(service, policy=policy)
        dlock = DlockFactory(service, policy=policy)
        policy.rotate(b"new", clock.seconds(), 30)

        def ask(factory, data: bytes, port: int) -> bytes:
            return connect_unit(factory, IPv4Address("TCP", "127.0.0.1", port)).ask(data)

        self.assertEqual(ask(jesync, b"auth old\nstatus k\n", 1), b"OK\nSTATUS 0 0 k\n")
        self.assertEqual(ask(jesync, b"auth new\nstatus k\n", 2), b"OK\nSTATUS 0 0 k\n")
        [answer] = parse_responses(ask(dlock, dlock_frame(ping(id=1, access_token="old")), 3))
        self.assertEqual(answer.error_text, "")
        clock.advance(30)
        self.assertEqual(ask(jesync, b"auth old\nstatus k\n", 4), b"INVALID_PARAMETER: auth failed\n")
        [refused] = parse_responses(ask(dlock, dlock_frame(ping(id=2, access_token="old")), 5))
        self.assertEqual(refused.error_text, "access token refused")


class RotatedOutTests(SynchronousTestCase):
    """
    A connection authenticated with a token rotated out is closed when the
    token's grace period ends (the secure default: a token rotated out stops
    being a credential for connections already open too), with the
    protocol's auth refusal; one that authenticated again with the new token,
    or first with it, stays.
    """

    def setUp(self) -> None:
        import os
        import tempfile

        from jesync.lock_server import TokenFile

        self.clock = Clock()
        self.service = LockService(self.clock)
        self.policy = ConnectionPolicy(auth_token=b"old")
        handle, self.path = tempfile.mkstemp()
        os.close(handle)
        self.addCleanup(os.unlink, self.path)
        self.token_file = TokenFile(self.path, self.policy, self.clock, 30)
        self.token_file.startService()  # (a Clock: no SIGHUP handler)
        self.addCleanup(self.token_file.stopService)
        self._port = 40000

    def rotate(self, token: bytes) -> None:
        with open(self.path, "wb") as file:
            file.write(token + b"\n")
        self.token_file.reload()

    def connect(self, factory) -> UnitClient:
        self._port += 1
        return connect_unit(factory, IPv4Address("TCP", "127.0.0.1", self._port))

    def test_every_protocol_closes_them_at_the_end_of_the_grace_period(self) -> None:
        from tests.dlock_messages import lock, parse_responses, ping
        from tests.support import dlock_frame

        jesync = JESyncFactory(self.service, policy=self.policy)
        elock = ELockFactory(self.service, policy=self.policy)
        dlock = DlockFactory(self.service, policy=self.policy)
        memcache = MemcacheFactory(ObjectStore(self.service), policy=self.policy)
        on_old = self.connect(jesync)
        self.assertEqual(on_old.ask(b"auth old\nlock a\n"), b"OK\nGRANTED 1 0 a 120\n")
        moved = self.connect(jesync)
        self.assertEqual(moved.ask(b"auth old\n"), b"OK\n")
        elock_old = self.connect(elock)
        self.assertEqual(elock_old.ask(b"auth old\r\n"), b"200 OK\r\n")
        dlock_old = self.connect(dlock)
        [granted] = parse_responses(dlock_old.ask(dlock_frame(lock(["b"], access_token="old"))))
        self.assertEqual(granted.error_text, "")
        memcache_old = self.connect(memcache)
        self.assertEqual(memcache_old.ask(b"set u 0 0 8\r\nuser old\r\n"), b"STORED\r\n")
        self.rotate(b"new")
        on_new = self.connect(jesync)
        self.assertEqual(on_new.ask(b"auth new\n"), b"OK\n")
        self.assertEqual(moved.ask(b"auth new\n"), b"OK\n")  # moved to the new token in time
        # A dlock client moves by sending the new token.
        dlock_moved = self.connect(dlock)
        parse_responses(dlock_moved.ask(dlock_frame(ping(access_token="old"))))
        parse_responses(dlock_moved.ask(dlock_frame(ping(id=2, access_token="new"))))
        everyone = [on_old, moved, elock_old, dlock_old, memcache_old, on_new, dlock_moved]
        logged: list[str] = []

        def observe(event: dict) -> None:
            from twisted.logger import formatEvent

            logged.append(formatEvent(event))

        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        self.clock.advance(29.9)
        self.assertEqual([client.closing for client in everyone], [False] * 7)
        self.assertEqual(on_old.ask(b"status a\n"), b"STATUS 1 0 a\n")  # still served within the grace period
        self.clock.advance(0.1)
        self.assertEqual([client.closing for client in everyone], [True, False, True, True, True, False, False])
        self.assertIn("closed 4 connections authenticated with a token rotated out", logged)
        rotated_out = [line for line in logged if line.endswith(": the token it authenticated with was rotated out")]
        self.assertEqual(len(rotated_out), 4)
        self.assertFalse([line for line in logged if "old" in line.split()])  # (no token in the log)
        self.assertEqual(on_old.take(), b"INVALID_PARAMETER: auth failed\n")
        self.assertEqual(elock_old.take(), b"403 auth failed\r\n")
        [refused] = parse_responses(dlock_old.take())
        self.assertEqual(refused.error_text, "access token refused")
        self.assertEqual(memcache_old.take(), b"CLIENT_ERROR unauthenticated\r\n")
        # What they held is given back.
        self.assertEqual((self.service.status("a").granted, self.service.status("b").granted), (0, 0))
        self.assertEqual(moved.ask(b"status a\n"), b"STATUS 0 0 a\n")

    def test_a_second_rotation_within_the_grace_period(self) -> None:
        """Each token's connections are closed when its own grace period ends."""
        jesync = JESyncFactory(self.service, policy=self.policy)
        on_old = self.connect(jesync)
        on_old.ask(b"auth old\n")
        self.clock.advance(1)
        self.rotate(b"middle")
        on_middle = self.connect(jesync)
        self.assertEqual(on_middle.ask(b"auth middle\n"), b"OK\n")
        self.clock.advance(10)
        self.rotate(b"new")
        self.clock.advance(20)  # the old token's grace period is over
        self.assertEqual((on_old.closing, on_middle.closing), (True, False))
        self.clock.advance(10)  # and the middle one's
        self.assertTrue(on_middle.closing)

    def test_a_connection_not_yet_authenticated_keeps_its_auth_timeout(self) -> None:
        """Only authenticated connections are closed: one still authenticating is the auth timeout's."""
        policy = self.policy
        policy.auth_timeout = 100
        client = self.connect(JESyncFactory(self.service, policy=policy))
        self.rotate(b"new")
        self.clock.advance(30)
        self.assertFalse(client.closing)
        self.assertEqual(client.ask(b"auth new\n"), b"OK\n")

    def test_a_token_equal_to_the_other_credential_is_refused(self) -> None:
        """SIGHUP refuses an admin token equal to the lock token (and the reverse), as startup does."""
        from dataclasses import replace

        from jesync.lock_server import TokenFile

        admin_policy = replace(self.policy, auth_token=b"admin")
        self.token_file.distinct_from = admin_policy
        self.rotate(b"admin")
        self.assertEqual((self.policy.auth_token, self.policy.previous_token), (b"old", None))
        admin_file = TokenFile(self.path, admin_policy, self.clock, 30, name="admin token", distinct_from=self.policy)
        admin_file.reload()  # (the file still holds b"admin": unchanged)
        with open(self.path, "wb") as file:
            file.write(b"old\n")
        admin_file.reload()
        self.assertEqual((admin_policy.auth_token, admin_policy.previous_token), (b"admin", None))
        self.rotate(b"new")
        self.assertEqual(self.policy.auth_token, b"new")

    def test_stopping_cancels_the_ends_of_grace_periods(self) -> None:
        self.rotate(b"new")
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.token_file.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class OptionsTests(SynchronousTestCase):
    """--protected-mode, --admin-port, --auth-token-grace, as twistd reads them, and what build_server makes of them."""

    def server(self, *argv: str):
        from jesync import tap

        return tap.makeService(parse(*argv))

    def token_file(self, token: bytes = b"s3cret") -> str:
        import os
        import tempfile

        handle, path = tempfile.mkstemp()
        os.write(handle, token + b"\n")
        os.close(handle)
        self.addCleanup(os.unlink, path)
        return path

    def test_protected_by_default_without_a_token(self) -> None:
        server = self.server()
        self.assertTrue(server.policy.protected)
        self.assertIn("protected mode: only local clients", server.summary)
        self.assertFalse(self.server("--protected-mode", "off").policy.protected)
        self.assertIn("protected mode off", self.server("--protected-mode", "off").summary)
        with_token = self.server("--auth-token-file", self.token_file())
        self.assertFalse(with_token.policy.protected)
        self.assertNotIn("protected mode", with_token.summary)

    def test_bad_protected_mode(self) -> None:
        from twisted.python import usage

        error = self.assertRaises(usage.UsageError, parse, "--protected-mode", "maybe")
        self.assertIn("--protected-mode", str(error))

    def test_admin_port(self) -> None:
        from jesync.protocols.admin import AdminFactory

        server = self.server("--elock-port", "tcp:0", "--admin-port", "unix:/tmp/jesync-admin-test.sock")
        admin = server.factories["admin"]
        assert isinstance(admin, AdminFactory)
        self.assertIs(admin.sessions, server.factories["elock"].sessions)
        self.assertIs(admin.policy, server.policy)
        self.assertIn("admin on unix:/tmp/jesync-admin-test.sock", server.summary)
        self.assertIsNone(self.server().factories["admin"])

    def test_token_file_read_again(self) -> None:
        import os

        from jesync.lock_server import TokenFile

        path = self.token_file(b"old")
        server = self.server("--auth-token-file", path, "--auth-token-grace", "60")
        [reloader] = [child for child in server if isinstance(child, TokenFile)]
        clock = Clock()
        reloader.clock = clock
        with open(path, "wb") as file:
            file.write(b"new\n")
        reloader.reload()
        self.assertEqual((server.policy.auth_token, server.policy.previous_token), (b"new", b"old"))
        self.assertEqual(server.policy.previous_until, 60)
        # a broken file changes nothing
        with open(path, "wb") as file:
            file.write(b"two tokens\n")
        reloader.reload()
        os.unlink(path)
        reloader.reload()
        with open(path, "wb") as file:
            file.write(b"new\n")
        self.assertEqual(server.policy.auth_token, b"new")


class ProtectedMetricsTests(SynchronousTestCase):
    def test_metrics_refuse_remote_scrapers_in_protected_mode(self) -> None:
        from jesync.metrics_connections import CountedFactory

        class Site:
            def buildProtocol(self, addr):
                from twisted.internet.protocol import Protocol

                return Protocol()

            def logPrefix(self) -> str:
                return "site"

        factory = CountedFactory(Site(), Connections(4), protected=True)
        transport = StringTransport(peerAddress=REMOTE)
        factory.buildProtocol(REMOTE).makeConnection(transport)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 403 Forbidden\r\n"))
        self.assertTrue(transport.value().endswith(MESSAGE + b"\n"))
        local = IPv4Address("TCP", "127.0.0.1", 1)
        transport = StringTransport(peerAddress=local)
        factory.buildProtocol(local).makeConnection(transport)
        self.assertEqual(transport.value(), b"")
        self.assertEqual(len(factory.connections), 1)
