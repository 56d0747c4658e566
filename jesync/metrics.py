"""
Prometheus metrics for a lock server, served over HTTP by C{twisted.web}.

A lock server runs unattended: operators need to see how many locks are held
and waited for, how long waits take, and how often waits time out and grants
expire (a client that does not renew in time, or hangs).  This module
exposes that in Prometheus's text format, through C{prometheus_client}, which
is an optional dependency (C{pip install 'jesync[metrics]'}).

Two kinds of numbers, gathered two ways:

 - B{Events} (grants, timeouts, releases, expiries, how long granted
   requests waited) are counted by L{LockMetrics}, the lock service's
   L{ILockObserver}.  The service calls it synchronously on every lock
   operation, so each event costs one counter increment or one histogram
   observation, nothing more.  No label carries the key: keys are
   unbounded, and a series per key would grow without limit.
 - B{Levels} (open connections, keys in use, grants held, requests waiting)
   are not tracked per event: L{LockMetrics} reads them when Prometheus
   scrapes, from counts the lock table, the connection registry, the dlock
   listener and the memcached store keep as they change
   (C{service.totals()}, C{len(connections)}, the store's C{locked_items()}
   and the like).  Every level is O(1): a scrape's work does not grow with
   the keys held or the objects stored, so scrapers in a loop cannot hold up
   the lock clients (the reactor thread serves both).

With an auth token (C{--auth-token-file}), C{/metrics} answers only a
request that carries it, C{Authorization: Bearer <token>} (Prometheus's
scrape configs send one), as every listener answers only a client that
authenticated: the levels tell who is busy, and a scrape costs the reactor
time.  C{--metrics-public} serves it to anyone, as before.  C{/health}
stays open (a load balancer's check carries no token, and it tells only
whether the server serves).

Each L{LockMetrics} has a C{CollectorRegistry} of its own, never
C{prometheus_client}'s global one, so several servers (or tests) in one
process do not clash.  L{metrics_resource} serves C{/metrics} and
C{/health}; it renders in the reactor thread (not in a thread pool, as
C{prometheus_client.twisted.MetricsResource} does) because the lock table
belongs to the reactor thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import TYPE_CHECKING, Optional

from twisted.web import http
from twisted.web.pages import notFound
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site
from zope.interface import implementer

from jesync.interfaces import IGrant, ILockObserver, ILockService

if TYPE_CHECKING:
    from jesync.connections.listings import ListingBudget
    from jesync.protocols.dlock import DlockFactory
    from jesync.protocols.memcache import MemcacheFactory

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
except ImportError as error:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        "jesync.metrics needs prometheus_client: pip install 'jesync[metrics]'"
    ) from error

__all__ = ["WAIT_BUCKETS", "ClusterMetrics", "LockMetrics", "bearer_token", "metrics_resource", "metrics_site"]

#: Whether a bearer token (None: none was sent) lets a request read the metrics.
TokenCheck = Callable[[Optional[bytes]], bool]

# Upper bounds (seconds) of the wait histogram's buckets: from an immediate
# grant (0, in the first bucket) to the longest waits worth telling apart.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300)

# The levels read at scrape time: (name, help text).
_GAUGES = (
    ("jesync_connections", "Open client connections."),
    ("jesync_keys", "Keys in use (held or waited for)."),
    ("jesync_holders", "Grants held."),
    ("jesync_waiters", "Requests waiting for a grant."),
)


@implementer(ILockObserver)
class LockMetrics:
    """
    The metrics of one lock service: its observer, and a collector of its
    levels, in a registry of their own.

    Make the service first, then tell it about the metrics::

        locks = LockService(reactor)
        metrics = LockMetrics(locks, connections)
        locks.observer = metrics

    @param service: the lock table whose levels are reported.
    @param connections: anything whose C{len()} is the number of open client
        connections (read at scrape time).
    @param dlock: the dlock listener's factory, if the server has one: its
        connections, requests by type and timeouts are read at scrape time.
    @param memcache: the memcached listener's factory, if the server has
        one: its connections and its store's items, bytes, hits, misses,
        evictions and locked items are read at scrape time.
    @param registry: where the metrics are registered; a new
        C{CollectorRegistry} if None.
    @param listings: the server's listing budget
        (L{jesync.connections.listings.ListingBudget}): the bytes its
        snapshots hold and the listings it refused are read at scrape time.
    """

    def __init__(
        self,
        service: ILockService,
        connections: Sized,
        dlock: DlockFactory | None = None,
        registry: CollectorRegistry | None = None,
        memcache: MemcacheFactory | None = None,
        listings: ListingBudget | None = None,
    ) -> None:
        self.service = service
        self.connections = connections
        self.dlock = dlock
        self.memcache = memcache
        self.listings = listings
        self._first = (service, connections, dlock, memcache, listings)
        self.registry = registry if registry is not None else CollectorRegistry()
        self._grants = Counter(
            "jesync_grants_total", "Locks granted, at once or after a wait.", registry=self.registry
        )
        self._timeouts = Counter(
            "jesync_timeouts_total", "Waits for a lock that timed out.", registry=self.registry
        )
        self._expiries = Counter(
            "jesync_expiries_total",
            "Grants released by their failsafe expiry (not renewed in time).",
            registry=self.registry,
        )
        self._releases = Counter(
            "jesync_releases_total",
            "Grants given back: released, or their owner went away.",
            registry=self.registry,
        )
        self._waits = Histogram(
            "jesync_wait_seconds",
            "How long granted requests waited (0 for a grant made at once).",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(self)

    def follow(self, server: object) -> None:
        """
        Report the levels of C{server} (a L{jesync.server.LockServer}): a
        cluster leader's server of its current term; None: nothing is
        served (a standby), levels are 0.
        """
        if server is None:
            self.service, self.connections, self.dlock, self.memcache, self.listings = self._first
            return
        self.service = server.locks  # type: ignore[attr-defined]
        self.connections = server.policy.connections  # type: ignore[attr-defined]
        self.dlock = server.factories.get("dlock")  # type: ignore[attr-defined]
        self.memcache = server.factories.get("memcache")  # type: ignore[attr-defined]
        self.listings = server.policy.listings  # type: ignore[attr-defined]

    # -- ILockObserver: on the lock server's hot path, so one update each ----

    def granted(self, grant: IGrant, waited: float) -> None:
        self._grants.inc()
        self._waits.observe(waited)

    def timed_out(self, key: str) -> None:
        self._timeouts.inc()

    def released(self, grant: IGrant) -> None:
        self._releases.inc()

    def expired(self, grant: IGrant) -> None:
        self._expiries.inc()

    # -- a prometheus_client collector: the levels, read at scrape time ------

    def describe(self) -> Iterable[Metric]:
        return (
            [GaugeMetricFamily(name, doc) for name, doc in _GAUGES]
            + self._dlock_metrics(describing=True)
            + self._memcache_metrics(describing=True)
            + self._listing_metrics(describing=True)
        )

    def collect(self) -> Iterable[Metric]:
        totals = self.service.totals()
        values = (len(self.connections), totals.keys, totals.granted, totals.waiting)
        return (
            [GaugeMetricFamily(name, doc, value=value) for (name, doc), value in zip(_GAUGES, values)]
            + self._dlock_metrics()
            + self._memcache_metrics()
            + self._listing_metrics()
        )

    def _listing_metrics(self, describing: bool = False) -> list[Metric]:
        listings = self.listings
        if listings is None:
            return []
        held = GaugeMetricFamily(
            "jesync_listing_bytes",
            "Bytes the snapshots of listings being sent hold (estimated), counted toward --max-listing-memory.",
        )
        refused = CounterMetricFamily(
            "jesync_listing_refusals", "Listings refused because they would pass --max-listing-memory."
        )
        if not describing:
            held.add_metric([], listings.held)
            refused.add_metric([], listings.refused)
        return [held, refused]

    def _dlock_metrics(self, describing: bool = False) -> list[Metric]:
        dlock = self.dlock
        if dlock is None:
            return []
        connections = GaugeMetricFamily("jesync_dlock_connections", "Open dlock connections.")
        requests = CounterMetricFamily(
            "jesync_dlock_requests", "dlock requests received, by type.", labels=["type"]
        )
        timeouts = CounterMetricFamily("jesync_dlock_timeouts", "dlock Lock requests answered AcquireTimeout.")
        if not describing:
            connections.add_metric([], dlock.clients)
            for kind, count in dlock.request_counts():
                requests.add_metric([kind], count)
            timeouts.add_metric([], dlock.timeouts)
        return [connections, requests, timeouts]

    def _memcache_metrics(self, describing: bool = False) -> list[Metric]:
        memcache = self.memcache
        if memcache is None:
            return []
        store = memcache.store
        families: list[tuple[type, str, str, Callable[[], float]]] = [
            (GaugeMetricFamily, "jesync_memcache_connections", "Open memcached connections.", lambda: memcache.clients),
            (GaugeMetricFamily, "jesync_memcache_items", "Objects in the memcached store.", lambda: len(store)),
            (
                GaugeMetricFamily,
                "jesync_memcache_bytes",
                "Bytes the memcached store's objects count toward --memcache-memory.",
                lambda: store.bytes,
            ),
            (
                GaugeMetricFamily,
                "jesync_memcache_locked_items",
                "Objects whose key someone holds in the lock table (locked).",
                store.locked_items,
            ),
            (CounterMetricFamily, "jesync_memcache_hits", "Reads that found their object.", lambda: store.hits),
            (CounterMetricFamily, "jesync_memcache_misses", "Reads that found no object.", lambda: store.misses),
            (
                CounterMetricFamily,
                "jesync_memcache_evictions",
                "Objects evicted to make room (least recently used first).",
                lambda: store.evictions,
            ),
        ]
        if describing:
            return [family(name, doc) for family, name, doc, _ in families]
        return [family(name, doc, value=read()) for family, name, doc, read in families]


class _Page(Resource):
    """A resource with no children but those put there: any other path is 404."""

    def getChild(self, path: bytes, request: Request) -> IResource:
        return notFound()


def bearer_token(request: Request) -> Optional[bytes]:
    """
    The token of a request's C{Authorization: Bearer <token>} header (the
    scheme's name in any case, as RFC 7235 has it); None if there is none.
    """
    header = request.getHeader(b"authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


class _MetricsPage(_Page):
    """
    GET: every metric of a registry, in Prometheus's text format; with
    C{accepts}, only to a request whose bearer token it accepts (401 with
    C{WWW-Authenticate: Bearer} otherwise, as RFC 6750 has it).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        accepts: TokenCheck | None = None,
        on_authorized: Callable[[Request], None] | None = None,
    ) -> None:
        super().__init__()
        self.registry = registry
        self.accepts = accepts
        self.on_authorized = on_authorized

    def render_GET(self, request: Request) -> bytes:
        if self.accepts is not None:
            token = bearer_token(request)
            if not self.accepts(token):
                request.setResponseCode(401)
                challenge = b'Bearer realm="jesync"' + (b', error="invalid_token"' if token is not None else b"")
                request.setHeader(b"WWW-Authenticate", challenge)
                request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
                return b"unauthorized: send the server's auth token as 'Authorization: Bearer <token>'\n"
            if self.on_authorized is not None:
                self.on_authorized(request)
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode("ascii"))
        return generate_latest(self.registry)


class _HealthPage(_Page):
    """
    GET: 200 C{OK} while the server is serving, 503 C{stopping} once it is
    not.  A cluster member (C{role} given) says its role instead: 200
    C{leader}, or 503 C{standby} (it serves no client).
    """

    def __init__(self, serving: Callable[[], bool], role: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.serving = serving
        self.role = role

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
        serving = self.serving()
        if not serving:
            request.setResponseCode(503)
        if self.role is not None:
            return self.role().encode("ascii") + b"\n"
        return b"OK\n" if serving else b"stopping\n"


class ClusterMetrics:
    """
    A cluster member's own metrics, in its L{LockMetrics}' registry: its
    role, its terms as leader, etcd's round trips and the durable writes.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        # The member (a jesync.cluster.member.ClusterMember), once built.
        self.member: object = None
        self._round_trips = Histogram(
            "jesync_etcd_request_seconds",
            "Round trips to etcd, by operation.",
            ["operation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self._transactions = Counter(
            "jesync_durable_transactions_total", "Durable-state transactions committed to etcd.", registry=registry
        )
        self._operations = Counter(
            "jesync_durable_writes_total",
            "Durable records written or deleted in etcd (one group commit carries many).",
            registry=registry,
        )
        self._commits = Histogram(
            "jesync_durable_commit_seconds",
            "How long a group commit took, from cutting it to etcd's answer.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        registry.register(self)

    def etcd_round_trip(self, operation: str, seconds: float) -> None:
        self._round_trips.labels(operation).observe(seconds)

    def committed(self, operations: int, seconds: float) -> None:
        self._transactions.inc()
        self._operations.inc(operations)
        self._commits.observe(seconds)

    def describe(self) -> Iterable[Metric]:
        return self._levels(None, 0)

    def collect(self) -> Iterable[Metric]:
        member = self.member
        return self._levels(getattr(member, "role", None), getattr(member, "terms", 0))

    @staticmethod
    def _levels(role: str | None, terms: int) -> list[Metric]:
        return [
            GaugeMetricFamily("jesync_cluster_leader", "1 while this member leads its cluster, else 0.", value=int(role == "leader")),
            CounterMetricFamily("jesync_cluster_terms", "Elections this member has won.", value=terms),
        ]


def metrics_resource(
    metrics: LockMetrics,
    serving: Callable[[], bool] = lambda: True,
    role: Callable[[], str] | None = None,
    accepts: TokenCheck | None = None,
    on_authorized: Callable[[Request], None] | None = None,
) -> Resource:
    """
    The root of a metrics web server: C{/metrics} and C{/health}; any other
    path is 404.  Serve it with C{twisted.web.server.Site}.

    @param serving: whether the server is serving (for example
        C{lambda: service.running}); C{/health} answers 503 once it is false,
        so a load balancer or orchestrator stops sending clients.
    @param accepts: whether a request's bearer token (None: it sent none)
        may read C{/metrics} (for example the connection policy's token
        check); None: anyone may.  C{/health} is always open.
    @param on_authorized: called with each request C{accepts} let in (the
        server stops its connection's authentication deadline).
    """
    root = _Page()
    root.putChild(b"metrics", _MetricsPage(metrics.registry, accepts, on_authorized))
    root.putChild(b"health", _HealthPage(serving, role))
    return root


class _QuietSite(Site):
    """A Site that logs no access line per request (a scrape every few seconds would flood the log)."""

    noisy = False

    def log(self, request: http.Request) -> None:
        pass


def metrics_site(
    metrics: LockMetrics,
    serving: Callable[[], bool] = lambda: True,
    verbose: bool = False,
    role: Callable[[], str] | None = None,
    accepts: TokenCheck | None = None,
    on_authorized: Callable[[Request], None] | None = None,
) -> Site:
    """L{metrics_resource} as a listenable site; C{verbose} logs every request."""
    site_class = Site if verbose else _QuietSite
    site = site_class(metrics_resource(metrics, serving, role, accepts, on_authorized))
    site.noisy = False
    return site
