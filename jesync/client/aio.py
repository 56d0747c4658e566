"""
The asyncio client: the blocking client's operations as coroutines, for
asyncio services.  Any number of tasks may share one L{AsyncClient}; their
requests are pipelined on one connection per server.  Use a client from one
event loop only.  Nothing here needs the Twisted reactor.

    async with AsyncClient("127.0.0.1:11400") as client:
        async with client.lock("nightly-report", wait=10):
            ...
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generator, Iterable, Mapping, Optional

from jesync.client.address import Address, Member, UNIXAddress
from jesync.client.cluster import Members
from jesync.client.config import ConnectKeywords, ConnectOptions, Servers, client_options
from jesync.client.errors import ClientError, ConnectFailed, ConnectionLost, LockLost, describe
from jesync.client.fleet import Fleet
from jesync.client.group import GROUP_ANSWERS, GROUP_ROWS, GROUPS_LINE, AsyncGroup, listed_groups
from jesync.client.handle import LockState
from jesync.client.pipeline import discard
from jesync.client.connection import ConnectionCore
from jesync.client.session import SERVER_CLOSED
from jesync.client.watch import MAX_EVENTS, QueuedWatch, Subscription
from jesync.client.wire import (
    PING_KEY,
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


class AsyncLock(LockState):
    """
    A lock held through an L{AsyncClient}, on one key or several
    (C{lock_many}): C{async with} it, or C{await lock.release()}.  Lost-lock
    callbacks run in the event loop.
    """

    def __init__(self, connection: _Connection, reply: Reply, max_concurrent: int, expires: int) -> None:
        super().__init__(reply, str(connection.address), max_concurrent, expires, connection.loop.time)
        self._connection = connection
        self._renewer: Optional[asyncio.Task[None]] = None

    async def release(self) -> bool:
        """True if the lock was held until now; False if it had been lost or was released already."""
        return await self._connection.call(self._connection.session.release, self)

    async def renew(self) -> None:
        """Restart the failsafe expiry; raise L{LockLost} if the lock is not held any more."""
        await self._connection.call(self._connection.session.renew, self)

    async def owned(self) -> bool:
        """
        Ask the server whether this connection still holds the lock, as
        L{jesync.client.Lock.owned} does (False if released or lost; if the
        server says not, the lock is lost and its callbacks called).
        """
        result: bool = await self._connection.call(self._connection.session.owned, self)
        self._connection.core.tell_lost()
        return result

    def start_renewing(self) -> None:
        """Renew in a background task every third of C{expires}, until released or lost."""
        interval = self.renew_interval
        if interval is not None and self.held and self._renewer is None:
            self._renewer = self._connection.loop.create_task(self._renew_until_stopped(interval))

    async def _renew_until_stopped(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew()
            except LockLost:
                return

    def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task(self._connection.loop):
            renewer.cancel()

    async def __aenter__(self) -> AsyncLock:
        return self

    async def __aexit__(self, kind: Any, error: Any, traceback: Any) -> None:
        problem = self._error_leaving(await self.release(), body_raised=kind is not None)
        if problem is not None:
            raise problem


class _Protocol(asyncio.Protocol):
    def __init__(self, connection: _Connection) -> None:
        self.connection = connection

    def data_received(self, data: bytes) -> None:
        self.connection.data_received(data)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if isinstance(exc, OSError):
            self.connection.read_what_is_left()
        self.connection.fail(describe(exc) if exc else SERVER_CLOSED, by_server=True)


class _Connection:
    """
    One connection to one server (or one member of a cluster): a transport
    and its L{ConnectionCore} (the session, its silence and deadlines, on the loop's timers).
    """

    def __init__(self, address: Member, loop: asyncio.AbstractEventLoop, read_timeout: Optional[float]) -> None:
        self.address = address
        self.loop = loop
        self.core = ConnectionCore(
            str(address), self._send, self._make_lock, loop.time, read_timeout, self._schedule, self.fail
        )
        self.session = self.core.session
        self._transport: Optional[asyncio.Transport] = None

    def _schedule(self, delay: float, function: Callable[[], None]) -> Callable[[], None]:
        return self.loop.call_later(delay, function).cancel

    @classmethod
    async def open(
        cls,
        address: Member,
        options: ConnectOptions,
        connect_timeout: Optional[float],
        read_timeout: Optional[float],
        confirm: bool = False,
    ) -> _Connection:
        """Connect (with TLS and auth if C{options} say so; with C{confirm}, until the server answers)."""
        try:
            token = options.token()
        except ValueError as error:
            raise ConnectFailed(str(address), str(error), retryable=False) from None
        loop = asyncio.get_running_loop()
        connection = cls(address, loop, read_timeout)
        if isinstance(address, UNIXAddress):
            connecting: Awaitable[Any] = loop.create_unix_connection(lambda: _Protocol(connection), address.path)
        elif options.uses_tls(address):
            connecting = loop.create_connection(
                lambda: _Protocol(connection),
                address.host,
                address.port,
                ssl=options.ssl_context(),
                server_hostname=options.server_name(address),
            )
        else:
            connecting = loop.create_connection(lambda: _Protocol(connection), address.host, address.port)
        start = loop.time()
        try:
            transport, _ = await asyncio.wait_for(connecting, connect_timeout)
        except ssl.SSLError as error:
            raise ConnectFailed(str(address), f"TLS failed: {describe(error)}", retryable=False) from error
        except (OSError, asyncio.TimeoutError) as error:
            raise ConnectFailed(str(address), f"cannot connect: {describe(error)}") from error
        connection._transport = transport
        # auth (with a token) and fencing on, first on the connection; an older
        # server refuses fencing, and then grants have no tokens.
        ready = connection.start(
            lambda on_result, on_error: connection.session.handshake(token, on_result, on_error, confirm)
        )
        left = None if connect_timeout is None else max(0.0, connect_timeout - (loop.time() - start))
        try:
            await asyncio.wait_for(asyncio.shield(ready), left)
        except asyncio.TimeoutError:
            connection.fail("no answer")
            raise ConnectFailed(str(address), f"no answer within {connect_timeout:g} s") from None
        except ConnectionLost as error:
            raise ConnectFailed(str(address), f"cannot connect: {error.reason}") from None
        except BaseException:
            connection.fail("connecting was cancelled")
            raise
        return connection

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> AsyncLock:
        return AsyncLock(self, reply, max_concurrent, expires)

    @property
    def closed(self) -> bool:
        return self.session.closed

    # -- requests --------------------------------------------------------

    def start(self, operation: Callable[..., None], *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self.loop.create_future()

        def succeed(result: object) -> None:
            if not future.done():
                future.set_result(result)

        def fail(error: Exception) -> None:
            if not future.done():
                future.set_exception(error)

        self.core.start(operation, *args, succeed, fail)
        return future

    async def call(self, operation: Callable[..., None], *args: Any) -> Any:
        return await self.start(operation, *args)

    async def lock(
        self,
        key: str,
        max_concurrent: int,
        timeout: int,
        expires: int,
        shared: bool = False,
        value: Optional[bytes] = None,
    ) -> AsyncLock:
        return await self._acquire(
            key, partial(self.session.lock, shared=shared, value=value), key, max_concurrent, timeout, expires
        )

    async def lock_many(self, keys: tuple[str, ...], timeout: int, expires: int, shared: bool = False) -> AsyncLock:
        return await self._acquire(keys[0], partial(self.session.lock_many, shared=shared), keys, timeout, expires)

    async def _acquire(self, key: str, operation: Callable[..., None], *args: Any) -> AsyncLock:
        """Make a lock request (for C{key}, and others with it) and wait for the lock."""
        future = self.start(operation, *args)
        try:
            return await future
        except asyncio.CancelledError:
            # The caller gave up: the server cannot be told, so release whatever it grants.
            if future.cancelled() or not future.done():
                self.session.give_up(key)
            elif future.exception() is None:
                self.session.release(future.result(), discard, discard)
            raise

    # -- the transport ---------------------------------------------------

    def _send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            self.core.received(data)
        except UnexpectedReply as error:
            self.fail(str(error))

    def read_what_is_left(self) -> None:
        """
        The transport failed on an error, and asyncio stops reading at once:
        a write that failed (EPIPE, ECONNRESET) because the server had closed
        the connection, before the loop read what it said first (its reason,
        say C{protected mode: ...}), which the socket still holds.  Read it
        now, without waiting, through L{data_received}, so that the session
        sees the server's line before it is told of the close.  Only on plain
        sockets: over TLS the bytes left are ciphertext that only asyncio's
        own TLS state could decode, and it keeps that to itself.
        """
        transport = self._transport
        if transport is None or transport.get_extra_info("ssl_object") is not None:
            return
        held = transport.get_extra_info("socket")
        if held is None:
            return
        try:
            # A second descriptor of the same socket (asyncio's own may not be read through it).
            with socket.socket(held.family, held.type, held.proto, fileno=socket.dup(held.fileno())) as sock:
                sock.setblocking(False)
                while not self.closed:
                    data = sock.recv(65536)
                    if not data:
                        return
                    self.data_received(data)
        except OSError:  # nothing more to read (EAGAIN), or the reset after what was read
            return

    def fail(self, reason: str, by_server: bool = False) -> None:
        """
        Close the connection (C{by_server}: the server has closed it):
        outstanding requests fail, held locks are lost.
        """
        self.core.fail(reason, by_server)
        if self._transport is not None:
            self._transport.abort()
        self.core.tell_lost()


class _LockRequest:
    """What L{AsyncClient.lock} and L{AsyncClient.lock_many} return: await it for the lock, or C{async with} it."""

    def __init__(self, acquire: Callable[[], Awaitable[AsyncLock]]) -> None:
        self._acquire = acquire
        self._lock: Optional[AsyncLock] = None

    def __await__(self) -> Generator[Any, None, AsyncLock]:
        return self._acquire().__await__()

    async def __aenter__(self) -> AsyncLock:
        self._lock = await self._acquire()
        return self._lock

    async def __aexit__(self, kind: Any, error: Any, traceback: Any) -> None:
        assert self._lock is not None
        await self._lock.__aexit__(kind, error, traceback)


class AsyncWatch(QueuedWatch):
    """
    What L{AsyncClient.watch} gives: an async iterator of the
    L{WatchEvent}s of a key (or of every key with a prefix), in the order
    of the changes, until L{close}; C{async with} closes it.  As
    L{jesync.client.Watch}: if its connection drops, iterating (and L{get})
    raises L{ConnectionLost}, after the events read before it, and again on
    every later call; events are queued as they are read, at most
    C{max_events}: a reader that falls further behind gets
    L{jesync.client.WatchFellBehind} after them, and the watch ends.
    """

    def __init__(self, key: str, prefix: bool, max_events: int = MAX_EVENTS) -> None:
        super().__init__(key, prefix, max_events)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def _put(self, item: object) -> None:
        self._queue.put_nowait(item)

    def _queued(self) -> int:
        return self._queue.qsize()

    def _stop(self, connection: Any, subscription: Subscription) -> None:
        # (while the connection reads: not awaited; an unwatch cut off by its connection is nothing to report)
        connection.start(connection.session.unwatch, subscription).add_done_callback(_retrieved)

    async def _subscribe(self, connection: _Connection) -> None:
        await connection.start(self._subscription_request(connection))

    async def get(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """
        The next event, waiting at most C{timeout} seconds (None: for ever);
        None if none came in time, or once the watch is closed.  Raise
        L{ConnectionLost} once its connection has dropped,
        L{jesync.client.WatchFellBehind} once its reader has.
        """
        if not self._open():
            return None
        if not self._queue.empty():
            item = self._queue.get_nowait()  # (wait_for with no time left would not even run get())
        else:
            try:
                item = await asyncio.wait_for(self._queue.get(), timeout)
            except asyncio.TimeoutError:
                return None
        event = self._taken(item)
        if self._error is not None:
            await self.close()
            raise self._error
        return event

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def close(self) -> None:
        """Stop watching (a task iterating over it stops too).  Never raises."""
        for connection, subscription in self._closing():
            try:
                await connection.call(connection.session.unwatch, subscription)
            except ClientError:
                pass  # the connection is gone, and the server's watch with it

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A future nobody awaits: take its exception, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


class _WatchRequest:
    """What L{AsyncClient.watch} returns: await it for the L{AsyncWatch}, or C{async with} it."""

    def __init__(self, start: Callable[[], Awaitable[AsyncWatch]]) -> None:
        self._start = start
        self._watch: Optional[AsyncWatch] = None

    def __await__(self) -> Generator[Any, None, AsyncWatch]:
        return self._start().__await__()

    async def __aenter__(self) -> AsyncWatch:
        self._watch = await self._start()
        return self._watch

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._watch is not None
        await self._watch.close()


class AsyncClient:
    """
    An asyncio client of one or more JESync servers; the arguments are
    L{jesync.client.Client}'s (servers, auth token file, TLS and retries
    from the environment when not given, likewise).  Connections open on
    first use, in the running loop.  C{async with AsyncClient(...)} closes
    it at the end.  A cluster's members (C{"a:11400|b:11400|c:11400"}) are
    failed over as L{jesync.client.Client} says.
    """

    def __init__(
        self,
        servers: Optional[Servers] = None,
        *,
        placement: str = "consistent",
        options: Optional[ConnectOptions] = None,
        environ: Optional[Mapping[str, str]] = None,
        **keywords: Unpack[ConnectKeywords],
    ) -> None:
        servers, self.options = client_options(servers, options, environ, keywords)
        self._fleet = Fleet(servers, placement)
        self.servers = self._fleet.servers
        self.connect_timeout = self.options.connect_timeout
        self.read_timeout = self.options.read_timeout
        self._members = [Members(address) for address in self.servers]
        self._connections: list[Optional[_Connection]] = [None] * len(self.servers)
        self._opening: list[Optional[asyncio.Future[_Connection]]] = [None] * len(self.servers)
        # the candidacies and memberships kept over this client (keep_campaigning, keep_joined): close() stops them
        self._kept: weakref.WeakSet[Any] = weakref.WeakSet()

    def server_for(self, key: str) -> Address:
        """The server C{key} lives on."""
        return self._fleet.server_for(key)

    async def _connection(self, index: int, wait: Optional[float] = None) -> _Connection:
        """The open connection, or a new one, retrying failed attempts within C{wait} (see L{Client})."""
        loop = asyncio.get_running_loop()
        attempts = self._members[index].attempts(self.options.backoff(wait, loop.time()))
        while True:
            try:
                return await self._connect_once(index, attempts.member)
            except ConnectFailed as error:
                pause = attempts.failed(error, loop.time())
                if pause is None:
                    raise attempts.error()
                if pause:
                    await asyncio.sleep(pause)

    async def _connect_once(self, index: int, member: Member) -> _Connection:
        """The open connection, or a new one to C{member} (unless another caller is already connecting)."""
        connection = self._connections[index]
        if connection is not None and not connection.closed:
            return connection
        opening = self._opening[index]
        if opening is None:
            opening = self._opening[index] = asyncio.ensure_future(
                _Connection.open(
                    member, self.options, self.connect_timeout, self.read_timeout, self._members[index].is_cluster
                )
            )
            opening.add_done_callback(lambda _: self._opened(index))
        # Shielded: one caller giving up must not cancel the others' connection.
        return await asyncio.shield(opening)

    def _opened(self, index: int) -> None:
        opening, self._opening[index] = self._opening[index], None
        assert opening is not None
        if not opening.cancelled() and opening.exception() is None:
            connection = self._connections[index] = opening.result()
            self._members[index].answered(connection.address)

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
    ) -> _LockRequest:
        """
        Acquire C{key}, as L{jesync.client.Client.lock} does (C{shared} and
        C{value} too): C{lock = await client.lock(...)}, or C{async with
        client.lock(...) as lock:}.

        Cancelling the wait (task cancellation, C{asyncio.timeout}) cannot
        withdraw the request from the server: if it is granted later it is
        released at once, and until the server answers, this client refuses
        another C{lock} for the key with L{KeyBusy}.  Prefer C{wait=}.
        """
        arguments = lock_arguments(max_concurrent, wait, expires)
        checked = lock_value(key, value, check_shared(shared, max_concurrent))
        index = self._fleet.index_for(key)

        async def acquire() -> AsyncLock:
            connection = await self._connection(index, wait)
            lock = await connection.lock(key, *arguments, shared, checked)
            if auto_renew:
                lock.start_renewing()
            return lock

        return _LockRequest(acquire)

    def lock_many(
        self,
        keys: Iterable[str],
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
        shared: bool = False,
    ) -> _LockRequest:
        """
        Acquire every one of C{keys}, all or nothing, as
        L{jesync.client.Client.lock_many} does (C{shared} too): C{lock = await
        client.lock_many([...])}, or C{async with client.lock_many([...]) as
        lock:}; C{lock.tokens} has each key's fencing token.  Cancelling the
        wait is as for L{lock}.
        """
        distinct, timeout, expires_ = lock_many_arguments(keys, wait, expires, check_shared(shared))
        index = self._fleet.index_for_all(distinct)

        async def acquire() -> AsyncLock:
            connection = await self._connection(index, wait)
            lock = await connection.lock_many(distinct, timeout, expires_, shared)
            if auto_renew:
                lock.start_renewing()
            return lock

        return _LockRequest(acquire)

    async def status(self, key: str) -> KeyStatus:
        """How many hold C{key} and how many wait for it."""
        connection = await self._connection(self._fleet.index_for(key))
        return await connection.call(connection.session.status, key)

    async def holders(self, key: str) -> list[Holder]:
        """Who holds C{key} and since when, as L{jesync.client.Client.holders}."""
        connection = await self._connection(self._fleet.index_for(key))
        return await connection.call(connection.session.holders, key)

    def watch(
        self,
        key: Optional[str] = None,
        *,
        prefix: Optional[str] = None,
        max_events: int = MAX_EVENTS,
        route_by: Optional[str] = None,
    ) -> _WatchRequest:
        """
        Watch C{key}, or every key starting with C{prefix} (C{""}: every
        key), as L{jesync.client.Client.watch} does (C{route_by} too):
        C{async with client.watch("leader") as events: async for event in
        events: ...}, or C{events = await client.watch(...)} (then C{await
        events.close()}).  At most C{max_events} wait for the reader (see
        L{AsyncWatch}).
        """
        what, is_prefix = watch_arguments(key, prefix)
        indexes = self._fleet.watched(what, is_prefix, route_by)

        async def start() -> AsyncWatch:
            watch = AsyncWatch(what, is_prefix, max_events)
            try:
                for index in indexes:
                    await watch._subscribe(await self._connection(index))
            except BaseException:
                await watch.close()
                raise
            return watch

        return _WatchRequest(start)

    def group(self, name: str) -> AsyncGroup:
        """
        Group C{name} on these servers (L{jesync.client.group.AsyncGroup}):
        L{jesync.client.Client.group}'s operations, awaited.  Raise
        ValueError for a name that cannot be a group's (a C{/}).
        """
        return AsyncGroup(self, name)

    async def groups(self) -> list[str]:
        """Every group on every server, sorted."""
        names: list[str] = []
        for index in range(len(self.servers)):
            connection = await self._connection(index)
            reply = await connection.call(connection.session.extension, GROUPS_LINE, GROUP_ANSWERS, GROUP_ROWS)
            names.extend(listed_groups(reply))
        return sorted(names)

    async def _extension_request(
        self, key: str, line: bytes, answers: frozenset[str], rows: frozenset[str]
    ) -> tuple[str, list[bytes], list[list[bytes]]]:
        """Send an extension command (C{line}) to the server of C{key}; its reply's word, fields and rows."""
        connection = await self._connection(self._fleet.index_for(key))
        return await connection.call(connection.session.extension, line, answers, rows)

    async def listing(self, order: ListingOrder = "key") -> list[KeyStatus]:
        """Every key in use on every server, in C{order} (C{"key"}, C{"requests"}, C{"grants"})."""
        rows: list[KeyStatus] = []
        for index in range(len(self.servers)):
            connection = await self._connection(index)
            rows.extend(await connection.call(connection.session.listing, order))
        return sort_listing(rows, order)

    async def ping(self) -> dict[str, float]:
        """The round-trip time of one request to each server, in seconds."""
        times = {}
        for index, address in enumerate(self.servers):
            connection = await self._connection(index)
            start = time.perf_counter()
            await connection.call(connection.session.status, PING_KEY)
            times[str(address)] = time.perf_counter() - start
        return times

    async def close(self) -> None:
        """
        Close every connection: the server releases everything held through
        them.  As L{jesync.client.Client.close}: the candidacies and
        memberships kept over this client stop first.
        """
        for kept in list(self._kept):
            kept._halt()
        for opening in self._opening:
            if opening is not None:
                opening.cancel()
        for index, connection in enumerate(self._connections):
            if connection is not None:
                connection.fail("the client was closed")
            self._connections[index] = None
        await asyncio.sleep(0)  # let the transports close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
