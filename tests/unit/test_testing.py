"""
L{jesync.testing}, the in-memory harness: the real server and the real
client, paired in memory, with time moved by the test.  Each test here
checks one thing the harness promises (the replies a socket would carry,
the addresses, closing and aborting, connecting to nothing, time); the
protocols and clients are tested through it elsewhere.
"""

from __future__ import annotations

import re
import unittest
from pathlib import Path
from typing import Optional

from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.client import ConnectFailed, KeyStatus
from jesync.server import ServerSettings
from jesync.testing import MemoryServer
from tests.support import dlock_frame


class RawPeerTests(SynchronousTestCase):
    def test_bytes_in_bytes_out(self) -> None:
        """A peer's bytes reach the server at the flush, and its replies come back."""
        server = MemoryServer()
        peer = server.connect("jesync")
        peer.send(b"lock k\n")
        self.assertEqual(peer.received(), b"")
        server.flush()
        self.assertEqual(peer.received(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(peer.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(server.service.status("k"), KeyStatus("k", 1, 0))

    def test_every_listener_shares_one_table(self) -> None:
        server = MemoryServer(elock_ports=["tcp:11401"], admin_ports=["tcp:11403"])
        jesync, elock, admin = server.connect("jesync"), server.connect("elock"), server.connect("admin")
        self.assertEqual(elock.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(admin.ask(b"force-release k\n").split(b" ")[0], b"FORCE-RELEASED")
        self.assertEqual(server.address("elock"), "127.0.0.1:11401")

    def test_dlock_and_memcache_too(self) -> None:
        """Every protocol's listener can be reached: dlock's frames and memcached's lines lock the same table."""
        from jesync.protocols import dlock_pb2

        server = MemoryServer(dlock_ports=["tcp:11402"], memcache_ports=["tcp:11211"])
        dlock, memcache = server.connect("dlock"), server.connect("memcache")
        request = dlock_pb2.Request(
            id=1, version=2, type=dlock_pb2.Lock, lock=dlock_pb2.RequestLock(keys=["k"], wait_micro=0)
        )
        reply = dlock.ask(dlock_frame(request))
        response = dlock_pb2.Response.FromString(reply[4:])
        self.assertEqual((int.from_bytes(reply[:4], "big"), response.request_id), (len(reply) - 4, 1))
        self.assertEqual(dlock_pb2.ResponseStatus.Name(response.status), "Ok")
        self.assertEqual(memcache.ask(b"set a 0 0 1\r\nx\r\n"), b"STORED\r\n")
        self.assertEqual(server.service.status("k"), KeyStatus("k", 1, 0))

    def test_a_listener_not_served(self) -> None:
        with self.assertRaises(ValueError):
            MemoryServer().connect("elock")

    def test_peers_have_loopback_addresses_unless_told(self) -> None:
        """The server sees each peer as from 127.0.0.1 (a port each), so protected mode serves it; not another host."""
        server = MemoryServer(admin_ports=["tcp:11403"], elock_ports=["tcp:11401"])
        elock = server.connect("elock")
        self.assertEqual(elock.ask(b"conn_id mine\r\n"), b"200 conn id set\r\n")
        listing = server.connect("admin").ask(b"sessions\n")
        self.assertRegex(listing, rb"^SESSION mine 127\.0\.0\.1:\d+ 0 attached 30000\nEND\n$")
        remote = server.connect("jesync", host="192.0.2.7")
        self.assertTrue(remote.closed)
        self.assertIn(b"protected mode", remote.received())
        self.assertEqual(server.connections, 2)

    def test_close_and_abort(self) -> None:
        """Closing gives the server a clean close; aborting a reset; either way, what it held is released."""
        server = MemoryServer()
        closing, aborting, other = server.connect(), server.connect(), server.connect()
        closing.ask(b"lock a\n")
        aborting.ask(b"lock b\n")
        closing.close()
        aborting.send(b"status b\n")  # dropped: an abort discards what was not sent
        aborting.abort()
        self.assertIsInstance(closing.lost.value, ConnectionDone)
        self.assertIsInstance(aborting.lost.value, ConnectionAborted)
        self.assertEqual(aborting.received(), b"")
        self.assertEqual(other.ask(b"status-by-key\n"), b"END\n")
        self.assertEqual(server.connections, 1)

    def test_server_drop_is_a_reset(self) -> None:
        """The server aborting a connection: the peer sees ConnectionLost, as over TCP."""
        server = MemoryServer()
        peer = server.connect()
        [connection] = list(server.server.policy.connections)
        connection.drop("a test")
        server.flush()
        self.assertIsInstance(peer.lost.value, ConnectionLost)


class TimeTests(SynchronousTestCase):
    def test_time_moves_only_when_told(self) -> None:
        server = MemoryServer()
        holder, waiter = server.connect(), server.connect()
        holder.ask(b"lock k 1 -1 10\n")
        self.assertEqual(waiter.ask(b"lock k 1 5\nstatus k\n"), b"STATUS 1 1 k\n")
        server.advance(4.9)
        self.assertEqual(waiter.received(), b"")
        server.advance(0.1)
        self.assertEqual(waiter.received(), b"TIMEOUT 1 0 k\n")
        server.advance(5)
        self.assertEqual(waiter.ask(b"lock k 1 0\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(server.reactor.seconds(), 10)

    def test_advance_delivers_what_each_timer_causes_before_the_next(self) -> None:
        """An expiry frees the key, the waiter is granted, and its own expiry runs later within the same advance."""
        server = MemoryServer()
        first, second, watcher = server.connect(), server.connect(), server.connect()
        first.ask(b"lock k 1 -1 1\n")
        second.ask(b"lock k 1 -1 2\n")
        server.advance(10)
        self.assertEqual(second.received(), b"GRANTED 1 0 k 2\n")
        self.assertEqual(watcher.ask(b"status k\n"), b"STATUS 0 0 k\n")


class ClientTests(SynchronousTestCase):
    def test_the_real_client(self) -> None:
        """A TwistedClient connects through the memory reactor: its Deferreds fire as bytes move."""
        server = MemoryServer()
        client = server.client()
        locking = client.lock("report", expires=1)
        self.assertNoResult(locking)
        server.flush()
        lock = self.successResultOf(locking)
        self.assertEqual(server.service.status("report"), KeyStatus("report", 1, 0))
        server.advance(1)
        self.assertEqual(server.service.status("report"), KeyStatus("report", 0, 0))
        released = lock.release()
        server.flush()
        self.assertFalse(self.successResultOf(released))
        closed = client.close()
        server.flush()
        self.successResultOf(closed)
        self.assertEqual(server.connections, 0)

    def test_nothing_listening(self) -> None:
        """A client of a port nothing listens on is refused (after its retries, on the clock)."""
        server = MemoryServer()
        client = server.client(servers="127.0.0.1:1")
        status = client.status("k")
        server.advance(60)
        self.failureResultOf(status, ConnectFailed)

    def test_stop(self) -> None:
        """
        Stopping the server closes every connection, one after the other:
        the holder's closes first, which grants the waiter, whose
        connection closes next; both locks are lost, the table is empty.
        """
        server = MemoryServer()
        holder, waiter = server.client(), server.client()
        holding = holder.lock("k")
        server.flush()
        lock = self.successResultOf(holding)
        waiting = waiter.lock("k")
        server.flush()
        self.assertNoResult(waiting)
        server.stop()
        self.assertTrue(lock.lost)
        self.assertTrue(self.successResultOf(waiting).lost)
        self.assertEqual(server.connections, 0)
        self.assertEqual(server.service.listing(), [])


    def test_stop_ends_the_sessions_nobody_can_resume(self) -> None:
        """As a real port does, a listener that stops stops its factory: elock ends its detached sessions."""
        server = MemoryServer(elock_ports=["tcp:11401"])
        holder = server.connect("elock")
        self.assertEqual(holder.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        holder.abort()
        self.assertEqual(server.service.status("k"), KeyStatus("k", 1, 0))  # in its grace period
        server.stop()
        self.assertEqual(server.service.listing(), [])
        self.assertTrue(server.server.factories["elock"].stopped)


class Recording(ClientFactory):
    """A client factory that records what it is told (builds a L{Protocol}, or none if C{builds} is false)."""

    def __init__(self, builds: bool = True) -> None:
        self.builds = builds
        self.told: list = []

    def buildProtocol(self, addr: object) -> Optional[Protocol]:
        return Protocol() if self.builds else None

    def clientConnectionFailed(self, connector: object, reason: Failure) -> None:
        self.told.append(("failed", connector, reason.type))

    def clientConnectionLost(self, connector: object, reason: Failure) -> None:
        self.told.append(("lost", connector, reason.type))


class ConnectorTests(SynchronousTestCase):
    def test_each_attempt_has_its_own_connector(self) -> None:
        """
        A connectUNIX or connectSSL on the same reactor (never paired: only
        TCP is) does not shift which connector a TCP attempt is told about.
        """
        server = MemoryServer()
        unix, ssl = Recording(), Recording()
        server.reactor.connectUNIX("/nowhere.sock", unix)
        server.reactor.connectSSL("127.0.0.1", 11400, ssl, None)
        refused, accepted = Recording(), Recording()
        refused_connector = server.reactor.connectTCP("127.0.0.1", 1, refused)
        server.reactor.connectTCP("127.0.0.1", 11400, accepted)
        server.flush()
        self.assertEqual(refused.told, [("failed", refused_connector, ConnectionRefusedError)])
        self.assertEqual((accepted.told, unix.told, ssl.told), ([], [], []))
        self.assertEqual(server.connections, 1)

    def test_a_client_factory_that_builds_nothing_is_told(self) -> None:
        """A client factory that builds no protocol is told its connection was lost, as by a real connector."""
        server = MemoryServer()
        server.reactor.connectSSL("127.0.0.1", 11400, Recording(), None)
        factory = Recording(builds=False)
        connector = server.reactor.connectTCP("127.0.0.1", 11400, factory)
        server.flush()
        self.assertEqual(factory.told, [("lost", connector, ConnectionDone)])
        self.assertEqual(server.connections, 0)

    def test_a_listener_that_builds_nothing_closes(self) -> None:
        """A server factory whose buildProtocol returns None closes the connection at once, as a real port does."""
        server = MemoryServer()
        self.patch(server.server.factories["jesync"], "buildProtocol", lambda addr: None)
        peer = server.connect()
        self.assertTrue(peer.closed)
        self.assertIsInstance(peer.lost.value, ConnectionDone)
        self.assertEqual(server.connections, 0)


class SettingsTests(SynchronousTestCase):
    def test_settings_are_the_servers(self) -> None:
        """The limits are the real server's, from its settings."""
        server = MemoryServer(ServerSettings(ports=["tcp:7000"], max_held=1))
        self.assertEqual(server.address(), "127.0.0.1:7000")
        peer = server.connect()
        self.assertEqual(peer.ask(b"lock a\n"), b"GRANTED 1 0 a 120\n")
        self.assertTrue(peer.ask(b"lock b\n").startswith(b"INVALID_PARAMETER"))

    def test_twistd_arguments(self) -> None:
        """from_args reads twistd jesync's options, as the tap does."""
        server = MemoryServer.from_args(["--port", "tcp:7001:interface=127.0.0.1", "--elock-port", "7002"])
        self.assertEqual((server.address(), server.address("elock")), ("127.0.0.1:7001", "127.0.0.1:7002"))
        self.assertEqual(server.connect("elock").ask(b"lock k\r\n"), b"200 Acquired\r\n")


class DocsExampleTests(SynchronousTestCase):
    def test_the_example_runs_as_written(self) -> None:
        """docs/testing.md's example is a test module: every test in it passes."""
        text = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text(encoding="utf-8")
        [example] = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
        namespace: dict = {"__name__": "docs_testing_example"}
        exec(compile(example, "docs/testing.md", "exec"), namespace)
        defined = [value for value in namespace.values() if getattr(value, "__module__", None) == namespace["__name__"]]
        suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(case) for case in defined)
        result = unittest.TestResult()
        suite.run(result)
        self.assertEqual((result.testsRun, result.errors, result.failures), (2, [], []))
