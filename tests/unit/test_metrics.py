"""
Tests for L{jesync.metrics}: the counters and wait histogram a lock service's
events drive, the gauges read at scrape time, the memcached objects a lock
holds, and what a scrape costs.  No socket: the web resource over real HTTP
is L{tests.tcp.test_metrics}, a real twistd's token rules
L{tests.process.test_metrics_twistd}, a cluster member's
L{tests.etcd.test_metrics_cluster}.

The lock service runs on a L{Clock}, so waits and expiries take exact,
known times.  Skipped without C{prometheus_client} (C{pip install
'.[metrics]'}), except the test that its absence is explained.
"""

from __future__ import annotations

import gc
import importlib
import platform
import sys
from typing import Callable
from unittest import mock

from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from jesync.errors import LockTimeout
from jesync.interfaces import ILockObserver
from jesync.service import LockService
from tests.support import skip_without_prometheus

try:
    from prometheus_client import CollectorRegistry

    from jesync.metrics import LockMetrics
except ImportError:
    pass  # (the tests that need them are skipped: skip_without_prometheus)

# Timers fire at most one 10 ms tick after their deadline.
SLACK = 0.05

COUNTERS = ("grants", "timeouts", "expiries", "releases")


class MissingDependencyTests(SynchronousTestCase):
    def test_import_error_says_what_to_install(self) -> None:
        """Without prometheus_client, importing jesync.metrics says how to get it."""
        hidden = {
            name: None
            for name in list(sys.modules)
            if name == "prometheus_client" or name.startswith("prometheus_client.")
        }
        hidden["prometheus_client"] = None  # None in sys.modules: the import fails
        with mock.patch.dict(sys.modules, hidden):
            sys.modules.pop("jesync.metrics", None)
            with self.assertRaises(ImportError) as caught:
                importlib.import_module("jesync.metrics")
        self.assertIn("pip install 'jesync[metrics]'", str(caught.exception))


class MetricsTestCase(SynchronousTestCase):
    """A L{LockService} on a L{Clock}, observed by a L{LockMetrics}."""

    skip = skip_without_prometheus

    def setUp(self) -> None:
        self.clock = Clock()
        self.connections: list[object] = []
        self.service = LockService(self.clock)
        self.metrics = LockMetrics(self.service, self.connections)
        self.service.observer = self.metrics

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        assert value is not None, f"no sample {name} {labels}"
        return value

    def counters(self) -> dict[str, float]:
        return {name: self.sample(f"jesync_{name}_total") for name in COUNTERS}

    def assertCounted(self, before: dict[str, float], **changes: int) -> None:
        """Each counter changed by C{changes[name]} since C{before} (0 if not given)."""
        expected = {name: before[name] + changes.get(name, 0) for name in COUNTERS}
        self.assertEqual(self.counters(), expected)

    def assertWaits(self, count: int, total: float) -> None:
        self.assertEqual(self.sample("jesync_wait_seconds_count"), count)
        self.assertAlmostEqual(self.sample("jesync_wait_seconds_sum"), total)

    def grant(self, key: str, owner: str, **kwargs: float):
        return self.successResultOf(self.service.acquire(key, owner, **kwargs))


class CounterTests(MetricsTestCase):
    def test_observer(self) -> None:
        self.assertTrue(verifyObject(ILockObserver, self.metrics))

    def test_start_at_zero(self) -> None:
        self.assertEqual(self.counters(), dict.fromkeys(COUNTERS, 0))
        self.assertWaits(0, 0)

    def test_acquire_and_release(self) -> None:
        before = self.counters()
        grant = self.grant("a", "alice")
        self.assertCounted(before, grants=1)
        self.assertTrue(grant.release())
        self.assertCounted(before, grants=1, releases=1)

    def test_renewal_is_not_a_grant(self) -> None:
        before = self.counters()
        self.grant("a", "alice")
        self.grant("a", "alice")
        self.assertCounted(before, grants=1)
        self.assertWaits(1, 0)

    def test_release_of_nothing_counts_nothing(self) -> None:
        before = self.counters()
        self.assertFalse(self.service.release("a", "alice"))
        self.assertCounted(before)

    def test_timeout(self) -> None:
        self.grant("a", "alice")
        before = self.counters()
        waiting = self.service.acquire("a", "bob", timeout=3)
        self.clock.advance(3 + SLACK)
        self.failureResultOf(waiting, LockTimeout)
        self.assertCounted(before, timeouts=1)
        self.assertWaits(1, 0)  # a wait that timed out is not in the histogram

    def test_try_lock_that_fails_is_not_a_timeout(self) -> None:
        """C{timeout=0} on a held key never waited: the service reports no timeout."""
        self.grant("a", "alice")
        before = self.counters()
        self.failureResultOf(self.service.acquire("a", "bob", timeout=0), LockTimeout)
        self.assertCounted(before)

    def test_expiry(self) -> None:
        grant = self.grant("a", "alice", expires=5)
        before = self.counters()
        self.clock.advance(5 + SLACK)
        self.assertCounted(before, expiries=1)
        self.assertFalse(grant.release())
        self.assertCounted(before, expiries=1)

    def test_release_all(self) -> None:
        """Each grant the owner held is a release; its cancelled waits count nothing."""
        self.grant("a", "alice")
        self.grant("b", "alice")
        self.grant("c", "carol")
        alice_waits = self.service.acquire("c", "alice")
        bob_waits = self.service.acquire("a", "bob")
        before = self.counters()
        self.clock.advance(2)
        self.service.release_all("alice")
        self.failureResultOf(alice_waits, CancelledError)
        self.assertEqual(self.successResultOf(bob_waits).owner, "bob")
        self.assertCounted(before, releases=2, grants=1)
        self.assertWaits(4, 2)


class WaitHistogramTests(MetricsTestCase):
    def bucket(self, le: str) -> float:
        return self.sample("jesync_wait_seconds_bucket", {"le": le})

    def test_immediate_grant_waited_zero(self) -> None:
        self.grant("a", "alice")
        self.grant("b", "alice")
        self.assertWaits(2, 0)
        self.assertEqual(self.bucket("0.001"), 2)

    def test_waited_grants(self) -> None:
        first = self.grant("a", "alice")
        bob = self.service.acquire("a", "bob")
        self.clock.advance(2.5)
        carol = self.service.acquire("a", "carol")
        first.release()
        second = self.successResultOf(bob)
        self.clock.advance(40)
        second.release()
        self.successResultOf(carol)
        # alice at once, bob after 2.5 s, carol after 40 s.
        self.assertWaits(3, 42.5)
        self.assertEqual(self.bucket("0.001"), 1)
        self.assertEqual(self.bucket("1.0"), 1)
        self.assertEqual(self.bucket("5.0"), 2)
        self.assertEqual(self.bucket("30.0"), 2)
        self.assertEqual(self.bucket("60.0"), 3)
        self.assertEqual(self.bucket("+Inf"), 3)


class GaugeTests(MetricsTestCase):
    def gauges(self) -> tuple[float, float, float, float]:
        return tuple(
            self.sample(f"jesync_{name}") for name in ("connections", "keys", "holders", "waiters")
        )

    def test_read_at_scrape_time(self) -> None:
        self.assertEqual(self.gauges(), (0, 0, 0, 0))
        self.connections.extend([object(), object()])
        self.grant("a", "alice", max_concurrent=2)
        self.grant("a", "bob", max_concurrent=2)
        self.grant("b", "alice")
        waits = [self.service.acquire(key, "carol") for key in ("a", "b")]
        self.assertEqual(self.gauges(), (2, 2, 3, 2))
        self.assertEqual(tuple(self.service.totals()), (2, 3, 2))
        self.connections.pop()
        self.service.release_all("carol")
        for wait in waits:
            self.failureResultOf(wait, CancelledError)
        self.assertEqual(self.gauges(), (1, 2, 3, 0))

    def test_registries_are_separate(self) -> None:
        """Two servers in one process: each has its own metrics, nothing clashes."""
        other_service = LockService(self.clock)
        other = LockMetrics(other_service, [], registry=CollectorRegistry())
        other_service.observer = other
        self.grant("a", "alice")
        self.assertEqual(self.sample("jesync_grants_total"), 1)
        self.assertEqual(other.registry.get_sample_value("jesync_grants_total"), 0)
        self.assertEqual(other.registry.get_sample_value("jesync_holders"), 0)


class MemcacheMetricsTests(MetricsTestCase):
    def test_the_store_read_at_scrape_time(self) -> None:
        from jesync.protocols.memcache import MemcacheFactory
        from jesync.store import ObjectStore

        store = ObjectStore(self.service, memory=1 << 20)
        factory = MemcacheFactory(store)
        metrics = LockMetrics(self.service, self.connections, registry=CollectorRegistry(), memcache=factory)
        store.store("set", b"a", b"12345", 0, 0, "alice")
        store.store("set", b"b", b"1", 0, 0, "alice")
        store.get(b"a")
        store.get(b"missing")
        store.lock(b"b", "alice")
        names = ("connections", "items", "bytes", "locked_items", "hits_total", "misses_total", "evictions_total")
        samples = {name: metrics.registry.get_sample_value(f"jesync_memcache_{name}") for name in names}
        self.assertEqual(
            samples,
            {
                "connections": 0,
                "items": 2,
                "bytes": store.bytes,
                "locked_items": 1,
                "hits_total": 1,
                "misses_total": 1,
                "evictions_total": 0,
            },
        )
        self.assertIsNone(self.metrics.registry.get_sample_value("jesync_memcache_items"))  # only when served


class LockedItemsTests(SynchronousTestCase):
    """
    The memcached store's count of locked objects (C{jesync_memcache_locked_items},
    C{stats}'s C{locked_items}) is kept as the lock table and the store change:
    right through every way an object gets or loses its lock, or comes and goes.
    """

    def setUp(self) -> None:
        from jesync.store import ITEM_OVERHEAD, ObjectStore

        self.clock = Clock()
        self.service = LockService(self.clock)
        # Room for four 10-byte objects under 1-byte keys.
        self.store = ObjectStore(self.service, memory=4 * (1 + 10 + ITEM_OVERHEAD), max_item=100)

    def set(self, key: bytes, owner: str = "writer") -> None:
        from jesync.store import Outcome

        outcome, _ = self.store.store("set", key, b"0123456789", 0, 0, owner)
        self.assertEqual(outcome, Outcome.STORED)

    def assertLocked(self, *keys: bytes) -> None:
        self.assertEqual(sorted(self.store._locked), sorted(keys))
        self.assertEqual(self.store.locked_items(), len(keys))

    def test_memcached_lock_unlock_and_delete(self) -> None:
        from jesync.store import Outcome

        self.set(b"a")
        self.set(b"b")
        self.assertLocked()
        self.assertEqual(self.store.lock(b"a", "alice"), Outcome.OK)
        self.assertEqual(self.store.lock(b"b", "alice"), Outcome.OK)
        self.assertLocked(b"a", b"b")
        self.assertEqual(self.store.unlock(b"a", "alice"), Outcome.OK)
        self.assertLocked(b"b")
        self.assertEqual(self.store.delete(b"b", "alice"), Outcome.DELETED)  # (drops its lock)
        self.assertLocked()
        self.assertEqual(self.service.totals().granted, 0)

    def test_any_protocol_and_its_expiry(self) -> None:
        """A key held through the lock table by anyone locks its object; the grant's expiry unlocks it."""
        self.set(b"a")
        self.successResultOf(self.service.acquire("a", "jesync-client", max_concurrent=2, expires=10))
        self.successResultOf(self.service.acquire("a", "other-client", max_concurrent=2, expires=20))
        self.assertLocked(b"a")
        self.clock.advance(10)
        self.assertLocked(b"a")  # (one holder is left)
        self.clock.advance(10)
        self.assertLocked()

    def test_held_before_the_object_is_stored(self) -> None:
        self.successResultOf(self.service.acquire("a", "alice"))
        self.assertLocked()  # (no object: nothing locked)
        self.set(b"a", owner="alice")
        self.assertLocked(b"a")
        self.set(b"a", owner="alice")  # (rewritten by its holder: still locked)
        self.assertLocked(b"a")
        self.service.release_all("alice")
        self.assertLocked()

    def test_keys_that_are_not_ascii(self) -> None:
        """UTF-8 keys, and bytes that are not UTF-8 (the lock table's surrogate escapes), are counted."""
        from jesync.wire import decode_key

        for key in (b"\xc3\xa9t\xc3\xa9", b"\xff\xfe"):
            self.set(key)
            self.successResultOf(self.service.acquire(decode_key(key), "alice"))
        self.assertLocked(b"\xc3\xa9t\xc3\xa9", b"\xff\xfe")
        # A lock-table key no object's bytes decode to locks nothing.
        self.successResultOf(self.service.acquire("\udcc3\udca9t\udcc3\udca9", "bob"))
        self.successResultOf(self.service.acquire("\ud800", "bob"))
        self.assertLocked(b"\xc3\xa9t\xc3\xa9", b"\xff\xfe")
        self.service.release_all("alice")
        self.assertLocked()

    def test_two_stores_on_one_table(self) -> None:
        """Each store over the same lock table counts its own objects (the table tells every watcher)."""
        from jesync.store import ObjectStore

        other = ObjectStore(self.service)
        self.set(b"a")
        other.store("set", b"b", b"v", 0, 0, "writer")
        self.successResultOf(self.service.acquire("a", "alice"))
        self.successResultOf(self.service.acquire("b", "alice"))
        self.assertLocked(b"a")
        self.assertEqual(other.locked_items(), 1)
        self.service.release_all("alice")
        self.assertEqual((self.store.locked_items(), other.locked_items()), (0, 0))

    def test_flush_eviction_and_expiry_keep_the_locked(self) -> None:
        from jesync.store import Outcome

        for key in (b"a", b"b", b"c", b"d"):
            self.set(key)
        self.assertEqual(self.store.lock(b"a", "alice"), Outcome.OK)
        self.set(b"e")  # (evicts b, the least recently used unlocked object; a is locked)
        self.assertIsNone(self.store.get(b"b"))
        self.assertLocked(b"a")
        self.store.flush()
        self.assertEqual(len(self.store), 1)
        self.assertLocked(b"a")
        self.assertEqual(self.store.unlock(b"a", "alice"), Outcome.OK)  # (flushed: gone once unlocked)
        self.assertLocked()
        self.assertIsNone(self.store.get(b"a"))
        self.set(b"f")
        self.store.touch(b"f", 5)
        self.assertEqual(self.store.lock(b"f", "alice"), Outcome.OK)
        self.clock.advance(10)
        self.store.sweep()
        self.assertLocked(b"f")  # (its time has come, but it is locked)
        self.store.unlock_all("alice")
        self.assertLocked()
        self.clock.advance(2)  # (the sweep looks at a locked one again a second later)
        self.store.sweep()
        self.assertEqual(len(self.store), 0)


def operations(call: Callable[[], object]) -> int:
    """
    How much Python work C{call} does: the calls it makes and the lines it
    runs (a loop's every turn is a line event), as C{sys.settrace} sees them.
    """
    count = 0

    def trace(frame: object, event: str, arg: object) -> Callable[..., object]:
        nonlocal count
        count += 1
        return trace

    # (no garbage collection meanwhile: finalizers it would run, of other
    # tests' objects, are not the call's work)
    gc.collect()
    gc.disable()
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(previous)
        gc.enable()
    return count


class ScrapeCostTests(SynchronousTestCase):
    """A scrape's work does not grow with the lock table or the memcached store."""

    skip = skip_without_prometheus

    def scrape_operations(self, size: int) -> int:
        """The operations of one scrape of a server with C{size} objects, all locked, and C{size} more held keys."""
        from prometheus_client.exposition import generate_latest

        from jesync.connections.listings import ListingBudget
        from jesync.protocols.dlock import DlockFactory
        from jesync.protocols.memcache import MemcacheFactory
        from jesync.store import ObjectStore

        service = LockService(Clock())
        store = ObjectStore(service)
        metrics = LockMetrics(
            service,
            [],
            DlockFactory(service),
            registry=CollectorRegistry(),
            memcache=MemcacheFactory(store),
            listings=ListingBudget(),
        )
        service.observer = metrics
        for number in range(size):
            key = b"object-%d" % number
            store.store("set", key, b"v", 0, 0, "writer")
            self.assertEqual(store.lock(key, "holder").value, b"OK")
            self.successResultOf(service.acquire(f"lock-{number}", "holder"))
        generate_latest(metrics.registry)  # (anything done once, on a first scrape, is done)
        count = operations(lambda: generate_latest(metrics.registry))
        samples = {
            name: metrics.registry.get_sample_value(name)
            for name in ("jesync_keys", "jesync_holders", "jesync_memcache_items", "jesync_memcache_locked_items")
        }
        expected = {
            "jesync_keys": 2 * size,
            "jesync_holders": 2 * size,
            "jesync_memcache_items": size,
            "jesync_memcache_locked_items": size,
        }
        self.assertEqual(samples, expected)
        return count

    def test_scrape_work_does_not_grow_with_the_table(self) -> None:
        small, large = self.scrape_operations(200), self.scrape_operations(2000)
        self.assertGreater(small, 100)  # (the count sees the scrape's work)
        # The same work whatever the table holds (a scrape that walked it would do thousands more).
        if platform.python_implementation() == "PyPy":
            # PyPy's count may differ by a handful between two identical scrapes (its runtime's own
            # calls): not one operation more for every 100 more objects and keys.
            self.assertLess(abs(large - small), (2000 - 200) // 100)
        else:
            self.assertEqual(large, small)
