"""
A lean path for the leader's etcd transactions: C{POST /v3/kv/txn} over
HTTP/1.1 keep-alive connections of its own, the request written from
pre-encoded pieces and the answer read by a small parser.

Why: through treq and Twisted's HTTP client (L{jesync.cluster.etcd}) a
transaction cost the leader about 0.45 ms of CPU on CPython (profiled:
hyperlink and idna parsing the URL of every request, the header objects,
the Agent's state machines and a dozen Deferreds), as much as a local
etcd's whole round trip.  The journal writes one per group commit, so that
cost was the leader's ceiling.  Here a transaction is one C{write} of a
request built by concatenation (the guards and reads that every journal
transaction repeats are encoded once) and one C{json.loads} of the answer.

The rules:

 - B{One connection, requests pipelined}: each is written as it comes,
   without waiting for the answers before it, and etcd (Go's HTTP server)
   reads a connection's requests one after another, answering each before
   it reads the next.  So transactions reach etcd in the order they were
   sent, each after the one before it has applied, and none waits for the
   round trip of the one before it.  (Over several connections they race:
   measured at 8 in flight, nine in ten journal transactions reached etcd
   before their predecessor.)
 - B{It never retries.}  An answer not in time (C{timeout}, or as long
   as the etcd client gives an attempt once it has learned etcd slow on
   every request: L{TxnChannel.answer_within}; counted from when the
   request was posted, a wait for the connection to open included), a
   connection refused or lost, or anything but a well-formed HTTP answer
   fails the request with L{ChannelError} (and drops its connection; new
   ones go to the next endpoint): the caller retries through
   L{EtcdClient}, which tries every endpoint within its deadline.  So a
   transaction may apply twice (a copy sent here whose answer was lost,
   and the retry), as with L{EtcdClient}: callers guard their
   transactions (the journal's chain does).
 - etcd's own error answers are L{EtcdError}, as L{EtcdClient} raises them.
 - Plain C{http://} only: with an C{https://} endpoint, L{for_endpoints}
   gives None and everything goes through L{EtcdClient}.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, cast
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.interfaces import IDelayedCall, IReactorTCP, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from jesync.cluster.etcd import (
    Compare,
    Delete,
    EtcdClient,
    EtcdError,
    Get,
    Operation,
    Put,
    TxnResult,
    _encode_compare,
    _encode_operation,
    _gateway_error,
    _txn_result,
)

# The largest answer read (as L{jesync.cluster.etcd.MAX_RESPONSE}), and the largest header.
MAX_RESPONSE = 64 * 1024 * 1024
MAX_HEAD = 64 * 1024

_log = Logger()


class ChannelError(Exception):
    """No (well-formed) answer: the request may or may not have been applied."""


class _Answer:
    """An HTTP answer as read: its status and body."""

    __slots__ = ("status", "body")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


class _Connection(Protocol):
    """
    The keep-alive connection: requests written as they come (pipelined),
    answers parsed in turn (Content-Length or chunked) and matched to them
    in order.
    """

    def __init__(self, channel: TxnChannel) -> None:
        self.channel = channel
        # The requests written and not yet answered, oldest first, each with its deadline.
        self.waiting: Deque[Tuple[Deferred[_Answer], float]] = deque()
        self.timer: Optional[IDelayedCall] = None
        self.buffer = b""
        self.status = 0
        self.length: Optional[int] = None  # the body's length, once the head is read (-1: chunked)
        self.chunks: List[bytes] = []
        self.close_after = False
        self.lost = False

    def connectionMade(self) -> None:
        no_delay = getattr(self.transport, "setTcpNoDelay", None)  # (a request is one write)
        if no_delay is not None:
            no_delay(True)

    def send(self, request: bytes, answer: Deferred[_Answer], deadline: Optional[float] = None) -> None:
        """Write C{request}; C{answer} fails if not answered by C{deadline} (default: L{TxnChannel.answer_within} from now)."""
        if deadline is None:
            deadline = self.channel.reactor.seconds() + self.channel.answer_within()
        self.waiting.append((answer, deadline))
        if self.timer is None:
            self._watch()
        assert self.transport is not None
        self.transport.write(request)

    def _watch(self) -> None:
        """A timer for the oldest request's deadline (none if nothing is waiting)."""
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None
        if self.waiting:
            delay = max(0.0, self.waiting[0][1] - self.channel.reactor.seconds())
            self.timer = self.channel.reactor.callLater(delay, self._late)

    def _late(self) -> None:
        self.timer = None
        self._fail(ChannelError(f"no answer within {self.channel.answer_within():.3g} s"))

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer and not self.lost:
            if not self.waiting:
                self._fail(ChannelError("etcd sent data that answers no request"))
                return
            try:
                answer = self._parse()
            except ChannelError as error:
                self._fail(error)
                return
            if answer is None:
                return
            waiting, _ = self.waiting.popleft()
            self._watch()
            if self.close_after:
                self._fail(ChannelError("etcd closed the connection"))
            waiting.callback(answer)

    def _parse(self) -> Optional[_Answer]:
        """The answer, once whole (None: not yet); raises ChannelError if it is not HTTP/1.1 as expected."""
        if self.length is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    raise ChannelError("etcd's answer has an oversized head")
                return None
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise ChannelError(f"not an HTTP answer: {lines[0][:100]!r}")
            self.status = int(parts[1])
            length = None
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                value = value.strip().lower()
                if name == b"content-length":
                    if not value.isdigit():
                        raise ChannelError(f"a bad Content-Length: {value[:40]!r}")
                    length = int(value)
                elif name == b"transfer-encoding" and value == b"chunked":
                    length = -1
                elif name == b"connection" and value == b"close":
                    self.close_after = True
            if length is None:
                raise ChannelError("etcd's answer has neither a Content-Length nor chunks")
            if length > MAX_RESPONSE:
                raise ChannelError(f"etcd's answer is larger than {MAX_RESPONSE} bytes")
            self.length = length
        if self.length >= 0:
            if len(self.buffer) < self.length:
                return None
            body, self.buffer = self.buffer[: self.length], self.buffer[self.length :]
            return self._done(body)
        while True:  # chunked
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return None
            size_text = self.buffer[:end].split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ChannelError(f"a bad chunk size: {size_text[:40]!r}") from None
            if size == 0:
                # No trailers expected: the last chunk ends with an empty line.
                if len(self.buffer) < end + 4:
                    return None
                if self.buffer[end + 2 : end + 4] != b"\r\n":
                    raise ChannelError("trailers after the last chunk")
                self.buffer = self.buffer[end + 4 :]
                return self._done(b"".join(self.chunks))
            if len(self.buffer) < end + 2 + size + 2:
                return None
            self.chunks.append(self.buffer[end + 2 : end + 2 + size])
            if sum(len(chunk) for chunk in self.chunks) > MAX_RESPONSE:
                raise ChannelError(f"etcd's answer is larger than {MAX_RESPONSE} bytes")
            self.buffer = self.buffer[end + 2 + size + 2 :]

    def _done(self, body: bytes) -> _Answer:
        answer = _Answer(self.status, body)
        self.length = None
        self.chunks = []
        return answer

    def _fail(self, error: Exception) -> None:
        """Fail every waiting request with C{error} and drop the connection."""
        waiting, self.waiting = self.waiting, deque()
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None
        self._drop()
        for answer, _ in waiting:
            answer.errback(Failure(error))

    def _drop(self) -> None:
        if not self.lost:
            self.lost = True
            self.channel._gone(self)
            if self.transport is not None:
                self.transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = cast(Failure, None)) -> None:
        self.transport = None
        self._fail(ChannelError(f"the connection was lost: {reason.getErrorMessage() if reason else 'closed'}"))


class TxnChannel:
    """
    Transactions to etcd at C{endpoints} (C{http://host:port} URLs), as
    L{jesync.cluster.etcd.EtcdClient.txn} takes and answers them, over one
    connection of its own (requests pipelined: each answered in turn).
    """

    def __init__(
        self,
        reactor: Any,
        endpoints: Sequence[Tuple[str, int]],
        timeout: float,
        observer: Optional[Callable[[str, float], None]] = None,
        slow_etcd: Optional[Callable[[], float]] = None,
    ) -> None:
        self.reactor = reactor
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.observer = observer
        # What the etcd client has learned an attempt may take (an etcd slow
        # on every request: EtcdClient.attempt_bound); a request here gets as long.
        self._slow_etcd = slow_etcd
        self._endpoint = 0
        self._connection: Optional[_Connection] = None
        self._connecting = False
        # Requests waiting for the connection to open, each with its deadline
        # (answer_within() from when it was posted, not from when it is written).
        self._queue: List[Tuple[bytes, Deferred[_Answer], float]] = []
        self._closed = False
        self._heads: Dict[int, bytes] = {}
        self._encoded: Dict[Any, bytes] = {}

    @classmethod
    def for_endpoints(
        cls,
        reactor: IReactorTime,
        urls: Sequence[str],
        timeout: float,
        observer: Optional[Callable[[str, float], None]] = None,
        slow_etcd: Optional[Callable[[], float]] = None,
    ) -> Optional[TxnChannel]:
        """A channel to the etcd at C{urls} (as given to L{EtcdClient}), or None if one is not C{http://}."""
        endpoints = []
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                return None
            endpoints.append((parts.hostname, parts.port or 80))
        return cls(reactor, endpoints, timeout, observer, slow_etcd)

    @classmethod
    def beside(cls, etcd: Any) -> Optional[TxnChannel]:
        """
        A channel to the etcd that C{etcd} (an L{EtcdClient}) talks to, with
        its observer, each attempt given at most a quarter of its timeout
        (or 0.5 s): what is left is the client's, to retry in.  Unless the
        client has learned that etcd is slow on every request: then as long
        as the client gives an attempt (at most half its timeout), or every
        transaction would be sent here in vain and again by the client.
        None if C{etcd} is anything else, or an endpoint is not C{http://}.
        """
        if not isinstance(etcd, EtcdClient):
            return None
        return cls.for_endpoints(
            etcd.reactor, etcd.endpoints, min(0.5, etcd.timeout / 4), etcd.observer, etcd.attempt_bound
        )

    def answer_within(self) -> float:
        """How long a request posted now may wait for its answer: C{timeout}, or longer on a slow etcd."""
        if self._slow_etcd is None:
            return self.timeout
        return max(self.timeout, self._slow_etcd())

    # -- transactions --

    def txn(
        self, compare: Sequence[Compare], success: Sequence[Operation], failure: Sequence[Operation] = ()
    ) -> Deferred[TxnResult]:
        """As L{EtcdClient.txn}, but failing with L{ChannelError} where that would retry."""
        body = b"".join(
            (
                b'{"compare":[',
                b",".join([self._piece(condition) for condition in compare]),
                b'],"success":[',
                b",".join([self._operation(operation) for operation in success]),
                b'],"failure":[',
                b",".join([self._operation(operation) for operation in failure]),
                b"]}",
            )
        )
        answered = self._post(self._head(len(body)) + body)
        return answered.addCallback(self._result, success, failure, self.reactor.seconds())

    def _piece(self, item: Any) -> bytes:
        """A compare or read (the same few in every transaction), encoded once."""
        encoded = self._encoded.get(item)
        if encoded is None:
            if len(self._encoded) > 1024:
                self._encoded.clear()
            if isinstance(item, Compare):
                encoded = json.dumps(_encode_compare(item), separators=(",", ":")).encode("ascii")
            else:
                encoded = json.dumps(_encode_operation(item), separators=(",", ":")).encode("ascii")
            self._encoded[item] = encoded
        return encoded

    def _operation(self, operation: Operation) -> bytes:
        if isinstance(operation, Get):
            return self._piece(operation)
        if isinstance(operation, Put) and not operation.lease:
            return b'{"request_put":{"key":"%s","value":"%s"}}' % (
                base64.b64encode(operation.key),
                base64.b64encode(operation.value),
            )
        if isinstance(operation, Delete) and not operation.prefix:
            return b'{"request_delete_range":{"key":"%s"}}' % base64.b64encode(operation.key)
        return json.dumps(_encode_operation(operation), separators=(",", ":")).encode("ascii")

    def _head(self, length: int) -> bytes:
        host, port = self.endpoints[self._endpoint]
        return b"POST /v3/kv/txn HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
            host.encode("idna"),
            port,
            length,
        )

    def _result(
        self, answer: _Answer, success: Sequence[Operation], failure: Sequence[Operation], started: float
    ) -> TxnResult:
        try:
            message = json.loads(answer.body)
            if not isinstance(message, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise EtcdError(f"etcd's answer (HTTP {answer.status}) is not JSON ({e}): {answer.body[:200]!r}")
        error = _gateway_error(message)
        if error is not None:
            raise error
        result = _txn_result(message, success, failure)
        if self.observer is not None:
            try:
                self.observer("txn", self.reactor.seconds() - started)
            except Exception:
                _log.failure("the etcd channel's observer failed")
        return result

    # -- connections --

    def _post(self, request: bytes) -> Deferred[_Answer]:
        answer: Deferred[_Answer] = Deferred()
        if self._closed:
            answer.errback(Failure(ChannelError("the channel is closed")))
        elif self._connection is not None:
            self._connection.send(request, answer)
        else:
            self._queue.append((request, answer, self.reactor.seconds() + self.answer_within()))
            if not self._connecting:
                self._connect()
        return answer

    def _connect(self) -> None:
        self._connecting = True
        host, port = self.endpoints[self._endpoint]
        endpoint: Any
        if isIPAddress(host):  # (no name to resolve: no thread)
            endpoint = TCP4ClientEndpoint(self.reactor, host, port, timeout=self.timeout)
        elif isIPv6Address(host):
            endpoint = TCP6ClientEndpoint(self.reactor, host, port, timeout=self.timeout)
        else:
            endpoint = HostnameEndpoint(cast(IReactorTCP, self.reactor), host, port, timeout=self.timeout)
        factory = Factory.forProtocol(lambda: _Connection(self))
        factory.noisy = False  # (no log line for every connection)
        connecting = endpoint.connect(factory)
        timer = self.reactor.callLater(self.timeout, connecting.cancel)

        def connected(connection: _Connection) -> None:
            if timer.active():
                timer.cancel()
            self._connecting = False
            if self._closed:
                connection._drop()
                return
            self._connection = connection
            queue, self._queue = self._queue, []
            for request, answer, deadline in queue:
                connection.send(request, answer, deadline)

        def refused(reason: Failure) -> None:
            if timer.active():
                timer.cancel()
            self._connecting = False
            self._next_endpoint()
            queue, self._queue = self._queue, []
            for _, answer, _ in queue:
                answer.errback(Failure(ChannelError(f"could not connect: {reason.getErrorMessage()}")))

        connecting.addCallbacks(connected, refused)

    def _gone(self, connection: _Connection) -> None:
        """C{connection} is closed (the next request opens another, to the next endpoint)."""
        if connection is self._connection:
            self._connection = None
            if not self._closed:
                self._next_endpoint()

    def _next_endpoint(self) -> None:
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)

    def close(self) -> None:
        """Drop the connection; requests still waiting fail with L{ChannelError}."""
        self._closed = True
        queue, self._queue = self._queue, []
        for _, answer, _ in queue:
            answer.errback(Failure(ChannelError("the channel is closed")))
        if self._connection is not None:
            self._connection._fail(ChannelError("the channel is closed"))
