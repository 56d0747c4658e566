"""
Helpers shared by the protocol, TCP and twistd tests.

Unit tests drive L{jesync.protocols.jesync.JESyncProtocol} over a
L{StringTransport} with a L{Clock} (L{UnitServer}, L{UnitClient}).
Integration tests run a real listening server in-process (L{TCPServer}) and
talk to it with L{LineClient}, whose reads are Deferreds with a bounded
timeout: tests wait on events, never on sleeps.

Below them, what the tests of several tiers share: the options twistd
would parse (L{parse}), throwaway files (L{short_temp_dir}, L{write_file}),
the log (L{capture_log}), sockets and ports (L{keepalive_options},
L{taken_port}), and the skip without C{prometheus_client}.
"""

from __future__ import annotations

import errno
import importlib
import os
import shutil
import socket
import tempfile
from collections import deque
from socket import SO_KEEPALIVE, SOL_SOCKET
from typing import Any, Callable

from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import (
    Deferred,
    DeferredList,
    gatherResults,
    fail,
    inlineCallbacks,
)
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPullProducer
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer

from jesync import ELockFactory, JESyncFactory, LockService, tap
from jesync.connections.policy import ConnectionPolicy

# How long any single awaited event may take before the test fails.
TIMEOUT = 5.0


# -- unit: StringTransport + Clock ---------------------------------------------


class PausingTransport(StringTransport):
    """
    A L{StringTransport} that, like a real one, pauses its streaming producer
    once more than C{bufferSize} bytes are unsent, and resumes it when they
    are taken (L{drain}).
    """

    bufferSize = 2**16

    def write(self, data: bytes) -> None:
        super().write(data)
        if (
            self.producer is not None
            and self.producerState == "producing"
            and len(self.io.getvalue()) > self.bufferSize
        ):
            self.producer.pauseProducing()

    def drain(self) -> bytes:
        """Take everything written; resume the producer if it was paused."""
        data = self.value()
        self.clear()
        if self.producer is not None and self.producerState == "paused":
            self.producer.resumeProducing()
        return data


class UnitClient:
    """One connection to a L{UnitServer}: bytes in, bytes out, by hand."""

    def __init__(self, protocol, transport: StringTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def take(self) -> bytes:
        """Everything the server wrote since the last take."""
        data = self.transport.value()
        self.transport.clear()
        return data

    def ask(self, data: bytes) -> bytes:
        self.send(data)
        return self.take()

    @property
    def closing(self) -> bool:
        """The server asked its transport to close."""
        return bool(self.transport.disconnecting)

    def lose(self, reason: type[Exception] = ConnectionDone) -> None:
        """The connection went away (as the reactor would report it)."""
        self.protocol.connectionLost(Failure(reason()))


class UnitServer:
    """
    A lock service on a fake clock, the JESync factory serving it, and an
    elock factory over the same service (L{connect_elock}).
    """

    def __init__(self, verbose: bool = False) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.policy = ConnectionPolicy()
        self.factory = JESyncFactory(self.service, verbose=verbose, policy=self.policy)
        self.elock_factory = ELockFactory(self.service, verbose=verbose, policy=self.policy)
        self._next_port = 40000

    def connect(self, transport: StringTransport | None = None, peer=None) -> UnitClient:
        return self._connect(self.factory, transport, peer)

    def connect_elock(self, transport: StringTransport | None = None, peer=None) -> UnitClient:
        return self._connect(self.elock_factory, transport, peer)

    def _connect(self, factory, transport: StringTransport | None, peer) -> UnitClient:
        self._next_port += 1
        if peer is None:
            peer = IPv4Address("TCP", "127.0.0.1", self._next_port)
        return connect_unit(factory, peer, transport)


def connect_unit(factory, peer, transport: StringTransport | None = None) -> UnitClient:
    """A connection from C{peer} to C{factory}'s protocol, over C{transport} (a new StringTransport if None)."""
    if transport is None:
        transport = StringTransport(peerAddress=peer)
    else:
        transport.peerAddr = peer
    protocol = factory.buildProtocol(peer)
    protocol.makeConnection(transport)
    return UnitClient(protocol, transport)


# -- integration: a real server and line clients -------------------------------


class LineClient(Protocol):
    """
    A JESync client for tests: L{send} bytes, then C{yield read_line()}.

    Lines are delivered with their C{\\n} so tests compare exact bytes.
    Every read times out after L{TIMEOUT} seconds (or as told), and fails
    if the connection closes first.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._lines: deque[bytes] = deque()
        self._readers: deque[tuple[int, Deferred[list[bytes]]]] = deque()
        self.closed: Deferred[None] = Deferred()
        self.lost_reason: Failure | None = None

    # -- Protocol

    def dataReceived(self, data: bytes) -> None:
        data = self._buffer + data if self._buffer else data
        start = 0
        lines = self._lines
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            lines.append(data[start : end + 1])
            start = end + 1
        self._buffer = data[start:]
        self._serve()

    def connectionLost(self, reason: Failure = None) -> None:
        self.lost_reason = reason
        readers, self._readers = self._readers, deque()
        for count, reader in readers:
            reader.errback(reason)
        self.closed.callback(None)

    def _serve(self) -> None:
        while self._readers and len(self._lines) >= self._readers[0][0]:
            count, reader = self._readers.popleft()
            reader.callback([self._lines.popleft() for _ in range(count)])

    # -- the test's side

    def send(self, data: bytes) -> None:
        self.transport.write(data)

    def read_lines(self, count: int, timeout: float = TIMEOUT) -> Deferred[list[bytes]]:
        """The next C{count} lines, all within C{timeout} seconds."""
        if self.lost_reason is not None and len(self._lines) < count:
            return fail(self.lost_reason)
        entry: tuple[int, Deferred[list[bytes]]]
        reader: Deferred[list[bytes]] = Deferred(lambda d: self._readers.remove(entry))
        entry = (count, reader)
        self._readers.append(entry)
        self._serve()
        return reader.addTimeout(timeout, reactor)

    def read_line(self, timeout: float = TIMEOUT) -> Deferred[bytes]:
        """The next line received (with its C{\\n})."""
        return self.read_lines(1, timeout).addCallback(lambda lines: lines[0])

    def ask(self, data: bytes, count: int = 1, timeout: float = TIMEOUT) -> Deferred:
        """Send C{data}; then the next line (C{count} == 1) or C{count} lines, joined."""
        self.send(data)
        if count == 1:
            return self.read_line(timeout)
        return self.read_lines(count, timeout).addCallback(b"".join)

    def unread(self) -> bytes:
        """Lines received but not read yet, and any partial line."""
        return b"".join(self._lines) + self._buffer

    def wait_closed(self, timeout: float = TIMEOUT) -> Deferred[Exception]:
        """Fires with the reason (an exception) once the connection is closed."""
        waiting: Deferred[Exception] = Deferred()

        def fire(ignored: None) -> None:
            if not waiting.called:
                waiting.callback(self.lost_reason.value)

        self.closed.addCallback(fire)
        return waiting.addTimeout(timeout, reactor)

    def disconnect(self) -> Deferred[Exception]:
        if self.lost_reason is None:
            self.transport.loseConnection()
        return self.wait_closed()

    def abort(self) -> Deferred[Exception]:
        if self.lost_reason is None:
            self.transport.abortConnection()
        return self.wait_closed()


def dlock_frame(message) -> bytes:
    """A dlock message as it travels: a 4-byte big-endian length and the encoded message."""
    body = message.SerializeToString()
    return len(body).to_bytes(4, "big") + body


class DlockClient(LineClient):
    """
    A dlock client for tests: a L{LineClient} whose "lines" are the server's
    length-prefixed frames, parsed as C{Response} messages
    (L{jesync.protocols.dlock_pb2}).  L{send} takes raw bytes;
    L{send_requests} frames C{Request} messages; reads time out as
    L{LineClient}'s do.
    """

    def dataReceived(self, data: bytes) -> None:
        from jesync.protocols.dlock_pb2 import Response

        data = self._buffer + data if self._buffer else data
        start = 0
        while len(data) - start >= 4:
            end = start + 4 + int.from_bytes(data[start : start + 4], "big")
            if len(data) < end:
                break
            self._lines.append(Response.FromString(data[start + 4 : end]))
            start = end
        self._buffer = data[start:]
        self._serve()

    def send_requests(self, *requests) -> None:
        """Send C{requests} (C{Request} messages), framed, in one write."""
        self.send(b"".join(dlock_frame(request) for request in requests))

    def ask(self, *requests, timeout: float = TIMEOUT) -> Deferred:
        """Send C{requests}; then the next response (one request) or a list of as many responses."""
        self.send_requests(*requests)
        if len(requests) == 1:
            return self.read_line(timeout)
        return self.read_lines(len(requests), timeout)

    def unread(self) -> list:
        """Responses received but not read yet."""
        return list(self._lines)


@implementer(IPullProducer)
class Flood:
    """
    Writes C{chunk} to a transport each time its buffer drains, until
    C{stop()} says so or C{limit} bytes are written.
    """

    def __init__(self, transport, chunk: bytes, stop: Callable[[], bool], limit: int) -> None:
        self.transport = transport
        self.chunk = chunk
        self.stop = stop
        self.limit = limit
        self.written = 0
        self.stopped = False

    def start(self) -> None:
        self.transport.registerProducer(self, False)

    def resumeProducing(self) -> None:
        if self.stopped or self.stop() or self.written >= self.limit:
            self.finish()
            return
        self.written += len(self.chunk)
        self.transport.write(self.chunk)

    def finish(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.transport.unregisterProducer()

    def stopProducing(self) -> None:
        self.stopped = True


def unsent_bytes(transport) -> int:
    """How much a Twisted socket transport has buffered but not yet sent."""
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


class ConnectionTracker:
    """
    Records every protocol a server factory builds: C{protocols}, in order,
    and C{lost[p]}, which fires once C{p} has lost its connection.
    """

    def __init__(self, factory) -> None:
        self.protocols: list = []
        self.lost: dict[object, Deferred[None]] = {}
        real_build = factory.buildProtocol

        def buildProtocol(addr):
            protocol = real_build(addr)
            lost: Deferred[None] = Deferred()
            real_lost = protocol.connectionLost

            def connectionLost(reason=None):
                try:
                    real_lost(reason)
                finally:
                    lost.callback(None)

            protocol.connectionLost = connectionLost
            self.protocols.append(protocol)
            self.lost[protocol] = lost
            return protocol

        factory.buildProtocol = buildProtocol

    def wait_lost(self, protocols=None, timeout: float = TIMEOUT) -> Deferred:
        """Fires once the server side of every (given) connection is gone."""
        protocols = self.protocols if protocols is None else protocols
        waiting = DeferredList([self.lost[p] for p in protocols], fireOnOneErrback=True)
        return waiting.addTimeout(timeout, reactor)

    @inlineCallbacks
    def close_all(self, clients, timeout: float = TIMEOUT):
        """Abort C{clients} and whatever server connections are left; wait for all."""
        for client in clients:
            if client.lost_reason is None:
                client.transport.abortConnection()
        yield gatherResults([client.wait_closed(timeout) for client in clients], consumeErrors=True)
        for protocol in self.protocols:
            if not self.lost[protocol].called:
                protocol.transport.abortConnection()
        yield self.wait_lost(timeout=timeout)


class TCPServer:
    """
    A JESync server listening on 127.0.0.1, port 0, in this process, built
    with the embedding API: C{JESyncFactory(LockService(reactor))}.

    Every server-side protocol is recorded in C{protocols}; C{lost[p]} fires
    when C{p} has lost its connection.  L{start} registers a cleanup that
    closes every client and server connection, stops listening, checks that
    the service was left empty, and cancels the service's idle timers.
    """

    def __init__(self, test, verbose: bool = False) -> None:
        self.test = test
        self.service = LockService(reactor)
        self.factory = JESyncFactory(self.service, verbose=verbose)
        self.policy = self.factory.policy
        self.tracker = ConnectionTracker(self.factory)
        self.protocols = self.tracker.protocols
        self.lost = self.tracker.lost
        self.clients: list[LineClient] = []
        self.port = None

    @classmethod
    @inlineCallbacks
    def start(cls, test, verbose: bool = False, backlog: int = 50):
        server = cls(test, verbose)
        endpoint = TCP4ServerEndpoint(reactor, 0, backlog=backlog, interface="127.0.0.1")
        server.port = yield endpoint.listen(server.factory)
        test.addCleanup(server.shutdown)
        return server

    @property
    def port_number(self) -> int:
        return self.port.getHost().port

    @inlineCallbacks
    def connect(self):
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port_number, timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
        client.local_port = client.transport.getHost().port
        self.clients.append(client)
        return client

    @inlineCallbacks
    def connect_many(self, count: int):
        clients = yield gatherResults([self.connect() for _ in range(count)], consumeErrors=True)
        return clients

    def protocol_for(self, client: LineClient):
        """The server side of C{client}'s connection (after one round trip)."""
        (protocol,) = [p for p in self.protocols if p.transport.getPeer().port == client.local_port]
        return protocol

    def wait_server_lost(self, protocols=None, timeout: float = TIMEOUT) -> Deferred:
        """Fires once the server side of every (given) connection is gone."""
        return self.tracker.wait_lost(protocols, timeout)

    @inlineCallbacks
    def shutdown(self):
        yield self.tracker.close_all(self.clients)
        yield self.port.stopListening()
        leftover = self.service.listing()
        # Every connection is gone, so everything it held or waited for is.
        self.test.assertEqual(leftover, [])


# elock replies several tests expect.
BYE = b"200 Hey, it was nice seeing you.\r\n"


def stats(clients: int, locks: int, monitoring: int) -> bytes:
    return b"200 STATS\r\nSTAT clients %d\r\nSTAT locks %d\r\nSTAT monitoring %d\r\nEND\r\n" % (
        clients,
        locks,
        monitoring,
    )


# Bad arguments and the INVALID_PARAMETER message each gets.
INVALID_PARAMETER_CASES = [
    (b"lock", b"missing key"),
    (b"lock   ", b"missing key"),
    (b"release", b"missing key"),
    (b"status", b"missing key"),
    (b"lock k x", b"max_concurrent is not an integer"),
    (b"lock k 1.0", b"max_concurrent is not an integer"),
    (b"lock k +1", b"max_concurrent is not an integer"),
    (b"lock k 0x1", b"max_concurrent is not an integer"),
    (b"lock k 1 5s", b"timeout is not an integer"),
    (b"lock k 1 -1 1e3", b"expires is not an integer"),
    (b"lock k 1 -1 --1", b"expires is not an integer"),
    (b"lock k 9999999999", b"max_concurrent is out of range"),
    (b"lock k 1 -99999999999", b"timeout is out of range"),
    (b"lock k 1 -1 " + b"9" * 5000, b"expires is out of range"),
    (b"lock k 0", b"Max concurrent should be greater or equal than 1"),
    (b"lock k -3", b"Max concurrent should be greater or equal than 1"),
    (b"lock k 1 -2", b"Timeout should be greater or equal than -1"),
    (b"lock k 1 -1 -1", b"Expire timeout should be greater or equal than 0"),
    (b"lock k 1 -1 0 value extra", b"too many arguments"),
    (b"lock k 1 -1 0 %zz", b"value is not percent-encoded"),
    (b"lock-shared k 1 -1 v extra", b"too many arguments"),
    (b"release k extra", b"too many arguments"),
    (b"status k extra", b"too many arguments"),
    (b"status-by-key k", b"too many arguments"),
    (b"status-by-requests k", b"too many arguments"),
    (b"status-by-grants k", b"too many arguments"),
    (b"quit k", b"too many arguments"),
]


def without_tokens(listing: bytes) -> bytes:
    """A C{holders} listing without each line's fencing token (checked to be a number)."""
    lines = listing.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(b"HOLDER "):
            rest, token = line.rsplit(b" ", 1)
            assert token.isdigit() and len(rest.split()) == 5, line
            lines[index] = rest
    return b"\n".join(lines)


def wait_until(predicate, timeout: float = TIMEOUT):
    """A Deferred that fires once C{predicate()} is true (checked every millisecond), or fails after C{timeout}."""
    done: Deferred = Deferred()
    deadline = reactor.seconds() + timeout

    def check() -> None:
        if predicate():
            done.callback(None)
        elif reactor.seconds() > deadline:
            done.errback(AssertionError(f"not true within {timeout} s: {predicate}"))
        else:
            reactor.callLater(0.001, check)

    check()
    return done


@inlineCallbacks
def hold_keys(client, keys: list[bytes], batch: int):
    """C{client} takes every key in C{keys} for good (never expiring), C{batch} requests at a time."""
    for start in range(0, len(keys), batch):
        some = keys[start : start + batch]
        replies = yield client.ask(b"".join(b"lock %s 1 -1 0\n" % key for key in some), len(some))
        assert replies == b"".join(b"GRANTED 1 0 %s 0\n" % key for key in some), replies[:200]


# -- shared by the tests of several tiers: options, files, ports, skips ----------


def parse(*argv: str) -> tap.Options:
    options = tap.Options()
    options.parseOptions(list(argv))
    return options


def short_temp_dir(test) -> str:
    """A fresh directory with a path short enough for UNIX sockets."""
    path = tempfile.mkdtemp(prefix="jesync-")
    test.addCleanup(shutil.rmtree, path, True)
    return path


LOCAL = "tcp:0:interface=127.0.0.1"
LINUX_KEEPALIVE = hasattr(socket, "TCP_KEEPIDLE")
TOKEN = b"s3cret-Token_42"


def write_file(test, content: bytes, name: str = "token") -> str:
    path = os.path.join(short_temp_dir(test), name)
    with open(path, "wb") as file:
        file.write(content)
    return path


def capture_log(test) -> list[str]:
    """Every log event from now to the end of the test, formatted."""
    lines: list[str] = []

    def observe(event: dict) -> None:
        text = formatEvent(event)
        if text:
            lines.append(text)

    globalLogPublisher.addObserver(observe)
    test.addCleanup(globalLogPublisher.removeObserver, observe)
    return lines


def keepalive_options(sock: socket.socket) -> tuple[int, ...]:
    """SO_KEEPALIVE, and (Linux) TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT."""
    options = (sock.getsockopt(SOL_SOCKET, SO_KEEPALIVE),)
    if LINUX_KEEPALIVE:
        options += tuple(
            sock.getsockopt(socket.IPPROTO_TCP, option)
            for option in (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)
        )
    return options


def peer_of(client: LineClient) -> bytes:
    """How the server names C{client} (its host:port)."""
    return b"127.0.0.1:%d" % client.transport.getHost().port


def taken_port(test) -> int:
    """A port on 127.0.0.1 that something else listens on, for the rest of the test."""
    holder = socket.socket()
    test.addCleanup(holder.close)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    return holder.getsockname()[1]


def accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:C{port}."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


IN_USE = os.strerror(errno.EADDRINUSE).lower()


def strictly_increasing(tokens: list[Any]) -> bool:
    return all(isinstance(token, int) for token in tokens) and all(a < b for a, b in zip(tokens, tokens[1:]))


try:
    for _module in ("prometheus_client.exposition", "prometheus_client.parser", "jesync.metrics"):
        importlib.import_module(_module)
except ImportError:
    skip_without_prometheus = "prometheus_client is not installed (pip install '.[metrics]')"
else:
    skip_without_prometheus = None


def grant_and_release_before_answering(service: LockService, key: str) -> None:
    """
    Make C{service} grant C{key} to a hand owner and release it just before
    it answers a C{holders} of C{key} (in its reactor): the grant and
    release events reach a watcher of C{key} before the answer, which does
    not count them.  The race an observer's consistent start must survive.
    """
    holders = service.holders

    def granting_first(asked: str) -> Any:
        if asked == key:
            grant = service.request(key, "hand", 1, 0, 0, "exclusive", b"ghost")
            grant.release()
        return holders(asked)

    service.holders = granting_first  # type: ignore[method-assign]
