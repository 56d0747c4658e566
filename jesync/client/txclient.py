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

from typing import Any, Callable, Iterable, Optional, Sequence

from twisted.internet import defer, endpoints
from twisted.internet.interfaces import IDelayedCall, IReactorTime, IStreamClientEndpoint, ITCPTransport
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from jesync.client.address import DEFAULT_SERVER, Address, UNIXAddress
from jesync.client.errors import ConnectFailed, LockLost, describe
from jesync.client.fleet import Fleet
from jesync.client.handle import LockState
from jesync.client.pipeline import discard
from jesync.client.session import Session
from jesync.client.wire import PING_KEY, LineSplitter, Reply, UnexpectedReply, lock_arguments, lock_many_arguments
from jesync.listing import sort_listing
from jesync.wire import KeyStatus, ListingOrder


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


def _describe_failure(failure: Failure) -> str:
    """L{describe} a Failure's exception (which it always has, though Twisted types it as optional)."""
    error = failure.value
    return describe(error) if error is not None else failure.getErrorMessage()


class _Protocol(Protocol):
    # Set on connecting: a TCP or a UNIX endpoint's, both ITCPTransports.
    transport: ITCPTransport

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection

    def dataReceived(self, data: bytes) -> None:
        self.connection.data_received(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        why = "the server closed the connection" if reason.check(ConnectionDone) else _describe_failure(reason)
        self.connection.fail(why, lost=True)


class _Connection:
    """One connection to one server: a transport and its L{Session}."""

    def __init__(self, address: Address, reactor: IReactorTime, read_timeout: Optional[float]) -> None:
        self.address = address
        self.reactor = reactor
        self.session = Session(str(address), self._send, self._make_lock)
        self._read_timeout = read_timeout
        self._transport: Optional[ITCPTransport] = None
        self._splitter = LineSplitter()
        self._silence: Optional[IDelayedCall] = None
        self.gone: defer.Deferred[None] = defer.Deferred()

    @classmethod
    def open(
        cls, reactor: IReactorTime, address: Address, connect_timeout: Optional[float], read_timeout: Optional[float]
    ) -> defer.Deferred[_Connection]:
        connection = cls(address, reactor, read_timeout)
        # Twisted's endpoints always have a timeout: 30 s is theirs.
        timeout = 30.0 if connect_timeout is None else connect_timeout
        endpoint: IStreamClientEndpoint
        if isinstance(address, UNIXAddress):
            endpoint = endpoints.UNIXClientEndpoint(reactor, address.path, timeout=timeout)
        else:
            endpoint = endpoints.HostnameEndpoint(reactor, address.host, address.port, timeout=timeout)

        def connected(protocol: _Protocol) -> _Connection:
            connection._transport = protocol.transport
            # Pipelined: nothing waits for its answer (an older server refuses it, and then grants have no tokens).
            connection.session.enable_fencing(discard, discard)
            connection._watch_silence()
            return connection

        def failed(failure: Failure) -> Failure:
            if failure.check(defer.CancelledError):
                return failure
            raise ConnectFailed(str(address), f"cannot connect: {_describe_failure(failure)}")

        return endpoints.connectProtocol(endpoint, _Protocol(connection)).addCallbacks(connected, failed)

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> TwistedLock:
        return TwistedLock(self, reply, max_concurrent, expires)

    @property
    def closed(self) -> bool:
        return self.session.closed

    # -- requests --------------------------------------------------------

    def start(
        self, operation: Callable[..., None], *args: Any, canceller: Optional[Callable[[defer.Deferred[Any]], None]] = None
    ) -> defer.Deferred[Any]:
        """Make a session request; the Deferred fires with its result."""
        deferred: defer.Deferred[Any] = defer.Deferred(canceller)

        def succeed(result: object) -> None:
            if not deferred.called:
                deferred.callback(result)

        def fail(error: Exception) -> None:
            if not deferred.called:
                deferred.errback(error)

        owed = self.session.pipeline.owes_reply
        try:
            operation(*args, succeed, fail)
        except Exception:
            return defer.fail()
        if not owed:
            self._watch_silence()
        return deferred

    def lock(self, key: str, max_concurrent: int, timeout: int, expires: int) -> defer.Deferred[TwistedLock]:
        return self._acquire(key, self.session.lock, key, max_concurrent, timeout, expires)

    def lock_many(self, keys: tuple[str, ...], timeout: int, expires: int) -> defer.Deferred[TwistedLock]:
        return self._acquire(keys[0], self.session.lock_many, keys, timeout, expires)

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
            for line in self._splitter.feed(data):
                self.session.line_received(line)
        except UnexpectedReply as error:
            self.fail(str(error))
            return
        self._watch_silence()
        self._tell_lost()

    def _watch_silence(self) -> None:
        """While the server owes a reply, give up on it after read_timeout seconds of silence."""
        if self._silence is not None and self._silence.active():
            self._silence.cancel()
        self._silence = None
        if self._read_timeout is not None and self.session.pipeline.owes_reply and not self.closed:
            self._silence = self.reactor.callLater(self._read_timeout, self._silent)

    def _silent(self) -> None:
        self._silence = None
        self.fail(f"no reply within {self._read_timeout:g} s")

    def _tell_lost(self) -> None:
        for lock in self.session.take_lost():
            lock._notify_lost()

    def fail(self, reason: str, lost: bool = False) -> None:
        """Close the connection (C{lost}: it has closed): outstanding requests fail, held locks are lost."""
        if self._silence is not None and self._silence.active():
            self._silence.cancel()
        self._silence = None
        self.session.fail(reason)
        if lost:
            if not self.gone.called:
                self.gone.callback(None)
        elif self._transport is not None:
            self._transport.abortConnection()
        self._tell_lost()


class TwistedClient:
    """
    A Twisted client of one or more JESync servers; the arguments after the
    reactor are L{jesync.client.Client}'s.  Connections open on first use.
    """

    def __init__(
        self,
        reactor: IReactorTime,
        servers: str | Sequence[str] = DEFAULT_SERVER,
        *,
        placement: str = "consistent",
        connect_timeout: Optional[float] = 5.0,
        read_timeout: Optional[float] = 10.0,
    ) -> None:
        self.reactor = reactor
        self._fleet = Fleet(servers, placement)
        self.servers = self._fleet.servers
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._connections: list[Optional[_Connection]] = [None] * len(self.servers)
        # index -> (the connection attempt, the requests waiting for it)
        self._opening: dict[int, tuple[defer.Deferred[_Connection], list[defer.Deferred[_Connection]]]] = {}

    def server_for(self, key: str) -> Address:
        """The server C{key} lives on."""
        return self._fleet.server_for(key)

    def _connection(self, index: int) -> defer.Deferred[_Connection]:
        connection = self._connections[index]
        if connection is not None and not connection.closed:
            return defer.succeed(connection)
        waiter: defer.Deferred[_Connection] = defer.Deferred()
        if index not in self._opening:
            opening = _Connection.open(self.reactor, self.servers[index], self.connect_timeout, self.read_timeout)
            self._opening[index] = (opening, [])
            opening.addBoth(self._opened, index)
        self._opening[index][1].append(waiter)
        return waiter

    def _opened(self, result: _Connection | Failure, index: int) -> None:
        _, waiters = self._opening.pop(index)
        if isinstance(result, _Connection):
            self._connections[index] = result
        for waiter in waiters:
            if not waiter.called:
                if isinstance(result, Failure):
                    waiter.errback(result)
                else:
                    waiter.callback(result)

    def _call(self, index: int, request: Callable[[_Connection], defer.Deferred[Any]]) -> defer.Deferred[Any]:
        return self._connection(index).addCallback(request)

    def lock(
        self,
        key: str,
        max_concurrent: int = 1,
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
    ) -> defer.Deferred[TwistedLock]:
        """
        Acquire C{key}, as L{jesync.client.Client.lock} does; the Deferred
        fires with a L{TwistedLock} or fails with the same exceptions.

        Cancelling the Deferred cannot withdraw the request from the server:
        if it is granted later it is released at once, and until the server
        answers, this client refuses another C{lock} for the key with
        L{KeyBusy}.  Prefer C{wait=}.
        """
        try:
            arguments = lock_arguments(max_concurrent, wait, expires)
            index = self._fleet.index_for(key)
        except Exception:
            return defer.fail()

        return self._call(index, lambda connection: connection.lock(key, *arguments)).addCallback(
            self._renewing, auto_renew
        )

    def lock_many(
        self,
        keys: Iterable[str],
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
    ) -> defer.Deferred[TwistedLock]:
        """
        Acquire every one of C{keys}, all or nothing, as
        L{jesync.client.Client.lock_many} does; the Deferred fires with one
        L{TwistedLock} for them all (C{lock.tokens} has each key's fencing
        token) or fails with the same exceptions.  Cancelling it is as for
        L{lock}.
        """
        try:
            distinct, timeout, expires_ = lock_many_arguments(keys, wait, expires)
            index = self._fleet.index_for_all(distinct)
        except Exception:
            return defer.fail()
        return self._call(index, lambda connection: connection.lock_many(distinct, timeout, expires_)).addCallback(
            self._renewing, auto_renew
        )

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
        """Close every connection (the server releases everything held through them); fires once closed."""
        for opening, _ in list(self._opening.values()):
            opening.cancel()
        gone = []
        for index, connection in enumerate(self._connections):
            if connection is not None:
                connection.fail("the client was closed")
                gone.append(connection.gone)
            self._connections[index] = None
        return defer.gatherResults(gone).addCallback(lambda _: None)
