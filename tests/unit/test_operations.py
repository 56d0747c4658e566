"""
The operating options of C{twistd jesync} as the service
L{jesync.tap.makeService} builds them, with nothing listening: every limit,
--keepalive and --shutdown-grace, and --auth-token-file (the token is its
first line, and is never shown); how keepalive is set on a socket object
(never connected); a holder gone silent losing its lock to the expiry, and
the connection registry's graceful close, on a L{Clock}.  The same options
through a real listening server and real TCP clients are
L{tests.tcp.test_operations}.
"""

from __future__ import annotations

import os
import socket

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from jesync import tap
from jesync.interfaces import Totals
from jesync.deadlines import TICKS_PER_SECOND
from jesync.connections.policy import KEEPALIVE_PROBES, Connections, tune_tcp
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.lock_server import LockServer
from tests.support import (
    LINUX_KEEPALIVE,
    TOKEN,
    UnitServer,
    keepalive_options,
    parse,
    short_temp_dir,
    without_tokens,
    write_file,
)

# Timers fire at most one tick after their time, never before it.
TICK = 1 / TICKS_PER_SECOND


# -- options --------------------------------------------------------------------


class OptionsTests(SynchronousTestCase):
    """Every operating option, as far as the service makeService builds."""

    def build(self, *argv: str) -> LockServer:
        server = tap.makeService(parse(*argv))
        self.assertIsInstance(server, LockServer)
        return server

    def test_defaults(self) -> None:
        server = self.build()
        policy = server.policy
        self.assertEqual(
            (policy.max_key_length, policy.max_unsent, policy.keepalive, policy.auth_token, policy.connections.limit),
            (1024, 4 * 2**20, 60.0, None, 10_000),
        )
        self.assertEqual(
            (server.locks.max_keys, server.locks.max_waiters, server.locks.max_held), (1_000_000, 10_000, 10_000)
        )
        self.assertEqual(server.grace, 5.0)
        self.assertEqual(
            server.summary,
            "JESync on tcp:11400; limits: max-connections=10000, max-keys=1000000, max-waiters=10000, "
            "max-total-waits=100000, max-held=10000, max-sessions=10000, max-session-grace=300, max-key-length=1024, max-unsent=4194304, "
            "max-listing-memory=67108864, auth-timeout=10, idle-timeout=none; keepalive 60.0; auth off"
            "; protected mode: only local clients (set --auth-token-file, or --protected-mode off)",
        )

    def test_every_option(self) -> None:
        server = self.build(
            "--max-connections=3", "--max-keys=4", "--max-waiters=5", "--max-held=6", "--max-key-length=7",
            "--max-unsent=8", "--keepalive=9.5", "--shutdown-grace=0.25",
        )
        policy = server.policy
        self.assertEqual(
            (policy.connections.limit, policy.max_key_length, policy.max_unsent, policy.keepalive), (3, 7, 8, 9.5)
        )
        self.assertEqual((server.locks.max_keys, server.locks.max_waiters, server.locks.max_held), (4, 5, 6))
        self.assertEqual(server.grace, 0.25)
        # one policy, one lock table, for both protocols
        server = self.build("--elock-port", "11401")
        factories = [child.factory for child in server]
        self.assertEqual([type(factory) for factory in factories], [JESyncFactory, ELockFactory])
        for factory in factories:
            self.assertIs(factory.policy, server.policy)
            self.assertIs(factory.service, server.locks)

    def test_zero_means_no_limit(self) -> None:
        server = self.build(
            "--max-connections=0", "--max-keys=0", "--max-waiters=0", "--max-held=0", "--max-key-length=0",
            "--max-unsent=0",
        )
        self.assertIsNone(server.policy.connections.limit)
        self.assertEqual((server.locks.max_keys, server.locks.max_waiters, server.locks.max_held), (None, None, None))
        self.assertGreaterEqual(server.policy.max_key_length, 2**31)
        self.assertGreaterEqual(server.policy.max_unsent, 2**62)
        self.assertIn("max-connections=none, max-keys=none, max-waiters=none, max-total-waits=100000, max-held=none", server.summary)

    def test_keepalive_zero_is_the_systems(self) -> None:
        server = self.build("--keepalive", "0")
        self.assertIsNone(server.policy.keepalive)
        self.assertIn("; keepalive system;", server.summary)

    def test_bad_values(self) -> None:
        for option in [
            "--max-connections", "--max-keys", "--max-waiters", "--max-held", "--max-key-length", "--max-unsent",
            "--keepalive", "--shutdown-grace",
        ]:
            for value in ["-1", "lots", ""]:
                self.assertRaises(usage.UsageError, parse, option, value)

    def test_max_session_grace(self) -> None:
        cases = [((), 300_000), (("--max-session-grace", "20.5"), 20_500), (("--max-session-grace", "0"), None)]
        for argv, bound in cases:
            server = self.build("--elock-port", "11401", *argv)
            (elock,) = [child.factory for child in server if isinstance(child.factory, ELockFactory)]
            self.assertEqual(elock.sessions.max_grace_ms, bound)
        for value in ["-1", "inf", "nan", "lots"]:
            self.assertRaises(usage.UsageError, parse, "--max-session-grace", value)


class AuthTokenFileTests(SynchronousTestCase):
    """--auth-token-file: the token is its first line, and is never shown."""

    def test_first_line_stripped(self) -> None:
        for content in [TOKEN, TOKEN + b"\n", b"  " + TOKEN + b" \r\nsecond line\n"]:
            options = parse("--auth-token-file", write_file(self, content))
            self.assertEqual(options["auth_token"], TOKEN)
            server = tap.makeService(options)
            self.assertEqual(server.policy.auth_token, TOKEN)
            self.assertTrue(server.summary.endswith("; auth required"), server.summary)
            self.assertNotIn(TOKEN.decode(), server.summary)

    def test_no_file_no_token(self) -> None:
        self.assertIsNone(parse()["auth_token"])

    def test_unreadable(self) -> None:
        directory = short_temp_dir(self)
        for path in [os.path.join(directory, "missing"), directory]:
            error = self.assertRaises(usage.UsageError, parse, "--auth-token-file", path)
            self.assertTrue(str(error).startswith(f"--auth-token-file: cannot read {path}: "), str(error))

    def test_not_one_token(self) -> None:
        for content in [b"", b"\n", b"   \nsecond\n", b"s3cret part-two\n", b"s3cret\tpart-two"]:
            path = write_file(self, content)
            error = self.assertRaises(usage.UsageError, parse, "--auth-token-file", path)
            self.assertEqual(str(error), f"--auth-token-file: {path} must hold one token, without spaces")
            for secret in content.split():
                self.assertNotIn(secret.decode(), str(error))

    def test_usage_never_shows_the_token(self) -> None:
        options = parse("--auth-token-file", write_file(self, TOKEN))
        self.assertNotIn(TOKEN.decode(), options.getUsage())
        self.assertNotIn(TOKEN.decode(), str(options))


class KeepaliveUnitTests(SynchronousTestCase):
    def test_not_a_socket(self) -> None:
        self.assertFalse(tune_tcp(StringTransport(), 7))

    def test_unix_socket(self) -> None:
        first, second = socket.socketpair(socket.AF_UNIX)
        self.addCleanup(first.close)
        self.addCleanup(second.close)

        class Transport:
            def getHandle(self):
                return first

        self.assertFalse(tune_tcp(Transport(), 7))

    def test_seconds_rounded_down_to_at_least_one(self) -> None:
        for idle, expected in [(0.5, 1), (2.9, 2), (None, None)]:
            with socket.socket() as sock:

                class Transport:
                    def getHandle(self):
                        return sock

                self.assertTrue(tune_tcp(Transport(), idle))
                self.assertNotEqual(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), 0)
                options = keepalive_options(sock)
                self.assertEqual(options[0], 1)
                if LINUX_KEEPALIVE and expected is not None:
                    self.assertEqual(options[1:], (expected, expected, KEEPALIVE_PROBES))


# -- dead and stuck peers ---------------------------------------------------------


class SilentHolderTests(SynchronousTestCase):
    def test_loses_its_lock_when_it_expires(self):
        """
        A holder whose peer vanished without a FIN (it neither sends nor
        reads any more) loses its lock to the failsafe expiry.
        """
        server = UnitServer()
        holder, waiter = server.connect(), server.connect()
        self.assertEqual(holder.ask(b"lock k 1 -1 1\n"), b"GRANTED 1 0 k 1\n")
        granted_at = server.clock.seconds()
        # (from here on the holder sends nothing and reads nothing)
        self.assertEqual(waiter.ask(b"lock k 1 -1 30\nstatus k\n"), b"STATUS 1 1 k\n")
        server.clock.advance(0.9)
        self.assertEqual(waiter.take(), b"")
        server.clock.advance(0.1 + TICK)
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 30\n")
        self.assertGreaterEqual(server.clock.seconds() - granted_at, 0.9)
        # Its connection is still open, and holds nothing.
        self.assertFalse(holder.closing)
        self.assertEqual(holder.take(), b"")
        peer = b"127.0.0.1:%d" % waiter.transport.getPeer().port
        self.assertEqual(without_tokens(waiter.ask(b"holders k\n")), b"HOLDER k %s 0 30\nEND\n" % peer)


# -- graceful stop ----------------------------------------------------------------


class ConnectionsUnitTests(SynchronousTestCase):
    def test_close_all_with_none_open(self) -> None:
        self.successResultOf(Connections().close_all(Clock(), 5))

    def test_close_all_fires_once_everything_is_given_back(self) -> None:
        """
        close_all fires once every connection's connectionLost has run to
        its end (elock sessions end after the connection leaves the
        registry), so a summary made then counts everything released.
        """
        server = UnitServer()
        jesync = server.connect()
        elock = server.connect_elock()
        self.assertEqual(jesync.ask(b"lock a\n"), b"GRANTED 1 0 a 120\n")
        self.assertEqual(elock.ask(b"lock b\r\n"), b"200 Acquired\r\n")
        closed = server.policy.connections.close_all(server.clock, 5)
        seen = []
        closed.addCallback(lambda _: seen.append(server.service.totals()))
        self.assertTrue(jesync.closing and elock.closing)
        server.elock_factory.stopFactory()  # the listener is gone
        jesync.lose()
        elock.lose()
        server.clock.advance(0)
        self.assertEqual(seen, [Totals(0, 0, 0)])

    def test_stragglers_aborted_after_grace(self) -> None:
        server = UnitServer()
        client = server.connect()
        self.assertEqual(client.ask(b"lock a\n"), b"GRANTED 1 0 a 120\n")
        closed = server.policy.connections.close_all(server.clock, 5)
        server.clock.advance(4.9)
        self.assertNoResult(closed)
        self.assertTrue(client.closing)
        aborted = []
        client.transport.abortConnection = lambda: aborted.append(True)
        server.clock.advance(0.1)
        # (by the registry, and by the connection's own close grace)
        self.assertTrue(aborted)
        client.lose()
        server.clock.advance(0)
        self.successResultOf(closed)
        self.assertEqual(server.clock.getDelayedCalls(), [])
