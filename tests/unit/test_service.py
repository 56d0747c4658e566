"""
Tests for L{jesync.service.LockService}: the lock table, the grant rule, wait
timeouts, expiries and the bookkeeping that leaves no trace of idle keys.

Time is driven by a L{Clock}; timers must fire within L{SLACK} seconds after
their deadline and never before it.
"""

from __future__ import annotations

import random
from typing import Callable, Hashable

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from jesync.errors import AlreadyWaiting, LimitReached, LockTimeout
from jesync.interfaces import IGrant, ILockService, KeyStatus
from jesync.service import Grant, LockService

SLACK = 0.05
STEP = 0.001
EPSILON = 1e-9


class ServiceTestCase(SynchronousTestCase):
    """A L{LockService} on a L{Clock}, and helpers to drive and inspect it."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)

    # -- driving ---------------------------------------------------------

    def grant(self, key: str, owner: Hashable, *args: float, **kwargs: float) -> Grant:
        """Acquire C{key}, which must be granted at once."""
        return self.successResultOf(self.service.acquire(key, owner, *args, **kwargs))

    def wait(self, key: str, owner: Hashable, *args: float, **kwargs: float) -> Deferred[Grant]:
        """Acquire C{key}, which must have to wait."""
        d = self.service.acquire(key, owner, *args, **kwargs)
        self.assertNoResult(d)
        return d

    def advance_to(self, when: float) -> None:
        self.clock.advance(max(0.0, when - self.clock.seconds()))

    def step_to(self, end: float) -> None:
        """Move the clock to C{end} in 1 ms steps, as a real reactor would wake up."""
        start = self.clock.seconds()
        for n in range(1, round((end - start) / STEP) + 1):
            self.advance_to(start + n * STEP)

    def assertHappensOnTime(self, happened: Callable[[], bool], deadline: float) -> float:
        """
        Step the clock in 1 ms steps up to C{deadline + SLACK}: C{happened()}
        must stay false before C{deadline} and become true by then.  Returns
        the clock time at which it was first seen.
        """
        start = self.clock.seconds()
        self.assertFalse(happened(), "happened before the clock moved")
        for n in range(1, round((deadline + SLACK - start) / STEP) + 1):
            self.advance_to(start + n * STEP)
            if happened():
                now = self.clock.seconds()
                self.assertGreaterEqual(now, deadline - EPSILON, f"happened early, at {now}")
                return now
        self.fail(f"did not happen by {deadline} + {SLACK}")

    # -- inspecting ------------------------------------------------------

    def assertStatus(self, key: str, granted: int, waiting: int) -> None:
        self.assertEqual(self.service.status(key), KeyStatus(key, granted, waiting))

    def assertHolds(self, owner: Hashable, key: str) -> None:
        self.assertIsInstance(self.service._owners.get(owner, {}).get(key), Grant)

    def assertForgotten(self, *keys: str) -> None:
        """No trace of C{keys} is left in the lock table or the owner index."""
        for key in keys:
            self.assertNotIn(key, self.service._locks)
            self.assertStatus(key, 0, 0)
            for owner, entries in self.service._owners.items():
                self.assertNotIn(key, entries, f"{owner!r} still has an entry for {key!r}")

    def assertIdle(self) -> None:
        """The service holds nothing at all: no keys, no owners, no deadlines."""
        self.assertEqual(self.service._locks, {})
        self.assertEqual(self.service._owners, {})
        self.assertEqual(len(self.service._expiries), 0)
        self.assertEqual(len(self.service._wait_timeouts), 0)
        self.assertEqual(self.service.listing(), [])
        self.assertEqual(self.service.totals(), (0, 0, 0))


class InterfaceTests(ServiceTestCase):
    def test_service_provides_ILockService(self) -> None:
        self.assertTrue(verifyObject(ILockService, self.service))

    def test_grant_provides_IGrant(self) -> None:
        self.assertTrue(verifyObject(IGrant, self.grant("k", "a")))


class ValidationTests(ServiceTestCase):
    def assertRejected(self, message: str, **kwargs: float) -> None:
        with self.assertRaises(ValueError) as caught:
            self.service.acquire("k", "a", **kwargs)
        self.assertEqual(str(caught.exception), message)

    def test_max_concurrent_below_one(self) -> None:
        self.assertRejected("Max concurrent should be greater or equal than 1", max_concurrent=0)
        self.assertRejected("Max concurrent should be greater or equal than 1", max_concurrent=-3)
        self.assertIdle()

    def test_timeout_below_minus_one(self) -> None:
        self.assertRejected("Timeout should be greater or equal than -1", timeout=-2)
        self.assertIdle()

    def test_negative_expires(self) -> None:
        self.assertRejected("Expire timeout should be greater or equal than 0", expires=-1)
        self.assertIdle()

    def test_boundary_values_are_accepted(self) -> None:
        grant = self.grant("k", "a", max_concurrent=1, timeout=-1, expires=0)
        self.assertIsNone(grant.expires_at)
        self.assertIsInstance(self.grant("j", "a", timeout=0), Grant)

    def test_invalid_renewal_changes_nothing(self) -> None:
        grant = self.grant("k", "a", expires=10)
        self.clock.advance(5)
        self.assertRaises(ValueError, self.service.acquire, "k", "a", expires=-1)
        self.assertEqual(grant.expires_at, 10)
        self.assertStatus("k", 1, 0)

    def test_invalid_request_from_a_waiting_owner_changes_nothing(self) -> None:
        self.grant("k", "holder")
        first = self.wait("k", "a")
        self.assertRaises(ValueError, self.service.acquire, "k", "a", max_concurrent=0)
        self.assertStatus("k", 1, 1)
        self.assertNoResult(first)


class GrantTests(ServiceTestCase):
    def test_grant_attributes(self) -> None:
        owner = object()
        self.clock.advance(7)
        grant = self.grant("k", owner, max_concurrent=3, expires=30)
        self.assertEqual(grant.key, "k")
        self.assertIs(grant.owner, owner)
        self.assertEqual(grant.max_concurrent, 3)
        self.assertEqual(grant.expires_at, 37)

    def test_default_request_is_a_mutex_expiring_after_120_seconds(self) -> None:
        grant = self.grant("k", "a")
        self.assertEqual(grant.max_concurrent, 1)
        self.assertEqual(grant.expires_at, 120)
        self.wait("k", "b")

    def test_seconds_left_counts_down(self) -> None:
        grant = self.grant("k", "a", expires=60)
        self.assertIsInstance(grant.seconds_left, float)
        self.assertEqual(grant.seconds_left, 60.0)
        self.clock.advance(15.5)
        self.assertEqual(grant.seconds_left, 44.5)

    def test_never_expiring_grant(self) -> None:
        grant = self.grant("k", "a", expires=0)
        self.assertIsNone(grant.expires_at)
        self.assertIsNone(grant.seconds_left)
        self.clock.advance(10**7)
        self.assertStatus("k", 1, 0)
        self.assertTrue(grant.release())

    def test_owners_are_any_hashable(self) -> None:
        owners = [object(), "name", ("tuple", 1), 42, frozenset({"x"})]
        grants = [self.grant("k", owner, max_concurrent=len(owners)) for owner in owners]
        self.assertEqual([grant.owner for grant in grants], owners)
        self.assertStatus("k", len(owners), 0)

    def test_keys_are_opaque_strings(self) -> None:
        """Keys differing in case, normalization or whitespace, and the empty key, are all distinct locks."""
        keys = ["k", "K", "caf\u00e9", "cafe\u0301", " k", "", "\udcff"]
        for key in keys:
            self.grant(key, "a")
        self.assertEqual([row.key for row in self.service.listing()], sorted(keys))
        for key in keys:
            self.assertStatus(key, 1, 0)


class MutexAndSemaphoreTests(ServiceTestCase):
    def test_mutex_excludes_a_second_owner(self) -> None:
        self.grant("k", "a")
        waiting = self.wait("k", "b")
        self.assertStatus("k", 1, 1)
        self.assertTrue(self.service.release("k", "a"))
        self.assertEqual(self.successResultOf(waiting).owner, "b")
        self.assertStatus("k", 1, 0)

    def test_one_owner_per_key_is_independent_of_other_keys(self) -> None:
        self.grant("k1", "a")
        self.grant("k2", "b")
        self.assertStatus("k1", 1, 0)
        self.assertStatus("k2", 1, 0)

    def test_semaphore_admits_n_then_queues(self) -> None:
        for owner in ["a", "b", "c"]:
            self.grant("k", owner, max_concurrent=3)
        waiting = self.wait("k", "d", max_concurrent=3)
        self.assertStatus("k", 3, 1)
        self.service.release("k", "b")
        self.assertEqual(self.successResultOf(waiting).owner, "d")
        self.assertStatus("k", 3, 0)

    def test_equal_requests_are_served_in_arrival_order(self) -> None:
        served: list[str] = []
        self.grant("k", "first", max_concurrent=2)
        self.grant("k", "second", max_concurrent=2)
        waiters = ["w1", "w2", "w3", "w4", "w5"]
        for owner in waiters:
            self.wait("k", owner, max_concurrent=2).addCallback(lambda g: served.append(g.owner))
        self.service.release("k", "first")
        self.assertEqual(served, ["w1"])
        for owner in ["second", "w1", "w2", "w3"]:
            self.service.release("k", owner)
        self.assertEqual(served, waiters)

    def test_looser_request_passes_an_earlier_stricter_one(self) -> None:
        """With one holder left, a waiter allowing 2 is granted before an earlier one allowing only 1."""
        self.grant("k", "h1", max_concurrent=2)
        self.grant("k", "h2", max_concurrent=2)
        strict = self.wait("k", "strict", max_concurrent=1)
        loose = self.wait("k", "loose", max_concurrent=2)
        self.service.release("k", "h1")
        self.assertEqual(self.successResultOf(loose).owner, "loose")
        self.assertNoResult(strict)
        self.assertStatus("k", 2, 1)
        self.service.release("k", "h2")
        self.assertNoResult(strict)
        self.service.release("k", "loose")
        self.assertEqual(self.successResultOf(strict).owner, "strict")

    def test_strict_holder_blocks_looser_requests(self) -> None:
        self.grant("k", "strict", max_concurrent=1)
        waiters = [self.wait("k", f"loose{n}", max_concurrent=5) for n in range(3)]
        self.assertStatus("k", 1, 3)
        for d in waiters:
            self.assertNoResult(d)

    def test_strict_holder_leaving_grants_several_looser_waiters_at_once(self) -> None:
        self.grant("k", "strict", max_concurrent=1)
        waiters = [self.wait("k", f"loose{n}", max_concurrent=3) for n in range(4)]
        self.service.release("k", "strict")
        self.assertEqual([self.successResultOf(d).owner for d in waiters[:3]], ["loose0", "loose1", "loose2"])
        self.assertNoResult(waiters[3])
        self.assertStatus("k", 3, 1)

    def test_cascade_stops_at_the_strictest_newly_granted_waiter(self) -> None:
        """A waiter granted in a cascade limits the ones after it: here 3, then 2, so the last 3 waits."""
        self.grant("k", "strict", max_concurrent=1)
        allows_three = self.wait("k", "three", max_concurrent=3)
        allows_two = self.wait("k", "two", max_concurrent=2)
        also_three = self.wait("k", "three-again", max_concurrent=3)
        self.service.release("k", "strict")
        self.successResultOf(allows_three)
        self.successResultOf(allows_two)
        self.assertNoResult(also_three)
        self.assertStatus("k", 2, 1)

    def test_cascade_skips_waiters_that_cannot_join(self) -> None:
        """Waiters are scanned in arrival order: stricter ones are skipped, looser later ones granted."""
        self.grant("k", "strict", max_concurrent=1)
        first = self.wait("k", "first", max_concurrent=3)
        mutex = self.wait("k", "mutex", max_concurrent=1)
        later = self.wait("k", "later", max_concurrent=3)
        self.service.release("k", "strict")
        self.successResultOf(first)
        self.successResultOf(later)
        self.assertNoResult(mutex)
        self.assertStatus("k", 2, 1)

    def test_stricter_request_cannot_join_looser_holders_beyond_its_limit(self) -> None:
        self.grant("k", "h1", max_concurrent=5)
        self.grant("k", "h2", max_concurrent=5)
        strict = self.wait("k", "strict", max_concurrent=2)
        self.grant("k", "loose", max_concurrent=5)
        self.assertStatus("k", 3, 1)
        self.service.release("k", "h1")
        self.assertNoResult(strict)
        self.service.release("k", "h2")
        self.successResultOf(strict)
        self.assertStatus("k", 2, 0)

    def test_new_request_joins_when_waiters_cannot(self) -> None:
        """A new request that may join is granted at once even if stricter requests wait."""
        self.grant("k", "h", max_concurrent=3)
        self.grant("k", "h2", max_concurrent=3)
        self.wait("k", "strict", max_concurrent=2)
        self.grant("k", "loose", max_concurrent=3)
        self.assertStatus("k", 3, 1)

    def test_constant_time_handoff_with_ten_thousand_waiters(self) -> None:
        """With 10,000 equal waiters each release grants exactly the head of the queue."""
        served: list[int] = []
        self.grant("k", "holder", expires=0)
        for n in range(10_000):
            self.wait("k", n, expires=0).addCallback(lambda g: served.append(g.owner))
        self.service.release("k", "holder")
        self.assertEqual(served, [0])
        self.assertStatus("k", 1, 9_999)
        for n in range(10_000):
            self.assertTrue(self.service.release("k", n))
        self.assertEqual(served, list(range(10_000)))
        self.assertIdle()


class TimeoutTests(ServiceTestCase):
    def test_no_wait_request_is_granted_when_free(self) -> None:
        self.assertEqual(self.grant("k", "a", timeout=0).owner, "a")

    def test_no_wait_request_fails_at_once_when_taken(self) -> None:
        self.grant("k", "a")
        failure = self.failureResultOf(self.service.acquire("k", "b", timeout=0), LockTimeout)
        self.assertEqual(failure.value.key, "k")
        self.assertStatus("k", 1, 0)
        self.assertNotIn("b", self.service._owners)
        self.assertEqual(len(self.service._wait_timeouts), 0)

    def test_wait_times_out_on_time(self) -> None:
        self.grant("k", "a", expires=0)
        self.clock.advance(3)
        waiting = self.wait("k", "b", timeout=2.5)
        self.assertHappensOnTime(lambda: waiting.called, 5.5)
        self.assertEqual(self.failureResultOf(waiting, LockTimeout).value.key, "k")
        self.assertStatus("k", 1, 0)
        self.assertNotIn("b", self.service._owners)
        self.assertEqual(len(self.service._wait_timeouts), 0)

    def test_timed_out_waiter_status_seen_by_errback_is_final(self) -> None:
        seen: list[KeyStatus] = []
        self.grant("k", "a")
        self.wait("k", "b", timeout=1).addErrback(lambda f: seen.append(self.service.status("k")))
        self.clock.advance(1 + SLACK)
        self.assertEqual(seen, [KeyStatus("k", 1, 0)])

    def test_wait_granted_before_its_timeout_does_not_time_out(self) -> None:
        self.grant("k", "a")
        waiting = self.wait("k", "b", timeout=10)
        self.clock.advance(4)
        self.service.release("k", "a")
        grant = self.successResultOf(waiting)
        self.assertEqual(len(self.service._wait_timeouts), 0)
        self.clock.advance(10)
        self.assertHolds("b", "k")
        self.assertTrue(grant.release())

    def test_wait_forever_never_times_out(self) -> None:
        self.grant("k", "a", expires=0)
        waiting = self.wait("k", "b", timeout=-1)
        self.clock.advance(10**7)
        self.assertNoResult(waiting)
        self.service.release("k", "a")
        self.successResultOf(waiting)

    def test_waiter_timing_out_mid_queue_is_skipped(self) -> None:
        self.grant("k", "h", expires=0)
        first = self.wait("k", "first")
        middle = self.wait("k", "middle", timeout=5)
        last = self.wait("k", "last")
        self.clock.advance(5 + SLACK)
        self.failureResultOf(middle, LockTimeout)
        self.assertStatus("k", 1, 2)
        self.service.release("k", "h")
        self.successResultOf(first)
        self.service.release("k", "first")
        self.assertEqual(self.successResultOf(last).owner, "last")
        self.service.release("k", "last")
        self.assertIdle()

    def test_timed_out_head_waiter_is_skipped(self) -> None:
        self.grant("k", "h", expires=0)
        head = self.wait("k", "head", timeout=1)
        behind = self.wait("k", "behind")
        self.clock.advance(1 + SLACK)
        self.failureResultOf(head, LockTimeout)
        self.service.release("k", "h")
        self.assertEqual(self.successResultOf(behind).owner, "behind")

    def test_owner_may_wait_again_after_timing_out(self) -> None:
        self.grant("k", "a")
        self.wait("k", "b", timeout=1).addErrback(lambda f: f.trap(LockTimeout))
        self.clock.advance(1 + SLACK)
        again = self.wait("k", "b")
        self.assertStatus("k", 1, 1)
        self.service.release("k", "a")
        self.assertEqual(self.successResultOf(again).owner, "b")


class ExpiryTests(ServiceTestCase):
    def test_grant_expires_on_time(self) -> None:
        self.clock.advance(2)
        grant = self.grant("k", "a", expires=10)
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, 12)
        self.assertForgotten("k")
        self.assertIdle()
        self.assertFalse(grant.release())
        self.assertFalse(self.service.release("k", "a"))

    def test_expiry_hands_the_key_to_the_next_waiter(self) -> None:
        self.grant("k", "a", expires=3)
        waiting = self.wait("k", "b", expires=0)
        self.assertHappensOnTime(lambda: waiting.called, 3)
        self.assertEqual(self.successResultOf(waiting).owner, "b")
        self.assertStatus("k", 1, 0)

    def test_expiry_counts_from_the_grant_not_the_request(self) -> None:
        self.grant("k", "a", expires=0)
        waiting = self.wait("k", "b", expires=10)
        self.clock.advance(5)
        self.service.release("k", "a")
        grant = self.successResultOf(waiting)
        self.assertEqual(grant.expires_at, 15)
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, 15)

    def test_expired_grant_has_no_seconds_left(self) -> None:
        """After expiry the handle says 0 seconds left, not None ("never expires")."""
        grant = self.grant("k", "a", expires=1)
        self.clock.advance(1 + SLACK)
        self.assertEqual(grant.seconds_left, 0.0)

    def test_expired_holder_loses_the_key_to_a_new_owner(self) -> None:
        self.grant("k", "a", expires=1)
        self.clock.advance(1 + SLACK)
        self.assertEqual(self.grant("k", "b").owner, "b")
        self.assertFalse(self.service.release("k", "a"))


class RenewalTests(ServiceTestCase):
    def test_renewal_returns_the_same_grant(self) -> None:
        grant = self.grant("k", "a")
        self.assertIs(self.grant("k", "a"), grant)
        self.assertStatus("k", 1, 0)

    def test_renewal_restarts_the_expiry(self) -> None:
        """After renewing, the old deadline no longer releases the grant; the new one does."""
        grant = self.grant("k", "a", expires=10)
        self.clock.advance(6)
        self.grant("k", "a", expires=10)
        self.assertEqual(grant.expires_at, 16)
        self.advance_to(10 + SLACK)
        self.assertHolds("a", "k")
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, 16)
        self.assertIdle()

    def test_renewal_can_move_the_expiry_earlier(self) -> None:
        self.grant("k", "a", expires=100)
        self.clock.advance(1)
        self.grant("k", "a", expires=5)
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, 6)
        self.assertIdle()

    def test_renewal_with_zero_expires_never_expires(self) -> None:
        grant = self.grant("k", "a", expires=10)
        self.clock.advance(5)
        self.grant("k", "a", expires=0)
        self.assertIsNone(grant.expires_at)
        self.assertIsNone(grant.seconds_left)
        self.assertEqual(len(self.service._expiries), 0)
        self.clock.advance(10**6)
        self.assertHolds("a", "k")

    def test_renewal_can_give_a_never_expiring_grant_an_expiry(self) -> None:
        grant = self.grant("k", "a", expires=0)
        self.clock.advance(100)
        self.grant("k", "a", expires=5)
        self.assertEqual(grant.seconds_left, 5.0)
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, 105)

    def test_renewal_keeps_the_first_max_concurrent(self) -> None:
        grant = self.grant("k", "a", max_concurrent=3)
        self.assertIs(self.grant("k", "a", max_concurrent=1), grant)
        self.assertEqual(grant.max_concurrent, 3)
        self.grant("k", "b", max_concurrent=3)
        self.assertStatus("k", 2, 0)

    def test_renewal_is_granted_even_when_others_wait(self) -> None:
        grant = self.grant("k", "a")
        self.wait("k", "b")
        self.assertIs(self.grant("k", "a", timeout=0), grant)
        self.assertStatus("k", 1, 1)


class AlreadyWaitingTests(ServiceTestCase):
    def test_asking_again_while_waiting_fails_at_once(self) -> None:
        self.grant("k", "holder")
        first = self.wait("k", "a")
        failure = self.failureResultOf(self.service.acquire("k", "a"), AlreadyWaiting)
        self.assertEqual(failure.value.key, "k")
        self.assertNoResult(first)
        self.assertStatus("k", 1, 1)

    def test_first_request_is_still_granted_normally(self) -> None:
        self.grant("k", "holder")
        first = self.wait("k", "a")
        self.failureResultOf(self.service.acquire("k", "a", timeout=0), AlreadyWaiting)
        self.service.release("k", "holder")
        self.assertEqual(self.successResultOf(first).owner, "a")
        self.assertStatus("k", 1, 0)

    def test_second_request_timeout_does_not_apply_to_the_first(self) -> None:
        self.grant("k", "holder", expires=0)
        first = self.wait("k", "a", timeout=-1)
        self.failureResultOf(self.service.acquire("k", "a", timeout=1), AlreadyWaiting)
        self.clock.advance(5)
        self.assertNoResult(first)
        self.assertEqual(len(self.service._wait_timeouts), 0)


class ReleaseTests(ServiceTestCase):
    def test_release_reports_whether_the_owner_held_the_key(self) -> None:
        self.grant("k", "a")
        self.assertFalse(self.service.release("k", "b"))
        self.assertFalse(self.service.release("unknown", "a"))
        self.assertTrue(self.service.release("k", "a"))
        self.assertFalse(self.service.release("k", "a"))
        self.assertIdle()

    def test_release_by_a_waiting_owner_does_not_withdraw_its_wait(self) -> None:
        self.grant("k", "a")
        waiting = self.wait("k", "b")
        self.assertFalse(self.service.release("k", "b"))
        self.assertStatus("k", 1, 1)
        self.service.release("k", "a")
        self.successResultOf(waiting)

    def test_grant_release(self) -> None:
        grant = self.grant("k", "a")
        waiting = self.wait("k", "b")
        self.assertTrue(grant.release())
        self.successResultOf(waiting)
        self.assertFalse(grant.release())
        self.assertStatus("k", 1, 0)

    def test_grant_release_releases_only_that_holder(self) -> None:
        mine = self.grant("k", "a", max_concurrent=2)
        self.grant("k", "b", max_concurrent=2)
        self.assertTrue(mine.release())
        self.assertHolds("b", "k")
        self.assertStatus("k", 1, 0)

    def test_stale_handle_after_expiry_does_not_release_the_new_grant(self) -> None:
        old = self.grant("k", "a", expires=1)
        self.clock.advance(1 + SLACK)
        new = self.grant("k", "a", expires=0)
        self.assertIsNot(new, old)
        self.assertFalse(old.release())
        self.assertHolds("a", "k")
        self.assertTrue(new.release())

    def test_stale_handle_after_release_does_not_release_the_new_grant(self) -> None:
        old = self.grant("k", "a")
        self.service.release("k", "a")
        new = self.grant("k", "a")
        self.assertFalse(old.release())
        self.assertIs(self.service._owners["a"]["k"], new)

    def test_stale_handle_does_not_withdraw_a_new_wait(self) -> None:
        old = self.grant("k", "a")
        self.service.release("k", "a")
        self.grant("k", "b")
        waiting = self.wait("k", "a")
        self.assertFalse(old.release())
        self.assertStatus("k", 1, 1)
        self.assertNoResult(waiting)

    def test_releasing_one_key_leaves_the_owners_other_keys(self) -> None:
        self.grant("k1", "a")
        self.grant("k2", "a")
        self.service.release("k1", "a")
        self.assertForgotten("k1")
        self.assertHolds("a", "k2")


class ReleaseAllTests(ServiceTestCase):
    def test_release_all_releases_grants_and_cancels_waits(self) -> None:
        self.grant("held1", "gone", expires=5)
        self.grant("held2", "gone", max_concurrent=2, expires=0)
        self.grant("waited1", "other")
        self.grant("waited2", "other")
        wait1 = self.wait("waited1", "gone", timeout=10)
        wait2 = self.wait("waited2", "gone")
        next1 = self.wait("held1", "next1")
        next2 = self.wait("held2", "next2", max_concurrent=1)

        self.service.release_all("gone")

        self.failureResultOf(wait1, CancelledError)
        self.failureResultOf(wait2, CancelledError)
        self.assertEqual(self.successResultOf(next1).owner, "next1")
        self.assertEqual(self.successResultOf(next2).owner, "next2")
        self.assertNotIn("gone", self.service._owners)
        for key in ["held1", "held2", "waited1", "waited2"]:
            self.assertStatus(key, 1, 0)
        self.assertEqual(len(self.service._wait_timeouts), 0)
        self.assertEqual(len(self.service._expiries), 4)  # the default 120 s of the others

    def test_release_all_leaves_no_trace(self) -> None:
        self.grant("a", "gone", expires=5)
        self.grant("b", "gone", max_concurrent=3)
        self.grant("c", "other", expires=0)
        cancelled = self.wait("c", "gone", timeout=5)
        self.service.release_all("gone")
        self.failureResultOf(cancelled, CancelledError)
        self.assertForgotten("a", "b")
        self.service.release("c", "other")
        self.assertIdle()
        self.clock.advance(10)
        self.assertIdle()

    def test_release_all_of_an_unknown_owner_does_nothing(self) -> None:
        self.grant("k", "a")
        self.service.release_all("nobody")
        self.assertStatus("k", 1, 0)

    def test_callbacks_see_the_final_state(self) -> None:
        """A waiter granted by release_all sees the owner's other waits already gone, and the cancelled see its grants gone."""
        seen: dict[str, tuple[KeyStatus, KeyStatus]] = {}

        def record(result: object, name: str) -> None:
            seen[name] = (self.service.status("held"), self.service.status("waited"))

        self.grant("held", "gone")
        self.grant("waited", "other")
        self.wait("waited", "gone").addErrback(record, "cancelled")
        self.wait("held", "next").addCallback(record, "granted")
        self.service.release_all("gone")
        final = (KeyStatus("held", 1, 0), KeyStatus("waited", 1, 0))
        self.assertEqual(seen, {"granted": final, "cancelled": final})

    def test_freed_capacity_goes_to_other_owners_waits(self) -> None:
        """Every key the owner held goes to the next waiter, whichever order they were taken in."""
        for key in ["x", "y", "z"]:
            self.grant(key, "gone", expires=0)
        waits = {key: self.wait(key, f"next-{key}") for key in ["z", "x", "y"]}
        self.service.release_all("gone")
        for key, d in waits.items():
            self.assertEqual(self.successResultOf(d).owner, f"next-{key}")

    def test_stale_grant_handle_after_release_all(self) -> None:
        grant = self.grant("k", "gone")
        self.service.release_all("gone")
        self.assertFalse(grant.release())


class CancelTests(ServiceTestCase):
    def test_cancel_withdraws_the_waiter(self) -> None:
        self.grant("k", "a")
        waiting = self.wait("k", "b", timeout=10)
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        self.assertStatus("k", 1, 0)
        self.assertNotIn("b", self.service._owners)
        self.assertEqual(len(self.service._wait_timeouts), 0)
        self.service.release("k", "a")
        self.assertIdle()

    def test_release_skips_a_cancelled_waiter(self) -> None:
        self.grant("k", "a")
        cancelled = self.wait("k", "b")
        behind = self.wait("k", "c")
        cancelled.cancel()
        self.failureResultOf(cancelled, CancelledError)
        self.service.release("k", "a")
        self.assertEqual(self.successResultOf(behind).owner, "c")
        self.assertNotIn("b", self.service._owners)

    def test_cancelled_wait_does_not_time_out_later(self) -> None:
        self.grant("k", "a", expires=0)
        waiting = self.wait("k", "b", timeout=2)
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        self.clock.advance(5)
        self.assertStatus("k", 1, 0)

    def test_cancelling_a_granted_request_changes_nothing(self) -> None:
        d = self.service.acquire("k", "a")
        grant = self.successResultOf(d)
        d.cancel()
        self.assertHolds("a", "k")
        self.assertTrue(grant.release())

    def test_owner_may_wait_again_after_cancelling(self) -> None:
        self.grant("k", "a")
        first = self.wait("k", "b")
        first.cancel()
        self.failureResultOf(first, CancelledError)
        again = self.wait("k", "b")
        self.service.release("k", "a")
        self.assertEqual(self.successResultOf(again).owner, "b")


class CallbackTests(ServiceTestCase):
    """What a waiter's callbacks see, and what they may do to the service."""

    def test_callbacks_see_the_whole_cascade(self) -> None:
        seen: list[KeyStatus] = []
        self.grant("k", "strict", max_concurrent=1)
        for n in range(3):
            self.wait("k", n, max_concurrent=3).addCallback(lambda g: seen.append(self.service.status("k")))
        self.wait("k", "last", max_concurrent=1)
        self.service.release("k", "strict")
        self.assertEqual(seen, [KeyStatus("k", 3, 1)] * 3)

    def test_callback_on_expiry_sees_the_final_state(self) -> None:
        seen: list[KeyStatus] = []
        self.grant("k", "a", expires=1)
        self.wait("k", "b").addCallback(lambda g: seen.append(self.service.status("k")))
        self.wait("k", "c")
        self.clock.advance(1 + SLACK)
        self.assertEqual(seen, [KeyStatus("k", 1, 1)])

    def test_callback_releasing_its_grant_passes_the_key_on(self) -> None:
        served: list[str] = []

        def use_and_release(grant: Grant) -> None:
            served.append(grant.owner)
            self.assertTrue(grant.release())

        self.grant("k", "a")
        for owner in ["b", "c", "d"]:
            self.wait("k", owner).addCallback(use_and_release)
        self.service.release("k", "a")
        self.assertEqual(served, ["b", "c", "d"])
        self.assertIdle()

    def test_callback_acquiring_again_renews(self) -> None:
        renewed: list[Grant] = []

        def renew(grant: Grant) -> Grant:
            renewed.append(self.successResultOf(self.service.acquire("k", "b", expires=50)))
            return grant

        self.grant("k", "a")
        waiting = self.wait("k", "b", expires=5)
        waiting.addCallback(renew)
        self.service.release("k", "a")
        grant = self.successResultOf(waiting)
        self.assertEqual(renewed, [grant])
        self.assertEqual(grant.expires_at, 50)
        self.assertStatus("k", 1, 0)

    def test_callback_releasing_another_owner(self) -> None:
        """A granted waiter's callback releasing another holder grants the next waiter consistently."""
        self.grant("k", "a", max_concurrent=2)
        self.grant("k", "b", max_concurrent=2)
        first = self.wait("k", "c", max_concurrent=2)
        second = self.wait("k", "d", max_concurrent=2)
        first.addCallback(lambda g: self.service.release("k", "b"))
        self.service.release("k", "a")
        self.successResultOf(first)
        self.assertEqual(self.successResultOf(second).owner, "d")
        self.assertStatus("k", 2, 0)

    def test_callback_cancelling_a_request_granted_in_the_same_cascade(self) -> None:
        """
        A waiter's callback cancels another waiter granted by the same
        release, before that one was told: the release does not fail, the
        cancelled request's grant is given back and passed on.
        """
        self.grant("k", "strict", max_concurrent=1)
        first = self.wait("k", "first", max_concurrent=2)
        second = self.wait("k", "second", max_concurrent=2)
        third = self.wait("k", "third", max_concurrent=2)
        first.addCallback(lambda g: second.cancel())

        self.assertTrue(self.service.release("k", "strict"))

        self.successResultOf(first)
        self.failureResultOf(second, CancelledError)
        self.assertEqual(self.successResultOf(third).owner, "third")
        self.assertNotIn("second", self.service._owners)
        self.assertStatus("k", 2, 0)

    def test_expiry_callback_cancelling_a_request_granted_in_the_same_cascade(self) -> None:
        """The same, on expiry: later deadlines still fire on time afterwards."""
        self.grant("k", "strict", max_concurrent=1, expires=1)
        first = self.wait("k", "first", max_concurrent=2, expires=3)
        second = self.wait("k", "second", max_concurrent=2)
        first.addCallback(lambda g: second.cancel())
        self.grant("other", "x", expires=2)

        self.clock.advance(1 + SLACK)

        self.successResultOf(first)
        self.failureResultOf(second, CancelledError)
        self.assertStatus("k", 1, 0)
        self.assertHappensOnTime(lambda: self.service.status("other").granted == 0, 2)
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, 1 + SLACK + 3)
        self.assertIdle()

    def test_callback_releasing_an_owner_granted_in_the_same_cascade(self) -> None:
        """
        A waiter's callback makes another owner, granted by the same release
        but not yet told, go away: that owner's request fails with
        CancelledError instead of firing with a grant it no longer holds.
        """
        self.grant("k", "strict", max_concurrent=1)
        first = self.wait("k", "first", max_concurrent=2)
        second = self.wait("k", "second", max_concurrent=2)
        first.addCallback(lambda g: self.service.release_all("second"))

        self.assertTrue(self.service.release("k", "strict"))

        self.successResultOf(first)
        self.failureResultOf(second, CancelledError)
        self.assertNotIn("second", self.service._owners)
        self.assertStatus("k", 1, 0)

    def test_release_all_callback_cancelling_a_request_granted_in_the_same_cascade(self) -> None:
        self.grant("k", "gone", max_concurrent=1)
        first = self.wait("k", "first", max_concurrent=2)
        second = self.wait("k", "second", max_concurrent=2)
        first.addCallback(lambda g: second.cancel())
        self.service.release_all("gone")
        self.successResultOf(first)
        self.failureResultOf(second, CancelledError)
        self.assertStatus("k", 1, 0)
        self.assertNotIn("second", self.service._owners)

    def test_timeout_errback_asking_again_is_queued_again(self) -> None:
        """A wait that times out and retries from its errback gets a fresh wait, which also times out on time."""
        retried: list[Deferred[Grant]] = []

        def retry(failure: object) -> None:
            retried.append(self.service.acquire("k", "b", timeout=2))

        self.grant("k", "a", expires=0)
        self.wait("k", "b", timeout=1).addErrback(retry)
        self.clock.advance(1 + SLACK)
        [again] = retried
        self.assertNoResult(again)
        self.assertStatus("k", 1, 1)
        deadline = self.clock.seconds() + 2
        self.assertHappensOnTime(lambda: again.called, deadline)
        self.failureResultOf(again, LockTimeout)


class TimingTests(ServiceTestCase):
    """Many wait timeouts and expiries at once, all on time."""

    def test_many_timeouts_and_expiries_fire_on_time(self) -> None:
        rng = random.Random(7)
        fired_at: dict[str, float] = {}
        deadlines: dict[str, float] = {}

        def record(result: object, name: str) -> None:
            fired_at[name] = self.clock.seconds()

        for n in range(150):
            # A wait timeout, behind a holder that never expires.
            key = f"timeout-{n}"
            self.grant(key, "holder", expires=0)
            timeout = round(rng.uniform(0.1, 20), 4)
            deadlines[key] = timeout
            self.wait(key, "waiter", timeout=timeout).addErrback(record, key)
            # An expiry, seen as the moment the waiter behind it is granted.
            key = f"expiry-{n}"
            expires = round(rng.uniform(0.1, 20), 4)
            self.grant(key, "holder", expires=expires)
            deadlines[key] = expires
            self.wait(key, "waiter", expires=0).addCallback(record, key)

        self.step_to(21)
        self.assertEqual(fired_at.keys(), deadlines.keys())
        for name, deadline in deadlines.items():
            self.assertGreaterEqual(fired_at[name], deadline - EPSILON, name)
            self.assertLessEqual(fired_at[name], deadline + SLACK, name)

    def test_deadlines_added_while_others_fire(self) -> None:
        """Each expiry grants a waiter whose own expiry starts then; the whole chain keeps time."""
        granted_at: list[float] = []
        self.grant("k", "owner0", expires=1.234)
        for n in range(1, 6):
            self.wait("k", f"owner{n}", expires=1.234).addCallback(lambda g: granted_at.append(self.clock.seconds()))
        self.step_to(7)
        self.assertEqual(len(granted_at), 5)
        previous = 0.0
        for when in granted_at:
            self.assertGreaterEqual(when, previous + 1.234 - EPSILON)
            self.assertLessEqual(when, previous + 1.234 + SLACK)
            previous = when
        self.assertHappensOnTime(lambda: self.service.status("k").granted == 0, previous + 1.234)
        self.assertIdle()

    def test_renewals_move_deadlines_both_ways(self) -> None:
        grants = {name: self.grant(name, "a", expires=10) for name in ["earlier", "later", "kept"]}
        self.clock.advance(2)
        self.grant("earlier", "a", expires=3)
        self.grant("later", "a", expires=20)
        expected = {"earlier": 5, "kept": 10, "later": 22}
        for name, deadline in sorted(expected.items(), key=lambda item: item[1]):
            self.assertHappensOnTime(lambda: self.service.status(name).granted == 0, deadline)
            self.assertFalse(grants[name].release())
        self.assertIdle()


class StatusAndListingTests(ServiceTestCase):
    def test_status_of_an_unknown_key(self) -> None:
        self.assertEqual(self.service.status("nothing"), KeyStatus("nothing", 0, 0))
        self.assertNotIn("nothing", self.service._locks)

    def test_listing_sorts_keys_by_their_bytes(self) -> None:
        """Keys that are not UTF-8 (surrogate escapes) sort by their wire bytes too."""
        wire_keys = [b"\xee\x80\x80", b"\xff", b"\xed\x9f\xbf", b"\x80", b"\xc3\xa9", b"z"]
        for n, raw in enumerate(wire_keys):
            self.grant(raw.decode("utf-8", "surrogateescape"), n)
        for order in ["key", "requests", "grants"]:
            listed = [row.key.encode("utf-8", "surrogateescape") for row in self.service.listing(order)]
            self.assertEqual(listed, sorted(wire_keys), order)

    def fill(self) -> None:
        """b: 2 holders, 0 waiting; a: 1 holder, 3 waiting; c and d: 1 holder, 1 waiting each."""
        self.grant("b", "x", max_concurrent=2)
        self.grant("b", "y", max_concurrent=2)
        self.grant("a", "x")
        for owner in ["p", "q", "r"]:
            self.wait("a", owner)
        for key in ["d", "c"]:
            self.grant(key, "x")
            self.wait(key, "p")

    def test_listing_by_key(self) -> None:
        self.fill()
        expected = [KeyStatus("a", 1, 3), KeyStatus("b", 2, 0), KeyStatus("c", 1, 1), KeyStatus("d", 1, 1)]
        self.assertEqual(self.service.listing("key"), expected)
        self.assertEqual(self.service.listing(), expected)

    def test_listing_by_requests(self) -> None:
        self.fill()
        self.assertEqual(
            self.service.listing("requests"),
            [KeyStatus("a", 1, 3), KeyStatus("c", 1, 1), KeyStatus("d", 1, 1), KeyStatus("b", 2, 0)],
        )

    def test_listing_by_grants(self) -> None:
        self.fill()
        self.assertEqual(
            self.service.listing("grants"),
            [KeyStatus("b", 2, 0), KeyStatus("a", 1, 3), KeyStatus("c", 1, 1), KeyStatus("d", 1, 1)],
        )

    def test_listing_with_an_unknown_order(self) -> None:
        self.fill()
        self.assertRaises(ValueError, self.service.listing, "waiting")

    def test_listing_leaves_out_idle_keys(self) -> None:
        self.fill()
        self.service.release_all("x")
        self.service.release_all("y")
        self.assertEqual(
            self.service.listing(), [KeyStatus("a", 1, 2), KeyStatus("c", 1, 0), KeyStatus("d", 1, 0)]
        )
        for owner in ["p", "q", "r"]:
            self.service.release_all(owner)
        self.assertEqual(self.service.listing(), [])


class NoTraceTests(ServiceTestCase):
    """A key with no holders and no waiters leaves nothing behind in memory."""

    def test_after_a_timeout(self) -> None:
        self.grant("k", "a", expires=0)
        self.wait("k", "b", timeout=1).addErrback(lambda f: None)
        self.clock.advance(1 + SLACK)
        self.service.release("k", "a")
        self.assertIdle()

    def test_after_an_expiry_with_a_waiter_timing_out_first(self) -> None:
        self.grant("k", "a", expires=5)
        self.wait("k", "b", timeout=1).addErrback(lambda f: None)
        self.clock.advance(5 + SLACK)
        self.assertIdle()

    def test_after_a_cancel(self) -> None:
        self.grant("k", "a", expires=1)
        waiting = self.wait("k", "b", timeout=10)
        waiting.cancel()
        self.failureResultOf(waiting, CancelledError)
        self.clock.advance(1 + SLACK)
        self.assertIdle()

    def test_after_release_all_of_every_owner(self) -> None:
        for n in range(5):
            self.grant(f"k{n}", f"owner{n}", max_concurrent=2, expires=n)
            self.wait(f"k{n}", f"owner{(n + 1) % 5}", max_concurrent=1, timeout=n + 1).addErrback(
                lambda f: f.trap(CancelledError)
            )
        for n in range(5):
            self.service.release_all(f"owner{n}")
        self.assertIdle()

    def test_mid_queue_timeouts_are_compacted(self) -> None:
        """Waiters timing out behind a long-lived head do not pile up in the queue."""
        self.grant("k", "holder", expires=0)
        head = self.wait("k", "head")
        for n in range(2_000):
            self.wait("k", n, timeout=0.5).addErrback(lambda f: None)
            self.clock.advance(0.1)
            self.assertLess(len(self.service._locks["k"].waiters), 64)
        self.clock.advance(1)
        self.assertStatus("k", 1, 1)
        self.assertLess(len(self.service._locks["k"].waiters), 64)
        self.assertEqual(len(self.service._wait_timeouts), 0)
        self.service.release("k", "holder")
        self.successResultOf(head).release()
        self.assertIdle()

    def test_mid_queue_timeouts_in_bulk_are_compacted(self) -> None:
        """Thousands of waiters timing out at once behind a long-lived head leave a short queue."""
        self.grant("k", "holder", expires=0)
        self.wait("k", "head")
        for n in range(5_000):
            self.wait("k", n, timeout=1).addErrback(lambda f: None)
        self.assertEqual(len(self.service._locks["k"].waiters), 5_001)
        self.clock.advance(1 + SLACK)
        self.assertStatus("k", 1, 1)
        self.assertLess(len(self.service._locks["k"].waiters), 64)

    def test_mid_queue_cancels_are_compacted(self) -> None:
        self.grant("k", "holder", expires=0)
        self.wait("k", "head")
        for n in range(2_000):
            d = self.wait("k", n)
            d.cancel()
            self.failureResultOf(d, CancelledError)
        self.assertStatus("k", 1, 1)
        self.assertLess(len(self.service._locks["k"].waiters), 64)

    def test_random_operations_leave_no_trace_once_everyone_leaves(self) -> None:
        """A seeded mix of every operation, then every owner leaving, leaves the service empty."""
        rng = random.Random(2024)
        owners = [f"o{n}" for n in range(6)]
        keys = ["a", "b", "c"]
        results: list[Deferred[Grant]] = []
        for _ in range(2_000):
            key, owner = rng.choice(keys), rng.choice(owners)
            action = rng.random()
            if action < 0.5:
                d = self.service.acquire(
                    key,
                    owner,
                    max_concurrent=rng.choice([1, 1, 2, 3]),
                    timeout=rng.choice([-1, 0, 0.5, 3]),
                    expires=rng.choice([0, 1, 4]),
                )
                d.addErrback(lambda f: f.trap(LockTimeout, AlreadyWaiting, CancelledError))
                results.append(d)
            elif action < 0.65:
                self.service.release(key, owner)
            elif action < 0.7:
                self.service.release_all(owner)
            elif action < 0.8 and results:
                rng.choice(results).cancel()
            else:
                self.clock.advance(rng.choice([0.01, 0.3, 1]))
            self.assertConsistent()
        for owner in owners:
            self.service.release_all(owner)
        self.assertIdle()

    def assertConsistent(self) -> None:
        """Counts, owner index and deadline queues agree with the holders and live waiters."""
        rows = self.service.listing()
        self.assertEqual(
            self.service.totals(),
            (len(rows), sum(row.granted for row in rows), sum(row.waiting for row in rows)),
        )
        expiries = timeouts = 0
        for key, lock in self.service._locks.items():
            live = [w for w in lock.waiters or () if w.deferred is not None]
            self.assertEqual(lock.waiting, len(live))
            self.assertTrue(lock.holders or live, f"idle key {key!r} kept")
            for entry in lock.holders + live:
                self.assertIs(self.service._owners[entry.owner][key], entry)
            joining = len(lock.holders) + 1
            for waiter in live:
                grantable = joining <= lock.limit() and joining <= waiter.max_concurrent
                self.assertFalse(grantable, f"{waiter.owner!r} could be granted {key!r}")
            expiries += sum(1 for h in lock.holders if h.expires_at is not None)
            timeouts += sum(1 for w in live if w.timeout_at is not None)
        entries = sum(len(held) for held in self.service._owners.values())
        self.assertEqual(entries, sum(len(lock.holders) + lock.waiting for lock in self.service._locks.values()))
        self.assertEqual(len(self.service._expiries), expiries)
        self.assertEqual(len(self.service._wait_timeouts), timeouts)


class LimitTests(SynchronousTestCase):
    """Each limit refuses the request that would pass it, and nothing changes."""

    def service_with(self, **limits: int) -> LockService:
        self.clock = Clock()
        return LockService(self.clock, **limits)

    def test_max_keys(self) -> None:
        service = self.service_with(max_keys=2)
        service.acquire("a", "x")
        service.acquire("b", "x")
        error = self.assertRaises(LimitReached, service.acquire, "c", "y")
        self.assertEqual((error.limit, error.value, str(error)), ("max-keys", 2, "max-keys exceeded (2)"))
        self.assertEqual(service.totals(), (2, 2, 0))
        # A key already in use may still be asked for, and renewed.
        d = service.acquire("a", "y")
        self.assertNoResult(d)
        self.successResultOf(service.acquire("b", "x", expires=5))
        service.release("b", "x")
        self.successResultOf(service.acquire("c", "y"))

    def test_max_waiters(self) -> None:
        service = self.service_with(max_waiters=1)
        service.acquire("k", "holder")
        waiting = service.acquire("k", "first")
        error = self.assertRaises(LimitReached, service.acquire, "k", "second")
        self.assertEqual(error.limit, "max-waiters")
        self.assertEqual(service.status("k"), KeyStatus("k", 1, 1))
        # Not waiting is always allowed.
        self.failureResultOf(service.acquire("k", "second", timeout=0), LockTimeout)
        service.release("k", "holder")
        self.assertEqual(self.successResultOf(waiting).owner, "first")

    def test_max_held_counts_grants_and_waits(self) -> None:
        service = self.service_with(max_held=2)
        service.acquire("busy", "other")
        service.acquire("a", "x")
        service.acquire("busy", "x")
        error = self.assertRaises(LimitReached, service.acquire, "b", "x")
        self.assertEqual(error.limit, "max-held")
        self.assertNotIn("b", service._locks)
        # Renewing what it holds is not a new request.
        self.successResultOf(service.acquire("a", "x", expires=9))
        service.release("a", "x")
        self.successResultOf(service.acquire("b", "x"))


class ObserverTests(ServiceTestCase):
    """The observer hears of every grant (and how long it waited), timeout, release and expiry."""

    def setUp(self) -> None:
        super().setUp()
        self.events: list[tuple] = []
        service = self

        class Recorder:
            def granted(self, grant: Grant, waited: float) -> None:
                service.events.append(("granted", grant.owner, waited))

            def timed_out(self, key: str) -> None:
                service.events.append(("timed_out", key))

            def released(self, grant: Grant) -> None:
                service.events.append(("released", grant.owner))

            def expired(self, grant: Grant) -> None:
                service.events.append(("expired", grant.owner))

        self.service.observer = Recorder()

    def test_events(self) -> None:
        self.grant("k", "a", expires=10)
        waiting = self.wait("k", "b", expires=3)
        timing_out = self.wait("k", "c", timeout=1)
        self.clock.advance(2)
        self.failureResultOf(timing_out, LockTimeout)
        self.service.release("k", "a")
        self.successResultOf(waiting)
        self.clock.advance(3 + SLACK)
        self.grant("j", "d")
        self.service.release_all("d")
        self.assertEqual(
            self.events,
            [
                ("granted", "a", 0.0),
                ("timed_out", "k"),
                ("released", "a"),
                ("granted", "b", 2.0),
                ("expired", "b"),
                ("granted", "d", 0.0),
                ("released", "d"),
            ],
        )


class HoldersTests(ServiceTestCase):
    def test_holders_in_grant_order_with_when_granted(self) -> None:
        self.grant("k", "a", max_concurrent=3)
        self.clock.advance(5)
        self.grant("k", "b", max_concurrent=3)
        self.grant("k", "a", max_concurrent=3, expires=60)  # a renewal keeps granted_at
        self.assertEqual([(g.owner, g.granted_at) for g in self.service.holders("k")], [("a", 0), ("b", 5)])
        self.assertEqual(self.service.holders("unused"), [])
        self.assertNotIn("unused", self.service._locks)


class ManyKeysRenewalTests(ServiceTestCase):
    """Keys a multi-key request's owner holds already are renewed when it is granted, not before."""

    def test_renewed_when_granted(self) -> None:
        held = self.grant("a", "me", expires=10)
        self.grant("b", "other")
        waiting = self.service.acquire_many(["a", "b"], "me", timeout=-1, expires=60)
        self.clock.advance(5)
        self.assertEqual(held.seconds_left, 5)  # not yet
        self.service.release("b", "other")
        grants = self.successResultOf(waiting)
        self.assertEqual([g.key for g in grants], ["a", "b"])
        self.assertIs(grants[0], held)
        self.assertEqual(held.seconds_left, 60)

    def test_left_alone_by_a_request_that_times_out_or_is_refused(self) -> None:
        held = self.grant("a", "me", expires=10)
        self.grant("b", "other")
        timing_out = self.service.acquire_many(["a", "b"], "me", timeout=2, expires=60)
        self.clock.advance(2.01)
        self.assertEqual(self.failureResultOf(timing_out, LockTimeout).value.busy, ["b"])
        self.assertAlmostEqual(held.seconds_left, 7.99)
        self.failureResultOf(self.service.acquire_many(["a", "b"], "me", timeout=0, expires=60), LockTimeout)
        self.assertAlmostEqual(held.seconds_left, 7.99)
        self.service.max_waiters = 0
        self.assertRaises(LimitReached, self.service.request_many, ["a", "b"], "me", -1, 60)
        self.assertAlmostEqual(held.seconds_left, 7.99)

    def test_a_held_key_given_up_while_waiting_fails_the_request(self) -> None:
        """All or nothing: the answer never lacks a key asked for."""
        self.grant("a", "me", expires=5)
        self.grant("b", "other")
        waiting = self.service.acquire_many(["a", "b"], "me")
        self.clock.advance(6)  # a expires while the request waits
        self.grant("a", "third")
        self.service.release("b", "other")
        self.assertEqual(self.failureResultOf(waiting, LockTimeout).value.busy, ["a"])
        self.assertEqual(self.service.status("b"), KeyStatus("b", 0, 0))  # given back
        self.assertEqual([g.owner for g in self.service.holders("a")], ["third"])
