"""
The dlock wire protocol (temoto/dlock, API version 2, with the changes
docs/protocols/dlock.md lists): its grammar, served by L{DlockFactory}.

Every message is a 4-byte big-endian length and a protocol buffer
(L{jesync.protocols.dlock_pb2}, generated from C{dlock.proto} beside it).
Requests are answered in the order they were sent: a C{Lock} that has to wait
holds up the requests behind it.  A C{Lock} takes all its keys or none (a
mutex on each, through L{jesync.interfaces.ILockService.request_many}), and
holds them until the connection ends, or, with C{release_micro}, for that
long whatever happens to the connection.  A C{Lock} that sets
C{fencing_tokens} (a field of jesync's own) gets each granted key's fencing
token in the response's C{fencing_tokens}; every other response carries only
the fields the reference server's does.  The reference's clients never ask,
and must not be sent more: its Go client reads a message with one C{Read}
call, so a response longer than what it reads (a token per key, for a
C{Lock} of a few hundred keys) leaves bytes that corrupt its next response.

Only pings (or any other bytes) keep a connection alive: one silent for
C{--dlock-idle-timeout} is closed even if it holds or waits for locks, as
the reference server does.  The access token travels in every request; it
is checked against the server's token (when it has one), and a wrong one
closes the connection.  With a token, a connection is authenticating until
its first complete request with a right token, and is closed if that has not
come within C{--auth-timeout}, as on every listener: otherwise a client
without the token could hold a connection slot for as long as it trickles
bytes of a request it never finishes (the idle timeout starts once it has
authenticated).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, ClassVar, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from google.protobuf.message import DecodeError
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from jesync.connections.connection import LockConnection, LockServerFactory
from jesync.connections.framing import LengthPrefixedFraming
from jesync.connections.grammar import Grammar
from jesync.connections.policy import ConnectionPolicy
from jesync.errors import LimitReached, LockTimeout
from jesync.interfaces import IGrant, ILockService
from jesync.protocols.dlock_pb2 import (
    AcquireTimeout,
    General,
    InvalidType,
    Lock,
    Ok,
    Ping,
    Request,
    Response,
    ResponseStatus,
    TooManyKeys,
    Unlock,
    Version,
)
from jesync.sessions import TimedGrants
from jesync.wire import WAIT_FOREVER, key_problem

#: The protocol version served (and the only one accepted besides 0, unset).
API_VERSION = 2
#: The reference server's defaults.
DEFAULT_MAX_MESSAGE = 16384
DEFAULT_IDLE_TIMEOUT = 60.0
DEFAULT_MAX_KEYS = 1000

#: The request types, by name, for counting (and "invalid": another type;
#: "malformed": not a Request at all).
TYPE_NAMES = {Ping: "ping", Lock: "lock", Unlock: "unlock"}
COUNTED = (*TYPE_NAMES.values(), "invalid", "malformed")


class _Way(NamedTuple):
    """How a Lock holds its keys: for a time (its owner the connection's L{TimedGrants}) or until disconnect."""

    owner: object
    other: object  # the owner of the other way (None: no timed grants yet)
    expires: float


class DlockProtocol(Grammar):
    """
    The dlock grammar.  The connection owns the keys locked until disconnect,
    and a L{TimedGrants} those locked for a time.
    """

    framing = LengthPrefixedFraming
    ordered = True
    idle_while_busy = True
    #: The request types served, and their handlers.
    handlers: ClassVar[Dict[int, Callable[[DlockProtocol, Request], None]]] = {}

    def __init__(self, connection: LockConnection) -> None:
        super().__init__(connection)
        factory = connection.factory
        assert isinstance(factory, DlockFactory)
        self.factory = factory
        self.max_frame = factory.max_message
        self.idle_timeout = factory.idle_timeout
        self.timed: Optional[TimedGrants] = None
        # The id of the request whose answer is owed (a Lock waiting), if any.
        self._owed_id: Optional[int] = None
        # The id of the request being read (its token refused: the answer's).
        self._request_id = 0

    # -- requests -----------------------------------------------------------------

    def frame_received(self, frame: bytes) -> None:
        request = Request()
        try:
            request.ParseFromString(frame)
        except DecodeError as error:
            self.factory.requests["malformed"] += 1
            self.connection.close(self._framed(self._response(0, General, f"malformed request: {error}")))
            return
        self.factory.requests[TYPE_NAMES.get(request.type, "invalid")] += 1
        if self.connection.verbose:
            self.log.debug("{peer} sent {request}", peer=self.connection.peer, request=_described(request))
        # (each request's token is checked: the first right one authenticates
        # the connection, a wrong one closes it, with this request's id)
        self._request_id = request.id
        if not self.connection.authenticate(request.access_token.encode("utf-8")):
            return
        if request.version not in (0, API_VERSION):
            self._reply(request.id, Version, f"version {request.version} not supported: {API_VERSION} is")
            return
        handler = self.handlers.get(request.type)
        if handler is None:
            self._reply(request.id, InvalidType, f"unknown request type {request.type}")
        else:
            handler(self, request)

    def _ping(self, request: Request) -> None:
        self._reply(request.id, Ok)

    def _keys(self, request: Request) -> Union[List[str], Response]:
        """The request's keys, or the error response that refuses them."""
        keys = list(dict.fromkeys(request.lock.keys))
        if not keys:
            return self._response(request.id, General, "no keys given")
        if len(keys) > self.factory.max_keys:
            return self._response(request.id, TooManyKeys, f"more than {self.factory.max_keys} keys")
        max_length = self.connection.policy.max_key_length
        for key in keys:
            problem = key_problem(key, max_length)
            if problem is not None:
                return self._response(request.id, General, problem)
        return keys

    def _lock(self, request: Request) -> None:
        keys = self._keys(request)
        if isinstance(keys, Response):
            self._send(keys)
            return
        wait_micro = request.lock.wait_micro
        release_micro = request.lock.release_micro
        timeout = wait_micro / 1e6 if wait_micro else WAIT_FOREVER  # 0: no limit, as the reference
        if not self.connection.may_wait:
            timeout = 0
        if release_micro:
            way = _Way(self._timed(), self.connection, release_micro / 1e6)
        else:
            way = _Way(self.connection, self.timed, 0)
        # Keys this connection holds the other way (timed, or until
        # disconnect) are its own already: they take this request's way once
        # it is granted, and are not asked for.
        switching: List[str] = []
        wanted: List[str] = []
        for key in keys:
            held_other_way = way.other is not None and self.service.grant_of(key, way.other) is not None
            (switching if held_other_way else wanted).append(key)
        # What it holds already this way is renewed, not taken: never given
        # back if a switching key is lost (only then is this needed).
        kept = {key for key in wanted if self.service.grant_of(key, way.owner) is not None} if switching else set()
        try:
            if not wanted:
                result: object = []
            elif len(wanted) == 1:
                # (the one-key path of the lock table is its fastest)
                result = self.service.request(wanted[0], way.owner, 1, timeout, way.expires)
            else:
                result = self.service.request_many(wanted, way.owner, timeout, way.expires)
        except (LimitReached, ValueError) as error:
            self._reply(request.id, General, str(error))
            return
        if isinstance(result, Deferred):
            self._owed_id = request.id
            result.addCallbacks(
                self._granted,
                self._not_granted,
                (request.id, keys, switching, kept, way, request.lock.fencing_tokens),
                errbackArgs=(request.id, keys, way),
            )
            self.connection.await_reply(result)
        else:
            self._granted(result, request.id, keys, switching, kept, way, request.lock.fencing_tokens)

    def _granted(
        self,
        result: object,
        request_id: int,
        keys: List[str],
        switching: List[str],
        kept: Set[str],
        way: _Way,
        with_tokens: bool,
    ) -> None:
        self._owed_id = None
        given: List[IGrant] = result if isinstance(result, list) else [result]  # type: ignore[list-item]
        grants = {grant.key: grant for grant in given}
        lost = []
        for key in switching:
            grant = self.service.reassign(key, way.other, way.owner, way.expires)
            if grant is None:
                lost.append(key)  # a timed grant that ran out while this request waited
            else:
                grants[key] = grant
        if lost:
            # All or nothing: give back what this request took.
            for key in grants:
                if key not in kept and key not in switching:
                    self.service.release(key, way.owner)
            self._acquire_timeout(request_id, lost)
            return
        # Timed grants begun, renewed, or switched to or from a time: told to
        # whoever records them, and reported only once recorded.
        timed = bool(switching) or isinstance(way.owner, TimedGrants)
        changes = self.owner_changes() if timed else None
        if changes is not None:
            for key in keys:  # (begun, renewed, or switched to or from a time)
                changes.timed_changed(key)
        response = self._response(request_id, Ok)
        if with_tokens:
            response.fencing_tokens.extend(grants[key].token for key in keys)
        self._send(response, durable=timed)

    def _not_granted(self, failure: Failure, request_id: int, keys: List[str], way: _Way) -> None:
        self._owed_id = None
        if isinstance(failure.value, LockTimeout):
            self._acquire_timeout(request_id, failure.value.busy)
        elif failure.check(CancelledError):
            # The client sent FIN while it waited (once the connection is
            # closing, nothing is sent).
            self._acquire_timeout(request_id, [key for key in keys if self._in_use(key) and not self._holds(key, way)])
        else:
            # (AlreadyWaiting cannot happen: one request at a time)
            self.log.failure("lock request failed", failure)
            self._reply(request_id, General, str(failure.value))

    def _acquire_timeout(self, request_id: int, busy: Sequence[str]) -> None:
        self.factory.timeouts += 1
        response = self._response(request_id, AcquireTimeout)
        response.keys.extend(busy)
        self._send(response)

    def _holds(self, key: str, way: _Way) -> bool:
        """Whether this connection holds C{key}, either way."""
        return any(owner is not None and self.service.grant_of(key, owner) for owner in (way.owner, way.other))

    def _in_use(self, key: str) -> bool:
        status = self.service.status(key)
        return bool(status.granted or status.waiting)

    def _unlock(self, request: Request) -> None:
        """Release the listed keys this connection holds, either way; keys it does not hold are ignored."""
        keys = self._keys(request)
        if isinstance(keys, Response):
            self._send(keys)
            return
        for key in keys:
            if not self.service.release(key, self.connection) and self.timed is not None:
                self.service.release(key, self.timed)
        # (a timed grant given back is written to etcd first, in cluster mode)
        self._send(self._response(request.id, Ok), durable=self.timed is not None)

    def _timed(self) -> TimedGrants:
        if self.timed is None:
            self.timed = TimedGrants(self.connection.peer)
        return self.timed

    # -- responses ----------------------------------------------------------------

    def _response(self, request_id: int, status: ResponseStatus, error_text: str = "") -> Response:
        return Response(
            version=API_VERSION,
            request_id=request_id,
            status=status,
            error_text=error_text,
            server_unix_time=int(self.service.clock.seconds() * 1e9),
        )

    def _reply(self, request_id: int, status: ResponseStatus, error_text: str = "") -> None:
        self._send(self._response(request_id, status, error_text))

    def _send(self, response: Response, durable: bool = False) -> None:
        """Send C{response}; a C{durable} one once the timed grants it reports are in etcd (cluster mode)."""
        if self.connection.verbose:
            self.log.debug("{peer} answered {response}", peer=self.connection.peer, response=_described(response))
        if durable:
            self.connection.write_durable(self._framed(response))
        else:
            self.connection.write(self._framed(response))

    @staticmethod
    def _framed(response: Response) -> bytes:
        body = response.SerializeToString()
        return len(body).to_bytes(4, "big") + body

    # -- what the connection layer says through us ---------------------------------

    def refusal(self, error: LimitReached) -> bytes:
        # A waiting Lock (idle timeout) is answered; otherwise request id 0.
        return self._framed(self._response(self._owed_id or 0, General, str(error)))

    def auth_refused(self) -> bytes:
        return self._framed(self._response(self._request_id, General, "access token refused"))

    def frame_too_long(self) -> bytes:
        return self._framed(self._response(0, General, f"message longer than {self.max_frame} bytes"))


DlockProtocol.handlers = {Ping: DlockProtocol._ping, Lock: DlockProtocol._lock, Unlock: DlockProtocol._unlock}


def _described(message: object) -> str:
    """A message on one line, for the verbose log (never the access token)."""
    text = " ".join(str(message).split())
    if isinstance(message, Request) and message.access_token:
        text = text.replace(repr(message.access_token)[1:-1], "(token)")
    return text


class DlockFactory(LockServerFactory):
    """
    Serves the dlock protocol over a lock service; listen on it with any
    stream endpoint.

    @param policy: the server's policy; dlock connections keep its limits,
        registry and authentication, whose handshake is the first request
        with a right C{access_token} (every request's is checked against the
        policy's token), but not its idle timeout: they close after
        C{idle_timeout} seconds of silence.
    @param max_message: the longest message, in bytes (a longer one closes
        the connection).
    @param max_keys: the most keys one request may name.
    @ivar requests: requests received, by type (C{ping}, C{lock}, C{unlock},
        C{invalid}, C{malformed}).
    @ivar timeouts: Lock requests answered C{AcquireTimeout}.
    """

    grammar = DlockProtocol

    def __init__(
        self,
        service: ILockService,
        verbose: bool = False,
        policy: Optional[ConnectionPolicy] = None,
        max_message: int = DEFAULT_MAX_MESSAGE,
        max_keys: int = DEFAULT_MAX_KEYS,
        idle_timeout: Optional[float] = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        super().__init__(service, verbose, policy)
        self.idle_timeout = idle_timeout
        self.max_message = max_message
        self.max_keys = max_keys
        self.requests: Counter[str] = Counter()
        self.timeouts = 0

    def request_counts(self) -> List[Tuple[str, int]]:
        """Requests received by type, every type named (for C{stats} and metrics)."""
        return [(kind, self.requests[kind]) for kind in COUNTED]
