"""
The HTTP/JSON API's one resource: every request goes through L{HttpApi},
which finds its route, checks its token, reads its JSON, runs its handler
and writes the JSON it returns, or the error it raised.

The rules every route shares live here, once:

 - B{Errors are JSON with one stable code}: C{{"code", "message", ...}}
   with the HTTP status that fits (L{error_of} maps the lock table's
   exceptions; a handler raises L{ApiError} for its own).  Nothing
   unexpected reaches the client as a traceback: it is logged, and the
   client gets C{500 internal_error}.
 - B{Auth is a bearer token}: with C{--auth-token-file}, every route but
   the ones declared open needs C{Authorization: Bearer <token>}; a request
   that carries it authorizes its connection (C{on_authorized}: the
   listener's auth deadline is lifted).  Never a token in a URL.
 - B{A request whose client has gone is granted nothing}: a handler that
   waits (a long poll) returns a Deferred; when the client goes away it is
   cancelled, and the lock table withdraws the wait.  A reply that could
   not be delivered is undone (L{Reply.undo}): the client never learned of
   it.  When the server stops (or, in cluster mode, its term ends) every
   call still waiting is answered with C{409 not_granted} saying why
   (L{HttpApi.close}).
 - B{In cluster mode a reply is sent only once what it reports is
   durable}: as elock's replies, every reply waits until everything the
   lock table changed so far is in etcd
   (L{jesync.connections.policy.IDurability}), and is sent only while this
   member may still answer; otherwise C{503 unavailable}.  An HTTP
   session is the client's failsafe across a failover, so what it was
   told it holds, it holds on the next leader.  (Event streams are sent
   as the table changes, as JESync's watch events are.)

Routes are declared by the modules that handle them (L{route}, into their
module's C{ROUTES}), and handlers are small functions of a L{Call}: its
JSON fields read with typed accessors that answer C{400} for bad input.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Dict, List, Optional, Pattern, Sequence, Tuple
from urllib.parse import unquote

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from jesync.connections.policy import ConnectionPolicy, describe_peer
from jesync.errors import (
    AlreadyWaiting,
    GroupAlreadyExists,
    GroupKeyTaken,
    GroupNotCreated,
    GroupNotEmpty,
    LimitReached,
    LockTimeout,
    MemberAlreadyExists,
    MemberNotJoined,
    ModeConflict,
)
from jesync.http.state import BusiestKeys, LeaderObservers, ListingSnapshots, StatusSignature
from jesync.interfaces import IOwnerChanges
from jesync.wire import LARGEST_NUMBER, MAX_VALUE, key_problem

log = Logger()

# The limits one client runs into on its own (429: it should slow down);
# every other limit is the server's as a whole (503).
PER_CLIENT_LIMITS = frozenset({"max-held", "max-waiters", "max-watches"})

_MISSING: Any = object()


class ApiError(Exception):
    """
    An error reply: C{status}, a stable C{code}, a C{message} for people,
    and C{extra} fields of the JSON body (and C{headers}).
    """

    def __init__(
        self, status: int, code: str, message: str, headers: Optional[Dict[str, str]] = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def document(self) -> Dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


def error_of(failure: Failure, why_cancelled: str = "the request was cancelled") -> ApiError:
    """
    The error reply for a failure: an L{ApiError} itself, or the one for a
    lock table's exception; anything else is a bug, logged and answered
    with C{500 internal_error}.
    """
    error = failure.value
    if isinstance(error, ApiError):
        return error
    if isinstance(error, LockTimeout):
        return ApiError(409, "not_granted", f"not granted: {', '.join(error.busy)} busy", busy=error.busy)
    if isinstance(error, CancelledError):
        return ApiError(409, "not_granted", f"not granted: {why_cancelled}", busy=[])
    if isinstance(error, AlreadyWaiting):
        return ApiError(409, "already_waiting", str(error))
    if isinstance(error, ModeConflict):
        return ApiError(409, "mode_conflict", str(error))
    if isinstance(error, LimitReached):
        status = 429 if error.limit in PER_CLIENT_LIMITS else 503
        return ApiError(status, "limit_reached", str(error), limit=error.limit, value=error.value)
    for kind, status, code in _GROUP_ERRORS:
        if isinstance(error, kind):
            return ApiError(status, code, str(error))
    if isinstance(error, ValueError):
        return ApiError(400, "invalid_parameter", str(error))
    log.failure("an HTTP API call failed", failure)
    return ApiError(500, "internal_error", "internal error (the server's log says more)")


_GROUP_ERRORS: Sequence[Tuple[type, int, str]] = (
    (GroupNotCreated, 404, "group_not_found"),
    (GroupAlreadyExists, 409, "group_exists"),
    (GroupKeyTaken, 409, "group_key_taken"),
    (GroupNotEmpty, 409, "group_not_empty"),
    (MemberAlreadyExists, 409, "member_exists"),
    (MemberNotJoined, 409, "not_member"),
)


class Reply:
    """
    A reply other than C{200} with a JSON document: its C{status}, its
    C{document} (JSON) or C{body} (bytes of C{content_type}), its
    C{headers}; C{undo}: what to do if it cannot be delivered (its client
    has gone: a grant it reports is released).
    """

    def __init__(
        self,
        document: Any = None,
        status: int = 200,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        headers: Optional[Dict[str, str]] = None,
        undo: Optional[Callable[[], object]] = None,
    ) -> None:
        self.document = document
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}
        self.undo = undo


class Held:
    """
    What a call that outlives its handler (an event stream) gives
    L{Call.hold}: told to L{stop} when the server stops or its token is
    no longer accepted.
    """

    def stop(self, why: str) -> None:
        raise NotImplementedError


# What a handler returns after it has started writing the response itself
# (an event stream, having called Call.hold).
STREAMING: Any = object()


class ApiContext:
    """
    What the routes work on: the lock table (C{locks}), elock's session
    table (C{sessions}), the groups (C{groups}), the connection policy
    (C{policy}: tokens, key length, durability, listing budget), the
    C{clock}, the longest long poll (C{max_wait}, seconds), and
    C{describe}: the server's own part of the status document (role,
    term, limits, listeners, uptime; see L{jesync.http.status}).

    It holds, too, what the server's API keeps between requests, made here
    once and gone with it (L{jesync.http.state}): C{listing_snapshots},
    C{busiest_keys}, C{leader_observers} and C{latest_status}.
    """

    def __init__(
        self,
        locks: Any,
        sessions: Any,
        groups: Any,
        policy: ConnectionPolicy,
        clock: IReactorTime,
        max_wait: float = 60.0,
        describe: Optional[Callable[[], Dict[str, Any]]] = None,
    ) -> None:
        self.locks = locks
        self.sessions = sessions
        self.groups = groups
        self.policy = policy
        self.clock = clock
        self.max_wait = max_wait
        self.describe: Callable[[], Dict[str, Any]] = describe or dict
        #: The last listing snapshot of each order, kept for the next page (L{jesync.http.locks}).
        self.listing_snapshots = ListingSnapshots(locks, policy, clock)
        #: The keys last found busiest: the status document's top (L{jesync.http.status}).
        self.busiest_keys = BusiestKeys(locks, clock)
        #: Each election's observe streams, told when its leader proclaims (L{jesync.http.streams}).
        self.leader_observers = LeaderObservers()
        #: The status document last made for a status stream, and what it counted (L{jesync.http.streams}).
        self.latest_status: Optional[Tuple[StatusSignature, Dict[str, Any]]] = None


class Route:
    """
    One route: C{method} and a path C{template} (C{/v1/locks/{key}}: each
    C{{name}} one percent-encoded path segment), its C{handler}; C{auth}:
    whether it needs the token.
    """

    def __init__(self, method: str, template: str, handler: Callable[[Call], Any], auth: bool) -> None:
        self.method = method
        self.template = template
        self.handler = handler
        self.auth = auth
        self.pattern: Pattern[str] = re.compile(
            "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$"
        )

    def match(self, path: str) -> Optional[Dict[str, str]]:
        found = self.pattern.match(path)
        if found is None:
            return None
        return {name: unquote(segment, errors="strict") for name, segment in found.groupdict().items()}


def route(
    routes: List[Route], method: str, template: str, auth: bool = True
) -> Callable[[Callable[[Call], Any]], Callable[[Call], Any]]:
    """Declare the decorated function the handler of C{method template}, in C{routes}."""

    def declare(handler: Callable[[Call], Any]) -> Callable[[Call], Any]:
        routes.append(Route(method, template, handler, auth))
        return handler

    return declare


class Call:
    """
    One request to a route: its C{params} (the path's), its query and JSON
    body read with typed accessors (each raising C{400 invalid_parameter}
    for a bad value), its C{peer}, and the C{context} it works on.

    @ivar gone: its client went away (or the server stopped) before it was
        answered: nothing more is sent.
    """

    def __init__(self, api: HttpApi, request: Any, route: Route, params: Dict[str, str]) -> None:
        self.api = api
        self.context: ApiContext = api.context
        self.request = request
        self.route = route
        self.params = params
        self.gone = False
        self.why_stopped = "the client went away"
        self.stopped = False
        self._body: Optional[Dict[str, Any]] = None
        self._session: Any = None
        self._waiting: Optional[Deferred[Any]] = None
        self._held: Optional[Held] = None
        request.notifyFinish().addBoth(self._finished)

    @property
    def peer(self) -> str:
        return describe_peer(self.request.getClientAddress())

    # -- the request's fields ------------------------------------------

    @property
    def body(self) -> Dict[str, Any]:
        """The JSON object sent (an empty one for an empty body)."""
        if self._body is None:
            raw = self.request.content.read() if self.request.content is not None else b""
            if not raw.strip():
                self._body = {}
            else:
                try:
                    parsed = json.loads(raw)
                except ValueError as error:  # (UnicodeDecodeError is one)
                    raise ApiError(400, "invalid_json", f"the body is not JSON: {error}")
                except RecursionError:
                    raise ApiError(400, "invalid_json", "the body is not JSON: it is nested too deeply")
                if not isinstance(parsed, dict):
                    raise ApiError(400, "invalid_json", "the body must be a JSON object")
                self._body = parsed
        return self._body

    def query(self, name: str, default: Optional[str] = None) -> Optional[str]:
        values = self.request.args.get(name.encode())
        if not values:
            return default
        try:
            return values[0].decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(name, "is not UTF-8")

    def query_integer(self, name: str, default: int, minimum: int, maximum: int) -> int:
        text = self.query(name)
        if text is None:
            return default
        try:
            number = int(text)
        except ValueError:
            raise invalid(name, "must be an integer")
        if not minimum <= number <= maximum:
            raise invalid(name, f"must be from {minimum} to {maximum}")
        return number

    def text(self, name: str, default: Any = _MISSING) -> Any:
        """A string field (C{default} if absent; required without one)."""
        value = self._field(name, default)
        if value is not default and not isinstance(value, str):
            raise invalid(name, "must be a string")
        return value

    def number(
        self, name: str, default: Any = _MISSING, minimum: Optional[float] = None, maximum: float = LARGEST_NUMBER
    ) -> Any:
        """
        A number field, at least C{minimum}, at most C{maximum} (by default
        the largest number the line protocols accept: a time in seconds
        past it is no time a lock server keeps, and an infinite one would
        wedge the timers): finite, else C{400 invalid_parameter}.
        """
        value = self._field(name, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(name, "must be a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid(name, "must be a finite number")
        if minimum is not None and value < minimum:
            raise invalid(name, f"must be at least {minimum}")
        if value > maximum:
            raise invalid(name, f"must be at most {maximum}")
        return value

    def integer(
        self, name: str, default: Any = _MISSING, minimum: Optional[int] = None, maximum: int = LARGEST_NUMBER
    ) -> Any:
        """An integer field, at least C{minimum}, at most C{maximum} (by default as the line protocols)."""
        value = self._field(name, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, "must be an integer")
        if minimum is not None and value < minimum:
            raise invalid(name, f"must be at least {minimum}")
        if value > maximum:
            raise invalid(name, f"must be at most {maximum}")
        return value

    def boolean(self, name: str, default: Any = _MISSING) -> Any:
        value = self._field(name, default)
        if value is not default and not isinstance(value, bool):
            raise invalid(name, "must be true or false")
        return value

    def value(self, name: str = "value") -> Optional[bytes]:
        """A value field: text of at most L{MAX_VALUE} bytes in UTF-8, or null (absent: None)."""
        text = self._field(name, None)
        if text is None:
            return None
        if not isinstance(text, str):
            raise invalid(name, "must be a string or null")
        value = text.encode("utf-8", "surrogatepass")
        if len(value) > MAX_VALUE:
            raise ApiError(400, "value_too_long", f"{name} is longer than {MAX_VALUE} bytes", parameter=name)
        return value

    def key(self, name: str = "key", text: Any = _MISSING) -> str:
        """A key field (or C{text}, a key from the path): a key of the key space, else C{400 invalid_key}."""
        key = self.text(name) if text is _MISSING else text
        problem = key_problem(key, self.context.policy.max_key_length)
        if problem is not None:
            raise ApiError(400, "invalid_key", problem, parameter=name)
        return key

    def keys(self) -> List[str]:
        """C{key} or C{keys} (a non-empty list): exactly one of the two."""
        body = self.body
        if ("key" in body) == ("keys" in body):
            raise invalid("key", "give either key or keys")
        if "key" in body:
            return [self.key()]
        keys = body["keys"]
        if not isinstance(keys, list) or not keys or not all(isinstance(key, str) for key in keys):
            raise invalid("keys", "must be a non-empty list of keys (strings)")
        return [self.key("keys", key) for key in keys]

    def session(self) -> Any:
        """The live session named by the C{session} field, else C{404 no_such_session}."""
        session = self.context.sessions.find(self.text("session"))
        if session is None:
            raise no_such_session()
        self._session = session
        return session

    def session_ended(self, failure: Failure) -> bool:
        """
        Whether C{failure} (of this call's long poll) is its session's end:
        a wait is cancelled by its client going away (nothing is sent then),
        by the server stopping (L{stop}), or by its session ending (its end,
        its TTL running out: the lock table withdraws the session's waits
        as it releases its locks, before the session table forgets it).
        """
        return failure.check(CancelledError) is not None and self._session is not None and not self.stopped

    def wait(self, name: str = "wait") -> float:
        """A long poll's seconds: 0 by default; -1, or more than the server's C{--http-max-wait}: that."""
        wait = self.number(name, 0)
        if wait == -1 or wait > self.context.max_wait:
            return self.context.max_wait
        if wait < 0:
            raise invalid(name, "must be at least 0 (or -1: as long as the server allows)")
        return float(wait)

    def _field(self, name: str, default: Any) -> Any:
        value = self.body.get(name, default)
        if value is _MISSING:
            raise invalid(name, "is required")
        return value

    # -- what outlives the handler ---------------------------------------

    def hold(self, held: Held) -> None:
        """C{held} (an event stream) answers this call from now on; it is stopped with the server."""
        self._held = held
        self.api.in_flight.add(self)

    def stop(self, why: str) -> None:
        """The server stops: a wait is answered C{not_granted} saying C{why}; a stream ends."""
        self.why_stopped = why
        self.stopped = True
        if self._waiting is not None:
            self._waiting.cancel()
        if self._held is not None:
            self._held.stop(why)

    def _finished(self, result: object) -> None:
        """The response was sent, or the connection went first (a Failure)."""
        self.api.in_flight.discard(self)
        if isinstance(result, Failure):
            self.gone = True
            if self._waiting is not None:
                self._waiting.cancel()
            if self._held is not None:
                self._held.stop("the client went away")


def no_such_session() -> ApiError:
    return ApiError(404, "no_such_session", "no such session (it ended, or its ttl ran out)")


def invalid(name: str, problem: str) -> ApiError:
    return ApiError(400, "invalid_parameter", f"{name} {problem}", parameter=name)


class HttpApi(Resource):
    """
    The API: C{routes} over C{context}.  C{on_authorized(request,
    generation)}: a request carried an accepted token (of that generation).
    """

    isLeaf = True

    def __init__(
        self,
        context: ApiContext,
        routes: Sequence[Route],
        on_authorized: Optional[Callable[[Any, int], None]] = None,
    ) -> None:
        super().__init__()
        self.context = context
        self.routes = list(routes)
        self.on_authorized = on_authorized
        self.in_flight: set[Call] = set()
        self.closed: Optional[str] = None

    def close(self, why: str = "the server is stopping") -> None:
        """Answer every call still waiting (C{409 not_granted} saying C{why}) and end every stream."""
        self.closed = why
        for call in list(self.in_flight):
            call.stop(why)

    def render(self, request: Any) -> Any:
        try:
            path = request.path.decode("ascii")
        except UnicodeDecodeError:
            return self._error(request, ApiError(404, "not_found", "no such resource"))
        method = request.method.decode("ascii", "replace")
        allowed = []
        for candidate in self.routes:
            try:
                params = candidate.match(path)
            except UnicodeDecodeError:
                return self._error(request, invalid("path", "is not UTF-8 once percent-decoded"))
            if params is None:
                continue
            if candidate.method == method or (method == "HEAD" and candidate.method == "GET"):
                return self._run(request, candidate, params)
            allowed.append(candidate.method)
        if allowed:
            return self._error(
                request,
                ApiError(405, "method_not_allowed", f"{method} is not allowed here", {"Allow": ", ".join(allowed)}),
            )
        return self._error(request, ApiError(404, "not_found", "no such resource"))

    def _run(self, request: Any, route: Route, params: Dict[str, str]) -> Any:
        try:
            self._check_token(request, route)
            if self.closed is not None or not self._serving():
                raise ApiError(503, "unavailable", "the server is not serving (stopping, or not the leader)")
            call = Call(self, request, route, params)
            result = route.handler(call)
        except Exception:
            return self._error(request, error_of(Failure()))
        if result is STREAMING:
            return NOT_DONE_YET
        if isinstance(result, Deferred):
            call._waiting = result
            self.in_flight.add(call)
            result.addCallback(self._answered, call).addErrback(self._failed, call)
            return NOT_DONE_YET
        self._answered(result, call)
        return NOT_DONE_YET

    def _answered(self, result: Any, call: Call) -> None:
        call._waiting = None
        reply = result if isinstance(result, Reply) else Reply(result)
        durability = self.context.policy.durability
        durable = durability.durable() if durability is not None else None
        if durable is None:
            self._send(call, reply)
        else:
            durable.addCallbacks(lambda _: self._send(call, reply), lambda _: self._send(call, reply, False))

    def _send(self, call: Call, reply: Reply, durable: bool = True) -> None:
        self.in_flight.discard(call)
        if call.gone:
            if reply.undo is not None:
                reply.undo()
            return
        if not (durable and self._serving()):
            # (a deposed leader reports no change: its write may not have landed)
            if reply.undo is not None:
                reply.undo()
            self._write_error(call.request, ApiError(503, "unavailable", "no longer the leader"))
            return
        body = reply.body if reply.body is not None else encode_json(reply.document)
        self._write(call.request, reply.status, reply.content_type, body, reply.headers)

    def _failed(self, failure: Failure, call: Call) -> None:
        self.in_flight.discard(call)
        call._waiting = None
        if call.gone:
            return
        if call.session_ended(failure):
            # (its session ended while it waited: the wait was withdrawn with it)
            self._write_error(call.request, no_such_session())
            return
        self._write_error(call.request, error_of(failure, call.why_stopped))

    def _check_token(self, request: Any, route: Route) -> None:
        policy = self.context.policy
        if policy.auth_token is None or not route.auth:
            return
        header = request.getHeader(b"authorization") or b""  # (bytes: twisted.web's headers are)
        scheme, _, token = header.partition(b" ")
        generation = None
        if scheme.lower() == b"bearer" and token.strip():
            generation = policy.generation_of(token.strip(), self.context.clock.seconds())
        if generation is None:
            raise ApiError(
                401,
                "unauthorized",
                "this server needs a token: send Authorization: Bearer <token>",
                {"WWW-Authenticate": 'Bearer realm="jesync"'},
            )
        if self.on_authorized is not None:
            self.on_authorized(request, generation)

    def _serving(self) -> bool:
        serving = self.context.policy.serving
        return serving is None or serving()

    def _error(self, request: Any, error: ApiError) -> Any:
        self._write_error(request, error)
        return NOT_DONE_YET

    def _write_error(self, request: Any, error: ApiError) -> None:
        self._write(request, error.status, "application/json", encode_json(error.document()), error.headers)

    def _write(self, request: Any, status: int, content_type: str, body: bytes, headers: Dict[str, str]) -> None:
        request.setResponseCode(status)
        request.setHeader(b"content-type", content_type.encode())
        request.setHeader(b"cache-control", b"no-store")
        for name, value in headers.items():
            request.setHeader(name.encode(), value.encode())
        request.setHeader(b"content-length", b"%d" % len(body))
        if request.method != b"HEAD":
            request.write(body)
        request.finish()


def owner_changes(context: ApiContext) -> Optional[Any]:
    """The lock table's observer if it records sessions (cluster mode: the journal)."""
    return IOwnerChanges(context.locks.observer, None)


def tell_renewed(call: Call, session: Any, keys: Sequence[str]) -> None:
    """
    Tell cluster mode's journal of the session's grants renewed (their
    expiry, their value: the lock table tells it of grants, not of
    renewals, nor of a group member's capabilities updated), before the
    durable reply: every call that renews a grant (acquire, renew,
    campaign, proclaim, a group update) calls this.
    """
    changes = owner_changes(call.context)
    if changes is not None:
        for key in keys:
            changes.held_changed(session, key)


def grant_document(grant: Any, now: float) -> Dict[str, Any]:
    """A grant as the API shows it (its holder's peer, never a session id), at clock time C{now}."""
    return {
        "key": grant.key,
        "token": grant.token,
        "mode": grant.mode,
        "max_concurrent": grant.max_concurrent,
        "held_for": max(0.0, now - grant.granted_at),
        "expires_in": grant.seconds_left,
        "value": value_text(grant.value),
        "peer": peer_of(grant.owner),
    }


def peer_of(owner: Any) -> str:
    """An owner's peer as the API shows it (a session's, a connection's; never a session id)."""
    return getattr(owner, "peer", None) or repr(owner)


def value_text(value: Optional[bytes]) -> Optional[str]:
    """A value as text: UTF-8, bytes that are not shown as U+FFFD."""
    return None if value is None else value.decode("utf-8", "replace")


def encode_json(document: Any) -> bytes:
    """C{document} as JSON (never NaN or Infinity, which are not JSON: a ValueError, a bug)."""
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )
