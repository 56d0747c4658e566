"""
The JESync protocol over real TCP, against a server listening in this process
(built with the embedding API: C{JESyncFactory(LockService(reactor))}).
Only what needs a real socket is here: back-pressure on a real TCP buffer,
thousands of connections, the embedding API on a real port, half-close (a
FIN alone), UNIX peers; and the line framing over TCP.  The protocol's
behaviour (locking, renewal, expiry, release, status, quit, bad input,
disconnects, opaque keys) is tested against the real server in memory:
tests/unit/test_jesync_in_memory.py.

Nothing here sleeps: every step waits for the reply line it expects (or the
connection closing), with a bounded timeout.  That a line is I{not} sent is
shown by order: the next line a client reads is the reply to a later command.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from socket import SO_RCVBUF, SO_SNDBUF, SOL_SOCKET
from unittest import skipIf

from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.protocol import Factory
from twisted.trial.unittest import TestCase

from jesync import JESyncFactory, LockService
from tests.support import (
    TIMEOUT,
    ConnectionTracker,
    Flood,
    LineClient,
    TCPServer,
    unsent_bytes,
)

MAX_LINE = 8192


class TCPTestCase(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.server = yield TCPServer.start(self)
        self.service = self.server.service

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    def connect(self) -> Deferred:
        return self.server.connect()

    def connect_many(self, count: int) -> Deferred:
        return self.server.connect_many(count)

    @inlineCallbacks
    def wait_gone(self, client):
        """Wait until the server has seen C{client}'s connection go."""
        yield client.wait_closed()
        yield self.server.wait_server_lost([self.server.protocol_for(client)])


class FramingTests(TCPTestCase):
    @inlineCallbacks
    def test_line_in_pieces(self):
        client = yield self.connect()
        self.assertEqual((yield client.ask(b"status k\n")), b"STATUS 0 0 k\n")
        served = self.server.protocol_for(client)
        real_received = served.dataReceived
        arrivals: list[Deferred[None]] = []

        def dataReceived(data):
            real_received(data)
            if arrivals:
                arrivals.pop(0).callback(None)

        served.dataReceived = dataReceived
        # each piece reaches the server on its own before the next is sent
        for piece in [b"lock k 2 ", b"-1 30", b"\r"]:
            arrival = Deferred()
            arrivals.append(arrival)
            client.send(piece)
            yield arrival.addTimeout(TIMEOUT, reactor)
        self.assertEqual(client.unread(), b"")
        self.assertEqual((yield client.ask(b"\nstatus k\n", 2)), b"GRANTED 1 0 k 30\nSTATUS 1 0 k\n")


class LineLengthTests(TCPTestCase):
    @inlineCallbacks
    def test_too_long_closes_only_that_connection(self):
        client, other = yield self.connect_many(2)
        yield client.ask(b"lock held\n")
        yield other.ask(b"lock mine\n")
        key = b"k" * (MAX_LINE + 1 - len(b"status "))
        self.assertEqual(
            (yield client.ask(b"status a\nstatus " + key + b"\nstatus b\n", 2)),
            b"STATUS 0 0 a\nINVALID_PARAMETER: line too long\n",
        )
        reason = yield client.wait_closed()
        self.assertIsInstance(reason, ConnectionDone)
        self.assertEqual(client.unread(), b"")
        self.assertEqual(
            (yield other.ask(b"lock held 1 0\nstatus-by-key\n", 4)),
            b"GRANTED 1 0 held 120\nSTATUS 1 0 held\nSTATUS 1 0 mine\nEND\n",
        )

    @inlineCallbacks
    def test_endless_line(self):
        client, other = yield self.connect_many(2)
        client.send(b"x" * 100000)
        self.assertEqual((yield client.read_line()), b"INVALID_PARAMETER: line too long\n")
        reason = yield client.wait_closed()
        # the server may close with unread bytes, which is a reset
        self.assertIsInstance(reason, (ConnectionDone, ConnectionLost))
        self.assertEqual(client.unread(), b"")
        self.assertEqual((yield other.ask(b"status x\n")), b"STATUS 0 0 x\n")


class BackpressureTests(TCPTestCase):
    @inlineCallbacks
    def test_client_that_does_not_read(self):
        # Small kernel buffers, so that the server's own buffer fills soon.
        self.server.port.socket.setsockopt(SOL_SOCKET, SO_SNDBUF, 8192)
        slow, other = yield self.connect_many(2)
        slow.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 8192)
        self.assertEqual((yield slow.ask(b"status x\n")), b"STATUS 0 0 x\n")
        served = self.server.protocol_for(slow)
        transport = served.transport
        paused: Deferred[None] = Deferred()
        real_pause = served.pauseProducing

        def pauseProducing():
            real_pause()
            if not paused.called:
                paused.callback(None)

        served.pauseProducing = pauseProducing
        most_unsent = [0]
        real_write = transport.write

        def write(data):
            real_write(data)
            most_unsent[0] = max(most_unsent[0], unsent_bytes(transport))

        transport.write = write

        # The client stops reading and writes status commands as fast as
        # the connection takes them, until the server stops reading it.
        slow.transport.pauseProducing()
        chunk = b"status x\n" * 1000
        flood = Flood(slow.transport, chunk, lambda: paused.called, limit=64 * 2**20)
        flood.start()
        yield paused.addTimeout(20, reactor)
        flood.finish()
        sent = flood.written // len(b"status x\n")
        self.assertTrue(served.paused)
        # ... and keeps writing.
        slow.send(b"status x\n" * 20000 + b"status end\n")
        sent += 20000

        # Meanwhile another client is served.
        self.assertEqual((yield other.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        for _ in range(20):
            self.assertEqual((yield other.ask(b"status k\nstatus-by-key\n", 3)), b"STATUS 1 0 k\nSTATUS 1 0 k\nEND\n")
            self.assertTrue(served.paused)
        bound = transport.bufferSize + len(b"STATUS 0 0 x\n")
        self.assertLessEqual(most_unsent[0], bound)
        self.assertLessEqual(unsent_bytes(transport), bound)
        self.assertGreater(unsent_bytes(transport), 0)  # else it would have resumed

        # When it reads at last, everything is answered, in order.
        transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 2**20)
        slow.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 2**20)
        slow.transport.resumeProducing()
        replies = yield slow.read_lines(sent + 1, timeout=20)
        self.assertEqual(len(replies), sent + 1)
        self.assertEqual(set(replies[:-1]), {b"STATUS 0 0 x\n"})
        self.assertEqual(replies[-1], b"STATUS 0 0 end\n")
        self.assertFalse(served.paused)
        self.assertEqual((yield slow.ask(b"status k\n")), b"STATUS 1 0 k\n")
        self.assertLessEqual(most_unsent[0], bound)


class ManyConnectionsTests(TCPTestCase):
    @inlineCallbacks
    def setUp(self):
        self.server = yield TCPServer.start(self, backlog=512)
        self.service = self.server.service

    @inlineCallbacks
    def read_replies(self, client):
        """The replies to lock own, lock shared, status own."""
        lines = yield client.read_lines(2)
        if lines[1].startswith(b"GRANTED"):
            lines += yield client.read_lines(1)
        return lines

    @inlineCallbacks
    def test_thousands_of_connections(self):
        total, batch = 2000, 200
        for first in range(0, total, batch):
            clients = yield self.connect_many(batch)
            for n, client in enumerate(clients, first):
                client.send(b"lock own%d\nlock shared\nstatus own%d\n" % (n, n))
            replies = yield gatherResults([self.read_replies(client) for client in clients], consumeErrors=True)
            expected = [[b"GRANTED 1 0 own%d 120\n" % n, b"STATUS 1 0 own%d\n" % n] for n in range(first, first + batch)]
            # whichever asked first got the shared key
            (winner,) = [i for i, lines in enumerate(replies) if len(lines) == 3]
            expected[winner].insert(1, b"GRANTED 1 0 shared 120\n")
            self.assertEqual(replies, expected)
            self.assertEqual(self.service.status("shared"), ("shared", 1, batch - 1))
            yield gatherResults(
                [(client.disconnect() if n % 2 else client.abort()) for n, client in enumerate(clients)],
                consumeErrors=True,
            )
        yield self.server.wait_server_lost(timeout=20)
        self.assertEqual(len(self.server.protocols), total)
        self.assertEqual(self.service.listing(), [])
        self.assertEqual(getattr(self.service, "_owners", {}), {})
        client = yield self.connect()
        self.assertEqual(
            (yield client.ask(b"status-by-key\nlock shared\n", 2)), b"END\nGRANTED 1 0 shared 120\n"
        )


class EmbeddingTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def test_embedding_api(self):
        from twisted.internet.endpoints import TCP4ServerEndpoint, TCP4ClientEndpoint, connectProtocol

        from jesync import JESyncFactory, LockService
        from tests.support import LineClient

        service = LockService(reactor)
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(JESyncFactory(service))
        self.addCleanup(port.stopListening)
        client = yield connectProtocol(
            TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port), LineClient()
        ).addTimeout(TIMEOUT, reactor)
        self.assertEqual((yield client.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual([tuple(row) for row in service.listing()], [("k", 1, 0)])
        self.assertEqual((yield client.ask(b"release k\nquit\n")), b"RELEASED 0 0 k\n")
        yield client.wait_closed()
        self.assertEqual(service.listing(), [])


class HalfCloseTests(TCPTestCase):
    @inlineCallbacks
    def test_client_that_half_closes_gets_its_replies(self):
        """
        A client may send its commands and shut down its sending side (as
        C{nc -N} does): it is answered, then the server closes.  Its wait
        ends at the FIN, not granted.
        """
        client, other = yield self.connect_many(2)
        yield other.ask(b"lock held\n")
        client.send(b"lock mine\nstatus-by-key\nlock held\nstatus held\n")
        client.transport.loseWriteConnection()
        self.assertEqual(
            (yield client.read_lines(6)),
            [
                b"GRANTED 1 0 mine 120\n",
                b"STATUS 1 0 held\n",
                b"STATUS 1 0 mine\n",
                b"END\n",
                b"STATUS 1 1 held\n",
                b"TIMEOUT 1 0 held\n",
            ],
        )
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        self.assertEqual(client.unread(), b"")
        yield self.wait_gone(client)
        self.assertEqual((yield other.ask(b"status-by-key\n", 2)), b"STATUS 1 0 held\nEND\n")


class UnixPeerTests(TestCase):
    timeout = 30

    @skipIf(not sys.platform.startswith("linux"), "abstract UNIX socket names are Linux's")
    @inlineCallbacks
    def test_client_with_undecodable_socket_name(self):
        """
        The peer's name only goes into the log: a client bound to an abstract
        socket name that is not UTF-8 is served like any other.
        """
        directory = tempfile.mkdtemp(prefix="jesync-")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "s.sock")
        service = LockService(reactor)
        factory = JESyncFactory(service)
        tracker = ConnectionTracker(factory)
        port = yield UNIXServerEndpoint(reactor, path).listen(factory)
        self.addCleanup(port.stopListening)

        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(raw.close)
        raw.bind(b"\0\xff\xfejesync-test-%d" % os.getpid())
        raw.connect(path)  # the listen backlog takes it at once
        raw.setblocking(False)
        clients = []
        client_factory = Factory.forProtocol(LineClient)
        real_build = client_factory.buildProtocol
        client_factory.buildProtocol = lambda addr: clients.append(real_build(addr)) or clients[-1]
        reactor.adoptStreamConnection(raw.fileno(), socket.AF_UNIX, client_factory)
        (client,) = clients
        self.addCleanup(lambda: tracker.close_all(clients))
        self.assertEqual((yield client.ask(b"lock k\nstatus k\n", 2)), b"GRANTED 1 0 k 120\nSTATUS 1 0 k\n")
        (served,) = tracker.protocols
        self.assertEqual(served.peer, "unix:\x00\\xff\\xfejesync-test-%d" % os.getpid())
        yield client.disconnect()
        yield tracker.wait_lost()
        self.assertEqual(service.listing(), [])
        self.assertEqual(self.flushLoggedErrors(), [])
