"""
The state that must outlive the leader, written to etcd before the replies
that depend on it, in group commits.

What is durable (everything else ends with a failover, exactly as with a
disconnect):

 - B{elock sessions that hold keys}: C{sessions/<id>} = the session's grace
   period and its keys, each with its fencing token.  A session holding
   nothing needs no record: C{conn_id <id>} on the new leader starts it
   again under the same id.
 - B{dlock grants with C{release_micro}}: C{timed/<key>} = when the grant
   ends (wall time, microseconds) and its token.
 - B{The fencing-token high-water mark}: C{fencing-mark}, kept ahead of the
   tokens in blocks (L{jesync.fencing}), so most grants need no write.

The rule: a change marks its session or key I{dirty} (the lock service
tells this journal of every grant, release and expiry, as its observer;
the grammars tell it of renewals and switches).  Once per reactor turn the
dirty records are read from the lock table as they are then, and written
in as few etcd transactions as etcd's limits allow (L{MAX_OPS} operations,
L{MAX_BYTES} bytes each): a turn's hundred lock requests cost one round
trip, not a hundred.  One batch is in flight at a time, so batches commit
in the order they were cut.  A reply that depends on durable state is sent
once L{Journal.durable} fires: everything dirtied before it is then in
etcd.

Every transaction is guarded by the election key's revision: a deposed
leader's late write fails instead of landing after its successor has read
the state; a failed or refused write ends the leadership (C{on_failure}).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple, Union

from twisted.internet.defer import Deferred, DeferredList, FirstError, fail
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from zope.interface import implementer

from jesync.cluster.etcd import Compare, Delete, EtcdClient, Get, Put, TxnResult
from jesync.interfaces import IGrant, ILockObserver, ILockService
from jesync.protocols.dlock import TimedGrants
from jesync.sessions import Session

#: etcd's default --max-txn-ops.
MAX_OPS = 128
#: What one transaction may carry, in key and value bytes: etcd's default
#: --max-request-bytes is 1.5 MiB, and the JSON gateway base64-encodes both.
MAX_BYTES = 1024 * 1024

Operation = Union[Put, Delete]


class Deposed(Exception):
    """A durable write was refused: this member is no longer the leader."""


def encode_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def decode_key(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


@dataclass
class SessionRecord:
    """A session as written: its grace period and its keys with their tokens."""

    session_id: str
    grace_ms: int
    keys: Dict[str, int]

    def encode(self) -> bytes:
        return json.dumps({"grace_ms": self.grace_ms, "keys": self.keys}, sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, session_id: str, value: bytes) -> SessionRecord:
        data = json.loads(value)
        return cls(session_id, int(data["grace_ms"]), {str(key): int(token) for key, token in data["keys"].items()})


@dataclass
class TimedRecord:
    """A dlock grant with C{release_micro}: when it ends (wall time, microseconds) and its token."""

    key: str
    release_us: int
    token: int

    def encode(self) -> bytes:
        return json.dumps({"release_us": self.release_us, "token": self.token}).encode("utf-8")

    @classmethod
    def decode(cls, key: str, value: bytes) -> TimedRecord:
        data = json.loads(value)
        return cls(key, int(data["release_us"]), int(data["token"]))


@dataclass
class DurableState:
    """Everything the journal keeps, as the next leader reads it."""

    mark: int = 0
    sessions: List[SessionRecord] = field(default_factory=list)
    timed: List[TimedRecord] = field(default_factory=list)
    # Records that could not be read (logged and deleted by the new leader).
    unreadable: List[bytes] = field(default_factory=list)


class Layout:
    """Where a cluster keeps its keys in etcd: everything under C{/jesync/<cluster>/}."""

    def __init__(self, cluster: str) -> None:
        self.prefix = b"/jesync/" + cluster.encode("utf-8") + b"/"
        self.leader = self.prefix + b"leader"
        self.state = self.prefix + b"state/"
        self.sessions = self.state + b"sessions/"
        self.timed = self.state + b"timed/"
        self.mark = self.state + b"fencing-mark"

    def session(self, session_id: str) -> bytes:
        return self.sessions + encode_key(session_id)

    def timed_key(self, key: str) -> bytes:
        return self.timed + encode_key(key)

    def load(self, kvs: List[Tuple[bytes, bytes]]) -> DurableState:
        """The durable state from what etcd holds under C{state/}."""
        state = DurableState()
        for raw, value in kvs:
            try:
                if raw == self.mark:
                    state.mark = int(value)
                elif raw.startswith(self.sessions):
                    state.sessions.append(SessionRecord.decode(decode_key(raw[len(self.sessions) :]), value))
                elif raw.startswith(self.timed):
                    state.timed.append(TimedRecord.decode(decode_key(raw[len(self.timed) :]), value))
                else:
                    state.unreadable.append(raw)
            except (ValueError, KeyError, TypeError, AttributeError):
                state.unreadable.append(raw)
        return state


@implementer(ILockObserver)
class Journal:
    """
    The durable state of one leadership term, written to etcd in group commits.

    @param etcd: where it is written.
    @param layout: the cluster's keys.
    @param revision: the election key's create revision: every write is
        guarded by it.
    @param service: the lock table the records are read from.
    @param clock: schedules the commit of each reactor turn.
    @param on_failure: called once, with why, when a write fails or is
        refused (the leader must step down).
    @param observer: the lock service's other observer (metrics), told of
        every event after this journal.
    @param on_commit: called after each transaction with its operation
        count and how long it took (metrics).
    """

    def __init__(
        self,
        etcd: EtcdClient,
        layout: Layout,
        revision: int,
        service: ILockService,
        clock: IReactorTime,
        on_failure: Callable[[str], None],
        observer: Optional[ILockObserver] = None,
        on_commit: Optional[Callable[[int, float], None]] = None,
    ) -> None:
        self.etcd = etcd
        self.layout = layout
        self.revision = revision
        self.service = service
        self.clock = clock
        self.on_failure = on_failure
        self.observer = observer
        self.on_commit = on_commit
        self._sessions: Dict[str, Session] = {}
        self._timed: Set[str] = set()
        self._mark: Optional[int] = None
        self._flush_call: Optional[IDelayedCall] = None
        # Batches are numbered: cut (sent) and committed so far.
        self._cut = 0
        self._committed = 0
        self._in_flight = False
        self._waiters: List[Tuple[int, Deferred[None]]] = []
        self.failed: Optional[str] = None
        self.transactions = 0
        self.operations = 0

    # -- what changed ---------------------------------------------------------

    def session_changed(self, session: Session) -> None:
        """C{session}'s keys or grace period changed, or it ended."""
        self._sessions[session.id] = session
        self._dirtied()

    def timed_changed(self, key: str) -> None:
        """C{key}'s dlock timed grant may have begun, been renewed or ended."""
        self._timed.add(key)
        self._dirtied()

    def mark_reached(self, mark: int) -> None:
        """Keep C{mark} as the fencing-token high-water mark."""
        self._mark = mark if self._mark is None else max(mark, self._mark)
        self._dirtied()

    def _dirtied(self) -> None:
        if self._flush_call is None and not self._in_flight and self.failed is None:
            self._flush_call = self.clock.callLater(0, self._flush)

    @property
    def _dirty(self) -> bool:
        return bool(self._sessions or self._timed or self._mark is not None)

    # -- ILockObserver: marks the owners whose records change ------------------

    def _owner_changed(self, grant: IGrant) -> None:
        owner = grant.owner
        if isinstance(owner, Session):
            self.session_changed(owner)
        elif isinstance(owner, TimedGrants):
            self.timed_changed(grant.key)

    def granted(self, grant: IGrant, waited: float) -> None:
        self._owner_changed(grant)
        if self.observer is not None:
            self.observer.granted(grant, waited)

    def timed_out(self, key: str) -> None:
        if self.observer is not None:
            self.observer.timed_out(key)

    def released(self, grant: IGrant) -> None:
        self._owner_changed(grant)
        if self.observer is not None:
            self.observer.released(grant)

    def expired(self, grant: IGrant) -> None:
        self._owner_changed(grant)
        if self.observer is not None:
            self.observer.expired(grant)

    # -- waiting for durability --------------------------------------------------

    def durable(self) -> Optional[Deferred[None]]:
        """
        None if everything changed so far is in etcd; otherwise a Deferred
        that fires once it is (or fails with L{Deposed} if it never will be).
        Each caller gets a Deferred of its own, which it may cancel.
        """
        if self.failed is not None:
            return fail(Deposed(self.failed))
        if self._dirty:
            needed = self._cut + 1
        elif self._in_flight:
            needed = self._cut
        else:
            return None
        waiting: Deferred[None] = Deferred()
        self._waiters.append((needed, waiting))
        return waiting

    # -- committing --------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_call = None
        if self._in_flight or not self._dirty or self.failed is not None:
            return
        operations = self._operations()
        self._cut += 1
        batch = self._cut
        self._in_flight = True
        started = self.clock.seconds()
        sent = [self._send(chunk) for chunk in self._chunks(operations)]
        DeferredList(sent, fireOnOneErrback=True, consumeErrors=True).addCallbacks(
            self._committed_batch, self._failed_batch, (batch, len(operations), started)
        ).addErrback(self._broken)

    def _operations(self) -> List[Operation]:
        """The dirty records as the lock table has them now, as etcd operations."""
        layout = self.layout
        operations: List[Operation] = []
        sessions, self._sessions = self._sessions, {}
        for session_id, session in sessions.items():
            grants = self.service.grants_of(session)  # (none once it has ended)
            if grants:
                record = SessionRecord(session_id, session.grace_ms, {grant.key: grant.token for grant in grants})
                operations.append(Put(layout.session(session_id), record.encode()))
            else:
                operations.append(Delete(layout.session(session_id)))
        timed, self._timed = self._timed, set()
        for key in sorted(timed):
            grant = next((grant for grant in self.service.holders(key) if isinstance(grant.owner, TimedGrants)), None)
            if grant is not None and grant.expires_at is not None:
                timed_record = TimedRecord(key, int(grant.expires_at * 1e6), grant.token)
                operations.append(Put(layout.timed_key(key), timed_record.encode()))
            else:
                operations.append(Delete(layout.timed_key(key)))
        if self._mark is not None:
            operations.append(Put(layout.mark, b"%d" % self._mark))
            self._mark = None
        return operations

    def _chunks(self, operations: List[Operation]) -> List[List[Operation]]:
        """The operations in transactions within etcd's limits."""
        chunks: List[List[Operation]] = [[]]
        size = 0
        for operation in operations:
            cost = len(operation.key) + len(getattr(operation, "value", b""))
            if chunks[-1] and (len(chunks[-1]) >= MAX_OPS or size + cost > MAX_BYTES):
                chunks.append([])
                size = 0
            chunks[-1].append(operation)
            size += cost
        return chunks

    def _send(self, operations: List[Operation]) -> Deferred[TxnResult]:
        guard = [Compare(self.layout.leader, "CREATE", self.revision)]
        self.transactions += 1
        self.operations += len(operations)
        return self.etcd.txn(guard, operations, [Get(self.layout.leader)])

    def _committed_batch(self, results: List[Tuple[bool, TxnResult]], batch: int, count: int, started: float) -> None:
        self._in_flight = False
        if self.failed is not None:
            return
        if not all(result.succeeded for _, result in results):
            self._failed_batch(Failure(Deposed("the election key is gone or another member's")), batch, count, started)
            return
        if self.on_commit is not None:
            self.on_commit(count, self.clock.seconds() - started)
        self._committed = batch
        ready = [waiting for needed, waiting in self._waiters if needed <= batch]
        self._waiters = [(needed, waiting) for needed, waiting in self._waiters if needed > batch]
        for waiting in ready:
            if not waiting.called:
                waiting.callback(None)
        if self._dirty:
            self._flush()

    def _failed_batch(self, reason: Failure, *ignored: object) -> None:
        self._in_flight = False
        error = reason.value
        if isinstance(error, FirstError):  # (from the DeferredList)
            error = error.subFailure.value
        self.fail(f"a durable write failed: {error}")

    def _broken(self, reason: Failure) -> None:
        """A bug here must not leave replies waiting forever: fail as if etcd had."""
        self.fail(f"the journal failed: {reason.getErrorMessage()}")

    def stop(self) -> None:
        """Write nothing more (the term is over): replies still waiting are never sent."""
        if self.failed is None:
            self.failed = "the term is over"
            self._end()

    def fail(self, why: str) -> None:
        """A write failed: write nothing more, tell C{on_failure} (which ends the term), then the waiting replies."""
        if self.failed is None:
            self.failed = why
            self.on_failure(why)
            self._end()

    def _end(self) -> None:
        """Every reply waiting for durability fails with L{Deposed}."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        waiters, self._waiters = self._waiters, []
        for _, waiting in waiters:
            if not waiting.called:
                waiting.errback(Failure(Deposed(self.failed or "")))


class JournalMark:
    """The fencing-token mark kept in etcd, for L{jesync.fencing.TokenMarkService}: written with the next commit."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.path = "etcd " + journal.layout.mark.decode("utf-8", "replace")

    def write(self, mark: int) -> None:
        self.journal.mark_reached(mark)
