"""
The composition root: a whole lock server from its settings.
L{ServerSettings} is everything C{twistd jesync} can be told: each option
is declared once, as the field it sets (L{jesync.options.option}), and
C{twistd jesync} reads its options from those declarations;
L{build_server} turns settings into a running-ready Twisted service, for
C{twistd jesync}, a C{.tac} file, or an application embedding it: a
L{LockServer} (L{build_lock_server}) or, with etcd, a cluster member
(L{build_member}).

This is the one module that knows every other: the lock service, the
connection policy, each protocol's factory, the HTTP API, the metrics and
the cluster.
So nothing imports it but its callers (L{jesync.tap}, C{etc/jesync.tac},
embedders); the parts it builds live below it (L{jesync.listening},
L{jesync.lock_server}, L{jesync.metrics_connections}, L{jesync.process},
L{jesync.http}).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from jesync import __version__ as jesync_version

from jesync.connections.listings import DEFAULT_LIMIT as DEFAULT_LISTING_LIMIT
from jesync.connections.listings import ListingBudget
from jesync.connections.policy import ConnectionPolicy, Connections
from jesync.errors import show_number
from jesync.fencing import TokenMark, TokenMarkService
from jesync.groups import DEFAULT_MAX_GROUPS, DEFAULT_MAX_MEMBERS, GroupTable
from jesync.http import coordination, status, streams
from jesync.http import locks as http_locks
from jesync.http.api import ApiContext, HttpApi
from jesync.http.listener import ApiClosing, http_factory
from jesync.http.listener import authorized as http_authorized
from jesync.listening import DEFAULT_TLS_CIPHERS, ListenFailed, TLSPolicy, public_endpoint
from jesync.lock_server import LockServer, MemberTokens, TokenFile
from jesync.metrics_connections import CountedFactory, scraper_authorized
from jesync.options import (
    DEFAULT_PORT,
    FLAG,
    MANY,
    Option,
    etcd_url,
    endpoint_type,
    limit,
    listen_endpoint,
    listeners,
    none_if_zero,
    on_off,
    option,
    options_of,
    read_into,
    seconds,
    seconds_text,
    size,
    size_text,
    tls_version,
    whole_number,
)
from jesync.protocols.admin import AdminFactory
from jesync.protocols.dlock import DlockFactory
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.protocols.memcache import MemcacheFactory
from jesync.service import LockService
from jesync.sessions import DEFAULT_MAX_SESSIONS, SessionTable
from jesync.store import ObjectStore, SweepService

if TYPE_CHECKING:
    from jesync.cluster.member import ClusterMember, Leadership

# What embedders import from here (docs/embedding.md): the settings,
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
    limit"; endpoints are Twisted endpoint descriptions.  A field set by an
    option is that option's declaration (L{jesync.options.option}: its
    name, group, help, parser, default...), and its default is the
    option's; the fields' order is C{--help}'s.  The tokens are read from
    their files and the TLS policy from the options declared in it
    (L{jesync.options.read_into}); the tokens are plain fields.
    """

    ports: List[str] = option(
        "port",
        "Listeners",
        "Where to listen for JESync clients: a port number or a Twisted endpoint description "
        "(tcp:7777:interface=127.0.0.1, unix:/run/jesync.sock, ssl:11443:privateKey=key.pem:certKey=cert.pem; "
        "ssl: needs pip install 'jesync[tls]'). May be given more than once. [default: 11400]",
        kind=MANY,
        parser=listen_endpoint,
        default=DEFAULT_PORT,
        short="p",
    )
    elock_ports: List[str] = option(
        "elock-port",
        "Listeners",
        "Where to listen for elock clients (a port number or an endpoint description, as for --port); "
        "may be given more than once. Off unless given; 11401 is suggested (elock's own default is JESync's 11400).",
        kind=MANY,
        parser=listen_endpoint,
    )
    dlock_ports: List[str] = option(
        "dlock-port",
        "Listeners",
        "Where to listen for dlock clients (length-prefixed protocol buffers; a port number or an endpoint "
        "description, as for --port); may be given more than once. Off unless given; 11402 is suggested.",
        kind=MANY,
        parser=listen_endpoint,
    )
    memcache_ports: List[str] = option(
        "memcache-port",
        "Listeners",
        "Where to listen for memcached clients (text and binary protocols, with yrmcds's object locks; "
        "a port number or an endpoint description, as for --port); may be given more than once. "
        "Off unless given; 11211 is suggested.",
        kind=MANY,
        parser=listen_endpoint,
    )
    admin_ports: List[str] = option(
        "admin-port",
        "Listeners",
        "Where to listen for the operator: the JESync protocol plus force-release <key> and end-session <id> "
        "(a port number or an endpoint description, as for --port; e.g. unix:/run/jesync/admin.sock "
        "with mode=600); may be given more than once. Off unless given.",
        kind=MANY,
        parser=listen_endpoint,
    )
    metrics_ports: List[str] = option(
        "metrics",
        "Listeners",
        "Serve Prometheus metrics (/metrics) and a health check (/health) over HTTP, unauthenticated: "
        "a port number or an endpoint description, as for --port (e.g. tcp:9400:interface=127.0.0.1). "
        "Off unless given. Needs pip install 'jesync[metrics]'.",
        kind=MANY,
        parser=listen_endpoint,
    )
    http_ports: List[str] = option(
        "http-port",
        "Listeners",
        "Where to serve the HTTP/JSON API and the status page (GET /): a port number or an endpoint "
        "description, as for --port (ssl: for HTTPS); may be given more than once. Off unless given; "
        "11480 is suggested. Its connections count toward --max-connections; --auth-token-file's token "
        "is sent as 'Authorization: Bearer <token>'.",
        kind=MANY,
        parser=listen_endpoint,
    )
    max_connections: Optional[int] = option(
        "max-connections",
        "Limits",
        "Most client connections open at once, all protocols together.",
        parser=limit,
        default=10_000,
        logged=1,
    )
    max_keys: Optional[int] = option(
        "max-keys",
        "Limits",
        "Most distinct keys in use (held or waited for) at once.",
        parser=limit,
        default=1_000_000,
        logged=2,
    )
    max_waiters: Optional[int] = option(
        "max-waiters",
        "Limits",
        "Most requests waiting for one key.",
        parser=limit,
        default=10_000,
        logged=3,
    )
    max_total_waits: Optional[int] = option(
        "max-total-waits",
        "Limits",
        "Most requests waiting at once, all keys and connections together.",
        parser=limit,
        default=100_000,
        logged=4,
    )
    max_held: Optional[int] = option(
        "max-held",
        "Limits",
        "Most grants plus waits one connection (elock: one session) may have.",
        parser=limit,
        default=10_000,
        logged=5,
    )
    max_watches: Optional[int] = option(
        "max-watches",
        "Limits",
        "Most keys and prefixes one JESync connection may watch at once.",
        parser=limit,
        default=1_000,
    )
    max_total_watches: Optional[int] = option(
        "max-total-watches",
        "Limits",
        "Most watches at once, all connections together.",
        parser=limit,
        default=100_000,
    )
    max_groups: Optional[int] = option(
        "max-groups",
        "Limits",
        "Most groups (JESync group-create) at once.",
        parser=limit,
        default=DEFAULT_MAX_GROUPS,
    )
    max_members: Optional[int] = option(
        "max-members",
        "Limits",
        "Most members one group may have.",
        parser=limit,
        default=DEFAULT_MAX_MEMBERS,
    )
    max_sessions: Optional[int] = option(
        "max-sessions",
        "Limits",
        "Most elock sessions in their grace period (detached) at once; while there are that many, "
        "no new session starts.",
        parser=limit,
        default=DEFAULT_MAX_SESSIONS,
        logged=6,
    )
    max_session_grace: Optional[float] = option(
        "max-session-grace",
        "Limits",
        "Longest grace period, in seconds, an elock session may ask for with set_timeout "
        "(a longer one is cut to it); a session holding nothing ends when its connection goes.",
        parser=seconds,
        default=300.0,
        shown=seconds_text,
        setting=none_if_zero,
        logged=7,
    )
    max_key_length: Optional[int] = option(
        "max-key-length",
        "Limits",
        "Longest key accepted, in bytes.",
        parser=limit,
        default=1024,
        logged=8,
    )
    max_unsent: Optional[int] = option(
        "max-unsent",
        "Limits",
        "Bytes of replies a client that stopped reading may fall behind by before it is disconnected "
        "(counted from the first reactor turn after its transport's buffer passed 64 KiB).",
        parser=limit,
        default=4 * 1024 * 1024,
        logged=9,
    )
    max_listing_memory: int = option(
        "max-listing-memory",
        "Limits",
        "Most memory the snapshots of listings being sent hold together, in bytes or with a unit (64m, 1g); "
        "past it, a listing that needs a new snapshot is refused (one is always admitted when no other is being sent).",
        parser=size,
        default=DEFAULT_LISTING_LIMIT,
        shown=size_text,
        logged=10,
    )
    idle_timeout: Optional[float] = option(
        "idle-timeout",
        "Limits",
        "Seconds after which a connection that has sent nothing, and holds and waits for nothing, "
        "is closed (0: never).",
        parser=seconds,
        default=0.0,
        shown=seconds_text,
        setting=none_if_zero,
        logged=12,
    )
    http_max_wait: float = option(
        "http-max-wait",
        "Limits",
        "Longest an HTTP request may wait for a lock or an election (a long poll), in seconds; "
        "a request asking for longer, or for -1, waits this long.",
        parser=seconds,
        default=60.0,
        shown=seconds_text,
    )
    dlock_max_message: int = option(
        "dlock-max-message",
        "Limits",
        "Longest dlock message, in bytes; a longer one closes its connection.",
        parser=whole_number,
        default=16384,
    )
    dlock_max_keys: int = option(
        "dlock-max-keys",
        "Limits",
        "Most keys one dlock request may name (more: TooManyKeys).",
        parser=whole_number,
        default=1000,
    )
    dlock_idle_timeout: Optional[float] = option(
        "dlock-idle-timeout",
        "Limits",
        "Seconds after which a dlock connection that has sent nothing (not even a Ping) is closed, "
        "releasing the locks it holds until disconnect (0: never). Governs dlock connections instead "
        "of --idle-timeout.",
        parser=seconds,
        default=60.0,
        shown=seconds_text,
        setting=none_if_zero,
    )
    memcache_memory: int = option(
        "memcache-memory",
        "Limits",
        "Most memory the memcached store's items take (keys, values and 320 bytes each), in bytes or with "
        "a unit (64m, 1g); past it, least recently used unlocked items are evicted.",
        parser=size,
        default=64 * 1024**2,
        shown=size_text,
    )
    memcache_max_item: int = option(
        "memcache-max-item",
        "Limits",
        "Longest value the memcached store takes (bytes, or 512k, 1m...); a longer one is refused "
        "with memcached's 'object too large' error.",
        parser=size,
        default=1024**2,
        shown=size_text,
    )
    # The token, read from --auth-token-file (read again on SIGHUP).
    auth_token: Optional[bytes] = None
    auth_token_file: Optional[str] = option(
        "auth-token-file",
        "Security",
        "A file holding a token (one line): every connection must send 'auth <token>' first.",
    )
    auth_token_grace: float = option(
        "auth-token-grace",
        "Security",
        "Seconds the previous token is still accepted after the token file is read again (on SIGHUP), "
        "so that clients can be given the new one without a restart.",
        parser=seconds,
        default=300.0,
        shown=seconds_text,
    )
    # The admin listener's own token, read from --admin-token-file (read again
    # on SIGHUP): with it, the admin listener takes this token and not auth_token.
    admin_token: Optional[bytes] = None
    admin_token_file: Optional[str] = option(
        "admin-token-file",
        "Security",
        "A file holding the admin listener's own token (one line): --admin-port then accepts "
        "'auth <this token>' alone (not --auth-token-file's), and this token opens no other listener. "
        "Read again on SIGHUP, as --auth-token-file is.",
    )
    auth_timeout: Optional[float] = option(
        "auth-timeout",
        "Security",
        "Seconds a connection may take to send a valid 'auth <token>' (with --auth-token-file) "
        "before it is closed (0: no limit).",
        parser=seconds,
        default=10.0,
        shown=seconds_text,
        setting=none_if_zero,
        logged=11,
    )
    protected_mode: bool = option(
        "protected-mode",
        "Security",
        "on: while no --auth-token-file is set, only clients on loopback or a UNIX socket are served, "
        "others get an error saying how to let them in; off: serve everyone (a trusted network).",
        parser=on_off,
        default="on",
    )
    # What ssl: endpoints accept, read from --tls-ciphers and --tls-min-version.
    tls: TLSPolicy = read_into(
        Option(
            "tls-ciphers",
            "Security",
            "The TLS 1.2 cipher suites ssl: listeners accept, as an OpenSSL cipher string "
            "(forward-secret AEAD suites only by default; TLS 1.3's are OpenSSL's, all of that kind).",
            default=DEFAULT_TLS_CIPHERS,
        ),
        Option(
            "tls-min-version",
            "Security",
            "The oldest TLS version ssl: listeners accept: 1.2 or 1.3.",
            parser=tls_version,
            default="1.2",
        ),
        default_factory=TLSPolicy,
    )
    metrics_public: bool = option(
        "metrics-public",
        "Security",
        "Serve /metrics to anyone even with --auth-token-file (without it, a scrape must send "
        "'Authorization: Bearer <token>'; /health is always open).",
        kind=FLAG,
        setting=bool,
    )
    etcd: List[str] = option(
        "etcd",
        "Cluster",
        "Run as a member of a cluster whose state lives in etcd: an etcd client URL (http://127.0.0.1:2379); "
        "give each member of an etcd cluster, one --etcd each. One member of the cluster (--cluster) is "
        "leader and serves every listener; the others stand by, listening on nothing but --metrics, and take "
        "over if it dies. Needs pip install 'jesync[cluster]'.",
        kind=MANY,
        parser=etcd_url,
    )
    cluster: str = option(
        "cluster",
        "Cluster",
        "With --etcd: the cluster's name; every member of one cluster uses the same name and etcd.",
        default="jesync",
    )
    lease_ttl: int = option(
        "lease-ttl",
        "Cluster",
        "With --etcd: seconds the leader's election lease lasts without a keep-alive; a standby takes over "
        "within this plus 2 seconds of the leader's death (2 at least: etcd's own minimum).",
        parser=int,
        default=5,
    )
    state_dir: Optional[str] = option(
        "state-dir",
        "Operations",
        "A directory the server may write to (systemd's StateDirectory=): it keeps a high-water mark of "
        "fencing tokens there, so that tokens keep increasing across restarts even if the clock goes back.",
    )
    keepalive: Optional[float] = option(
        "keepalive",
        "Operations",
        "Seconds of silence before TCP keepalive probes a client, and between probes; "
        "4 unanswered probes drop it (0: the system's settings).",
        parser=seconds,
        default=60.0,
        shown=seconds_text,
        setting=none_if_zero,
    )
    shutdown_grace: float = option(
        "shutdown-grace",
        "Operations",
        "Seconds a stopping server, or a closing connection, waits for clients to take their last replies "
        "before dropping them.",
        parser=seconds,
        default=5.0,
        shown=seconds_text,
    )
    verbose: bool = option(
        "verbose",
        "Operations",
        "Log every command and reply (at debug level).",
        kind=FLAG,
        short="v",
        setting=bool,
    )


    def summary(self) -> str:
        """
        One line for the log: endpoints (as L{public_endpoint} shows them:
        never a TLS key's or certificate's path) and limits (never the token):
        the options declared with C{logged}, in its order.
        """
        logged = sorted((each for each in options_of(ServerSettings) if each.logged), key=lambda each: each.logged)
        limits = {each.name: getattr(self, str(each.field)) for each in logged}

        def shown(descriptions: List[str]) -> str:
            return ", ".join(public_endpoint(description) for description in descriptions)

        return (
            f"JESync on {shown(self.ports)}"
            + (f"; elock on {shown(self.elock_ports)}" if self.elock_ports else "")
            + (f"; dlock on {shown(self.dlock_ports)}" if self.dlock_ports else "")
            + (f"; memcached on {shown(self.memcache_ports)}" if self.memcache_ports else "")
            + (f"; metrics on {shown(self.metrics_ports)}" if self.metrics_ports else "")
            + (f"; admin on {shown(self.admin_ports)}" if self.admin_ports else "")
            + (f"; HTTP on {shown(self.http_ports)}" if self.http_ports else "")
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
        listening = listeners(options_of(ServerSettings))
        descriptions = [description for listener in listening for description in getattr(self, str(listener.field))]
        if not any(endpoint_type(description) == "ssl" for description in descriptions):
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
        max_watches=settings.max_watches,
        max_total_watches=settings.max_total_watches,
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
    groups = GroupTable(locks, max_groups=settings.max_groups, max_members=settings.max_members)
    jesync = JESyncFactory(locks, verbose, policy, groups=groups)
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
        admin = AdminFactory(locks, verbose, admin_policy, sessions=elock.sessions, groups=groups)
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
    if settings.http_ports:
        serve_http(server, settings, elock.sessions, groups, cluster)
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


def serve_http(
    server: LockServer, settings: ServerSettings, sessions: SessionTable, groups: GroupTable, cluster: Any
) -> HttpApi:
    """
    The HTTP API (L{jesync.http}) of C{server}, served at every
    C{--http-port}: its sessions are elock's (C{sessions}: one id space, one
    C{--max-sessions}), its connections are counted with every other, and
    when the server stops (in cluster mode: its term ends) every call still
    waiting is answered C{409 not_granted} before the connections close.
    """
    reactor = server.clock
    policy = server.policy
    started = reactor.seconds()

    def describe() -> Dict[str, Any]:
        return {
            "server": {
                "version": jesync_version,
                "role": "standalone" if cluster is None else "leader",
                "term": None if cluster is None else cluster.term,
                "uptime": max(0.0, reactor.seconds() - started),
                "listeners": [
                    public_endpoint(description)
                    for listener in listeners(options_of(ServerSettings))
                    for description in getattr(settings, str(listener.field))
                ],
            },
            "limits": {
                "max_connections": settings.max_connections,
                "max_keys": settings.max_keys,
                "max_waiters": settings.max_waiters,
                "max_held": settings.max_held,
                "max_total_waits": settings.max_total_waits,
                "max_watches": settings.max_watches,
                "max_total_watches": settings.max_total_watches,
                "max_sessions": settings.max_sessions,
                "max_session_grace": settings.max_session_grace,
                "max_groups": settings.max_groups,
                "max_members": settings.max_members,
                "max_key_length": settings.max_key_length,
                "max_unsent": settings.max_unsent,
                "http_max_wait": settings.http_max_wait,
            },
        }

    context = ApiContext(
        server.locks, sessions, groups, policy, reactor, max_wait=settings.http_max_wait, describe=describe
    )
    routes = http_locks.ROUTES + coordination.ROUTES + streams.ROUTES + status.ROUTES
    api = HttpApi(context, routes, on_authorized=http_authorized)
    ApiClosing(api, sessions).setServiceParent(server)
    factory = http_factory(api, policy, reactor, policy.connections, verbose=settings.verbose)
    for description in settings.http_ports:
        server.listen(description, factory)
    return api


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
