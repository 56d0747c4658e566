"""
One shared timer for many deadlines.

A lock server holds a deadline for every grant (its expiry failsafe) and every
bounded wait (its timeout).  A ``callLater`` each would cost a DelayedCall
object per lock (hundreds of bytes) and reactor heap churn on every
lock/release cycle.  Instead, deadlines are grouped into buckets of
``1 / TICKS_PER_SECOND`` seconds, and one ``callLater`` is kept for the
earliest bucket.  An item fires at most one tick (10 ms) after its deadline,
never before it; adding and removing an item are O(1) (plus a heap push when
it opens a new bucket).
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Generic, Hashable, TypeVar

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

TICKS_PER_SECOND = 100

_ABSENT = object()

Item = TypeVar("Item", bound=Hashable)


def _tick(at: float) -> int:
    """The first tick at or after time C{at}."""
    return math.ceil(at * TICKS_PER_SECOND)


class Deadlines(Generic[Item]):
    """
    Items, each due at a time, handed to C{fire} once that time has come.

    Items fire in deadline order, and in the order they were added within one
    tick.  C{fire} may add and remove items.
    """

    _log = Logger()

    def __init__(self, clock: IReactorTime, fire: Callable[[Item], object]) -> None:
        self._clock = clock
        self._fire = fire
        # tick -> items due in it (a dict: O(1) removal, insertion order kept)
        self._buckets: dict[int, dict[Item, None]] = {}
        # heap of ticks; may hold ticks whose bucket has since emptied
        self._ticks: list[int] = []
        self._timer: IDelayedCall | None = None
        self._timer_tick = 0

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())

    def add(self, item: Item, at: float) -> None:
        """Fire C{item} once the clock reaches C{at}."""
        tick = _tick(at)
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = {}
            heapq.heappush(self._ticks, tick)
            if self._timer is None or tick < self._timer_tick:
                self._schedule(tick)
        bucket[item] = None

    def discard(self, item: Item, at: float) -> None:
        """Forget C{item}, added with deadline C{at}, unless it has already fired."""
        tick = _tick(at)
        bucket = self._buckets.get(tick)
        if bucket is None or bucket.pop(item, _ABSENT) is _ABSENT:
            return
        if not bucket:
            del self._buckets[tick]
            if not self._buckets:
                # Nothing left: no timer, no stale ticks (an idle server sleeps).
                self._ticks.clear()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                return
            # Emptied ticks stay in the heap until due; rebuild it when they
            # outnumber the live ones so churn cannot grow it without bound.
            if len(self._ticks) > 2 * len(self._buckets) + 64:
                self._ticks = list(self._buckets)
                heapq.heapify(self._ticks)

    def _schedule(self, tick: int) -> None:
        delay = max(0.0, tick / TICKS_PER_SECOND - self._clock.seconds())
        if self._timer is not None:
            self._timer.cancel()
        self._timer_tick = tick
        self._timer = self._clock.callLater(delay, self._run)

    def _run(self) -> None:
        self._timer = None
        # Everything up to the tick we were scheduled for is due, and so is
        # everything up to now if the reactor woke us late.
        due = max(self._timer_tick, math.floor(self._clock.seconds() * TICKS_PER_SECOND))
        while self._ticks and self._ticks[0] <= due:
            tick = self._ticks[0]
            bucket = self._buckets.get(tick)
            if not bucket:
                heapq.heappop(self._ticks)
                self._buckets.pop(tick, None)
                continue
            item = next(iter(bucket))
            del bucket[item]
            try:
                self._fire(item)
            except Exception:
                # A failing callback must not stop every later deadline.
                self._log.failure("deadline callback failed for {item!r}", item=item)
        if not self._buckets:
            # Nothing left: drop the ticks emptied earlier by discard(), and
            # schedule nothing (an idle server sleeps) -- cancelling a timer
            # an add() made while items were firing, for an item discarded
            # since (discard() could not tell: the bucket being fired was
            # still there, empty).
            self._ticks.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        else:
            # (replacing any timer an add() made while items were firing)
            self._schedule(self._ticks[0])
