"""
The memcached listener's object store (L{jesync.store}), on a
L{twisted.internet.task.Clock}: memcached's storage rules, expiry (lazy and
by the sweep), bounded memory with LRU eviction, and the lock rule that ties
object C{K} to key C{K} of the shared lock table.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import LimitReached
from jesync.service import LockService
from jesync.store import (
    ITEM_OVERHEAD,
    RELATIVE_LIMIT,
    NonNumeric,
    ObjectStore,
    Outcome,
    OutOfMemory,
    SweepService,
    TooLarge,
)

A = object()  # a memcached connection
B = object()  # another one


def sized(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + ITEM_OVERHEAD


class StoreTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_800_000_000)  # a Unix time (2027)
        self.locks = LockService(self.clock, max_held=5)
        self.store = ObjectStore(self.locks, memory=10_000, max_item=1000)

    def set(self, key: bytes, value: bytes = b"v", exptime: int = 0, owner: object = A, flags: int = 0) -> Outcome:
        return self.store.store("set", key, value, flags, exptime, owner)[0]

    def value(self, key: bytes) -> bytes | None:
        item = self.store.get(key)
        return None if item is None else item.value

    def delta(self, key: bytes, delta: int, owner: object = A, **options: object) -> tuple[Outcome, int | None]:
        outcome, item = self.store.add_delta(key, delta, owner, **options)  # type: ignore[arg-type]
        return outcome, None if item is None else int(item.value)


class StorageTests(StoreTestCase):
    def test_set_get(self) -> None:
        self.assertEqual(self.store.store("set", b"k", b"hello", 7, 0, A)[0], Outcome.STORED)
        item = self.store.get(b"k")
        assert item is not None
        self.assertEqual((item.value, item.flags), (b"hello", 7))
        self.assertEqual((self.store.hits, self.store.misses), (1, 0))
        self.assertIsNone(self.store.get(b"other"))
        self.assertEqual(self.store.misses, 1)

    def test_add_replace(self) -> None:
        self.assertEqual(self.store.store("replace", b"k", b"x", 0, 0, A)[0], Outcome.NOT_STORED)
        self.assertEqual(self.store.store("add", b"k", b"x", 0, 0, A)[0], Outcome.STORED)
        self.assertEqual(self.store.store("add", b"k", b"y", 0, 0, A)[0], Outcome.NOT_STORED)
        self.assertEqual(self.store.store("replace", b"k", b"z", 0, 0, A)[0], Outcome.STORED)
        self.assertEqual(self.value(b"k"), b"z")

    def test_append_prepend_keep_flags_and_expiry(self) -> None:
        self.assertEqual(self.store.store("append", b"k", b"x", 0, 0, A)[0], Outcome.NOT_STORED)
        self.set(b"k", b"mid", exptime=10, flags=3)
        self.store.store("append", b"k", b">", 9, 0, A)
        self.store.store("prepend", b"k", b"<", 9, 0, A)
        item = self.store.get(b"k")
        assert item is not None
        self.assertEqual((item.value, item.flags), (b"<mid>", 3))
        self.clock.advance(10)
        self.assertIsNone(self.store.get(b"k"))

    def test_cas(self) -> None:
        self.assertEqual(self.store.store("cas", b"k", b"x", 0, 0, A, cas=1)[0], Outcome.NOT_FOUND)
        _, item = self.store.store("set", b"k", b"x", 0, 0, A)
        assert item is not None
        self.assertEqual(self.store.store("cas", b"k", b"y", 0, 0, A, cas=item.cas + 1)[0], Outcome.EXISTS)
        outcome, second = self.store.store("cas", b"k", b"y", 0, 0, A, cas=item.cas)
        self.assertEqual(outcome, Outcome.STORED)
        assert second is not None
        self.assertGreater(second.cas, item.cas)
        # A binary set with a CAS is a cas.
        self.assertEqual(self.store.store("set", b"k", b"z", 0, 0, A, cas=item.cas)[0], Outcome.EXISTS)

    def test_too_large(self) -> None:
        self.assertRaises(TooLarge, self.store.store, "set", b"k", b"x" * 1001, 0, 0, A)
        self.set(b"k", b"x" * 1000)
        self.assertEqual(self.store.store("append", b"k", b"y", 0, 0, A)[0], Outcome.NOT_STORED)
        self.assertEqual(self.value(b"k"), b"x" * 1000)

    def test_incr_decr(self) -> None:
        self.assertEqual(self.delta(b"n", 1), (Outcome.NOT_FOUND, None))
        self.assertEqual(self.delta(b"n", 1, initial=5), (Outcome.STORED, 5))
        self.assertEqual(self.delta(b"n", 2**64 - 5), (Outcome.STORED, 0))  # wraps
        self.assertEqual(self.delta(b"n", 3, decrement=True), (Outcome.STORED, 0))  # floors
        self.set(b"n", b"10")
        self.assertEqual(self.delta(b"n", 1, decrement=True), (Outcome.STORED, 9))
        self.assertEqual(self.value(b"n"), b"9")  # (not "9 ", as memcached pads it)
        self.set(b"n", b" 12 ")
        self.assertEqual(self.delta(b"n", 1), (Outcome.STORED, 13))
        for value in (b"abc", b"-5", b"", b"9" * 21):
            self.set(b"s", value)
            self.assertRaises(NonNumeric, self.store.add_delta, b"s", 1, A)

    def test_delete(self) -> None:
        self.assertEqual(self.store.delete(b"k", A), Outcome.NOT_FOUND)
        _, item = self.store.store("set", b"k", b"x", 0, 0, A)
        assert item is not None
        self.assertEqual(self.store.delete(b"k", A, cas=item.cas + 1), Outcome.EXISTS)
        self.assertEqual(self.store.delete(b"k", A, cas=item.cas), Outcome.DELETED)
        self.assertIsNone(self.store.get(b"k"))
        self.assertEqual(self.store.bytes, 0)


class ExpiryTests(StoreTestCase):
    def test_relative_absolute_negative(self) -> None:
        now = int(self.clock.seconds())
        self.set(b"rel", exptime=5)
        self.set(b"abs", exptime=now + RELATIVE_LIMIT + 100)
        self.set(b"past", exptime=RELATIVE_LIMIT + 1)  # an absolute time long gone
        self.set(b"neg", exptime=-1)
        self.set(b"never")
        self.assertEqual([self.value(k) for k in (b"past", b"neg")], [None, None])
        self.clock.advance(5)
        self.assertIsNone(self.value(b"rel"))
        self.assertEqual(self.value(b"abs"), b"v")
        self.clock.advance(RELATIVE_LIMIT + 100)
        self.assertIsNone(self.value(b"abs"))
        self.assertEqual(self.value(b"never"), b"v")
        self.assertEqual(len(self.store), 1)

    def test_touch(self) -> None:
        self.set(b"k", exptime=5)
        self.clock.advance(4)
        self.assertIsNotNone(self.store.touch(b"k", 10))
        self.clock.advance(9)
        self.assertEqual(self.value(b"k"), b"v")
        self.assertIsNotNone(self.store.touch(b"k", 0))
        self.clock.advance(100)
        self.assertEqual(self.value(b"k"), b"v")
        self.assertIsNone(self.store.touch(b"missing", 10))

    def test_sweep_removes_expired_within_budget(self) -> None:
        for index in range(25):
            self.set(b"k%d" % index, exptime=1)
        self.set(b"stays", exptime=100)
        self.clock.advance(2)
        self.assertTrue(self.store.sweep(budget=10))
        self.assertEqual(len(self.store), 16)
        self.assertTrue(self.store.sweep(budget=10))
        self.assertFalse(self.store.sweep(budget=10))
        self.assertEqual(len(self.store), 1)
        self.assertEqual(self.store.expired, 25)
        self.assertEqual(self.store.bytes, sized(b"stays", b"v"))

    def test_sweep_service_runs_on_the_clock(self) -> None:
        sweeper = SweepService(self.store)
        sweeper.startService()
        self.set(b"k", exptime=3)
        self.clock.advance(1)
        self.assertEqual(len(self.store), 1)
        self.clock.pump([1, 1, 1])
        self.assertEqual(len(self.store), 0)
        sweeper.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_resetting_expiry_leaves_no_stale_buckets_behind(self) -> None:
        for second in range(1, 1000):
            self.set(b"k", exptime=second)
        self.assertLess(len(self.store._seconds), 200)
        self.assertEqual(len(self.store._expiring), 1)

    def test_delayed_flush(self) -> None:
        self.set(b"old")
        self.store.flush_later(10)
        self.clock.advance(5)
        self.set(b"during")
        self.assertEqual(self.value(b"old"), b"v")
        self.store.flush_later(20)  # replaces the first
        self.clock.advance(6)
        self.assertEqual(self.value(b"old"), b"v")
        self.clock.advance(15)
        self.assertEqual((self.value(b"old"), self.value(b"during")), (None, None))


class KeysTests(StoreTestCase):
    """yrmcds's Keys: the keys of the live objects with a prefix, a snapshot that touches nothing."""

    def test_prefix_and_snapshot(self) -> None:
        for key in (b"apple", b"apricot", b"banana"):
            self.set(key)
        self.assertEqual(sorted(self.store.keys()), [b"apple", b"apricot", b"banana"])
        self.assertEqual(sorted(self.store.keys(b"ap")), [b"apple", b"apricot"])
        self.assertEqual(self.store.keys(b"apples"), [])
        # listing is no use: it counts no hit and moves nothing
        self.store.get(b"apple")
        listed = self.store.keys()
        self.assertEqual(self.store.keys(), listed)
        self.assertEqual((self.store.hits, self.store.misses), (1, 0))
        # a snapshot: later writes leave it as it was
        self.store.delete(b"banana", A)
        self.set(b"cherry")
        self.assertEqual(sorted(listed), [b"apple", b"apricot", b"banana"])
        self.assertEqual(sorted(self.store.keys()), [b"apple", b"apricot", b"cherry"])

    def test_expired_objects_are_left_out_and_left_in_place(self) -> None:
        self.set(b"never")
        self.set(b"soon", exptime=10)
        self.set(b"locked", exptime=10)
        self.assertEqual(self.store.lock(b"locked", A), Outcome.OK)
        self.assertEqual(sorted(self.store.keys()), [b"locked", b"never", b"soon"])
        self.clock.advance(10)
        self.assertEqual(sorted(self.store.keys()), [b"locked", b"never"])
        self.assertEqual(self.store.keys(b"so"), [])
        self.assertEqual(len(self.store), 3)  # (removed by a read or the sweep, not by a listing)
        self.store.unlock(b"locked", A)
        self.assertEqual(self.store.keys(), [b"never"])

    def test_lock_table_keys_are_not_objects(self) -> None:
        self.set(b"object")
        self.locks.request("lock-only", B, 1, 0, 0)
        self.assertEqual(self.store.keys(), [b"object"])


class MemoryTests(StoreTestCase):
    def test_least_recently_used_evicted(self) -> None:
        value = b"x" * 900
        self.store = ObjectStore(self.locks, memory=10 * sized(b"k0", value) + 5, max_item=1000)
        for index in range(10):
            self.set(b"k%d" % index, value)
        self.assertEqual(self.store.evictions, 0)
        self.store.get(b"k0")  # now the most recently used
        self.set(b"k10", value)
        self.assertIsNone(self.value(b"k1"))
        self.assertEqual(self.value(b"k0"), value)
        self.assertEqual(self.store.evictions, 1)
        self.assertLessEqual(self.store.bytes, self.store.memory)

    def test_replacing_never_evicts_itself_nor_loses_it(self) -> None:
        self.store = ObjectStore(self.locks, memory=3 * sized(b"k0", b"x" * 100), max_item=1000)
        for index in range(3):
            self.set(b"k%d" % index, b"x" * 100)
        self.locks.request("k1", B, 1, 0, 0)
        self.locks.request("k2", B, 1, 0, 0)
        self.assertRaises(OutOfMemory, self.set, b"k0", b"y" * 200)
        self.assertEqual(self.value(b"k0"), b"x" * 100)
        self.assertEqual(self.set(b"k0", b"y" * 100), Outcome.STORED)

    def test_locked_items_first_in_line_are_passed_over(self) -> None:
        size = sized(b"k0", b"x" * 100)
        self.store = ObjectStore(self.locks, memory=4 * size, max_item=1000)
        for index in range(4):
            self.set(b"k%d" % index, b"x" * 100)
        self.locks.request("k0", B, 1, 0, 0)
        self.assertEqual(self.set(b"big", b"x" * (99 + 2 * size)), Outcome.STORED)  # k1, k2, k3 make room
        self.assertEqual([self.value(b"k%d" % index) is not None for index in range(4)], [True, False, False, False])

    def test_only_locked_left(self) -> None:
        self.store = ObjectStore(self.locks, memory=2 * sized(b"k0", b"x" * 100), max_item=1000)
        self.set(b"k0", b"x" * 100)
        self.set(b"k1", b"x" * 100)
        self.assertEqual(self.store.lock(b"k0", A), Outcome.OK)
        self.locks.request("k1", B, 1, 0, 0)  # a JESync holder locks object k1 too
        self.assertRaises(OutOfMemory, self.set, b"k2", b"x" * 100)
        self.assertEqual((self.value(b"k0"), self.value(b"k1")), (b"x" * 100, b"x" * 100))
        self.store.unlock(b"k0", A)
        self.assertEqual(self.set(b"k2", b"x" * 100), Outcome.STORED)
        self.assertIsNone(self.value(b"k0"))


class LockTests(StoreTestCase):
    def test_lock_rules(self) -> None:
        self.assertEqual(self.store.lock(b"k", A), Outcome.NOT_FOUND)
        self.set(b"k")
        self.assertEqual(self.store.lock(b"k", A), Outcome.OK)
        self.assertEqual(self.locks.status("k").granted, 1)
        self.assertEqual(self.store.lock(b"k", A), Outcome.LOCKED)  # the holder too, as yrmcds
        self.assertEqual(self.store.lock(b"k", B), Outcome.LOCKED)
        self.assertEqual(self.store.unlock(b"k", B), Outcome.NOT_LOCKED)
        self.assertEqual(self.store.unlock(b"missing", B), Outcome.NOT_FOUND)
        self.assertEqual(self.store.unlock(b"k", A), Outcome.OK)
        self.assertEqual(self.store.lock(b"k", B), Outcome.OK)
        grant = self.locks.grant_of("k", B)
        assert grant is not None
        self.assertIsNone(grant.expires_at)  # no failsafe: held until unlocked or disconnected

    def test_writes_of_others_refused(self) -> None:
        self.set(b"k", b"1")
        self.store.lock(b"k", A)
        for mode in ("set", "add", "replace", "append", "prepend"):
            self.assertEqual(self.store.store(mode, b"k", b"2", 0, 0, B)[0], Outcome.LOCKED, mode)
        item = self.store.get(b"k")
        assert item is not None
        self.assertEqual(self.store.store("cas", b"k", b"2", 0, 0, B, cas=item.cas)[0], Outcome.LOCKED)
        self.assertEqual(self.delta(b"k", 1, B), (Outcome.LOCKED, None))
        self.assertEqual(self.store.delete(b"k", B), Outcome.LOCKED)
        self.assertIsNotNone(self.store.touch(b"k", 100))  # touch is not a write
        self.assertEqual(self.value(b"k"), b"1")
        self.assertEqual(self.delta(b"k", 1, A), (Outcome.STORED, 2))
        self.assertEqual(self.set(b"k", b"mine", owner=A), Outcome.STORED)

    def test_owner_delete_drops_the_lock(self) -> None:
        self.set(b"k")
        self.store.lock(b"k", A)
        self.assertEqual(self.store.delete(b"k", A), Outcome.DELETED)
        self.assertEqual(self.locks.status("k").granted, 0)
        self.assertEqual(self.store.store("add", b"k", b"v", 0, 0, B)[0], Outcome.STORED)

    def test_a_lock_from_another_protocol_locks_the_object(self) -> None:
        jesync_client = object()
        self.locks.request("k", jesync_client, 1, 0, 30)
        self.assertEqual(self.store.store("add", b"k", b"v", 0, 0, A)[0], Outcome.LOCKED)  # even missing
        self.locks.release("k", jesync_client)
        self.set(b"k")
        self.locks.request("k", jesync_client, 3, 0, 30)  # a semaphore holder too
        self.assertEqual(self.store.lock(b"k", A), Outcome.LOCKED)
        self.assertEqual(self.store.delete(b"k", A), Outcome.LOCKED)

    def test_a_multi_key_waiter_first_in_line_makes_lock_answer_locked(self) -> None:
        self.set(b"k")
        other = object()
        self.locks.request("j", other, 1, 0, 0)
        waiting = self.locks.request_many(["j", "k"], object(), 10, 0)
        self.assertEqual(self.store.lock(b"k", A), Outcome.LOCKED)
        self.assertEqual(self.locks.status("k").granted, 0)
        waiting.cancel()  # type: ignore[union-attr]
        self.failureResultOf(waiting)

    def test_locked_objects_are_not_expired_evicted_or_flushed(self) -> None:
        self.set(b"k", exptime=2)
        self.set(b"other", exptime=2)
        self.store.lock(b"k", A)
        self.clock.advance(5)
        self.assertFalse(self.store.sweep())
        self.assertEqual(self.value(b"k"), b"v")
        self.assertIsNone(self.value(b"other"))
        self.set(b"plain")
        self.store.flush()
        self.assertEqual((self.value(b"k"), self.value(b"plain")), (b"v", None))
        # Once unlocked, its time having run out, it expires.
        self.store.unlock(b"k", A)
        self.clock.advance(2)
        self.store.sweep()
        self.assertEqual(len(self.store), 0)

    def test_replace_and_unlock(self) -> None:
        self.set(b"k", b"old")
        self.assertEqual(self.store.replace_and_unlock(b"k", b"new", 0, 0, A)[0], Outcome.NOT_LOCKED)
        self.store.lock(b"k", A)
        self.assertEqual(self.store.replace_and_unlock(b"k", b"new", 4, 0, A)[0], Outcome.STORED)
        self.assertEqual(self.value(b"k"), b"new")
        self.assertEqual(self.locks.status("k").granted, 0)

    def test_unlock_all_and_limits(self) -> None:
        for index in range(5):
            self.set(b"k%d" % index)
            self.assertEqual(self.store.lock(b"k%d" % index, A), Outcome.OK)
        self.set(b"k5")
        self.assertRaises(LimitReached, self.store.lock, b"k5", A)  # max-held 5
        self.assertEqual(self.store.locked_items(), 5)
        self.store.unlock_all(A)
        self.assertEqual(self.store.locked_items(), 0)
        self.assertEqual(self.locks.totals().granted, 0)
