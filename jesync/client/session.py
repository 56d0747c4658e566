"""
One connection's state, shared by the three clients: the L{Pipeline} of its
requests and the locks held through it, with the rules that keep the two
consistent.

 - A lock is registered as held the moment its C{GRANTED} is read, so a
   connection that fails from then on loses it.
 - A connection holds a key at most once: asking for a key it holds raises
   L{KeyBusy}.
 - When the connection fails, every held lock is lost (before any
   outstanding request fails, so their callers already see the locks lost).
 - A renewal refused (C{TIMEOUT}: the grant had expired and another client
   took the key) loses the lock; a release answered C{NOT_RELEASED} (it had
   expired) or cut off by the connection returns False and leaves the handle
   lost.

No I/O and no threads here: the event-loop clients call it from their loop,
the blocking client under its connection's mutex.  Lost-lock callbacks are
user code, so they are not called from inside: L{Session.take_lost} hands
over the locks lost since it was last called, for the client to notify once
it is safe to.
"""

from __future__ import annotations

from typing import Callable

from jesync.client.errors import ConnectionLost, KeyBusy, LockLost, ServerError
from jesync.client.handle import LockState
from jesync.client.pipeline import OnError, OnResult, Pipeline
from jesync.client.wire import Reply
from jesync.errors import LockTimeout
from jesync.wire import ListingOrder

#: Builds a client's lock handle from its GRANTED reply, max_concurrent and expires.
MakeLock = Callable[[Reply, int, int], LockState]


class Session:
    def __init__(self, address: str, send: Callable[[bytes], None], make_lock: MakeLock) -> None:
        self.address = address
        self.pipeline = Pipeline(send, self._expired)
        self.held: dict[str, LockState] = {}
        self._make_lock = make_lock
        self._just_lost: list[LockState] = []

    @property
    def closed(self) -> bool:
        return self.pipeline.closed is not None

    # -- requests --------------------------------------------------------

    def lock(
        self,
        key: str,
        max_concurrent: int,
        timeout: int,
        expires: int,
        on_result: OnResult,
        on_error: OnError,
    ) -> None:
        """Ask for C{key}; C{on_result} gets the new lock handle."""
        if key in self.held:
            raise KeyBusy(key, "this client already holds it")

        def granted(reply: Reply) -> None:
            lock = self.held[key] = self._make_lock(reply, max_concurrent, expires)
            on_result(lock)

        self.pipeline.lock(key, max_concurrent, timeout, expires, granted, on_error)

    def give_up(self, key: str) -> None:
        """The caller of an unanswered C{lock} for C{key} stopped waiting: release it if granted."""
        self.pipeline.abandon(key)

    def release(self, lock: LockState, on_result: OnResult, on_error: OnError) -> None:
        """C{on_result} gets True if the lock was held until now, False if it had been lost."""
        if not lock._mark_released():
            on_result(False)
            return
        self.held.pop(lock.key, None)

        def answered(released: bool) -> None:
            if not released:
                lock._release_failed("it had expired before it was released")
            on_result(released)

        def failed(error: Exception) -> None:
            if isinstance(error, ConnectionLost):
                lock._release_failed(f"the connection dropped while releasing it ({error.reason})")
                on_result(False)
            else:
                on_error(error)

        self.pipeline.release(lock.key, answered, failed)

    def renew(self, lock: LockState, on_result: OnResult, on_error: OnError) -> None:
        """
        Send the lock's C{lock} again (with timeout 0, so it never waits);
        C{on_result} gets None, C{on_error} a L{LockLost}.
        """
        if not lock.held:
            on_error(lock.lost_reason or LockLost(lock.key, "it was released"))
            return

        def renewed(reply: Reply) -> None:
            if lock.held:
                lock._granted(reply.seconds_left)
            on_result(None)

        def refused(error: Exception) -> None:
            if isinstance(error, LockTimeout):
                self._lose(lock, "a renewal found it expired and taken by another client")
            elif isinstance(error, ServerError):
                self._lose(lock, f"a renewal was refused: {error}")
            on_error(lock.lost_reason or LockLost(lock.key, str(error)))

        try:
            self.pipeline.lock(lock.key, lock.max_concurrent, 0, lock.expires, renewed, refused)
        except ConnectionLost as error:
            on_error(lock.lost_reason or LockLost(lock.key, error.reason))

    def status(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        self.pipeline.status(key, on_result, on_error)

    def listing(self, order: ListingOrder, on_result: OnResult, on_error: OnError) -> None:
        self.pipeline.listing(order, on_result, on_error)

    # -- the connection --------------------------------------------------

    def line_received(self, line: bytes) -> None:
        """A reply line (may raise L{jesync.client.wire.UnexpectedReply}: then call L{fail})."""
        self.pipeline.line_received(line)

    def fail(self, reason: str) -> None:
        """The connection is gone: its locks are lost and its requests fail with L{ConnectionLost}."""
        if self.closed:
            return
        for lock in list(self.held.values()):
            self._lose(lock, f"the connection to {self.address} was lost ({reason})")
        self.pipeline.fail_all(ConnectionLost(self.address, reason))

    def take_lost(self) -> list[LockState]:
        """The locks lost since the last call, whose lost callbacks are still to be called."""
        lost, self._just_lost = self._just_lost, []
        return lost

    def _lose(self, lock: LockState, reason: str) -> None:
        if lock._lose(reason):
            self.held.pop(lock.key, None)
            self._just_lost.append(lock)

    def _expired(self, key: str) -> None:
        lock = self.held.get(key)
        if lock is not None:
            self._lose(lock, "the server's failsafe expiry released it")
