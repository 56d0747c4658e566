"""
Tests for L{jesync.service.LockService}'s modes and holder values: shared
holders together, fair queues of mixed modes (no writer starvation, shared
requests at the head granted together), no upgrade and no downgrade, tokens
per shared holder, values and their limit, expiry and release of shared
holders handing on, and multi-key shared requests.  Exclusive-only callers
are covered by C{test_service.py}, unchanged.
"""

from __future__ import annotations

from typing import Hashable, List

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import AlreadyWaiting, LimitReached, LockTimeout, ModeConflict
from jesync.interfaces import KeyStatus
from jesync.service import EXCLUSIVE, MAX_VALUE, SHARED, Grant, LockService


class ModesTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)

    def shared(self, key: str, owner: Hashable, **kwargs) -> Grant:
        """A shared request for C{key}, granted at once."""
        return self.successResultOf(self.service.acquire(key, owner, mode=SHARED, **kwargs))

    def exclusive(self, key: str, owner: Hashable, *args, **kwargs) -> Grant:
        return self.successResultOf(self.service.acquire(key, owner, *args, **kwargs))

    def wait(self, key: str, owner: Hashable, *args, **kwargs) -> Deferred:
        d = self.service.acquire(key, owner, *args, **kwargs)
        self.assertNoResult(d)
        return d

    def holders(self, key: str) -> list:
        return [(g.owner, g.mode) for g in self.service.holders(key)]

    def assertStatus(self, key: str, granted: int, waiting: int) -> None:
        self.assertEqual(self.service.status(key), KeyStatus(key, granted, waiting))

    def assertIdle(self) -> None:
        self.assertEqual(self.service.totals(), (0, 0, 0))
        self.assertEqual(self.service._locks, {})
        self.assertEqual(self.service._owners, {})


class SharedHoldersTests(ModesTestCase):
    def test_any_number_of_shared_holders(self) -> None:
        grants = [self.shared("k", n) for n in range(50)]
        self.assertStatus("k", 50, 0)
        self.assertTrue(all(g.mode == SHARED and g.max_concurrent == 1 for g in grants))
        for grant in grants:
            self.assertTrue(grant.release())
        self.assertIdle()

    def test_exclusive_grant_mode(self) -> None:
        grant = self.exclusive("k", "a", 3)
        self.assertEqual((grant.mode, grant.value, grant.max_concurrent), (EXCLUSIVE, None, 3))

    def test_mode_given_as_an_equal_string(self) -> None:
        grant = self.successResultOf(self.service.acquire("k", "a", mode="".join(["sha", "red"])))
        self.assertIs(grant.mode, SHARED)
        grant = self.successResultOf(self.service.acquire("j", "a", mode="".join(["exclu", "sive"])))
        self.assertIs(grant.mode, EXCLUSIVE)

    def test_exclusive_waits_for_shared_holders(self) -> None:
        self.shared("k", "r1")
        self.shared("k", "r2")
        writer = self.wait("k", "w")
        semaphore = self.wait("k", "s", 5)
        self.service.release("k", "r1")
        self.assertNoResult(writer)
        self.service.release("k", "r2")
        self.assertEqual(self.holders("k"), [("w", EXCLUSIVE)])
        self.successResultOf(writer)
        self.assertNoResult(semaphore)

    def test_exclusive_with_no_wait_is_refused_by_shared_holders(self) -> None:
        self.shared("k", "r")
        self.failureResultOf(self.service.acquire("k", "w", 3, 0), LockTimeout)
        self.assertStatus("k", 1, 0)

    def test_shared_waits_for_exclusive_holders(self) -> None:
        self.exclusive("k", "w", 3)
        reader = self.wait("k", "r", mode=SHARED)
        self.service.release("k", "w")
        self.assertEqual(self.successResultOf(reader).mode, SHARED)

    def test_shared_max_concurrent_must_be_one(self) -> None:
        for bad in (2, 3, 0):
            self.assertRaises(ValueError, self.service.acquire, "k", "a", bad, mode=SHARED)
        self.assertRaises(ValueError, self.service.acquire, "k", "a", mode="read")
        self.assertRaises(ValueError, self.service.acquire_many, ["k"], "a", mode="write")
        self.assertIdle()

    def test_release_all_hands_on_to_waiting_writer(self) -> None:
        self.shared("k", "r1")
        self.shared("k", "r2")
        writer = self.wait("k", "w")
        self.service.release_all("r1")
        self.assertNoResult(writer)
        self.service.release_all("r2")
        self.assertEqual(self.successResultOf(writer).owner, "w")


class FairnessTests(ModesTestCase):
    def test_waiting_writer_holds_back_later_readers(self) -> None:
        """No writer starvation: readers arriving after a waiting writer queue behind it."""
        self.shared("k", "r1")
        writer = self.wait("k", "w")
        late = self.wait("k", "r2", mode=SHARED)
        self.failureResultOf(self.service.acquire("k", "r3", mode=SHARED, timeout=0), LockTimeout)
        self.assertStatus("k", 1, 2)
        self.service.release("k", "r1")
        self.successResultOf(writer)
        self.assertNoResult(late)
        self.service.release("k", "w")
        self.successResultOf(late)

    def test_readers_reaching_the_head_together_are_granted_together(self) -> None:
        self.exclusive("k", "w1")
        readers = [self.wait("k", f"r{n}", mode=SHARED) for n in range(5)]
        writer = self.wait("k", "w2")
        tail = self.wait("k", "r-late", mode=SHARED)
        seen: List[KeyStatus] = []
        readers[0].addCallback(lambda g: seen.append(self.service.status("k")) or g)
        self.service.release("k", "w1")
        # all five at once, in the same change (the first one told sees them all)
        self.assertEqual(seen, [KeyStatus("k", 5, 2)])
        self.assertEqual([self.successResultOf(d).owner for d in readers], [f"r{n}" for n in range(5)])
        self.assertNoResult(writer)
        self.assertNoResult(tail)
        for n in range(5):
            self.service.release("k", f"r{n}")
        self.successResultOf(writer)
        self.assertNoResult(tail)

    def test_waiting_reader_is_not_passed_by_later_semaphore(self) -> None:
        """Exclusive semaphore holders with room: a later `lock k 3` waits behind a waiting reader."""
        self.exclusive("k", "s1", 3)
        reader = self.wait("k", "r", mode=SHARED)
        later = self.wait("k", "s2", 3)
        self.assertStatus("k", 1, 2)
        self.service.release("k", "s1")
        self.successResultOf(reader)
        self.assertNoResult(later)
        self.service.release("k", "r")
        self.successResultOf(later)

    def test_semaphores_behind_a_reader_wait_for_it(self) -> None:
        """Exclusive requests granted ahead of a shared waiter; none after it until it is served."""
        self.exclusive("k", "m", 1)
        s1 = self.wait("k", "s1", 3)
        reader = self.wait("k", "r", mode=SHARED)
        s2 = self.wait("k", "s2", 3)
        self.service.release("k", "m")
        self.successResultOf(s1)
        self.assertNoResult(reader)
        self.assertNoResult(s2)  # (the grant rule admits it; the earlier reader holds it back)
        self.service.release("k", "s1")
        self.successResultOf(reader)
        self.assertNoResult(s2)

    def test_overtaking_among_exclusive_requests_is_unchanged(self) -> None:
        """A waiting `lock k 1` stays queued while a later `lock k 3` is granted, as before."""
        self.exclusive("k", "a", 3)
        strict = self.wait("k", "b", 1)
        self.exclusive("k", "c", 3)
        self.assertStatus("k", 2, 1)
        self.assertNoResult(strict)

    def test_withdrawn_writer_lets_readers_behind_it_join(self) -> None:
        self.shared("k", "r1")
        writer = self.wait("k", "w", timeout=2)
        reader = self.wait("k", "r2", mode=SHARED)
        self.clock.advance(2)
        self.failureResultOf(writer, LockTimeout)
        self.assertEqual(self.holders("k"), [("r1", SHARED), ("r2", SHARED)])
        self.successResultOf(reader)

    def test_cancelled_writer_lets_readers_behind_it_join(self) -> None:
        self.shared("k", "r1")
        writer = self.wait("k", "w")
        reader = self.wait("k", "r2", mode=SHARED)
        writer.cancel()
        self.failureResultOf(writer, CancelledError)
        self.successResultOf(reader)

    def test_writer_gone_lets_readers_behind_it_join(self) -> None:
        self.shared("k", "r1")
        self.wait("k", "w").addErrback(lambda f: None)
        reader = self.wait("k", "r2", mode=SHARED)
        self.service.release_all("w")
        self.successResultOf(reader)

    def test_withdrawn_reader_lets_semaphore_behind_it_join(self) -> None:
        self.exclusive("k", "s1", 3)
        reader = self.wait("k", "r", mode=SHARED, timeout=1)
        semaphore = self.wait("k", "s2", 3)
        self.clock.advance(1)
        self.failureResultOf(reader, LockTimeout)
        self.successResultOf(semaphore)
        self.assertStatus("k", 2, 0)

    def test_reader_gone_lets_semaphore_behind_it_join(self) -> None:
        self.exclusive("k", "s1", 3)
        self.wait("k", "r", mode=SHARED).addErrback(lambda f: None)
        semaphore = self.wait("k", "s2", 3)
        self.service.release_all("r")
        self.successResultOf(semaphore)

    def test_alternating_batches(self) -> None:
        """Readers and writers alternate in arrival order: each batch of readers at once, each writer alone."""
        self.exclusive("k", "w0")
        order = ["r1", "r2", "w1", "r3", "w2", "r4", "r5"]
        pending = {
            name: self.wait("k", name, mode=SHARED if name.startswith("r") else EXCLUSIVE) for name in order
        }
        batches = []
        current = ["w0"]
        while current:
            for name in current:
                self.service.release("k", name)
            current = [owner for owner, _ in self.holders("k")]
            batches.append(current)
        self.assertEqual(batches, [["r1", "r2"], ["w1"], ["r3"], ["w2"], ["r4", "r5"], []])
        self.assertTrue(all(d.called for d in pending.values()))
        self.assertIdle()


class ModeConflictTests(ModesTestCase):
    def test_no_upgrade(self) -> None:
        grant = self.shared("k", "a")
        self.shared("k", "b")
        for timeout in (-1, 0, 5):
            failure = self.failureResultOf(self.service.acquire("k", "a", timeout=timeout), ModeConflict)
            self.assertEqual((failure.value.key, failure.value.held), ("k", SHARED))
            self.assertIn("no upgrade", str(failure.value))
        self.assertEqual(self.holders("k"), [("a", SHARED), ("b", SHARED)])
        self.assertIs(self.service.grant_of("k", "a"), grant)
        self.assertStatus("k", 2, 0)

    def test_two_readers_wanting_to_write_do_not_deadlock(self) -> None:
        self.shared("k", "a")
        self.shared("k", "b")
        self.failureResultOf(self.service.acquire("k", "a"), ModeConflict)
        self.failureResultOf(self.service.acquire("k", "b"), ModeConflict)
        self.service.release("k", "a")
        self.service.release("k", "b")
        self.assertIdle()

    def test_no_downgrade(self) -> None:
        grant = self.exclusive("k", "a", 2)
        failure = self.failureResultOf(self.service.acquire("k", "a", mode=SHARED), ModeConflict)
        self.assertEqual(failure.value.held, EXCLUSIVE)
        self.assertIs(self.service.grant_of("k", "a"), grant)
        self.assertEqual(grant.mode, EXCLUSIVE)

    def test_conflict_leaves_expiry(self) -> None:
        grant = self.shared("k", "a", expires=5)
        self.clock.advance(3)
        self.failureResultOf(self.service.acquire("k", "a", expires=100), ModeConflict)
        self.assertEqual(grant.expires_at, 5)

    def test_waiting_owner_asking_in_other_mode_is_already_waiting(self) -> None:
        self.exclusive("k", "w")
        first = self.wait("k", "a", mode=SHARED)
        self.failureResultOf(self.service.acquire("k", "a"), AlreadyWaiting)
        self.service.release("k", "w")
        self.assertEqual(self.successResultOf(first).mode, SHARED)

    def test_many_with_a_key_held_in_the_other_mode(self) -> None:
        self.shared("k", "a")
        failure = self.failureResultOf(self.service.acquire_many(["j", "k"], "a"), ModeConflict)
        self.assertEqual(failure.value.key, "k")
        self.assertEqual(self.service.holders("j"), [])
        self.assertEqual(self.service.grants_of("a"), [self.service.grant_of("k", "a")])

    def test_renewal_in_the_same_mode(self) -> None:
        grant = self.shared("k", "a", expires=5)
        self.clock.advance(3)
        self.assertIs(self.shared("k", "a", expires=10), grant)
        self.assertEqual(grant.expires_at, 13)


class TokenTests(ModesTestCase):
    def test_each_shared_holder_has_its_own_token(self) -> None:
        tokens = [self.shared("k", n).token for n in range(5)]
        self.assertEqual(tokens, sorted(set(tokens)))
        self.exclusive("j", "x")
        self.assertGreater(self.service.last_token, tokens[-1])

    def test_readers_granted_together_get_increasing_tokens(self) -> None:
        first = self.exclusive("k", "w")
        readers = [self.wait("k", n, mode=SHARED) for n in range(3)]
        self.service.release("k", "w")
        tokens = [self.successResultOf(d).token for d in readers]
        self.assertEqual(tokens, sorted(set(tokens)))
        self.assertGreater(tokens[0], first.token)

    def test_renewal_keeps_token(self) -> None:
        grant = self.shared("k", "a")
        token = grant.token
        self.clock.advance(1)
        self.shared("k", "a")
        self.assertEqual(grant.token, token)


class ValueTests(ModesTestCase):
    def test_value_shown_by_holders(self) -> None:
        self.shared("k", "a", value=b"10.0.0.1:8080")
        self.shared("k", "b")
        shown = [(g.owner, g.value) for g in self.service.holders("k")]
        self.assertEqual(shown, [("a", b"10.0.0.1:8080"), ("b", None)])

    def test_exclusive_value(self) -> None:
        self.assertEqual(self.exclusive("k", "a", value=b"leader").value, b"leader")

    def test_limit(self) -> None:
        self.assertEqual(MAX_VALUE, 4096)
        self.assertEqual(self.exclusive("k", "a", value=b"x" * MAX_VALUE).value, b"x" * MAX_VALUE)
        self.assertRaises(ValueError, self.service.acquire, "j", "a", value=b"x" * (MAX_VALUE + 1))
        self.assertRaises(ValueError, self.service.acquire, "j", "a", mode=SHARED, value=b"x" * (MAX_VALUE + 1))
        self.assertRaises(ValueError, self.service.acquire_many, ["i", "j"], "a", value=b"x" * (MAX_VALUE + 1))
        self.assertRaises(ValueError, self.service.acquire, "j", "a", value="text")  # type: ignore[arg-type]
        self.assertEqual(self.service.holders("j"), [])
        # a renewal over the limit changes nothing
        self.assertRaises(ValueError, self.service.acquire, "k", "a", value=b"y" * (MAX_VALUE + 1))
        self.assertEqual(self.service.grant_of("k", "a").value, b"x" * MAX_VALUE)

    def test_renewal_replaces_or_keeps(self) -> None:
        grant = self.shared("k", "a", value=b"one")
        self.shared("k", "a")
        self.assertEqual(grant.value, b"one")
        self.shared("k", "a", value=b"two")
        self.assertEqual(grant.value, b"two")
        self.shared("k", "a", value=b"")
        self.assertEqual(grant.value, b"")

    def test_waiter_value_on_its_grant(self) -> None:
        self.exclusive("k", "w")
        reader = self.wait("k", "r", mode=SHARED, value=b"r's")
        writer = self.wait("k", "w2", value=b"w2's")
        self.service.release("k", "w")
        self.assertEqual(self.successResultOf(reader).value, b"r's")
        self.service.release("k", "r")
        self.assertEqual(self.successResultOf(writer).value, b"w2's")

    def test_many_values(self) -> None:
        grants = self.successResultOf(self.service.acquire_many(["i", "j"], "a", mode=SHARED, value=b"v"))
        self.assertEqual([(g.mode, g.value) for g in grants], [(SHARED, b"v"), (SHARED, b"v")])
        again = self.successResultOf(self.service.acquire_many(["i", "j", "k"], "a", mode=SHARED, value=b"w"))
        self.assertEqual([g.value for g in again], [b"w", b"w", b"w"])
        self.assertIs(again[0], grants[0])

    def test_waiting_many_renews_values_when_granted(self) -> None:
        held = self.exclusive("i", "a", value=b"old")
        self.exclusive("j", "x")
        d = self.service.acquire_many(["i", "j"], "a", value=b"new")
        self.assertNoResult(d)
        self.assertEqual(held.value, b"old")
        self.service.release("j", "x")
        self.assertEqual([g.value for g in self.successResultOf(d)], [b"new", b"new"])


class ExpiryTests(ModesTestCase):
    def test_shared_holders_expire_and_hand_on(self) -> None:
        self.shared("k", "r1", expires=1)
        self.shared("k", "r2", expires=2)
        writer = self.wait("k", "w")
        reader = self.wait("k", "r3", mode=SHARED)
        self.clock.advance(1)
        self.assertNoResult(writer)
        self.clock.advance(1)
        self.assertEqual(self.successResultOf(writer).owner, "w")
        self.assertNoResult(reader)

    def test_renewal_restarts_expiry(self) -> None:
        grant = self.shared("k", "a", expires=2)
        self.clock.advance(1.5)
        self.shared("k", "a", expires=2)
        self.clock.advance(1)
        self.assertTrue(grant.release())


class ManyTests(ModesTestCase):
    def test_shared_many_joins_shared_holders(self) -> None:
        self.shared("i", "r")
        grants = self.successResultOf(self.service.acquire_many(["i", "j"], "a", mode=SHARED))
        self.assertEqual([g.mode for g in grants], [SHARED, SHARED])
        self.assertStatus("i", 2, 0)

    def test_shared_many_waits_for_exclusive_holder(self) -> None:
        self.shared("i", "r")
        self.exclusive("j", "w")
        d = self.service.acquire_many(["i", "j"], "a", mode=SHARED)
        self.assertNoResult(d)
        # it does not hold back other readers of i
        self.shared("i", "r2")
        self.service.release("j", "w")
        self.assertEqual([g.key for g in self.successResultOf(d)], ["i", "j"])

    def test_shared_many_keeps_its_place_against_writers(self) -> None:
        self.exclusive("j", "w")
        d = self.service.acquire_many(["i", "j"], "a", mode=SHARED)
        writer = self.wait("i", "w2")  # behind the waiting reader on i
        self.service.release("j", "w")
        self.successResultOf(d)
        self.assertNoResult(writer)
        self.service.release_all("a")
        self.successResultOf(writer)

    def test_exclusive_many_waits_for_readers(self) -> None:
        self.shared("i", "r")
        d = self.service.acquire_many(["i", "j"], "a")
        self.assertNoResult(d)
        reader = self.wait("j", "r2", mode=SHARED)  # behind the exclusive request on j
        self.service.release("i", "r")
        self.assertEqual([g.mode for g in self.successResultOf(d)], [EXCLUSIVE, EXCLUSIVE])
        self.assertNoResult(reader)
        self.service.release_all("a")
        self.successResultOf(reader)

    def test_shared_many_timeout_names_busy_keys(self) -> None:
        self.shared("i", "r")
        self.exclusive("j", "w")
        d = self.service.acquire_many(["i", "j"], "a", mode=SHARED, timeout=1)
        self.clock.advance(1)
        self.assertEqual(self.failureResultOf(d, LockTimeout).value.busy, ["j"])
        self.assertEqual(self.service.status("i"), KeyStatus("i", 1, 0))

    def test_shared_many_not_waiting(self) -> None:
        self.exclusive("j", "w")
        failure = self.failureResultOf(self.service.acquire_many(["i", "j"], "a", mode=SHARED, timeout=0), LockTimeout)
        self.assertEqual(failure.value.busy, ["j"])


class LimitTests(SynchronousTestCase):
    def test_limits_count_shared_requests(self) -> None:
        service = LockService(Clock(), max_held=1, max_waiters=1, max_keys=2)
        service.acquire("k", "a", mode=SHARED)
        self.assertRaises(LimitReached, service.acquire, "j", "a", mode=SHARED)
        service.acquire("j", "w")
        service.acquire("j", "b", mode=SHARED).addErrback(lambda f: None)
        self.assertRaises(LimitReached, service.acquire, "j", "c", mode=SHARED)
        self.assertRaises(LimitReached, service.acquire, "new", "d", mode=SHARED)
        service.release_all("b")
