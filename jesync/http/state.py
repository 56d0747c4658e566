"""
What a server's HTTP API keeps between requests.  Each piece is an
attribute of the server's L{jesync.http.api.ApiContext}, made with it and
gone with it: one per API, so one per server (in cluster mode, one per
term), and none at module level, so two servers in one process (the tests
run many) share none of it, and what a server holds is read in one place.

 - C{listing_snapshots} (L{ListingSnapshots}): the last listing snapshot of
   each order, kept for the next page while the table does not change, at
   most half of C{--max-listing-memory} and at most L{SNAPSHOT_KEPT}
   seconds after its last page (the rules are L{jesync.http.locks}'s);
   released when the server stops (L{jesync.http.listener.ApiClosing}).
 - C{busiest_keys} (L{BusiestKeys}): the status document's top, found again
   only as often as L{CHEAP_PASS} and L{PASS_SHARE} allow (the rules are
   L{jesync.http.status}'s).
 - C{leader_observers} (L{LeaderObservers}): each election's observe
   streams, told when its leader proclaims (L{jesync.http.streams}).
 - C{latest_status}: the status document last made for a status stream,
   and what it counted (its L{StatusSignature}): streams that tick while
   nothing changed send that one (L{jesync.http.streams}).

This module names none of the routes' modules: they reach it through the
context (L{jesync.http.api} imports it; it imports only the layers below).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from jesync.connections.listings import ROW_BYTES, SnapshotRead
from jesync.connections.policy import ConnectionPolicy

# How long the snapshot a listing page was read from is kept for the next
# page while the table does not change, in seconds.
SNAPSHOT_KEPT = 5.0

#: How many keys the status document's C{top} lists.
TOP_COUNT = 20
#: A pass over the table that takes at most this (seconds) is redone whenever the table changed.
CHEAP_PASS = 0.005
#: A costlier pass is not redone within this many times what it took.
PASS_SHARE = 20

#: What the status document counts, at a glance: the lock table's version,
#: the sessions, the detached sessions and the connections.
StatusSignature = Tuple[int, int, int, int]


class ListingSnapshots:
    """
    The last listing snapshot of each order, kept while the table has not
    changed (released L{SNAPSHOT_KEPT} seconds after its last page), read
    under C{policy}'s listing budget.
    """

    def __init__(self, locks: Any, policy: ConnectionPolicy, clock: IReactorTime) -> None:
        self.locks = locks
        self.policy = policy
        self.clock = clock
        self.kept: Dict[str, SnapshotRead] = {}
        self.versions: Dict[str, object] = {}
        self.timers: Dict[str, IDelayedCall] = {}

    @property
    def largest_kept(self) -> int:
        """
        The largest snapshot kept between pages, in bytes: half the listing
        budget, so that the line protocols' listing of the same table (a
        snapshot of its own once the table has changed) still fits beside it.
        """
        return self.policy.listings.limit // 2

    def rows(self, order: str) -> Tuple[Sequence[Any], Optional[SnapshotRead]]:
        """
        The table's rows in C{order}: a kept snapshot (and None), or, for a
        table larger than L{largest_kept} allows, a snapshot read for this
        page alone (and its read, to be released once the page is made).
        """
        locks = self.locks
        version = locks.version
        kept = self.kept.get(order)
        if kept is not None and self.versions[order] == version:
            self.timers[order].reset(SNAPSHOT_KEPT)
            return kept.rows, None
        self.drop(order)
        size = locks.totals().keys * ROW_BYTES
        read = self.policy.listings.share(("status", order), version, size, lambda: locks.snapshot(order))
        if size > self.largest_kept:
            return read.rows, read
        self.kept[order] = read
        self.versions[order] = version
        self.timers[order] = self.clock.callLater(SNAPSHOT_KEPT, self.drop, order)
        return read.rows, None

    def drop(self, order: str) -> None:
        """The snapshot kept of C{order}, if any, released."""
        read = self.kept.pop(order, None)
        if read is not None:
            read.release()
        timer = self.timers.pop(order, None)
        if timer is not None and timer.active():
            timer.cancel()

    def drop_all(self) -> None:
        """Every snapshot kept, released (the server stops)."""
        for order in list(self.kept):
            self.drop(order)


class BusiestKeys:
    """One server's top: the keys last found busiest, the version and the time they were found at."""

    def __init__(self, locks: Any, clock: IReactorTime) -> None:
        self.locks = locks
        self.clock = clock
        self.version: Optional[int] = None
        self.keys: List[str] = []
        self.found_at = 0.0
        self.cost = 0.0

    def summaries(self) -> List[Dict[str, Any]]:
        """The top as lock summaries (C{key}, C{mode}: null when not held, C{holders}, C{waiters})."""
        locks = self.locks
        now = self.clock.seconds()
        if self.version != locks.version and (self.cost <= CHEAP_PASS or now - self.found_at >= self.cost * PASS_SHARE):
            started = time.perf_counter()
            self.keys = [row[0] for row in locks.busiest(TOP_COUNT)]
            self.cost = time.perf_counter() - started
            self.version, self.found_at = locks.version, now
        rows: List[Tuple[int, int, str]] = []
        for key in self.keys:
            status = locks.status(key)
            if status.granted or status.waiting:
                rows.append((-status.waiting, -status.granted, key))
        rows.sort()
        summaries = []
        for waiting, granted, key in rows:
            holders = locks.holders(key) if granted else ()
            mode = holders[0].mode if holders else None
            summaries.append({"key": key, "mode": mode, "holders": -granted, "waiters": -waiting})
        return summaries


class Observer(Protocol):
    """An observe stream, as L{LeaderObservers} sees it: it can be told the leader of now."""

    def tell(self) -> None: ...


class LeaderObservers:
    """Each election's observe streams (L{jesync.http.streams.LeaderObserver}), in the order they started."""

    def __init__(self) -> None:
        self._by_election: Dict[str, Dict[Observer, None]] = {}

    def add(self, election: str, observer: Observer) -> None:
        self._by_election.setdefault(election, {})[observer] = None

    def remove(self, election: str, observer: Observer) -> None:
        """C{observer} forgotten (an election none observes is forgotten too)."""
        observers = self._by_election.get(election, {})
        observers.pop(observer, None)
        if not observers:
            self._by_election.pop(election, None)

    def tell(self, election: str) -> None:
        """Every observer of C{election} is told the leader of now (it proclaimed)."""
        for observer in list(self._by_election.get(election, ())):
            observer.tell()
