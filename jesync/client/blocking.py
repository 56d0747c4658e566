"""
The blocking client, for ordinary (threaded or not) Python code.

Each server gets one connection, opened when first needed, with a
background thread that reads its replies, so several threads may share one
L{Client}, and a lock renewing itself in the background never waits behind
another thread's long C{lock()}.  Nothing here needs the Twisted reactor.
"""

from __future__ import annotations

import selectors
import signal
import socket
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Optional, Sequence

from jesync.client.address import DEFAULT_SERVER, Address, UNIXAddress
from jesync.client.errors import ConnectFailed, LockLost, describe
from jesync.client.fleet import Fleet
from jesync.client.handle import LockState
from jesync.client.pipeline import discard
from jesync.client.session import Session
from jesync.client.wire import PING_KEY, LineSplitter, Reply, UnexpectedReply, lock_arguments, lock_many_arguments
from jesync.listing import sort_listing
from jesync.wire import KeyStatus, ListingOrder

def open_socket(address: Address, timeout: Optional[float]) -> socket.socket:
    """Connect to C{address}; raise L{ConnectFailed}."""
    try:
        if isinstance(address, UNIXAddress):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(address.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((address.host, address.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as error:
        raise ConnectFailed(str(address), f"cannot connect: {describe(error)}") from error
    return sock


# The signals a process gets from outside.  The client's threads block them, so
# that they reach the application's threads (Python runs its handlers in the
# main thread, and a blocked main thread only notices a signal delivered to it).
_OUTSIDE_SIGNALS = {
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD", "SIGWINCH")
    if hasattr(signal, name)
}


def start_background(target: Callable[..., None], name: str, *args: Any) -> None:
    """Start a daemon thread that blocks outside signals."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return
    # A new thread inherits the signal mask of the thread that starts it.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _OUTSIDE_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Lock(LockState):
    """
    A lock held through a L{Client}, on one key (L{Client.lock}) or several
    (L{Client.lock_many}).  Use it as a context manager (the lock is
    released when the block ends), or call L{release} yourself.  Its fencing
    token is C{token} (C{tokens} for each key of a C{lock_many} lock).

    If the lock is lost while held (see L{LockState}), C{lost} becomes true,
    the callbacks given to C{add_lost_callback} are called (from a background
    thread), automatic renewal stops, and leaving a C{with} block raises
    L{LockLost}.
    """

    def __init__(self, connection: _Connection, reply: Reply, max_concurrent: int, expires: int) -> None:
        super().__init__(reply, str(connection.address), max_concurrent, expires, time.monotonic)
        self._connection = connection
        self._renewal_stopped = threading.Event()

    def release(self) -> bool:
        """
        Give the lock back (every key of it).  True if it was held until
        now; False if it had been lost (connection dropped, expired, renewal
        refused) or was already released.  Never raises for a lost lock.
        """
        return self._connection.call(self._connection.session.release, self)

    def renew(self) -> None:
        """
        Restart the failsafe expiry (the server counts C{expires} again from
        now).  Raise L{LockLost} if the lock is not held any more.
        """
        self._connection.call(self._connection.session.renew, self)

    def start_renewing(self) -> None:
        """Renew in a background thread every third of C{expires}, until released or lost."""
        interval = self.renew_interval
        if interval is None or not self.held:
            return
        start_background(self._renew_until_stopped, f"jesync renew {self.key}", interval)

    def _renew_until_stopped(self, interval: float) -> None:
        while not self._renewal_stopped.wait(interval):
            try:
                self.renew()
            except LockLost:
                return

    def _stop_renewing(self) -> None:
        self._renewal_stopped.set()

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        problem = self._error_leaving(self.release(), body_raised=kind is not None)
        if problem is not None:
            raise problem


class _Connection:
    """
    One connection to one server: a socket, a reader thread, and the
    L{Session} (outstanding requests, held locks), guarded by a mutex.  Once
    it has failed it stays failed (L{closed}); the L{Client} opens a new one.
    """

    def __init__(self, address: Address, connect_timeout: Optional[float], read_timeout: Optional[float]) -> None:
        self.address = address
        self._sock = open_socket(address, connect_timeout)
        # Bounds every send: a server that stops reading is as dead as one that stops answering.
        self._sock.settimeout(read_timeout)
        self._read_timeout = read_timeout
        # The session's callbacks run under the mutex (they only settle futures).
        self._mutex = threading.RLock()
        self.session = Session(str(address), self._send, self._make_lock)
        self._quiet_since = time.monotonic()
        self._send_error: Optional[str] = None
        with self._mutex:
            # Pipelined: nothing waits for its answer (an older server refuses it, and then grants have no tokens).
            self.session.enable_fencing(discard, discard)
        start_background(self._read_until_closed, f"jesync reader {address}")

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> Lock:
        return Lock(self, reply, max_concurrent, expires)

    @property
    def closed(self) -> bool:
        return self.session.closed

    # -- requests --------------------------------------------------------

    def start(self, operation: Callable[..., None], *args: Any) -> Future[Any]:
        """
        Start a session request, under the mutex so that the order on the
        wire is the pipeline's order; its result arrives in the future.
        """
        future: Future[Any] = Future()
        with self._mutex:
            owed = self.session.pipeline.owes_reply
            operation(*args, future.set_result, future.set_exception)
            if not owed:
                self._quiet_since = time.monotonic()
        return future

    def call(self, operation: Callable[..., None], *args: Any) -> Any:
        """Make a session request and wait for its result."""
        return self.start(operation, *args).result()

    def lock(self, key: str, max_concurrent: int, timeout: int, expires: int) -> Lock:
        return self._acquire(key, self.session.lock, key, max_concurrent, timeout, expires)

    def lock_many(self, keys: tuple[str, ...], timeout: int, expires: int) -> Lock:
        return self._acquire(keys[0], self.session.lock_many, keys, timeout, expires)

    def _acquire(self, key: str, operation: Callable[..., None], *args: Any) -> Lock:
        """Make a lock request (for C{key}, and others with it) and wait for the lock."""
        future = self.start(operation, *args)
        try:
            return future.result()
        except BaseException:
            self._give_up(key, future)
            raise

    def _give_up(self, key: str, future: Future[Any]) -> None:
        """The caller stopped waiting (an exception, e.g. KeyboardInterrupt): don't leave it holding the lock."""
        with self._mutex:
            if not future.done():
                self.session.give_up(key)
                return
        if future.exception() is None:
            future.result().release()

    # -- the socket ------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as error:
            # The reader thread notices the shutdown and fails the connection.
            self._send_error = f"sending failed: {describe(error)}"
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read_until_closed(self) -> None:
        reason = "the server closed the connection"
        tick = None if self._read_timeout is None else min(1.0, self._read_timeout / 2)
        splitter = LineSplitter()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self._sock, selectors.EVENT_READ)
                while not self.closed:
                    if not selector.select(tick):
                        if self._overdue():
                            reason = f"no reply within {self._read_timeout:g} s"
                            break
                        continue
                    data = self._sock.recv(65536)
                    if not data:
                        break
                    with self._mutex:
                        self._quiet_since = time.monotonic()
                        for line in splitter.feed(data):
                            self.session.line_received(line)
                    self._tell_lost()
        except UnexpectedReply as error:
            reason = str(error)
        except OSError as error:
            reason = describe(error)
        finally:
            self.fail(self._send_error or reason)
            self._sock.close()

    def _overdue(self) -> bool:
        assert self._read_timeout is not None
        with self._mutex:
            return self.session.pipeline.owes_reply and time.monotonic() - self._quiet_since >= self._read_timeout

    def _tell_lost(self) -> None:
        """Outside the mutex: call the lost callbacks of the locks just lost."""
        with self._mutex:
            lost = self.session.take_lost()
        for lock in lost:
            lock._notify_lost()

    def fail(self, reason: str) -> None:
        """Close the connection: outstanding requests fail, held locks are lost."""
        with self._mutex:
            self.session.fail(reason)
        self._shutdown()
        self._tell_lost()


class _Server:
    """A server's address and its current connection, opened on demand."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self._connection: Optional[_Connection] = None
        self._connecting = threading.Lock()

    def connection(self, connect_timeout: Optional[float], read_timeout: Optional[float]) -> _Connection:
        with self._connecting:
            if self._connection is None or self._connection.closed:
                self._connection = _Connection(self.address, connect_timeout, read_timeout)
            return self._connection

    def close(self) -> None:
        with self._connecting:
            if self._connection is not None:
                self._connection.fail("the client was closed")


class Client:
    """
    A client of one or more JESync servers.

    @param servers: one address (C{"host:port"}, C{"host"} for port 11400,
        C{"[::1]:11400"}, C{"unix:/path"}), several in one string separated by
        commas or spaces, or a list.
    @param placement: how a key picks its server when there are several:
        C{"consistent"} (consistent hashing) or C{"php"} (as the JESync PHP
        driver does); see L{jesync.client.placement}.
    @param connect_timeout: seconds to wait for a connection (None: the OS's).
    @param read_timeout: seconds the server may stay silent while it owes a
        reply before the connection is given up for dead (None: for ever).
        A lock that is waiting owes no reply; this never cuts a wait short.

    Connections open on first use.  A dropped connection fails what was
    outstanding on it with L{ConnectionLost} and loses the locks held through
    it; the next request opens a new connection, and the old locks stay lost.
    """

    def __init__(
        self,
        servers: str | Sequence[str] = DEFAULT_SERVER,
        *,
        placement: str = "consistent",
        connect_timeout: Optional[float] = 5.0,
        read_timeout: Optional[float] = 10.0,
    ) -> None:
        self._fleet = Fleet(servers, placement)
        self.servers = self._fleet.servers
        self._servers = [_Server(address) for address in self.servers]
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    def server_for(self, key: str) -> Address:
        """The server C{key} lives on."""
        return self._fleet.server_for(key)

    def _connection(self, index: int) -> _Connection:
        return self._servers[index].connection(self.connect_timeout, self.read_timeout)

    def _connection_for(self, key: str) -> _Connection:
        return self._connection(self._fleet.index_for(key))

    def lock(
        self,
        key: str,
        max_concurrent: int = 1,
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
    ) -> Lock:
        """
        Acquire C{key}: a mutex, or a counting semaphore of C{max_concurrent}.

        @param wait: seconds to wait for it: None waits for ever, 0 not at
            all.  JESync counts whole seconds, so a fraction is rounded up.
        @param expires: the failsafe: the server releases the lock this many
            seconds (rounded up) after granting or renewing it, whatever
            happens to this process.  None (or 0): never.
        @param auto_renew: renew in a background thread every third of
            C{expires}, until released or lost.
        @return: the L{Lock}; its C{token} is the grant's fencing token
            (None from a server that gives none).
        @raise LockTimeout: the wait ran out.
        @raise KeyBusy: this client already holds or is asking for C{key}.
        @raise ServerError: the server refused the request.
        @raise ConnectionLost: the server cannot be reached or the connection
            dropped (L{ConnectFailed} if it never connected).
        """
        arguments = lock_arguments(max_concurrent, wait, expires)
        lock = self._connection_for(key).lock(key, *arguments)
        if auto_renew:
            lock.start_renewing()
        return lock

    def lock_many(
        self,
        keys: Iterable[str],
        wait: Optional[float] = None,
        expires: Optional[float] = 120,
        *,
        auto_renew: bool = False,
    ) -> Lock:
        """
        Acquire every one of C{keys}, all or nothing, a mutex on each (a key
        given twice counts once).  The server grants them together when all
        are free, so two clients asking for overlapping sets in different
        orders cannot deadlock.  The returned lock holds them all: it is
        released, renewed and lost as one, and C{lock.tokens} has each
        key's fencing token.

        The keys must live on one server (with one server they always do).
        The server must support C{lock-many} (an older one refuses it with
        L{ServerError}).  C{wait}, C{expires} and C{auto_renew} are
        L{lock}'s.

        @raise LockTimeout: the wait ran out (a L{LockManyTimeout}, naming
            all the keys); none of the keys was granted.
        @raise KeyBusy: this client already holds or is asking for one of them.
        @raise ServerError: the server refused the request.
        @raise ConnectionLost: as L{lock}.
        @raise ValueError: no keys, keys on several servers, or too many
            keys for one request line.
        """
        distinct, timeout, expires_ = lock_many_arguments(keys, wait, expires)
        lock = self._connection(self._fleet.index_for_all(distinct)).lock_many(distinct, timeout, expires_)
        if auto_renew:
            lock.start_renewing()
        return lock

    def status(self, key: str) -> KeyStatus:
        """How many hold C{key} and how many wait for it."""
        connection = self._connection_for(key)
        return connection.call(connection.session.status, key)

    def listing(self, order: ListingOrder = "key") -> list[KeyStatus]:
        """
        Every key in use on every server: sorted by key (C{"key"}), or by
        waiting (C{"requests"}) or holding (C{"grants"}) count, largest first.
        (A listing needs a server that ends it with C{END}, as jesync does;
        JESync 0.8.1 did not.)
        """
        rows: list[KeyStatus] = []
        for index in range(len(self.servers)):
            connection = self._connection(index)
            rows.extend(connection.call(connection.session.listing, order))
        return sort_listing(rows, order)

    def ping(self) -> dict[str, float]:
        """
        The round-trip time of one request to each server, in seconds,
        connecting first if needed (the connection time is not counted).
        """
        times = {}
        for index, address in enumerate(self.servers):
            connection = self._connection(index)
            start = time.perf_counter()
            connection.call(connection.session.status, PING_KEY)
            times[str(address)] = time.perf_counter() - start
        return times

    def close(self) -> None:
        """Close every connection: the server releases everything held through them."""
        for server in self._servers:
            server.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
