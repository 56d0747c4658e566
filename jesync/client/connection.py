"""
What the three JESync clients' connections share, whatever their I/O: a
L{Session}, the lines read into it, and the two clocks that can end a
connection the server has not closed.

 - Silence: while the server owes a reply, it may stay silent at most
   C{read_timeout} seconds (counted from the last data read, or from the
   request that made it owe one when it owed nothing); then the connection
   is given up for dead, with C{"no reply within <read_timeout> s"}.  A lock
   that is waiting owes no reply (L{Session}'s pipeline), so this never cuts
   a wait short.
 - Deadlines: a held lock whose failsafe expiry runs out is lost, and a
   waiting lock's answer that is overdue ends the connection
   (L{Session.expire_overdue}); deadlines only change when replies arrive,
   so they are looked at again after each read.
 - Lost locks: their callbacks are user code, called once the session's
   state is settled (L{ConnectionCore.tell_lost}), never from inside it.

No I/O here.  An event-loop client (asyncio, Twisted) gives a C{schedule}
(its loop's "call this in so many seconds"), and the core keeps one timer
per clock, calling the client's C{fail} when one runs out; the blocking
client, whose reader thread waits in C{select}, gives none, and asks
L{ConnectionCore.wake_in} how long it may wait and L{ConnectionCore.silent}
whether the server has been silent too long.  Each client keeps only its
I/O: opening, sending, reading and closing its socket or transport.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from jesync.client.handle import LockState
from jesync.client.session import MakeLock, Session
from jesync.client.wire import LineSplitter

#: Call C{function} in C{delay} seconds; returns what cancels that call (harmless once called).
Schedule = Callable[[float, Callable[[], None]], Callable[[], None]]


class ConnectionCore:
    """
    One connection's session, its reads and its clocks (see the module's
    documentation).  C{fail} is the client's own: it closes the transport,
    and it is called (by the timers of a C{schedule}) with the reason.
    """

    def __init__(
        self,
        address: str,
        send: Callable[[bytes], None],
        make_lock: MakeLock,
        clock: Callable[[], float],
        read_timeout: Optional[float],
        schedule: Optional[Schedule] = None,
        fail: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.session = Session(address, send, make_lock, clock, read_timeout)
        self.read_timeout = read_timeout
        self._clock = clock
        self._schedule = schedule
        self._fail = fail
        self._splitter = LineSplitter()
        self._quiet_since = clock()
        self._cancel_silence: Optional[Callable[[], None]] = None
        self._cancel_deadline: Optional[Callable[[], None]] = None

    @property
    def closed(self) -> bool:
        return self.session.closed

    @property
    def silence_reason(self) -> str:
        """Why a connection whose server stayed silent too long is closed."""
        return f"no reply within {self.read_timeout:g} s"

    # -- requests --------------------------------------------------------

    def start(self, operation: Callable[..., None], *args: Any) -> None:
        """
        Make a session request (C{operation(*args)}, its callbacks last in
        C{args}); if the server owed nothing before, its silence counts from now.
        """
        owed = self.session.pipeline.owes_reply
        operation(*args)
        if not owed:
            self._quiet_since = self._clock()
            self.watch_silence()

    # -- reading ---------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """
        Data read (plain text: after TLS): the session gets the lines it
        completes; the silence starts again.  May raise
        L{jesync.client.wire.UnexpectedReply}: then fail the connection.
        """
        self._quiet_since = self._clock()
        for line in self._splitter.feed(data):
            self.session.line_received(line)

    def received(self, data: bytes) -> None:
        """For an event-loop client: L{feed}, then the clocks again and the lost callbacks."""
        self.feed(data)
        self.watch_silence()
        self.watch_deadlines()
        self.tell_lost()

    # -- the clocks, with a schedule (event-loop clients) ------------------

    def watch_silence(self) -> None:
        """While the server owes a reply, give up on it after read_timeout seconds of silence."""
        self._stop_silence()
        if self._schedule is None:
            return
        if self.read_timeout is not None and self.session.pipeline.owes_reply and not self.closed:
            left = self._quiet_since + self.read_timeout - self._clock()
            self._cancel_silence = self._schedule(max(0.0, left), self._silent)

    def watch_deadlines(self) -> None:
        """Wake up when the earliest lock deadline passes."""
        self._stop_deadline()
        if self._schedule is None:
            return
        deadline = None if self.closed else self.session.next_deadline()
        if deadline is not None:
            self._cancel_deadline = self._schedule(max(0.0, deadline - self._clock()), self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._cancel_deadline = None
        overdue = self.session.expire_overdue()
        if overdue is not None:
            self._failed(overdue)
            return
        self.watch_deadlines()
        self.tell_lost()

    def _silent(self) -> None:
        self._cancel_silence = None
        self._failed(self.silence_reason)

    def _failed(self, reason: str) -> None:
        assert self._fail is not None, "a schedule needs the client's fail"
        self._fail(reason)

    def _stop_silence(self) -> None:
        cancel, self._cancel_silence = self._cancel_silence, None
        if cancel is not None:
            cancel()

    def _stop_deadline(self) -> None:
        cancel, self._cancel_deadline = self._cancel_deadline, None
        if cancel is not None:
            cancel()

    # -- the clocks, without a schedule (the blocking client's reader) ------

    def wake_in(self, tick: Optional[float]) -> Optional[float]:
        """
        How long a reader may wait for data: C{tick}, or less if a lock's
        deadline comes first.  (Deadlines are set by replies, which the
        reader reads, so a new one is always seen before its next wait.)
        """
        deadline = self.session.next_deadline()
        if deadline is None:
            return tick
        left = max(0.0, deadline - self._clock())
        return left if tick is None else min(tick, left)

    def silent(self) -> bool:
        """Whether the server has owed a reply for read_timeout seconds without saying anything."""
        if self.read_timeout is None:
            return False
        return self.session.pipeline.owes_reply and self._clock() - self._quiet_since >= self.read_timeout

    def expire_overdue(self) -> Optional[str]:
        """L{Session.expire_overdue}: the reason to close the connection, if any."""
        return self.session.expire_overdue()

    # -- lost locks and the end --------------------------------------------

    def take_lost(self) -> list[LockState]:
        """The locks lost since the last call (for a client that must call their callbacks elsewhere)."""
        return self.session.take_lost()

    def tell_lost(self) -> None:
        """Call the lost callbacks of the locks just lost."""
        for lock in self.session.take_lost():
            lock._notify_lost()

    def fail(self, reason: str, by_server: bool = False) -> None:
        """
        The connection is gone (C{by_server}: the server closed it, and what
        it said last may be the reason): the clocks stop, outstanding
        requests fail, held locks are lost (call L{tell_lost} once the
        transport is closed).
        """
        self._stop_silence()
        self._stop_deadline()
        if by_server:
            self.session.server_closed(reason)
        else:
            self.session.fail(reason)
