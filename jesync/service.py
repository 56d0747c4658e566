"""
The lock table: counting locks with fair queues, wait timeouts and expiries.

Everything here is driven by calls from protocols (or an embedding
application) and by one clock; nothing here knows about sockets.

The grant rule (JESync's counting semaphore): with C{g} holders, a request R
may join them when C{g + 1 <= R.max_concurrent} and C{g + 1 <= H.max_concurrent}
for every holder H.  Waiting requests are considered in arrival order and the
first one that may join is granted, repeatedly, until none may.  So a request
that allows more concurrency can pass an earlier, stricter one.  After every
change no waiter could be granted, which is why a new request is either
granted at once or queued, without looking at the queue.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Union

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from jesync.deadlines import Deadlines
from jesync.errors import AlreadyWaiting, LimitReached, LockTimeout
from jesync.interfaces import IGrant, ILockObserver, ILockService, KeyStatus, ListingOrder, Totals
from jesync.listing import listing_sort_key

DEFAULT_EXPIRES = 120
WAIT_FOREVER = -1

_new_status = tuple.__new__


@implementer(IGrant)
class Grant:
    """One owner's hold on a key: the handle L{LockService.acquire} returns."""

    __slots__ = ("_service", "key", "owner", "max_concurrent", "granted_at", "expires_at")

    def __init__(
        self,
        service: LockService,
        key: str,
        owner: Hashable,
        max_concurrent: int,
        granted_at: float,
        expires_at: float | None,
    ) -> None:
        self._service = service
        self.key = key
        self.owner = owner
        self.max_concurrent = max_concurrent
        self.granted_at = granted_at
        self.expires_at = expires_at

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
    """A queued request.  C{deferred} is None once it has left the queue."""

    __slots__ = ("key", "owner", "max_concurrent", "expires", "requested_at", "timeout_at", "deferred")

    def __init__(
        self,
        key: str,
        owner: Hashable,
        max_concurrent: int,
        expires: float,
        requested_at: float,
        timeout_at: float | None,
        deferred: Deferred[Grant],
    ) -> None:
        self.key = key
        self.owner = owner
        self.max_concurrent = max_concurrent
        self.expires = expires
        self.requested_at = requested_at
        self.timeout_at = timeout_at
        self.deferred: Deferred[Grant] | None = deferred


class _Lock:
    """
    The holders and waiters of one key.

    C{waiters} is created on the first wait and dropped when nobody waits.  A
    waiter that leaves from the middle (timeout, cancel) is only marked and
    skipped later, so leaving is O(1); C{waiting} counts the live ones.
    """

    __slots__ = ("holders", "waiters", "waiting")

    def __init__(self) -> None:
        self.holders: list[Grant] = []
        self.waiters: deque[_Waiter] | None = None
        self.waiting = 0

    def limit(self) -> float:
        """The most holders every current holder accepts."""
        return min((h.max_concurrent for h in self.holders), default=float("inf"))


_Held = Union[Grant, _Waiter]


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


@implementer(ILockService)
class LockService:
    """
    The one lock table a server shares among all its protocols.

    @param clock: the reactor (or a L{twisted.internet.task.Clock} in tests);
        wait timeouts and expiries are scheduled on it.
    @param max_keys: the most keys in use at once (None: no limit).
    @param max_waiters: the most requests waiting for one key.
    @param max_held: the most grants plus waits one owner may have.
    @param max_total_waits: the most requests waiting at once, all keys and
        owners together.
    @param observer: an L{ILockObserver} told of grants, timeouts,
        releases and expiries (for metrics).
    """

    def __init__(
        self,
        clock: IReactorTime,
        *,
        max_keys: int | None = None,
        max_waiters: int | None = None,
        max_held: int | None = None,
        max_total_waits: int | None = None,
        observer: ILockObserver | None = None,
    ) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self.max_waiters = max_waiters
        self.max_held = max_held
        self.max_total_waits = max_total_waits
        self.observer = observer
        self._locks: dict[str, _Lock] = {}
        # owner -> key -> its grant of, or wait for, that key
        self._owners: dict[Hashable, dict[str, _Held]] = {}
        self._granted = 0
        self._waiting = 0
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
    ) -> Deferred[Grant]:
        result = self.request(key, owner, max_concurrent, timeout, expires)
        return succeed(result) if isinstance(result, Grant) else result

    def request(
        self,
        key: str,
        owner: Hashable,
        max_concurrent: int = 1,
        timeout: float = WAIT_FOREVER,
        expires: float = DEFAULT_EXPIRES,
    ) -> Union[Grant, Deferred[Grant]]:
        check_request(max_concurrent, timeout, expires)
        held = self._owners.get(owner)
        current = held.get(key) if held is not None else None
        if current is not None:
            if isinstance(current, Grant):
                self._renew(current, expires)
                return current
            return fail(AlreadyWaiting(key))

        if self.max_held is not None and held is not None and len(held) >= self.max_held:
            raise LimitReached("max-held", self.max_held)
        lock = self._locks.get(key)
        if lock is None:
            if self.max_keys is not None and len(self._locks) >= self.max_keys:
                raise LimitReached("max-keys", self.max_keys)
            lock = self._locks[key] = _Lock()
        granted = len(lock.holders)
        if granted < max_concurrent and granted < lock.limit():
            grant = self._grant(lock, key, owner, max_concurrent, expires)
            if self.observer is not None:
                self.observer.granted(grant, 0.0)
            return grant
        if timeout == 0:
            return fail(LockTimeout(key))
        if self.max_waiters is not None and lock.waiting >= self.max_waiters:
            raise LimitReached("max-waiters", self.max_waiters)
        if self.max_total_waits is not None and self._waiting >= self.max_total_waits:
            raise LimitReached("max-total-waits", self.max_total_waits)

        now = self.clock.seconds()
        timeout_at = None if timeout == WAIT_FOREVER else now + timeout
        deferred: Deferred[Grant] = Deferred(lambda d: self._withdraw(waiter))
        waiter = _Waiter(key, owner, max_concurrent, expires, now, timeout_at, deferred)
        if lock.waiters is None:
            lock.waiters = deque()
        lock.waiters.append(waiter)
        lock.waiting += 1
        self._waiting += 1
        self._owner_entries(owner)[key] = waiter
        if timeout_at is not None:
            self._wait_timeouts.add(waiter, timeout_at)
        return deferred

    def release(self, key: str, owner: Hashable) -> bool:
        held = self._owners.get(owner)
        grant = held.get(key) if held is not None else None
        if not isinstance(grant, Grant):
            return False
        return self._release_grant(grant)

    def release_all(self, owner: Hashable) -> None:
        entries = self._owners.pop(owner, None)
        if not entries:
            return
        cancelled = []
        freed = []
        for key, entry in entries.items():
            lock = self._locks[key]
            if isinstance(entry, Grant):
                self._remove_holder(lock, entry)
                freed.append(key)
            else:
                cancelled.append(self._leave_queue(lock, entry))
        granted = []
        for key in freed:
            granted.extend(self._admit(key, self._locks[key]))
        for key in entries:
            self._forget_if_idle(key)
        self._deliver(granted)
        for deferred in cancelled:
            deferred.cancel()

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

    def totals(self) -> Totals:
        return Totals(len(self._locks), self._granted, self._waiting)

    def holders(self, key: str) -> list[Grant]:
        lock = self._locks.get(key)
        return list(lock.holders) if lock is not None else []

    def listing(self, order: ListingOrder = "key") -> list[KeyStatus]:
        return [KeyStatus(*row) for row in self.snapshot(order)]

    def snapshot(self, order: ListingOrder = "key") -> list[tuple[str, int, int]]:
        # Plain tuples: a million KeyStatus take several times as long to make.
        rows = [(key, len(lock.holders), lock.waiting) for key, lock in self._locks.items()]
        rows.sort(key=listing_sort_key(order))
        return rows

    # -- the rules -------------------------------------------------------

    def _grant(self, lock: _Lock, key: str, owner: Hashable, max_concurrent: int, expires: float) -> Grant:
        now = self.clock.seconds()
        expires_at = now + expires if expires else None
        grant = Grant(self, key, owner, max_concurrent, now, expires_at)
        if lock.holders:
            lock.holders.append(grant)
        else:
            # A list made with its one item is 24 bytes smaller than an
            # empty one grown by append (which allocates room for four).
            lock.holders = [grant]
        self._granted += 1
        self._owner_entries(owner)[key] = grant
        if expires_at is not None:
            self._expiries.add(grant, expires_at)
        return grant

    def _renew(self, grant: Grant, expires: float) -> None:
        """Restart C{grant}'s failsafe; its C{max_concurrent} stays as granted."""
        if grant.expires_at is not None:
            self._expiries.discard(grant, grant.expires_at)
        grant.expires_at = self.clock.seconds() + expires if expires else None
        if grant.expires_at is not None:
            self._expiries.add(grant, grant.expires_at)

    def _admit(self, key: str, lock: _Lock) -> list[tuple[Deferred[Grant], Grant]]:
        """
        Grant waiters, in arrival order, while any may join the holders.

        In the common case (all requests with the same C{max_concurrent}) this
        looks only at the head of the queue.  The Deferreds are returned
        rather than fired so that callers see the key's final state.
        """
        granted: list[tuple[Deferred[Grant], Grant]] = []
        if not lock.waiting:
            return granted
        limit = lock.limit()
        while lock.waiting:
            waiters = lock.waiters  # _leave_queue may have compacted it
            assert waiters is not None
            while waiters[0].deferred is None:
                waiters.popleft()
            joining = len(lock.holders) + 1
            if joining > limit:
                break
            for index, waiter in enumerate(waiters):
                if waiter.deferred is not None and waiter.max_concurrent >= joining:
                    break
            else:
                break
            del waiters[index]
            deferred = self._leave_queue(lock, waiter)
            grant = self._grant(lock, key, waiter.owner, waiter.max_concurrent, waiter.expires)
            if self.observer is not None:
                self.observer.granted(grant, grant.granted_at - waiter.requested_at)
            granted.append((deferred, grant))
            limit = min(limit, waiter.max_concurrent)
        return granted

    def _leave_queue(self, lock: _Lock, waiter: _Waiter) -> Deferred[Grant]:
        """Take C{waiter} out of the queue's count and its timeout; return its Deferred."""
        deferred = waiter.deferred
        assert deferred is not None
        waiter.deferred = None
        lock.waiting -= 1
        self._waiting -= 1
        if waiter.timeout_at is not None:
            self._wait_timeouts.discard(waiter, waiter.timeout_at)
        waiters = lock.waiters
        assert waiters is not None
        if not lock.waiting:
            lock.waiters = None
        elif len(waiters) > 2 * lock.waiting + 16:
            lock.waiters = deque(w for w in waiters if w.deferred is not None)
        return deferred

    def _remove_holder(self, lock: _Lock, grant: Grant, expired: bool = False) -> None:
        lock.holders.remove(grant)
        self._granted -= 1
        if grant.expires_at is not None:
            self._expiries.discard(grant, grant.expires_at)
        if self.observer is not None:
            if expired:
                self.observer.expired(grant)
            else:
                self.observer.released(grant)

    def _release_grant(self, grant: Grant, expired: bool = False) -> bool:
        """Release C{grant} if it is still its owner's hold on its key."""
        if not self._holds(grant):
            return False
        key, owner = grant.key, grant.owner
        self._forget_entry(owner, self._owners[owner], key)
        lock = self._locks[key]
        self._remove_holder(lock, grant, expired)
        granted = self._admit(key, lock)
        self._forget_if_idle(key)
        self._deliver(granted)
        return True

    def _deliver(self, granted: list[tuple[Deferred[Grant], Grant]]) -> None:
        """Fire the Deferreds of new grants, once the table is final."""
        for deferred, grant in granted:
            if deferred.called:
                # An earlier callback cancelled it after it was granted but
                # before it was told: give the grant back.
                grant.release()
            elif not self._holds(grant):
                # An earlier callback released it (or its owner) first.
                deferred.cancel()
            else:
                deferred.callback(grant)

    def _holds(self, grant: Grant) -> bool:
        """Whether C{grant} is still its owner's hold on its key."""
        held = self._owners.get(grant.owner)
        return held is not None and held.get(grant.key) is grant

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter out of its queue, leaving its Deferred unfired."""
        if waiter.deferred is None:
            return
        key = waiter.key
        self._leave_queue(self._locks[key], waiter)
        self._forget_entry(waiter.owner, self._owners[waiter.owner], key)
        self._forget_if_idle(key)

    # -- clock events ----------------------------------------------------

    def _expire(self, grant: Grant) -> None:
        self._release_grant(grant, expired=True)

    def _time_out(self, waiter: _Waiter) -> None:
        deferred = waiter.deferred
        assert deferred is not None
        self._withdraw(waiter)
        if self.observer is not None:
            self.observer.timed_out(waiter.key)
        deferred.errback(LockTimeout(waiter.key))

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

    def _forget_if_idle(self, key: str) -> None:
        """Drop a key nobody holds or waits for: an idle key leaves no trace."""
        lock = self._locks.get(key)
        if lock is not None and not lock.holders and not lock.waiting:
            del self._locks[key]
