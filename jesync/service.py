"""
The lock table: counting locks with fair queues, wait timeouts and expiries.

Everything here is driven by calls from protocols (or an embedding
application) and by one clock; nothing here knows about sockets.

The grant rule (JESync's counting semaphore): with C{g} holders, a request R
may join them when C{g + 1 <= R.max_concurrent} and C{g + 1 <= H.max_concurrent}
for every holder H.  Waiting requests are considered in arrival order and the
first one that may join is granted, repeatedly, until none may.  So a request
that allows more concurrency can pass an earlier, stricter one, and that is
the only way a later request passes an earlier one.

Several keys at once (L{LockService.request_many}): all or nothing, a mutex
on each key.  Such a request waits in the queue of every key it does not hold
yet, in the one arrival order all requests share.  In each queue, the
I{candidate} is the first waiter (in arrival order) that the grant rule
admits; a key's queue is served only up to its candidate.  A multi-key
request is granted when it is the candidate of every one of its keys; until
then it keeps its place in the keys where it is the candidate, and a later
request for such a key waits behind it even though the key is free.  Among
requests of equal C{max_concurrent}, then, the order is strictly first come,
first served, and a multi-key request cannot starve behind later ones.  It
cannot deadlock either: a waiter is only ever held up by holders (which
release or expire) or by a candidate, which arrived earlier or is one that a
stricter earlier request lets pass because holders stand in its way.

So after every change no waiter could be granted, and while no multi-key
request and no shared request waits for a key, no waiter of that key is
admitted by the grant rule at all: a new request for it is granted at once
or queued by looking at its holders only.  Where a multi-key request waits,
a new request also looks for a candidate ahead of it; where a shared one
waits, see the modes below.

Modes: a request is exclusive (all of the above: counting semaphores
included) or shared.  Shared holders are compatible with each other, any
number of them, and with nothing exclusive; so a key's holders are all
shared or all exclusive.  The grant rule with modes: a shared request may
join shared holders or none (C{max_concurrent} does not apply to it: it must
be 1, and a shared grant's C{max_concurrent} is 1, which keeps every
exclusive request out while one holds); an exclusive request may join no
shared holder, and exclusive holders by the rule above.  Fairness keeps one
arrival order per key: a waiter is admitted only if the grant rule admits it
I{and} no waiter of the other mode arrived before it and still waits.  So a
waiting exclusive request holds back every later shared one (readers cannot
starve a writer), a waiting shared request is not passed by a later
exclusive one (a counting semaphore's included), and the shared requests
that reach the head of a queue together are granted together, in the same
change.  Between exclusive requests nothing changes: with no shared request
waiting, a C{lock k 3} still passes a waiting C{lock k 1}.  A multi-key
request has one mode for all its keys; a shared one is granted when each of
its keys admits it (shared holders or none, no exclusive waiter ahead of it),
and shared requests never hold each other back.  There is no upgrade and no
downgrade: an owner that holds a key and asks for it in the other mode is
refused at once with L{jesync.errors.ModeConflict} (its grant stays as it
is; never a wait, so two readers that both want to write cannot deadlock).
Asking again in the same mode is a renewal, as ever.  Expiry, release,
release on disconnect, fencing tokens (one per grant, shared or not) and the
limits are the same for both modes.  The plain path costs what it did: an
exclusive request without a value tests two identities more, and a key no
shared request waits for takes the exclusive path as before.

Holder values: a request may carry a value (bytes, at most L{MAX_VALUE},
4 KiB), kept on its grant (C{Grant.value}) for anyone to read through
C{holders}: a leader's address, an owner's label.  A renewal with a value
replaces it; one without keeps it.

Fencing tokens: every grant gets a token, an integer larger than any the
service gave before (so strictly increasing per key, and across keys):
C{max(last + 1, now in microseconds)}, C{now} read from the service's clock.
Across restarts tokens keep increasing as long as the clock at the restart
is past the last token (the clock did not go back, and grants did not run
ahead of it by more than the restart took); C{first_token} (a high-water
mark kept by the server, see L{jesync.fencing}) covers a clock that went
back, and a token past C{token_check} is left to C{token_mark} (which keeps
tokens at or below the durable mark).  A renewal keeps its grant's token.

Listings: C{version} counts the changes a listing would show (a grant, a
release, a wait starting or ending), so that a listing asked for while the
table has not changed can be sent from the snapshot an earlier one took
(L{jesync.connections.listings}).  Renewals, expiry times and owners are
not in a listing and do not count.

Watches: an owner may watch a key, or every key with a prefix
(L{LockService.watch}), and is then told of every change of its holders, as
it happens, in order: a holder granted, released, expired, or lost (its
owner went away); a prefix watch is also told of keys entering the table
(their first request, granted or waiting) and leaving it (nobody holds or
waits for them).  A renewal, a wait and dlock's hand-over of a grant to
another owner of the same client are not events.  Events are told
synchronously, from inside the change, so a protocol that writes them at
once sends an event before its reply to any later request that could
observe the change; a listener must not change the table.  The caps
(C{max_watches} an owner, C{max_total_watches} in all) bound what watches
hold; a change costs the plain path one test while nobody watches, one
dictionary look-up while only other keys are watched, and one more per
prefix length watched while prefixes are.

Held keys: a watcher (L{LockService.watch_holds}) is told when a key gets
its first holder and when its last holder goes, and of nothing else, so that
a table built on the lock table (the memcached store's count of locked
objects) is kept as the table changes rather than computed from it: a
metrics scrape reads such counts in O(1), whatever the table holds.  A
server without such a table pays one empty-list test per first grant and
last release.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Hashable, Iterable, List, Optional, Sequence, Tuple, Union

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from jesync.deadlines import Deadlines
from jesync.errors import AlreadyWaiting, LimitReached, LockTimeout, ModeConflict
from jesync.interfaces import (
    APPEARED,
    DISAPPEARED,
    EXPIRED,
    GRANTED,
    LOST,
    RELEASED,
    IGrant,
    ILockObserver,
    ILockService,
    ITokenMark,
    KeyStatus,
    ListingOrder,
    LockEvent,
    Totals,
    Waiting,
)
from jesync.listing import listing_sort_key
from jesync.wire import EXCLUSIVE, MAX_VALUE, SHARED, VALUE_TOO_LONG

DEFAULT_EXPIRES = 120
WAIT_FOREVER = -1

_new_status = tuple.__new__


@implementer(IGrant)
class Grant:
    """One owner's hold on a key: the handle L{LockService.acquire} returns."""

    __slots__ = ("_service", "key", "owner", "max_concurrent", "granted_at", "expires_at", "token", "mode", "value")

    def __init__(
        self,
        service: LockService,
        key: str,
        owner: Hashable,
        max_concurrent: int,
        granted_at: float,
        expires_at: float | None,
        token: int,
        mode: str,
        value: bytes | None,
    ) -> None:
        self._service = service
        self.key = key
        self.owner = owner
        self.max_concurrent = max_concurrent
        self.granted_at = granted_at
        self.expires_at = expires_at
        self.token = token
        #: EXCLUSIVE or SHARED (a shared grant's max_concurrent is 1).
        self.mode = mode
        #: What its holder set (bytes, at most MAX_VALUE), or None.
        self.value = value

    @property
    def seconds_left(self) -> float | None:
        if self.expires_at is None:
            return None
        return max(0.0, self.expires_at - self._service.clock.seconds())

    def release(self) -> bool:
        return self._service._release_grant(self)

    def __repr__(self) -> str:
        return f"<Grant {self.key!r} held by {self.owner!r}>"


class _Waiter:
    """
    A queued request.  C{deferred} is None once it has left the queue.

    A multi-key request has C{keys}: the keys it waits for (in the queue of
    each), C{key} being the first; and C{asked}: every key it asked for, those
    its owner held already included.  Both are None for one key.  C{shared}:
    a shared request (its C{max_concurrent} is 1); C{value}: the value its
    grants will carry.
    """

    __slots__ = (
        "key",
        "owner",
        "max_concurrent",
        "expires",
        "requested_at",
        "timeout_at",
        "deferred",
        "keys",
        "asked",
        "shared",
        "value",
    )

    def __init__(
        self,
        key: str,
        owner: Hashable,
        max_concurrent: int,
        expires: float,
        requested_at: float,
        timeout_at: float | None,
        deferred: Deferred,
        shared: bool,
        value: bytes | None,
    ) -> None:
        self.key = key
        self.owner = owner
        self.max_concurrent = max_concurrent
        self.expires = expires
        self.requested_at = requested_at
        self.timeout_at = timeout_at
        self.deferred: Deferred | None = deferred
        self.shared = shared
        self.value = value
        self.keys: tuple[str, ...] | None = None
        self.asked: tuple[str, ...] | None = None


class _Lock:
    """
    The holders and waiters of one key.

    C{waiters} is created on the first wait and dropped when nobody waits.  A
    waiter that leaves from the middle (timeout, cancel, or granted through
    another of its keys) is only marked and skipped later, so leaving is
    O(1); C{waiting} counts the live ones, C{multi} the live multi-key ones,
    C{shared} the live shared ones.  Holders are all exclusive or all shared.
    """

    __slots__ = ("holders", "waiters", "waiting", "multi", "shared")

    def __init__(self) -> None:
        self.holders: list[Grant] = []
        self.waiters: deque[_Waiter] | None = None
        self.waiting = 0
        self.multi = 0
        self.shared = 0

    def limit(self) -> float:
        """The most holders every current holder accepts."""
        return min((h.max_concurrent for h in self.holders), default=float("inf"))


class _ManyGranted:
    """
    A multi-key waiter's new grants, and what its answer lists: every key it
    asked for, those its owner held already too (renewed with C{expires}
    when it is granted).
    """

    __slots__ = ("grants", "owner", "asked", "expires", "value")

    def __init__(self, grants: List[Grant], waiter: _Waiter) -> None:
        assert waiter.asked is not None
        self.grants = grants
        self.owner = waiter.owner
        self.asked = waiter.asked
        self.expires = waiter.expires
        self.value = waiter.value


class _Watcher:
    """One owner's watches: its listener, the keys and the prefixes it watches."""

    __slots__ = ("listener", "keys", "prefixes", "counted")

    def __init__(self, listener: Callable[[LockEvent], None], counted: bool) -> None:
        self.listener = listener
        # (whether its watches count toward the caps and watch_count: not a
        # table built on this one, such as the group table)
        self.counted = counted
        self.keys: set[str] = set()
        self.prefixes: set[str] = set()


_Held = Union[Grant, _Waiter]
# What _admit hands to _deliver: a Deferred and the grant (or grants) it is owed.
_Granted = List[Tuple[Deferred, Union[Grant, _ManyGranted]]]


def _busyness(item: tuple[str, _Lock]) -> tuple[int, int]:
    """How busy a key of the table is: its waiters, then its holders (L{LockService.busiest})."""
    lock = item[1]
    return lock.waiting, len(lock.holders)


def check_request(max_concurrent: int, timeout: float, expires: float) -> None:
    """Raise ValueError (with JESync's wording) for an out-of-range request."""
    if max_concurrent < 1:
        raise ValueError("Max concurrent should be greater or equal than 1")
    if timeout < WAIT_FOREVER:
        raise ValueError("Timeout should be greater or equal than -1")
    if WAIT_FOREVER < timeout < 0:
        raise ValueError("Timeout should be -1 (wait for ever) or at least 0")
    if expires < 0:
        raise ValueError("Expire timeout should be greater or equal than 0")


def renew_grant(locks: ILockService, grant: IGrant, value: bytes | None, expires: float | None = None) -> IGrant:
    """
    Renew C{grant} for its owner (asking again for a key held, in the same
    mode and concurrency, renews it, its token kept) with C{value} (None:
    as a renewal without one), and an expiry of C{expires} seconds (0:
    none), or, with None, the time its expiry has left (none if it has
    none): a new value for a group member's capabilities or an election's
    leader, its lease unchanged.
    """
    if expires is None:
        left = grant.seconds_left
        expires = 0 if left is None else max(left, 0.001)
    return locks.request(grant.key, grant.owner, grant.max_concurrent, 0, expires, grant.mode, value)


def check_mode(mode: str, max_concurrent: int, value: bytes | None) -> bool:
    """
    Raise ValueError for an unknown mode, a shared request with a
    C{max_concurrent} other than 1, or a value that is not bytes or is
    longer than L{MAX_VALUE}; return whether the request is shared.
    """
    if value is not None:
        if not isinstance(value, bytes):
            raise ValueError("A value should be bytes")
        if len(value) > MAX_VALUE:
            raise ValueError(VALUE_TOO_LONG)
    if mode == EXCLUSIVE:
        return False
    if mode != SHARED:
        raise ValueError(f"Mode should be {EXCLUSIVE!r} or {SHARED!r}")
    if max_concurrent != 1:
        raise ValueError("A shared request takes no max concurrent (it should be 1)")
    return True


#: C{token_check} without a mark: above every 64-bit token.
NO_TOKEN_CHECK = 2**64


@implementer(ILockService)
class LockService:
    """
    The one lock table a server shares among all its protocols.

    @param clock: the reactor (or a L{twisted.internet.task.Clock} in tests);
        wait timeouts and expiries are scheduled on it, and fencing tokens
        follow it.
    @param max_keys: the most keys in use at once (None: no limit).
    @param max_waiters: the most requests waiting for one key.
    @param max_held: the most grants plus waits one owner may have (a
        multi-key wait counts once).
    @param max_total_waits: the most requests waiting at once, all keys and
        owners together (a multi-key wait counts once).
    @param first_token: every fencing token given is above this one.
    @param observer: an L{ILockObserver} told of grants, timeouts,
        releases and expiries (for metrics).
    @param max_watches: the most watches one owner may have.
    @param max_total_watches: the most watches at once, all owners together.
    """

    def __init__(
        self,
        clock: IReactorTime,
        *,
        max_keys: int | None = None,
        max_waiters: int | None = None,
        max_held: int | None = None,
        max_total_waits: int | None = None,
        first_token: int = 0,
        observer: ILockObserver | None = None,
        max_watches: int | None = None,
        max_total_watches: int | None = None,
    ) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self.max_waiters = max_waiters
        self.max_held = max_held
        self.max_total_waits = max_total_waits
        self.observer = observer
        self.last_token = first_token
        # Bumped on every change a status listing shows.
        self.version = 0
        # A token above token_check is given by token_mark.reached (jesync.fencing).
        self.token_check = NO_TOKEN_CHECK
        self.token_mark: Optional[ITokenMark] = None
        self._locks: dict[str, _Lock] = {}
        # owner -> key -> its grant of, or wait for, that key (a multi-key
        # wait appears under each key it waits for)
        self._owners: dict[Hashable, dict[str, _Held]] = {}
        # owner -> how many more entries its multi-key waits have than waits
        self._spread: dict[Hashable, int] = {}
        self._granted = 0
        self._waiting = 0
        # Told (key, True) when a key gets its first holder, (key, False)
        # when its last one goes: one callable (the watchers chained), so
        # the common case, no watcher or one, costs one test or one call.
        self._hold_watcher: Optional[Callable[[str, bool], None]] = None
        # Keys held shared now.
        self.shared_keys = 0
        self.max_watches = max_watches
        self.max_total_watches = max_total_watches
        # owner -> its watches; key -> the owners watching it (and prefix ->
        # the owners watching it, with how many prefixes of each length are
        # watched): dicts as ordered sets, told in the order they watched.
        self._watchers: dict[Hashable, _Watcher] = {}
        self._key_watchers: dict[str, dict[Hashable, None]] = {}
        self._prefix_watchers: dict[str, dict[Hashable, None]] = {}
        self._prefix_lengths: dict[int, int] = {}
        self.watch_count = 0
        self._expiries: Deadlines[Grant] = Deadlines(clock, self._expire)
        self._wait_timeouts: Deadlines[_Waiter] = Deadlines(clock, self._time_out)

    # -- requests --------------------------------------------------------

    def acquire(
        self,
        key: str,
        owner: Hashable,
        max_concurrent: int = 1,
        timeout: float = WAIT_FOREVER,
        expires: float = DEFAULT_EXPIRES,
        mode: str = EXCLUSIVE,
        value: bytes | None = None,
    ) -> Deferred[Grant]:
        result = self.request(key, owner, max_concurrent, timeout, expires, mode, value)
        return succeed(result) if isinstance(result, Grant) else result

    def request(
        self,
        key: str,
        owner: Hashable,
        max_concurrent: int = 1,
        timeout: float = WAIT_FOREVER,
        expires: float = DEFAULT_EXPIRES,
        mode: str = EXCLUSIVE,
        value: bytes | None = None,
    ) -> Union[Grant, Deferred[Grant]]:
        check_request(max_concurrent, timeout, expires)
        # (the plain request, exclusive without a value, tests two identities)
        if mode is EXCLUSIVE and value is None:
            shared = False
        else:
            shared = check_mode(mode, max_concurrent, value)
        held = self._owners.get(owner)
        current = held.get(key) if held is not None else None
        if current is not None:
            if isinstance(current, Grant):
                if (current.mode is SHARED) is not shared:
                    return fail(ModeConflict(key, current.mode))
                self._renew(current, expires)
                if value is not None:
                    current.value = value
                return current
            return fail(AlreadyWaiting(key))

        if self.max_held is not None and held is not None:
            self._check_held(owner, held)
        lock = self._locks.get(key)
        if lock is None:
            if self.max_keys is not None and len(self._locks) >= self.max_keys:
                raise LimitReached("max-keys", self.max_keys)
            lock = self._locks[key] = _Lock()
            if self._prefix_lengths:
                self._tell(APPEARED, key, None)
        granted = len(lock.holders)
        if shared:
            # Shared holders (or none), and no exclusive request waiting.
            admitted = (not granted or lock.holders[0].mode is SHARED) and lock.waiting == lock.shared
        else:
            admitted = (
                granted < max_concurrent
                and granted < lock.limit()
                and not lock.shared
                and (not lock.multi or self._candidate(lock) is None)
            )
        if admitted:
            grant = self._grant(lock, key, owner, max_concurrent, expires, SHARED if shared else EXCLUSIVE, value)
            if self.observer is not None:
                self.observer.granted(grant, 0.0)
            return grant
        if timeout == 0:
            return fail(LockTimeout(key))
        self._check_waits((lock,))

        now = self.clock.seconds()
        timeout_at = None if timeout == WAIT_FOREVER else now + timeout
        deferred: Deferred[Grant] = Deferred(lambda d: self._withdraw(waiter))
        waiter = _Waiter(key, owner, max_concurrent, expires, now, timeout_at, deferred, shared, value)
        if lock.waiters is None:
            lock.waiters = deque()
        lock.waiters.append(waiter)
        lock.waiting += 1
        if shared:
            lock.shared += 1
        self._waiting += 1
        self.version += 1
        self._owner_entries(owner)[key] = waiter
        if timeout_at is not None:
            self._wait_timeouts.add(waiter, timeout_at)
        return deferred

    def acquire_many(
        self,
        keys: Sequence[str],
        owner: Hashable,
        timeout: float = WAIT_FOREVER,
        expires: float = DEFAULT_EXPIRES,
        mode: str = EXCLUSIVE,
        value: bytes | None = None,
    ) -> Deferred[List[Grant]]:
        result = self.request_many(keys, owner, timeout, expires, mode, value)
        return succeed(result) if isinstance(result, list) else result

    def request_many(
        self,
        keys: Sequence[str],
        owner: Hashable,
        timeout: float = WAIT_FOREVER,
        expires: float = DEFAULT_EXPIRES,
        mode: str = EXCLUSIVE,
        value: bytes | None = None,
    ) -> Union[List[Grant], Deferred[List[Grant]]]:
        asked = tuple(dict.fromkeys(keys))
        if not asked:
            raise ValueError("No keys given")
        check_request(1, timeout, expires)
        shared = check_mode(mode, 1, value)
        mode = SHARED if shared else EXCLUSIVE
        held = self._owners.get(owner)
        renewals = []
        wanted = []
        for key in asked:
            current = held.get(key) if held is not None else None
            if isinstance(current, _Waiter):
                return fail(AlreadyWaiting(key))
            if current is None:
                wanted.append(key)
            elif current.mode is not mode:
                return fail(ModeConflict(key, current.mode))
            else:
                renewals.append(current)
        if wanted and self.max_held is not None and held is not None:
            self._check_held(owner, held)
        locks = self._locks
        new_keys = sum(key not in locks for key in wanted)
        if new_keys and self.max_keys is not None and len(locks) + new_keys > self.max_keys:
            raise LimitReached("max-keys", self.max_keys)
        # A key with no holder and no waiter is free; a key with no holder and
        # a waiter has a candidate ahead of this request (anyone may join
        # no holders).  A shared request is also admitted by shared holders
        # when no exclusive request waits.
        if shared:
            busy = [
                key
                for key in wanted
                if key in locks
                and (
                    (locks[key].holders and locks[key].holders[0].mode is not SHARED)
                    or locks[key].waiting != locks[key].shared
                )
            ]
        else:
            busy = [key for key in wanted if key in locks and (locks[key].holders or locks[key].waiting)]
        if not busy:
            for grant in renewals:
                self._renew(grant, expires)
                if value is not None:
                    grant.value = value
            for key in wanted:
                grant = self._grant(self._lock_of(key), key, owner, 1, expires, mode, value)
                if self.observer is not None:
                    self.observer.granted(grant, 0.0)
            entries = self._owners[owner]
            return [entries[key] for key in asked]  # type: ignore[misc]
        if timeout == 0:
            return fail(LockTimeout(asked[0], busy))
        self._check_waits([locks[key] for key in wanted if key in locks])

        now = self.clock.seconds()
        timeout_at = None if timeout == WAIT_FOREVER else now + timeout
        deferred: Deferred[List[Grant]] = Deferred(lambda d: self._withdraw(waiter))
        waiter = _Waiter(wanted[0], owner, 1, expires, now, timeout_at, deferred, shared, value)
        waiter.keys = tuple(wanted)
        waiter.asked = asked
        entries = self._owner_entries(owner)
        for key in wanted:
            lock = self._lock_of(key)
            if lock.waiters is None:
                lock.waiters = deque()
            lock.waiters.append(waiter)
            lock.waiting += 1
            lock.multi += 1
            lock.shared += shared
            entries[key] = waiter
        self._waiting += 1
        self.version += 1
        if len(wanted) > 1:
            self._spread[owner] = self._spread.get(owner, 0) + len(wanted) - 1
        if timeout_at is not None:
            self._wait_timeouts.add(waiter, timeout_at)
        return deferred

    def release(self, key: str, owner: Hashable) -> bool:
        held = self._owners.get(owner)
        grant = held.get(key) if held is not None else None
        if not isinstance(grant, Grant):
            return False
        return self._release_grant(grant)

    def release_all(self, owner: Hashable, why: str = LOST) -> None:
        if why is LOST and owner in self._watchers:
            self._unwatch_all(owner)
        entries = self._owners.pop(owner, None)
        self._spread.pop(owner, None)
        if not entries:
            return
        cancelled = []
        freed: dict[str, None] = {}
        for key, entry in entries.items():
            if isinstance(entry, Grant):
                self._remove_holder(self._locks[key], entry, why)
                freed[key] = None
            elif entry.deferred is not None:  # (a multi-key wait is met once per key)
                cancelled.append(self._leave(entry))
                if entry.keys is not None:
                    freed.update(dict.fromkeys(entry.keys))
                elif entry.shared or self._locks[key].shared:
                    freed[key] = None  # (it may have held back waiters of the other mode)
        granted: _Granted = []
        for key in freed:
            granted.extend(self._admit(key, self._locks[key]))
        for key in entries:
            self._forget_if_idle(key)
        self._deliver(granted)
        for deferred in cancelled:
            deferred.cancel()

    def reassign(self, key: str, owner: Hashable, new_owner: Hashable, expires: float) -> Grant | None:
        """
        Hand C{owner}'s grant of C{key} to C{new_owner}, renewed with
        C{expires} (its token kept): dlock's switch between a lock held until
        disconnect and one held for a time.  None if C{owner} does not hold it.

        @raise ValueError: if C{new_owner} holds or waits for C{key} already.
        """
        held = self._owners.get(owner)
        grant = held.get(key) if held is not None else None
        if not isinstance(grant, Grant):
            return None
        entries = self._owner_entries(new_owner)
        if key in entries:
            raise ValueError(f"{new_owner!r} already has {key!r}")
        self._forget_entry(owner, held, key)  # type: ignore[arg-type]
        grant.owner = new_owner
        entries[key] = grant
        self._renew(grant, expires)
        return grant

    def watch_holds(self, watcher: Callable[[str, bool], None]) -> None:
        """
        Call C{watcher(key, True)} whenever C{key} gets its first holder, and
        C{watcher(key, False)} whenever its last holder goes (released,
        expired, or its owner gone), from then on; it must not change the
        table.
        """
        before = self._hold_watcher
        if before is None:
            self._hold_watcher = watcher
            return

        def both(key: str, held: bool) -> None:
            before(key, held)
            watcher(key, held)

        self._hold_watcher = both

    def watch(
        self,
        owner: Hashable,
        key: str,
        listener: Callable[[LockEvent], None],
        prefix: bool = False,
        counted: bool = True,
    ) -> bool:
        watcher = self._watchers.get(owner)
        watched = None if watcher is None else (watcher.prefixes if prefix else watcher.keys)
        if watched is not None and key in watched:
            watcher.listener = listener  # type: ignore[union-attr]
            return False
        if not key and not prefix:
            raise ValueError("a key cannot be empty")
        if counted and self.max_watches is not None and watcher is not None:
            if len(watcher.keys) + len(watcher.prefixes) >= self.max_watches:
                raise LimitReached("max-watches", self.max_watches)
        if counted and self.max_total_watches is not None and self.watch_count >= self.max_total_watches:
            raise LimitReached("max-total-watches", self.max_total_watches)
        if watcher is None:
            watcher = self._watchers[owner] = _Watcher(listener, counted)
        else:
            watcher.listener = listener
        if prefix:
            watcher.prefixes.add(key)
            owners = self._prefix_watchers.setdefault(key, {})
            if not owners:
                self._prefix_lengths[len(key)] = self._prefix_lengths.get(len(key), 0) + 1
        else:
            watcher.keys.add(key)
            owners = self._key_watchers.setdefault(key, {})
        owners[owner] = None
        self.watch_count += watcher.counted
        return True

    def unwatch(self, owner: Hashable, key: str, prefix: bool = False) -> bool:
        watcher = self._watchers.get(owner)
        watched = None if watcher is None else (watcher.prefixes if prefix else watcher.keys)
        if watched is None or key not in watched:
            return False
        watched.remove(key)
        self._forget_watch(owner, key, prefix, watcher.counted)  # type: ignore[union-attr]
        if not watcher.keys and not watcher.prefixes:  # type: ignore[union-attr]
            del self._watchers[owner]
        return True

    def watches_of(self, owner: Hashable) -> int:
        watcher = self._watchers.get(owner)
        return 0 if watcher is None else len(watcher.keys) + len(watcher.prefixes)

    def _unwatch_all(self, owner: Hashable) -> None:
        watcher = self._watchers.pop(owner)
        for key in watcher.keys:
            self._forget_watch(owner, key, False, watcher.counted)
        for prefix in watcher.prefixes:
            self._forget_watch(owner, prefix, True, watcher.counted)

    def _forget_watch(self, owner: Hashable, key: str, prefix: bool, counted: bool) -> None:
        """Take C{owner} from the watchers of C{key} (or of the prefix)."""
        index = self._prefix_watchers if prefix else self._key_watchers
        owners = index[key]
        del owners[owner]
        self.watch_count -= counted
        if owners:
            return
        del index[key]
        if prefix:
            left = self._prefix_lengths[len(key)] - 1
            if left:
                self._prefix_lengths[len(key)] = left
            else:
                del self._prefix_lengths[len(key)]

    def _tell(self, kind: str, key: str, grant: Grant | None) -> None:
        """
        Tell every owner watching C{key} (APPEARED and DISAPPEARED: by a
        prefix only) of one change, each once.
        """
        event = None
        watchers = self._watchers
        owners = None if grant is None else self._key_watchers.get(key)
        if owners:
            event = LockEvent(kind, key, grant)
            for owner in owners:
                watchers[owner].listener(event)
        if not self._prefix_lengths:
            return
        told: set[Hashable] | None = None
        prefix_watchers = self._prefix_watchers
        for length in self._prefix_lengths:
            by_prefix = prefix_watchers.get(key[:length]) if length <= len(key) else None
            if by_prefix:
                if event is None:
                    event = LockEvent(kind, key, grant)
                if told is None:
                    told = set(owners) if owners else set()
                for owner in by_prefix:
                    if owner not in told:
                        told.add(owner)
                        watchers[owner].listener(event)

    # -- status ----------------------------------------------------------

    def status(self, key: str) -> KeyStatus:
        lock = self._locks.get(key)
        # (tuple.__new__: a NamedTuple's own constructor is Python code,
        # and a reply to every request asks for a status)
        if lock is None:
            return _new_status(KeyStatus, (key, 0, 0))
        return _new_status(KeyStatus, (key, len(lock.holders), lock.waiting))

    def owned(self, owner: Hashable) -> int:
        entries = self._owners.get(owner)
        return len(entries) if entries is not None else 0

    def grants_of(self, owner: Hashable) -> list[Grant]:
        """C{owner}'s grants (not its waits)."""
        entries = self._owners.get(owner)
        return [entry for entry in entries.values() if isinstance(entry, Grant)] if entries else []

    def grant_of(self, key: str, owner: Hashable) -> Grant | None:
        """C{owner}'s grant of C{key}, if it holds it."""
        entries = self._owners.get(owner)
        entry = entries.get(key) if entries is not None else None
        return entry if isinstance(entry, Grant) else None

    def totals(self) -> Totals:
        return Totals(len(self._locks), self._granted, self._waiting)

    def holders(self, key: str) -> list[Grant]:
        lock = self._locks.get(key)
        return list(lock.holders) if lock is not None else []

    def waiters(self, key: str, limit: int | None = None) -> list[Waiting]:
        lock = self._locks.get(key)
        if lock is None or lock.waiters is None:
            return []
        found: list[Waiting] = []
        for waiter in lock.waiters:
            if waiter.deferred is None:
                continue  # (left from the middle: skipped, as _admit does)
            if limit is not None and len(found) >= limit:
                break
            mode = SHARED if waiter.shared else EXCLUSIVE
            found.append(Waiting(waiter.owner, mode, waiter.max_concurrent, waiter.requested_at))
        return found

    def listing(self, order: ListingOrder = "key") -> list[KeyStatus]:
        return [KeyStatus(*row[:3]) for row in self.snapshot(order)]

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return [key for key in self._locks if key.startswith(prefix)]

    def snapshot(self, order: ListingOrder = "key") -> list[tuple]:
        # Plain tuples: a million KeyStatus take several times as long to make.
        rows: list[tuple]
        if self.shared_keys:
            rows = [
                (key, len(lock.holders), lock.waiting, SHARED)
                if lock.holders and lock.holders[0].mode is SHARED
                else (key, len(lock.holders), lock.waiting)
                for key, lock in self._locks.items()
            ]
        else:
            rows = [(key, len(lock.holders), lock.waiting) for key, lock in self._locks.items()]
        rows.sort(key=listing_sort_key(order))
        return rows

    def first_keys(self, count: int, after: bytes | None = None, prefix: bytes = b"") -> tuple[list[tuple], int]:
        """
        The first C{count} rows of L{snapshot}C{("key")} whose key (its
        bytes, L{jesync.wire.encode_key}) is after C{after} and starts with
        C{prefix}, and how many keys start with C{prefix}: one pass over the
        table that keeps C{count} rows (C{heapq.nsmallest}), no snapshot of
        it, for a page of a table too large to snapshot.
        """
        matching = 0

        def candidates() -> Iterable[tuple[bytes, str]]:
            nonlocal matching
            for key in self._locks:
                encoded = key.encode("utf-8", "surrogateescape")
                if encoded.startswith(prefix):
                    matching += 1
                    if after is None or encoded > after:
                        yield encoded, key

        first = heapq.nsmallest(count, candidates())
        rows: list[tuple] = []
        for _, key in first:
            lock = self._locks[key]
            if lock.holders and lock.holders[0].mode is SHARED:
                rows.append((key, len(lock.holders), lock.waiting, SHARED))
            else:
                rows.append((key, len(lock.holders), lock.waiting))
        return rows, matching

    def busiest(self, count: int) -> list[KeyStatus]:
        """
        The C{count} keys with the most waiters, then the most holders (in
        that order; among equals, the first in the table), for a status
        summary's top-N: one pass over the table, no sort of it and no row
        per key (C{heapq.nlargest}), so about 75 ms at 1,000,000 keys on
        CPython where a sorted listing takes ten times that.
        """
        busiest = heapq.nlargest(count, self._locks.items(), key=_busyness)
        return [_new_status(KeyStatus, (key, len(lock.holders), lock.waiting)) for key, lock in busiest]

    # -- the rules -------------------------------------------------------

    def _check_held(self, owner: Hashable, held: dict[str, _Held]) -> None:
        max_held = self.max_held
        assert max_held is not None
        if len(held) - self._spread.get(owner, 0) >= max_held:
            raise LimitReached("max-held", max_held)

    def _check_waits(self, locks: Iterable[_Lock]) -> None:
        """Raise L{LimitReached} if one more wait (for each of C{locks}) would pass a limit."""
        if self.max_waiters is not None and any(lock.waiting >= self.max_waiters for lock in locks):
            raise LimitReached("max-waiters", self.max_waiters)
        if self.max_total_waits is not None and self._waiting >= self.max_total_waits:
            raise LimitReached("max-total-waits", self.max_total_waits)

    def _grant(
        self,
        lock: _Lock,
        key: str,
        owner: Hashable,
        max_concurrent: int,
        expires: float,
        mode: str,
        value: bytes | None,
    ) -> Grant:
        now = self.clock.seconds()
        expires_at = now + expires if expires else None
        token = int(now * 1000000)
        if token <= self.last_token:
            token = self.last_token + 1
        if token > self.token_check and self.token_mark is not None:
            token = self.token_mark.reached(token)
        self.last_token = token
        grant = Grant(self, key, owner, max_concurrent, now, expires_at, token, mode, value)
        if lock.holders:
            lock.holders.append(grant)
        else:
            # A list made with its one item is 24 bytes smaller than an
            # empty one grown by append (which allocates room for four).
            lock.holders = [grant]
            if mode is SHARED:
                self.shared_keys += 1
            if self._hold_watcher is not None:
                self._hold_watcher(key, True)
        self._granted += 1
        self.version += 1
        self._owner_entries(owner)[key] = grant
        if expires_at is not None:
            self._expiries.add(grant, expires_at)
        if self._watchers and (self._prefix_lengths or key in self._key_watchers):
            self._tell(GRANTED, key, grant)
        return grant

    def _renew(self, grant: Grant, expires: float) -> None:
        """Restart C{grant}'s failsafe; its C{max_concurrent} and token stay as granted."""
        if grant.expires_at is not None:
            self._expiries.discard(grant, grant.expires_at)
        grant.expires_at = self.clock.seconds() + expires if expires else None
        if grant.expires_at is not None:
            self._expiries.add(grant, grant.expires_at)

    def _candidate(self, lock: _Lock) -> _Waiter | None:
        """
        The first exclusive waiter (in arrival order) the grant rule admits
        and no shared waiter precedes, if any.
        """
        joining = len(lock.holders) + 1
        if not lock.waiting or joining > lock.limit():
            return None
        assert lock.waiters is not None
        for waiter in lock.waiters:
            if waiter.deferred is not None and (waiter.max_concurrent >= joining or waiter.shared):
                return None if waiter.shared else waiter
        return None

    def _shared_admits(self, lock: _Lock, waiter: _Waiter) -> bool:
        """Whether C{lock} admits the shared C{waiter}: shared holders (or none), no exclusive waiter before it."""
        if lock.holders and lock.holders[0].mode is not SHARED:
            return False
        assert lock.waiters is not None
        for other in lock.waiters:
            if other is waiter:
                return True
            if other.deferred is not None and not other.shared:
                return False
        return False  # (not in the queue: cannot happen)

    def _admit(self, key: str, lock: _Lock) -> _Granted:
        """
        Grant waiters, in arrival order, while any may join the holders.

        In the common case (all requests with the same C{max_concurrent}) this
        looks only at the head of the queue.  The Deferreds are returned
        rather than fired so that callers see the key's final state.
        """
        granted: _Granted = []
        if not lock.waiting:
            return granted
        if lock.shared and lock.holders and lock.holders[0].mode is SHARED:
            assert lock.waiters is not None
            return self._admit_shared(key, lock, lock.waiters)
        limit = lock.limit()
        while lock.waiting:
            waiters = lock.waiters  # _leave may have compacted it
            assert waiters is not None
            while waiters[0].deferred is None:
                waiters.popleft()
            joining = len(lock.holders) + 1
            if joining > limit:
                break
            for index, waiter in enumerate(waiters):
                if waiter.deferred is not None and (waiter.max_concurrent >= joining or waiter.shared):
                    break
            else:
                break
            if waiter.shared:
                # Shared requests first in line (none if an exclusive one is
                # ahead of them) are granted together.
                if index == 0:
                    granted.extend(self._admit_shared(key, lock, waiters))
                break
            if waiter.keys is not None:
                # A multi-key candidate: granted if it is the candidate of
                # every key it waits for; either way, nobody passes it here.
                if all(self._candidate(self._locks[other]) is waiter for other in waiter.keys):
                    granted.append(self._grant_many(waiter))
                break
            del waiters[index]
            deferred = self._leave(waiter, lock)
            grant = self._grant(lock, key, waiter.owner, waiter.max_concurrent, waiter.expires, EXCLUSIVE, waiter.value)
            if self.observer is not None:
                self.observer.granted(grant, grant.granted_at - waiter.requested_at)
            granted.append((deferred, grant))
            limit = min(limit, waiter.max_concurrent)
        return granted

    def _admit_shared(self, key: str, lock: _Lock, waiters: deque[_Waiter]) -> _Granted:
        """
        Grant the shared waiters at the head of C{key}'s queue (up to the
        first exclusive one), if its holders are shared or none: each one
        for C{key} alone, each multi-key one that every key it waits for
        admits.  (Granted ones are only marked: C{waiters} is not changed
        while it is walked.)
        """
        granted: _Granted = []
        if lock.holders and lock.holders[0].mode is not SHARED:
            return granted
        for waiter in waiters:
            if waiter.deferred is None:
                continue
            if not waiter.shared:
                break
            if waiter.keys is None:
                deferred = self._leave(waiter, lock)
                grant = self._grant(lock, key, waiter.owner, 1, waiter.expires, SHARED, waiter.value)
                if self.observer is not None:
                    self.observer.granted(grant, grant.granted_at - waiter.requested_at)
                granted.append((deferred, grant))
            elif all(other == key or self._shared_admits(self._locks[other], waiter) for other in waiter.keys):
                granted.append(self._grant_many(waiter))
        return granted

    def _grant_many(self, waiter: _Waiter) -> tuple[Deferred, _ManyGranted]:
        """Grant a multi-key waiter every key it waits for."""
        deferred = self._leave(waiter)
        assert waiter.keys is not None and waiter.asked is not None
        grants = []
        mode = SHARED if waiter.shared else EXCLUSIVE
        for key in waiter.keys:
            grant = self._grant(self._locks[key], key, waiter.owner, 1, waiter.expires, mode, waiter.value)
            if self.observer is not None:
                self.observer.granted(grant, grant.granted_at - waiter.requested_at)
            grants.append(grant)
        return deferred, _ManyGranted(grants, waiter)

    def _leave(self, waiter: _Waiter, lock: _Lock | None = None) -> Deferred:
        """
        Take C{waiter} out of the queue counts of its keys and its timeout;
        return its Deferred.  (C{lock}: its one key's, when the caller has it.)
        """
        deferred = waiter.deferred
        assert deferred is not None
        waiter.deferred = None
        self._waiting -= 1
        if waiter.timeout_at is not None:
            self._wait_timeouts.discard(waiter, waiter.timeout_at)
        if waiter.keys is None:
            self._shrink_queue(lock or self._locks[waiter.key], 0, waiter.shared)
        else:
            for key in waiter.keys:
                self._shrink_queue(self._locks[key], 1, waiter.shared)
            spread = self._spread.get(waiter.owner)
            if spread is not None:
                spread -= len(waiter.keys) - 1
                if spread:
                    self._spread[waiter.owner] = spread
                else:
                    del self._spread[waiter.owner]
        return deferred

    def _shrink_queue(self, lock: _Lock, multi: int, shared: bool) -> None:
        """One waiter (C{multi}: a multi-key one; C{shared}: a shared one) has left C{lock}'s queue."""
        lock.waiting -= 1
        lock.multi -= multi
        if shared:
            lock.shared -= 1
        self.version += 1
        waiters = lock.waiters
        assert waiters is not None
        if not lock.waiting:
            lock.waiters = None
        elif len(waiters) > 2 * lock.waiting + 16:
            lock.waiters = deque(w for w in waiters if w.deferred is not None)

    def _remove_holder(self, lock: _Lock, grant: Grant, why: str = RELEASED) -> None:
        """Take C{grant} from C{lock}'s holders: RELEASED, EXPIRED or LOST (its owner gone)."""
        lock.holders.remove(grant)
        if not lock.holders:
            if grant.mode is SHARED:
                self.shared_keys -= 1
            if self._hold_watcher is not None:
                self._hold_watcher(grant.key, False)
        self._granted -= 1
        self.version += 1
        if grant.expires_at is not None:
            self._expiries.discard(grant, grant.expires_at)
        if self.observer is not None:
            if why is EXPIRED:
                self.observer.expired(grant)
            else:
                self.observer.released(grant)
        if self._watchers and (self._prefix_lengths or grant.key in self._key_watchers):
            self._tell(why, grant.key, grant)

    def _release_grant(self, grant: Grant, why: str = RELEASED) -> bool:
        """Release C{grant} if it is still its owner's hold on its key (C{why}: RELEASED or EXPIRED)."""
        if not self._holds(grant):
            return False
        self._deliver(self._take_back(grant, why))
        return True

    def _take_back(self, grant: Grant, why: str = RELEASED) -> _Granted:
        """Release a grant still held; return the grants it made room for, untold."""
        key, owner = grant.key, grant.owner
        self._forget_entry(owner, self._owners[owner], key)
        lock = self._locks[key]
        self._remove_holder(lock, grant, why)
        granted = self._admit(key, lock)
        self._forget_if_idle(key)
        return granted

    def _deliver(self, granted: _Granted) -> None:
        """Fire the Deferreds of new grants, once the table is final."""
        for deferred, given in granted:
            grants = given.grants if isinstance(given, _ManyGranted) else [given]
            if deferred.called:
                # An earlier callback cancelled it after it was granted but
                # before it was told: give the grant back.
                for grant in grants:
                    grant.release()
            elif not all(self._holds(grant) for grant in grants):
                # An earlier callback released it (or its owner) first: all
                # or nothing.
                for grant in grants:
                    grant.release()
                deferred.cancel()
            elif isinstance(given, _ManyGranted):
                self._answer_many(deferred, given)
            else:
                deferred.callback(given)

    def _answer_many(self, deferred: Deferred, given: _ManyGranted) -> None:
        """
        The answer lists every key asked for, in their order, those held
        already renewed now.  All or nothing: if one of those was given up
        (released, expired) while the request waited, the new grants are
        given back and the request fails as timed out, naming the lost keys.
        """
        entries = self._owners[given.owner]
        answer = [entries.get(key) for key in given.asked]
        lost = [key for key, entry in zip(given.asked, answer) if not isinstance(entry, Grant)]
        if lost:
            granted: _Granted = []
            for taken in given.grants:
                granted.extend(self._take_back(taken))
            deferred.errback(LockTimeout(given.asked[0], lost))
            self._deliver(granted)
            return
        new = {id(grant) for grant in given.grants}
        for entry in answer:
            if id(entry) not in new:
                self._renew(entry, given.expires)  # type: ignore[arg-type]
                if given.value is not None:
                    entry.value = given.value  # type: ignore[union-attr]
        deferred.callback(answer)

    def _holds(self, grant: Grant) -> bool:
        """Whether C{grant} is still its owner's hold on its key."""
        held = self._owners.get(grant.owner)
        return held is not None and held.get(grant.key) is grant

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter out of its queues, leaving its Deferred unfired."""
        if waiter.deferred is None:
            return
        self._leave(waiter)
        keys = waiter.keys or (waiter.key,)
        entries = self._owners[waiter.owner]
        for key in keys:
            self._forget_entry(waiter.owner, entries, key)
        granted: _Granted = []
        if waiter.keys is not None or waiter.shared or self._locks[waiter.key].shared:
            # Where it was the candidate, or held back waiters of the other
            # mode, others may be admitted now.
            for key in keys:
                granted.extend(self._admit(key, self._locks[key]))
        for key in keys:
            self._forget_if_idle(key)
        self._deliver(granted)

    # -- clock events ----------------------------------------------------

    def _expire(self, grant: Grant) -> None:
        self._release_grant(grant, EXPIRED)

    def _time_out(self, waiter: _Waiter) -> None:
        deferred = waiter.deferred
        assert deferred is not None
        if waiter.keys is None:
            error = LockTimeout(waiter.key)
        else:
            busy = [
                key
                for key in waiter.keys
                if not (
                    self._shared_admits(self._locks[key], waiter)
                    if waiter.shared
                    else self._candidate(self._locks[key]) is waiter
                )
            ]
            error = LockTimeout(waiter.key, busy)
        self._withdraw(waiter)
        if self.observer is not None:
            self.observer.timed_out(waiter.key)
        if not deferred.called:  # (a grant _withdraw handed on may have cancelled it)
            deferred.errback(error)

    # -- bookkeeping -----------------------------------------------------

    def _owner_entries(self, owner: Hashable) -> dict[str, _Held]:
        entries = self._owners.get(owner)
        if entries is None:
            entries = self._owners[owner] = {}
        return entries

    def _forget_entry(self, owner: Hashable, entries: dict[str, _Held], key: str) -> None:
        del entries[key]
        if not entries:
            del self._owners[owner]

    def _lock_of(self, key: str) -> _Lock:
        """C{key}'s lock, made if it has none (the caller checked max-keys)."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = _Lock()
            if self._prefix_lengths:
                self._tell(APPEARED, key, None)
        return lock

    def _forget_if_idle(self, key: str) -> None:
        """Drop a key nobody holds or waits for: an idle key leaves no trace."""
        lock = self._locks.get(key)
        if lock is not None and not lock.holders and not lock.waiting:
            del self._locks[key]
            if self._prefix_lengths:
                self._tell(DISAPPEARED, key, None)
