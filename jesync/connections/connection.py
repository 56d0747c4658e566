"""
One client connection, whatever protocol it speaks: framing in, grammar in
the middle, output out, and the rules every protocol shares.

A L{LockConnection} is the Twisted protocol of every listener.  Its factory
names a grammar (a L{jesync.connections.grammar.Grammar}: one module of
L{jesync.protocols}), which names its framing.  What the connection needs of
a grammar is declared here (L{ConnectionGrammar}); the grammars know the
connection, this module does not know them.  Bytes read go to the
framing; each frame goes to the grammar, which parses it, calls the lock
service and writes its reply through the connection.  Everything else is
decided here, once:

 - B{Lifecycle} (L{jesync.connections.lifecycle}): admission (protected
   mode, then max-connections), authentication and its timeout, the idle
   timeout, half-close, closing and giving back what the connection held.
 - B{Waits.}  A reply that comes later (a lock that waits) is handed to
   L{LockConnection.await_reply}.  When the peer sends FIN, or the
   connection closes, every such wait is cancelled at once, so nothing is
   ever granted to a connection that may be gone: after a FIN the grammar
   answers it with its not-granted reply; once closing, nothing is sent.
   After the FIN no request waits (L{LockConnection.may_wait}): it is
   granted at once or not at all.  A closing connection whose client takes
   none of its last replies within the policy's C{close_grace} is dropped.
 - B{Order.}  An I{ordered} grammar (elock, dlock) answers in request
   order: while one of its replies is owed, later requests stay in the
   framing's buffer (reading from the socket pauses once C{HOLD_BUFFER}
   bytes are buffered there).  An unordered one (JESync) answers a wait
   whenever it ends and reads on meanwhile.
 - B{Output.}  Replies are written in the order they are made.  A large
   reply (a listing) is a snapshot taken at once and sent as a stream of
   pieces (L{LockConnection.write_stream}), a bounded amount per reactor
   turn and only while the transport takes them, so it can neither pass
   C{max_unsent} nor hold up other clients; requests read meanwhile wait
   until it has gone out, so one connection has at most one snapshot.
   What a stream holds (a snapshot shared with other connections, bytes
   charged to the server-wide C{--max-listing-memory}:
   L{jesync.connections.listings}) is given back when its last piece has
   been written, or when the connection is dropped or closed before that.
 - B{Slow readers.}  The connection is the producer of its own replies.
   When the transport's buffer passes its high-water mark (64 KiB; TLS's
   too) it pauses the connection: reading stops.  A reply written after the
   transport has been paused for a whole reactor turn counts toward
   C{max_unsent}; past it, the client is disconnected.  What one reactor
   turn writes is never counted, however much it is: a client that reads as
   fast as it can is never cut off.  Events (L{LockConnection.write_event}:
   lines a watcher did not ask for, written while the lock table changes)
   count from the moment the transport pauses the connection (one change
   is written to every watcher of its key, so a turn's burst of them is
   not bounded by what the watcher asked), and never close the connection
   inside that change: past C{max_unsent}, a watcher is sent nothing more
   and is dropped on the next reactor turn, whatever it reads meanwhile (an
   event it missed is never passed over in silence).
 - B{A paused connection's peer.}  While reading is paused (either way
   above), the reactor does not watch the socket for input, which is how
   it learns of a FIN, an RST or a failed keepalive; so the connection asks
   the socket itself every second (L{jesync.connections.hangup}):
   a peer gone is dropped; at a FIN its waits end, not granted, and the
   requests still unread before the FIN are read and answered (under TLS,
   a FIN closes the connection).
"""

from __future__ import annotations

import typing
from collections import deque
from typing import TYPE_CHECKING, Callable, ClassVar, Deque, Dict, Iterator, Optional, Union

from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IHalfCloseableProtocol, IPushProducer, ISSLTransport
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from jesync.connections import hangup, lifecycle
from jesync.connections.lifecycle import ANSWERING, AUTHENTICATING, CLOSED, CLOSING, HALF_CLOSED, READING, READY
from jesync.connections.listings import Held
from jesync.connections.policy import ConnectionPolicy, describe_peer, is_local, socket_of, tune_tcp
from jesync.errors import LimitReached, ProtectedMode
from jesync.interfaces import ILockService

if TYPE_CHECKING:
    from jesync.connections.framing import Framing
    from jesync.connections.policy import IStreamTransport

# Bytes buffered behind held requests before reading from the socket pauses.
HOLD_BUFFER = 65536
# Bytes of a stream written per reactor turn, at most.
STREAM_TURN = 65536
# A reply up to this long is sent straight to the socket when nothing is
# queued ahead of it (larger ones, listings, go through the transport, whose
# buffer pauses the connection as it should).
DIRECT_WRITE = 4096


class _Stream:
    """A large reply queued: its pieces, and what it holds until they have gone out."""

    __slots__ = ("pieces", "held")

    def __init__(self, pieces: Iterator[bytes], held: Optional[Held]) -> None:
        self.pieces = pieces
        self.held = held

    def release(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            held.release()


_Output = Union[bytes, _Stream]


class ConnectionGrammar(typing.Protocol):
    """
    What a connection needs of its grammar (L{jesync.connections.grammar.Grammar}
    is the base of those that provide it): its framing, its timing, and the
    replies the connection sends on its behalf.
    """

    ordered: ClassVar[bool]
    idle_while_busy: ClassVar[bool]
    max_frame: int
    idle_timeout: Optional[float]
    log: Logger

    @property
    def framing(self) -> type[Framing]:
        """How frames are cut: a class taking (deliver, too_long, max_frame)."""

    def frame_received(self, frame: bytes) -> None:
        """One request: parse it, carry it out, reply."""

    def refusal(self, error: LimitReached) -> bytes:
        """The reply to a request (or a connection) over a limit, terminated."""

    def auth_refused(self) -> bytes:
        """The last reply to a connection that did not authenticate."""

    def frame_too_long(self) -> bytes:
        """The last reply to a connection that sent a frame over C{max_frame}."""

    def holds_nothing(self) -> bool:
        """Whether the connection holds no lock (for the idle timeout)."""

    def closing(self) -> None:
        """The connection is closing (its waits are already cancelled): give back what it holds."""


@implementer(IHalfCloseableProtocol, IPushProducer)
class LockConnection(Protocol):
    """
    One client connection: an owner in the lock service (or, for elock, the
    voice of a session that is).

    @ivar peer: the remote end, for logs and listings (C{host:port}).
    @ivar state: its lifecycle state (L{jesync.connections.lifecycle}).
    """

    transport: IStreamTransport
    state = lifecycle.ACCEPTED
    peer = "?"
    authenticated = False
    #: The generation of the token it authenticated with (L{ConnectionPolicy.generation_of}).
    auth_generation = 0

    def __init__(self, factory: LockServerFactory) -> None:
        self.factory = factory
        self.service: ILockService = factory.service
        self.policy: ConnectionPolicy = factory.policy
        self.clock = factory.service.clock
        self.verbose: bool = factory.verbose
        self.grammar: ConnectionGrammar = factory.grammar(self)
        self._watch_idle = self.grammar.idle_timeout is not None
        self.framing = self.grammar.framing(self.grammar.frame_received, self._frame_too_long, self.grammar.max_frame)
        # Replies owed (waits, in the order they were asked for): whether
        # each waits for durable state (then it is answered after a FIN).
        self._pending: Dict[Deferred, bool] = {}
        # Cluster mode: whether this member may still answer (policy.serving).
        self._serving = self.policy.serving
        self._output: Optional[Deque[_Output]] = None
        self._pump_call: Optional[IDelayedCall] = None
        self._read_call: Optional[IDelayedCall] = None
        # An event took it past max_unsent: its drop, on the next turn.
        self._drop_call: Optional[IDelayedCall] = None
        self._timer: Optional[IDelayedCall] = None
        # While reading is paused: the next look at whether the peer is gone.
        self._peer_call: Optional[IDelayedCall] = None
        self._last_heard = 0.0
        # The transport asked us to stop producing (its buffer is full) ...
        self._paused = False
        # ... for at least a whole reactor turn; and reply bytes written since.
        self._paused_long = False
        self.behind = 0
        self._reading_paused = False
        # A check of the paused socket saw the peer's FIN, which the reactor
        # has not read up to yet: no request waits any more.
        self._input_ending = False
        self._admitted = False
        # The plain TCP or UNIX transport whose socket replies may be sent to
        # at once (None: TLS, or not a socket transport).
        self._direct: Optional[tcp.Connection] = None

    @property
    def log(self) -> Logger:
        """The grammar's logger (made when something is logged: a connection keeps none)."""
        return type(self.grammar).log

    @property
    def paused(self) -> bool:
        """Whether the transport has asked for no more replies for now (its buffer is full)."""
        return self._paused

    @property
    def reading_paused(self) -> bool:
        """Whether reading from the socket has stopped (the client does not take its replies, or too much is held)."""
        return self._reading_paused

    def __repr__(self) -> str:
        return f"<{type(self.grammar).__name__} connection from {self.peer}>"

    # -- the lifecycle -----------------------------------------------------

    def connectionMade(self) -> None:
        address = self.transport.getPeer()
        self.peer = describe_peer(address)
        refusal: Optional[LimitReached] = None
        if self.policy.protected and not is_local(address):
            refusal = ProtectedMode()
        elif not self.policy.connections.admit(self):
            refusal = LimitReached("max-connections", self.policy.connections.limit or 0)
        if refusal is not None:
            self.log.info("{peer} refused: {limit}", peer=self.peer, limit=refusal.limit)
            self._feed("refuse")
            self._send_last(self.grammar.refusal(refusal))
            self._finish_closing()
            return
        self._admitted = True
        self.factory.clients += 1
        tune_tcp(self.transport, self.policy.keepalive)
        self.transport.registerProducer(self, True)
        if isinstance(self.transport, tcp.Connection):
            self._direct = self.transport
        self.log.info("{peer} connected", peer=self.peer)
        self._feed("admit" if self.policy.auth_token is None else "admit_with_auth")

    def entered(self, state: str, previous: str) -> None:
        """The lifecycle entered C{state}: do what that means."""
        if state == AUTHENTICATING:
            if self.policy.auth_timeout is not None:
                self._timer = self.clock.callLater(self.policy.auth_timeout, self._auth_timed_out)
        elif state == READY:
            self.authenticated = True
            self._cancel_timer()
            if self.grammar.idle_timeout is not None:
                self._last_heard = self.clock.seconds()
                self._timer = self.clock.callLater(self.grammar.idle_timeout, self._idle_check)
        elif state == HALF_CLOSED:
            self._end_waits(answer_durable=True)
            self._close_if_answered()
        elif state == CLOSING:
            self._give_back()
            # However it closes, a client that does not take its last
            # replies is not waited for beyond the grace period.
            self._timer = self.clock.callLater(self.policy.close_grace, self._close_overdue)
        elif state == CLOSED:
            if previous != CLOSING:
                self._give_back()
            self._cancel_calls()
            self._discard_output()

    def _feed(self, event: str) -> bool:
        return lifecycle.feed(self, event)

    def _give_back(self) -> None:
        """Stop reading, end the waits without a reply, and give back what this connection holds."""
        self.framing.stop()
        self._cancel_timer()
        self._end_waits()
        if self._admitted:
            self.grammar.closing()

    def readConnectionLost(self) -> None:
        """The peer sent FIN: answer what it sent (its waits: not granted), then close."""
        if self._feed("input_ended") and self.state == CLOSING:
            self._finish_closing()  # it had not authenticated: nothing is owed

    def writeConnectionLost(self) -> None:
        """Never asked for: the server closes both directions at once."""

    def connectionLost(self, reason: Optional[Failure] = None) -> None:
        if not self._feed("lost") or not self._admitted:
            return
        self.policy.connections.remove(self)
        self.factory.clients -= 1
        self.log.info("{peer} disconnected", peer=self.peer)

    def close(self, last: bytes = b"") -> None:
        """
        Close: send C{last} after the replies already owed, give back what
        this connection holds now, and close once those replies are sent.
        """
        if self._feed("close"):
            self._send_last(last)
            self._finish_closing()

    def _send_last(self, data: bytes) -> None:
        """The last reply, after those owed (closing: nothing else is sent)."""
        serving = self._serving
        if not data or (serving is not None and not serving()):
            return
        if self.verbose:
            self.log.debug("{peer} answered {line!r}", peer=self.peer, line=data.rstrip(b"\r\n"))
        if self._output is not None:
            self._output.append(data)
        else:
            self.transport.write(data)

    def _finish_closing(self) -> None:
        """Close the transport once the output queue has drained (L{_pump} comes back when it has)."""
        if self._output is None and self.state != CLOSED and not self.transport.disconnecting:
            # A transport does not close while a producer is registered (TLS
            # never starts its shutdown, TCP waits again if it had paused us).
            if self._admitted:
                self.transport.unregisterProducer()
            self.transport.loseConnection()

    def _close_if_answered(self) -> None:
        """After a FIN: close once nothing is owed (no wait, no stream, no request held back)."""
        if (
            self.state == HALF_CLOSED
            and not self._pending
            and self._output is None
            and self._read_call is None
            and not self.framing.paused
        ):
            self._feed("answered")
            self._finish_closing()

    def _close_overdue(self) -> None:
        self._timer = None
        if self.state == CLOSING:
            self.drop("did not take its last replies")

    @property
    def may_wait(self) -> bool:
        """
        Whether a request may wait for a lock: not once the client has sent
        FIN (a wait would only be ended at once, not granted).
        """
        return (self.state == READY or self.state == AUTHENTICATING) and not self._input_ending

    def drop(self, why: str) -> None:
        """Disconnect at once, without flushing: the client is not reading."""
        self.log.info("{peer} dropped: {why}", peer=self.peer, why=why)
        self._feed("close")
        self._discard_output()
        self.transport.abortConnection()

    # -- authentication and timers -------------------------------------------

    def authenticate(self, token: Optional[bytes]) -> bool:
        """
        C{auth <token>}: compared in constant time (L{ConnectionPolicy.accepts}).
        True if right (or if the server has no token); False closes the
        connection with the grammar's refusal.
        """
        generation = self.policy.generation_of(token, self.clock.seconds())
        if generation is not None:
            self.auth_generation = generation
            self._feed("authenticated")
            return True
        self.refuse_unauthenticated()
        return False

    def refuse_unauthenticated(self) -> None:
        self.log.info("{peer} failed to authenticate", peer=self.peer)
        self.close(self.grammar.auth_refused())

    def token_rotated_out(self) -> None:
        """The token it authenticated with was rotated out, and its grace period is over: close."""
        if self.state not in READING:
            return  # (closing already)
        self.log.info("{peer} closed: the token it authenticated with was rotated out", peer=self.peer)
        self.close(self.grammar.auth_refused())

    def _auth_timed_out(self) -> None:
        self._timer = None
        if self.state == AUTHENTICATING and not getattr(self.transport, "_handshakeDone", True):
            # A TLS handshake never completed: a refusal would only wait in
            # the TLS layer's buffer (and the close for the close grace).
            self.drop("did not complete its TLS handshake in time")
            return
        if self.state == AUTHENTICATING:
            self.log.info("{peer} did not authenticate in time", peer=self.peer)
            self.close(self.grammar.refusal(LimitReached("auth-timeout", self.policy.auth_timeout or 0)))

    def _idle_check(self) -> None:
        self._timer = None
        timeout = self.grammar.idle_timeout
        assert timeout is not None
        if self.state not in (READY, HALF_CLOSED):
            return
        quiet = self.clock.seconds() - self._last_heard
        busy = self._pending or self._output is not None or not self.grammar.holds_nothing()
        if quiet >= timeout and (self.grammar.idle_while_busy or not busy):
            self.log.info("{peer} closed: idle", peer=self.peer)
            self.close(self.grammar.refusal(LimitReached("idle-timeout", timeout)))
            return
        self._timer = self.clock.callLater(max(timeout - quiet, 0) or timeout, self._idle_check)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _cancel_calls(self) -> None:
        self._cancel_timer()
        for call in (self._pump_call, self._read_call, self._peer_call, self._drop_call):
            if call is not None and call.active():
                call.cancel()
        self._pump_call = self._read_call = self._peer_call = self._drop_call = None

    # -- input -------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._watch_idle:
            # (bytes, not requests: a request held behind a wait, or one
            # still arriving, is not silence)
            self._last_heard = self.clock.seconds()
        self.framing.dataReceived(data)
        if self.framing.paused:
            self._update_reading()

    def _frame_too_long(self) -> None:
        self.close(self.grammar.frame_too_long())

    def _update_hold(self, now: bool = False) -> None:
        """
        Hold requests back while the client does not take its replies, a
        stream goes out, or an ordered grammar owes a reply; once none of
        these holds, answer the requests held back (C{now}, or on the next
        reactor turn: this may run inside another connection's request).
        """
        if self.state not in READING:
            return
        hold = self._paused or self._output is not None or (self.grammar.ordered and bool(self._pending))
        if hold:
            self.framing.paused = True
        elif self.framing.paused:
            self.framing.paused = False
            self._update_reading()
            if now:
                self._read_held()
            elif self._read_call is None:
                self._read_call = self.clock.callLater(0, self._read_held)

    def _read_held(self) -> None:
        """Answer the requests that arrived while held; read from the socket again."""
        if self._read_call is not None:
            if self._read_call.active():
                self._read_call.cancel()
            self._read_call = None
        if self.state not in READING or self.framing.paused:
            return
        self.framing.dataReceived(b"")
        self._update_reading()
        self._close_if_answered()

    def _update_reading(self) -> None:
        """Read from the socket unless the client is not taking its replies or too much is held back."""
        stop = self._paused or (self.framing.paused and self.framing.buffered() > HOLD_BUFFER)
        if stop != self._reading_paused and self.state in READING:
            self._reading_paused = stop
            if stop:
                self.transport.pauseProducing()
                if self._peer_call is None:
                    self._peer_call = self.clock.callLater(hangup.PEER_CHECK, self._check_peer)
            else:
                self.transport.resumeProducing()
                if self._peer_call is not None:
                    if self._peer_call.active():
                        self._peer_call.cancel()
                    self._peer_call = None

    def _check_peer(self) -> None:
        """
        Reading is paused, so the reactor no longer reports a FIN, an RST or
        a failed keepalive: ask the socket (L{jesync.connections.hangup}).
        Gone: dropped, as if the reactor had seen it.  FIN: its waits end,
        not granted, and none waits from now on, but it is not half-closed
        yet: the requests it sent before the FIN may still be unread in the
        kernel, and each is answered once read; L{readConnectionLost} comes
        when the reactor reads up to the FIN.  Under TLS, which cannot
        half-close, what a FIN does there: the connection is dropped.
        """
        self._peer_call = None
        if self.state not in READING or not self._reading_paused:
            return
        found = hangup.peer_state(socket_of(self.transport))
        if found == hangup.GONE or (found == hangup.INPUT_ENDED and ISSLTransport.providedBy(self.transport)):
            self.drop("its peer is gone")
            return
        if found == hangup.INPUT_ENDED and not self._input_ending:
            # Requests sent before the FIN may still be unread in the
            # kernel: end the waits (not granted), let no request wait from
            # now on, and read on; the FIN itself (half-closed, then closed
            # once all is answered) comes when the reactor reads up to it.
            # What is left to read is bounded: the peer sends no more.
            self._input_ending = True
            self._end_waits(answer_durable=True)
        if self.state in READING and self._reading_paused and self._peer_call is None:
            self._peer_call = self.clock.callLater(hangup.PEER_CHECK, self._check_peer)

    # -- replies that come later ------------------------------------------------

    def await_reply(self, reply: Deferred, durable: bool = False) -> None:
        """
        C{reply} (a wait, with the grammar's callbacks on it) will be
        answered later: cancel it if the connection's input ends or it
        closes first; for an ordered grammar, read no further request until
        it has fired.  After a FIN it is cancelled at once.  A C{durable}
        one (a reply waiting for durable state, L{write_durable}) is
        cancelled only when the connection closes: a FIN is answered.
        """
        if reply.called:
            return
        if not durable and not self.may_wait:
            reply.cancel()
            return
        self._pending[reply] = durable
        reply.addBoth(self._answered, reply)
        if self.grammar.ordered:
            self._update_hold()

    def _answered(self, result: object, reply: Deferred) -> object:
        self._pending.pop(reply, None)
        if self.grammar.ordered:
            self._update_hold()
        if self.state == HALF_CLOSED:
            self._close_if_answered()
        return result

    def _end_waits(self, answer_durable: bool = False) -> None:
        # (a cancelled wait's reply may start another: end that one too)
        while True:
            ending = [reply for reply, durable in self._pending.items() if not (answer_durable and durable)]
            if not ending:
                return
            for reply in ending:
                del self._pending[reply]
                reply.cancel()

    # -- output ---------------------------------------------------------------

    def write_durable(self, data: bytes) -> None:
        """
        Send C{data} once everything the lock table changed so far that
        must outlive this server is durable (cluster mode: in etcd), as an
        owed reply; at once in single-process mode.
        """
        durability = self.policy.durability
        if durability is None or self.state not in ANSWERING:
            self.write(data)
            return
        waiting = durability.durable()
        if waiting is None:
            self.write(data)
            return
        waiting.addCallbacks(lambda _: self.write(data), lambda _: None)
        self.await_reply(waiting, durable=True)

    def write(self, data: bytes) -> None:
        """Send C{data}, after anything already queued; nothing once the connection is closed."""
        if self.state not in ANSWERING:
            return
        serving = self._serving
        if serving is not None and not serving():
            return  # a deposed cluster member says nothing more
        if self._output is not None:
            self._output.append(data)
            return
        direct = self._direct
        if (
            direct is not None
            and len(data) <= DIRECT_WRITE
            and not direct._tempDataBuffer
            and direct.offset == len(direct.dataBuffer)
            and not direct.TLS
            and not self._paused
            # (an aborted transport drops what it has not sent: so must we)
            and not direct._aborting
        ):
            # Nothing is queued ahead of it: send it now, as Redis does,
            # rather than in a write event on the next reactor turn (two
            # epoll_ctl calls and an event per reply).  What the socket does
            # not take goes through the transport, in order.
            try:
                sent = direct.socket.send(data)
            except OSError:  # EAGAIN; or a dead connection, which the transport will report
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self.transport.write(data)
        if self._paused_long:
            self._count_behind(len(data))

    def write_event(self, data: bytes) -> None:
        """
        Send C{data}, a line nobody asked for (a watch's event), after
        anything already queued.  It is written while the lock table
        changes, so it never closes the connection there and then: bytes
        written while the transport has paused the connection count toward
        C{max_unsent}, and past it the connection is sent nothing more and
        is dropped on the next reactor turn.
        """
        if self._drop_call is not None:
            return  # (past max_unsent: it is dropped on the next turn)
        if not self._paused:
            self.write(data)
            return
        if self.state not in ANSWERING:
            return
        serving = self._serving
        if serving is not None and not serving():
            return
        if self._output is not None:
            self._output.append(data)
        else:
            self.transport.write(data)
        self.behind += len(data)
        if self.behind > self.policy.max_unsent:
            self._drop_call = self.clock.callLater(0, self._drop_behind)

    def _drop_behind(self) -> None:
        self._drop_call = None
        if self.state in ANSWERING:
            self.drop(f"not reading its events (past {self.policy.max_unsent} bytes behind)")

    def write_stream(self, pieces: Iterator[bytes], held: Optional[Held] = None) -> None:
        """
        Send a large reply, piece by piece, as the transport takes them;
        C{held} (a snapshot it is made from, bytes charged for it) is
        released once its last piece is written, or the connection closes
        first.
        """
        stream = _Stream(pieces, held)
        if self.state not in ANSWERING:
            stream.release()
            return
        if self._output is None:
            self._output = deque()
        self._output.append(stream)
        self._update_hold()
        if not self._paused:
            self._pump()

    def _pump(self) -> None:
        """Write queued output, a turn's worth at most, while the transport takes it."""
        self._pump_call = None
        output = self._output
        if output is None:
            return
        transport = self.transport
        written = 0
        serving = self._serving
        if serving is not None and not serving():
            return
        while output and not self._paused and written < STREAM_TURN:
            item = output[0]
            piece: Optional[bytes]
            if isinstance(item, bytes):
                output.popleft()
                piece = item
            else:
                piece = next(item.pieces, None)
                if piece is None:
                    output.popleft()
                    item.release()
                    continue
            transport.write(piece)
            written += len(piece)
        if output:
            if not self._paused:
                self._pump_call = self.clock.callLater(0, self._pump)
            return
        self._output = None
        if self.state in READING:
            self._update_hold()
            self._close_if_answered()
        elif self.state == CLOSING:
            self._finish_closing()

    def _discard_output(self) -> None:
        """Nothing more will be sent: forget the output queued, giving back what its streams hold."""
        output, self._output = self._output, None
        if output:
            for item in output:
                if isinstance(item, _Stream):
                    item.release()

    def _count_behind(self, size: int) -> None:
        self.behind += size
        if self.behind > self.policy.max_unsent and self.state in ANSWERING:
            self.drop(f"not reading its replies ({self.behind} bytes behind)")

    # -- IPushProducer: the transport's buffer is full, or has drained ------

    def pauseProducing(self) -> None:
        """The client is not taking its replies: stop reading its requests."""
        if self._paused:
            return
        self._paused = True
        self.behind = 0
        self._update_hold()
        self._update_reading()
        self.clock.callLater(0, self._pause_lasted)

    def _pause_lasted(self) -> None:
        if self._paused:
            self._paused_long = True

    def resumeProducing(self) -> None:
        self._paused = self._paused_long = False
        self.behind = 0
        if self.state == CLOSED:
            return
        if self._output is not None and self._pump_call is None:
            self._pump()
        self._update_hold(now=True)
        self._update_reading()

    def stopProducing(self) -> None:
        """The transport is going away; connectionLost follows."""


class LockServerFactory(Factory):
    """
    Serves one wire protocol (its grammar) over a lock service, shared with
    any other protocol; listen on it with any stream endpoint.

    @param service: the lock table.
    @param verbose: log every request and reply at debug level.
    @param policy: limits, timeouts, keepalive and authentication (shared by
        every factory of one server, so max-connections counts them all).
    """

    noisy = False
    protocol = LockConnection
    grammar: Callable[[LockConnection], ConnectionGrammar]

    def __init__(
        self, service: ILockService, verbose: bool = False, policy: Optional[ConnectionPolicy] = None
    ) -> None:
        self.service = service
        self.verbose = verbose
        self.policy = policy if policy is not None else ConnectionPolicy()
        # Connections of this factory admitted and not yet gone.
        self.clients = 0

    def buildProtocol(self, addr: object) -> LockConnection:
        return LockConnection(self)
