"""
One member of a jesync cluster: its election, its terms as leader, and how
it stops leading.

 - B{Election.}  The leader is the member whose entry is the cluster's
   election key, C{/jesync/<cluster>/leader}, created only if absent and
   bound to an etcd lease the leader keeps alive.  A standby looks at the
   key every L{Timing.poll} seconds, and campaigns (a lease, then the
   create-if-absent transaction) when it is gone: when the leader resigned,
   or its lease expired.
 - B{A term.}  The winner reads the durable state (L{jesync.cluster.journal}),
   builds a fresh server (L{jesync.server.build_server}: a new lock table,
   the same settings), restores the elock sessions (detached: their grace
   periods start again now) and the dlock timed grants into it, writes a
   fencing-token mark (L{jesync.fencing.reservation}: a few seconds ahead
   of its clock, not of the old mark, so takeovers do not add up) above
   every token given before, and only then listens.  A member that cannot listen resigns and campaigns again later;
   it never exits for that.
 - B{Certainty.}  The lease's TTL runs on etcd from when etcd received the
   last keep-alive, which was after this member sent it.  So this member is
   certain to be the only leader until I{sent + TTL - margin}, measured on
   its monotonic clock.  Every reply checks that before anything is sent
   (L{jesync.connections.policy.ConnectionPolicy.serving}), so a leader that
   was paused past its lease and resumes finds itself deposed before it
   tells anyone of a grant; a timer steps it down at that moment too.  Its
   durable writes are guarded by the election key's revision, so none can
   land after a successor has read the state.
 - B{Stepping down} (the lease could not be renewed in time, etcd said it is
   gone, or a durable write failed or was refused): nothing more is sent,
   the listeners close, every client connection is dropped, the term's lock
   table is thrown away, and the member campaigns again like any standby.
 - B{Resigning} (SIGTERM): the same, then the lease is revoked, which
   deletes the election key at once: a standby takes over without waiting
   for the lease to run out.
"""

from __future__ import annotations

import json
import os
import socket
import time
from functools import partial
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from automat import MethodicalMachine
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from jesync.cluster.etcd import Compare, EtcdClient, Get, Put
from jesync.cluster.journal import DurableState, Journal, Layout
from jesync.fencing import reservation
from jesync.interfaces import ILockObserver
from jesync.listening import Listeners, public_endpoint
from jesync.process import exit_cleanly, ignore_further_stop_signals
from jesync.sessions import TimedGrants
from jesync.wire import EXCLUSIVE

#: Roles, as /health and the metrics report them.
# Seconds the HTTP API's connections may take, when a term ends, to take
# their last replies (long polls answered not-granted) before they are
# aborted.
HTTP_STEP_DOWN_GRACE = 0.5

LEADER = "leader"
STANDBY = "standby"


@dataclass(frozen=True)
class Timing:
    """How a member paces itself, from C{--lease-ttl}."""

    ttl: int

    @property
    def keepalive(self) -> float:
        """Seconds between keep-alives: three chances per TTL."""
        return self.ttl / 3

    @property
    def margin(self) -> float:
        """How long before the lease could expire the leader steps down."""
        return min(1.0, self.ttl / 4)

    @property
    def certainty(self) -> float:
        """How long after a keep-alive is sent the leader is certain to lead: C{ttl - margin}."""
        return self.ttl - self.margin

    @property
    def poll(self) -> float:
        """Seconds between a standby's looks at the election key."""
        return min(0.5, self.ttl / 4)

    @property
    def retry(self) -> float:
        """Seconds before a member that stepped down, or could not listen, campaigns again."""
        return min(1.0, self.ttl / 2)


#: Seconds on a clock that never goes back and keeps counting while the
#: machine is suspended (Linux's C{CLOCK_BOOTTIME}; C{time.monotonic} stops
#: then, and a leader resumed from a suspend would think its lease still
#: young).  Elsewhere, C{time.monotonic}.  (Read before every reply: a C call.)
uptime: Callable[[], float] = (
    partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)


def member_name() -> str:
    """This process, as the election key names its leader."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Term:
    """One leadership: its lease, the election key's revision, and what it serves."""

    def __init__(self, lease: int, ttl: int, revision: int, valid_until: float, monotonic: Callable[[], float]):
        self.lease = lease
        self.ttl = ttl
        self.revision = revision
        self.valid_until = valid_until
        self._monotonic = monotonic
        self.ended = False
        self.server: Any = None
        self.journal: Optional[Journal] = None
        self.keepalive: Optional[LoopingCall] = None
        self.deadline: Optional[IDelayedCall] = None
        # Called once when certainty is found lost while replying.
        self.on_lapse: Callable[[], object] = lambda: None

    def certain(self) -> bool:
        """Whether this member is still surely the only leader (checked before every reply)."""
        if self.ended:
            return False
        if self._monotonic() < self.valid_until:
            return True
        self.ended = True
        self.on_lapse()
        return False


class ClusterMember(Listeners):
    """
    One jesync process of a cluster: a standby, or the leader serving the
    endpoints of C{settings}.  Its own endpoints (the metrics) listen all or
    not at all, as a L{LockServer}'s do (L{Listeners}); it joins the
    election once they do.

    @param reactor: its clock, and what the term's servers listen on.
    @param settings: the server's settings (L{jesync.server.ServerSettings}).
    @param etcd: the cluster's etcd.
    @param cluster: the cluster's name (its keys' prefix).
    @param ttl: the election lease's TTL, in seconds.
    @param build: builds a term's server (L{jesync.server.build_lock_server}).
    @param monotonic: the clock certainty is measured on.
    @param name: how the election key names this member (host:pid).
    @param observer: the lock service's other observer (metrics), handed to
        each term's journal.
    @param on_commit: told of each durable commit (metrics).
    """

    log = Logger()
    _machine = MethodicalMachine()

    def __init__(
        self,
        reactor: Any,
        settings: Any,
        etcd: EtcdClient,
        cluster: str,
        ttl: int,
        build: Callable[..., Any],
        monotonic: Callable[[], float] = uptime,
        name: Optional[str] = None,
        observer: Optional[ILockObserver] = None,
        on_commit: Optional[Callable[[int, float], None]] = None,
    ) -> None:
        super().__init__(reactor)
        self.reactor = reactor
        self.settings = settings
        self.etcd = etcd
        self.layout = Layout(cluster)
        self.cluster = cluster
        self.timing = Timing(ttl)
        self.build = build
        self.monotonic = monotonic
        self.name = name or member_name()
        self.observer = observer
        self.on_commit = on_commit
        self.term: Optional[Term] = None
        self.role = STANDBY
        self.terms = 0
        self._next: Optional[IDelayedCall] = None
        self._leader_seen: Optional[bytes] = None
        self._etcd_down = False
        self._leading: List[Deferred[None]] = []
        # Called with each new term's server once it serves, and None when it ends (metrics follow it).
        self.on_serving: Callable[[Any], None] = lambda server: None

    # -- states -----------------------------------------------------------------

    @_machine.state(initial=True)
    def idle(self) -> None:
        "Not started."

    @_machine.state()
    def standing_by(self) -> None:
        "Campaigning, or watching another member lead."

    @_machine.state()
    def taking_over(self) -> None:
        "Won: reading the durable state and starting to listen."

    @_machine.state()
    def leading(self) -> None:
        "Serving."

    @_machine.state()
    def stopped(self) -> None:
        "Stopped (resigned, if it led)."

    # -- inputs -----------------------------------------------------------------

    @_machine.input()
    def start(self) -> None:
        "The service starts."

    @_machine.input()
    def won(self, term: Term) -> None:
        "This member's entry is the election key now."

    @_machine.input()
    def serving(self) -> None:
        "The term's server listens on every endpoint."

    @_machine.input()
    def deposed(self, why: str) -> None:
        "Leadership is no longer certain, or could not begin."

    @_machine.input()
    def stop(self) -> None:
        "The service stops (SIGTERM)."

    # -- outputs ----------------------------------------------------------------

    @_machine.output()
    def _look_now(self) -> None:
        self._schedule(0)

    @_machine.output()
    def _begin_term(self, term: Term) -> None:
        self.term = term
        self.terms += 1
        term.on_lapse = lambda: self.clock.callLater(0, self._lapsed, term)
        keepalive = term.keepalive = LoopingCall(self._keep_alive, term)
        keepalive.clock = self.clock
        keepalive.start(self.timing.keepalive, now=False)
        self._arm_deadline(term)
        self.log.info(
            "cluster {cluster}: {name} won the election (revision {revision}); taking over",
            cluster=self.cluster,
            name=self.name,
            revision=term.revision,
        )
        self._take_over(term)

    @_machine.output()
    def _announce(self) -> None:
        self.role = LEADER
        term = self.term
        assert term is not None
        self.log.info("cluster {cluster}: {name} leads and serves", cluster=self.cluster, name=self.name)
        self.on_serving(term.server)
        leading, self._leading = self._leading, []
        for waiting in leading:
            waiting.callback(None)

    @_machine.output()
    def _step_down(self, why: str) -> None:
        self.log.warn("cluster {cluster}: {name} steps down: {why}", cluster=self.cluster, name=self.name, why=why)
        self._end_term().addBoth(lambda _: None)

    @_machine.output()
    def _look_later(self, why: str) -> None:
        self._schedule(self.timing.retry)

    @_machine.output()
    def _stop_looking(self) -> None:
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = None

    @_machine.output()
    def _resign(self) -> Deferred[None]:
        self.log.info("cluster {cluster}: {name} resigns", cluster=self.cluster, name=self.name)
        return self._end_term()

    @_machine.output()
    def _give_back(self, term: Term) -> None:
        """Won after all, but stopping: let the lease go."""
        self.etcd.revoke(term.lease).addErrback(lambda _: None)

    @_machine.output()
    def _nothing(self) -> Deferred[None]:
        return succeed(None)

    idle.upon(start, enter=standing_by, outputs=[_look_now])
    standing_by.upon(won, enter=taking_over, outputs=[_begin_term])
    standing_by.upon(stop, enter=stopped, outputs=[_stop_looking, _nothing], collector=lambda outs: list(outs)[-1])
    taking_over.upon(serving, enter=leading, outputs=[_announce])
    taking_over.upon(deposed, enter=standing_by, outputs=[_step_down, _look_later])
    taking_over.upon(stop, enter=stopped, outputs=[_resign], collector=lambda outs: list(outs)[-1])
    leading.upon(deposed, enter=standing_by, outputs=[_step_down, _look_later])
    leading.upon(stop, enter=stopped, outputs=[_resign], collector=lambda outs: list(outs)[-1])
    stopped.upon(won, enter=stopped, outputs=[_give_back])
    stopped.upon(deposed, enter=stopped, outputs=[])
    idle.upon(stop, enter=stopped, outputs=[_nothing], collector=lambda outs: list(outs)[-1])

    # -- the service ------------------------------------------------------------

    def listening_everywhere(self) -> None:
        self.log.info(
            "cluster {cluster}: {name} joins, as a standby (lease TTL {ttl} s)",
            cluster=self.cluster,
            name=self.name,
            ttl=self.timing.ttl,
        )
        self.start()

    def stopService(self) -> Deferred[None]:
        """Resign (if leading), then stop the metrics listeners; a completed stop exits with status 0."""
        ignore_further_stop_signals(self.clock, self.log)
        stopped: Deferred[None] = self.stop()
        stopped.addBoth(lambda _: self.stop_listening())
        stopped.addBoth(lambda _: self.etcd.close())
        return stopped.addBoth(lambda _: exit_cleanly(self.clock))

    def when_leading(self) -> Deferred[None]:
        """Fires when this member next serves as leader (at once if it does)."""
        if self.role == LEADER:
            return succeed(None)
        waiting: Deferred[None] = Deferred()
        self._leading.append(waiting)
        return waiting

    @property
    def server(self) -> Any:
        """The current term's server, while leading."""
        return self.term.server if self.role == LEADER and self.term is not None else None

    # -- standing by ------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        if self._next is not None and self._next.active():
            self._next.cancel()
        self._next = self.clock.callLater(delay, self._look)

    def _look(self) -> None:
        """Is there a leader?  If not, campaign."""
        self._next = None
        self.etcd.get(self.layout.leader).addCallbacks(self._looked, self._etcd_failed)

    def _looked(self, result: Any) -> None:
        if self.running is False or self.term is not None:
            return
        _, kvs = result
        self._etcd_back()
        if kvs and _entry_member(kvs[0].value) == self.name:
            # A claim of ours that timed out here but was applied: nobody
            # serves under it, so let it go at once rather than when it expires.
            self.log.info(
                "cluster {cluster}: {name} lets go of a claim it lost track of", cluster=self.cluster, name=self.name
            )
            self.etcd.revoke(kvs[0].lease).addBoth(
                lambda _: self._schedule(0) if self.running and self.term is None else None
            )
            return
        if kvs:
            if kvs[0].value != self._leader_seen:
                self._leader_seen = kvs[0].value
                self.log.info(
                    "cluster {cluster}: {name} stands by; the leader is {leader}",
                    cluster=self.cluster,
                    name=self.name,
                    leader=kvs[0].value.decode("utf-8", "replace"),
                )
            self._schedule(self.timing.poll)
            return
        self._campaign()

    def _campaign(self) -> None:
        sent = self.monotonic()
        claimed = self.etcd.grant(self.timing.ttl)
        claimed.addCallback(self._claim, sent)
        claimed.addErrback(self._etcd_failed)

    def _claim(self, lease: Any, sent: float) -> Deferred[None]:
        lease_id, ttl = lease
        # (as public_endpoint shows them: never a TLS key's path)
        endpoints = [public_endpoint(description) for description in self.settings.ports]
        entry = json.dumps({"member": self.name, "endpoints": endpoints}).encode("utf-8")
        claim = self.etcd.txn(
            [Compare(self.layout.leader, "CREATE", 0)],
            [Put(self.layout.leader, entry, lease_id)],
            [Get(self.layout.leader)],
        )

        def decided(result: Any) -> None:
            revision = result.revision
            if not result.succeeded:
                [found] = result.responses
                if not (found and found[0].lease == lease_id and found[0].value == entry):
                    self.etcd.revoke(lease_id).addErrback(lambda _: None)
                    if self.running:
                        self._schedule(self.timing.poll)
                    return
                # The key is bound to this lease, which only this claim
                # wrote: a copy of this request, sent before the client
                # tried again, created it.  Won, at that key's revision.
                revision = found[0].create_revision
            term = Term(lease_id, ttl, revision, sent + Timing(ttl).certainty, self.monotonic)
            self.won(term)

        return claim.addCallback(decided)

    def _etcd_failed(self, reason: Failure) -> None:
        if not self._etcd_down:
            self._etcd_down = True
            self.log.warn(
                "cluster {cluster}: {name} cannot reach etcd ({error}); trying again",
                cluster=self.cluster,
                name=self.name,
                error=reason.getErrorMessage(),
            )
        if self.running and self.term is None:
            self._schedule(self.timing.retry)

    def _etcd_back(self) -> None:
        if self._etcd_down:
            self._etcd_down = False
            self.log.info("cluster {cluster}: {name} reaches etcd again", cluster=self.cluster, name=self.name)

    # -- a term -----------------------------------------------------------------

    def _take_over(self, term: Term) -> None:
        loaded = self.etcd.get(self.layout.state, prefix=True)
        loaded.addCallback(lambda result: self._start_serving(term, self.layout.load(result[1])))
        loaded.addErrback(self._could_not_serve, term)

    def _start_serving(self, term: Term, state: DurableState) -> Optional[Deferred[None]]:
        if term is not self.term or term.ended:
            return None
        now = self.clock.seconds()
        first_token = max(state.mark, int(now * 1e6))
        journal_holder: List[Journal] = []

        def journal_for(locks: Any) -> Journal:
            journal = Journal(
                self.etcd,
                self.layout,
                term.revision,
                locks,
                self.clock,
                on_failure=lambda why: self._journal_failed(term, why),
                commit_revision=state.commit_revision,
                observer=self.observer,
                on_commit=self.on_commit,
            )
            journal_holder.append(journal)
            return journal

        server = term.server = self.build(
            self.reactor, self.settings, cluster=Leadership(first_token, term.certain, journal_for, term.revision)
        )
        journal = term.journal = journal_holder[0]
        restored = restore(server, state, now, journal)
        self.log.info(
            "cluster {cluster}: restored {sessions} elock sessions holding {keys} keys and {timed} dlock timed grants",
            cluster=self.cluster,
            sessions=restored[0],
            keys=restored[1],
            timed=restored[2],
        )
        for raw in state.unreadable:
            self.log.warn("cluster {cluster}: ignored an unreadable record {key!r}", cluster=self.cluster, key=raw)
        # Every token from now on is above every token given before, and at
        # most this mark: the term's TokenMarkService starts from it.  (Read
        # after the restore, which leaves the last token at least first_token.)
        journal.mark_reached(reservation(int(now * 1e6), server.locks.last_token))
        written = journal.durable() or succeed(None)
        return written.addCallback(lambda _: self._listen(term))

    def _listen(self, term: Term) -> None:
        if term is not self.term or term.ended:
            return
        server = term.server
        server.startService()  # raises ListenFailed at once if an endpoint cannot listen
        server.when_listening().addCallbacks(
            lambda _: self._term_listens(term), self._could_not_serve, errbackArgs=(term,)
        )

    def _term_listens(self, term: Term) -> None:
        if term is self.term and not term.ended:
            self.serving()

    def _could_not_serve(self, reason: Failure, term: Term) -> None:
        if term is self.term:
            self.deposed(f"cannot serve: {reason.getErrorMessage()}")

    def _keep_alive(self, term: Term) -> None:
        sent = self.monotonic()

        def renewed(ttl_left: int) -> None:
            if term is not self.term or term.ended:
                return
            if ttl_left <= 0:
                self._lapsed(term, "etcd says the lease is gone")
                return
            term.valid_until = max(term.valid_until, sent + Timing(term.ttl).certainty)
            self._arm_deadline(term)

        def failed(reason: Failure) -> None:
            if term is self.term and not term.ended:
                self.log.warn(
                    "cluster {cluster}: keep-alive failed ({error}); steps down in {left:.1f} s unless one succeeds",
                    cluster=self.cluster,
                    error=reason.getErrorMessage(),
                    left=max(0.0, term.valid_until - self.monotonic()),
                )

        self.etcd.keepalive(term.lease).addCallbacks(renewed, failed)

    def _arm_deadline(self, term: Term) -> None:
        if term.deadline is not None and term.deadline.active():
            term.deadline.cancel()
        left = max(0.0, term.valid_until - self.monotonic())
        term.deadline = self.clock.callLater(left, self._check_certain, term)

    def _check_certain(self, term: Term) -> None:
        term.deadline = None
        if not term.certain():
            self._lapsed(term, "the lease could not be renewed in time")
        elif term is self.term:
            self._arm_deadline(term)

    def _journal_failed(self, term: Term, why: str) -> None:
        """
        A durable write failed, or a fencing token would pass the mark in
        etcd: nothing more is sent from now on, and the term ends on the
        next reactor turn (this may be called from within a grant, which
        must finish before the lock table is thrown away).
        """
        term.ended = True
        self.clock.callLater(0, self._lapsed, term, why)

    def _lapsed(self, term: Term, why: str = "the lease ran out before a reply could be sent") -> None:
        term.ended = True
        if term is self.term:
            self.deposed(why)

    def _end_term(self) -> Deferred[None]:
        """Send nothing more, drop every connection, throw the lock table away, and let the lease go."""
        term, self.term = self.term, None
        if self.role == LEADER:
            self.on_serving(None)
        self.role = STANDBY
        self._leader_seen = None
        if term is None:
            return succeed(None)
        term.ended = True
        if term.keepalive is not None and term.keepalive.running:
            term.keepalive.stop()
        if term.deadline is not None and term.deadline.active():
            term.deadline.cancel()
        if term.journal is not None:
            term.journal.stop()
        stopped: Deferred[Any] = succeed(None)
        server = term.server
        if server is not None:
            # At once, not after the listeners close: replies still in
            # Twisted's buffers must not go out now.  Only the HTTP API's
            # connections close gracefully, after its long polls are
            # answered not-granted: it wrote nothing that was not durable
            # (jesync.http.api), and "not granted" reports no change.
            for last_words in server.term_ending:
                last_words()
            graceful = 0
            for registry in server.registries:
                for connection in list(registry):
                    if getattr(connection, "answers_when_deposed", False):
                        connection.close()
                        graceful += 1
                    else:
                        connection.transport.abortConnection()
            if server.running:
                server.grace = HTTP_STEP_DOWN_GRACE if graceful else 0
                stopped = server.stopService()
            stopped.addBoth(lambda _: abandon(server))
        # Revoking deletes the election key: a standby need not wait out the lease.
        stopped.addBoth(lambda _: self.etcd.revoke(term.lease))
        return stopped.addErrback(
            lambda reason: self.log.info(
                "cluster {cluster}: the lease was not revoked ({error}); it runs out by itself",
                cluster=self.cluster,
                error=reason.getErrorMessage(),
            )
        )


def _entry_member(value: bytes) -> Optional[str]:
    """The member an election key's value names (None: not one of ours)."""
    try:
        member = json.loads(value).get("member")
    except (ValueError, AttributeError):
        return None
    return member if isinstance(member, str) else None


@dataclass
class Leadership:
    """
    What a term's server needs from its member (L{jesync.server.build_server}'s C{cluster}).

    @ivar first_token: every fencing token is above it.
    @ivar serving: whether the member may still answer (checked before every reply).
    @ivar journal_for: the term's journal, for the server's lock table.
    @ivar term: the term's number as the cluster knows it (its election
        key's revision in etcd: larger for every later term).
    """

    first_token: int
    serving: Callable[[], bool]
    journal_for: Callable[[Any], Journal]
    term: Optional[int] = None


def restore(server: Any, state: DurableState, now: float, journal: Journal) -> tuple:
    """
    Put the durable state into a new term's server: each elock session
    detached (its grace period starting now) with its keys, and each dlock
    timed grant until its release time; every grant keeps its token.  A
    session's grant keeps its mode, C{max_concurrent} and value too, and
    its expiry (the time left of it: the wall time it was due, less now).
    A grant past its time is not restored and its record is deleted: a
    timed grant's, and by the same rule a session grant whose expiry
    passed during the takeover (restored only to expire at once, it would
    tell the new leader's watchers of the expiry of a grant they never saw
    granted; either way its key is free).  Returns (sessions, their keys,
    timed grants) restored.

    The lock table's last token is left as it was before (the term's first
    token) or, if a restored token is larger, that one: a restored grant is
    given the next token and then keeps its own, so without this the last
    token would be one higher per grant restored, and a term restoring more
    grants than the room reserved above it (L{jesync.fencing.ROOM}) would
    pass its mark on its first grant; and tokens would run further ahead
    of the clock with every takeover.
    """
    locks = server.locks
    last_token = locks.last_token
    sessions = server.factories["elock"].sessions
    keys = 0
    for record in state.sessions:
        session = sessions.restore(record.session_id, record.grace_ms)
        for key in record.keys:
            held = record.grant(key)
            expires = 0.0
            if held.expires_at_us is not None:
                expires = held.expires_at_us / 1e6 - now
                if expires <= 0:
                    journal.held_changed(session, key)  # (not restored: its record goes)
                    continue
            if _restore_grant(locks, key, session, expires, held.token, held.mode, held.max_concurrent, held.value):
                keys += 1
                last_token = max(last_token, held.token)
        journal.session_changed(session)
    timed = 0
    for timed_record in state.timed:
        left = timed_record.release_us / 1e6 - now
        # (an owner each: together they are no client's, and no limit of one owner's applies)
        owner = TimedGrants("restored")
        if left > 0 and _restore_grant(locks, timed_record.key, owner, left, timed_record.token):
            timed += 1
            last_token = max(last_token, timed_record.token)
        journal.timed_changed(timed_record.key)
    locks.last_token = last_token
    return len(state.sessions), keys, timed


def _restore_grant(
    locks: Any,
    key: str,
    owner: object,
    expires: float,
    token: int,
    mode: str = EXCLUSIVE,
    max_concurrent: int = 1,
    value: Optional[bytes] = None,
) -> bool:
    """
    Grant C{key} to C{owner} again, with C{token} (C{expires}: seconds
    left, 0 never); False (logged) if the table refuses it.
    """
    try:
        grant = locks.request(key, owner, max_concurrent, 0, expires, mode, value)
    except Exception as error:  # a limit the settings set lower now
        Logger().warn("cluster: could not restore {key!r}: {error}", key=key, error=error)
        return False
    if isinstance(grant, Deferred):
        grant.addErrback(lambda _: None)
        Logger().warn("cluster: could not restore {key!r}: it is held twice in the durable state", key=key)
        return False
    grant.token = token
    return True


def abandon(server: Any) -> None:
    """
    Empty an old term's lock table: end its detached sessions and give back
    every grant (dlock timed grants too), so none of its timers keeps it
    alive, unseen by the metrics of the terms after it.
    """
    locks = server.locks
    locks.observer = None
    elock = server.factories.get("elock")
    if elock is not None:
        elock.sessions.end_detached()
    for status in locks.listing():
        for grant in locks.holders(status.key):
            locks.release_all(grant.owner)
