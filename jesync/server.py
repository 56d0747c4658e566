"""
The composition root: a whole lock server from its settings.
L{ServerSettings} is everything C{twistd jesync} can be told (one field per
option of L{jesync.options.OPTIONS}, which C{twistd jesync} fills);
L{build_server} turns settings into a running-ready Twisted service, for
C{twistd jesync}, a C{.tac} file, or an application embedding it: a
L{LockServer} (L{build_lock_server}) or, with etcd, a cluster member
(L{build_member}).

This is the one module that knows every other: the lock service, the
connection policy, each protocol's factory, the metrics and the cluster.
So nothing imports it but its callers (L{jesync.tap}, C{etc/jesync.tac},
embedders); the parts it builds live below it (L{jesync.listening},
L{jesync.lock_server}, L{jesync.metrics_connections}, L{jesync.process}).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, List, Optional, Union

from jesync.connections.listings import ListingBudget
from jesync.connections.policy import ConnectionPolicy, Connections
from jesync.errors import show_number
from jesync.fencing import TokenMark, TokenMarkService
from jesync.listening import DEFAULT_TLS_CIPHERS, ListenFailed, TLSPolicy, public_endpoint
from jesync.lock_server import LockServer, MemberTokens, TokenFile
from jesync.metrics_connections import CountedFactory, scraper_authorized
from jesync.options import DEFAULT_PORT, setting_default
from jesync.protocols.admin import AdminFactory
from jesync.protocols.dlock import DlockFactory
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.protocols.memcache import MemcacheFactory
from jesync.service import LockService
from jesync.store import ObjectStore, SweepService

if TYPE_CHECKING:
    from jesync.cluster.member import ClusterMember, Leadership

# What embedders import from here (README, "Embedding it"): the settings,
# the builder, and what starting the built server may raise.
__all__ = [
    "DEFAULT_PORT",
    "ListenFailed",
    "LockServer",
    "ServerSettings",
    "build_lock_server",
    "build_member",
    "build_server",
]

# The metrics endpoint's own cap on connections (scrapers and health checks).
METRICS_CONNECTIONS = 16


@dataclass
class ServerSettings:
    """
    Everything C{twistd jesync} can be told.  Limits are None for "no
    limit"; endpoints are Twisted endpoint descriptions.  Each field set by
    an option has that option's default (L{jesync.options.OPTIONS}, where
    every option is declared); the tokens and the TLS policy are read from
    options (their files, C{--tls-ciphers} and C{--tls-min-version}).
    """

    ports: List[str] = setting_default("port")
    elock_ports: List[str] = setting_default("elock-port")
    dlock_ports: List[str] = setting_default("dlock-port")
    memcache_ports: List[str] = setting_default("memcache-port")
    metrics_ports: List[str] = setting_default("metrics")
    admin_ports: List[str] = setting_default("admin-port")
    max_connections: Optional[int] = setting_default("max-connections")
    max_keys: Optional[int] = setting_default("max-keys")
    max_waiters: Optional[int] = setting_default("max-waiters")
    max_total_waits: Optional[int] = setting_default("max-total-waits")
    max_held: Optional[int] = setting_default("max-held")
    max_sessions: Optional[int] = setting_default("max-sessions")
    # Seconds: the longest grace period an elock session may ask for (None: no bound).
    max_session_grace: Optional[float] = setting_default("max-session-grace")
    max_key_length: Optional[int] = setting_default("max-key-length")
    max_unsent: Optional[int] = setting_default("max-unsent")
    # Bytes all pending listings' snapshots may hold together (jesync.connections.listings).
    max_listing_memory: int = setting_default("max-listing-memory")
    keepalive: Optional[float] = setting_default("keepalive")
    auth_token: Optional[bytes] = None
    # The file the token came from: read again on SIGHUP (None: never).
    auth_token_file: Optional[str] = setting_default("auth-token-file")
    auth_token_grace: float = setting_default("auth-token-grace")
    # The admin listener's own token, and its file (read again on SIGHUP):
    # with it, the admin listener takes this token and not auth_token.
    admin_token: Optional[bytes] = None
    admin_token_file: Optional[str] = setting_default("admin-token-file")
    # Serve /metrics without the token even when one is set.
    metrics_public: bool = setting_default("metrics-public")
    protected_mode: bool = setting_default("protected-mode")
    # What ssl: endpoints accept (--tls-ciphers, --tls-min-version).
    tls: TLSPolicy = field(default_factory=lambda: TLSPolicy())
    auth_timeout: Optional[float] = setting_default("auth-timeout")
    idle_timeout: Optional[float] = setting_default("idle-timeout")
    shutdown_grace: float = setting_default("shutdown-grace")
    dlock_max_message: int = setting_default("dlock-max-message")
    dlock_max_keys: int = setting_default("dlock-max-keys")
    dlock_idle_timeout: Optional[float] = setting_default("dlock-idle-timeout")
    memcache_memory: int = setting_default("memcache-memory")
    memcache_max_item: int = setting_default("memcache-max-item")
    state_dir: Optional[str] = setting_default("state-dir")
    # Cluster mode (jesync.cluster): etcd's client URLs (none: a single process).
    etcd: List[str] = setting_default("etcd")
    cluster: str = setting_default("cluster")
    lease_ttl: int = setting_default("lease-ttl")
    verbose: bool = setting_default("verbose")

    def summary(self) -> str:
        """
        One line for the log: endpoints (as L{public_endpoint} shows them:
        never a TLS key's or certificate's path) and limits (never the token).
        """
        limits = {
            "max-connections": self.max_connections,
            "max-keys": self.max_keys,
            "max-waiters": self.max_waiters,
            "max-total-waits": self.max_total_waits,
            "max-held": self.max_held,
            "max-sessions": self.max_sessions,
            "max-session-grace": self.max_session_grace,
            "max-key-length": self.max_key_length,
            "max-unsent": self.max_unsent,
            "max-listing-memory": self.max_listing_memory,
            "auth-timeout": self.auth_timeout,
            "idle-timeout": self.idle_timeout,
        }

        def shown(descriptions: List[str]) -> str:
            return ", ".join(public_endpoint(description) for description in descriptions)

        return (
            f"JESync on {shown(self.ports)}"
            + (f"; elock on {shown(self.elock_ports)}" if self.elock_ports else "")
            + (f"; dlock on {shown(self.dlock_ports)}" if self.dlock_ports else "")
            + (f"; memcached on {shown(self.memcache_ports)}" if self.memcache_ports else "")
            + (f"; metrics on {shown(self.metrics_ports)}" if self.metrics_ports else "")
            + (f"; admin on {shown(self.admin_ports)}" if self.admin_ports else "")
            + "; limits: "
            + ", ".join(f"{name}={show_number(value) if value else 'none'}" for name, value in limits.items())
            + f"; keepalive {self.keepalive or 'system'}"
            + (
                f"; cluster {self.cluster} on etcd {', '.join(self.etcd)} (lease TTL {self.lease_ttl} s)"
                if self.etcd
                else ""
            )
            + self.tls_summary()
            + f"; auth {'required' if self.auth_token is not None else 'off'}"
            + ("; admin auth: its own token" if self.admin_token is not None and self.admin_ports else "")
            + (
                ""
                if self.auth_token is not None
                else (
                    "; protected mode: only local clients (set --auth-token-file, or --protected-mode off)"
                    if self.protected_mode
                    else "; protected mode off: clients from anywhere, without authentication"
                )
            )
        )

    def tls_summary(self) -> str:
        """What the ssl: listeners accept, for the summary (nothing without one)."""
        listeners = (
            self.ports + self.elock_ports + self.dlock_ports + self.memcache_ports + self.metrics_ports + self.admin_ports
        )
        if not any(description.split(":", 1)[0].strip().lower() == "ssl" for description in listeners):
            return ""
        ciphers = "" if self.tls.ciphers == DEFAULT_TLS_CIPHERS else f", TLS 1.2 ciphers {self.tls.ciphers}"
        return f"; TLS {self.tls.min_version}+{ciphers}"

    @property
    def protected(self) -> bool:
        """Whether non-local clients are refused: protected mode, and no token."""
        return self.protected_mode and self.auth_token is None


def build_server(reactor: Any, settings: ServerSettings) -> Union[LockServer, ClusterMember]:
    """
    The server the settings describe, as a Twisted service (start it, or
    give it a parent): a L{LockServer} (L{build_lock_server}); or, with
    C{settings.etcd}, a member of a cluster (L{build_member}), which serves
    such a server while it leads.  C{reactor} is its clock and what its
    endpoints listen on.
    """
    if settings.etcd:
        return build_member(reactor, settings)
    return build_lock_server(reactor, settings)


def build_lock_server(
    reactor: Any,
    settings: ServerSettings,
    cluster: Optional[Leadership] = None,
    tokens: Optional[MemberTokens] = None,
) -> LockServer:
    """
    One lock service, served over every protocol at every endpoint the
    settings name, as a L{LockServer}.  With C{cluster}, it is a cluster
    leader's term: its tokens start above the cluster's mark, its durable
    state goes to the term's journal, it answers only while the leadership
    is certain, and its member serves the metrics.  With C{tokens} (its
    member's), its auth and admin tokens are those as rotated so far, and
    the member, not the term, reads the token files again on SIGHUP.
    """
    mark: Any = None
    first_token = 0
    if cluster is not None:
        first_token = cluster.first_token
    elif settings.state_dir is not None:
        mark = TokenMark(settings.state_dir)
        first_token = mark.read()
    locks = LockService(
        reactor,
        max_keys=settings.max_keys,
        max_waiters=settings.max_waiters,
        max_held=settings.max_held,
        max_total_waits=settings.max_total_waits,
        first_token=first_token,
    )
    policy = ConnectionPolicy(
        max_key_length=settings.max_key_length or 2**31,
        max_unsent=settings.max_unsent or 2**62,
        keepalive=settings.keepalive or None,
        auth_token=settings.auth_token,
        auth_timeout=settings.auth_timeout or None,
        idle_timeout=settings.idle_timeout or None,
        close_grace=settings.shutdown_grace,
        protected=settings.protected,
        connections=Connections(settings.max_connections),
        listings=ListingBudget(settings.max_listing_memory, reactor),
    )
    if tokens is not None:
        tokens.lock.copy_to(policy)
    mark_every = None
    if cluster is not None:
        from jesync.cluster.journal import JournalMark  # (the cluster extra: treq)

        journal = cluster.journal_for(locks)
        locks.observer = journal
        policy.serving = cluster.serving
        policy.durability = journal
        mark, mark_every = JournalMark(journal), 1.0
    server = LockServer(locks, policy, reactor, settings.shutdown_grace)
    server.tls = settings.tls
    server.summary = settings.summary()
    verbose = settings.verbose
    jesync = JESyncFactory(locks, verbose, policy)
    elock = ELockFactory(
        locks,
        verbose,
        policy,
        max_sessions=settings.max_sessions,
        max_grace_ms=None if settings.max_session_grace is None else round(settings.max_session_grace * 1000),
    )
    if cluster is not None:
        elock.sessions.on_end = journal.session_ended
    for description in settings.ports:
        server.listen(description, jesync)
    for description in settings.elock_ports:
        server.listen(description, elock)
    dlock = None
    if settings.dlock_ports:
        dlock = DlockFactory(
            locks,
            verbose,
            policy,
            max_message=settings.dlock_max_message,
            max_keys=settings.dlock_max_keys,
            idle_timeout=settings.dlock_idle_timeout or None,
        )
        elock.dlock = dlock
        for description in settings.dlock_ports:
            server.listen(description, dlock)
    memcache = None
    if settings.memcache_ports:
        store = ObjectStore(locks, memory=settings.memcache_memory, max_item=settings.memcache_max_item)
        memcache = MemcacheFactory(store, verbose, policy)
        SweepService(store).setServiceParent(server)
        for description in settings.memcache_ports:
            server.listen(description, memcache)
    admin = None
    if settings.admin_ports:
        admin_policy = admin_listener_policy(policy, settings)
        if tokens is not None and tokens.admin is not None and admin_policy is not policy:
            tokens.admin.copy_to(admin_policy)
        admin = AdminFactory(locks, verbose, admin_policy, sessions=elock.sessions)
        for description in settings.admin_ports:
            server.listen(description, admin)
        if settings.admin_token_file is not None and admin_policy is not policy and tokens is None:
            TokenFile(
                settings.admin_token_file,
                admin_policy,
                reactor,
                settings.auth_token_grace,
                name="admin token",
                distinct_from=policy,
            ).setServiceParent(server)
    server.factories = {"jesync": jesync, "elock": elock, "dlock": dlock, "memcache": memcache, "admin": admin}
    if settings.auth_token_file is not None and tokens is None:
        separate_admin = admin.policy if admin is not None and admin.policy is not policy else None
        TokenFile(
            settings.auth_token_file, policy, reactor, settings.auth_token_grace, distinct_from=separate_admin
        ).setServiceParent(server)
    if mark is not None:
        TokenMarkService(mark, locks, reactor, every=mark_every).setServiceParent(server)
    if settings.metrics_ports and cluster is None:
        from jesync.metrics import LockMetrics, metrics_site  # (the metrics extra: prometheus_client)

        metrics = LockMetrics(locks, policy.connections, dlock, memcache=memcache, listings=policy.listings)
        locks.observer = metrics
        site = metrics_site(
            metrics,
            serving=lambda: bool(server.running),
            verbose=verbose,
            accepts=None if settings.metrics_public else lambda token: policy.accepts(token, reactor.seconds()),
            on_authorized=scraper_authorized,
        )
        scrapers = Connections(METRICS_CONNECTIONS)
        server.registries.append(scrapers)
        counted = CountedFactory(
            site, scrapers, protected=policy.protected, auth_timeout=metrics_auth_timeout(settings), clock=reactor
        )
        for description in settings.metrics_ports:
            server.listen(description, counted)
    return server


def admin_listener_policy(policy: ConnectionPolicy, settings: ServerSettings) -> ConnectionPolicy:
    """
    What the admin listener's connections are held to: the server's
    C{policy} itself, unless the settings give the admin listener a token
    of its own (C{--admin-token-file}).  Then a copy of it whose token is
    that one alone: the lock token does not open the admin listener, nor
    the admin token a lock listener, so a client given the lock token
    cannot force-release what others hold.  Limits, the registry of
    connections (max-connections counts admin connections too), the
    listing budget and cluster mode are the server's; protected mode does
    not apply, as a token is required.
    """
    if settings.admin_token is None:
        return policy
    return replace(policy, auth_token=settings.admin_token, previous_token=None, previous_until=0.0, protected=False)


def build_member(reactor: Any, settings: ServerSettings) -> ClusterMember:
    """
    A member of the cluster C{settings.cluster} on C{settings.etcd}: a
    standby until it wins the election, then the leader, serving a
    L{build_lock_server} of the settings (a new one each term).  Its metrics
    endpoints serve whether it leads or not.
    """
    try:
        from jesync.cluster.etcd import EtcdClient
    except ImportError as error:  # pragma: no cover - the cluster extra is missing
        raise ImportError(f"cluster mode (--etcd) needs treq: pip install 'jesync[cluster]' ({error})") from error
    from jesync.cluster.member import LEADER, ClusterMember, Timing  # (the cluster extra: treq)

    metrics: Any = None
    cluster_metrics: Any = None
    if settings.metrics_ports:
        from jesync.metrics import ClusterMetrics, LockMetrics  # (the metrics extra: prometheus_client)

        metrics = LockMetrics(LockService(reactor), Connections(), listings=ListingBudget())
        cluster_metrics = ClusterMetrics(metrics.registry)
    etcd = EtcdClient(
        reactor,
        settings.etcd,
        # A request may take as long as the lease is certain: an etcd
        # cluster electing a new leader is waited for, not given up on.
        timeout=Timing(settings.lease_ttl).certainty,
        observer=cluster_metrics.etcd_round_trip if cluster_metrics is not None else None,
    )
    tokens = MemberTokens(settings.auth_token, settings.admin_token)
    member = ClusterMember(
        reactor,
        settings,
        etcd,
        settings.cluster,
        settings.lease_ttl,
        build=partial(build_lock_server, tokens=tokens),
        observer=metrics,
        on_commit=cluster_metrics.committed if cluster_metrics is not None else None,
    )
    member.tls = settings.tls
    tokens.read_again_on_sighup(
        member,
        reactor,
        settings.auth_token_file,
        settings.admin_token_file if settings.admin_ports else None,
        settings.auth_token_grace,
    )
    if metrics is not None:
        from jesync.metrics import metrics_site  # (the metrics extra)

        cluster_metrics.member = member
        # The token the metrics ask for: the member's, as rotated so far,
        # whether it leads or stands by.
        member.on_serving = metrics.follow
        site = metrics_site(
            metrics,
            serving=lambda: member.role == LEADER,
            verbose=settings.verbose,
            role=lambda: member.role,
            accepts=(
                None if settings.metrics_public else lambda token: tokens.lock.accepts(token, reactor.seconds())
            ),
            on_authorized=scraper_authorized,
        )
        counted = CountedFactory(
            site,
            Connections(METRICS_CONNECTIONS),
            protected=settings.protected,
            auth_timeout=metrics_auth_timeout(settings),
            clock=reactor,
        )
        for description in settings.metrics_ports:
            member.listen(description, counted)
    return member


def metrics_auth_timeout(settings: ServerSettings) -> Optional[float]:
    """
    How long a metrics connection may take to complete a scrape with the
    token (None: no limit, as when the metrics need none): as any other
    listener's connection takes to authenticate, so that a client without
    the token holds one of the endpoint's 16 connections for
    C{--auth-timeout} at most, however slowly it sends.
    """
    if settings.auth_token is None or settings.metrics_public:
        return None
    return settings.auth_timeout
