"""
The rules the connection layer (L{jesync.connections}) holds every protocol
to, where time is the point or no socket is needed: the real factories over
L{StringTransport}s, on a L{Clock} (L{tests.support.UnitServer}).

 - --auth-timeout and --idle-timeout;
 - numbers have at most 10 digits; a CR inside a line is no separator;
 - the metrics endpoint's own connection cap;
 - a listing goes out in pieces bounded in bytes;
 - after a FIN, a request that would wait is answered not-granted.

The same rules through real TCP are in L{tests.tcp.test_connection_rules}.
"""

from __future__ import annotations

from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.policy import ConnectionPolicy
from jesync.interfaces import KeyStatus
from tests.support import UnitServer


class TimeoutUnitTests(SynchronousTestCase):
    """The auth and idle timeouts, on a L{Clock}."""

    def server(self, **policy) -> UnitServer:
        server = UnitServer()
        server.policy = ConnectionPolicy(**policy)
        server.factory.policy = server.elock_factory.policy = server.policy
        return server

    def test_auth_timeout(self) -> None:
        server = self.server(auth_token=b"t", auth_timeout=10.0)
        late, prompt, elock = server.connect(), server.connect(), server.connect_elock()
        self.assertEqual(prompt.ask(b"auth t\n"), b"OK\n")
        server.clock.advance(9.99)
        self.assertFalse(late.closing or elock.closing)
        server.clock.advance(0.01)
        self.assertEqual(late.take(), b"INVALID_PARAMETER: auth-timeout exceeded (10)\n")
        self.assertEqual(elock.take(), b"503 auth-timeout exceeded (10)\r\n")
        self.assertTrue(late.closing and elock.closing)
        self.assertFalse(prompt.closing)
        for client in (late, prompt, elock):
            client.lose()
        self.assertEqual(server.clock.getDelayedCalls(), [])

    def test_idle_timeout(self) -> None:
        server = self.server(idle_timeout=30.0)
        holder, waiter, idle, chatty = server.connect(), server.connect(), server.connect(), server.connect()
        session_holder, session_idle = server.connect_elock(), server.connect_elock()
        self.assertEqual(holder.ask(b"lock k 1 -1 0\n"), b"GRANTED 1 0 k 0\n")
        self.assertEqual(waiter.ask(b"lock k\n"), b"")
        self.assertEqual(session_holder.ask(b"lock e\r\n"), b"200 Acquired\r\n")
        self.assertEqual(session_idle.ask(b"lock f\r\nunlock f\r\n"), b"200 Acquired\r\n200 Unlocked\r\n")
        for _ in range(5):
            server.clock.advance(20)
            self.assertEqual(chatty.ask(b"status k\n"), b"STATUS 1 1 k\n")
        # 100 s on: the idle ones are closed, those that hold, wait or talk are not.
        self.assertEqual(idle.take(), b"INVALID_PARAMETER: idle-timeout exceeded (30)\n")
        self.assertEqual(session_idle.take(), b"503 idle-timeout exceeded (30)\r\n")
        self.assertEqual(
            [client.closing for client in (holder, waiter, idle, chatty, session_holder, session_idle)],
            [False, False, True, False, False, True],
        )
        self.assertEqual(server.service.status("k"), KeyStatus("k", 1, 1))
        server.clock.advance(29)
        self.assertFalse(chatty.closing)
        server.clock.advance(1)
        self.assertTrue(chatty.closing)


class NumberAndFieldRulesTests(SynchronousTestCase):
    def test_at_most_ten_digits(self) -> None:
        client = UnitServer().connect()
        self.assertEqual(client.ask(b"lock k 0000000001 00000000 0000000000\n"), b"GRANTED 1 0 k 0\n")
        for line, name in [
            (b"lock j 00000000001\n", b"max_concurrent"),
            (b"lock j 1 -00000000001\n", b"timeout"),
            (b"lock j 1 1 00000000120\n", b"expires"),
        ]:
            self.assertEqual(client.ask(line), b"INVALID_PARAMETER: %s is out of range\n" % name)
        elock = UnitServer().connect_elock()
        self.assertEqual(elock.ask(b"lock k 00000000005\r\n"), b"400 wait is out of range\r\n")
        self.assertEqual(elock.ask(b"set_timeout 00000000001000\r\n"), b"400 timeout is out of range\r\n")

    def test_carriage_return_inside_a_line(self) -> None:
        server = UnitServer()
        client, elock = server.connect(), server.connect_elock()
        refused = b"INVALID_PARAMETER: a key cannot contain a carriage return\n"
        self.assertEqual(client.ask(b"status a\rb\n"), refused)
        self.assertEqual(client.ask(b"lock a\rb\r\n"), refused)
        self.assertEqual(client.ask(b"lock a 1\r5\n"), b"INVALID_PARAMETER: max_concurrent is not an integer\n")
        self.assertEqual(client.ask(b"\rstatus a\n"), b"INVALID_COMMAND\n")
        # One CR before the LF ends the line, as ever.
        self.assertEqual(client.ask(b"status a\r\n"), b"STATUS 0 0 a\n")
        self.assertEqual(elock.ask(b"unlock a\rb\r\n"), b"400 a key cannot contain a carriage return\r\n")
        self.assertEqual(elock.ask(b"conn_id a\rb\r\n"), b"400 a conn id cannot contain a carriage return\r\n")
        self.assertEqual(server.service.listing(), [])


class MetricsConnectionCapTests(SynchronousTestCase):
    def test_own_cap(self) -> None:
        """The metrics endpoint counts its connections in a registry of its own, with its own cap."""
        from twisted.internet.protocol import Factory, Protocol

        from jesync.connections.policy import Connections
        from jesync.metrics_connections import CountedFactory

        registry = Connections(2)
        counted = CountedFactory(Factory.forProtocol(Protocol), registry)
        transports = [StringTransport() for _ in range(3)]
        protocols = [counted.buildProtocol(None) for _ in transports]
        for protocol, transport in zip(protocols, transports):
            protocol.makeConnection(transport)
        self.assertEqual(len(registry), 2)
        self.assertTrue(transports[2].disconnecting)
        self.assertTrue(transports[2].value().startswith(b"HTTP/1.1 503 "))
        self.assertEqual([t.disconnecting for t in transports[:2]], [False, False])
        for protocol in protocols:
            protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(len(registry), 0)


class ReviewRegressionUnitTests(SynchronousTestCase):
    def test_pieces_are_bounded_in_bytes(self) -> None:
        """A listing of long keys still goes out in pieces of about 16 KiB."""
        from jesync.connections.grammar import PIECE

        server = UnitServer()
        server.service.max_held = None
        holder = server.connect()
        keys = [b"%04d-%s" % (n, b"x" * 1000) for n in range(300)]
        holder.ask(b"".join(b"lock %s 1 -1 0\n" % key for key in keys))
        writes: list[int] = []
        real_write = holder.transport.write
        holder.transport.write = lambda data: writes.append(len(data)) or real_write(data)
        holder.send(b"status-by-key\n")
        while server.clock.getDelayedCalls():
            server.clock.advance(0)
        self.assertLessEqual(max(writes), PIECE + 1100)
        self.assertGreater(len(writes), 10)


class AfterFinUnitTests(SynchronousTestCase):
    def test_would_wait_is_not_granted_whatever_the_limits(self) -> None:
        """
        After a FIN, a request held back behind a wait that would wait is
        answered not-granted, not with the limit waiting would have met.
        """
        server = UnitServer()
        holder, waiter, client = server.connect(), server.connect(), server.connect_elock()
        holder.ask(b"lock a\nlock k\n")
        self.assertEqual(waiter.ask(b"lock k\n"), b"")
        self.assertEqual(client.ask(b"lock a 5\r\nlock k 5\r\n"), b"")
        server.service.max_total_waits = 1
        client.protocol.readConnectionLost()
        server.clock.advance(0)
        self.assertEqual(client.take(), b"409 Unavailable\r\n409 Unavailable\r\n")
        self.assertTrue(client.closing)
        self.assertEqual(server.service.status("k"), KeyStatus("k", 1, 1))
