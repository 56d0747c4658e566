"""
The state that must outlive the leader, written to etcd before the replies
that depend on it, in group commits.

What is durable (everything else ends with a failover, exactly as with a
disconnect), under C{/jesync/<cluster>/state/}:

 - B{Sessions} (elock's, and the HTTP API's, which are the same):
   C{sessions/<id>} = the session's grace period, written when it first
   holds a key and deleted when it ends; and one C{held/<id>/<key>} per key
   held (so a lock or an unlock writes one small value, however many keys
   the session holds), in one of two forms (L{HeldRecord}): the fencing
   token alone, as a decimal integer, for a grant with the defaults
   (exclusive, C{max_concurrent} 1, no expiry, no value: every elock
   grant, and every record written before grants had more); or a JSON
   object with the token and whatever is not a default (mode,
   C{max_concurrent}, the value in base64, the expiry as wall time in
   microseconds, as C{timed/<key>} has it).  So a session grant's expiry,
   mode and value survive a failover.  Ids are written base64url, so any
   id fits.  A session that never held a key has no record: C{conn_id
   <id>} on the new leader starts it again under the same id.
 - B{dlock grants with C{release_micro}}: C{timed/<key>} = when the grant
   ends (wall time, microseconds) and its token.
 - B{The fencing-token high-water mark}: C{fencing-mark}, reserved a few
   seconds ahead of the clock and renewed every few seconds
   (L{jesync.fencing}), so no grant needs a write.

The rule: a change marks its record I{dirty} (the lock service tells this
journal of every grant, release and expiry, as its observer; the grammars
tell it of renewals, switches and grace periods, as L{IOwnerChanges}: a
session grant renewed with an expiry or a value is C{held_changed}).  Once
per reactor turn the dirty records are read from the lock table as they
are then, and written in
as few etcd transactions as etcd's limits allow (L{MAX_OPS} operations,
L{MAX_BYTES} bytes each): a turn's hundred lock requests cost one round
trip, not a hundred.  A reply that depends on durable state is sent once
L{Journal.durable} fires: everything dirtied before it is then in etcd.

The transactions of a term are a chain, and up to L{MAX_IN_FLIGHT} are in
flight at once (a turn does not wait for the round trip of the one
before).  Every transaction is guarded twice: by the election key's
create revision (a deposed leader's late write fails instead of landing
after its successor has read the state), and by the commit key's value,
which must be the tag of the transaction before it (the term's first: the
commit key's mod revision when the term began); it writes its own tag
there (C{<election revision>:<batch>:<chunk>}, written once).  So each
applies only right after its predecessor: what is in etcd is always a
prefix of the chain, an answer that one is in etcd says that every one
before it is, and batches are released in order.  A copy of an older
transaction that etcd applies late (after the client retried it) finds a
later tag and fails.  A refused transaction whose commit key held an
earlier tag of this chain reached etcd before its predecessor: it is sent
again once that one is in etcd (no refusal); one that held its own tag or
a later one was applied already (a copy).  Anything else -- the election
key gone or another member's, the commit key written by anyone else, no
answer for one not known to be in etcd -- ends the leadership
(C{on_failure}); no answer for one a later one's success showed in etcd
is no failure.  docs/cluster.md has the
argument.  Transactions go through L{jesync.cluster.txn_channel} (one
connection, pipelined, so they reach etcd in order), and through the
L{EtcdClient} when it gets no answer or etcd's "unavailable" (no leader
for a moment): the client tries again within its deadline, so an etcd
election is waited out (a copy that lands late is harmless, above).
"""

from __future__ import annotations

import base64
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple, Union

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure
from zope.interface import implementer

from jesync.cluster.etcd import Compare, Delete, EtcdClient, EtcdUnavailable, Get, KeyValue, Put, TxnResult
from jesync.cluster.txn_channel import ChannelError, TxnChannel
from jesync.connections.policy import IDurability
from jesync.fencing import IDurableMark
from jesync.interfaces import IGrant, ILockObserver, ILockService, IOwnerChanges
from jesync.sessions import DEFAULT_GRACE_MS, Session, TimedGrants
from jesync.wire import EXCLUSIVE, SHARED

#: etcd's default --max-txn-ops, less the write of C{commit} every transaction carries.
MAX_OPS = 127
#: What one transaction may carry, in key and value bytes: etcd's default
#: --max-request-bytes is 1.5 MiB, and the JSON gateway base64-encodes both.
MAX_BYTES = 1024 * 1024
#: Transactions of the chain awaiting etcd's answer at once (and batches
#: cut ahead of the last one known to be in etcd).
MAX_IN_FLIGHT = 8

Operation = Union[Put, Delete]

# A transaction of the chain: cut, not yet sent; awaiting etcd's answer;
# answered early (it reached etcd before its predecessor: sent again once
# that one is in etcd).
_NEW = "new"
_OUT = "out"
_EARLY = "early"
# L{Journal._refused}'s verdict on a transaction that reached etcd before its predecessor.
_SEND_AGAIN = object()


class _Link:
    """
    One transaction of a term's chain: its place (batch, chunk), its tag,
    its guard on the commit key (the tag of the one before it, or for the
    term's first the commit key's revision), its operations, and for a
    batch's last one (started, operation count, mark) to report once the
    batch is in etcd.
    """

    __slots__ = ("position", "tag", "guard", "operations", "last", "state", "floor")

    def __init__(self, position: Tuple[int, int], tag: bytes, guard: Compare, operations: List[Operation]) -> None:
        self.position = position
        self.tag = tag
        self.guard = guard
        self.operations = operations
        self.last: Optional[Tuple[float, int, Optional[int]]] = None
        self.state = _NEW
        # The last position known to be in etcd when it was sent.
        self.floor = (0, 0)


class Deposed(Exception):
    """A durable write was refused: this member is no longer the leader."""


def encode_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def decode_key(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def encode_id(session_id: str) -> bytes:
    """A session id as a path segment: base64url, without padding (an id may hold any byte, C{/} too)."""
    return base64.urlsafe_b64encode(encode_key(session_id)).rstrip(b"=")


def decode_id(raw: bytes) -> str:
    return decode_key(base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4)))


@dataclass
class HeldRecord:
    """
    A session's grant of one key, as C{held/<id>/<key>} keeps it.

    Two forms.  A grant with the defaults (exclusive, C{max_concurrent} 1,
    no expiry, no value) is its token alone, C{b"1700000000000001"}: what
    every elock grant writes, as before, so records written before grants
    had more still load.  Any other is a JSON object: C{token} always, then
    only what is not a default: C{mode} (C{"shared"}), C{max_concurrent},
    C{value} (the bytes in standard base64: a value is any bytes, not
    text) and C{expires_at_us} (when its failsafe releases it: wall time in
    microseconds, as C{timed/<key>}'s C{release_us}).  A reader ignores
    fields it does not know.
    """

    token: int
    mode: str = EXCLUSIVE
    max_concurrent: int = 1
    value: Optional[bytes] = None
    expires_at_us: Optional[int] = None

    @classmethod
    def of(cls, grant: IGrant) -> HeldRecord:
        """The record of C{grant} as the lock table has it now."""
        expires_at = grant.expires_at
        return cls(
            grant.token,
            SHARED if grant.mode == SHARED else EXCLUSIVE,
            grant.max_concurrent,
            grant.value,
            None if expires_at is None else int(expires_at * 1e6),
        )

    @property
    def plain(self) -> bool:
        """Whether it has the defaults (and is written as its token alone)."""
        return (
            self.mode == EXCLUSIVE and self.max_concurrent == 1 and self.value is None and self.expires_at_us is None
        )

    def encode(self) -> bytes:
        if self.plain:
            return b"%d" % self.token
        data: Dict[str, Any] = {"token": self.token}
        if self.mode != EXCLUSIVE:
            data["mode"] = self.mode
        if self.max_concurrent != 1:
            data["max_concurrent"] = self.max_concurrent
        if self.value is not None:
            data["value"] = base64.b64encode(self.value).decode("ascii")
        if self.expires_at_us is not None:
            data["expires_at_us"] = self.expires_at_us
        return json.dumps(data, separators=(",", ":")).encode("utf-8")

    @classmethod
    def decode(cls, raw: bytes) -> HeldRecord:
        """
        Either form.

        @raise ValueError: (or KeyError, TypeError) if it is neither, or
            names an unknown mode.
        """
        if not raw.lstrip().startswith(b"{"):
            return cls(int(raw))
        data = json.loads(raw)
        mode = data.get("mode", EXCLUSIVE)
        if mode not in (EXCLUSIVE, SHARED):
            raise ValueError(f"unknown mode {mode!r}")
        value = data.get("value")
        expires_at_us = data.get("expires_at_us")
        return cls(
            _integer(data["token"]),
            SHARED if mode == SHARED else EXCLUSIVE,
            _integer(data.get("max_concurrent", 1)),
            None if value is None else base64.b64decode(value.encode("ascii"), validate=True),
            None if expires_at_us is None else _integer(expires_at_us),
        )


def _integer(value: Any) -> int:
    """A JSON integer (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


@dataclass
class SessionRecord:
    """
    A session as the next leader reads it: its grace period and its keys
    with their tokens (C{keys}); C{grants} has the full record of every key
    that has one (a key only in C{keys} has the defaults).
    """

    session_id: str
    grace_ms: int
    keys: Dict[str, int]
    grants: Dict[str, HeldRecord] = field(default_factory=dict)

    def grant(self, key: str) -> HeldRecord:
        """The record of C{key}'s grant (one of C{keys})."""
        return self.grants.get(key) or HeldRecord(self.keys[key])


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
    # The mod revision of the commit key (0: none yet): the next term's first guard.
    commit_revision: int = 0
    # Records that could not be read (logged, and left alone).
    unreadable: List[bytes] = field(default_factory=list)


class Layout:
    """Where a cluster keeps its keys in etcd: everything under C{/jesync/<cluster>/}."""

    def __init__(self, cluster: str) -> None:
        self.prefix = b"/jesync/" + cluster.encode("utf-8") + b"/"
        self.leader = self.prefix + b"leader"
        self.state = self.prefix + b"state/"
        self.sessions = self.state + b"sessions/"
        self.held = self.state + b"held/"
        self.timed = self.state + b"timed/"
        self.mark = self.state + b"fencing-mark"
        self.commit = self.state + b"commit"

    def session(self, session_id: str) -> bytes:
        return self.sessions + encode_id(session_id)

    def held_by(self, session_id: str) -> bytes:
        """The prefix of a session's keys."""
        return self.held + encode_id(session_id) + b"/"

    def held_key(self, session_id: str, key: str) -> bytes:
        return self.held_by(session_id) + encode_key(key)

    def timed_key(self, key: str) -> bytes:
        return self.timed + encode_key(key)

    def load(self, kvs: Iterable[KeyValue]) -> DurableState:
        """
        The durable state from what etcd holds under C{state/}: every
        session with a record (holding keys or not: it ends, and its record
        goes, when its grace period is over).  A session's keys without its
        grace period (a batch cut short between two of its transactions) get
        the default grace period.
        """
        state = DurableState()
        grace: Dict[str, int] = {}
        held: Dict[str, Dict[str, HeldRecord]] = {}
        for kv in kvs:
            raw, value = kv.key, kv.value
            try:
                if raw == self.mark:
                    state.mark = int(value)
                elif raw == self.commit:
                    state.commit_revision = kv.mod_revision
                elif raw.startswith(self.sessions):
                    grace[decode_id(raw[len(self.sessions) :])] = int(json.loads(value)["grace_ms"])
                elif raw.startswith(self.held):
                    encoded, slash, key = raw[len(self.held) :].partition(b"/")
                    if not slash:
                        raise ValueError("no key")
                    held.setdefault(decode_id(encoded), {})[decode_key(key)] = HeldRecord.decode(value)
                elif raw.startswith(self.timed):
                    state.timed.append(TimedRecord.decode(decode_key(raw[len(self.timed) :]), value))
                else:
                    state.unreadable.append(raw)
            except (ValueError, KeyError, TypeError, AttributeError):
                state.unreadable.append(raw)
        for session_id in {**grace, **held}:
            grants = held.get(session_id, {})
            keys = {key: record.token for key, record in grants.items()}
            state.sessions.append(
                SessionRecord(session_id, grace.get(session_id, DEFAULT_GRACE_MS), keys, grants)
            )
        return state


@implementer(ILockObserver, IOwnerChanges, IDurability)
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
    @param commit_revision: the commit key's mod revision when the term
        began (L{DurableState.commit_revision}).
    @param observer: the lock service's other observer (metrics), told of
        every event after this journal.
    @param on_commit: called after each batch with its operation count and
        how long it took (metrics).
    @param channel: if not None, transactions go through it
        (L{jesync.cluster.txn_channel}), and through C{etcd} only when it
        gets no answer; by default one beside C{etcd}, if that is an
        L{EtcdClient} with C{http://} endpoints.
    """

    def __init__(
        self,
        etcd: EtcdClient,
        layout: Layout,
        revision: int,
        service: ILockService,
        clock: IReactorTime,
        on_failure: Callable[[str], None],
        commit_revision: int = 0,
        observer: Optional[ILockObserver] = None,
        on_commit: Optional[Callable[[int, float], None]] = None,
        channel: Union[TxnChannel, None, str] = "beside",
    ) -> None:
        self.etcd = etcd
        self.layout = layout
        self.revision = revision
        self.service = service
        self.clock = clock
        self.on_failure = on_failure
        self.commit_revision = commit_revision
        self.observer = observer
        self.on_commit = on_commit
        # Dirty records: sessions (whether they hold anything, their grace
        # period), the keys they hold, timed grants, the mark.
        self._sessions: Dict[str, Session] = {}
        self._held: Dict[Tuple[str, str], Session] = {}
        # Sessions whose record (their grace period) is written or being written.
        self._recorded: Set[str] = set()
        self._timed: Set[str] = set()
        self._mark: Optional[int] = None
        #: The largest fencing-token mark committed in this term (0: none yet).
        self.committed_mark = 0
        self._flush_call: Optional[IDelayedCall] = None
        # The waiting replies failing, once this journal failed (L{fail}).
        self._end_call: Optional[IDelayedCall] = None
        # Batches are numbered: cut (sent) and committed so far.
        self._cut = 0
        self._committed = 0
        self._waiters: List[Tuple[int, Deferred[None]]] = []
        # The chain: the transactions cut and not yet known to be in etcd, in
        # order; how many of them are awaiting etcd's answer; the position of
        # the last one known to be in etcd (every one before it is too); the
        # tag of the last one cut (None: none yet, the next is guarded by
        # the commit key's revision when the term began).
        self._chain: Deque[_Link] = deque()
        self._unsent: Deque[_Link] = deque()
        # The transactions that came back early, to send again in order.
        self._resend: Deque[_Link] = deque()
        self._pumping = False
        self._outstanding = 0
        self._applied: Tuple[int, int] = (0, 0)
        self._previous: Optional[bytes] = None
        self._start_revision = commit_revision
        self._own = b"%d:" % revision
        self.channel: Optional[TxnChannel] = TxnChannel.beside(etcd) if isinstance(channel, str) else channel
        self.failed: Optional[str] = None
        # Transactions of the chain and their operations; transactions sent
        # again because they reached etcd before their predecessor.
        self.transactions = 0
        self.operations = 0
        self.resent = 0

    # -- what changed ---------------------------------------------------------

    def session_changed(self, session: Session) -> None:
        """C{session}'s grace period changed."""
        self._sessions[session.id] = session
        self._dirtied()

    def session_ended(self, session: Session) -> None:
        """C{session} ended (its keys are released): its record goes, if it has one."""
        if session.id in self._recorded or session.id in self._sessions:
            self.session_changed(session)

    def held_changed(self, session: Session, key: str) -> None:
        """
        C{session} took or gave back C{key}, or renewed it (a new expiry or
        value: L{IOwnerChanges}); its first key writes its record too.
        """
        self._held[(session.id, key)] = session
        if session.id not in self._recorded:
            self._sessions[session.id] = session
        self._dirtied()

    def timed_changed(self, key: str) -> None:
        """C{key}'s dlock timed grant may have begun, been renewed or ended."""
        self._timed.add(key)
        self._dirtied()

    def mark_reached(self, mark: int) -> None:
        """Keep C{mark} as the fencing-token high-water mark (one not above the committed mark is ignored)."""
        if mark <= self.committed_mark:
            return
        self._mark = mark if self._mark is None else max(mark, self._mark)
        self._dirtied()

    def _dirtied(self) -> None:
        if self._flush_call is None and len(self._chain) < MAX_IN_FLIGHT and self.failed is None:
            self._flush_call = self.clock.callLater(0, self._flush)

    @property
    def _dirty(self) -> bool:
        return bool(self._sessions or self._held or self._timed or self._mark is not None)

    # -- ILockObserver: marks the records that change ----------------------------

    def _owner_changed(self, grant: IGrant) -> None:
        owner = grant.owner
        if isinstance(owner, Session):
            self.held_changed(owner, grant.key)
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
        elif self._chain:
            needed = self._cut
        else:
            return None
        waiting: Deferred[None] = Deferred()
        self._waiters.append((needed, waiting))
        return waiting

    # -- committing --------------------------------------------------------------

    def _flush(self) -> None:
        """Cut a batch of what is dirty now, if the chain has room for it."""
        self._flush_call = None
        if not self._dirty or self.failed is not None or len(self._chain) >= MAX_IN_FLIGHT:
            return
        started = self.clock.seconds()
        mark = self._mark
        operations = self._operations()
        self._cut += 1
        batch = self._cut
        chunks = self._chunks(operations)
        for number, chunk in enumerate(chunks):
            tag = b"%d:%d:%d" % (self.revision, batch, number)
            if self._previous is None:
                guard = Compare(self.layout.commit, "MOD", self._start_revision)
            else:
                guard = Compare(self.layout.commit, "VALUE", self._previous)
            self._previous = tag
            link = _Link((batch, number), tag, guard, chunk)
            if number == len(chunks) - 1:
                link.last = (started, len(operations), mark)
            self._chain.append(link)
            self._unsent.append(link)
        self._pump()

    def _operations(self) -> List[Operation]:
        """The dirty records as the lock table has them now, as etcd operations."""
        layout = self.layout
        operations: List[Operation] = []
        sessions, self._sessions = self._sessions, {}
        held, self._held = self._held, {}
        gone: Set[str] = set()
        for session_id, session in sessions.items():
            # A session's record lasts as long as the session (a lock and an
            # unlock then write one key each), once it has held a key.
            if session.live:
                self._recorded.add(session_id)
                grace = json.dumps({"grace_ms": session.grace_ms}).encode("utf-8")
                operations.append(Put(layout.session(session_id), grace))
            else:
                self._recorded.discard(session_id)
                gone.add(session_id)
                operations.append(Delete(layout.session(session_id)))
                operations.append(Delete(layout.held_by(session_id), prefix=True))
        for (session_id, key), session in held.items():
            if session_id in gone:
                continue
            grant = self.service.grant_of(key, session)
            if grant is not None:
                operations.append(Put(layout.held_key(session_id, key), HeldRecord.of(grant).encode()))
            else:
                operations.append(Delete(layout.held_key(session_id, key)))
        timed, self._timed = self._timed, set()
        for key in sorted(timed):
            holder = next((grant for grant in self.service.holders(key) if isinstance(grant.owner, TimedGrants)), None)
            if holder is not None and holder.expires_at is not None:
                record = TimedRecord(key, int(holder.expires_at * 1e6), holder.token)
                operations.append(Put(layout.timed_key(key), record.encode()))
            else:
                operations.append(Delete(layout.timed_key(key)))
        if self._mark is not None:
            operations.append(Put(layout.mark, b"%d" % self._mark))
            self._mark = None
        return operations

    @staticmethod
    def _chunks(operations: List[Operation]) -> List[List[Operation]]:
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

    def _pump(self) -> None:
        """
        Send what may go now, in chain order: the first transaction again if
        it came back early (with every later one that did), then new ones,
        up to L{MAX_IN_FLIGHT} awaiting an answer, those sent again
        included.  (Not re-entered: an answer given at once, within a send,
        is taken in by the loop.)
        """
        if self._pumping:
            return
        self._pumping = True
        try:
            chain, unsent, resend = self._chain, self._unsent, self._resend
            while self.failed is None and self._outstanding < MAX_IN_FLIGHT:
                if chain and chain[0].state is _EARLY:
                    # Its predecessor is in etcd: it goes again, and every
                    # other one that came back early after it, in order
                    # (before any new one, as places in flight come free).
                    resend.clear()
                    resend.extend(link for link in chain if link.state is _EARLY)
                if resend:
                    link = resend.popleft()
                    if link.position > self._applied and link.state is _EARLY:
                        self._send(link)
                elif unsent:
                    self._send(unsent.popleft())
                else:
                    return
        finally:
            self._pumping = False

    def _send(self, link: _Link) -> None:
        if link.state is _NEW:
            self.transactions += 1
            self.operations += len(link.operations)
        else:
            self.resent += 1
        link.state = _OUT
        link.floor = self._applied
        self._outstanding += 1
        guards = [Compare(self.layout.leader, "CREATE", self.revision), link.guard]
        success = [*link.operations, Put(self.layout.commit, link.tag)]
        failure = [Get(self.layout.leader), Get(self.layout.commit)]
        if self.channel is None:
            sent = self.etcd.txn(guards, success, failure)
        else:
            sent = self.channel.txn(guards, success, failure)
            # No answer on the lean path: the same transaction again through
            # the client, which tries every endpoint (a copy that lands late
            # is harmless: the chain lets each apply only once, in order).
            sent.addErrback(self._again, guards, success, failure)
        sent.addCallbacks(self._answered, self._lost, callbackArgs=(link,), errbackArgs=(link,))
        sent.addErrback(self._broken)

    def _again(self, reason: Failure, guards: List[Compare], success: List[Any], failure: List[Get]) -> Any:
        # No answer, or etcd's "unavailable" (no leader for a moment): the
        # client tries again within its deadline, an election waited out.
        reason.trap(ChannelError, EtcdUnavailable)
        if self.failed is not None:
            return reason
        return self.etcd.txn(guards, success, failure)

    def _answered(self, result: TxnResult, link: _Link) -> None:
        self._outstanding -= 1
        if self.failed is not None:
            return
        if result.succeeded:
            self.commit_revision = max(self.commit_revision, result.revision)
        verdict = self._refused(result, link)
        if verdict is _SEND_AGAIN:
            if link.position > self._applied:
                link.state = _EARLY  # sent again once its predecessor is in etcd
        elif isinstance(verdict, str):
            self.fail(verdict)
            return
        elif link.position > self._applied:
            self._applied_through(link.position)
        self._pump()
        if self._dirty and self._flush_call is None:
            self._flush()

    def _lost(self, reason: Failure, link: _Link) -> None:
        self._outstanding -= 1
        if self.failed is not None:
            return
        if link.position > self._applied:
            self.fail(f"a durable write failed: {reason.getErrorMessage()}")
            return
        # A later one in the chain was answered as applied, so this one is in
        # etcd (each applies only right after its predecessor): only its
        # answer was lost.  Its place in flight is free.
        self._pump()
        if self._dirty and self._flush_call is None:
            self._flush()

    def _applied_through(self, position: Tuple[int, int]) -> None:
        """
        The transaction at C{position} is in etcd, so is every one before it
        (each applies only right after its predecessor): release the
        replies of every batch now whole, in order.
        """
        self._applied = position
        chain = self._chain
        while chain and chain[0].position <= position:
            link = chain.popleft()
            if link.last is None:
                continue
            started, count, mark = link.last
            batch = self._committed = link.position[0]
            if mark is not None:
                self.committed_mark = max(self.committed_mark, mark)
            if self.on_commit is not None:
                self.on_commit(count, self.clock.seconds() - started)
            if self._waiters and self._waiters[0][0] <= batch:
                ready = [waiting for needed, waiting in self._waiters if needed <= batch]
                self._waiters = [(needed, waiting) for needed, waiting in self._waiters if needed > batch]
                for waiting in ready:
                    if not waiting.called:
                        waiting.callback(None)
                if self.failed is not None:
                    return

    def _refused(self, result: TxnResult, link: _Link) -> Union[None, str, object]:
        """
        None if the transaction C{link} is in etcd (now, or already: a copy
        sent before, applied first); L{_SEND_AGAIN} if it reached etcd before its
        predecessor (it is sent again once that one is in etcd); otherwise
        why it never will be.
        """
        if result.succeeded:
            return None
        leader, commit = (list(found or []) for found in result.responses)
        if not leader or leader[0].create_revision != self.revision:
            return "the election key is gone or another member's"
        position = self._position(commit)
        # Before what was known to be in etcd when it was sent: moved back.
        if position is None or position < link.floor:
            return "the durable state was written by someone else"
        if position >= link.position:
            return None
        return _SEND_AGAIN

    def _position(self, commit: List[KeyValue]) -> Optional[Tuple[int, int]]:
        """
        Where in this term's chain the commit key C{commit} (its value, read
        by a failed transaction) is: (0, 0) before the first transaction,
        (batch, chunk) at one of this term's tags; None if anyone else
        wrote it.
        """
        if not commit:
            return (0, 0) if self._start_revision == 0 else None
        kv = commit[0]
        if kv.mod_revision == self._start_revision:
            return (0, 0)
        if not kv.value.startswith(self._own):
            return None
        try:
            batch, number = (int(part) for part in kv.value[len(self._own) :].split(b":"))
        except ValueError:
            return None
        return (batch, number)

    def _broken(self, reason: Failure) -> None:
        """A bug here must not leave replies waiting forever: fail as if etcd had."""
        self.fail(f"the journal failed: {reason.getErrorMessage()}")

    def stop(self) -> None:
        """Write nothing more (the term is over): replies still waiting are never sent."""
        if self.failed is None:
            self.failed = "the term is over"
        self._end()

    def fail(self, why: str) -> None:
        """
        A write failed: write nothing more and release no reply from now on,
        tell C{on_failure} (which ends the term), and fail the waiting
        replies on the next reactor turn, before the term ends.  Not at
        once: this may be called from within a grant (L{JournalMark.passed}),
        and a failed reply may close its connection, which releases its
        locks: the grant must finish first.
        """
        if self.failed is None:
            self.failed = why
            self._end_call = self.clock.callLater(0, self._end)
            self.on_failure(why)

    def _end(self) -> None:
        """Every reply waiting for durability fails with L{Deposed}."""
        if self._end_call is not None and self._end_call.active():
            self._end_call.cancel()
        self._end_call = None
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if self.channel is not None:
            self.channel.close()
        waiters, self._waiters = self._waiters, []
        for _, waiting in waiters:
            if not waiting.called:
                waiting.errback(Failure(Deposed(self.failed or "")))


@implementer(IDurableMark)
class JournalMark:
    """
    The fencing-token mark kept in etcd, for L{jesync.fencing.TokenMarkService}:
    written with the next commit, durable once it is committed.  A token
    above the durable mark ends the term (L{passed}).
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.path = "etcd " + journal.layout.mark.decode("utf-8", "replace")

    @property
    def durable(self) -> int:
        return self.journal.committed_mark

    def write(self, mark: int) -> Optional[Deferred[None]]:
        """Write C{mark} with the next commit: a Deferred that fires once it is durable."""
        self.journal.mark_reached(mark)
        return self.journal.durable()

    def passed(self, token: int) -> None:
        """A token above the durable mark: the leader steps down instead of sending it."""
        self.journal.fail(f"fencing token {token} would pass the mark in etcd ({self.journal.committed_mark})")
