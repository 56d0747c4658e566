"""
L{jesync.reactor.ReadIntoServer} over a real socket pair: each C{doRead}
hands the protocol exactly the bytes that arrived, as C{bytes} of their own
(a later read into the shared buffer never changes an earlier one); a read
with nothing there is no event, the peer's close is a clean
C{ConnectionDone}, a reset a C{ConnectionLost}; and the reactor listens
with it on PyPy, where it pays (the class's docstring says why).
"""

from __future__ import annotations

import platform
import socket
import struct
from typing import List

from twisted.internet import main, tcp
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import SynchronousTestCase

from jesync.reactor import JESyncEPollReactor, ReadIntoPort, ReadIntoServer


class Recording(Protocol):
    def __init__(self) -> None:
        self.received: List[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)


class ReadIntoServerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = JESyncEPollReactor()
        self.addCleanup(self.reactor._poller.close)
        self.addCleanup(self.reactor.waker.connectionLost, None)
        mine, self.peer = socket.socketpair()
        self.addCleanup(self.peer.close)
        mine.setblocking(False)
        self.protocol = Recording()
        self.server = ReadIntoServer(mine, self.protocol, ("127.0.0.1", 1), None, 1, self.reactor)
        self.addCleanup(mine.close)
        self.addCleanup(self.server.stopReading)

    def test_each_read_is_its_own_bytes(self) -> None:
        self.peer.sendall(b"lock first 60\r\n")
        self.assertIsNone(self.server.doRead())
        self.peer.sendall(b"release first\r\n")
        self.assertIsNone(self.server.doRead())
        self.assertEqual(self.protocol.received, [b"lock first 60\r\n", b"release first\r\n"])
        self.assertEqual([type(data) for data in self.protocol.received], [bytes, bytes])

    def test_a_read_of_a_full_buffer(self) -> None:
        payload = bytes(range(256)) * 300  # more than one buffer's worth
        self.peer.sendall(payload)
        while sum(map(len, self.protocol.received)) < len(payload):
            self.assertIsNone(self.server.doRead())
        self.assertEqual(b"".join(self.protocol.received), payload)
        self.assertEqual(len(self.protocol.received[0]), ReadIntoServer.bufferSize)

    def test_nothing_to_read_is_no_event(self) -> None:
        self.assertIsNone(self.server.doRead())
        self.assertEqual(self.protocol.received, [])

    def test_the_peer_closing_is_connection_done(self) -> None:
        self.peer.close()
        self.assertIs(self.server.doRead(), main.CONNECTION_DONE)
        self.assertEqual(self.protocol.received, [])

    def test_a_reset_is_connection_lost(self) -> None:
        reset = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(reset.close)
        client = socket.create_connection(reset.getsockname())
        accepted, _ = reset.accept()
        self.addCleanup(accepted.close)
        accepted.setblocking(False)
        server = ReadIntoServer(accepted, Recording(), ("127.0.0.1", 1), None, 2, self.reactor)
        self.addCleanup(server.stopReading)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # (an RST: SO_LINGER with a zero timeout)
        self.assertIs(server.doRead(), main.CONNECTION_LOST)


class ListenTests(SynchronousTestCase):
    def test_pypy_listens_reading_into_one_buffer(self) -> None:
        reactor = JESyncEPollReactor()
        self.addCleanup(reactor._poller.close)
        self.addCleanup(reactor.waker.connectionLost, None)
        port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        if platform.python_implementation() == "PyPy":
            self.assertIsInstance(port, ReadIntoPort)
        else:  # (CPython's recv shrinks its buffer in place: nothing to gain)
            self.assertIs(type(port), tcp.Port)
