"""
Which reply answers which request, on one pipelined JESync connection.

The server answers every command at once and in order, except a C{lock} that
has to wait: that one gets no immediate reply, commands sent after it are
answered meanwhile, and it is answered (C{GRANTED} or C{TIMEOUT}, naming the
key) whenever it is granted or times out.  So without help a client cannot
tell whether the C{lock} it sent is waiting or its answer is still in
flight, and an C{INVALID_PARAMETER} (which names no key) arriving after a
C{lock} is ambiguous.

The scheme used here: every C{lock k ...} is written together with a fence,
C{status k}, which the server always answers at once.  Then every request
owes exactly one immediate reply, in order, and each line is read thus:

 - C{GRANTED}/C{TIMEOUT k}: the answer to the C{lock k} at the head of the
   queue if it is still unanswered (it was answered at once); otherwise the
   late answer to the C{lock k} that is waiting.
 - C{STATUS k} while the head of the queue is a C{lock k}: the fence.  If the
   lock was not answered before its fence, it is waiting: it leaves the queue
   and waits, by key, for its late answer.
 - Anything else answers the head of the queue (an C{INVALID_PARAMETER} too),
   and must fit it (a C{RELEASED k} for a C{release k}, ...); a line that fits
   nothing means the connection cannot be trusted any more, and
   L{UnexpectedReply} is raised for the client to close it.

This needs one rule, which L{Pipeline.lock} enforces by raising L{KeyBusy}:
a connection never has two C{lock} requests for the same key outstanding
when either of them may wait.  (The server does not answer a second C{lock}
from a connection already waiting for that key, and two late answers for one
key could not be told apart.)  Renewals are sent with a timeout of 0, never
wait, and so may overlap.

Since every request owes an immediate reply, a client can also tell a
server that has stopped answering (L{Pipeline.owes_reply}) from a lock that
is merely waiting.

JESync has no command to withdraw a waiting C{lock}.  A request its caller
gave up on (L{Pipeline.abandon}) stays outstanding until the server answers
it; if that answer is C{GRANTED}, the pipeline releases the lock at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

from jesync.client.errors import ConnectionLost, KeyBusy, ServerError
from jesync.client.wire import (
    ERROR_WORDS,
    Reply,
    UnexpectedReply,
    lock_request,
    listing_request,
    parse_reply,
    release_request,
    status_request,
)
from jesync.errors import LockTimeout
from jesync.wire import KeyStatus, ListingOrder

OnResult = Callable[[Any], None]
OnError = Callable[[Exception], None]


def discard(result: object) -> None:
    """A callback for a reply nobody waits for."""


class _Request:
    """One request awaiting its reply."""

    __slots__ = ("command", "key", "on_result", "on_error", "may_wait", "answered", "abandoned", "rows")

    def __init__(self, command: str, key: str | None, on_result: OnResult, on_error: OnError) -> None:
        self.command = command
        self.key = key
        self.on_result = on_result
        self.on_error = on_error
        self.may_wait = False
        # lock: its GRANTED/TIMEOUT/error has arrived (and settled it), its fence has not yet
        self.answered = False
        self.abandoned = False
        self.rows: list[KeyStatus] = []


class Pipeline:
    """
    The requests outstanding on one connection, and the matching of its reply
    lines to them.  It does no I/O: C{send} writes bytes to the connection, and
    the client feeds every line it reads to L{line_received}.

    Each request takes an C{on_result} and an C{on_error} callable, exactly one
    of which is called, once: C{lock} results in the C{GRANTED} L{Reply} (a
    timed-out wait is a L{LockTimeout} error), C{release} in a C{bool}
    (whether the connection held the key), C{status} in a L{KeyStatus},
    C{listing} in a list of them.  A refused request errs with L{ServerError}.
    The pipeline's state is consistent whenever it calls them, so they may
    make new requests.

    @param on_expired: called with the key of an unsolicited C{EXPIRED} line
        (sent by JESync 0.8.1, never by jesync, when a grant expires).
    """

    def __init__(self, send: Callable[[bytes], None], on_expired: Callable[[str], None] = discard) -> None:
        self._send = send
        self._on_expired = on_expired
        self._queue: deque[_Request] = deque()  # owed an immediate reply, in order
        self._waiting: dict[str, _Request] = {}  # locks past their fence, by key
        self._locks: dict[str, list[_Request]] = {}  # unsettled lock requests, by key
        self.closed: Optional[Exception] = None

    @property
    def owes_reply(self) -> bool:
        """Whether the server owes an immediate reply (so silence means trouble)."""
        return bool(self._queue)

    def outstanding(self) -> bool:
        """Whether any request at all is unanswered (waiting locks included)."""
        return bool(self._queue or self._waiting)

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
        """Send C{lock} (and its fence); the arguments are the protocol's, already checked."""
        line = lock_request(key, max_concurrent, timeout, expires) + status_request(key)
        self._check_open()
        pending = self._locks.get(key)
        if pending and (timeout != 0 or any(request.may_wait for request in pending)):
            raise KeyBusy(key, "a lock request for it is already outstanding on this connection")
        request = _Request("lock", key, on_result, on_error)
        request.may_wait = timeout != 0
        self._locks.setdefault(key, []).append(request)
        self._enqueue(request, line)

    def release(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        self._enqueue(_Request("release", key, on_result, on_error), release_request(key))

    def status(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        self._enqueue(_Request("status", key, on_result, on_error), status_request(key))

    def listing(self, order: ListingOrder, on_result: OnResult, on_error: OnError) -> None:
        self._enqueue(_Request("listing", None, on_result, on_error), listing_request(order))

    def abandon(self, key: str) -> None:
        """
        The caller of the unanswered C{lock} for C{key} has given up on it:
        drop its callbacks, and release the lock if the server grants it.
        """
        for request in self._locks.get(key, ()):
            request.abandoned = True

    def _check_open(self) -> None:
        closed = self.closed
        if isinstance(closed, ConnectionLost):
            raise ConnectionLost(closed.address, closed.reason)
        if closed is not None:
            raise closed

    def _enqueue(self, request: _Request, line: bytes) -> None:
        self._check_open()
        self._queue.append(request)
        self._send(line)

    # -- replies ---------------------------------------------------------

    def line_received(self, line: bytes) -> None:
        """Match one reply line to its request and settle it (or raise L{UnexpectedReply})."""
        reply = parse_reply(line)
        word = reply.word
        head = self._queue[0] if self._queue else None
        if word in ("GRANTED", "TIMEOUT"):
            if head is not None and head.command == "lock" and head.key == reply.key and not head.answered:
                head.answered = True
                self._settle_lock(head, reply)
                return
            request = self._waiting.pop(reply.key, None)  # type: ignore[arg-type]
            if request is None:
                raise UnexpectedReply(f"{reply.text!r} answers no lock request")
            self._settle_lock(request, reply)
            return
        if word == "EXPIRED":
            self._on_expired(reply.key)  # type: ignore[arg-type]
            return
        if head is None:
            raise UnexpectedReply(f"{reply.text!r} answers no request")
        if head.command == "lock":
            self._fence_or_error(head, reply)
        elif word in ERROR_WORDS:
            self._queue.popleft()
            head.on_error(ServerError(reply.text))
        elif head.command == "listing":
            self._listing_line(head, reply)
        elif head.command == "release" and word in ("RELEASED", "NOT_RELEASED") and reply.key == head.key:
            self._queue.popleft()
            head.on_result(word == "RELEASED")
        elif head.command == "status" and word == "STATUS" and reply.key == head.key:
            self._queue.popleft()
            head.on_result(reply.status)
        else:
            raise UnexpectedReply(f"{reply.text!r} does not answer {head.command} {head.key or ''}")

    def _fence_or_error(self, head: _Request, reply: Reply) -> None:
        if reply.word == "STATUS" and reply.key == head.key:
            self._queue.popleft()
            if not head.answered:
                self._waiting[head.key] = head  # type: ignore[index]
        elif reply.word in ERROR_WORDS and not head.answered:
            head.answered = True
            self._forget_lock(head)
            if not head.abandoned:
                head.on_error(ServerError(reply.text))
        else:
            raise UnexpectedReply(f"{reply.text!r} does not answer lock {head.key}")

    def _listing_line(self, head: _Request, reply: Reply) -> None:
        if reply.word == "STATUS":
            head.rows.append(reply.status)  # type: ignore[arg-type]
        elif reply.word == "END":
            self._queue.popleft()
            head.on_result(head.rows)
        else:
            raise UnexpectedReply(f"{reply.text!r} in a listing")

    def _settle_lock(self, request: _Request, reply: Reply) -> None:
        key = request.key
        assert key is not None
        self._forget_lock(request)
        if request.abandoned:
            if reply.word == "GRANTED":
                self.release(key, discard, discard)
        elif reply.word == "GRANTED":
            request.on_result(reply)
        else:
            request.on_error(LockTimeout(key))

    def _forget_lock(self, request: _Request) -> None:
        pending = self._locks[request.key]  # type: ignore[index]
        pending.remove(request)
        if not pending:
            del self._locks[request.key]  # type: ignore[arg-type]

    # -- the end ---------------------------------------------------------

    def fail_all(self, error: Exception) -> None:
        """The connection is gone: every unsettled request fails with C{error}, and so will new ones."""
        if self.closed is not None:
            return
        self.closed = error
        unsettled = [r for r in self._queue if not (r.command == "lock" and r.answered)]
        unsettled.extend(self._waiting.values())
        self._queue.clear()
        self._waiting.clear()
        self._locks.clear()
        for request in unsettled:
            if not request.abandoned:
                request.on_error(error)
