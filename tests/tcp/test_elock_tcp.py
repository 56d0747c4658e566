"""
The elock protocol over real TCP, next to JESync: one L{LockService} shared by
a L{JESyncFactory}, an L{ELockFactory} and the operator's L{AdminFactory},
each listening on 127.0.0.1 port 0, in this process.  Only the line framing
over a real socket is here; the protocol's behaviour (sessions, grace
periods, the shared table, pipelining, bad input) is tested against the real
server in memory: tests/unit/test_elock_in_memory.py.

Nothing here sleeps: every step waits for the reply line it expects, or a
connection closing, with a bounded timeout.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from jesync import ELockFactory, JESyncFactory, LockService
from jesync.connections.policy import ConnectionPolicy
from jesync.protocols.admin import AdminFactory
from tests.support import TIMEOUT, ConnectionTracker, LineClient, stats

MAX_LINE = 8192
class SharedServer:
    """
    A lock service served over JESync and elock, each on its own port.

    L{start} registers a cleanup that closes every client and server
    connection, stops listening, ends the sessions still in their grace
    period (so no grace timer outlives the test), and checks that the lock
    table was left empty.
    """

    def __init__(self, test) -> None:
        self.test = test
        self.service = LockService(reactor)
        self.policy = ConnectionPolicy()
        self.jesync_factory = JESyncFactory(self.service, policy=self.policy)
        self.elock_factory = ELockFactory(self.service, policy=self.policy)
        self.sessions = self.elock_factory.sessions
        self.admin_factory = AdminFactory(self.service, policy=self.policy, sessions=self.sessions)
        self.trackers = {
            "jesync": ConnectionTracker(self.jesync_factory),
            "elock": ConnectionTracker(self.elock_factory),
            "admin": ConnectionTracker(self.admin_factory),
        }
        self.clients: dict[str, list[LineClient]] = {"jesync": [], "elock": [], "admin": []}
        self.ports: dict[str, object] = {}
        # peer port -> fires with the server side once it is connected
        self._connected: dict[int, Deferred] = {}
        for factory in (self.jesync_factory, self.elock_factory, self.admin_factory):
            self._announce_connections(factory)

    def _announce_connections(self, factory) -> None:
        build = factory.buildProtocol

        def buildProtocol(addr):
            protocol = build(addr)
            made = protocol.connectionMade

            def connectionMade():
                made()
                self._server_side(addr.port).callback(protocol)

            protocol.connectionMade = connectionMade
            return protocol

        factory.buildProtocol = buildProtocol

    def _server_side(self, port: int) -> Deferred:
        return self._connected.setdefault(port, Deferred())

    @classmethod
    @inlineCallbacks
    def start(cls, test):
        server = cls(test)
        test.addCleanup(server.shutdown)
        for name, factory in [
            ("jesync", server.jesync_factory),
            ("elock", server.elock_factory),
            ("admin", server.admin_factory),
        ]:
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            server.ports[name] = yield endpoint.listen(factory)
        return server

    @inlineCallbacks
    def _connect(self, name: str):
        port = self.ports[name].getHost().port
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
        client.kind = name
        self.clients[name].append(client)
        client.served = yield self._server_side(client.transport.getHost().port).addTimeout(TIMEOUT, reactor)
        return client

    def elock(self) -> Deferred:
        return self._connect("elock")

    def jesync(self) -> Deferred:
        return self._connect("jesync")

    def admin(self) -> Deferred:
        return self._connect("admin")

    @inlineCallbacks
    def shutdown(self):
        for name, tracker in self.trackers.items():
            yield tracker.close_all(self.clients[name])
        for port in self.ports.values():
            yield port.stopListening()
        self.test.assertEqual(self.elock_factory.clients, 0)
        # Every connection is gone, so every session left is in its grace
        # period; end them now rather than leave their timers behind:
        # resuming one cancels its timer, ending it releases its locks.
        for session in list(self.sessions._sessions.values()):
            self.test.assertIsNone(session.connection, session)
            self.test.assertIs(self.sessions.take(self, session.id), session)
            session.end()
        self.test.assertEqual(len(self.sessions), 0)
        self.test.assertEqual(self.service.listing(), [])


class ELockTCPTestCase(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.server = yield SharedServer.start(self)
        self.service = self.server.service
        self.sessions = self.server.sessions

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def session_id(self, client: LineClient):
        reply = yield client.ask(b"conn_id\r\n")
        self.assertTrue(reply.startswith(b"200 ") and reply.endswith(b"\r\n"), reply)
        return reply[4:-2]


class FramingTests(ELockTCPTestCase):
    @inlineCallbacks
    def test_many_pipelined_in_one_write(self):
        client = yield self.server.elock()
        commands = b"".join(b"lock k%d\r\nunlock k%d\r\nunlock k%d\r\n" % (i, i, i) for i in range(500))
        expected = b"200 Acquired\r\n200 Unlocked\r\n403 not_locked\r\n" * 500
        self.assertEqual((yield client.ask(commands + b"stats\r\n", 1505)), expected + stats(1, 0, 0))

    @inlineCallbacks
    def test_ids_are_random(self):
        first = yield self.server.elock()
        second = yield self.server.elock()
        first_id = yield self.session_id(first)
        second_id = yield self.session_id(second)
        self.assertNotEqual(first_id, second_id)
        for session_id in (first_id, second_id):
            self.assertGreaterEqual(len(session_id), 20, session_id)
            self.assertFalse(session_id.isdigit(), session_id)
        self.assertEqual((yield self.session_id(first)), first_id)
