"""
Sessions that outlive a connection (elock's defining feature).

A session owns locks in the L{ILockService}.  It is attached to one
connection at a time; when that connection drops, the session is detached and
its locks survive for a grace period, during which a new connection may
resume it by id.  A session that is not resumed in time, or whose client
quits, ends and its locks are released.

    attached --connection_lost--> detached --grace period over--> ended
        ^                             |
        +-----------resume------------+
    attached --end (quit, or gone holding nothing)--> ended
    detached --end (server stopping, an operator's end-session)--> ended
    detached --keep_alive--> detached (its grace period starts again)

B{An HTTP session} (L{SessionTable.open}) is the same kind of session,
started detached: HTTP requests do not own a connection, so its grace
period is its TTL, which only C{keep_alive} starts again; it ends when the
TTL runs out (its locks released), when ended, or when the server stops.
It shares the elock sessions' ids and their C{--max-sessions} cap (it is
counted while detached, as every detached session is).  An elock
connection may attach to it with C{conn_id <id>}: it is then that
connection's session under elock's rules (no TTL running while attached),
except that when that connection goes it detaches for its grace period even
holding nothing: an HTTP session ends when its client says so, or its TTL
runs out, never because some connection went.

Two rules bound what a session keeps after its client has gone, since the
sessions in their grace period are capped (C{--max-sessions}) and a full cap
refuses every new client:

 - B{The grace period is bounded} (C{--max-session-grace}, default
   L{DEFAULT_MAX_GRACE_MS}): a client may ask for a longer one
   (C{set_timeout} takes up to 2**31-1 ms, 24.8 days), and gets the bound.
 - B{A session that holds nothing ends when its connection goes}: it has
   nothing to keep, so it does not wait out a grace period (and does not
   count toward the cap).  A client that comes back with C{conn_id <id>}
   gets a new session under the same id, as it would from elock, whose
   sessions hold nothing but their locks and their C{set_timeout} (which a
   client sends again on a new connection).

The other owner whose grants outlive its connection is L{TimedGrants}: a
connection's grants that end at a time (dlock's C{release_micro}), not when
the connection goes.  Both are the lock service's vocabulary, not one
grammar's: the cluster's journal records them, and restores them.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable, Dict, Iterable, List, Optional

from automat import MethodicalMachine
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from jesync.errors import LimitReached
from jesync.interfaces import ILockService

DEFAULT_GRACE_MS = 30_000
# The longest grace period a client may ask for (--max-session-grace): 5 minutes.
DEFAULT_MAX_GRACE_MS = 300_000
# The most sessions in their grace period at once (--max-sessions).
DEFAULT_MAX_SESSIONS = 10_000


def new_session_id() -> str:
    """An unguessable id: 128 random bits (elock counted 1, 2, 3..., so anyone could take over a session)."""
    return secrets.token_urlsafe(16)


def _last_output(outputs: Iterable[Any]) -> Any:
    """What an input returns: its last output's result (whether a resume was accepted; the grace in force)."""
    return list(outputs)[-1]


class Session:
    """One client's identity across its connections, and the owner of its locks."""

    _machine = MethodicalMachine()

    def __init__(
        self,
        session_id: str,
        connection: object,
        clock: IReactorTime,
        service: ILockService,
        table: SessionTable,
    ) -> None:
        self.id = session_id
        self.connection: object | None = connection
        # The address of the connection it had last (an operator's listing shows it once it has gone).
        self.last_peer: str = _peer_of(connection)
        self.grace_ms = table.grace_in_force(DEFAULT_GRACE_MS)
        self._clock = clock
        self._service = service
        self._table = table
        self._grace_timer: IDelayedCall | None = None
        # Where it was opened from over HTTP, as listings show it while
        # detached (None: an elock session, shown as "detached-session").
        self.opened_by: str | None = None

    def __repr__(self) -> str:
        return f"<Session {self.id}>"

    @property
    def live(self) -> bool:
        """Whether it has not ended."""
        return self._table.live(self)

    @property
    def peer(self) -> str:
        """Where its client is, for listings (never its id: that would let anyone take it over)."""
        return getattr(self.connection, "peer", None) or self.opened_by or "detached-session"

    def set_grace(self, milliseconds: int) -> int:
        """Ask for a grace period of C{milliseconds}; returns the one in force (at most the table's bound)."""
        self.grace_ms = self._table.grace_in_force(milliseconds)
        return self.grace_ms

    def seconds_left(self) -> float | None:
        """Seconds until its grace period is over, if it is in one (None: it is attached, or has ended)."""
        timer = self._grace_timer
        return None if timer is None else max(0.0, timer.getTime() - self._clock.seconds())

    def disconnected(self) -> None:
        """
        Its connection went away without quitting: it detaches for its grace
        period if it holds anything (its waits are cancelled by then), or
        ends now if it holds nothing: there is nothing to keep for a
        reconnect, and a session kept for nothing would count toward
        C{--max-sessions}.
        """
        if self._service.owned(self) or self.opened_by is not None:
            self.connection_lost()
        else:
            self.end()

    # -- states ----------------------------------------------------------

    @_machine.state(initial=True)
    def attached(self) -> None:
        "A connection speaks for the session."

    @_machine.state()
    def detached(self) -> None:
        "No connection; the locks survive until the grace period is over."

    @_machine.state()
    def ended(self) -> None:
        "The session is over and its locks are released."

    # -- inputs ----------------------------------------------------------

    @_machine.input()
    def connection_lost(self) -> None:
        "The session's connection went away without quitting."

    @_machine.input()
    def resume(self, connection: object) -> None:
        "A connection asks to take the session over by its id."

    @_machine.input()
    def grace_over(self) -> None:
        "The grace period ran out."

    @_machine.input()
    def end(self) -> None:
        "The client quit: an explicit end, so nothing should survive."

    @_machine.input()
    def keep_alive(self) -> Any:
        "An HTTP client says it is still there: a grace period starts again (returns it, in milliseconds)."

    # -- outputs ---------------------------------------------------------

    @_machine.output()
    def _detach(self) -> None:
        self.connection = None
        self._table._detached[self.id] = self

    @_machine.output()
    def _start_grace_timer(self) -> None:
        self._grace_timer = self._clock.callLater(self.grace_ms / 1000, self.grace_over)

    @_machine.output()
    def _stop_grace_timer(self) -> None:
        assert self._grace_timer is not None
        self._grace_timer.cancel()
        self._grace_timer = None

    @_machine.output()
    def _grace_in_force(self) -> int:
        return self.grace_ms

    @_machine.output()
    def _attach(self, connection: object) -> bool:
        self.connection = connection
        self.last_peer = _peer_of(connection)
        self._table._detached.pop(self.id, None)
        return True

    @_machine.output()
    def _refuse(self, connection: object) -> bool:
        return False

    @_machine.output()
    def _release_locks(self) -> None:
        self._grace_timer = None
        self.connection = None
        self._service.release_all(self)
        self._table._forget(self)


    attached.upon(connection_lost, enter=detached, outputs=[_detach, _start_grace_timer])
    attached.upon(resume, enter=attached, outputs=[_refuse], collector=_last_output)
    attached.upon(end, enter=ended, outputs=[_release_locks])
    detached.upon(resume, enter=attached, outputs=[_stop_grace_timer, _attach], collector=_last_output)
    detached.upon(grace_over, enter=ended, outputs=[_release_locks])
    detached.upon(end, enter=ended, outputs=[_stop_grace_timer, _release_locks])
    ended.upon(resume, enter=ended, outputs=[_refuse], collector=_last_output)
    detached.upon(
        keep_alive,
        enter=detached,
        outputs=[_stop_grace_timer, _start_grace_timer, _grace_in_force],
        collector=_last_output,
    )
    attached.upon(keep_alive, enter=attached, outputs=[_grace_in_force], collector=_last_output)
    ended.upon(keep_alive, enter=ended, outputs=[_grace_in_force], collector=_last_output)


def _peer_of(connection: object) -> str:
    """A connection's address, as listings show it ("unknown": an embedder's connection without one)."""
    return getattr(connection, "peer", None) or "unknown"


class TimedGrants:
    """
    The owner of a connection's grants that outlive it and end when their
    time runs out (dlock's C{release_micro}).
    """

    def __init__(self, peer: str) -> None:
        self.peer = f"{peer}(timed)"

    def __repr__(self) -> str:
        return f"<timed dlock grants of {self.peer}>"


class SessionTable:
    """
    The live sessions of one listener family, by id.

    @param clock: runs the grace timers.
    @param service: the lock table the sessions own locks in.
    @param limit: the most sessions in their grace period: while there are
        that many, no new session starts (L{LimitReached}), so churn or
        guessed ids cannot grow the table without bound.  Attached sessions
        are bounded by the connections.  None: no limit.
    @param max_grace_ms: the longest grace period a session may have, in
        milliseconds; a longer one asked for is cut to it.  None: no bound.
    """

    def __init__(
        self,
        clock: IReactorTime,
        service: ILockService,
        limit: Optional[int] = None,
        max_grace_ms: Optional[int] = DEFAULT_MAX_GRACE_MS,
    ) -> None:
        self._clock = clock
        self._service = service
        self.limit = limit
        self.max_grace_ms = max_grace_ms
        self._sessions: Dict[str, Session] = {}
        self._detached: Dict[str, Session] = {}
        # Told of every session that ends, once its locks are released
        # (cluster mode: the journal deletes its record).
        self.on_end: Optional[Callable[[Session], None]] = None

    def __len__(self) -> int:
        return len(self._sessions)

    def grace_in_force(self, milliseconds: int) -> int:
        """The grace period a session asking for C{milliseconds} gets: at most L{max_grace_ms}."""
        if self.max_grace_ms is None:
            return milliseconds
        return min(milliseconds, self.max_grace_ms)

    def sessions(self) -> List[Session]:
        """Every live session (attached or in its grace period), in the order they started."""
        return list(self._sessions.values())

    def find(self, session_id: str) -> Session | None:
        """The live session C{session_id}, if there is one."""
        return self._sessions.get(session_id)

    def detached_count(self) -> int:
        """Sessions in their grace period (elock's "monitoring")."""
        return len(self._detached)

    def start(self, connection: object, session_id: str | None = None) -> Session:
        """
        A new session for C{connection}, under a fresh id unless one is given.

        @raise LimitReached: if C{limit} sessions are in their grace period.
        """
        if self.limit is not None and len(self._detached) >= self.limit:
            raise LimitReached("max-sessions", self.limit)
        if session_id is None:
            session_id = new_session_id()
            while session_id in self._sessions:  # pragma: no cover - 2**-128
                session_id = new_session_id()
        session = Session(session_id, connection, self._clock, self._service, self)
        self._sessions[session_id] = session
        return session

    def open(self, ttl_ms: int, peer: str) -> Session:
        """
        An HTTP session for a client at C{peer}: started detached, its grace
        period (its TTL) C{ttl_ms} (at most L{max_grace_ms}) running from now.

        @raise LimitReached: if C{limit} sessions are in their grace period.
        """
        session = self.start(None)
        session.opened_by = f"{peer} (http)"
        session.last_peer = session.opened_by
        session.set_grace(ttl_ms)
        session.connection_lost()
        return session

    def restore(self, session_id: str, grace_ms: int) -> Session:
        """
        A session a previous leader kept in etcd (cluster mode), detached: its
        grace period starts now (at most L{max_grace_ms}, which may have
        changed since).  Not refused by C{limit}: it existed already.
        """
        session = Session(session_id, None, self._clock, self._service, self)
        session.last_peer = "restored"
        session.set_grace(grace_ms)
        self._sessions[session_id] = session
        session.connection_lost()
        return session

    def take(self, connection: object, session_id: str) -> Session | None:
        """
        Resume the detached session C{session_id} for C{connection}, or start
        one under that id if there is none; None if it is attached elsewhere.
        """
        session = self._sessions.get(session_id)
        if session is None:
            return self.start(connection, session_id)
        return session if session.resume(connection) else None

    def end_one_detached(self, session_id: str) -> bool:
        """
        End the session C{session_id} now if it is in its grace period (an
        operator's C{end-session}); False if not.
        """
        session = self._detached.get(session_id)
        if session is None:
            return False
        session.end()
        return True

    def end_detached(self) -> None:
        """End every session in its grace period now (the server is stopping)."""
        for session in list(self._detached.values()):
            session.end()

    def live(self, session: Session) -> bool:
        """Whether C{session} has not ended (it is attached, or in its grace period)."""
        return self._sessions.get(session.id) is session

    def _forget(self, session: Session) -> None:
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        if self._detached.get(session.id) is session:
            del self._detached[session.id]
        if self.on_end is not None:
            self.on_end(session)
