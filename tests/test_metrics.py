"""
Tests for L{jesync.metrics}: the counters and wait histogram a lock service's
events drive, the gauges read at scrape time, and the web resource that
serves them (over real HTTP, on the loopback interface).

The lock service runs on a L{Clock}, so waits and expiries take exact,
known times.  Skipped without C{prometheus_client} (C{pip install
'.[metrics]'}), except the test that its absence is explained.
"""

from __future__ import annotations

import importlib
import sys
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
        site = Site(metrics_resource(self.metrics, lambda: self.serving))
        site.noisy = False
        port = yield serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(site)
        self.addCleanup(port.stopListening)
        self.base = f"http://127.0.0.1:{port.getHost().port}".encode("ascii")
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        self.agent = Agent(reactor, connectTimeout=TIMEOUT, pool=pool)

    @inlineCallbacks
    def get(self, path: bytes):
        """GET C{path}: (status code, content type, body)."""
        request = self.agent.request(b"GET", self.base + path)
        request.addTimeout(TIMEOUT, reactor)
        response = yield request
        with warnings.catch_warnings():
            # Agent's response transport has no abortConnection (twisted#8227).
            warnings.filterwarnings("ignore", "Using readBody", DeprecationWarning)
            body = readBody(response)
        body.addTimeout(TIMEOUT, reactor)
        body = yield body
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
