"""
The elock client's session, and its failover as a declared state machine.

An elock session (L{jesync.client.elock}) has an id the server gave it, and
at most one connection at a time.  What happens to it is a small machine,
whose states say whether there is a session and whether it has a connection:

    unattached --start--> attached      a new session, through a member that answered
    attached   --broke--> resuming      its connection failed: it is closed and forgotten
    resuming   --resume-> attached      a member took the session back within the grace period
    resuming   --give_up-> unattached   none did: the id is forgotten (the next request starts anew)
    any        --end----> ended         the client quits or stops: the connection is closed

Any other input in a state is a bug, and raises (automat's NoTransition),
so the bookkeeping of the id, the member and the connection can only change
along these arrows.  The machine does no I/O of its own beyond closing a
connection: the client connects, asks and decides, in its I/O thread, and
tells the machine what happened.

The session also keeps what the client knows it holds (L{ELockHolds}: the
held keys' L{ELockHandle}s, their tokens, the keys being asked for, and
which handles are lost when a resume or C{owned} says so), and its
heartbeat's liveness (when it last heard from its member, and how long until
the next heartbeat is due).  Both are plain bookkeeping without I/O, so the
client is left with the I/O: the connection, its thread, the request queue
and driving the failover.  Lost handles' callbacks are handed to a reporter
the client gives (it calls them from a thread of its own).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Optional, Protocol

from automat import MethodicalMachine

from jesync.client.errors import KeyBusy, LockLost

log = logging.getLogger("jesync.client.elock")

LostCallback = Callable[[LockLost], object]


class Closable(Protocol):
    """A session's connection, as far as the machine cares."""

    def close(self) -> None: ...


class HandleOwner(Protocol):
    """What a handle asks of its client: release a key, or ask whether the session holds it."""

    def unlock(self, key: str) -> bool: ...

    def owned(self, key: str) -> bool: ...


class ELockHandle:
    """
    A lock an L{jesync.client.elock.ELockClient}'s session holds on C{key}.
    Use it as a context manager (released when the block ends), or call
    L{release}.

    It stays held across failovers the session survives.  If the session
    loses it (the resume found it not held), C{lost} becomes true,
    C{lost_reason} says why (a L{LockLost}), the callbacks given to
    L{on_lost} are called once with that error, and leaving a C{with} block
    raises it.

    @ivar key: the key.
    @ivar token: the grant's fencing token (None from a server without
        fencing tokens).
    """

    def __init__(self, client: HandleOwner, key: str, token: Optional[int]) -> None:
        self.key = key
        self.token = token
        self.lost_reason: Optional[LockLost] = None
        self._client = client
        self._state = "held"
        self._callbacks: list[LostCallback] = []
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"<ELockHandle {self.key!r} {self._state}>"

    @property
    def held(self) -> bool:
        return self._state == "held"

    @property
    def lost(self) -> bool:
        return self._state == "lost"

    @property
    def released(self) -> bool:
        return self._state == "released"

    def on_lost(self, callback: LostCallback) -> None:
        """
        Call C{callback(error)} (a L{LockLost}) once if the lock is lost: at
        once if it already is, else from a background thread when it is.
        """
        with self._mutex:
            if self._state != "lost":
                self._callbacks.append(callback)
                return
        assert self.lost_reason is not None
        call_quietly(callback, self.lost_reason)

    def release(self) -> bool:
        """True if the session held the lock until now; False if it had been lost or released."""
        if not self.held:
            return False
        return self._client.unlock(self.key)

    def owned(self) -> bool:
        """
        Ask the server whether the session still holds the lock (False once
        released or lost); if it says no, the lock is lost (its callbacks are
        called).
        """
        if not self.held:
            return False
        return self._client.owned(self.key)

    def __enter__(self) -> ELockHandle:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if not self.release() and kind is None and self.lost_reason is not None:
            raise self.lost_reason

    # -- the session's side ----------------------------------------------

    def _set_released(self) -> None:
        with self._mutex:
            if self._state == "held":
                self._state = "released"

    def _set_lost(self, reason: str) -> list[LostCallback]:
        """Mark it lost; the callbacks to call (outside every lock), once."""
        with self._mutex:
            if self._state != "held":
                return []
            self._state = "lost"
            self.lost_reason = LockLost(self.key, reason)
            callbacks, self._callbacks = self._callbacks, []
        return callbacks


def call_quietly(callback: LostCallback, error: LockLost) -> None:
    """Call a lost-lock callback; log what it raises (one failing callback must not stop the others)."""
    try:
        callback(error)
    except Exception:
        log.exception("a lost-lock callback failed")


#: Handles just lost, each with the callbacks to call for it.
Lost = list[tuple[ELockHandle, list[LostCallback]]]


def report_at_once(lost: Lost) -> None:
    """Call the lost handles' callbacks here and now (the client calls them from a thread of its own)."""
    for handle, callbacks in lost:
        assert handle.lost_reason is not None
        for callback in callbacks:
            call_quietly(callback, handle.lost_reason)


class ELockHolds:
    """
    The locks a session holds as far as its client knows: one L{ELockHandle}
    per held key, and the keys a C{lock} is asking for.  A handle leaves
    when it is released or lost; lost handles are given to C{report} (with
    their callbacks), outside this object's lock.  Thread-safe: callers
    ask from their threads, the I/O thread records the outcomes.
    """

    def __init__(self, report: Callable[[Lost], None] = report_at_once) -> None:
        self._report = report
        self._mutex = threading.Lock()
        self._handles: dict[str, ELockHandle] = {}
        self._asking: set[str] = set()

    def held(self) -> list[ELockHandle]:
        """The handles still held."""
        with self._mutex:
            return [handle for handle in self._handles.values() if handle.held]

    def held_keys(self) -> list[str]:
        """The keys of the handles still held."""
        with self._mutex:
            return [key for key, handle in self._handles.items() if handle.held]

    def released_or_lost(self, key: str) -> bool:
        """True if C{key} has a handle that is no longer held (its C{unlock} has nothing to give back)."""
        with self._mutex:
            handle = self._handles.get(key)
        return handle is not None and not handle.held

    def ask(self, key: str) -> None:
        """A C{lock} of C{key} starts; raise L{KeyBusy} if the session holds it, or is asking for it."""
        with self._mutex:
            handle = self._handles.get(key)
            if handle is not None and handle.held:
                raise KeyBusy(key, "this client holds it already")
            if key in self._asking:
                raise KeyBusy(key, "this client is asking for it already")
            self._asking.add(key)

    def asked(self, key: str) -> None:
        """The C{lock} of C{key} ended (granted or not)."""
        with self._mutex:
            self._asking.discard(key)

    def granted(self, owner: HandleOwner, key: str, token: Optional[int]) -> ELockHandle:
        """The session got C{key}: its new handle."""
        handle = ELockHandle(owner, key, token)
        with self._mutex:
            self._handles[key] = handle
        return handle

    def released(self, key: str) -> None:
        """The session gave C{key} back."""
        with self._mutex:
            handle = self._handles.pop(key, None)
            if handle is not None:
                handle._set_released()

    def release_all(self) -> None:
        """The session gave everything back (C{unlock_all}, C{quit}), or the client stopped."""
        with self._mutex:
            for handle in self._handles.values():
                handle._set_released()
            self._handles.clear()

    def owned(self, key: str, held: bool, token: Optional[int]) -> None:
        """
        The server said whether the session holds C{key} (and its token):
        a handle it does not hold is lost; one it holds takes the token.
        """
        lost: Lost = []
        with self._mutex:
            handle = self._handles.get(key)
            if handle is not None and not held:
                self._handles.pop(key)
                lost.append((handle, handle._set_lost("the server says the session does not hold it")))
            elif handle is not None and token is not None:
                handle.token = token
        self._tell(lost)

    def keep_only(self, holds: dict[str, Optional[int]], reason: str, spare: Iterable[str] = ()) -> None:
        """
        A resume found the session holding C{holds} (key: its token, or
        None): the other handles are lost for C{reason}, except those of
        the keys in C{spare} (an interrupted C{unlock} was giving them back).
        """
        spared = set(spare)
        lost: Lost = []
        with self._mutex:
            for key, handle in list(self._handles.items()):
                if not handle.held or key in spared:
                    continue
                if key in holds:
                    if holds[key] is not None:
                        handle.token = holds[key]
                    continue
                del self._handles[key]
                lost.append((handle, handle._set_lost(reason)))
        self._tell(lost)

    def lose_all(self, reason: str) -> None:
        """The session is gone: every handle is lost for C{reason}."""
        with self._mutex:
            lost = [(handle, handle._set_lost(reason)) for handle in self._handles.values()]
            self._handles.clear()
        self._tell(lost)

    def _tell(self, lost: Lost) -> None:
        if lost:
            self._report(lost)


class ELockSession:
    """
    One elock session's state: its C{id} (None while unattached), the
    C{connection} it is attached through (None unless attached), the
    C{member_index} of the member that last answered, when it last heard
    from it (C{heard_at}, for the C{heartbeat}), and the locks it holds
    (C{holds}, an L{ELockHolds}).
    """

    _machine = MethodicalMachine()

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: float = 5.0,
        report_lost: Callable[[Lost], None] = report_at_once,
    ) -> None:
        self._clock = clock
        self.id: Optional[str] = None
        self.connection: Optional[Any] = None
        self.member_index = 0
        self.heartbeat = heartbeat
        self.heard_at = clock()
        self.holds = ELockHolds(report_lost)

    def heard(self) -> None:
        """The server answered: the heartbeat's quiet starts again."""
        self.heard_at = self._clock()

    def heartbeat_due_in(self) -> float:
        """Seconds until a heartbeat is due (0 or less: it is due now)."""
        return self.heartbeat - (self._clock() - self.heard_at)

    # -- states ---------------------------------------------------------------

    @_machine.state(initial=True)
    def unattached(self) -> None:
        "No session: none started yet, or the last one was given up."

    @_machine.state()
    def attached(self) -> None:
        "A session with a connection."

    @_machine.state()
    def resuming(self) -> None:
        "A session whose connection failed, being taken back through a member."

    @_machine.state()
    def ended(self) -> None:
        "The client quit or stopped."

    # -- inputs ---------------------------------------------------------------

    @_machine.input()
    def start(self, connection: Closable, member_index: int, session_id: str) -> None:
        "A new session started through the member at C{member_index}."

    @_machine.input()
    def broke(self) -> None:
        "The connection failed."

    @_machine.input()
    def resume(self, connection: Closable, member_index: int) -> None:
        "The member at C{member_index} took the session back."

    @_machine.input()
    def give_up(self) -> None:
        "No member took the session back within its grace period."

    @_machine.input()
    def end(self) -> None:
        "The client quits or stops."

    # -- outputs --------------------------------------------------------------

    @_machine.output()
    def _adopt(self, connection: Closable, member_index: int, session_id: str) -> None:
        self.id = session_id
        self._use(connection, member_index)

    @_machine.output()
    def _reattach(self, connection: Closable, member_index: int) -> None:
        self._use(connection, member_index)

    @_machine.output()
    def _drop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()

    @_machine.output()
    def _forget(self) -> None:
        self.id = None

    def _use(self, connection: Closable, member_index: int) -> None:
        self.connection = connection
        self.member_index = member_index
        self.heard()

    unattached.upon(start, enter=attached, outputs=[_adopt])
    unattached.upon(end, enter=ended, outputs=[])
    attached.upon(broke, enter=resuming, outputs=[_drop])
    attached.upon(end, enter=ended, outputs=[_drop])
    resuming.upon(resume, enter=attached, outputs=[_reattach])
    resuming.upon(give_up, enter=unattached, outputs=[_forget])
    resuming.upon(end, enter=ended, outputs=[])
    ended.upon(end, enter=ended, outputs=[])
