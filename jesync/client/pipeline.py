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

A C{lock-many k1 k2 ...} (an extension: all or nothing, a mutex on each key)
is read the same way, with C{status k1} as its fence: C{GRANTED-MANY} and
C{TIMEOUT-MANY} name all its keys, in the order asked, and answer the
C{lock-many} at the head of the queue with exactly those keys if it is still
unanswered, or else the one waiting with them.

This needs one rule, which L{Pipeline.lock} and L{Pipeline.lock_many}
enforce by raising L{KeyBusy}: a connection never has two lock requests
(C{lock} or C{lock-many}) sharing a key outstanding when either of them may
wait.  (The server does not answer a second request from a connection
already waiting for that key, and two late answers for one key could not be
told apart.)  Renewals are sent with a timeout of 0, never wait, and so may
overlap.

C{auth <token>} (an extension, sent first on a connection to a server with a
token) is answered C{OK}, or C{INVALID_PARAMETER: auth failed} before the
server closes the connection.

C{fencing on} (an extension) is answered C{FENCING ON}, or C{INVALID_COMMAND}
by a server without fencing; from then on a C{GRANTED} carries the grant's
fencing token, and a C{GRANTED-MANY} one per key.

C{lock-shared} and C{lock-many-shared} (extensions) are answered as C{lock}
and C{lock-many} are, and read the same way: a C{lock} request is either.
The C{group-*} commands and C{groups}, and the admin listener's
C{force-release} (extensions), are sent as lines built by their callers
(L{jesync.client.group}, L{jesync.client.Client.force_release}), each with
the reply words that end it and the words of its rows
(L{jesync.client.group.GROUP_ANSWERS}, for one); those lines are not parsed here: the request gets
C{(word, fields, rows)}, the fields of its last line and of the rows before
it, for the caller to read.  An error word answers it as any request.
C{watch}, C{watch-prefix}, C{unwatch} and C{unwatch-prefix} (extensions)
are answered at once (C{WATCHING <key>}, ...).  C{EVENT ...} lines answer
nothing: a connection that watches gets them, unsolicited, between any two
replies; they go to C{on_event} whatever the queue holds, so an event is
never taken for the reply to a request.

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

from jesync.client.errors import ConnectionLost, KeyBusy, LockManyTimeout, ServerError
from jesync.client.wire import (
    ERROR_WORDS,
    auth_request,
    Reply,
    UnexpectedReply,
    fencing_request,
    lock_many_request,
    lock_request,
    lock_shared_request,
    unwatch_request,
    watch_request,
    WatchEvent,
    listing_request,
    holders_request,
    owned_request,
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


#: The lock commands, and the reply words that answer each.
_LOCK_ANSWERS = {"GRANTED": "lock", "TIMEOUT": "lock", "GRANTED-MANY": "lock-many", "TIMEOUT-MANY": "lock-many"}
_GRANTS = frozenset({"GRANTED", "GRANTED-MANY"})
#: The watch commands' replies, and the command each answers.
_WATCH_ANSWERS = {
    "WATCHING": "watch",
    "WATCHING-PREFIX": "watch-prefix",
    "UNWATCHED": "unwatch",
    "NOT_WATCHING": "unwatch",
    "UNWATCHED-PREFIX": "unwatch-prefix",
    "NOT_WATCHING-PREFIX": "unwatch-prefix",
}


class _Request:
    """One request awaiting its reply."""

    __slots__ = (
        "command",
        "keys",
        "on_result",
        "on_error",
        "may_wait",
        "answered",
        "abandoned",
        "rows",
        "on_waiting",
        "answers",
    )

    def __init__(self, command: str, keys: tuple[str, ...], on_result: OnResult, on_error: OnError) -> None:
        self.command = command
        self.keys = keys
        self.on_result = on_result
        self.on_error = on_error
        self.may_wait = False
        # lock: its GRANTED/TIMEOUT/error has arrived (and settled it), its fence has not yet
        self.answered = False
        self.abandoned = False
        self.rows: list[Any] = []
        #: a lock request: called when its fence shows it waiting
        self.on_waiting: Optional[Callable[[], None]] = None
        #: an extension request: the reply words that end it, and those of its rows
        self.answers: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())

    @property
    def key(self) -> Optional[str]:
        """The key (a lock-many's first key: the one its fence asks about)."""
        return self.keys[0] if self.keys else None

    @property
    def is_lock(self) -> bool:
        return self.command in ("lock", "lock-many")

    def describe(self) -> str:
        return " ".join((self.command,) + self.keys)


class Pipeline:
    """
    The requests outstanding on one connection, and the matching of its reply
    lines to them.  It does no I/O: C{send} writes bytes to the connection, and
    the client feeds every line it reads to L{line_received}.

    Each request takes an C{on_result} and an C{on_error} callable, exactly one
    of which is called, once: C{lock} results in the C{GRANTED} L{Reply} (a
    timed-out wait is a L{LockTimeout} error), C{lock_many} in the
    C{GRANTED-MANY} L{Reply} (L{LockManyTimeout}), C{release} in a C{bool}
    (whether the connection held the key), C{status} in a L{KeyStatus},
    C{listing} in a list of them, C{holders} in a list of
    L{jesync.client.wire.Holder}, C{owned} in the milliseconds left (None if
    not held), C{fencing} in a C{bool} (the server's
    setting), C{watch} in None (the server watches), C{unwatch} in a
    C{bool} (whether it watched).  A refused request errs with L{ServerError}.  The pipeline's
    state is consistent whenever it calls them, so they may make new
    requests.

    @param on_expired: called with the key of an unsolicited C{EXPIRED} line
        (sent by JESync 0.8.1, never by jesync, when a grant expires).
    @param on_event: called with the L{WatchEvent} of each C{EVENT} line.
    """

    def __init__(
        self,
        send: Callable[[bytes], None],
        on_expired: Callable[[str], None] = discard,
        on_event: Callable[[WatchEvent], None] = discard,
    ) -> None:
        self._send = send
        self._on_expired = on_expired
        self._on_event = on_event
        self._queue: deque[_Request] = deque()  # owed an immediate reply, in order
        self._waiting: dict[str, _Request] = {}  # lock requests past their fence, by (first) key
        self._locks: dict[str, list[_Request]] = {}  # unsettled lock requests, by each of their keys
        self.closed: Optional[Exception] = None

    @property
    def owes_reply(self) -> bool:
        """Whether the server owes an immediate reply (so silence means trouble)."""
        return bool(self._queue)

    def is_waiting(self, key: str) -> bool:
        """Whether a lock request for C{key} (a C{lock-many}: its first key) is past its fence, and its caller still waits."""
        request = self._waiting.get(key)
        return request is not None and not request.abandoned

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
        on_waiting: Optional[Callable[[], None]] = None,
        shared: bool = False,
        value: Optional[bytes] = None,
    ) -> None:
        """
        Send C{lock} (C{lock-shared} if C{shared}: then C{max_concurrent} is
        not sent), with C{value} if given, and its fence; the arguments are
        the protocol's, already checked.  C{on_waiting} (if given) is called
        when the fence shows that the request waits (it was not answered at
        once).
        """
        if shared:
            request = lock_shared_request(key, timeout, expires, value)
        else:
            request = lock_request(key, max_concurrent, timeout, expires, value)
        line = request + status_request(key)
        self._lock(_Request("lock", (key,), on_result, on_error), timeout, line, on_waiting)

    def lock_many(
        self,
        keys: tuple[str, ...],
        timeout: int,
        expires: int,
        on_result: OnResult,
        on_error: OnError,
        on_waiting: Optional[Callable[[], None]] = None,
        shared: bool = False,
    ) -> None:
        """
        Send C{lock-many} (C{lock-many-shared} if C{shared}) and its fence, a
        C{status} of its first key; the arguments are the protocol's, already
        checked (L{jesync.client.wire.lock_many_arguments}); C{on_waiting} as
        L{lock}'s.
        """
        keys = tuple(dict.fromkeys(keys))  # as the server counts them, so that its answer names the same keys
        line = lock_many_request(keys, timeout, expires, shared) + status_request(keys[0])
        self._lock(_Request("lock-many", keys, on_result, on_error), timeout, line, on_waiting)

    def _lock(
        self, request: _Request, timeout: int, line: bytes, on_waiting: Optional[Callable[[], None]] = None
    ) -> None:
        self._check_open()
        request.on_waiting = on_waiting
        for key in request.keys:
            pending = self._locks.get(key)
            if pending and (timeout != 0 or any(other.may_wait for other in pending)):
                raise KeyBusy(key, "a lock request for it is already outstanding on this connection")
        request.may_wait = timeout != 0
        for key in request.keys:
            self._locks.setdefault(key, []).append(request)
        self._enqueue(request, line)

    def release(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        self._enqueue(_Request("release", (key,), on_result, on_error), release_request(key))

    def status(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        self._enqueue(_Request("status", (key,), on_result, on_error), status_request(key))

    def owned(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        """
        C{owned <key>} (an extension): C{on_result} gets None if this
        connection does not hold the key, else the milliseconds until its
        failsafe expiry (-1: none).  An older server errs (INVALID_COMMAND).
        """
        self._enqueue(_Request("owned", (key,), on_result, on_error), owned_request(key))

    def holders(self, key: str, on_result: OnResult, on_error: OnError) -> None:
        """C{holders <key>} (an extension): C{on_result} gets a list of L{jesync.client.wire.Holder}."""
        self._enqueue(_Request("holders", (key,), on_result, on_error), holders_request(key))

    def watch(self, key: str, prefix: bool, on_result: OnResult, on_error: OnError) -> None:
        """
        C{watch <key>} (C{watch-prefix <key>} if C{prefix}; an empty prefix:
        every key); C{on_result} gets None once the server watches it.
        """
        command = "watch-prefix" if prefix else "watch"
        self._enqueue(_Request(command, (key,), on_result, on_error), watch_request(key, prefix))

    def unwatch(self, key: str, prefix: bool, on_result: OnResult, on_error: OnError) -> None:
        """C{unwatch <key>} (C{unwatch-prefix}); C{on_result} gets whether it was watched."""
        command = "unwatch-prefix" if prefix else "unwatch"
        self._enqueue(_Request(command, (key,), on_result, on_error), unwatch_request(key, prefix))

    def listing(self, order: ListingOrder, on_result: OnResult, on_error: OnError) -> None:
        self._enqueue(_Request("listing", (), on_result, on_error), listing_request(order))

    def auth(self, token: bytes, on_result: OnResult, on_error: OnError) -> None:
        """C{auth <token>}: C{on_result} gets None (the server's C{OK}); a refusal errs with L{ServerError}."""
        self._enqueue(_Request("auth", (), on_result, on_error), auth_request(token))

    def fencing(self, on: bool, on_result: OnResult, on_error: OnError) -> None:
        """C{fencing on} or C{off}: C{on_result} gets the server's setting; an older server errs (INVALID_COMMAND)."""
        self._enqueue(_Request("fencing", (), on_result, on_error), fencing_request(on))

    def extension(
        self, line: bytes, answers: frozenset[str], rows: frozenset[str], on_result: OnResult, on_error: OnError
    ) -> None:
        """
        An extension command's C{line} (a group command, C{force-release}),
        answered by a line whose word is one of C{answers}, after any number
        of lines whose word is one of C{rows}: C{on_result} gets C{(word,
        fields, rows)}, the reply's word, the fields of its line and a list
        of the fields of each row before it.
        """
        request = _Request("extension", (), on_result, on_error)
        request.answers = (answers, rows)
        self._enqueue(request, line)

    def abandon(self, key: str) -> None:
        """
        The caller of the unanswered lock request for C{key} (a C{lock-many}:
        any of its keys) has given up on it: drop its callbacks, and release
        what the server grants.
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
        if self._queue and self._queue[0].command == "extension" and self._extension_line(self._queue[0], line):
            return
        reply = parse_reply(line)
        word = reply.word
        head = self._queue[0] if self._queue else None
        command = _LOCK_ANSWERS.get(word)
        if command is not None:
            if head is not None and head.command == command and head.keys == reply.keys and not head.answered:
                head.answered = True
                self._settle_lock(head, reply)
                return
            request = self._waiting.get(reply.key)  # type: ignore[arg-type]
            if request is None or request.command != command or request.keys != reply.keys:
                raise UnexpectedReply(f"{reply.text!r} answers no lock request")
            del self._waiting[request.key]  # type: ignore[arg-type]
            self._settle_lock(request, reply)
            return
        if word == "EXPIRED":
            self._on_expired(reply.key)  # type: ignore[arg-type]
            return
        if reply.event is not None:
            self._on_event(reply.event)
            return
        if head is None:
            raise UnexpectedReply(f"{reply.text!r} answers no request")
        if head.is_lock:
            self._fence_or_error(head, reply)
        elif word in ERROR_WORDS:
            self._queue.popleft()
            head.on_error(ServerError(reply.text))
        elif head.command == "listing":
            self._listing_line(head, reply)
        elif head.command == "holders" and word in ("HOLDER", "END") and reply.key in (head.key, None):
            if word == "END":
                self._queue.popleft()
                head.on_result(head.rows)
            else:
                head.rows.append(reply.holder)
        elif head.command == "owned" and word in ("OWNED", "NOT_OWNED") and reply.key == head.key:
            self._queue.popleft()
            head.on_result(reply.ms_left if word == "OWNED" else None)
        elif head.command == "release" and word in ("RELEASED", "NOT_RELEASED") and reply.key == head.key:
            self._queue.popleft()
            head.on_result(word == "RELEASED")
        elif head.command == "status" and word == "STATUS" and reply.key == head.key:
            self._queue.popleft()
            head.on_result(reply.status)
        elif head.command == "auth" and word == "OK":
            self._queue.popleft()
            head.on_result(None)
        elif head.command == "fencing" and word == "FENCING":
            self._queue.popleft()
            head.on_result(reply.fencing)
        elif _WATCH_ANSWERS.get(word) == head.command and reply.key == head.key:
            self._queue.popleft()
            head.on_result(None if head.command.startswith("watch") else word.startswith("UNWATCHED"))
        else:
            raise UnexpectedReply(f"{reply.text!r} does not answer {head.describe()}")

    def _extension_line(self, head: _Request, line: bytes) -> bool:
        """Whether C{line} answers the extension request C{head} (a row, or its end)."""
        fields = line.rstrip(b"\r").split()
        word = fields[0].decode("ascii", "replace") if fields else ""
        answers, rows = head.answers
        if word in rows:
            head.rows.append(fields)
            return True
        if word in answers:
            self._queue.popleft()
            head.on_result((word, fields, head.rows))
            return True
        return False

    def _fence_or_error(self, head: _Request, reply: Reply) -> None:
        if reply.word == "STATUS" and reply.key == head.key:
            self._queue.popleft()
            if not head.answered:
                self._waiting[head.key] = head  # type: ignore[index]
                if head.on_waiting is not None:
                    head.on_waiting()
        elif reply.word in ERROR_WORDS and not head.answered:
            head.answered = True
            self._forget_lock(head)
            if not head.abandoned:
                head.on_error(ServerError(reply.text))
        else:
            raise UnexpectedReply(f"{reply.text!r} does not answer {head.describe()}")

    def _listing_line(self, head: _Request, reply: Reply) -> None:
        if reply.word == "STATUS":
            head.rows.append(reply.status)
        elif reply.word == "END":
            self._queue.popleft()
            head.on_result(head.rows)
        else:
            raise UnexpectedReply(f"{reply.text!r} in a listing")

    def _settle_lock(self, request: _Request, reply: Reply) -> None:
        self._forget_lock(request)
        if request.abandoned:
            if reply.word in _GRANTS:
                for key in request.keys:
                    self.release(key, discard, discard)
        elif reply.word in _GRANTS:
            request.on_result(reply)
        elif request.command == "lock":
            request.on_error(LockTimeout(request.keys[0]))
        else:
            request.on_error(LockManyTimeout(request.keys))

    def _forget_lock(self, request: _Request) -> None:
        for key in request.keys:
            pending = self._locks[key]
            pending.remove(request)
            if not pending:
                del self._locks[key]

    # -- the end ---------------------------------------------------------

    def fail_all(self, error: Exception) -> None:
        """The connection is gone: every unsettled request fails with C{error}, and so will new ones."""
        if self.closed is not None:
            return
        self.closed = error
        unsettled = [r for r in self._queue if not (r.is_lock and r.answered)]
        unsettled.extend(self._waiting.values())
        self._queue.clear()
        self._waiting.clear()
        self._locks.clear()
        for request in unsettled:
            if not request.abandoned:
                request.on_error(error)
