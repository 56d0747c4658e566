"""
L{jesync.cluster.etcd.EtcdClient} against real etcd processes (tests/etcd_server.py
finds the binary, or the tests skip saying how to get one).

One etcd (L{shared_etcd}) serves every test of L{EtcdClientTests}, each
test under keys of its own; the failover tests start a 3-member cluster of their own.  Nothing
sleeps: the tests wait for events (watch events, a Deferred firing) with a
bounded timeout.
"""

from __future__ import annotations

from typing import List, Tuple

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase

from jesync.cluster.etcd import (
    Compare,
    Delete,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    Get,
    KeyValue,
    Put,
    WatchEvent,
    _prefix_end,
)
from tests.etcd_server import MIN_LEASE_TTL, shared_etcd, start_etcd_cluster
from tests.servers import free_port
from tests.support import TIMEOUT, ConnectionTracker


class EventCollector:
    """A watch's C{on_events}: keeps the events; L{wait_for} fires once C{count} have come."""

    def __init__(self) -> None:
        self.events: List[WatchEvent] = []
        self._waiting: List[Tuple[int, Deferred[List[WatchEvent]]]] = []

    def __call__(self, events: List[WatchEvent]) -> None:
        self.events.extend(events)
        for count, waiting in list(self._waiting):
            if len(self.events) >= count:
                self._waiting.remove((count, waiting))
                waiting.callback(self.events[:count])

    def wait_for(self, count: int) -> Deferred[List[WatchEvent]]:
        waiting: Deferred[List[WatchEvent]] = Deferred()
        self._waiting.append((count, waiting))
        self([])
        return waiting.addTimeout(TIMEOUT, reactor)


class EtcdClientInputTests(TestCase):
    """What needs no etcd: the key ranges of prefixes, and bad arguments refused at once."""

    def test_prefix_end(self):
        self.assertEqual(_prefix_end(b"a/"), b"a0")
        self.assertEqual(_prefix_end(b"a\xff"), b"b")
        self.assertEqual(_prefix_end(b"\xff\xff"), b"\x00")
        self.assertEqual(_prefix_end(b""), b"\x00")

    def test_compare_bad_input(self):
        """A compare etcd could not take is refused at once, saying why."""
        for bad, message in [
            (lambda: Compare(b"k", "MODIFIED", 1), "Compare target must be one of CREATE, MOD"),
            (lambda: Compare(b"k", "MOD", 1, "SAME"), "Compare result must be one of EQUAL"),
            (lambda: Compare(b"k", "VALUE", 1), "Compare of VALUE takes bytes"),
            (lambda: Compare(b"k", "MOD", b"1"), "Compare of MOD takes int"),
        ]:
            with self.assertRaises(ValueError) as raised:
                bad()
            self.assertIn(message, str(raised.exception))

    def test_bad_endpoints(self):
        with self.assertRaises(ValueError):
            EtcdClient(reactor, [])
        with self.assertRaises(ValueError) as raised:
            EtcdClient(reactor, ["127.0.0.1:2379"])
        self.assertIn("http://127.0.0.1:2379", str(raised.exception))


class EtcdClientTests(TestCase):
    timeout = 30

    def setUp(self) -> None:
        self.etcd = shared_etcd()
        self.observed: List[Tuple[str, float]] = []
        self.client = self.make_client([self.etcd.endpoint])
        # Each test's keys are under a prefix of its own.
        self.prefix = self.id().encode() + b"/"

    def make_client(self, endpoints: List[str], timeout: float = 2.0) -> EtcdClient:
        client = EtcdClient(reactor, endpoints, timeout, lambda name, seconds: self.observed.append((name, seconds)))
        self.addCleanup(client.close)
        return client

    # -- KV --

    @inlineCallbacks
    def test_put_get(self):
        key = self.prefix + b"k"
        written = yield self.client.put(key, b"\x00value\xff")
        revision, kvs = yield self.client.get(key)
        self.assertGreaterEqual(revision, written)
        [kv] = kvs
        self.assertEqual(
            (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease),
            (key, b"\x00value\xff", written, written, 0),
        )
        _, missing = yield self.client.get(self.prefix + b"missing")
        self.assertEqual(missing, [])

    @inlineCallbacks
    def test_prefix_get_pages_through_every_key(self):
        """A prefix read pages through every key under the prefix (sorted by key), and none outside it."""
        self.client.page_size = 3
        keys = [self.prefix + b"p/%02d" % index for index in range(10)]
        for key in reversed(keys):
            yield self.client.put(key, key[-2:])
        yield self.client.put(self.prefix + b"p", b"not under p/")
        yield self.client.put(self.prefix + b"p0", b"not under p/ either")
        revision, kvs = yield self.client.get(self.prefix + b"p/", prefix=True)
        self.assertEqual([kv.key for kv in kvs], keys)
        self.assertEqual([kv.value for kv in kvs], [key[-2:] for key in keys])
        self.assertEqual(revision, max(kv.mod_revision for kv in kvs) + 2)
        # Four pages of three keys at most.
        self.assertEqual([name for name, _ in self.observed].count("get"), 4)

    @inlineCallbacks
    def test_delete(self):
        yield self.client.put(self.prefix + b"d/1", b"1")
        yield self.client.put(self.prefix + b"d/2", b"2")
        yield self.client.put(self.prefix + b"e", b"3")
        deleted = yield self.client.delete(self.prefix + b"d/", prefix=True)
        self.assertEqual(deleted, 2)
        _, kvs = yield self.client.get(self.prefix, prefix=True)
        self.assertEqual([kv.key for kv in kvs], [self.prefix + b"e"])
        deleted = yield self.client.delete(self.prefix + b"e")
        self.assertEqual(deleted, 1)

    # -- transactions --

    @inlineCallbacks
    def test_txn_branches(self):
        """The success branch when every compare holds, else the failure branch; a Get answers KeyValues."""
        key = self.prefix + b"t"
        create_once = dict(
            compare=[Compare(key, "CREATE", 0)],
            success=[Put(key, b"first"), Get(key)],
            failure=[Get(key), Get(self.prefix + b"none")],
        )
        first = yield self.client.txn(**create_once)
        self.assertTrue(first.succeeded)
        self.assertIsNone(first.responses[0])
        [kv] = first.responses[1]
        self.assertEqual((kv.key, kv.value, kv.mod_revision), (key, b"first", first.revision))

        second = yield self.client.txn(**create_once)
        self.assertFalse(second.succeeded)
        self.assertEqual(second.revision, first.revision)
        self.assertEqual(second.responses, [[kv], []])

    @inlineCallbacks
    def test_txn_compares(self):
        key = self.prefix + b"c"
        revision = yield self.client.put(key, b"v1")

        @inlineCallbacks
        def holds(*compare: Compare):
            result = yield self.client.txn(compare, [], [])
            return result.succeeded

        self.assertTrue((yield holds(Compare(key, "MOD", revision))))
        self.assertTrue((yield holds(Compare(key, "CREATE", revision))))
        self.assertTrue((yield holds(Compare(key, "VERSION", 1))))
        self.assertTrue((yield holds(Compare(key, "VALUE", b"v1"))))
        self.assertTrue((yield holds(Compare(key, "LEASE", 0))))
        self.assertTrue((yield holds(Compare(key, "MOD", revision + 1, "LESS"))))
        self.assertTrue((yield holds(Compare(key, "VALUE", b"v2", "NOT_EQUAL"))))
        self.assertTrue((yield holds(Compare(key, "VERSION", 0, "GREATER"))))
        self.assertFalse((yield holds(Compare(key, "MOD", revision), Compare(key, "VALUE", b"v2"))))
        self.assertFalse((yield holds(Compare(self.prefix + b"none", "VERSION", 0, "GREATER"))))

    @inlineCallbacks
    def test_txn_put_and_delete(self):
        a, b = self.prefix + b"a", self.prefix + b"b"
        yield self.client.put(a, b"1")
        result = yield self.client.txn([Compare(a, "VALUE", b"1")], [Delete(a), Put(b, b"2")])
        self.assertEqual((result.succeeded, result.responses), (True, [None, None]))
        _, kvs = yield self.client.get(self.prefix, prefix=True)
        self.assertEqual([(kv.key, kv.value) for kv in kvs], [(b, b"2")])

    @inlineCallbacks
    def test_etcd_error(self):
        """An error etcd answers is EtcdError with etcd's message, at once."""
        key = self.prefix + b"x"
        with self.assertRaises(EtcdError) as raised:
            yield self.client.txn([], [Put(key, b"1"), Put(key, b"2")])
        self.assertNotIsInstance(raised.exception, EtcdUnavailable)
        self.assertIn("duplicate key given in txn request", str(raised.exception))
        with self.assertRaises(EtcdError) as raised:
            yield self.client.put(b"", b"1")
        self.assertIn("key is not provided", str(raised.exception))

    # -- leases --

    @inlineCallbacks
    def test_lease_grant_keepalive_revoke(self):
        """A key bound to a lease goes with it; a revoked (or unknown) lease keeps alive as 0, and revokes quietly."""
        lease, ttl = yield self.client.grant(MIN_LEASE_TTL)
        self.assertGreater(lease, 0)
        self.assertGreaterEqual(ttl, MIN_LEASE_TTL)
        left = yield self.client.keepalive(lease)
        self.assertGreaterEqual(left, MIN_LEASE_TTL - 1)
        key = self.prefix + b"leased"
        yield self.client.put(key, b"v", lease=lease)
        _, [kv] = yield self.client.get(key)
        self.assertEqual(kv.lease, lease)

        yield self.client.revoke(lease)
        _, kvs = yield self.client.get(key)
        self.assertEqual(kvs, [])
        self.assertEqual((yield self.client.keepalive(lease)), 0)
        yield self.client.revoke(lease)
        self.assertEqual((yield self.client.keepalive(12345)), 0)
        with self.assertRaises(EtcdError) as raised:
            yield self.client.put(key, b"v", lease=lease)
        self.assertIn("requested lease not found", str(raised.exception))

    @inlineCallbacks
    def test_lease_expires(self):
        """A lease not kept alive expires: its key is deleted (a watch sees it) and keepalive gives 0."""
        lease, ttl = yield self.client.grant(MIN_LEASE_TTL)
        key = self.prefix + b"expiring"
        revision = yield self.client.put(key, b"v", lease=lease)
        events = EventCollector()
        watch = self.client.watch(key, revision + 1, events)
        [deleted] = yield events.wait_for(1)
        self.assertEqual((deleted.type, deleted.kv.key), ("DELETE", key))
        self.assertEqual((yield self.client.keepalive(lease)), 0)
        watch.cancel()
        yield watch.ended

    # -- watches --

    @inlineCallbacks
    def test_watch(self):
        """A watch sees PUT and DELETE events from its start revision, in order, and ends with None when cancelled."""
        key = self.prefix + b"w"
        before = yield self.client.put(key, b"before")
        events = EventCollector()
        watch = self.client.watch(key, before + 1, events)
        one = yield self.client.put(key, b"one")
        yield self.client.put(self.prefix + b"w2", b"not watched")
        two = yield self.client.put(key, b"two")
        yield self.client.delete(key)
        seen = yield events.wait_for(3)
        self.assertEqual(
            [(event.type, event.kv.key, event.kv.value) for event in seen],
            [("PUT", key, b"one"), ("PUT", key, b"two"), ("DELETE", key, b"")],
        )
        self.assertEqual([seen[0].kv.mod_revision, seen[1].kv.mod_revision], [one, two])
        self.assertEqual(seen[1].kv.create_revision, before)
        self.assertIn("watch", [name for name, _ in self.observed])
        watch.cancel()
        self.assertIsNone((yield watch.ended.addTimeout(TIMEOUT, reactor)))

    @inlineCallbacks
    def test_watch_prefix_from_the_past(self):
        """A watch of a prefix from an earlier revision replays what happened since."""
        first = yield self.client.put(self.prefix + b"q/1", b"1")
        yield self.client.put(self.prefix + b"q/2", b"2")
        yield self.client.put(self.prefix + b"r", b"not under q/")
        events = EventCollector()
        watch = self.client.watch(self.prefix + b"q/", first, events, prefix=True)
        seen = yield events.wait_for(2)
        self.assertEqual([event.kv.key for event in seen], [self.prefix + b"q/1", self.prefix + b"q/2"])
        watch.cancel()
        yield watch.ended

    @inlineCallbacks
    def test_watch_callback_failure_ends_it(self):
        """What on_events raises ends the watch, as its reason."""

        def on_events(events):
            raise ZeroDivisionError("on_events failed")

        revision = yield self.client.put(self.prefix + b"f", b"1")
        watch = self.client.watch(self.prefix + b"f", revision, on_events)
        with self.assertRaises(ZeroDivisionError):
            yield watch.ended.addTimeout(TIMEOUT, reactor)

    @inlineCallbacks
    def test_close_cancels_watches(self):
        client = EtcdClient(reactor, [self.etcd.endpoint])
        watch = client.watch(self.prefix + b"c", 0, lambda events: None)
        yield client.close().addTimeout(TIMEOUT, reactor)
        self.assertIsNone((yield watch.ended))

    # -- unavailable endpoints --

    @inlineCallbacks
    def test_refused_endpoint_is_unavailable_within_the_timeout(self):
        """Nothing listening: EtcdUnavailable once the timeout is up, not before, not much after."""
        dead = f"http://127.0.0.1:{free_port()}"
        client = self.make_client([dead], timeout=0.5)
        started = reactor.seconds()
        with self.assertRaises(EtcdUnavailable) as raised:
            yield client.get(b"k")
        elapsed = reactor.seconds() - started
        self.assertTrue(0.5 <= elapsed < 1.5, elapsed)
        self.assertIn(dead, str(raised.exception))
        self.assertIn("ConnectionRefusedError", str(raised.exception))
        self.assertEqual(self.observed, [])

    @inlineCallbacks
    def test_silent_endpoint_times_out_and_the_next_answers(self):
        """
        A member that accepts but never answers (as a paused etcd does) times
        out: alone, EtcdUnavailable; before a live member, the request goes
        on to that one, within the timeout, which then answers the next
        requests first.
        """
        factory = Factory.forProtocol(Protocol)
        tracker = ConnectionTracker(factory)
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
        self.addCleanup(port.stopListening)
        silent = f"http://127.0.0.1:{port.getHost().port}"

        alone = self.make_client([silent], timeout=0.5)
        started = reactor.seconds()
        with self.assertRaises(EtcdUnavailable) as raised:
            yield alone.get(b"k")
        self.assertTrue(0.5 <= reactor.seconds() - started < 1.5)
        self.assertIn("no answer within 0.5 s", str(raised.exception))

        client = self.make_client([silent, self.etcd.endpoint], timeout=1.0)
        started = reactor.seconds()
        yield client.put(self.prefix + b"k", b"1")
        self.assertLess(reactor.seconds() - started, 1.0)
        connections = len(tracker.protocols)
        _, [kv] = yield client.get(self.prefix + b"k")
        self.assertEqual(kv.value, b"1")
        self.assertEqual(len(tracker.protocols), connections)
        # The client dropped every connection it gave up on.
        yield tracker.wait_lost()

    @inlineCallbacks
    def test_observer(self):
        """The observer hears every successful round trip, by operation, with its duration."""
        lease, _ = yield self.client.grant(MIN_LEASE_TTL)
        yield self.client.keepalive(lease)
        yield self.client.put(self.prefix + b"o", b"1")
        yield self.client.get(self.prefix + b"o")
        yield self.client.txn([], [Get(self.prefix + b"o")])
        yield self.client.delete(self.prefix + b"o")
        yield self.client.revoke(lease)
        self.assertEqual(
            [name for name, _ in self.observed], ["grant", "keepalive", "put", "get", "txn", "delete", "revoke"]
        )
        for _, seconds in self.observed:
            self.assertTrue(0 <= seconds < 2.0, seconds)


class EtcdClusterFailoverTests(TestCase):
    """A client of a 3-member etcd cluster goes on when one member dies."""

    timeout = 60

    @inlineCallbacks
    def test_failover_from_a_dead_member(self):
        cluster = start_etcd_cluster(self, 3)
        first, second, _ = cluster.members
        client = EtcdClient(reactor, cluster.endpoints, timeout=2.0)
        self.addCleanup(client.close)
        revision = yield client.put(b"k", b"before")

        collector = EventCollector()
        watch = client.watch(b"k", revision + 1, collector)
        revision = yield client.put(b"k", b"seen")
        yield collector.wait_for(1)
        first.kill()
        # The watch was on the first member: its stream ends, saying so.
        with self.assertRaises(EtcdUnavailable):
            yield watch.ended.addTimeout(TIMEOUT, reactor)

        # If the member killed led the etcd cluster, the others elect a
        # leader first (1-2 election timeouts of 1 s): a client waits.
        patient = EtcdClient(reactor, cluster.endpoints, timeout=10.0)
        self.addCleanup(patient.close)
        started = reactor.seconds()
        written = yield patient.put(b"k", b"after")
        self.assertLess(reactor.seconds() - started, 10.0)
        _, [kv] = yield client.get(b"k")
        self.assertEqual((kv.value, kv.mod_revision), (b"after", written))
        # A watch started now is on a live member, and replays the write.
        collector = EventCollector()
        watch = client.watch(b"k", revision + 1, collector)
        [event] = yield collector.wait_for(1)
        self.assertEqual(event.kv, KeyValue(b"k", b"after", kv.create_revision, written, 0))
        watch.cancel()
        yield watch.ended

        # Back, it catches up; with a second member gone the cluster still has a majority.
        first.restart()
        second.kill()
        result = yield patient.txn([Compare(b"k", "MOD", written)], [Put(b"k", b"again")])
        self.assertTrue(result.succeeded)
