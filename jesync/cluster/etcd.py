"""
A non-blocking client of etcd's v3 JSON gateway, on treq.

etcd (3.4 and 3.5) serves its gRPC API as JSON over HTTP/1.1 under C{/v3/}:
a POST of the request message as JSON, answered with the response message as
JSON (C{/v3/watch} answers with a stream of them, one a line).  In that JSON
keys and values are base64 and 64-bit integers are strings; fields with
their default value (0, empty) are left out.  Through treq, on Twisted's own
HTTP client, nothing here blocks the reactor or needs a thread, so it runs
alike under CPython and PyPy.

The rules:

 - Every request has a deadline, the client's C{timeout}.  Within it, a
   request that does not get through -- connection refused or lost, no
   answer in time, or etcd's "unavailable" (what a member without a leader
   answers) -- is tried again on the next endpoint, in turn, starting from
   the one that answered last (with one endpoint: on that one again).
   When the deadline passes: L{EtcdUnavailable}.
 - Each attempt gets at most C{attempt_timeout} (L{ATTEMPT_TIMEOUT}, 0.4
   s: etcd answers in about a millisecond) and its share of the timeout
   among the endpoints, or, the last one, what is left (when less than
   two attempts' worth is) -- unless etcd is slow on every request: when
   even the fastest of its last L{ANSWERS_REMEMBERED} answers took over a
   quarter of that, L{SLOW_ETCD_MARGIN} times that fastest answer (at
   most half the timeout).  A flapping link cannot raise it: its answers
   that get through are fast, and one fast answer among the last ones is
   enough to keep an attempt's 0.4 s.  An attempt with
   no answer by then is abandoned I{with its connection}, and the next
   goes at once, on another (a new one, or an idle one from the pool).
   Why: on a link that drops and heals, a request on a connection whose
   packets were lost waits for TCP's retransmissions, which back off
   (0.2, 0.4, 0.8 s ...), and can miss every moment the link is up until
   the deadline; a new connection sends its first packet at once.  Only
   failures that came fast (refused, or etcd "unavailable") wait a little
   before the next round, so as not to spin.
 - Any other error etcd answers (C{{"error": ..., "code": ...}}) is
   L{EtcdError} with etcd's message, at once, with no retry.
 - B{A request may apply twice}: one whose answer was lost (the link
   dropped it, the member died or answered too late) may have been applied
   all the same, and its retry applies it again -- after it, or, the lost
   copy arriving late, before it.  So callers write transactions that are
   idempotent or guarded by compares (on the mod revision of what they
   last read, or on a lease), as etcd's own clients must too; jesync's
   (the journal's, the campaign's, leases') are, and docs/cluster.md ("Why
   a retried request is safe") says why, one by one.
 - Connections are pooled: HTTP/1.1 keep-alive, at most
   L{MAX_IDLE_CONNECTIONS} idle ones per member.  A watch holds a connection
   of its own for as long as it lasts.  Every response is bounded
   (L{MAX_RESPONSE}); a prefix read is paged (L{EtcdClient.page_size} keys a
   request) at one revision, so it never asks for an unbounded answer.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Generator, List, Optional, Sequence, Tuple, Union, cast

from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred, gatherResults, inlineCallbacks, succeed
from twisted.internet.interfaces import IConsumer, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone, _HTTP11ClientFactory
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IResponse
from zope.interface import implementer

# Idle keep-alive connections kept per etcd member.
MAX_IDLE_CONNECTIONS = 4
# The largest response body (or watch message) read; a larger one is an error.
MAX_RESPONSE = 64 * 1024 * 1024
# After every endpoint has failed at once (refused), wait this long before
# the next round, doubling up to RETRY_DELAY_MAX: no busy loop.
RETRY_DELAY = 0.05
RETRY_DELAY_MAX = 0.5
# The longest one attempt of a request waits for its answer (see the module
# docstring): 400 times etcd's usual 1 ms round trip, under the shortest
# time a flapping link stays up (0.5 s), and at least three of them fit in
# the shortest certainty window (1.5 s, a lease TTL of 2 s).
ATTEMPT_TIMEOUT = 0.4
# An etcd healthy but slow on every request (a slow disk) answers later than
# ATTEMPT_TIMEOUT every time: an attempt may then take SLOW_ETCD_MARGIN
# times the fastest of the last ANSWERS_REMEMBERED answers (see the module
# docstring).  Why the fastest: one answer that came quickly shows that the
# link, not etcd, was slow for the others.
SLOW_ETCD_MARGIN = 4
ANSWERS_REMEMBERED = 8

# gRPC status codes that etcd's gateway puts in its error bodies.
_GRPC_NOT_FOUND = 5
_GRPC_UNAVAILABLE = 14

_log = Logger()


class EtcdError(Exception):
    """etcd answered with an error (its message is the text; C{code} its gRPC status, if given)."""

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time (connection refused, lost, timed out, or no leader)."""


class EtcdCompacted(EtcdError):
    """A watch's start revision was compacted away: read again, and watch from after that read."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: bytes
    prefix: bool = False


@dataclass(frozen=True)
class Get:
    """A read inside a transaction: one answer, not paged (keep prefixes small there)."""

    key: bytes
    prefix: bool = False


# Compare.target -> the field of etcd's Compare message that holds the value.
_COMPARE_FIELDS = {
    "CREATE": "create_revision",
    "MOD": "mod_revision",
    "VERSION": "version",
    "VALUE": "value",
    "LEASE": "lease",
}
_COMPARE_RESULTS = ("EQUAL", "NOT_EQUAL", "GREATER", "LESS")


@dataclass(frozen=True)
class Compare:
    """
    A condition of a transaction: C{target} of C{key} compared with C{value}
    (bytes for "VALUE", an int otherwise).  A key that does not exist has
    create revision, mod revision, version and lease 0.
    """

    key: bytes
    target: str
    value: Union[int, bytes]
    result: str = "EQUAL"

    def __post_init__(self) -> None:
        if self.target not in _COMPARE_FIELDS:
            raise ValueError(f"Compare target must be one of {', '.join(_COMPARE_FIELDS)}, not {self.target!r}")
        if self.result not in _COMPARE_RESULTS:
            raise ValueError(f"Compare result must be one of {', '.join(_COMPARE_RESULTS)}, not {self.result!r}")
        wanted = bytes if self.target == "VALUE" else int
        if not isinstance(self.value, wanted) or isinstance(self.value, bool):
            raise ValueError(f"Compare of {self.target} takes {wanted.__name__}, not {self.value!r}")


@dataclass(frozen=True)
class TxnResult:
    """
    C{responses}: one entry per operation of the branch taken, the
    KeyValues for a L{Get} and None for a L{Put} or L{Delete}.
    """

    succeeded: bool
    revision: int
    responses: List[Optional[List[KeyValue]]]


@dataclass(frozen=True)
class WatchEvent:
    type: str  # "PUT" or "DELETE"
    kv: KeyValue


Operation = Union[Put, Delete, Get]
JSON = Dict[str, Any]
_Steps = Generator[Deferred[Any], Any, Any]


# -- the JSON of etcd's messages ------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _int(message: JSON, name: str) -> int:
    """An int64 field: a JSON string (or number), absent when 0."""
    return int(message.get(name, 0))


def _prefix_end(prefix: bytes) -> bytes:
    """The range end of every key starting with C{prefix}: its last byte below 0xff, plus one."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\x00"  # etcd's "to the end of the key space"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _range(key: bytes, prefix: bool) -> JSON:
    if not prefix:
        return {"key": _b64(key)}
    # The empty prefix: from the first key (\0) to the end.
    return {"key": _b64(key or b"\x00"), "range_end": _b64(_prefix_end(key))}


def _encode_operation(operation: Operation) -> JSON:
    if isinstance(operation, Put):
        put = {"key": _b64(operation.key), "value": _b64(operation.value), "lease": str(operation.lease)}
        return {"request_put": put}
    if isinstance(operation, Delete):
        return {"request_delete_range": _range(operation.key, operation.prefix)}
    if isinstance(operation, Get):
        return {"request_range": _range(operation.key, operation.prefix)}
    raise TypeError(f"a transaction takes Put, Delete and Get operations, not {operation!r}")


def _encode_compare(compare: Compare) -> JSON:
    value = compare.value
    encoded = _b64(value) if isinstance(value, bytes) else str(value)
    field = _COMPARE_FIELDS[compare.target]
    return {"key": _b64(compare.key), "target": compare.target, "result": compare.result, field: encoded}


def _decode_kv(kv: JSON) -> KeyValue:
    return KeyValue(
        key=_unb64(kv.get("key", "")),
        value=_unb64(kv.get("value", "")),
        create_revision=_int(kv, "create_revision"),
        mod_revision=_int(kv, "mod_revision"),
        lease=_int(kv, "lease"),
    )


def _revision(response: JSON) -> int:
    return _int(response.get("header", {}), "revision")


def _txn_result(answer: JSON, success: Sequence[Operation], failure: Sequence[Operation]) -> TxnResult:
    """
    etcd's answer to a transaction (as JSON) as a L{TxnResult}: which branch
    it took, and for each of that branch's operations the key-values a
    L{Get} read (None for a write).
    """
    succeeded = bool(answer.get("succeeded", False))
    taken = success if succeeded else failure
    answers = answer.get("responses", [])
    if len(answers) != len(taken):
        raise EtcdError(f"etcd answered {len(answers)} operations of a transaction of {len(taken)}")
    responses: List[Optional[List[KeyValue]]] = []
    for operation, item in zip(taken, answers):
        if isinstance(operation, Get):
            responses.append([_decode_kv(kv) for kv in item.get("response_range", {}).get("kvs", ())])
        else:
            responses.append(None)
    return TxnResult(succeeded=succeeded, revision=_revision(answer), responses=responses)


def _gateway_error(message: JSON) -> Optional[EtcdError]:
    """
    The error in a gateway answer, if it is one: C{{"error": "...", "code":
    N, "message": "..."}} for a request, C{{"error": {"grpc_code": N,
    "message": "..."}}} inside a stream.
    """
    error = message.get("error")
    if isinstance(error, dict):
        code = error.get("grpc_code", error.get("code"))
        text = error.get("message") or error.get("http_status") or json.dumps(error)
    elif isinstance(error, str) and "code" in message:
        code = message.get("code")
        text = message.get("message") or error
    else:
        return None
    code = code if isinstance(code, int) else None
    kind = EtcdUnavailable if code == _GRPC_UNAVAILABLE else EtcdError
    return kind(str(text), code)


def _first_message(body: bytes) -> JSON:
    """The first JSON object of C{body} (a stream's answer holds one or more, one a line)."""
    text = body.decode("utf-8").lstrip()
    message, _ = json.JSONDecoder().raw_decode(text)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message


# -- reading responses ----------------------------------------------------------


class _BodyReader(Protocol):
    """
    Collects a response body up to L{MAX_RESPONSE} bytes; cancelling
    C{finished} drops the connection (a member that stopped mid-answer
    keeps it no longer).
    """

    def __init__(self) -> None:
        self.finished: Deferred[bytes] = Deferred(self._abort)
        self._chunks: List[bytes] = []
        self._size = 0

    def _abort(self, finished: Deferred[bytes]) -> None:
        _drop_connection(self)

    def dataReceived(self, data: bytes) -> None:
        if self.finished.called:
            return
        self._size += len(data)
        if self._size > MAX_RESPONSE:
            self.finished.errback(EtcdError(f"etcd's answer is larger than {MAX_RESPONSE} bytes"))
            self._abort(self.finished)
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        if self.finished.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.finished.callback(b"".join(self._chunks))
        else:
            self.finished.errback(reason)


class _NoAnswer(Exception):
    """An attempt got no (complete) answer in its time."""


def _describe(error: Exception) -> str:
    """What went wrong with an attempt, in a line (with the reasons Twisted's HTTP client wraps)."""
    reasons = getattr(error, "reasons", None)
    if isinstance(error, _NoAnswer):
        return str(error)
    if isinstance(reasons, list) and reasons:
        inner = "; ".join(f"{reason.type.__name__}: {reason.getErrorMessage()}" for reason in reasons)
        return f"{type(error).__name__} ({inner})"
    return f"{type(error).__name__}: {error}"


def _drop_connection(body: Protocol) -> None:
    """
    Close the connection a response body arrives on: its transport is the
    HTTP client's producer of that body, and stopping it closes the
    connection (which so never returns to the pool).
    """
    if body.transport is not None:
        cast(IPushProducer, body.transport).stopProducing()


@implementer(IBodyProducer)
class _Body:
    """
    A request's body, written in the turn the request is (treq's own
    producer of bytes writes it a reactor turn later, through Twisted's
    cooperator, which runs on the global reactor whatever the client's is).
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def _read_body(response: IResponse) -> Deferred[bytes]:
    reader = _BodyReader()
    response.deliverBody(reader)
    return reader.finished


# -- watches --------------------------------------------------------------------


class Watch:
    """
    One watch stream.  C{ended} fires when the stream ends for any reason:
    with None after L{cancel}, otherwise with the reason as a failure
    (L{EtcdUnavailable} when the connection is lost, L{EtcdCompacted} when
    the start revision was compacted away, L{EtcdError} when etcd ends it,
    or what C{on_events} raised).
    """

    def __init__(self, on_events: Callable[[List[WatchEvent]], None]) -> None:
        self.ended: Deferred[None] = Deferred()
        self._on_events = on_events
        self._connecting: Optional[Deferred[Any]] = None
        self._stream: Optional[_WatchStream] = None
        self._cancelled = False
        self._reason: Optional[Failure] = None

    def cancel(self) -> None:
        """End the watch (C{ended} fires with None once its connection is closed)."""
        if self.ended.called or self._cancelled:
            return
        self._cancelled = True
        if self._connecting is not None:
            self._connecting.cancel()
        elif self._stream is not None:
            self._stream.abort()

    def _connected(self, response: IResponse) -> None:
        self._connecting = None
        self._stream = _WatchStream(self)
        response.deliverBody(self._stream)
        if self._cancelled:
            self._stream.abort()

    def _message(self, message: JSON) -> None:
        error = _gateway_error(message)
        if error is not None:
            self._fail(Failure(error))
            return
        result = message.get("result", {})
        if result.get("canceled"):
            compacted = _int(result, "compact_revision")
            if compacted:
                reason: EtcdError = EtcdCompacted(f"etcd compacted the watched revisions up to {compacted}", compacted)
            else:
                reason = EtcdError("etcd cancelled the watch: " + (result.get("cancel_reason") or "no reason given"))
            self._fail(Failure(reason))
            return
        events = [
            WatchEvent(type=event.get("type", "PUT"), kv=_decode_kv(event.get("kv", {})))
            for event in result.get("events", ())
        ]
        if events and not self._cancelled and self._reason is None:
            try:
                self._on_events(events)
            except Exception:
                self._fail(Failure())

    def _fail(self, reason: Failure) -> None:
        """End with C{reason} (once the connection is closed)."""
        if self._reason is None:
            self._reason = reason
        if self._stream is not None:
            self._stream.abort()

    def _end(self, reason: Failure) -> None:
        if self.ended.called:
            return
        if self._cancelled:
            self.ended.callback(None)
        elif self._reason is not None:
            self.ended.errback(self._reason)
        elif reason.check(EtcdError):
            self.ended.errback(reason)
        elif reason.check(ResponseDone, PotentialDataLoss):
            self.ended.errback(EtcdUnavailable("etcd ended the watch stream"))
        else:
            self.ended.errback(EtcdUnavailable(f"lost the watch stream: {reason.getErrorMessage()}"))


def _fire_and_pass(result: object, other: Deferred[None]) -> object:
    other.callback(None)
    return result


class _WatchStream(Protocol):
    """The body of a watch response: JSON messages, one a line, each at most L{MAX_RESPONSE} bytes."""

    def __init__(self, watch: Watch) -> None:
        self._watch = watch
        self._buffer = b""
        self._broken = False

    def abort(self) -> None:
        _drop_connection(self)

    def dataReceived(self, data: bytes) -> None:
        if self._broken:
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        if len(self._buffer) > MAX_RESPONSE:
            lines, self._buffer = [], b""
            self._break(EtcdError(f"a watch message is larger than {MAX_RESPONSE} bytes"))
        for line in lines:
            if self._broken or not line.strip():
                continue
            try:
                message = json.loads(line)
                if not isinstance(message, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                self._break(EtcdError(f"etcd sent a watch message that is not JSON ({e}): {line[:200]!r}"))
                continue
            self._watch._message(message)

    def _break(self, error: EtcdError) -> None:
        self._broken = True
        self._watch._fail(Failure(error))

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        self._watch._end(reason)


# -- the client -----------------------------------------------------------------


class _QuietFactory(_HTTP11ClientFactory):
    """The pool's connection factory, without a log line for every connection it opens and closes."""

    noisy = False


class EtcdClient:
    """
    etcd's KV, lease and watch APIs over the members at C{endpoints} (URLs
    such as C{"http://127.0.0.1:2379"}, members of one etcd cluster).

    C{timeout} is what a request may take in all, C{attempt_timeout} what
    one attempt of it may (see the module docstring).

    C{observer(operation, seconds)}, if given, is called after every round
    trip that etcd answered successfully (operations: C{"get"}, C{"put"},
    C{"delete"}, C{"txn"}, C{"grant"}, C{"keepalive"}, C{"revoke"}, and
    C{"watch"} for a watch's response headers), for latency metrics.
    """

    # Keys per request of a prefix read (L{get} pages through all of them).
    page_size = 1000

    def __init__(
        self,
        reactor: IReactorTime,
        endpoints: Sequence[str],
        timeout: float = 2.0,
        observer: Optional[Callable[[str, float], None]] = None,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint")
        for endpoint in endpoints:
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(f"an etcd endpoint is a URL such as http://127.0.0.1:2379, not {endpoint!r}")
        if timeout <= 0:
            raise ValueError(f"the etcd timeout must be positive, not {timeout!r}")
        if attempt_timeout <= 0:
            raise ValueError(f"the etcd attempt timeout must be positive, not {attempt_timeout!r}")
        self._reactor = reactor
        self._endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self._timeout = timeout
        self._attempt_timeout = attempt_timeout
        self._observer = observer
        self._preferred = 0
        # How long etcd's last answers took (each a successful attempt's round trip).
        self._answered: Deque[float] = deque(maxlen=ANSWERS_REMEMBERED)
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool._factory = _QuietFactory
        self._pool.maxPersistentPerHost = MAX_IDLE_CONNECTIONS
        self._http = HTTPClient(Agent(reactor, pool=self._pool))
        # Watches never share: each has its own connection while it lasts.
        watch_pool = HTTPConnectionPool(reactor, persistent=False)
        watch_pool._factory = _QuietFactory
        self._watch_http = HTTPClient(Agent(reactor, pool=watch_pool))
        self._watches: List[Watch] = []

    @property
    def reactor(self) -> Any:
        """The reactor its requests and timeouts run on."""
        return self._reactor

    @property
    def endpoints(self) -> List[str]:
        """Its endpoints' URLs, in the order it tries them."""
        return list(self._endpoints)

    @property
    def timeout(self) -> float:
        """Seconds a call may take, all attempts together."""
        return self._timeout

    @property
    def observer(self) -> Optional[Callable[[str, float], None]]:
        """Told of each answered round trip (the operation, its seconds), or None."""
        return self._observer

    # -- KV --

    @inlineCallbacks
    def get(self, key: bytes, prefix: bool = False) -> Generator[Deferred[Any], Any, Tuple[int, List[KeyValue]]]:
        """
        The revision of the read, and the KeyValues of C{key} (or of every key
        under the prefix C{key}), sorted by key.  A prefix read is paged, at
        the revision of its first page.
        """
        request = _range(key, prefix)
        if not prefix:
            response = yield self._call("get", "/kv/range", request)
            return _revision(response), [_decode_kv(kv) for kv in response.get("kvs", ())]
        request["limit"] = str(self.page_size)
        revision = 0
        kvs: List[KeyValue] = []
        while True:
            response = yield self._call("get", "/kv/range", request)
            if not revision:
                revision = _revision(response)
                request["revision"] = str(revision)
            page = [_decode_kv(kv) for kv in response.get("kvs", ())]
            kvs.extend(page)
            if not response.get("more") or not page:
                return revision, kvs
            request["key"] = _b64(page[-1].key + b"\x00")

    @inlineCallbacks
    def put(self, key: bytes, value: bytes, lease: int = 0) -> Generator[Deferred[Any], Any, int]:
        """Set C{key} (bound to C{lease}, if not 0); the revision of the write."""
        request = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        response = yield self._call("put", "/kv/put", request)
        return _revision(response)

    @inlineCallbacks
    def delete(self, key: bytes, prefix: bool = False) -> Generator[Deferred[Any], Any, int]:
        """Delete C{key} (or every key under the prefix C{key}); how many keys were deleted."""
        response = yield self._call("delete", "/kv/deleterange", _range(key, prefix))
        return _int(response, "deleted")

    @inlineCallbacks
    def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> Generator[Deferred[Any], Any, TxnResult]:
        """
        If every compare holds, the C{success} operations, else the C{failure}
        ones, atomically.  See the module's docstring: a retried transaction
        may apply twice.
        """
        request = {
            "compare": [_encode_compare(condition) for condition in compare],
            "success": [_encode_operation(operation) for operation in success],
            "failure": [_encode_operation(operation) for operation in failure],
        }
        response = yield self._call("txn", "/kv/txn", request)
        return _txn_result(response, success, failure)

    # -- leases --

    @inlineCallbacks
    def grant(self, ttl: int) -> Generator[Deferred[Any], Any, Tuple[int, int]]:
        """A new lease: its id, and the TTL etcd granted (at least etcd's minimum)."""
        response = yield self._call("grant", "/lease/grant", {"TTL": str(ttl), "ID": "0"})
        if response.get("error"):
            raise EtcdError(str(response["error"]))
        return _int(response, "ID"), _int(response, "TTL")

    @inlineCallbacks
    def keepalive(self, lease: int) -> Generator[Deferred[Any], Any, int]:
        """Renew C{lease}: the TTL it has now, 0 if it is gone (expired or revoked)."""
        response = yield self._call("keepalive", "/lease/keepalive", {"ID": str(lease)})
        return _int(response.get("result", {}), "TTL")

    @inlineCallbacks
    def revoke(self, lease: int) -> Generator[Deferred[Any], Any, None]:
        """Revoke C{lease}, deleting the keys bound to it; a lease already gone is no error."""
        try:
            yield self._call("revoke", "/lease/revoke", {"ID": str(lease)})
        except EtcdError as e:
            if e.code != _GRPC_NOT_FOUND:
                raise

    # -- watches --

    def watch(
        self,
        key: bytes,
        start_revision: int,
        on_events: Callable[[List[WatchEvent]], None],
        prefix: bool = False,
    ) -> Watch:
        """
        Call C{on_events} with the events of C{key} (or of every key under the
        prefix C{key}) from C{start_revision} on (0: from now), in order, a
        batch at a time.  The watch lasts until cancelled, or until its
        stream ends (see L{Watch.ended}); it is not resumed here.
        """
        watch = Watch(on_events)
        create = _range(key, prefix)
        if start_revision:
            create["start_revision"] = str(start_revision)
        connecting: Deferred[Any] = self._call("watch", "/watch", {"create_request": create}, stream=True)
        watch._connecting = connecting
        self._watches.append(watch)
        watch.ended.addBoth(self._forget, watch)
        connecting.addCallbacks(watch._connected, watch._end)
        return watch

    def _forget(self, result: object, watch: Watch) -> object:
        self._watches.remove(watch)
        return result

    def close(self) -> Deferred[None]:
        """Cancel every watch and close the pooled connections (fires once all are closed)."""
        closed: List[Deferred[Any]] = [self._pool.closeCachedConnections()]
        for watch in list(self._watches):
            ended: Deferred[None] = Deferred()
            watch.ended.addBoth(_fire_and_pass, ended)
            closed.append(ended)
            watch.cancel()
        return gatherResults(closed).addCallback(lambda _: None)

    # -- round trips --

    @inlineCallbacks
    def _call(self, operation: str, path: str, request: JSON, stream: bool = False) -> _Steps:
        """
        POST C{request} to C{/v3}C{path}, trying again (the endpoints in
        turn, each attempt on a connection of its own if the one before got
        no answer) until one answers or the timeout is up (see the module
        docstring).  The answer as JSON, or for a C{stream} the response,
        its body unread.
        """
        now = self._reactor.seconds
        deadline = now() + self._timeout
        bound = self.attempt_bound()
        attempts = 0
        failures = 0
        delay = RETRY_DELAY
        last: Optional[str] = None
        while True:
            remaining = deadline - now()
            if remaining <= 0:
                raise EtcdUnavailable(
                    f"no etcd endpoint answered {operation} within {self._timeout} s "
                    f"({attempts} attempt{'s' if attempts != 1 else ''}; last: {last})"
                )
            index = self._preferred
            url = self._endpoints[index] + "/v3" + path
            # The last attempt takes what is left, rather than leave less than one more's worth:
            # at least one attempt of each request may take longer than bound (a slow etcd is learned so).
            allowed = remaining if remaining < bound * 2 else bound
            attempts += 1
            started = now()
            try:
                response, body = yield self._attempt(url, request, allowed, stream)
                answer = None if body is None else self._parse(response.code, body)
            except CancelledError:
                raise
            except Exception as e:
                if isinstance(e, EtcdError) and not isinstance(e, EtcdUnavailable):
                    raise  # etcd answered: no retry
                unanswered = isinstance(e, _NoAnswer)
                # An attempt cut short by the deadline says less than the failure before it.
                if last is None or not (unanswered and allowed < bound):
                    last = f"{self._endpoints[index]}: {_describe(e)}"
            else:
                self._preferred = index
                took = now() - started
                if not stream:
                    self._answered.append(took)
                if self._observer is not None:
                    self._observe(operation, took)
                return response if answer is None else answer
            self._preferred = (index + 1) % len(self._endpoints)
            if unanswered:
                # It waited out its time already, and its connection is
                # closed: the next attempt goes at once, on another.
                continue
            failures += 1
            if failures % len(self._endpoints) == 0:
                yield deferLater(self._reactor, min(delay, max(0.0, deadline - now())))
                delay = min(delay * 2, RETRY_DELAY_MAX)

    def attempt_bound(self) -> float:
        """
        What one attempt may take: a member's share of the timeout, and at
        most C{attempt_timeout}; or, if etcd has been slow on every one of
        its last answers, L{SLOW_ETCD_MARGIN} times the fastest of them, up
        to the member's share and half the timeout.
        """
        share = self._timeout / len(self._endpoints)
        bound = min(self._attempt_timeout, share)
        if len(self._answered) == ANSWERS_REMEMBERED:
            slow = SLOW_ETCD_MARGIN * min(self._answered)
            if slow > bound:
                bound = max(bound, min(slow, share, self._timeout / 2))
        return bound

    def _attempt(self, url: str, request: JSON, timeout: float, stream: bool) -> Deferred[Any]:
        """
        One POST, answered within C{timeout} (else L{_NoAnswer}, its
        connection dropped): (response, body), the body None for a stream
        that etcd accepted.  Cancelled, it fails with CancelledError.
        """

        def read(response: IResponse) -> Any:
            if stream and response.code == 200:
                return (response, None)
            return _read_body(response).addCallback(lambda body: (response, body))

        def cancel(attempt: Deferred[Any]) -> None:
            attempt.errback(Failure(CancelledError()))
            posted.cancel()

        def settled(result: object) -> None:
            if timer.active():
                timer.cancel()
            elif isinstance(result, Failure):
                result = Failure(_NoAnswer(f"no answer within {timeout:.3g} s"))
            if attempt.called:
                return  # cancelled: what the cancellation raised is of no interest
            if isinstance(result, Failure):
                attempt.errback(result)
            else:
                attempt.callback(result)

        http = self._watch_http if stream else self._http
        attempt: Deferred[Any] = Deferred(cancel)
        body = _Body(json.dumps(request, separators=(",", ":")).encode("utf-8"))
        headers = Headers({b"Content-Type": [b"application/json"]})
        posted = http.post(url, data=body, headers=headers, unbuffered=True, allow_redirects=False)
        posted.addCallback(read)
        timer = self._reactor.callLater(timeout, posted.cancel)
        posted.addBoth(settled)
        return attempt

    @staticmethod
    def _parse(status: int, body: bytes) -> JSON:
        try:
            answer = _first_message(body)
        except ValueError as e:
            raise EtcdError(f"etcd's answer (HTTP {status}) is not JSON ({e}): {body[:200]!r}")
        error = _gateway_error(answer)
        if error is not None:
            raise error
        return answer

    def _observe(self, operation: str, seconds: float) -> None:
        assert self._observer is not None
        try:
            self._observer(operation, seconds)
        except Exception:
            _log.failure("the etcd client's observer failed")
