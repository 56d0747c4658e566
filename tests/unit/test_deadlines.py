"""
Tests for L{jesync.deadlines.Deadlines}: one shared timer for many deadlines.

Time is driven by a L{Clock}.  An item may fire at most one tick
(1 / TICKS_PER_SECOND seconds) after its deadline and never before it.
"""

from __future__ import annotations

import random

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.deadlines import TICKS_PER_SECOND, Deadlines

TICK = 1 / TICKS_PER_SECOND
STEP = 0.001
# Float sums of clock steps may land a hair on either side of a deadline.
EPSILON = 1e-9


class DeadlinesTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.fired: list[tuple[object, float]] = []
        # What to do when an item fires, by item (for reentrancy tests).
        self.on_fire: dict[object, object] = {}
        self.deadlines: Deadlines[object] = Deadlines(self.clock, self._fire)

    def _fire(self, item: object) -> None:
        self.fired.append((item, self.clock.seconds()))
        action = self.on_fire.get(item)
        if action is not None:
            action()

    # -- helpers ---------------------------------------------------------

    def advance_to(self, when: float) -> None:
        self.clock.advance(max(0.0, when - self.clock.seconds()))

    def run_until(self, end: float) -> None:
        """Step the clock to C{end} in 1 ms steps, so every firing time is observed closely."""
        start = self.clock.seconds()
        steps = round((end - start) / STEP)
        for n in range(1, steps + 1):
            self.advance_to(start + n * STEP)

    def fired_items(self) -> list[object]:
        return [item for item, _ in self.fired]

    def assertFiredOnTime(self, expected: dict[object, float]) -> None:
        """Each item in C{expected} fired once, not before its deadline and at most a tick (plus one step) after."""
        times = dict(self.fired)
        self.assertEqual(len(self.fired), len(times), "an item fired twice")
        self.assertEqual(set(times), set(expected))
        for item, deadline in expected.items():
            self.assertGreaterEqual(times[item], deadline - EPSILON, f"{item!r} fired early")
            self.assertLessEqual(times[item], deadline + TICK + STEP + EPSILON, f"{item!r} fired late")

    # -- order and timing ------------------------------------------------

    def test_items_fire_in_deadline_order(self) -> None:
        deadlines = {"e": 2.0, "a": 0.1, "c": 0.3, "b": 0.25, "d": 0.5}
        for item, at in deadlines.items():
            self.deadlines.add(item, at)
        self.run_until(2.1)
        self.assertEqual(self.fired_items(), ["a", "b", "c", "d", "e"])
        self.assertFiredOnTime(deadlines)

    def test_item_does_not_fire_before_its_deadline(self) -> None:
        self.deadlines.add("x", 1.005)
        self.advance_to(1.005 - 1e-6)
        self.assertEqual(self.fired, [])

    def test_item_fires_within_one_tick_of_its_deadline(self) -> None:
        self.deadlines.add("x", 1.005)
        self.advance_to(1.005 + TICK)
        self.assertEqual(self.fired_items(), ["x"])

    def test_item_on_a_tick_boundary_fires_at_its_deadline(self) -> None:
        self.deadlines.add("x", 3.0)
        self.advance_to(3.0)
        self.assertEqual(self.fired, [("x", 3.0)])

    def test_many_random_deadlines_fire_on_time_and_in_order(self) -> None:
        rng = random.Random(1234)
        deadlines = {n: rng.uniform(0, 5) for n in range(500)}
        for item, at in deadlines.items():
            self.deadlines.add(item, at)
        self.run_until(5.1)
        self.assertFiredOnTime(deadlines)
        in_fire_order = [deadlines[item] for item in self.fired_items()]
        # In deadline order, up to the tick that items sharing it fire in.
        for earlier, later in zip(in_fire_order, in_fire_order[1:]):
            self.assertLess(earlier, later + TICK)

    def test_items_in_one_tick_fire_in_the_order_added(self) -> None:
        for item, at in [("first", 1.004), ("second", 1.001), ("third", 1.009)]:
            self.deadlines.add(item, at)
        self.advance_to(1.01)
        self.assertEqual(self.fired_items(), ["first", "second", "third"])

    def test_earlier_item_added_later_reschedules_the_timer(self) -> None:
        self.deadlines.add("late", 5.0)
        self.deadlines.add("early", 1.0)
        self.run_until(5.1)
        self.assertEqual(self.fired_items(), ["early", "late"])
        self.assertFiredOnTime({"early": 1.0, "late": 5.0})

    def test_item_already_due_when_added_fires_at_once(self) -> None:
        self.clock.advance(10)
        self.deadlines.add("overdue", 4.0)
        self.clock.advance(0)
        self.assertEqual(self.fired, [("overdue", 10.0)])

    def test_late_wakeup_fires_everything_due_in_deadline_order(self) -> None:
        for item, at in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("later", 20.0)]:
            self.deadlines.add(item, at)
        self.clock.advance(10)
        self.assertEqual(self.fired_items(), ["a", "b", "c"])
        self.run_until(20.1)
        self.assertEqual(self.fired_items(), ["a", "b", "c", "later"])

    # -- removal and size ------------------------------------------------

    def test_removed_item_never_fires(self) -> None:
        self.deadlines.add("kept", 2.0)
        self.deadlines.add("removed", 1.0)
        self.deadlines.discard("removed", 1.0)
        self.run_until(2.1)
        self.assertEqual(self.fired_items(), ["kept"])
        self.assertFiredOnTime({"kept": 2.0})

    def test_removing_one_item_of_a_tick_keeps_the_others(self) -> None:
        for item in ["a", "b", "c"]:
            self.deadlines.add(item, 1.0)
        self.deadlines.discard("b", 1.0)
        self.advance_to(1.0)
        self.assertEqual(self.fired_items(), ["a", "c"])

    def test_discarding_an_item_that_has_fired_does_nothing(self) -> None:
        self.deadlines.add("fired", 1.0)
        self.deadlines.add("pending", 2.0)
        self.advance_to(1.0)
        self.deadlines.discard("fired", 1.0)
        self.deadlines.discard("never-added", 2.0)
        self.advance_to(2.0)
        self.assertEqual(self.fired_items(), ["fired", "pending"])

    def test_no_timer_once_the_last_item_fires(self) -> None:
        """A tick emptied earlier by discard() does not keep an idle queue's timer alive."""
        self.deadlines.add("fires", 1.0)
        self.deadlines.add("discarded", 5.0)
        self.deadlines.discard("discarded", 5.0)
        self.advance_to(1.0)
        self.assertEqual(self.fired_items(), ["fires"])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.deadlines.add("later", 7.0)
        self.advance_to(7.0)
        self.assertEqual(self.fired_items(), ["fires", "later"])

    def test_no_timer_for_an_item_added_and_discarded_while_firing(self) -> None:
        """An expiry that hands a key on, whose new holder releases at once: nothing is left due, no timer."""

        def hand_on() -> None:
            self.deadlines.add("next holder", 3.0)
            self.deadlines.discard("next holder", 3.0)

        self.on_fire["expires"] = hand_on
        self.deadlines.add("expires", 1.0)
        self.advance_to(1.0)
        self.assertEqual(self.fired_items(), ["expires"])
        self.assertEqual(len(self.deadlines), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_failing_callback_does_not_stop_later_deadlines(self) -> None:
        """The failure is logged, and the items after it still fire on time."""

        def fail() -> None:
            raise RuntimeError("boom")

        self.on_fire["failing"] = fail
        self.deadlines.add("failing", 1.0)
        self.deadlines.add("same-tick", 1.0)
        self.deadlines.add("later", 2.0)
        self.run_until(2.0 + TICK)
        self.assertFiredOnTime({"failing": 1.0, "same-tick": 1.0, "later": 2.0})
        [error] = self.flushLoggedErrors(RuntimeError)
        self.assertEqual(str(error.value), "boom")

    def test_len_counts_pending_items(self) -> None:
        self.deadlines.add("a", 1.0)
        self.deadlines.add("b", 1.0)
        self.deadlines.add("c", 2.0)
        self.assertEqual(len(self.deadlines), 3)
        self.deadlines.discard("c", 2.0)
        self.assertEqual(len(self.deadlines), 2)
        self.advance_to(1.0)
        self.assertEqual(len(self.deadlines), 0)

    def test_removing_everything_leaves_it_empty_and_silent(self) -> None:
        for n in range(100):
            self.deadlines.add(n, 1 + n * 0.1)
        for n in range(100):
            self.deadlines.discard(n, 1 + n * 0.1)
        self.assertEqual(len(self.deadlines), 0)
        self.clock.advance(100)
        self.assertEqual(self.fired, [])

    def test_tick_heap_stays_bounded_under_churn(self) -> None:
        """Adding and removing items at many distinct ticks does not grow the heap of ticks without bound."""
        self.deadlines.add("long-lived", 1000.0)
        for n in range(20_000):
            at = 1 + n * TICK
            self.deadlines.add(n, at)
            self.deadlines.discard(n, at)
        self.assertLess(len(self.deadlines._ticks), 200)
        self.assertEqual(len(self.deadlines), 1)
        self.advance_to(1000.0)
        self.assertEqual(self.fired, [("long-lived", 1000.0)])

    def test_tick_heap_stays_bounded_when_one_tick_is_reused(self) -> None:
        """Emptying and refilling the same tick over and over does not pile up copies of it."""
        for _ in range(20_000):
            self.deadlines.add("a", 5.0)
            self.deadlines.discard("a", 5.0)
        self.assertLess(len(self.deadlines._ticks), 200)

    def test_tick_heap_stays_bounded_while_firing(self) -> None:
        """A steady stream of items, each removed or fired, keeps the heap small."""
        for n in range(5_000):
            now = self.clock.seconds()
            self.deadlines.add(("fired", n), now + 0.005)
            self.deadlines.add(("removed", n), now + 0.5 + n * TICK)
            self.deadlines.discard(("removed", n), now + 0.5 + n * TICK)
            self.clock.advance(TICK)
        self.assertLess(len(self.deadlines._ticks), 200)
        self.clock.advance(TICK)
        self.assertEqual(len(self.fired), 5_000)

    # -- reentrancy: fire() adds and removes -----------------------------

    def test_items_added_while_firing_fire_on_time(self) -> None:
        """Items added from the fire callback, before, between and after the pending ones, fire on time."""
        expected = {"trigger": 0.5, "pending-1": 1.0, "pending-2": 3.0}
        for item, at in expected.items():
            self.deadlines.add(item, at)

        def add_more() -> None:
            now = self.clock.seconds()
            for item, at in [
                ("before-pending", now + 0.3),
                ("between", 2.0),
                ("after-all", 4.0),
                ("same-tick", now),
                ("next-tick", now + 0.004),
            ]:
                expected[item] = max(at, now)
                self.deadlines.add(item, at)

        self.on_fire["trigger"] = add_more
        self.run_until(4.1)
        self.assertFiredOnTime(expected)
        self.assertEqual(
            self.fired_items(),
            ["trigger", "same-tick", "next-tick", "before-pending", "pending-1", "between", "pending-2", "after-all"],
        )

    def test_earlier_item_added_while_firing_beats_a_pending_one(self) -> None:
        """An item added by fire() with a deadline before the next pending one fires first, on time."""
        self.deadlines.add("trigger", 1.0)
        self.deadlines.add("pending", 9.0)
        self.on_fire["trigger"] = lambda: self.deadlines.add("urgent", 1.5)
        self.run_until(9.1)
        self.assertEqual(self.fired_items(), ["trigger", "urgent", "pending"])
        self.assertFiredOnTime({"trigger": 1.0, "urgent": 1.5, "pending": 9.0})

    def test_items_added_while_firing_late_still_fire(self) -> None:
        """When the clock jumps past many deadlines, items added during that run that are already due fire in it too."""
        self.deadlines.add("a", 1.0)
        self.deadlines.add("b", 2.0)
        self.on_fire["a"] = lambda: self.deadlines.add("overdue", 1.5)
        self.on_fire["b"] = lambda: self.deadlines.add("future", 7.0)
        self.clock.advance(5)
        self.assertEqual(self.fired_items(), ["a", "overdue", "b"])
        self.run_until(7.1)
        self.assertEqual(self.fired_items(), ["a", "overdue", "b", "future"])
        self.assertFiredOnTime({"a": 5.0, "overdue": 5.0, "b": 5.0, "future": 7.0})

    def test_item_rescheduling_itself_from_fire_repeats_on_time(self) -> None:
        """An item that fire() adds again, a little later each time, fires every time on time."""
        period = 0.237
        due = [period]

        def again() -> None:
            if len(due) < 20:
                due.append(due[-1] + period)
                self.deadlines.add("periodic", due[-1])

        self.on_fire["periodic"] = again
        self.deadlines.add("periodic", period)
        self.run_until(period * 21)
        times = [when for _, when in self.fired]
        self.assertEqual(len(times), 20)
        for when, deadline in zip(times, due):
            self.assertGreaterEqual(when, deadline - EPSILON)
            self.assertLessEqual(when, deadline + TICK + STEP + EPSILON)

    def test_fire_removing_a_pending_item_of_the_same_tick(self) -> None:
        self.deadlines.add("first", 1.0)
        self.deadlines.add("second", 1.0)
        self.deadlines.add("third", 1.0)
        self.on_fire["first"] = lambda: self.deadlines.discard("second", 1.0)
        self.advance_to(1.0)
        self.assertEqual(self.fired_items(), ["first", "third"])
        self.assertEqual(len(self.deadlines), 0)

    def test_fire_removing_the_next_pending_item(self) -> None:
        self.deadlines.add("first", 1.0)
        self.deadlines.add("second", 2.0)
        self.deadlines.add("third", 3.0)
        self.on_fire["first"] = lambda: self.deadlines.discard("second", 2.0)
        self.run_until(3.1)
        self.assertEqual(self.fired_items(), ["first", "third"])
        self.assertFiredOnTime({"first": 1.0, "third": 3.0})

    def test_fire_readding_into_the_tick_being_fired(self) -> None:
        """An item added by fire() into the tick being fired, after its bucket emptied, fires in the same run."""
        self.deadlines.add("only", 1.0)
        self.on_fire["only"] = lambda: self.deadlines.add("again", 1.0)
        self.advance_to(1.0)
        self.assertEqual(self.fired, [("only", 1.0), ("again", 1.0)])
        self.assertEqual(len(self.deadlines), 0)

    def test_random_adds_and_removes_from_fire_stay_on_time(self) -> None:
        """A seeded mix of adds and removes, many of them from inside fire(), never fires early, late or twice."""
        rng = random.Random(42)
        pending: dict[int, float] = {}
        expected: dict[int, float] = {}
        counter = iter(range(10**9))

        def add() -> None:
            item = next(counter)
            now = self.clock.seconds()
            at = now + rng.choice([0.0, 0.003, 0.01, 0.0123, rng.uniform(0, 0.2), rng.uniform(0, 3)])
            pending[item] = at
            expected[item] = at
            self.on_fire[item] = lambda: on_fire(item)
            self.deadlines.add(item, at)

        def remove() -> None:
            if pending:
                item = rng.choice(sorted(pending))
                self.deadlines.discard(item, pending.pop(item))
                del expected[item]

        def on_fire(item: int) -> None:
            del pending[item]
            for _ in range(rng.randint(0, 2)):
                rng.choice([add, add, remove])()

        for _ in range(300):
            rng.choice([add, add, remove, lambda: self.run_until(self.clock.seconds() + rng.uniform(0, 0.1))])()
            self.assertEqual(len(self.deadlines), len(pending))
        self.run_until(self.clock.seconds() + 4)
        self.assertEqual(pending, {})
        self.assertFiredOnTime(expected)
