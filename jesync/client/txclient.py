"""
The Twisted client: the blocking client's operations returning Deferreds,
for C{inlineCallbacks} and C{async def} code on the reactor.

Any number of requests may be outstanding on one connection: a C{lock} that
waits does not hold up the requests made after it, and each reply reaches
the Deferred it answers (see L{jesync.client.pipeline} for how).

    client = TwistedClient(reactor, "127.0.0.1:11400")
    lock = await client.lock("nightly-report", wait=10)
    try:
        ...
    finally:
        await lock.release()
"""

from __future__ import annotations

import logging
import re
import warnings
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional

from twisted.internet import defer, endpoints, task
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import (
    IDelayedCall,
    IHandshakeListener,
    IOpenSSLClientConnectionCreator,
    IReactorTime,
    IStreamClientEndpoint,
    ITCPTransport,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from jesync.client.address import Address, Member, TCPAddress, UNIXAddress
from jesync.client.cluster import Members
from jesync.client.config import ConnectKeywords, ConnectOptions, Servers, client_options
from jesync.client.errors import ClientError, ConnectFailed, ConnectionLost, LockLost, describe
from jesync.client.fleet import Fleet
from jesync.client.group import (
    DROPPED,
    ENDED,
    GROUP_ANSWERS,
    GROUP_ROWS,
    GROUPS_LINE,
    RETRY_JOIN,
    Command,
    GroupOver,
    MembershipLost,
    MemberTracker,
    Membership,
    listed_groups,
)
from jesync.client.handle import LockState
from jesync.client.connection import ConnectionCore
from jesync.client.election import (
    CAMPAIGN_EXPIRES,
    RETRY_CAMPAIGN,
    Candidacy,
    ElectionOver,
    Leader,
    LeaderTracker,
    Leadership,
    holders_marking,
    leader_of,
)
from jesync.client.session import SERVER_CLOSED
from jesync.client.watch import Subscription, subscribe
from jesync.client.wire import (
    PING_KEY,
    check_value,
    Holder,
    Reply,
    UnexpectedReply,
    WatchEvent,
    check_shared,
    lock_arguments,
    lock_many_arguments,
    lock_value,
    watch_arguments,
)
from jesync.listing import sort_listing
from jesync.wire import KeyStatus, ListingOrder

if TYPE_CHECKING:
    from typing_extensions import Unpack


log = logging.getLogger("jesync.client")


class TwistedLock(LockState):
    """
    A lock held through a L{TwistedClient}, on one key or several
    (C{lock_many}).  Lost-lock callbacks run in the reactor.
    """

    def __init__(self, connection: _Connection, reply: Reply, max_concurrent: int, expires: int) -> None:
        super().__init__(reply, str(connection.address), max_concurrent, expires, connection.reactor.seconds)
        self._connection = connection
        self._next_renewal: Optional[IDelayedCall] = None

    def release(self) -> defer.Deferred[bool]:
        """Fires True if the lock was held until now; False if it had been lost or was released already."""
        return self._connection.start(self._connection.session.release, self)

    def renew(self) -> defer.Deferred[None]:
        """Restart the failsafe expiry; fails with L{LockLost} if the lock is not held any more."""
        return self._connection.start(self._connection.session.renew, self)

    def owned(self) -> defer.Deferred[bool]:
        """
        Ask the server whether this connection still holds the lock, as
        L{jesync.client.Lock.owned} does (False if released or lost; if the
        server says not, the lock is lost and its callbacks called).
        """

        def told(result: bool) -> bool:
            self._connection.core.tell_lost()
            return result

        return self._connection.start(self._connection.session.owned, self).addCallback(told)

    def start_renewing(self) -> None:
        """Renew every third of C{expires}, until released or lost."""
        interval = self.renew_interval
        if interval is not None and self.held and self._next_renewal is None:
            self._next_renewal = self._connection.reactor.callLater(interval, self._renew_now, interval)

    def _renew_now(self, interval: float) -> None:
        self._next_renewal = None

        def again(_: None) -> None:
            self.start_renewing()

        self.renew().addCallbacks(again, lambda failure: failure.trap(LockLost) and None)

    def _stop_renewing(self) -> None:
        renewal, self._next_renewal = self._next_renewal, None
        if renewal is not None and renewal.active():
            renewal.cancel()


class TwistedWatch:
    """
    What L{TwistedClient.watch} gives: its callback is called with each
    L{WatchEvent} of a key (or of every key with a prefix), in the reactor,
    in the order of the changes, until L{stop}.

    A watch is bound to its connection, as a lock is: if the connection
    drops (the server went away, a cluster failed over), the watch ends and
    the callbacks given to L{add_lost_callback} are called with the
    L{ConnectionLost} (C{lost_reason}), as a lock's lost callbacks are;
    watch again (which reconnects) to go on.

    It has no queue (unlike the blocking and asyncio watches, which hold at
    most C{max_events} for their reader): the callback is called as each
    event is read, so it never falls behind; a callback that takes long
    holds up the reactor, not memory.
    """

    def __init__(self, key: str, prefix: bool, callback: Callable[[WatchEvent], object]) -> None:
        self.key = key
        self.prefix = prefix
        #: why the watch ended on its own (its connection dropped), or None
        self.lost_reason: Optional[ClientError] = None
        self._callback = callback
        self._subscriptions: list[tuple[_Connection, Subscription]] = []
        self._lost_callbacks: list[Callable[[ClientError], object]] = []
        self._stopped = False

    def __repr__(self) -> str:
        state = " stopped" if self._stopped else " lost" if self.lost_reason else ""
        return f"<TwistedWatch {'prefix' if self.prefix else 'key'} {self.key!r}{state}>"

    @property
    def active(self) -> bool:
        """Neither stopped nor lost."""
        return not self._stopped and self.lost_reason is None

    def _subscribe(self, connection: _Connection) -> defer.Deferred[Any]:
        return connection.start(subscribe(connection, self.key, self.prefix, self._event, self._end, self._subscriptions))

    def _event(self, event: WatchEvent) -> None:
        if not self.active:
            return
        try:
            self._callback(event)
        except Exception:
            log.exception("the watch callback of %r failed", self)

    def _end(self, error: Exception) -> None:
        if not self.active:
            return
        assert isinstance(error, ClientError)
        self.lost_reason = error
        self._unwatch()
        callbacks, self._lost_callbacks = self._lost_callbacks, []
        for callback in callbacks:
            self._call(callback)

    def _call(self, callback: Callable[[ClientError], object]) -> None:
        assert self.lost_reason is not None
        try:
            callback(self.lost_reason)
        except Exception:
            log.exception("a lost-watch callback of %r failed", self)

    def add_lost_callback(self, callback: Callable[[ClientError], object]) -> None:
        """
        Call C{callback(ConnectionLost)} if the watch ends because its
        connection dropped (at once if it already has); never once stopped.
        """
        if self.lost_reason is not None:
            self._call(callback)
        elif not self._stopped:
            self._lost_callbacks.append(callback)

    def stop(self) -> defer.Deferred[bool]:
        """Stop watching: fires True if it was watching until now, False if it had been stopped or lost."""
        was_active = self.active
        self._stopped = True
        self._lost_callbacks.clear()
        return self._unwatch().addCallback(lambda _: was_active)

    @staticmethod
    def _gone(failure: Failure) -> None:
        """An unwatch cut off by its connection: the server's watch went with it."""
        failure.trap(ClientError)

    def _unwatch(self) -> defer.Deferred[None]:
        subscriptions, self._subscriptions = self._subscriptions, []
        unwatched = [
            connection.start(connection.session.unwatch, subscription).addErrback(self._gone)
            for connection, subscription in subscriptions
        ]
        return defer.gatherResults(unwatched).addCallback(lambda _: None)


def _describe_failure(failure: Failure) -> str:
    """L{describe} a Failure's exception (which it always has, though Twisted types it as optional)."""
    error = failure.value
    return describe(error) if error is not None else failure.getErrorMessage()


_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def _tls_options(options: ConnectOptions, address: TCPAddress) -> IOpenSSLClientConnectionCreator:
    """Twisted's TLS client options: trust the CA file (or the platform's store), check the server's name."""
    try:
        from twisted.internet import ssl
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise ConnectFailed(
            str(address), f"TLS needs pyOpenSSL: pip install 'jesync[tls]' ({error})", retryable=False
        ) from None
    trust = None
    if options.tls_ca_file is not None:
        try:
            with open(options.tls_ca_file, "rb") as file:
                blocks = _PEM_CERTIFICATE.findall(file.read())
            if not blocks:
                raise ValueError("no PEM certificate in it")
            trust = ssl.trustRootFromCertificates([ssl.Certificate.loadPEM(block) for block in blocks])
        except (OSError, ValueError) as error:
            raise ConnectFailed(
                str(address), f"cannot use the TLS CA file {options.tls_ca_file}: {describe(error)}", retryable=False
            ) from None
    with warnings.catch_warnings():
        # Twisted 25.5 with pyOpenSSL 25 sets its name-checking callback on a
        # context pyOpenSSL considers in use, and pyOpenSSL warns of it; newer
        # Twisted does not.  Harmless: the callback is set before any connection.
        warnings.filterwarnings("ignore", "Attempting to mutate a Context after a Connection", DeprecationWarning)
        return ssl.optionsForClientTLS(options.server_name(address), trustRoot=trust)


def _is_tls_error(failure: Failure) -> bool:
    """Whether the TLS handshake failed (the certificate or the name did not check out): not worth retrying."""
    try:
        from OpenSSL import SSL
        from service_identity import CertificateError, VerificationError
    except ImportError:  # pragma: no cover
        return False
    return failure.check(SSL.Error, VerificationError, CertificateError) is not None


@implementer(IHandshakeListener)
class _Protocol(Protocol):
    # Set on connecting: a TCP or a UNIX endpoint's, both ITCPTransports.
    transport: ITCPTransport

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        #: over TLS: fires once the TLS handshake is done, fails if the connection is lost before
        self.handshake: Optional[defer.Deferred[None]] = None
        #: why the connection was lost, once it is
        self.lost_reason: Optional[Failure] = None

    def handshakeCompleted(self) -> None:
        if self.handshake is not None and not self.handshake.called:
            self.handshake.callback(None)

    def dataReceived(self, data: bytes) -> None:
        self.connection.data_received(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        why = SERVER_CLOSED if reason.check(ConnectionDone) else _describe_failure(reason)
        self.lost_reason = reason
        if self.handshake is not None and not self.handshake.called:
            self.handshake.errback(reason)
        self.connection.fail(why, lost=True)


class _Connection:
    """
    One connection to one server (or one member of a cluster): a transport
    and its L{ConnectionCore} (the session, its silence and deadlines, on the reactor's timers).
    """

    def __init__(self, address: Member, reactor: IReactorTime, read_timeout: Optional[float]) -> None:
        self.address = address
        self.reactor = reactor
        self.core = ConnectionCore(
            str(address), self._send, self._make_lock, reactor.seconds, read_timeout, self._schedule, self.fail
        )
        self.session = self.core.session
        self._transport: Optional[ITCPTransport] = None
        self.gone: defer.Deferred[None] = defer.Deferred()

    def _schedule(self, delay: float, function: Callable[[], None]) -> Callable[[], None]:
        call = self.reactor.callLater(delay, function)

        def cancel() -> None:
            if call.active():
                call.cancel()

        return cancel

    @classmethod
    def open(
        cls,
        reactor: IReactorTime,
        address: Member,
        options: ConnectOptions,
        connect_timeout: Optional[float],
        read_timeout: Optional[float],
        confirm: bool = False,
    ) -> defer.Deferred[_Connection]:
        """
        Connect (with TLS and auth if C{options} say so; with C{confirm},
        until the server answers); fails with L{ConnectFailed}.
        """
        return defer.ensureDeferred(cls._open(reactor, address, options, connect_timeout, read_timeout, confirm))

    @classmethod
    async def _open(
        cls,
        reactor: IReactorTime,
        address: Member,
        options: ConnectOptions,
        connect_timeout: Optional[float],
        read_timeout: Optional[float],
        confirm: bool,
    ) -> _Connection:
        try:
            token = options.token()
        except ValueError as error:
            raise ConnectFailed(str(address), str(error), retryable=False) from None
        connection = cls(address, reactor, read_timeout)
        # Twisted's endpoints always have a timeout: 30 s is theirs.
        timeout = 30.0 if connect_timeout is None else connect_timeout
        start = reactor.seconds()
        endpoint: IStreamClientEndpoint
        tls = options.uses_tls(address)
        if isinstance(address, UNIXAddress):
            endpoint = endpoints.UNIXClientEndpoint(reactor, address.path, timeout=timeout)
        else:
            endpoint = endpoints.HostnameEndpoint(reactor, address.host, address.port, timeout=timeout)
            if tls:
                endpoint = endpoints.wrapClientTLS(_tls_options(options, address), endpoint)
        protocol = _Protocol(connection)
        if tls:
            handshake: defer.Deferred[None] = defer.Deferred()
            protocol.handshake = handshake
        try:
            await endpoints.connectProtocol(endpoint, protocol)
        except BaseException as error:
            if protocol.handshake is not None:
                protocol.handshake.addErrback(lambda _: None)  # nobody will wait for it
            if isinstance(error, Exception) and not isinstance(error, defer.CancelledError):
                raise ConnectFailed(str(address), f"cannot connect: {describe(error)}") from None
            raise
        connection._transport = protocol.transport
        # The TLS handshake and the answer to auth get what is left of the connect timeout.
        timer = reactor.callLater(
            max(0.0, timeout - (reactor.seconds() - start)), connection.fail, f"no answer within {timeout:g} s"
        )
        try:
            if tls:
                try:
                    await handshake
                except defer.CancelledError:
                    raise
                except Exception:
                    failure = Failure()
                    raise ConnectFailed(
                        str(address), f"TLS failed: {_describe_failure(failure)}", retryable=not _is_tls_error(failure)
                    ) from None
            # auth (with a token) and fencing on, first on the connection; an
            # older server refuses fencing, and then grants have no tokens.
            try:
                await connection.start(
                    lambda on_result, on_error: connection.session.handshake(token, on_result, on_error, confirm)
                )
            except ConnectFailed:
                raise
            except ConnectionLost as error:
                # (Some Twisted versions check the certificate's name just after the handshake.)
                lost = protocol.lost_reason
                if tls and lost is not None and _is_tls_error(lost):
                    raise ConnectFailed(str(address), f"TLS failed: {error.reason}", retryable=False) from None
                raise ConnectFailed(str(address), f"cannot connect: {error.reason}") from None
        except BaseException:
            connection.fail("connecting failed")
            raise
        finally:
            if timer.active():
                timer.cancel()
        connection.core.watch_silence()
        return connection

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> TwistedLock:
        return TwistedLock(self, reply, max_concurrent, expires)

    @property
    def closed(self) -> bool:
        return self.session.closed

    # -- requests --------------------------------------------------------

    def start(
        self,
        operation: Callable[..., None],
        *args: Any,
        canceller: Optional[Callable[[defer.Deferred[Any]], None]] = None,
    ) -> defer.Deferred[Any]:
        """Make a session request; the Deferred fires with its result."""
        deferred: defer.Deferred[Any] = defer.Deferred(canceller)

        def succeed(result: object) -> None:
            if not deferred.called:
                deferred.callback(result)

        def fail(error: Exception) -> None:
            if not deferred.called:
                deferred.errback(error)

        try:
            self.core.start(operation, *args, succeed, fail)
        except Exception:
            return defer.fail()
        return deferred

    def lock(
        self,
        key: str,
        max_concurrent: int,
        timeout: int,
        expires: int,
        shared: bool = False,
        value: Optional[bytes] = None,
    ) -> defer.Deferred[TwistedLock]:
        return self._acquire(key, partial(self.session.lock, shared=shared, value=value), key, max_concurrent, timeout, expires)

    def lock_many(
        self, keys: tuple[str, ...], timeout: int, expires: int, shared: bool = False
    ) -> defer.Deferred[TwistedLock]:
        return self._acquire(keys[0], partial(self.session.lock_many, shared=shared), keys, timeout, expires)

    def _acquire(self, key: str, operation: Callable[..., None], *args: Any) -> defer.Deferred[TwistedLock]:
        """Make a lock request (for C{key}, and others with it); the Deferred fires with the lock."""

        def give_up(_: defer.Deferred[Any]) -> None:
            # The server cannot be told: whatever it grants later is released at once.
            self.session.give_up(key)

        return self.start(operation, *args, canceller=give_up)

    # -- the transport ---------------------------------------------------

    def _send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            self.core.received(data)
        except UnexpectedReply as error:
            self.fail(str(error))

    def fail(self, reason: str, lost: bool = False) -> None:
        """Close the connection (C{lost}: it has closed): outstanding requests fail, held locks are lost."""
        self.core.fail(reason, by_server=lost)
        if lost:
            if not self.gone.called:
                self.gone.callback(None)
        elif self._transport is not None:
            self._transport.abortConnection()
        self.core.tell_lost()


class TwistedClient:
    """
    A Twisted client of one or more JESync servers; the arguments after the
    reactor are L{jesync.client.Client}'s (servers, auth token file, TLS and
    retries from the environment when not given, likewise; TLS needs
    pyOpenSSL: C{pip install 'jesync[tls]'}).  Connections open on first use.
    A cluster's members (C{"a:11400|b:11400|c:11400"}) are failed over as
    L{jesync.client.Client} says.
    """

    def __init__(
        self,
        reactor: IReactorTime,
        servers: Optional[Servers] = None,
        *,
        placement: str = "consistent",
        options: Optional[ConnectOptions] = None,
        environ: Optional[Mapping[str, str]] = None,
        **keywords: Unpack[ConnectKeywords],
    ) -> None:
        self.reactor = reactor
        servers, self.options = client_options(servers, options, environ, keywords)
        self._fleet = Fleet(servers, placement)
        self.servers = self._fleet.servers
        self.connect_timeout = self.options.connect_timeout
        self.read_timeout = self.options.read_timeout
        self._members = [Members(address) for address in self.servers]
        self._connections: list[Optional[_Connection]] = [None] * len(self.servers)
        # index -> (the connection attempt, the requests waiting for it)
        self._opening: dict[int, tuple[defer.Deferred[_Connection], list[defer.Deferred[_Connection]]]] = {}
        # the pauses between connection attempts, cancelled by close()
        self._pauses: set[defer.Deferred[None]] = set()
        # the candidacies and memberships kept over this client (keep_campaigning, keep_joined): close() stops them
        self._kept: weakref.WeakSet[Any] = weakref.WeakSet()

    def server_for(self, key: str) -> Address:
        """The server C{key} lives on."""
        return self._fleet.server_for(key)

    def _connection(self, index: int, wait: Optional[float] = None) -> defer.Deferred[_Connection]:
        """The open connection, or a new one, retrying failed attempts within C{wait} (see L{Client})."""
        connection = self._connections[index]
        if connection is not None and not connection.closed:
            return defer.succeed(connection)
        return defer.ensureDeferred(self._connect_retrying(index, wait))

    async def _connect_retrying(self, index: int, wait: Optional[float]) -> _Connection:
        attempts = self._members[index].attempts(self.options.backoff(wait, self.reactor.seconds()))
        while True:
            try:
                return await self._connect_once(index, attempts.member)
            except ConnectFailed as error:
                pause = attempts.failed(error, self.reactor.seconds())
                if pause is None:
                    raise attempts.error()
                if not pause:
                    continue
                sleeping = task.deferLater(self.reactor, pause, lambda: None)
                self._pauses.add(sleeping)
                try:
                    await sleeping
                finally:
                    self._pauses.discard(sleeping)

    def _connect_once(self, index: int, member: Member) -> defer.Deferred[_Connection]:
        """The open connection, or a new one to C{member} (unless another caller is already connecting)."""
        connection = self._connections[index]
        if connection is not None and not connection.closed:
            return defer.succeed(connection)
        waiter: defer.Deferred[_Connection] = defer.Deferred()
        if index not in self._opening:
            opening = _Connection.open(
                self.reactor,
                member,
                self.options,
                self.connect_timeout,
                self.read_timeout,
                self._members[index].is_cluster,
            )
            self._opening[index] = (opening, [])
            opening.addBoth(self._opened, index)
        self._opening[index][1].append(waiter)
        return waiter

    def _opened(self, result: _Connection | Failure, index: int) -> None:
        _, waiters = self._opening.pop(index)
        if isinstance(result, _Connection):
            self._connections[index] = result
            self._members[index].answered(result.address)
        for waiter in waiters:
            if not waiter.called:
                if isinstance(result, Failure):
                    waiter.errback(result)
                else:
                    waiter.callback(result)

    def _call(
        self, index: int, request: Callable[[_Connection], defer.Deferred[Any]], wait: Optional[float] = None
    ) -> defer.Deferred[Any]:
        return self._connection(index, wait).addCallback(request)

    def lock(
        self,
        key: str,
        max_concurrent: int = 1,
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
        shared: bool = False,
        value: bytes | str | None = None,
    ) -> defer.Deferred[TwistedLock]:
        """
        Acquire C{key}, as L{jesync.client.Client.lock} does (C{shared} and
        C{value} too); the Deferred fires with a L{TwistedLock} or fails
        with the same exceptions.

        Cancelling the Deferred cannot withdraw the request from the server:
        if it is granted later it is released at once, and until the server
        answers, this client refuses another C{lock} for the key with
        L{KeyBusy}.  Prefer C{wait=}.
        """
        try:
            arguments = lock_arguments(max_concurrent, wait, expires)
            checked = lock_value(key, value, check_shared(shared, max_concurrent))
            index = self._fleet.index_for(key)
        except Exception:
            return defer.fail()

        return self._call(
            index, lambda connection: connection.lock(key, *arguments, shared, checked), wait
        ).addCallback(self._renewing, auto_renew)

    def lock_many(
        self,
        keys: Iterable[str],
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
        shared: bool = False,
    ) -> defer.Deferred[TwistedLock]:
        """
        Acquire every one of C{keys}, all or nothing, as
        L{jesync.client.Client.lock_many} does (C{shared} too); the Deferred fires with one
        L{TwistedLock} for them all (C{lock.tokens} has each key's fencing
        token) or fails with the same exceptions.  Cancelling it is as for
        L{lock}.
        """
        try:
            distinct, timeout, expires_ = lock_many_arguments(keys, wait, expires, check_shared(shared))
            index = self._fleet.index_for_all(distinct)
        except Exception:
            return defer.fail()
        return self._call(
            index, lambda connection: connection.lock_many(distinct, timeout, expires_, shared), wait
        ).addCallback(self._renewing, auto_renew)

    @staticmethod
    def _renewing(lock: TwistedLock, auto_renew: bool) -> TwistedLock:
        if auto_renew:
            lock.start_renewing()
        return lock

    def status(self, key: str) -> defer.Deferred[KeyStatus]:
        """How many hold C{key} and how many wait for it."""
        try:
            index = self._fleet.index_for(key)
        except Exception:
            return defer.fail()
        return self._call(index, lambda connection: connection.start(connection.session.status, key))

    def holders(self, key: str) -> defer.Deferred[list[Holder]]:
        """Who holds C{key} and since when, as L{jesync.client.Client.holders}."""
        try:
            index = self._fleet.index_for(key)
        except Exception:
            return defer.fail()
        return self._call(index, lambda connection: connection.start(connection.session.holders, key))

    def watch(
        self,
        key: Optional[str] = None,
        callback: Optional[Callable[[WatchEvent], object]] = None,
        *,
        prefix: Optional[str] = None,
        route_by: Optional[str] = None,
    ) -> defer.Deferred[TwistedWatch]:
        """
        Watch C{key}, or every key starting with C{prefix} (C{""}: every
        key), as L{jesync.client.Client.watch} does (C{route_by} too): C{callback(event)} is
        called with each L{WatchEvent}.  The Deferred fires with the
        L{TwistedWatch} (C{stop()} it; C{add_lost_callback} to hear of its
        connection dropping) once the server watches, or fails as
        L{jesync.client.Client.watch} raises.
        """
        try:
            what, is_prefix = watch_arguments(key, prefix)
            if not callable(callback):
                raise TypeError("watch needs a callback, called with each event")
            indexes = self._fleet.watched(what, is_prefix, route_by)
        except Exception:
            return defer.fail()
        return defer.ensureDeferred(self._watch(TwistedWatch(what, is_prefix, callback), indexes))

    async def _watch(self, watch: TwistedWatch, indexes: list[int]) -> TwistedWatch:
        try:
            for index in indexes:
                connection = await self._connection(index)
                await watch._subscribe(connection)
        except BaseException:
            await watch.stop()
            raise
        return watch

    def group(self, name: str) -> TwistedGroup:
        """
        Group C{name} on these servers (L{TwistedGroup}):
        L{jesync.client.Client.group}'s operations returning Deferreds.
        Raise ValueError for a name that cannot be a group's (a C{/}).
        """
        return TwistedGroup(self, name)

    def groups(self) -> defer.Deferred[list[str]]:
        """Every group on every server, sorted."""
        return defer.ensureDeferred(self._groups())

    async def _groups(self) -> list[str]:
        names: list[str] = []
        for index in range(len(self.servers)):
            connection = await self._connection(index)
            reply = await connection.start(connection.session.extension, GROUPS_LINE, GROUP_ANSWERS, GROUP_ROWS)
            names.extend(listed_groups(reply))
        return sorted(names)

    def _extension_request(
        self, key: str, line: bytes, answers: frozenset[str], rows: frozenset[str]
    ) -> defer.Deferred[tuple[str, list[bytes], list[list[bytes]]]]:
        """Send an extension command (C{line}) to the server of C{key}; fires with its reply's word, fields and rows."""
        try:
            index = self._fleet.index_for(key)
        except Exception:
            return defer.fail()
        return self._call(index, lambda connection: connection.start(connection.session.extension, line, answers, rows))

    def listing(self, order: ListingOrder = "key") -> defer.Deferred[list[KeyStatus]]:
        """Every key in use on every server, in C{order} (C{"key"}, C{"requests"}, C{"grants"})."""
        return defer.ensureDeferred(self._listing(order))

    async def _listing(self, order: ListingOrder) -> list[KeyStatus]:
        rows: list[KeyStatus] = []
        for index in range(len(self.servers)):
            connection = await self._connection(index)
            rows.extend(await connection.start(connection.session.listing, order))
        return sort_listing(rows, order)

    def ping(self) -> defer.Deferred[dict[str, float]]:
        """The round-trip time of one request to each server, in seconds."""
        return defer.ensureDeferred(self._ping())

    async def _ping(self) -> dict[str, float]:
        times = {}
        for index, address in enumerate(self.servers):
            connection = await self._connection(index)
            start = self.reactor.seconds()
            await connection.start(connection.session.status, PING_KEY)
            times[str(address)] = self.reactor.seconds() - start
        return times

    def close(self) -> defer.Deferred[None]:
        """
        Close every connection (the server releases everything held through
        them); fires once closed.  As L{jesync.client.Client.close}: the
        candidacies and memberships kept over this client stop first.
        """
        for kept in list(self._kept):
            kept._halt()
        for opening, _ in list(self._opening.values()):
            opening.cancel()
        for pause in list(self._pauses):
            pause.cancel()
        gone = []
        for index, connection in enumerate(self._connections):
            if connection is not None:
                connection.fail("the client was closed")
                gone.append(connection.gone)
            self._connections[index] = None
        return defer.gatherResults(gone).addCallback(lambda _: None)


class TwistedGroup(GroupOver):
    """
    Group C{name} on a L{TwistedClient} (C{client.group(name)}):
    L{jesync.client.group.Group}'s operations, each returning a Deferred
    that fires with its result or fails with its error; L{watch} with a
    callback.
    """

    client: TwistedClient

    def _run(self, command: Command) -> defer.Deferred[Any]:
        return self.client._extension_request(self.key, command.line, GROUP_ANSWERS, GROUP_ROWS).addCallback(
            command.interpret
        )

    def watch(self, callback: Callable[[WatchEvent], object]) -> defer.Deferred[TwistedWatch]:
        """
        As L{jesync.client.group.Group.watch}: C{callback(event)} with each
        join (C{granted}) and leave (C{released}, C{expired}, C{lost}) of
        this group's members; fires with the L{TwistedWatch} (C{stop()} it).
        """
        return self.client.watch(callback=callback, prefix=self._watched_prefix())

    def keep_joined(
        self,
        member: str,
        capabilities: bytes | str | None = None,
        lease: float = 0,
        on_joined: Optional[Callable[[TwistedMembership], object]] = None,
        on_lost: Optional[Callable[[MembershipLost], object]] = None,
        retry: float = RETRY_JOIN,
    ) -> TwistedMembership:
        """
        As L{jesync.client.group.Group.keep_joined}, in the reactor: a
        L{TwistedMembership} (its C{update} and C{stop} return Deferreds).
        """
        membership: TwistedMembership = self._keep(
            TwistedMembership, member, capabilities, lease, on_joined, on_lost, retry
        )
        return membership


class TwistedElection(ElectionOver["TwistedClient"]):
    """
    An election over a L{TwistedClient} (the rules:
    L{jesync.client.election}): L{jesync.client.election.Election}'s
    operations returning Deferreds, and L{observe} with a callback.
    """

    def campaign(
        self, value: bytes | str | None, expires: Optional[float] = CAMPAIGN_EXPIRES, wait: Optional[float] = None
    ) -> defer.Deferred[Leadership[TwistedLock]]:
        """
        As L{jesync.client.election.Election.campaign}: fires with the
        L{Leadership} (its C{resign()} returns a Deferred) once this
        candidate leads, or fails as C{lock} does.
        """
        locked: defer.Deferred[TwistedLock] = self._campaign_lock(value, expires, wait)
        return locked.addCallback(lambda lock: Leadership(self.name, lock))

    def leader(self) -> defer.Deferred[Optional[Leader]]:
        """The leader now, or None."""
        return self.client.holders(self.key).addCallback(leader_of)

    def keep_campaigning(
        self,
        value: bytes | str | None,
        on_elected: Callable[[Leadership[TwistedLock]], object],
        on_lost: Optional[Callable[[LockLost], object]] = None,
        expires: Optional[float] = CAMPAIGN_EXPIRES,
        retry: float = RETRY_CAMPAIGN,
    ) -> TwistedCandidacy:
        """
        As L{jesync.client.election.Election.keep_campaigning}, in the
        reactor: a L{TwistedCandidacy} (its C{stop()} returns a Deferred).
        """
        return TwistedCandidacy(self, value, on_elected, on_lost, expires, retry).start()

    def observe(
        self,
        callback: Callable[[Optional[Leader]], object],
        on_lost: Optional[Callable[[ClientError], object]] = None,
    ) -> defer.Deferred[TwistedWatch]:
        """
        Call C{callback} with the leader (a L{Leader}, or None: no leader)
        once the server watches the election and has said who leads, then
        with each change, in order (an exception it raises is logged).
        Fires with the L{TwistedWatch} under it (C{stop()} it) after the
        first call.  Bound to its connection, as the other clients'
        observations are (which end with L{ConnectionLost}): if the
        connection drops, the observation ends and C{on_lost} is called
        with the L{ConnectionLost} (without C{on_lost}, the loss is logged
        as a warning: never silence); observe again (which reconnects) to
        go on.  Never called once stopped.
        """
        tracker = LeaderTracker()

        def tell(leader: Optional[Leader]) -> None:
            try:
                callback(leader)
            except Exception:
                log.exception("the observe callback of %r failed", self)

        def told(event: WatchEvent) -> None:
            # Before the holders answer (the tracker not started), an event
            # is one the answer counts: ignored (jesync.client.election).
            if tracker.told(event):
                tell(tracker.leader)

        def answered(holders: list[Holder]) -> None:
            tell(tracker.start(holders))

        def lost_unheard(error: ClientError) -> None:
            log.warning("observing the election %r: %s; no longer observing", self.name, describe(error))

        async def start() -> TwistedWatch:
            watch = await self.client.watch(self.key, told)
            try:
                index = self.client._fleet.index_for(self.key)
                await self.client._call(
                    index, lambda connection: connection.start(holders_marking(connection, self.key, answered))
                )
            except BaseException:
                await watch.stop()
                raise
            watch.add_lost_callback(on_lost if on_lost is not None else lost_unheard)
            return watch

        return defer.ensureDeferred(start())


class TwistedCandidacy(Candidacy[TwistedLock]):
    """
    L{jesync.client.election.Candidacy} over a L{TwistedClient}: its
    campaigns and callbacks run in the reactor; it campaigns again as soon
    as the loss is told (the client reconnects then).
    """

    election: TwistedElection

    def start(self) -> TwistedCandidacy:
        self._pending: Optional[defer.Deferred[Any]] = None
        self._kept()
        self._campaign()
        return self

    def _halt(self) -> None:
        super()._halt()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()

    def _campaign(self) -> None:
        if self.stopped:
            return
        self._pending = self.election.campaign(self.value, self.expires)
        self._pending.addCallbacks(self._won, self._refused)

    def _won(self, leadership: Leadership[TwistedLock]) -> None:
        self._pending = None
        if self.stopped:  # (a cancelled campaign never fires; this is one granted in the same turn)
            leadership.resign()
            return

        def ended(_: LockLost) -> None:
            if self.leadership is leadership and self._ended(leadership):
                self._campaign()

        leadership._on_resign.append(lambda: self._resigned(leadership))
        self._elected(leadership)
        leadership.add_lost_callback(ended)  # (after: a leadership already lost is told after it was won)

    def _resigned(self, leadership: Leadership[TwistedLock]) -> None:
        if self.leadership is leadership:
            self._ended(leadership)

    def _refused(self, failure: Failure) -> None:
        self._pending = None
        if failure.check(defer.CancelledError) or self.stopped:
            return
        error = failure.value
        if not isinstance(error, ClientError):
            log.error("campaigning in the election %r: %s; stopped", self.election.name, _describe_failure(failure))
            self.stopped = True
            return
        self._failed(error)
        self._pending = task.deferLater(self.election.client.reactor, self.retry, self._campaign)
        self._pending.addErrback(lambda failure: failure.trap(defer.CancelledError))

    def stop(self) -> defer.Deferred[bool]:
        """
        Stop campaigning (a queued campaign is withdrawn as a cancelled
        C{lock} is: released at once if granted later) and resign if
        leading; fires with whether a leadership was resigned.
        """
        self.stopped = True
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
        leadership, self.leadership = self.leadership, None
        if leadership is None or not leadership.held:
            return defer.succeed(False)
        return leadership.resign().addErrback(lambda failure: failure.trap(ClientError) and False)


class TwistedMembership(Membership):
    """
    L{jesync.client.group.Membership} over a L{TwistedClient}: it joins,
    heartbeats and watches in the reactor, and joins again as soon as a
    loss is told (the client reconnects then), then every C{retry} seconds
    while that fails.
    """

    group: TwistedGroup

    def start(self) -> TwistedMembership:
        self._watch: Optional[TwistedWatch] = None
        self._pending: Optional[defer.Deferred[Any]] = None
        self._heartbeat: Optional[Any] = None
        # whether _pending is a join that may be on its way to the server (then stop() must not cancel it)
        self._in_join = False
        self._kept()
        self._join()
        return self

    def _halt(self) -> None:
        super()._halt()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
        self._quiet()

    def _quiet(self) -> None:
        """Cancel the next heartbeat and stop the watch of its key."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()

    def _join(self) -> None:
        if self.stopped:
            return
        self._in_join = True
        self._pending = defer.ensureDeferred(self._joining())
        self._pending.addCallbacks(self._member_now, self._refused)

    async def _joining(self) -> TwistedWatch:
        tracker = MemberTracker()
        turn = self.joins + 1  # (the turn this join starts: _joined counts it)

        def told(event: WatchEvent) -> None:
            if tracker.ended(event):
                self._ended(turn, ENDED)

        watch = await self.group.client.watch(callback=told, **self._watch_arguments())
        try:
            await self._join_steps()
        except BaseException:
            await watch.stop()
            raise
        return watch

    def _member_now(self, watch: TwistedWatch) -> Optional[defer.Deferred[Any]]:
        self._pending = None
        self._in_join = False
        if self.stopped:  # (stopped while the join was on its way: it landed, so leave)
            watch.stop()
            return self.group.leave(self.member).addErrback(lambda failure: failure.trap(ClientError))
        self._watch = watch
        self._joined()
        turn = self.joins
        watch.add_lost_callback(lambda _: self._ended(turn, DROPPED))
        self._beat(turn)
        return None

    def _beat(self, turn: int) -> None:
        interval = self.heartbeat_interval
        if interval is None or self.stopped or turn != self.joins or not self.joined:
            return

        def answered(still: bool) -> None:
            if not still:
                self._ended(turn, ENDED)
            else:
                self._beat(turn)

        def dropped(failure: Failure) -> None:
            failure.trap(ClientError)
            self._ended(turn, DROPPED)

        def beat() -> None:
            self._heartbeat = None
            self.group.heartbeat(self.member, self.lease).addCallbacks(answered, dropped)

        self._heartbeat = self.group.client.reactor.callLater(interval, beat)

    def _ended(self, turn: int, why: str) -> None:
        """Turn C{turn}'s membership ended (told once, whichever notices first), then join again."""
        if self.stopped or turn != self.joins or not self.joined:
            return
        self._quiet()
        self._lost(why)
        self._join()

    def _refused(self, failure: Failure) -> None:
        self._pending = None
        self._in_join = False
        if failure.check(defer.CancelledError) or self.stopped:
            return
        if not failure.check(ClientError):
            log.error("joining group %r as %r: %s; stopped", self.group.name, self.member, _describe_failure(failure))
            self.stopped = True
            return
        self._failed(failure.value)  # type: ignore[arg-type]
        self._pending = task.deferLater(self.group.client.reactor, self.retry, self._join)
        self._pending.addErrback(lambda failure: failure.trap(defer.CancelledError))

    def update(self, capabilities: bytes | str | None) -> defer.Deferred[None]:
        """
        As L{jesync.client.group.BlockingMembership.update}: fires when
        done, or fails with L{MembershipLost}.
        """
        try:
            self.capabilities = check_value(capabilities)
        except Exception:
            return defer.fail()
        if not self.joined:
            return defer.fail(self._not_joined())

        def refused(failure: Failure) -> None:
            failure.trap(ClientError)
            raise self._not_joined() from failure.value

        return self.group.update(self.member, self.capabilities).addErrback(refused)

    def stop(self) -> defer.Deferred[bool]:
        """
        Stop keeping the membership and leave the group; fires with whether
        it was a member until now.  A join on its way to the server is not
        cancelled (it could land all the same, and leave a member behind):
        it is awaited, and left if it landed.
        """
        self.stopped = True
        pending, self._pending = self._pending, None
        if pending is not None and self._in_join:
            return pending.addBoth(lambda _: False)
        if pending is not None:
            pending.cancel()
        self._quiet()
        was_joined, self.joined = self.joined, False
        if not was_joined:
            return defer.succeed(False)
        return self.group.leave(self.member).addCallbacks(
            lambda _: True, lambda failure: failure.trap(ClientError) and False
        )
