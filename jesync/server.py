"""
A whole lock server from its settings: L{build_server} builds it (for
C{twistd jesync}, a C{.tac} file, or an application embedding it), and
L{LockServer} is what it builds: the listeners as a Twisted service, which
starts only if every one of them listens, with a graceful stop.
"""

from __future__ import annotations

import hmac
import signal
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple, Union

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints, tcp
from twisted.internet.defer import CancelledError, Deferred, gatherResults, succeed
from twisted.internet.error import CannotListenError, ConnectionDone
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IProtocolFactory,
    IReactorTime,
    IStreamServerEndpoint,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure

from jesync.connections.connection import LockServerFactory
from jesync.connections.listings import DEFAULT_LIMIT as DEFAULT_LISTING_LIMIT, ListingBudget
from jesync.connections.policy import ConnectionPolicy, Connections, is_local, read_token_file
from jesync.errors import ProtectedMode, show_number
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.service import LockService
from jesync.sessions import DEFAULT_MAX_SESSIONS

if TYPE_CHECKING:
    from twisted.internet.interfaces import IDelayedCall

    from jesync.cluster.member import ClusterMember, Leadership

DEFAULT_PORT = "tcp:11400"
# The metrics endpoint's own cap on connections (scrapers and health checks).
METRICS_CONNECTIONS = 16


@dataclass
class ServerSettings:
    """
    Everything C{twistd jesync} can be told.  Limits are None for "no
    limit"; endpoints are Twisted endpoint descriptions.
    """

    ports: List[str] = field(default_factory=lambda: [DEFAULT_PORT])
    elock_ports: List[str] = field(default_factory=list)
    dlock_ports: List[str] = field(default_factory=list)
    memcache_ports: List[str] = field(default_factory=list)
    metrics_ports: List[str] = field(default_factory=list)
    admin_ports: List[str] = field(default_factory=list)
    max_connections: Optional[int] = 10_000
    max_keys: Optional[int] = 1_000_000
    max_waiters: Optional[int] = 10_000
    max_total_waits: Optional[int] = 100_000
    max_held: Optional[int] = 10_000
    max_sessions: Optional[int] = DEFAULT_MAX_SESSIONS
    # Seconds: the longest grace period an elock session may ask for (None: no bound).
    max_session_grace: Optional[float] = 300.0
    max_key_length: Optional[int] = 1024
    max_unsent: Optional[int] = 4 * 1024 * 1024
    # Bytes all pending listings' snapshots may hold together (jesync.connections.listings).
    max_listing_memory: int = DEFAULT_LISTING_LIMIT
    keepalive: Optional[float] = 60.0
    auth_token: Optional[bytes] = None
    # The file the token came from: read again on SIGHUP (None: never).
    auth_token_file: Optional[str] = None
    auth_token_grace: float = 300.0
    # The admin listener's own token, and its file (read again on SIGHUP):
    # with it, the admin listener takes this token and not auth_token.
    admin_token: Optional[bytes] = None
    admin_token_file: Optional[str] = None
    # Serve /metrics without the token even when one is set.
    metrics_public: bool = False
    protected_mode: bool = True
    # What ssl: endpoints accept (--tls-ciphers, --tls-min-version).
    tls: TLSPolicy = field(default_factory=lambda: TLSPolicy())
    auth_timeout: Optional[float] = 10.0
    idle_timeout: Optional[float] = None
    shutdown_grace: float = 5.0
    dlock_max_message: int = 16384
    dlock_max_keys: int = 1000
    dlock_idle_timeout: Optional[float] = 60.0
    memcache_memory: int = 64 * 1024 * 1024
    memcache_max_item: int = 1024 * 1024
    state_dir: Optional[str] = None
    # Cluster mode (jesync.cluster): etcd's client URLs (none: a single process).
    etcd: List[str] = field(default_factory=list)
    cluster: str = "jesync"
    lease_ttl: int = 5
    verbose: bool = False

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


# Endpoint types whose every argument may be shown: where they listen, no secrets.
_PLAIN_ENDPOINTS = frozenset({"tcp", "tcp6", "unix", "systemd"})
# The arguments of any other type (ssl: and plugins) that may be: where it
# listens.  Not its other arguments (ssl:'s privateKey, certKey,
# extraCertChain, dhParameters, ...: files an operator may not want in a log).
_SHOWN_ARGUMENTS = frozenset({"port", "interface", "backlog"})


def _split_description(text: str, separator: str, most: int = -1) -> List[str]:
    """C{text} split at each C{separator} that a backslash does not escape (escapes kept)."""
    parts: List[str] = []
    start = index = 0
    while index < len(text) and most != len(parts):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == separator:
            parts.append(text[start:index])
            start = index + 1
        index += 1
    parts.append(text[start:])
    return parts


def public_endpoint(description: str) -> str:
    """
    The endpoint C{description} as the log may show it.  TCP, UNIX and
    systemd endpoints as they are; any other (C{ssl:}, plugins) as its type,
    its first argument (the port) and its C{port}, C{interface} and
    C{backlog} arguments: C{ssl:11443:privateKey=key.pem:certKey=cert.pem}
    is shown as C{ssl:11443}.
    """
    kind, *arguments = _split_description(description, ":")
    if not arguments or kind.lower() in _PLAIN_ENDPOINTS:
        return description
    shown = [kind]
    positional = 0
    for argument in arguments:
        name = _split_description(argument, "=", 1)
        if len(name) == 2:
            if name[0] in _SHOWN_ARGUMENTS:
                shown.append(argument)
        else:
            positional += 1
            if positional == 1:
                shown.append(argument)
    return ":".join(shown)


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
        from jesync.fencing import TokenMark

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
        from jesync.cluster.journal import JournalMark

        journal = cluster.journal_for(locks)
        locks.observer = journal
        policy.serving = cluster.serving
        policy.journal = journal
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
    if policy.journal is not None:
        elock.sessions.on_end = policy.journal.session_ended
    for description in settings.ports:
        server.listen(description, jesync)
    for description in settings.elock_ports:
        server.listen(description, elock)
    dlock = None
    if settings.dlock_ports:
        from jesync.protocols.dlock import DlockFactory

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
        from jesync.protocols.memcache import MemcacheFactory
        from jesync.store import ObjectStore, SweepService

        store = ObjectStore(locks, memory=settings.memcache_memory, max_item=settings.memcache_max_item)
        memcache = MemcacheFactory(store, verbose, policy)
        SweepService(store).setServiceParent(server)
        for description in settings.memcache_ports:
            server.listen(description, memcache)
    admin = None
    if settings.admin_ports:
        from jesync.protocols.admin import AdminFactory

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
        from jesync.fencing import TokenMarkService

        TokenMarkService(mark, locks, reactor, every=mark_every).setServiceParent(server)
    if settings.metrics_ports and cluster is None:
        from jesync.metrics import LockMetrics, metrics_site

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
    from jesync.cluster.member import LEADER, ClusterMember, Timing

    metrics: Any = None
    cluster_metrics: Any = None
    if settings.metrics_ports:
        from jesync.metrics import ClusterMetrics, LockMetrics

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
    tokens = MemberTokens(settings)
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
    tokens.read_again_on_sighup(member, reactor, settings)
    if metrics is not None:
        from jesync.metrics import metrics_site

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


def scraper_authorized(request: Any) -> None:
    """A metrics request carried the token: its connection may stay (see L{metrics_auth_timeout})."""
    connection = request.channel.transport
    if isinstance(connection, _CountedConnection):
        connection.authorized()


# Seconds a metrics connection closed at its auth deadline may take to close
# cleanly before it is aborted.
NOT_AUTHORIZED_CLOSE = 1.0


class _CountedConnection(ProtocolWrapper):
    """
    A connection of another kind (the metrics' HTTP), counted in a registry
    of its own; with the factory's C{auth_timeout}, closed unless it is
    L{authorized} in time.
    """

    _deadline: Optional[IDelayedCall] = None

    def makeConnection(self, transport: Any) -> None:
        # No protocol of ours to answer in: HTTP's own refusals.
        if self.factory.protected and not is_local(transport.getPeer()):
            body = ProtectedMode.MESSAGE.encode() + b"\n"
            self._refuse(transport, b"403 Forbidden", body)
            return
        if not self.factory.connections.admit(self):
            self._refuse(transport, b"503 Service Unavailable", b"")
            return
        if self.factory.clock is not None and self.factory.auth_timeout is not None:
            self._deadline = self.factory.clock.callLater(self.factory.auth_timeout, self._not_authorized)
        super().makeConnection(transport)

    def authorized(self) -> None:
        """It completed a request with the token: no deadline any more."""
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _not_authorized(self) -> None:
        """
        Closed: gracefully (a FIN after what was written, so that a health
        check's keep-alive connection between its requests is not reset),
        and aborted if still open L{NOT_AUTHORIZED_CLOSE} seconds later (a
        client that does not read, or a response still being sent).
        """
        transport: Any = self.transport  # (TCP's, UNIX's or TLS's: each can abort)
        transport.loseConnection()
        self._deadline = self.factory.clock.callLater(NOT_AUTHORIZED_CLOSE, transport.abortConnection)

    def _refuse(self, transport: Any, status: bytes, body: bytes) -> None:
        transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, len(body), body)
        )
        transport.loseConnection()
        self.refused = True

    def close(self) -> None:
        self.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if getattr(self, "refused", False):
            return
        self.authorized()  # (cancels the deadline)
        self.factory.connections.remove(self)
        super().connectionLost(reason)


class CountedFactory(WrappingFactory):
    """
    Counts the connections of C{factory} in C{connections} (its limit, and
    closing them at shutdown); C{protected}: refuses clients that are not
    local, as every listener does in protected mode; C{auth_timeout}: aborts
    a connection not authorized (L{scraper_authorized}) within that many
    seconds of C{clock}.
    """

    protocol = _CountedConnection
    noisy = False

    def __init__(
        self,
        factory: IProtocolFactory,
        connections: Connections,
        protected: bool = False,
        auth_timeout: Optional[float] = None,
        clock: Optional[IReactorTime] = None,
    ) -> None:
        super().__init__(factory)
        self.connections = connections
        self.protected = protected
        self.auth_timeout = auth_timeout
        if auth_timeout is not None and clock is None:
            raise ValueError("an auth_timeout needs a clock")
        self.clock = clock

    def logPrefix(self) -> str:
        return self.wrappedFactory.logPrefix()

    def unregisterProtocol(self, protocol: Protocol) -> None:
        self.protocols.pop(protocol, None)


class MemberTokens:
    """
    Cluster mode: a member's tokens as rotated so far (each the current
    token, the previous one and the end of its grace, the generation), kept
    across its terms.  A member builds a new lock server each term, whose
    policies start from these; SIGHUP is handled by the member (a standby
    too), which rotates these and the current term's policies; a standby's
    /metrics asks for these.  So a token rotated out stays out after a
    change of leader, and a new one stays in.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.lock = ConnectionPolicy(auth_token=settings.auth_token)
        self.admin: Optional[ConnectionPolicy] = None
        if settings.admin_token is not None:
            self.admin = ConnectionPolicy(auth_token=settings.admin_token)

    def read_again_on_sighup(self, member: Any, clock: IReactorTime, settings: ServerSettings) -> None:
        """The token files' L{TokenFile}s, services of C{member}, following its current term's policies."""

        def term_server() -> Any:
            term = getattr(member, "term", None)
            return getattr(term, "server", None)

        def lock_policies() -> List[ConnectionPolicy]:
            server = term_server()
            return [server.policy] if server is not None else []

        def admin_policies() -> List[ConnectionPolicy]:
            server = term_server()
            admin = server.factories.get("admin") if server is not None else None
            return [admin.policy] if admin is not None and admin.policy is not server.policy else []

        if settings.auth_token_file is not None:
            TokenFile(
                settings.auth_token_file,
                self.lock,
                clock,
                settings.auth_token_grace,
                distinct_from=self.admin,
                following=lock_policies,
            ).setServiceParent(member)
        if settings.admin_token_file is not None and self.admin is not None and settings.admin_ports:
            TokenFile(
                settings.admin_token_file,
                self.admin,
                clock,
                settings.auth_token_grace,
                name="admin token",
                distinct_from=self.lock,
                following=admin_policies,
            ).setServiceParent(member)


class TokenFile(service.Service):
    """
    Reads a token file again on SIGHUP: the new token is accepted at once,
    the previous one for C{grace} seconds more (clients can be given the new
    one without a restart); when they are over, the connections still
    authenticated with it are closed.  A file that cannot be read, or holds
    no single token, is logged and changes nothing.  A server may read two
    (the auth token's, and the admin listener's own, C{name}d C{admin
    token}): each one's SIGHUP handler calls the one it replaced, so one
    SIGHUP reads both.
    """

    log = Logger()

    def __init__(
        self,
        path: str,
        policy: ConnectionPolicy,
        clock: IReactorTime,
        grace: float,
        name: str = "auth token",
        distinct_from: Optional[ConnectionPolicy] = None,
        following: Callable[[], List[ConnectionPolicy]] = list,
    ) -> None:
        self.path = path
        # Policies that take C{policy}'s tokens after each rotation, and
        # whose connections a grace period's end closes too (cluster mode:
        # the current term's).
        self.following = following
        # The other credential's policy (the admin token's and the lock
        # token's each name the other's): a new token equal to its token is
        # refused, as at startup, or one token would open both again.
        self.distinct_from = distinct_from
        self.policy = policy
        self.clock = clock
        self.grace = grace
        self.name = name
        self._previous_handler: Any = None
        # The ends of grace periods to come (cancelled when the server stops).
        self._retirements: List[IDelayedCall] = []

    def startService(self) -> None:
        super().startService()
        call_from_thread = getattr(self.clock, "callFromThread", None)
        if call_from_thread is None or not hasattr(signal, "SIGHUP"):
            return  # not a reactor (an embedder's clock), or no SIGHUP here

        def hangup(number: int, frame: Any) -> None:
            call_from_thread(self.reload)
            if callable(self._previous_handler):
                self._previous_handler(number, frame)

        try:
            self._previous_handler = signal.signal(signal.SIGHUP, hangup)
        except ValueError:  # not the main thread: the embedder handles signals
            self._previous_handler = None

    def stopService(self) -> None:
        super().stopService()
        for call in self._retirements:
            if call.active():
                call.cancel()
        self._retirements = []
        if self._previous_handler is not None:
            signal.signal(signal.SIGHUP, self._previous_handler)
            self._previous_handler = None

    def reload(self) -> None:
        """Read the token file again, and take its token."""
        try:
            token = read_token_file(self.path)
        except (OSError, ValueError) as error:
            self.log.error(
                "{name} file not read again, the token stays: {why}",
                name=self.name,
                why=getattr(error, "strerror", None) or error,
            )
            return
        other = self.distinct_from
        if other is not None and other.auth_token is not None and hmac.compare_digest(token, other.auth_token):
            self.log.error(
                "{name} file not taken, the token stays: the admin token and the auth token must differ",
                name=self.name,
            )
            return
        if self.policy.rotate(token, self.clock.seconds(), self.grace):
            for policy in self.following():
                self.policy.copy_to(policy)
            self.log.info(
                "new {name} taken; the previous one is accepted for {grace} s more", name=self.name, grace=self.grace
            )
            self._retirements = [call for call in self._retirements if call.active()]
            self._retirements.append(self.clock.callLater(self.grace, self.close_rotated_out))
        else:
            self.log.info("{name} file read again: the token is unchanged", name=self.name)

    def close_rotated_out(self) -> None:
        """A grace period is over: close the connections still on the token it was for."""
        now = self.clock.seconds()
        closed = self.policy.close_rotated_out(now)
        for policy in self.following():
            closed += policy.close_rotated_out(now)
        if closed:
            self.log.info("closed {count} connections authenticated with a token rotated out", count=closed)


class ListenFailed(Exception):
    """
    A L{LockServer} did not start: some of its endpoints could not listen.
    Its message says which and why, in one line (C{cannot listen on
    tcp:11400: address already in use}).
    """


def listen_error(description: str, reason: Failure) -> str:
    """Why the endpoint C{description} could not listen, in a few words."""
    error = reason.value
    cause = error.socketError if isinstance(error, CannotListenError) else error
    if isinstance(cause, OSError) and cause.strerror:
        why = cause.strerror[:1].lower() + cause.strerror[1:]
    else:
        why = str(cause) or type(cause).__name__
    return f"cannot listen on {public_endpoint(description)}: {why}"


def _close_now(port: IListeningPort) -> None:
    """
    Stop listening on C{port} at once, rather than on the reactor's next
    turn (which a process that failed to start never takes): its socket
    closed and, for a UNIX socket, its file removed, so a restart can bind it.
    """
    if isinstance(port, tcp.Port):  # TCP, TLS and UNIX ports of the POSIX reactors
        if port.connected:
            port.stopReading()
            port.connectionLost(Failure(ConnectionDone("another endpoint could not listen")))
    else:
        port.stopListening()


# TLS 1.2's suites a listener accepts by default: forward-secret key
# exchange (ECDHE, or DHE with dhParameters=) and AEAD ciphers only.  TLS
# 1.3's suites are all of that kind; OpenSSL's own list of them is used.
DEFAULT_TLS_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL"
TLS_VERSIONS = ("1.2", "1.3")


@dataclass(frozen=True)
class TLSPolicy:
    """
    What every C{ssl:} listener accepts (C{--tls-ciphers},
    C{--tls-min-version}): by default TLS 1.2 or newer, and, for TLS 1.2,
    forward-secret AEAD suites only (L{DEFAULT_TLS_CIPHERS}).  Twisted's
    C{ssl:} parser takes neither a cipher list nor a minimum version, and
    its own defaults still accept TLS 1.0 and static-RSA CBC suites
    (C{AES128-SHA}), so L{apply} gives each such endpoint new options,
    with this policy, built from the certificate, key, chain and DH
    parameters it parsed.

    @ivar ciphers: an OpenSSL cipher string, for TLS 1.2 (TLS 1.3's suites
        are OpenSSL's).
    @ivar min_version: C{"1.2"} or C{"1.3"}.
    """

    ciphers: str = DEFAULT_TLS_CIPHERS
    min_version: str = "1.2"

    def check(self) -> None:
        """
        @raise ValueError: the cipher string selects no suite OpenSSL has,
            or the version is not one of L{TLS_VERSIONS}.
        """
        if self.min_version not in TLS_VERSIONS:
            raise ValueError(f"{self.min_version}: not one of {', '.join(TLS_VERSIONS)}")
        self.options()

    def options(self, **credentials: Any) -> Any:
        """A L{CertificateOptions} of this policy, for the C{credentials} (its certificate, key, chain, DH)."""
        from twisted.internet.ssl import AcceptableCiphers, CertificateOptions, TLSVersion

        acceptable = AcceptableCiphers.fromOpenSSLCipherString(self.ciphers)
        minimum = TLSVersion.TLSv1_3 if self.min_version == "1.3" else TLSVersion.TLSv1_2
        try:
            return CertificateOptions(acceptableCiphers=acceptable, raiseMinimumTo=minimum, **credentials)
        except ValueError as error:  # Twisted's: "... yielded no usable ciphers on this platform."
            if "cipher" not in str(error):
                raise
            raise ValueError(f"{self.ciphers!r} selects no cipher suite this OpenSSL has") from None

    def apply(self, endpoint: IStreamServerEndpoint) -> None:
        """
        Give an C{ssl:} endpoint this policy's options, before it listens
        (so before its context is made); any other endpoint is left alone.
        The certificate, key and chain go in as C{cryptography}'s objects
        rather than pyOpenSSL's: Twisted's C{ssl:} parser (through 26.10 at
        least) loads them as pyOpenSSL C{X509} and C{PKey}, which pyOpenSSL
        deprecates handing to a context (a DeprecationWarning from 24.3).

        @raise ValueError: the endpoint was given an C{sslmethod}, which
            these options replace (C{--tls-min-version} says the versions).
        """
        parsed = getattr(endpoint, "_sslContextFactory", None)
        if parsed is None:
            return
        from OpenSSL import SSL, crypto  # only for ssl:, which needs it anyway

        if parsed.method != SSL.TLS_METHOD:
            raise ValueError("sslmethod= is not taken: --tls-min-version says which TLS versions are accepted")

        def current(value: Any) -> Any:
            if isinstance(value, crypto.X509):
                return value.to_cryptography()
            if isinstance(value, crypto.PKey):
                return value.to_cryptography_key()
            return value

        endpoint._sslContextFactory = self.options(  # type: ignore[attr-defined]
            certificate=current(parsed.certificate),
            privateKey=current(parsed.privateKey),
            extraCertChain=[current(certificate) for certificate in parsed.extraCertChain or ()] or None,
            dhParameters=parsed.dhParameters,
        )


class Listener(StreamServerEndpointService):
    """
    One endpoint of a L{LockServer}, serving C{factory} while the server
    runs.  Where Twisted's own service logs a failure to listen and carries
    on, this one leaves it to the L{LockServer}, which then does not start.
    """

    def __init__(self, description: str, endpoint: IStreamServerEndpoint, factory: IProtocolFactory) -> None:
        super().__init__(endpoint, factory)
        self.description = description
        self.port: Optional[IListeningPort] = None
        # How the last listen went: fires with the port, or fails with why not.
        self.listening: Optional[Deferred[IListeningPort]] = None

    def privilegedStartService(self) -> None:
        service.Service.privilegedStartService(self)
        outcome: Deferred[IListeningPort] = Deferred()
        self.listening = outcome

        def listened(port: IListeningPort) -> IListeningPort:
            self.port = port
            outcome.callback(port)
            return port

        def failed(reason: Failure) -> None:
            outcome.errback(reason)

        self._waitingForPort = self.endpoint.listen(self.factory).addCallbacks(listened, failed)

    def close_now(self) -> None:
        """Stop listening (or trying to) at once; starting again listens again."""
        if self._waitingForPort is not None:
            self._waitingForPort.cancel()  # a listen still under way
        if self.port is not None:
            _close_now(self.port)
        self.port = None
        self._waitingForPort = None

    def stopService(self) -> Deferred[None]:
        if self._waitingForPort is None:  # never listened, or closed already
            self.running = False
            self.port = None
            return succeed(None)
        stopped: Deferred[None] = super().stopService()
        self.port = None
        return stopped


class Listeners(service.MultiService):
    """
    Endpoints that listen all or not at all: starting listens on every one;
    once every one listens, L{listening_everywhere} is called.  If one
    cannot listen, the others stop listening and it logs why, in one line:
    when that is known at once (as for every endpoint type of Twisted's
    own), C{privilegedStartService} or C{startService} raises
    L{ListenFailed}, which makes C{twistd} exit with status 1; otherwise
    L{when_listening} tells.  (A L{LockServer}; a cluster member's metrics.)
    """

    log = Logger()

    def __init__(self, clock: IReactorTime) -> None:
        super().__init__()
        self.clock = clock
        # Every endpoint's listen, once started: fires with whether every one listens.
        self._listening: Optional[Deferred[Any]] = None
        # How the last start went (None: every endpoint listens), once known.
        self._outcome: Optional[Tuple[Optional[Failure]]] = None
        self._waiters: List[Deferred[None]] = []
        # What its ssl: endpoints accept (set before the first listen).
        self.tls = TLSPolicy()

    def listen(self, description: str, factory: IProtocolFactory) -> None:
        """Serve C{factory} on the endpoint C{description} while this service runs."""
        endpoint = endpoints.serverFromString(self.clock, description)
        self.tls.apply(endpoint)
        Listener(description, endpoint, factory).setServiceParent(self)

    def listeners(self) -> List[Listener]:
        return [child for child in self if isinstance(child, Listener)]

    def when_listening(self) -> Deferred[None]:
        """
        Fires once every endpoint listens (at once if they do), or fails with
        L{ListenFailed} if one cannot.
        """
        waiting: Deferred[None] = Deferred()
        if self._outcome is None:
            self._waiters.append(waiting)
        elif self._outcome[0] is None:
            waiting.callback(None)
        else:
            waiting.errback(self._outcome[0])
        return waiting

    def _settle(self, failure: Optional[Failure]) -> None:
        self._outcome = (failure,)
        waiters, self._waiters = self._waiters, []
        for waiting in waiters:
            if failure is None:
                waiting.callback(None)
            else:
                waiting.errback(failure)

    def privilegedStartService(self) -> None:
        """
        Listen on every endpoint: twistd calls this before it gives up root
        (C{--uid}), so ports below 1024 can be served.  Raises L{ListenFailed}
        if an endpoint cannot listen, once the others have stopped listening.
        """
        if self._listening is not None:
            return
        self._outcome = None
        super().privilegedStartService()
        settled: List[Tuple[Listener, Optional[Failure]]] = []

        def settle(result: object, listener: Listener) -> None:
            settled.append((listener, result if isinstance(result, Failure) else None))

        outcomes = []
        for listener in self.listeners():
            assert listener.listening is not None
            outcomes.append(listener.listening.addBoth(settle, listener))
        every = gatherResults(outcomes)
        if any(failure is not None for _, failure in settled):
            # (Every endpoint type of Twisted's own listens, or fails to, at once.)
            raise self._failed(settled)
        self._listening = every  # (before its callback, which may run at once)
        every.addCallback(lambda _: self._all_settled(settled, every))

    def _all_settled(self, settled: List[Tuple[Listener, Optional[Failure]]], every: Deferred[Any]) -> bool:
        """Whether every endpoint listens, once each one's listen has settled."""
        if self._listening is not every:
            return False  # stopped before every endpoint listened
        if any(failure is not None for _, failure in settled):
            self._failed(settled)
            return False
        return True

    def _failed(self, settled: List[Tuple[Listener, Optional[Failure]]]) -> ListenFailed:
        """Some endpoints could not listen: say why, and stop the others."""
        error = ListenFailed(
            "; ".join(
                listen_error(listener.description, failure)
                for listener, failure in settled
                if failure is not None and not failure.check(CancelledError)
            )
        )
        self.log.critical("jesync not started: {error}", error=error)
        for listener in self.listeners():
            listener.close_now()
        self._listening = None
        self._settle(Failure(error))
        return error

    def startService(self) -> None:
        """Listen on every endpoint (unless listening already); see L{privilegedStartService}."""
        self.privilegedStartService()
        super().startService()
        assert self._listening is not None
        self._listening.addCallback(self._listening_everywhere)

    def _listening_everywhere(self, everywhere: bool) -> None:
        if everywhere:
            self.listening_everywhere()
            self._settle(None)

    def listening_everywhere(self) -> None:
        """Every endpoint listens (for subclasses: say so, start what depends on it)."""

    def stop_listening(self) -> Deferred[None]:
        """Stop every endpoint (and the other children); starting again listens again."""
        self._listening = None
        stopped: Deferred[None] = super().stopService()
        return stopped


class LockServer(Listeners):
    """
    The listeners of one lock server (L{Listeners}: all of them or none);
    stopping it closes every connection.  Only once every endpoint listens
    does it log its summary.

    Stopping (twistd's SIGTERM or SIGINT) stops listening, closes every
    connection, which releases every lock and cancels every wait, drops the
    clients that do not take their last replies within C{grace} seconds, and
    logs what it released.  A stop that completes is a normal exit: twistd
    then exits with status 0 rather than re-raising the signal.  Another
    SIGTERM or SIGINT during the stop is logged and changes nothing.
    """

    def __init__(self, locks: LockService, policy: ConnectionPolicy, clock: IReactorTime, grace: float = 5.0) -> None:
        super().__init__(clock)
        self.locks = locks
        self.policy = policy
        self.grace = grace
        self.summary = ""
        # The protocol factories by name (None: a protocol not served).
        self.factories: dict[str, Optional[LockServerFactory]] = {}
        # Every registry of connections to close when stopping.
        self.registries = [policy.connections]
        self._started = False

    def listening_everywhere(self) -> None:
        self._started = True
        self.log.info("jesync starting: {summary}", summary=self.summary)

    def stopService(self) -> Deferred[None]:
        self._ignore_further_stop_signals()
        connections = len(self.policy.connections)
        held = self.locks.totals()
        started, self._started = self._started, False
        stopped = self.stop_listening()
        stopped.addCallback(
            lambda _: gatherResults([registry.close_all(self.clock, self.grace) for registry in self.registries])
        )

        def stopped_cleanly(_: object) -> None:
            left = self.locks.totals()
            if started:  # (one that did not start said why)
                self.log.info(
                    "jesync stopped: closed {connections} connections, released {granted} grants and "
                    "{waiting} waits on {keys} keys ({left_granted} grants left, held by embedders)",
                    connections=connections,
                    granted=held.granted - left.granted,
                    waiting=held.waiting - left.waiting,
                    keys=held.keys - left.keys,
                    left_granted=left.granted,
                )
            exit_cleanly(self.clock)

        return stopped.addCallback(stopped_cleanly)

    def _ignore_further_stop_signals(self) -> None:
        ignore_further_stop_signals(self.clock, self.log)


def exit_cleanly(clock: object) -> None:
    """
    twistd re-raises the signal that stopped the reactor once it has run
    (twisted.application.app._exitWithSignal): a shutdown that completed
    is a clean exit (status 0).
    """
    if getattr(clock, "_exitSignal", None) is not None:
        # (a private attribute of twistd's reactor, unknown to IReactorTime)
        setattr(clock, "_exitSignal", None)


def ignore_further_stop_signals(clock: object, log: Logger) -> None:
    """
    The reactor's own SIGTERM handler would stop it again, which fails
    (with a traceback) while it is stopping, and would make twistd
    re-raise the signal at exit: take the signals over for the rest of
    the stop.
    """
    call_from_thread = getattr(clock, "callFromThread", None)
    stopping = getattr(clock, "running", False) and getattr(clock, "_stopped", False)
    if call_from_thread is None or not stopping:
        return  # not a reactor that is shutting down (an embedder stopping this service)

    def already_stopping(number: int, frame: object) -> None:
        call_from_thread(log.info, "received signal {number} while stopping: already stopping", number=number)

    for name in ("SIGTERM", "SIGINT"):
        try:
            signal.signal(getattr(signal, name), already_stopping)
        except (ValueError, OSError):  # not the main thread
            pass
