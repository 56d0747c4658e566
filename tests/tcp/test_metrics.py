"""
Tests for L{jesync.metrics}: the counters and wait histogram a lock service's
events drive, the gauges read at scrape time, and the web resource that
serves them (over real HTTP, on the loopback interface).

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
import warnings
from unittest import mock

from twisted.internet import reactor
from twisted.internet.defer import CancelledError, inlineCallbacks
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.server import Site
from zope.interface.verify import verifyObject

from jesync.errors import LockTimeout
from jesync.interfaces import ILockObserver
from jesync.service import LockService

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.parser import text_string_to_metric_families

    from jesync.metrics import LockMetrics, metrics_resource
except ImportError:
    skip_without_prometheus = "prometheus_client is not installed (pip install '.[metrics]')"
else:
    skip_without_prometheus = None

# How long any one HTTP request may take before the test fails.
TIMEOUT = 5.0
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


@inlineCallbacks
def served_over_http(test, resource):
    """
    C{resource} served over real HTTP on 127.0.0.1 until C{test} ends: a
    function that GETs a path (with C{headers}), firing with the response
    and its body.
    """
    site = Site(resource)
    site.noisy = False
    port = yield serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(site)
    test.addCleanup(port.stopListening)
    base = f"http://127.0.0.1:{port.getHost().port}".encode("ascii")
    pool = HTTPConnectionPool(reactor, persistent=False)
    test.addCleanup(pool.closeCachedConnections)
    agent = Agent(reactor, connectTimeout=TIMEOUT, pool=pool)

    @inlineCallbacks
    def get(path: bytes, headers=None):
        request = agent.request(b"GET", base + path, headers)
        request.addTimeout(TIMEOUT, reactor)
        response = yield request
        with warnings.catch_warnings():
            # Agent's response transport has no abortConnection (twisted#8227).
            warnings.filterwarnings("ignore", "Using readBody", DeprecationWarning)
            body = readBody(response)
        body.addTimeout(TIMEOUT, reactor)
        return response, (yield body)

    return get


class HTTPTests(TestCase):
    """The metrics resource over real HTTP on 127.0.0.1."""

    skip = skip_without_prometheus
    timeout = 10

    @inlineCallbacks
    def setUp(self):
        self.service = LockService(Clock())
        self.connections: list[object] = []
        self.metrics = LockMetrics(self.service, self.connections)
        self.service.observer = self.metrics
        self.serving = True
        self.fetch = yield served_over_http(self, metrics_resource(self.metrics, lambda: self.serving))

    @inlineCallbacks
    def get(self, path: bytes):
        """GET C{path}: (status code, content type, body)."""
        response, body = yield self.fetch(path)
        content_type = response.headers.getRawHeaders(b"content-type", [b""])[0]
        return response.code, content_type.decode("ascii"), body

    @inlineCallbacks
    def test_metrics(self):
        self.connections.extend([object()] * 3)
        self.successResultOf(self.service.acquire("a", "alice"))
        self.service.acquire("a", "bob")
        code, content_type, body = yield self.get(b"/metrics")
        self.assertEqual((code, content_type), (200, CONTENT_TYPE_LATEST))
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(body.decode("utf-8"))
            for sample in family.samples
            if not sample.labels
        }
        expected = {
            "jesync_grants_total": 1,
            "jesync_timeouts_total": 0,
            "jesync_expiries_total": 0,
            "jesync_releases_total": 0,
            "jesync_wait_seconds_count": 1,
            "jesync_wait_seconds_sum": 0,
            "jesync_connections": 3,
            "jesync_keys": 1,
            "jesync_holders": 1,
            "jesync_waiters": 1,
        }
        self.assertEqual({name: samples.get(name) for name in expected}, expected)
        self.assertIn(b"# TYPE jesync_wait_seconds histogram\n", body)

    @inlineCallbacks
    def test_health(self):
        self.assertEqual((yield self.get(b"/health")), (200, "text/plain; charset=utf-8", b"OK\n"))
        self.serving = False
        self.assertEqual(
            (yield self.get(b"/health")), (503, "text/plain; charset=utf-8", b"stopping\n")
        )

    @inlineCallbacks
    def test_anything_else_is_not_found(self):
        for path in (b"/nope", b"/", b"/metrics/nope", b"/health/"):
            code, _, _ = yield self.get(path)
            self.assertEqual(code, 404, path)


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


class BearerTokenTests(TestCase):
    """
    With a token, /metrics answers only a request that carries it as a
    bearer token (the connection policy's check: the previous token during
    its grace too); /health stays open.  Over real HTTP on 127.0.0.1.
    """

    skip = skip_without_prometheus
    timeout = 10

    @inlineCallbacks
    def setUp(self):
        from jesync.connections.policy import ConnectionPolicy

        self.clock = Clock()
        self.policy = ConnectionPolicy(auth_token=b"s3cret")
        self.service = LockService(self.clock)
        self.metrics = LockMetrics(self.service, [])
        self.service.observer = self.metrics
        self.fetch = yield served_over_http(
            self, metrics_resource(self.metrics, accepts=lambda token: self.policy.accepts(token, self.clock.seconds()))
        )

    @inlineCallbacks
    def get(self, path: bytes, authorization: bytes | None = None):
        """GET C{path}: (status code, its WWW-Authenticate header or None, body)."""
        from twisted.web.http_headers import Headers

        headers = Headers({b"Authorization": [authorization]} if authorization is not None else {})
        response, body = yield self.fetch(path, headers)
        challenge = response.headers.getRawHeaders(b"www-authenticate", [None])[0]
        return response.code, challenge, body

    @inlineCallbacks
    def assertRefused(self, authorization: bytes | None, challenge: bytes):
        code, sent_challenge, body = yield self.get(b"/metrics", authorization)
        self.assertEqual((code, sent_challenge), (401, challenge), authorization)
        self.assertNotIn(b"jesync_", body)
        self.assertNotIn(b"s3cret", body)

    @inlineCallbacks
    def assertServed(self, authorization: bytes | None):
        code, _, body = yield self.get(b"/metrics", authorization)
        self.assertEqual(code, 200, authorization)
        self.assertIn(b"\njesync_holders 0.0\n", body)

    @inlineCallbacks
    def test_only_the_token_reads_the_metrics(self):
        yield self.assertRefused(None, b'Bearer realm="jesync"')
        yield self.assertRefused(b"Basic czNjcmV0", b'Bearer realm="jesync"')  # (not a bearer token)
        yield self.assertRefused(b"Bearer", b'Bearer realm="jesync"')
        for wrong in (b"Bearer s3cre", b"Bearer s3cret2", b"Bearer S3CRET"):
            yield self.assertRefused(wrong, b'Bearer realm="jesync", error="invalid_token"')
        for right in (b"Bearer s3cret", b"bearer s3cret", b"BEARER  s3cret "):
            yield self.assertServed(right)

    @inlineCallbacks
    def test_health_stays_open(self):
        self.assertEqual((yield self.get(b"/health")), (200, None, b"OK\n"))

    @inlineCallbacks
    def test_rotation_and_its_grace(self):
        """A token rotated out (SIGHUP) reads the metrics for the grace period, and not after."""
        self.assertTrue(self.policy.rotate(b"n3w", self.clock.seconds(), grace=300))
        yield self.assertServed(b"Bearer n3w")
        yield self.assertServed(b"Bearer s3cret")
        self.clock.advance(300)
        yield self.assertServed(b"Bearer n3w")
        yield self.assertRefused(b"Bearer s3cret", b'Bearer realm="jesync", error="invalid_token"')

    def test_the_token_is_compared_in_constant_time(self):
        """The check is the policy's, hmac.compare_digest: no early exit on the first wrong byte."""
        import hmac

        with mock.patch.object(hmac, "compare_digest", wraps=hmac.compare_digest) as compare:
            self.assertFalse(self.policy.accepts(b"s3crex", self.clock.seconds()))
        compare.assert_called_once_with(b"s3crex", b"s3cret")


class TwistdMetricsTokenTests(SynchronousTestCase):
    """A real twistd server: /metrics needs the --auth-token-file token unless --metrics-public; /health never."""

    skip = skip_without_prometheus

    def start(self, *extra: str) -> tuple[str, str]:
        """
        A server with a token file (holding first-t0ken-8c1f) and these
        options: (its metrics URL base, the token file's path).
        """
        import os
        import tempfile

        from tests.servers import free_port, start_server

        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "token")
        with open(path, "wb") as file:
            file.write(b"first-t0ken-8c1f\n")
        self.addCleanup(os.rmdir, directory)
        self.addCleanup(os.unlink, path)
        port = free_port()
        self.server = start_server(
            self,
            extra_args=["--auth-token-file", path, "--metrics", f"tcp:{port}:interface=127.0.0.1", *extra],
            auth_token=b"first-t0ken-8c1f",
        )
        return f"http://127.0.0.1:{port}", path

    def get(self, url: str, token: bytes | None = None) -> tuple[int, bytes]:
        """GET C{url} (with the bearer C{token}): (status, body); waits for the metrics listener if need be."""
        import time
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url)
        if token is not None:
            request.add_header("Authorization", "Bearer " + token.decode())
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()
            except urllib.error.URLError:
                # (the metrics listener may start a moment after the lock port answers)
                self.assertLess(time.monotonic(), deadline, f"{url} did not answer")
                time.sleep(0.05)

    def test_token_needed_and_rotated_on_sighup(self) -> None:
        import signal
        import time

        base, path = self.start()
        self.assertEqual(self.get(base + "/metrics")[0], 401)
        self.assertEqual(self.get(base + "/metrics", b"wrong")[0], 401)
        code, body = self.get(base + "/metrics", b"first-t0ken-8c1f")
        self.assertEqual(code, 200)
        self.assertIn(b"\njesync_connections ", body)
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))
        with open(path, "wb") as file:
            file.write(b"second-t0ken-2b7e\n")
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while self.get(base + "/metrics", b"second-t0ken-2b7e")[0] != 200:
            self.assertLess(time.monotonic(), deadline, "the new token was not taken")
            time.sleep(0.05)
        self.assertEqual(self.get(base + "/metrics", b"first-t0ken-8c1f")[0], 200)  # (within --auth-token-grace, 300 s)
        self.assertEqual(self.get(base + "/metrics")[0], 401)
        for token in ("first-t0ken-8c1f", "second-t0ken-2b7e"):
            self.assertNotIn(token, self.server.log())

    def test_a_client_without_the_token_is_closed_after_the_auth_timeout(self) -> None:
        """
        One that trickles a request (a byte every 0.2 s, never done) holds one
        of the endpoint's 16 connections for --auth-timeout only; one that
        scraped with the token keeps its keep-alive connection past it.
        """
        import socket
        import time

        base, _ = self.start("--auth-timeout", "1")
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))  # (the listener is up)
        port = int(base.rsplit(":", 1)[1])
        request = b"GET /metrics HTTP/1.1\r\nHost: jesync\r\nAuthorization: Bearer first-t0ken-8c1f\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as scraper, socket.create_connection(
            ("127.0.0.1", port), timeout=TIMEOUT
        ) as trickler:
            scraper.sendall(request)
            self.assertTrue(self.response(scraper).startswith(b"HTTP/1.1 200 "))
            opened = time.monotonic()
            closed_after = None
            trickle = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100
            for byte in trickle:
                try:
                    trickler.sendall(bytes([byte]))
                    trickler.settimeout(0.2)
                    if trickler.recv(100) == b"":
                        closed_after = time.monotonic() - opened
                        break
                except socket.timeout:
                    continue
                except OSError:  # (aborted: a reset)
                    closed_after = time.monotonic() - opened
                    break
            self.assertIsNotNone(closed_after, "the trickling client was never closed")
            assert closed_after is not None
            self.assertGreaterEqual(closed_after, 0.8)
            self.assertLess(closed_after, 5)
            scraper.sendall(request)  # (past the deadline: still open, and answered)
            received = self.response(scraper)
            self.assertTrue(received.startswith(b"HTTP/1.1 200 "), received[:100])

    def test_a_health_check_keep_alive_connection_is_closed_cleanly(self) -> None:
        """
        A load balancer's keep-alive connection that only asks /health is
        closed at --auth-timeout with a FIN between its requests, never
        reset; one sending a request never finished is closed too.
        """
        import socket
        import time

        base, _ = self.start("--auth-timeout", "1")
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))  # (the listener is up)
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as checker:
            opened = time.monotonic()
            checker.sendall(b"GET /health HTTP/1.1\r\nHost: jesync\r\n\r\n")
            received = self.response(checker)
            self.assertTrue(received.startswith(b"HTTP/1.1 200 "), received[:100])
            self.assertTrue(received.endswith(b"OK\n"))
            checker.settimeout(TIMEOUT)
            self.assertEqual(checker.recv(100), b"")  # (a FIN: a reset raises ConnectionResetError)
            self.assertGreaterEqual(time.monotonic() - opened, 0.8)
            # (the server closed it: a request now finds it closed, not answered)
            try:
                checker.sendall(b"GET /health HTTP/1.1\r\nHost: jesync\r\n\r\n")
                self.assertEqual(checker.recv(100), b"")
            except (BrokenPipeError, ConnectionResetError):
                pass

    def response(self, sock: object) -> bytes:
        """One whole HTTP response (headers and its Content-Length of body) read from C{sock}."""
        import re
        import socket

        assert isinstance(sock, socket.socket)
        sock.settimeout(TIMEOUT)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, "the connection was closed")
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        length = re.search(rb"\r\nContent-Length: (\d+)", head)
        assert length is not None, head
        while len(body) < int(length.group(1)):
            chunk = sock.recv(65536)
            self.assertTrue(chunk, "the connection was closed")
            body += chunk
        return received

    def test_metrics_public(self) -> None:
        base, _ = self.start("--metrics-public")
        code, body = self.get(base + "/metrics")
        self.assertEqual(code, 200)
        self.assertIn(b"\njesync_connections ", body)
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))


class ClusterMetricsTokenTests(SynchronousTestCase):
    """A cluster member's /metrics needs the token too, as a standby (the token it started with) and as the leader."""

    skip = skip_without_prometheus

    def test_standby_and_leader(self) -> None:
        import os
        import tempfile
        import time
        import urllib.error
        import urllib.request

        from tests.cluster import MemberProcess
        from tests.etcd_server import start_etcd
        from tests.servers import free_port

        etcd = start_etcd(self)
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "token")
        with open(path, "wb") as file:
            file.write(b"cluster-t0ken-5d2a\n")
        self.addCleanup(os.rmdir, directory)
        self.addCleanup(os.unlink, path)
        member = MemberProcess([etcd.endpoint], f"test-{free_port()}", extra_args=["--auth-token-file", path])
        self.addCleanup(member.close)
        member.start()  # (ready once /health answers: a standby, or the leader already)

        def scrape(token: bytes | None) -> tuple[int, bytes]:
            request = urllib.request.Request(f"http://127.0.0.1:{member.metrics_port}/metrics")
            if token is not None:
                request.add_header("Authorization", "Bearer " + token.decode())
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        self.assertEqual(scrape(None)[0], 401)
        self.assertEqual(scrape(b"cluster-t0ken-5d2a")[0], 200)
        deadline = time.monotonic() + 20
        while member.health() != "leader":
            self.assertLess(time.monotonic(), deadline, member.log())
            time.sleep(0.05)
        self.assertEqual(scrape(None)[0], 401)
        self.assertEqual(scrape(b"wrong")[0], 401)
        code, body = scrape(b"cluster-t0ken-5d2a")
        self.assertEqual(code, 200)
        self.assertIn(b"\njesync_cluster_leader 1.0\n", body)
