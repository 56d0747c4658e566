"""
Server-Sent Events: what the HTTP API streams (C{text/event-stream}), and
the one rule every stream keeps: B{a client that does not read is dropped,
never buffered without bound}.

 - C{GET /v1/watch?key=K} or C{?prefix=P}: the lock table's watch
   (L{jesync.service}), one event per change, as it happens and in the
   table's order: C{event: granted|released|expired|lost|appeared|
   disappeared} with C{data: {"key", "holder": grant|null}}; a key watch
   starts with C{event: snapshot} C{{"key", "holders": [grant]}}.  The
   stream is the watch's owner, and the watch ends with it.  Past
   C{--max-total-watches} a stream is refused before it starts (C{503
   limit_reached}).  C{--max-watches} (a connection's) never refuses one:
   a stream watches one key or prefix, and an HTTP/1.1 connection carries
   one stream at a time (the requests after it wait for its end).
 - C{GET /v1/elections/{name}/observe}: C{event: leader}
   C{{"election", "leader": grant|null}}: the leader of now at once, then
   each time the key C{election:<name>}'s first holder changes, and each
   time the leader proclaims a new value (L{proclaimed}, which tells the
   server's C{leader_observers}: a renewal is not an event of the lock
   table, but an observer of an election wants the leader's new value).
   A watch as above.  A hand-over is two events, C{null} then the new
   leader: the table tells the old leader's release, then the grant it
   made room for.
 - C{GET /v1/status/stream}: C{event: status} with the document of
   C{GET /v1/status} (L{jesync.http.status}): at once, then at most every
   0.5 s and only when something it counts changed.

B{How a stream is written} (L{EventStream}): each event is C{event:} its
name and C{data:} its JSON on one line; a C{: ping} comment every 15 s
keeps proxies from closing a quiet stream (headers C{Cache-Control:
no-cache} and C{X-Accel-Buffering: no} keep them from holding it back).
The stream is the request's streaming producer, so the transport pauses it
when the client stops reading (its buffer passed its high-water mark).
While paused, its events are kept and their bytes counted (no pings: they
would tell nobody anything); past the policy's C{max_unsent} the stream is
dropped (logged, the connection aborted: the client learns it missed
events by the connection's end, never by silence).  Events are told from
inside a change of the lock table, so the abort is on the next reactor
turn; the stream sends nothing more from then on.  When the transport
resumes it, the kept events are written while it does not pause again.

A stream ends when its client goes (the watch withdrawn), or when the
server stops or the token it was authorized with is rotated out
(L{EventStream.stop}: a last C{event: end} C{{"reason"}}, then the
response is finished).

B{Why the status stream polls.}  Each status stream looks, every 0.5 s on
the clock, at what the document counts: the lock table's C{version} (every
grant, release, wait and its end), the sessions and the connections; only
if that changed is a document made.  That costs O(1) a stream a tick,
whatever the table's size or rate of change, and nothing at all while no
stream is open.  The other way, a hook on the table (C{watch_holds}), would
cost every first grant and last release a call for as long as the server
runs (it cannot be taken back), would still miss waits, and would only
decide whether to send what the tick decides anyway.  The documents
themselves are shared: streams that tick while nothing changed since one
was made send that one, the server's C{latest_status} (its top is
L{jesync.http.status}'s, which bounds its own cost at 1,000,000 keys).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, List, Optional

from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from jesync.http.api import STREAMING, ApiContext, Call, Held, Reply, Route, encode_json, grant_document, invalid, route
from jesync.http.state import StatusSignature
from jesync.http.status import status_document
from jesync.interfaces import LockEvent
from jesync.wire import election_key

log = Logger()

ROUTES: List[Route] = []

#: Seconds between two C{: ping} comments.
PING_INTERVAL = 15.0
#: The status stream's least interval between two documents, in seconds.
STATUS_INTERVAL = 0.5

PING = b": ping\n\n"
STREAM_HEADERS = {
    b"content-type": b"text/event-stream",
    b"cache-control": b"no-cache",
    b"x-accel-buffering": b"no",
}


def event_frame(name: str, document: Any) -> bytes:
    """One event: its name, and its data as JSON on one line."""
    return b"event: " + name.encode("ascii") + b"\ndata: " + encode_json(document) + b"\n\n"


@implementer(IPushProducer)
class EventStream(Held):
    """
    One call's event stream (the module's rules).  C{on_end}: told once,
    when the stream ends however it ends (what it watched is withdrawn
    there).
    """

    def __init__(self, call: Call) -> None:
        self.call = call
        self.request = call.request
        self.clock = call.context.clock
        self.max_unsent = call.context.policy.max_unsent
        self.ended = False
        self.paused = False
        #: Bytes kept while paused, and their frames.
        self.behind = 0
        self._kept: Deque[bytes] = deque()
        self._on_end: List[Callable[[], object]] = []
        self._pings: Optional[LoopingCall] = None
        self._drop_call: Optional[IDelayedCall] = None

    def on_end(self, what: Callable[[], object]) -> None:
        self._on_end.append(what)

    def start(self) -> None:
        """Send the headers; from now on the call is this stream's (stopped with the server)."""
        request = self.request
        request.setResponseCode(200)
        for name, value in STREAM_HEADERS.items():
            request.setHeader(name, value)
        request.registerProducer(self, True)
        self.call.hold(self)
        request.write(b"")
        self._pings = LoopingCall(self._ping)
        self._pings.clock = self.clock
        self._pings.start(PING_INTERVAL, now=False)

    def send(self, name: str, document: Any) -> None:
        """Send one event (kept while the client does not read; past C{max_unsent}, the stream is dropped)."""
        self._send(event_frame(name, document))

    def _ping(self) -> None:
        if not self.paused:
            self._send(PING)

    def _send(self, frame: bytes) -> None:
        if self.ended or self._drop_call is not None:
            return
        if not self.paused:
            self.request.write(frame)
            return
        self._kept.append(frame)
        self.behind += len(frame)
        if self.behind > self.max_unsent:
            self._kept.clear()
            self._drop_call = self.clock.callLater(0, self._drop)

    def _drop(self) -> None:
        """The client fell more than C{max_unsent} behind: abort its connection."""
        self._drop_call = None
        self._end()
        if self.call.gone:
            return
        log.info(
            "dropped an event stream of {peer}: its client is not reading (past {limit} bytes behind)",
            peer=self.call.peer,
            limit=self.max_unsent,
        )
        self.request.transport.abortConnection()

    def stop(self, why: str) -> None:
        """The stream ends: a last C{event: end} C{{"reason": why}} (unless its client has gone), and its end."""
        if self.ended:
            return
        kept, self._kept = self._kept, deque()
        self._end()
        if self.call.gone or self._drop_call is not None:
            return  # (a stream being dropped is aborted on this turn's end)
        request = self.request
        for frame in kept:
            request.write(frame)
        request.write(event_frame("end", {"reason": why}))
        request.unregisterProducer()
        request.finish()

    def _end(self) -> None:
        self.ended = True
        self.behind = 0
        if self._pings is not None and self._pings.running:
            self._pings.stop()
        for what in self._on_end:
            what()
        self._on_end = []

    # -- IPushProducer: the transport's buffer is full, or has drained --------

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        """Write what was kept, while the transport takes it without pausing again."""
        self.paused = False
        while self._kept and not self.paused and not self.ended:
            frame = self._kept.popleft()
            self.behind -= len(frame)
            self.request.write(frame)

    def stopProducing(self) -> None:
        if not self.ended:
            self._end()


def _head(call: Call) -> Optional[Reply]:
    """A HEAD of a stream: its headers only, nothing started."""
    if call.request.method == b"HEAD":
        return Reply(body=b"", content_type="text/event-stream")
    return None


# -- watches -----------------------------------------------------------------------


@route(ROUTES, "GET", "/v1/watch")
def watch(call: Call) -> Any:
    key = call.query("key")
    prefix = call.query("prefix")
    if (key is None) == (prefix is None):
        raise invalid("key", "give either key or prefix")
    if key is not None:
        watched = call.key("key", key)
    else:
        assert prefix is not None
        if not prefix:
            raise invalid("prefix", "cannot be empty (every key of the table is no watch: give a prefix)")
        watched = call.key("prefix", prefix)
    head = _head(call)
    if head is not None:
        return head
    locks = call.context.locks
    clock = call.context.clock
    stream = EventStream(call)

    def tell(event: LockEvent) -> None:
        holder = None if event.grant is None else grant_document(event.grant, clock.seconds())
        stream.send(event.kind, {"key": event.key, "holder": holder})

    is_prefix = key is None
    locks.watch(stream, watched, tell, prefix=is_prefix)
    stream.on_end(lambda: locks.unwatch(stream, watched, prefix=is_prefix))
    stream.start()
    if not is_prefix:
        now = clock.seconds()
        stream.send("snapshot", {"key": watched, "holders": [grant_document(g, now) for g in locks.holders(watched)]})
    return STREAMING


# -- elections ---------------------------------------------------------------------


class LeaderObserver:
    """One observe stream: tells C{leader} when the election's first holder changes, or proclaims."""

    def __init__(self, stream: EventStream, context: ApiContext, election: str) -> None:
        self.stream = stream
        self.context = context
        self.election = election
        self.key = election_key(election)
        self.leader: Any = None

    def changed(self, event: LockEvent) -> None:
        holders = self.context.locks.holders(self.key)
        if (holders[0] if holders else None) is not self.leader:
            self.tell()

    def tell(self) -> None:
        holders = self.context.locks.holders(self.key)
        self.leader = holders[0] if holders else None
        leader = None if self.leader is None else grant_document(self.leader, self.context.clock.seconds())
        self.stream.send("leader", {"election": self.election, "leader": leader})


def proclaimed(context: ApiContext, election: str) -> None:
    """The leader of C{election} has a new value: its observers are told (the module's rules)."""
    context.leader_observers.tell(election)


@route(ROUTES, "GET", "/v1/elections/{name}/observe")
def observe(call: Call) -> Any:
    election = call.params["name"]
    key = call.key("name", election_key(election))
    head = _head(call)
    if head is not None:
        return head
    context = call.context
    stream = EventStream(call)
    observer = LeaderObserver(stream, context, election)
    context.locks.watch(stream, key, observer.changed)
    context.leader_observers.add(election, observer)

    def forget() -> None:
        context.locks.unwatch(stream, key)
        context.leader_observers.remove(election, observer)

    stream.on_end(forget)
    stream.start()
    observer.tell()
    return STREAMING


# -- the status ---------------------------------------------------------------------


def status_signature(context: ApiContext) -> StatusSignature:
    """What the status document counts, at a glance: if this did not change, neither did the document."""
    sessions = context.sessions
    return (context.locks.version, len(sessions), sessions.detached_count(), len(context.policy.connections))


class StatusFeed:
    """One status stream: a document at once, then one each 0.5 s tick that finds something changed."""

    def __init__(self, stream: EventStream, context: ApiContext) -> None:
        self.stream = stream
        self.context = context
        self.sent: Optional[StatusSignature] = None
        self.ticks = LoopingCall(self.tick)
        self.ticks.clock = context.clock

    def start(self) -> None:
        self.send(fresh=True)
        self.ticks.start(STATUS_INTERVAL, now=False)

    def stop(self) -> None:
        if self.ticks.running:
            self.ticks.stop()

    def tick(self) -> None:
        if status_signature(self.context) != self.sent:
            self.send(fresh=False)

    def send(self, fresh: bool) -> None:
        signature = status_signature(self.context)
        latest = self.context.latest_status
        if fresh or latest is None or latest[0] != signature:
            latest = self.context.latest_status = (signature, status_document(self.context))
        self.sent = signature
        self.stream.send("status", latest[1])


@route(ROUTES, "GET", "/v1/status/stream")
def status_stream(call: Call) -> Any:
    head = _head(call)
    if head is not None:
        return head
    stream = EventStream(call)
    feed = StatusFeed(stream, call.context)
    stream.on_end(feed.stop)
    stream.start()
    feed.start()
    return STREAMING
