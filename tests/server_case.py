"""
C{twistd jesync}'s service started in this process on real TCP ports
(L{Server}), and the base of the TCP tests that use it (L{ServerTestCase}).
"""

from __future__ import annotations

from socket import SO_RCVBUF, SO_SNDBUF, SOL_SOCKET

from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, UNIXClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.trial.unittest import TestCase

from jesync import tap
from jesync.interfaces import Totals
from jesync.lock_server import LockServer
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from tests.support import LOCAL, TIMEOUT, ConnectionTracker, DlockClient, Flood, LineClient, parse


def listening_port(child) -> Deferred:
    """The port a started C{StreamServerEndpointService} listens on (leaving it its own)."""
    port: Deferred = Deferred()

    def listening(result):
        port.callback(result)
        return result

    child._waitingForPort.addCallback(listening)
    return port.addTimeout(TIMEOUT, reactor)


class Server:
    """
    C{twistd jesync}'s service, built by L{tap.makeService} from options and
    started in this process: JESync (and elock) on 127.0.0.1, port 0, with a
    one-second shutdown grace unless told otherwise.

    L{start} registers a cleanup that aborts every client, stops the
    service (which closes whatever the server still has open) unless the
    test did, and checks that nothing is left: no connection, lock, wait or
    elock session.
    """

    def __init__(self, test, service: LockServer) -> None:
        self.test = test
        self.service = service
        self.locks = service.locks
        self.policy = service.policy
        self.factories: dict[str, object] = {}
        self.trackers: dict[str, ConnectionTracker] = {}
        self.ports: dict[str, object] = {}
        self.clients: list[LineClient] = []
        # (kind, client port) -> fires with the server side once it is connected
        self._connected: dict[tuple[str, int], Deferred] = {}

    @classmethod
    @inlineCallbacks
    def start(cls, test, *argv: str, port: str = LOCAL, elock: bool = True, dlock: bool = False):
        args = ["--port", port, "--shutdown-grace", "1"]
        if elock:
            args += ["--elock-port", LOCAL]
        if dlock:
            # dlock too (tests.tcp.test_dlock): connect("dlock") gives a DlockClient.
            args += ["--dlock-port", LOCAL]
        service = tap.makeService(parse(*args, *argv))
        server = cls(test, service)
        children = {}
        for child in service.listeners():
            if isinstance(child.factory, (JESyncFactory, ELockFactory)):
                kind = "jesync" if isinstance(child.factory, JESyncFactory) else "elock"
                children[kind] = child
                server._watch(kind, child.factory)
            elif dlock and child.factory is service.factories["dlock"]:
                children["dlock"] = child
                server._watch("dlock", child.factory)
        service.startService()
        test.addCleanup(server.shutdown)
        for kind, child in children.items():
            server.ports[kind] = yield listening_port(child)
        return server

    def _watch(self, kind: str, factory) -> None:
        self.factories[kind] = factory
        self.trackers[kind] = ConnectionTracker(factory)
        build = factory.buildProtocol

        def buildProtocol(addr):
            protocol = build(addr)
            made = protocol.connectionMade

            def connectionMade():
                made()
                if isinstance(addr, IPv4Address):
                    self._server_side(kind, addr.port).callback(protocol)

            protocol.connectionMade = connectionMade
            return protocol

        factory.buildProtocol = buildProtocol

    def _server_side(self, kind: str, port: int) -> Deferred:
        return self._connected.setdefault((kind, port), Deferred())

    @inlineCallbacks
    def connect(self, kind: str = "jesync"):
        """A L{LineClient} connected to C{kind}'s port; C{client.served} is the server side (TCP)."""
        address = self.ports[kind].getHost()
        if isinstance(address, IPv4Address):
            endpoint = TCP4ClientEndpoint(reactor, address.host, address.port, timeout=int(TIMEOUT))
        else:
            endpoint = UNIXClientEndpoint(reactor, address.name, timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, DlockClient() if kind == "dlock" else LineClient()).addTimeout(
            TIMEOUT, reactor
        )
        self.clients.append(client)
        client.kind = kind
        client.served = None
        if isinstance(address, IPv4Address):
            client.served = yield self._server_side(kind, client.transport.getHost().port).addTimeout(
                TIMEOUT, reactor
            )
        return client

    def jesync(self) -> Deferred:
        return self.connect("jesync")

    def elock(self) -> Deferred:
        return self.connect("elock")

    def dlock(self) -> Deferred:
        """A L{DlockClient} (a server started with C{dlock=True})."""
        return self.connect("dlock")

    @inlineCallbacks
    def connect_many(self, count: int, kind: str = "jesync"):
        clients = []
        for _ in range(count):
            clients.append((yield self.connect(kind)))
        return clients

    def wait_lost(self, client: LineClient) -> Deferred:
        """Fires once the server has seen C{client}'s connection go."""
        return self.trackers[client.kind].wait_lost([client.served])

    @inlineCallbacks
    def drop(self, client: LineClient, abort: bool = False):
        """Close C{client}'s connection and wait until the server has seen it go."""
        yield (client.abort() if abort else client.disconnect())
        yield self.wait_lost(client)

    def send(self, client: LineClient, data: bytes) -> Deferred:
        """Send C{data}; fires once the server side has received all of it (and acted on what it could)."""
        protocol = client.served
        received = protocol.dataReceived
        left = [len(data)]
        arrived: Deferred[None] = Deferred()

        def dataReceived(chunk: bytes) -> None:
            received(chunk)
            left[0] -= len(chunk)
            if left[0] <= 0 and not arrived.called:
                del protocol.dataReceived
                arrived.callback(None)

        protocol.dataReceived = dataReceived
        client.send(data)
        return arrived.addTimeout(TIMEOUT, reactor)

    @inlineCallbacks
    def fill(self, client: LineClient, data: bytes | None = None, small_buffers: bool = True):
        """
        Make C{client} a slow reader: it stops reading and pipelines
        C{status x} (or sends C{data}) until the server stops reading it
        (its replies fill every buffer).  Fires with how many C{status x}
        it sent.
        """
        served = client.served
        if small_buffers:
            served.transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 8192)
            client.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 8192)
        paused: Deferred[None] = Deferred()
        real_pause = served.pauseProducing

        def pauseProducing():
            real_pause()
            if not paused.called and not stopped:
                stopped.append(True)
                # once the write that paused it is over
                reactor.callLater(0, paused.callback, None)

        stopped: list[bool] = []
        served.pauseProducing = pauseProducing
        client.transport.pauseProducing()
        line = b"status x\n"
        flood = Flood(client.transport, line * 1000, lambda: bool(stopped), limit=64 * 2**20)
        if data is None:
            flood.start()
        else:
            flood.stopped = True
            client.send(data)
        try:
            yield paused.addTimeout(20, reactor)
        finally:
            flood.finish()
            del served.pauseProducing
        self.test.assertTrue(served.paused)
        return flood.written // len(line)

    @inlineCallbacks
    def shutdown(self):
        for client in self.clients:
            if client.lost_reason is None:
                client.transport.abortConnection()
        yield gatherResults([client.wait_closed() for client in self.clients], consumeErrors=True)
        if self.service.running:
            yield self.service.stopService().addTimeout(TIMEOUT, reactor)
        self.test.assertEqual(len(self.policy.connections), 0)
        self.test.assertEqual(self.locks.listing(), [])
        self.test.assertEqual(self.locks.totals(), Totals(0, 0, 0))
        if "elock" in self.factories:
            self.test.assertEqual(len(self.factories["elock"].sessions), 0)
            self.test.assertEqual(self.factories["elock"].clients, 0)


class ServerTestCase(TestCase):
    timeout = 30

    def tearDown(self) -> None:
        # Never a traceback, whatever the test did.
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def assertRefused(self, client: LineClient, data: bytes, reply: bytes):
        """C{client} sends C{data}, is answered C{reply} and nothing else, and is closed."""
        client.send(data)
        reason = yield client.wait_closed()
        self.assertIsInstance(reason, ConnectionDone)
        self.assertEqual(client.unread(), reply)
