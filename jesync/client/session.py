"""
One connection's state, shared by the three clients: the L{Pipeline} of its
requests and the locks held through it, with the rules that keep the two
consistent.

 - A lock is registered as held the moment its C{GRANTED} (or
   C{GRANTED-MANY}) is read, so a connection that fails from then on loses it.
 - A connection holds a key at most once: asking for a key it holds (alone
   or in a C{lock_many}) raises L{KeyBusy}.
 - A C{lock_many} lock is one handle for all its keys: they are released,
   renewed (with C{lock-many}) and lost together.
 - When the connection fails, every held lock is lost (before any
   outstanding request fails, so their callers already see the locks lost).
 - A renewal refused (C{TIMEOUT}: the grant had expired and another client
   took the key) loses the lock (a C{lock_many} lock's keys are then all
   released); a release answered C{NOT_RELEASED} (it had
   expired) or cut off by the connection returns False and leaves the handle
   lost.
 - A lock keeps its mode: a shared lock is renewed with C{lock-shared}
   (asking the other mode would be refused: no upgrade or downgrade).  A
   renewal sends no value, so the server keeps the one granted.
 - The connection's watches are L{jesync.client.watch}'s: when it fails,
   every watch ends with its L{ConnectionLost}, after its locks are lost.

The server's last words: a server that closes a connection on its own says
why first, in one line (docs/protocols/index.md: protected mode, max-connections, auth,
auth-timeout, idle-timeout).  Whatever the order in which that line, the
client's first requests and the close cross on the wire, the client reports
that line, never a bare "closed" or "Broken pipe":

 - C{INVALID_PARAMETER: protected mode: ...}, whenever it arrives (even
   before anything was sent), fails the session with L{AccessRefused}.
 - C{INVALID_PARAMETER: auth failed} in answer to the handshake fails it
   with L{AuthFailed}; nothing else does.
 - Any other C{INVALID_PARAMETER: ...} line in answer to C{auth} (say
   C{max-connections exceeded}: a server refusing the connection answers
   whatever came first) fails the session with a L{ConnectionLost} whose
   reason is C{the server closed the connection: <its line>}; another error
   to C{auth} (C{INVALID_COMMAND}: a server without tokens) fails it with
   that L{ServerError}.
 - Any other error line that answers no request, or an C{INVALID_PARAMETER:
   ...} line that answered the handshake's C{fencing on} (which an older
   server without fencing refuses harmlessly, with C{INVALID_COMMAND}) and
   was the last line before the server closed (L{Session.server_closed}),
   becomes the reason of the L{ConnectionLost}, likewise.

No I/O and no threads here: the event-loop clients call it from their loop,
the blocking client under its connection's mutex.  Lost-lock callbacks are
user code, so they are not called from inside: L{Session.take_lost} hands
over the locks lost since it was last called, for the client to notify once
it is safe to.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Optional

import jesync.client.errors as errors
from jesync.client.errors import AccessRefused, AuthFailed, ConnectionLost, KeyBusy, ServerError
from jesync.client.handle import LockState
from jesync.client.pipeline import OnError, OnResult, Pipeline, discard
from jesync.client.watch import OnEnd, OnEvent, Subscription, Watches
from jesync.client.wire import ERROR_WORDS, SHARED, Reply, WatchEvent
from jesync.errors import LockTimeout
from jesync.wire import ListingOrder

#: How a server begins the line it sends before closing a connection on its
#: own (a limit's reply: docs/protocols/): an error reply that answered a request
#: is the closing reason only if it starts so.
CLOSING_REPLY = "INVALID_PARAMETER: "

#: How a server refuses a connection that did not authenticate (JESync's protocol).
AUTH_REFUSED = CLOSING_REPLY + "auth failed"

#: How a server in protected mode refuses a client that is not on its host
#: (the start of its line: L{jesync.client.errors.PROTECTED_MODE}).
PROTECTED_MODE = (CLOSING_REPLY + errors.PROTECTED_MODE).encode()

#: What a connection the server closed failed with, when it said nothing first.
SERVER_CLOSED = "the server closed the connection"

#: Builds a client's lock handle from its GRANTED (or GRANTED-MANY) reply, max_concurrent and expires.
MakeLock = Callable[[Reply, int, int], LockState]


class Session:
    def __init__(
        self,
        address: str,
        send: Callable[[bytes], None],
        make_lock: MakeLock,
        clock: Callable[[], float] = time.monotonic,
        reply_margin: Optional[float] = None,
    ) -> None:
        self.address = address
        #: the clock the requests are timed by (the locks' clock)
        self.clock = clock
        #: how late past its wait a waiting lock's answer may be before the
        #: connection is given up for dead (the clients' read_timeout; None: for ever)
        self.reply_margin = reply_margin
        # the lock requests waiting with a bounded wait, by their first key: when their answer is due
        self._answers_due: dict[str, float] = {}
        self.pipeline = Pipeline(send, self._expired, self._event)
        self.watches = Watches()
        self.held: dict[str, LockState] = {}  # by each of its keys
        #: whether the server gives fencing tokens: None until it has answered C{fencing on}
        self.fencing: Optional[bool] = None
        self._make_lock = make_lock
        self._just_lost: list[LockState] = []
        # The server's refusal (INVALID_PARAMETER: ...) of the handshake's fencing on, while it is the last line
        # read (see server_closed).
        self._last_words: Optional[str] = None

    @property
    def closed(self) -> bool:
        return self.pipeline.closed is not None

    # -- requests --------------------------------------------------------

    def handshake(self, token: Optional[bytes], on_result: OnResult, on_error: OnError, confirm: bool = False) -> None:
        """
        What every client sends first on every connection: C{auth <token>}
        (with a token), then C{fencing on} (see L{enable_fencing}), without
        waiting.  C{on_result} gets None once the connection may be used:
        when the server has answered C{OK}, or at once without a token; with
        C{confirm} (a member of a cluster, which must prove that it serves:
        see L{jesync.client.cluster}), only once it has answered the
        C{fencing on} as well.  A refused token fails the session (every
        request on it) and C{on_error} with L{AuthFailed}; so does a server
        that wants a token when none was sent (it refuses the C{fencing
        on}), and a server in protected mode, with L{AccessRefused}, even
        if its refusal came before this was called; any other refusal of
        C{auth} fails it as the module's docstring says.  Exactly one of the
        two is called.
        """
        settled: list[bool] = []

        def once(callback: Callable[[Any], None]) -> Callable[[Any], None]:
            def call(value: Any) -> None:
                if not settled:
                    settled.append(True)
                    callback(value)

            return call

        ready, failed = once(on_result), once(on_error)
        if self.closed:  # the server refused the connection before anything was sent
            assert self.pipeline.closed is not None
            failed(self.pipeline.closed)
            return
        if token is not None:

            def refused(error: Exception) -> None:
                if isinstance(error, AccessRefused) or not isinstance(error, ServerError):
                    pass  # the session failed with the server's refusal, or with the connection
                elif error.message == AUTH_REFUSED:
                    error = self.fail_with(AuthFailed(self.address, error.message, sent_token=True))
                elif error.message.startswith(CLOSING_REPLY):
                    error = self.fail_with(ConnectionLost(self.address, f"{SERVER_CLOSED}: {error.message}"))
                else:
                    error = self.fail_with(error)
                failed(error)

            self.pipeline.auth(token, discard if confirm else ready, refused)
        if confirm:
            self.enable_fencing(lambda _: ready(None), failed, needs_auth=token is None)
        else:
            self.enable_fencing(discard, discard, needs_auth=token is None)
            if token is None:
                ready(None)

    def enable_fencing(self, on_result: OnResult, on_error: OnError, needs_auth: bool = False) -> None:
        """
        Ask for fencing tokens (the clients do, first thing on every
        connection, without waiting for the answer: the requests after it
        are answered after it).  A server without them refuses
        (C{INVALID_COMMAND}): then grants carry none, and C{on_result} gets
        False as well.  With C{needs_auth} (no token was sent), a refusal
        for want of one fails the session with L{AuthFailed}.
        """

        def answered(on: bool) -> None:
            self.fencing = on
            on_result(on)

        def refused(error: Exception) -> None:
            if isinstance(error, AccessRefused) or self.closed:  # the session failed (the server's refusal, ...)
                on_error(error)
            elif needs_auth and isinstance(error, ServerError) and error.message == AUTH_REFUSED:
                on_error(self.fail_with(AuthFailed(self.address, error.message, sent_token=False)))
            elif isinstance(error, ServerError):
                # A server without fencing (INVALID_COMMAND); or one refusing the connection, which it closes next.
                if error.message.startswith(CLOSING_REPLY):
                    self._last_words = error.message
                answered(False)
            else:
                on_error(error)

        self.pipeline.fencing(True, answered, refused)

    def lock(
        self,
        key: str,
        max_concurrent: int,
        timeout: int,
        expires: int,
        on_result: OnResult,
        on_error: OnError,
        shared: bool = False,
        value: Optional[bytes] = None,
    ) -> None:
        """
        Ask for C{key}, exclusive or (C{shared}) shared, with C{value}
        (checked: L{jesync.client.wire.lock_value}) or none; C{on_result}
        gets the new lock handle, whose C{mode} and C{value} say what was
        asked.  (C{shared} and C{value} come after the callbacks, which
        the clients' C{start} appends last: they give them by keyword.)
        """
        self._check_free((key,))
        granted, failed, waiting = self._granted(
            key, max_concurrent, timeout, expires, on_result, on_error, shared, value
        )
        self.pipeline.lock(key, max_concurrent, timeout, expires, granted, failed, waiting, shared, value)

    def lock_many(
        self,
        keys: tuple[str, ...],
        timeout: int,
        expires: int,
        on_result: OnResult,
        on_error: OnError,
        shared: bool = False,
    ) -> None:
        """
        Ask for all of C{keys} (distinct, checked), a mutex on each, or
        each shared if C{shared} (C{lock-many-shared}); C{on_result} gets
        one handle for them all.
        """
        self._check_free(keys)
        granted, failed, waiting = self._granted(keys[0], 1, timeout, expires, on_result, on_error, shared)
        self.pipeline.lock_many(keys, timeout, expires, granted, failed, waiting, shared)

    def _check_free(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key in self.held:
                raise KeyBusy(key, "this client already holds it")

    def _granted(
        self,
        key: str,
        max_concurrent: int,
        timeout: int,
        expires: int,
        on_result: OnResult,
        on_error: OnError,
        shared: bool = False,
        value: Optional[bytes] = None,
    ) -> tuple[OnResult, OnError, Callable[[], None]]:
        """
        The callbacks of a lock request sent now: its grant, its failure, and
        its fence showing that it waits.  The lock's deadline is counted from
        when the request was sent; for one that had to wait, from one round
        trip (the time its fence took) before its grant arrived.  A request
        that waits at most C{timeout} seconds is owed its answer by then:
        if it has none C{reply_margin} seconds later, L{expire_overdue}
        gives the connection up (a paused server never answers).
        """
        sent = self.clock()
        round_trip: list[float] = []

        def granted(reply: Reply) -> None:
            self._answers_due.pop(key, None)
            lock = self._make_lock(reply, max_concurrent, expires)
            if shared:
                lock.mode = SHARED
            lock.value = value
            age = round_trip[0] if round_trip else self.clock() - sent
            lock._granted(reply.seconds_left, age)
            for each in lock.keys:
                self.held[each] = lock
            on_result(lock)

        def failed(error: Exception) -> None:
            self._answers_due.pop(key, None)
            on_error(error)

        def waiting() -> None:
            round_trip.append(self.clock() - sent)
            if timeout >= 0 and self.reply_margin is not None:
                self._answers_due[key] = sent + timeout + self.reply_margin

        return granted, failed, waiting

    def give_up(self, key: str) -> None:
        """
        The caller of an unanswered lock request for C{key} (a C{lock_many}:
        its first key) stopped waiting: release what it is granted.  (Its
        answer, which nobody waits for, is no longer watched for either.)
        """
        self.pipeline.abandon(key)
        self._answers_due.pop(key, None)

    def release(self, lock: LockState, on_result: OnResult, on_error: OnError) -> None:
        """
        Release every key of C{lock}; C{on_result} gets True if it was held
        until now, False if it had been lost.
        """
        if not lock._mark_released():
            on_result(False)
            return
        for key in lock.keys:
            if self.held.get(key) is lock:
                del self.held[key]
        failures: list[str] = []
        errors: list[Exception] = []
        unanswered = [len(lock.keys)]

        def settled() -> None:
            unanswered[0] -= 1
            if unanswered[0]:
                return
            if errors:
                on_error(errors[0])
            elif failures:
                lock._release_failed(failures[0])
                on_result(False)
            else:
                on_result(True)

        def answered(released: bool) -> None:
            if not released:
                failures.append("it had expired before it was released")
            settled()

        def failed(error: Exception) -> None:
            if isinstance(error, ConnectionLost):
                failures.append(f"the connection dropped while releasing it ({error.reason})")
            else:
                errors.append(error)
            settled()

        for key in lock.keys:
            self.pipeline.release(key, answered, failed)

    def renew(self, lock: LockState, on_result: OnResult, on_error: OnError) -> None:
        """
        Send the lock's C{lock} (or C{lock-many}) again, with timeout 0, so it
        never waits; C{on_result} gets None, C{on_error} a L{LockLost}.
        """
        if not lock.held:
            on_error(lock.lost_reason or lock._lost("it was released"))
            return

        sent = self.clock()

        def renewed(reply: Reply) -> None:
            if lock.held:
                lock._granted(reply.seconds_left, self.clock() - sent)
            on_result(None)

        def refused(error: Exception) -> None:
            if isinstance(error, LockTimeout):
                self._lose(lock, "a renewal found it expired and taken by another client")
            elif isinstance(error, ServerError):
                self._lose(lock, f"a renewal was refused: {error}")
            if lock.many and lock.lost:
                # Not all of its keys were free: whichever this connection still holds go back.
                for key in lock.keys:
                    self.pipeline.release(key, discard, discard)
            on_error(lock.lost_reason or lock._lost(str(error)))

        try:
            if lock.many:
                self.pipeline.lock_many(lock.keys, 0, lock.expires, renewed, refused, shared=lock.shared)
            else:
                self.pipeline.lock(lock.key, lock.max_concurrent, 0, lock.expires, renewed, refused, shared=lock.shared)
        except ConnectionLost as error:
            on_error(lock.lost_reason or lock._lost(error.reason))

    def status(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        self.pipeline.status(key, on_result, on_error)

    def listing(self, order: ListingOrder, on_result: OnResult, on_error: OnError) -> None:
        self.pipeline.listing(order, on_result, on_error)

    def holders(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        """Who holds C{key}: C{on_result} gets a list of L{jesync.client.wire.Holder}."""
        self.pipeline.holders(key, on_result, on_error)

    def extension(
        self, line: bytes, answers: frozenset[str], rows: frozenset[str], on_result: OnResult, on_error: OnError
    ) -> None:
        """An extension command (L{Pipeline.extension}): C{on_result} gets its reply's C{(word, fields, rows)}."""
        self.pipeline.extension(line, answers, rows, on_result, on_error)

    def watch(
        self, key: str, prefix: bool, on_event: OnEvent, on_end: OnEnd, on_result: OnResult, on_error: OnError
    ) -> Subscription:
        """
        Watch C{key} (with C{prefix}: every key starting with it; C{""}:
        every key).  C{on_result} gets the L{Subscription} (also returned at
        once, so that a caller who stops waiting can still L{unwatch} it)
        once the server watches it; from then on C{on_event} gets each
        event, and C{on_end} the connection's error if it fails (see
        L{jesync.client.watch}).  A refusal (the server's C{max-watches})
        errs with L{ServerError}.
        """
        subscription = Subscription(key, prefix, on_event, on_end)

        def watching(_: None) -> None:
            if not subscription.ended:
                subscription.active = True
            on_result(subscription)

        def refused(error: Exception) -> None:
            subscription.ended = True
            self.watches.remove(subscription)
            on_error(error)

        self.pipeline.watch(key, prefix, watching, refused)
        self.watches.add(subscription)
        return subscription

    def unwatch(self, subscription: Subscription, on_result: OnResult, on_error: OnError) -> None:
        """
        End C{subscription}: it gets no more events; the server stops
        watching its key once no other subscription watches it.
        C{on_result} gets whether it was still watching (False once ended,
        or once its connection has failed).
        """
        if subscription.ended or self.closed:
            subscription.ended = True
            on_result(False)
            return
        subscription.ended = True
        subscription.active = False
        if not self.watches.remove(subscription):
            on_result(True)
            return

        def answered(was_watched: bool) -> None:
            on_result(True)

        def failed(error: Exception) -> None:
            if isinstance(error, ConnectionLost):
                on_result(True)  # the server stops watching when the connection closes
            else:
                on_error(error)

        self.pipeline.unwatch(subscription.key, subscription.prefix, answered, failed)

    def _event(self, event: WatchEvent) -> None:
        self.watches.dispatch(event)

    def owned(self, lock: LockState, on_result: OnResult, on_error: OnError) -> None:
        """
        Ask the server whether this connection still holds every key of
        C{lock} (C{owned <key>}); C{on_result} gets a bool.  A lock that is
        not held (released or lost) is not asked about: False.  If the server
        says a key is not held, the lock is lost (its lost callbacks are
        due); if it says it expires sooner than the lock's C{deadline}, the
        deadline moves earlier.
        """
        if not lock.held:
            on_result(False)
            return
        sent = self.clock()
        answers: list[Optional[int]] = []
        errors: list[Exception] = []

        def settled() -> None:
            if len(answers) + len(errors) < len(lock.keys):
                return
            if errors:
                on_error(errors[0])
                return
            if any(ms_left is None for ms_left in answers):
                self._lose(lock, "the server says this connection does not hold it (owned)")
            elif lock.held:
                for ms_left in answers:
                    lock._server_says_left(ms_left, self.clock() - sent)  # type: ignore[arg-type]
            on_result(lock.held)

        def answered(ms_left: Optional[int]) -> None:
            answers.append(ms_left)
            settled()

        def failed(error: Exception) -> None:
            if isinstance(error, ConnectionLost):
                answers.append(None)  # the lock is lost with the connection
            else:
                errors.append(error)
            settled()

        for key in lock.keys:
            self.pipeline.owned(key, answered, failed)

    # -- the failsafe deadlines -------------------------------------------

    def next_deadline(self) -> Optional[float]:
        """
        The earliest C{deadline} of the locks held, or when a waiting lock's
        answer is overdue (None: neither): when to call L{expire_overdue}.
        """
        deadlines = [lock.deadline for lock in self.held.values() if lock.deadline is not None]
        deadlines.extend(self._answers_due.values())
        return min(deadlines, default=None)

    def expire_overdue(self) -> Optional[str]:
        """
        Lose every held lock whose deadline has passed without a renewal
        (their lost callbacks are due: L{take_lost}), and release its keys
        on the server, so that the server does not hold for a moment longer
        what the client counts as lost.

        If a waiting lock's answer is overdue (its wait and C{reply_margin}
        have passed), the server has stopped answering: the session fails,
        and the reason is returned for the client to close the connection
        with (L{fail}); else None.
        """
        now = self.clock()
        for key, due in list(self._answers_due.items()):
            if now < due:
                continue
            if not self.pipeline.is_waiting(key):
                del self._answers_due[key]  # answered, though nobody was waiting for it any more
                continue
            reason = f"no answer to the lock on {key!r} within {self.reply_margin:g} s after its wait"
            self.fail(reason)
            return reason
        for lock in [lock for lock in dict.fromkeys(self.held.values()) if lock._overdue()]:
            self._lose(lock, f"it expired: not renewed within its failsafe expiry of {lock.expires} s")
            if not self.closed:
                for key in lock.keys:
                    self.pipeline.release(key, discard, discard)
        return None

    # -- the connection --------------------------------------------------

    def line_received(self, line: bytes) -> None:
        """
        A reply line (may raise L{jesync.client.wire.UnexpectedReply}: then
        call L{fail}).  A refusal of the connection fails the session (see
        the module's docstring).
        """
        self._last_words = None
        if line.startswith(PROTECTED_MODE):
            self.fail_with(AccessRefused(self.address, line.decode("utf-8", "backslashreplace")))
            return
        if not self.pipeline.owes_reply and line.split(b" ", 1)[0].decode("latin-1") in ERROR_WORDS:
            # It answers no request: the server's reason for closing the connection.
            self.fail(f"{SERVER_CLOSED}: {line.decode('utf-8', 'backslashreplace')}")
            return
        self.pipeline.line_received(line)

    def server_closed(self, reason: str = SERVER_CLOSED) -> None:
        """
        The server closed the connection (C{reason}: how the client saw it:
        an end of file, a reset, a send that failed).  If the last line it
        sent was its refusal of the handshake, that line is the reason.
        """
        words = self._last_words
        self.fail(reason if words is None else f"{SERVER_CLOSED}: {words}")

    def fail(self, reason: str) -> None:
        """The connection is gone: its locks are lost and its requests fail with L{ConnectionLost}."""
        self.fail_with(ConnectionLost(self.address, reason))

    def fail_with(self, error: Exception) -> Exception:
        """
        The connection is unusable: its locks are lost and its requests fail
        with C{error} (a later L{fail} changes nothing); return C{error}.
        """
        if self.closed:
            return error
        reason = error.reason if isinstance(error, ConnectionLost) else str(error)
        self._answers_due.clear()
        for lock in dict.fromkeys(self.held.values()):
            self._lose(lock, f"the connection to {self.address} was lost ({reason})")
        failed = error if isinstance(error, ConnectionLost) else ConnectionLost(self.address, reason)
        self.pipeline.fail_all(error)
        self.watches.end_all(failed)
        return error

    def take_lost(self) -> list[LockState]:
        """The locks lost since the last call, whose lost callbacks are still to be called."""
        lost, self._just_lost = self._just_lost, []
        return lost

    def _lose(self, lock: LockState, reason: str) -> None:
        if lock._lose(reason):
            for key in lock.keys:
                if self.held.get(key) is lock:
                    del self.held[key]
            self._just_lost.append(lock)

    def _expired(self, key: str) -> None:
        lock = self.held.get(key)
        if lock is not None:
            self._lose(lock, "the server's failsafe expiry released it")
