"""
The blocking client, for ordinary (threaded or not) Python code.

Each server gets one connection, opened when first needed, with a
background thread that reads its replies, so several threads may share one
L{Client}, and a lock renewing itself in the background never waits behind
another thread's long C{lock()}.  Nothing here needs the Twisted reactor.
"""

from __future__ import annotations

import queue
import selectors
import signal
import socket
import ssl
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional

from jesync.client.address import Address, Member, TCPAddress, UNIXAddress
from jesync.client.cluster import Members
from jesync.client.config import ConnectKeywords, ConnectOptions, Servers, client_options
from jesync.client.errors import ClientError, ConnectFailed, ConnectionLost, LockLost, describe
from jesync.client.fleet import Fleet
from jesync.client.group import GROUP_ANSWERS, GROUP_ROWS, GROUPS_LINE, Group, listed_groups
from jesync.client.handle import LockState
from jesync.client.connection import ConnectionCore
from jesync.client.session import SERVER_CLOSED
from jesync.client.watch import MAX_EVENTS, QueuedWatch, Subscription
from jesync.client.wire import (
    PING_KEY,
    Holder,
    Reply,
    UnexpectedReply,
    WatchEvent,
    check_key,
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

#: The admin listener's answer to C{force-release} (L{Client.force_release}).
FORCE_RELEASE_ANSWERS = frozenset({"FORCE-RELEASED"})


def open_socket(address: Member, timeout: Optional[float]) -> socket.socket:
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


class _TLS:
    """
    TLS over a connected socket, through memory buffers (C{ssl.SSLObject}):
    the socket carries only ciphertext, and the TLS state is used only
    under the connection's mutex, so the reader thread and the threads
    sending never touch it at once (OpenSSL forbids that).

    The server's first records may come in the same segment as the end of
    its handshake (TLS 1.2: its Finished, a refusal line and its
    close_notify, in one write before it closes): the handshake decodes
    them at once, and the first L{received} returns them, so a client calls
    C{received(b"")} before it first waits on the socket, else it would
    wait for more data that never comes, and lose the server's line.
    """

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_name: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=server_name)
        self._sock = sock
        #: whether the server has ended TLS (its close_notify was read)
        self.ended = False
        # The plaintext that came with the end of the handshake, until the first received().
        self._early = b""

    def handshake(self) -> None:
        """Blocking, within the socket's timeout; raise OSError (ssl.SSLError for TLS's failures)."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                data = self._sock.recv(65536)
                if not data:
                    raise ConnectionResetError("the server closed the connection during the TLS handshake") from None
                self._incoming.write(data)
            else:
                self._flush()
                self._early = self.received(b"")
                return

    def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            self._sock.sendall(pending)

    def send(self, data: bytes) -> None:
        """Encrypt and send C{data} (under the connection's mutex)."""
        self._tls.write(data)
        self._flush()

    def received(self, data: bytes) -> bytes:
        """
        The plaintext C{data} (ciphertext from the socket) completes (under
        the connection's mutex), up to the server's end of TLS if it came
        with it (then L{ended} is true: the plaintext before it, such as
        the server's reason for closing, is still returned), after what
        came with the end of the handshake; raise ssl.SSLError for a broken
        stream.
        """
        self._incoming.write(data)
        plain = [self._early]
        self._early = b""
        while not self.ended:
            try:
                chunk = self._tls.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                chunk = b""
            if not chunk:
                self.ended = True
            plain.append(chunk)
        try:
            self._flush()  # whatever TLS itself has to answer
        except OSError:
            if not self.ended:
                raise
        return b"".join(plain)


def open_connection(
    address: Member, options: ConnectOptions, timeout: Optional[float]
) -> tuple[socket.socket, Optional[_TLS]]:
    """Connect to C{address} (with TLS if C{options} say so, the handshake done); raise L{ConnectFailed}."""
    sock = open_socket(address, timeout)
    if not options.uses_tls(address):
        return sock, None
    assert isinstance(address, TCPAddress)
    try:
        tls = _TLS(sock, options.ssl_context(), options.server_name(address))
        tls.handshake()
    except ssl.SSLError as error:
        sock.close()
        raise ConnectFailed(str(address), f"TLS failed: {describe(error)}", retryable=False) from error
    except OSError as error:
        sock.close()
        raise ConnectFailed(str(address), f"TLS failed: {describe(error)}") from error
    return sock, tls


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

    def owned(self) -> bool:
        """
        Ask the server whether this connection still holds the lock (every
        key of it), as redis-py's C{owned()}: False for a lock released or
        lost.  If the server says it does not, the lock is lost (its lost
        callbacks are called).  Needs a server with the C{owned} command.
        """
        result: bool = self._connection.call(self._connection.session.owned, self)
        self._connection._tell_lost()
        return result

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
    One connection to one server (or one member of a cluster): a socket, a
    reader thread, and the L{Session} (outstanding requests, held locks),
    guarded by a mutex.  Once it has failed it stays failed (L{closed}); the
    L{Client} opens a new one.  With C{confirm} (a cluster member) it is
    ready only once the server has answered (L{Session.handshake}).
    """

    def __init__(
        self,
        address: Member,
        options: ConnectOptions,
        connect_timeout: Optional[float],
        read_timeout: Optional[float],
        confirm: bool = False,
    ) -> None:
        self.address = address
        try:
            token = options.token()
        except ValueError as error:
            raise ConnectFailed(str(address), str(error), retryable=False) from None
        self._sock, self._tls = open_connection(address, options, connect_timeout)
        # Bounds every send: a server that stops reading is as dead as one that stops answering.
        self._sock.settimeout(read_timeout)
        self._read_timeout = read_timeout
        # The session's callbacks run under the mutex (they only settle futures).
        self._mutex = threading.RLock()
        # No schedule: the reader thread watches the clocks (_read_until_closed).
        self.core = ConnectionCore(str(address), self._send, self._make_lock, time.monotonic, read_timeout)
        self.session = self.core.session
        self._send_error: Optional[str] = None
        # auth (with a token) and fencing on, first on the connection; an older
        # server refuses fencing, and then grants have no tokens.
        ready = self.start(lambda on_result, on_error: self.session.handshake(token, on_result, on_error, confirm))
        start_background(self._read_until_closed, f"jesync reader {address}")
        try:
            ready.result(connect_timeout)
        except FutureTimeout:
            self.fail("no answer")
            raise ConnectFailed(str(address), f"no answer within {connect_timeout:g} s") from None
        except ConnectionLost as error:
            raise ConnectFailed(str(address), f"cannot connect: {error.reason}") from None

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
            self.core.start(operation, *args, future.set_result, future.set_exception)
        return future

    def call(self, operation: Callable[..., None], *args: Any) -> Any:
        """Make a session request and wait for its result."""
        return self.start(operation, *args).result()

    def lock(
        self,
        key: str,
        max_concurrent: int,
        timeout: int,
        expires: int,
        shared: bool = False,
        value: Optional[bytes] = None,
    ) -> Lock:
        return self._acquire(key, partial(self.session.lock, shared=shared, value=value), key, max_concurrent, timeout, expires)

    def lock_many(self, keys: tuple[str, ...], timeout: int, expires: int, shared: bool = False) -> Lock:
        return self._acquire(keys[0], partial(self.session.lock_many, shared=shared), keys, timeout, expires)

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
            if self._tls is not None:
                self._tls.send(data)
            else:
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
        reason = SERVER_CLOSED
        by_server = True  # whether the server ended the connection (else the client gave it up)
        tick = None if self._read_timeout is None else min(1.0, self._read_timeout / 2)
        try:
            # TLS: what came with the end of the handshake first (maybe all the server will say).
            ended = self._tls is not None and self._lines_received(b"")
            with selectors.DefaultSelector() as selector:
                selector.register(self._sock, selectors.EVENT_READ)
                while not self.closed and not ended:
                    with self._mutex:
                        wait = self.core.wake_in(tick)
                    ready = selector.select(wait)
                    overdue = self._expire_overdue()
                    if overdue is not None:
                        reason, by_server = overdue, False
                        break
                    if not ready:
                        with self._mutex:
                            silent = self.core.silent()
                        if silent:
                            reason, by_server = self.core.silence_reason, False
                            break
                        continue
                    data = self._sock.recv(65536)
                    if not data:
                        break
                    ended = self._lines_received(data)
        except UnexpectedReply as error:
            reason, by_server = str(error), False
        except OSError as error:
            reason = describe(error)
        finally:
            if by_server:
                # What the server said before it closed (read above, even after a send failed) tells why.
                with self._mutex:
                    self.core.fail(self._send_error or reason, by_server=True)
            self.fail(self._send_error or reason)
            self._sock.close()

    def _lines_received(self, data: bytes) -> bool:
        """
        Hand the session the lines C{data} (from the socket: TLS's
        ciphertext) completes; whether the server has ended TLS.
        """
        with self._mutex:
            ended = False
            if self._tls is not None:
                data = self._tls.received(data)
                ended = self._tls.ended
            self.core.feed(data)
        self._tell_lost()
        return ended

    def _expire_overdue(self) -> Optional[str]:
        """
        Lose the locks whose failsafe expiry ran out, and call their lost
        callbacks; the reason to close the connection if a waiting lock's
        answer is overdue (L{Session.expire_overdue}).
        """
        with self._mutex:
            overdue = self.core.expire_overdue()
        self._tell_lost()
        return overdue

    def _tell_lost(self) -> None:
        """Outside the mutex: call the lost callbacks of the locks just lost."""
        with self._mutex:
            lost = self.core.take_lost()
        for lock in lost:
            lock._notify_lost()

    def fail(self, reason: str) -> None:
        """Close the connection: outstanding requests fail, held locks are lost."""
        with self._mutex:
            self.core.fail(reason)
        self._shutdown()
        self._tell_lost()


class Watch(QueuedWatch):
    """
    What L{Client.watch} returns: an iterator of the L{WatchEvent}s of a key
    (or of every key with a prefix), in the order of the changes, until
    L{close}; a context manager that closes it.

    A watch is bound to its connection, as a lock is: if the connection
    drops (the server went away, a cluster failed over), the iterator (and
    L{get}) raises L{ConnectionLost} after the events read before it, and
    again on every later call; watch again (which reconnects) to go on.
    Changes made while nobody watched are not reported: after watching
    again, C{holders()} tells the state (see L{Client.watch}).

    Events are queued as they arrive (read by the client's background
    thread), at most C{max_events} of them: a reader that falls further
    behind gets, after those, L{WatchFellBehind} (and again on every later
    call), and the watch stops watching on the server (see
    L{jesync.client.watch}).
    """

    def __init__(self, key: str, prefix: bool, max_events: int = MAX_EVENTS) -> None:
        super().__init__(key, prefix, max_events)
        self._queue: queue.Queue[Any] = queue.Queue()
        # (a prefix watch is told by one reader thread per server)
        self._told_one_at_a_time = threading.Lock()

    def _put(self, item: object) -> None:
        self._queue.put(item)

    def _queued(self) -> int:
        return self._queue.qsize()

    def _told(self, connection: Any, event: WatchEvent) -> None:
        with self._told_one_at_a_time:
            super()._told(connection, event)

    def _stop(self, connection: Any, subscription: Subscription) -> None:
        connection.start(connection.session.unwatch, subscription)  # (in its reader: not waited for)

    def _subscribe(self, connection: _Connection) -> None:
        connection.start(self._subscription_request(connection)).result()

    def get(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """
        The next event, waiting at most C{timeout} seconds (None: for ever);
        None if none came in time, or once the watch is closed.  Raise
        L{ConnectionLost} once its connection has dropped, L{WatchFellBehind}
        once its reader has (see above).
        """
        if not self._open():
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        event = self._taken(item)
        if self._error is not None:
            self.close()
            raise self._error
        return event

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> WatchEvent:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def close(self) -> None:
        """Stop watching (an iterator waiting in another thread stops too).  Never raises."""
        for connection, subscription in self._closing():
            try:
                connection.call(connection.session.unwatch, subscription)
            except ClientError:
                pass  # the connection is gone, and the server's watch with it

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Server:
    """A server's address (a cluster's members) and its current connection, opened on demand."""

    def __init__(self, address: Address, options: ConnectOptions) -> None:
        self.address = address
        self._options = options
        self._members = Members(address)
        self._connection: Optional[_Connection] = None
        self._connecting = threading.Lock()

    def connection(
        self, connect_timeout: Optional[float], read_timeout: Optional[float], wait: Optional[float] = None
    ) -> _Connection:
        """
        The open connection, or a new one (to whichever member of a cluster
        answers: L{jesync.client.cluster}); a failed attempt is retried (see
        L{jesync.client.config.Backoff}) within C{wait} seconds (None: no
        limit but the number of retries).
        """
        attempts = self._members.attempts(self._options.backoff(wait, time.monotonic()))
        while True:
            try:
                with self._connecting:
                    if self._connection is None or self._connection.closed:
                        member = attempts.member
                        self._connection = _Connection(
                            member, self._options, connect_timeout, read_timeout, self._members.is_cluster
                        )
                        self._members.answered(member)
                    return self._connection
            except ConnectFailed as error:
                pause = attempts.failed(error, time.monotonic())
                if pause is None:
                    raise attempts.error()
                if pause:
                    time.sleep(pause)

    def close(self) -> None:
        with self._connecting:
            if self._connection is not None:
                self._connection.fail("the client was closed")


class Client:
    """
    A client of one or more JESync servers.

    @param servers: one address (C{"host:port"}, C{"host"} for port 11400,
        C{"[::1]:11400"}, C{"unix:/path"}), several in one string separated by
        commas or spaces, or a list.  None (the default): C{$JESYNC_SERVERS},
        else 127.0.0.1:11400, as the C{jesync} command does.  The members of
        one jesync cluster are one server, written C{"a:11400|b:11400|c:11400"}:
        the client connects to whichever member answers (see below).
    @param placement: how a key picks its server when there are several:
        C{"consistent"} (consistent hashing) or C{"php"} (as the JESync PHP
        driver does); see L{jesync.client.placement}.
    @param options: the connection settings as one value, a
        L{ConnectOptions} (L{jesync.client.config}): its fields are the
        keywords below, which may be given instead (not both) and are read
        from the environment when not given; an C{options} is used as it is.
    @param connect_timeout: seconds to wait for a connection (None: the OS's).
    @param read_timeout: seconds the server may stay silent while it owes a
        reply (to any request: release, renew, status, ...) before the
        connection is given up for dead (None: for ever).  A lock that is
        waiting owes no reply; this never cuts a wait short, but a lock
        asked with C{wait} seconds is given up for dead if it has no answer
        C{read_timeout} seconds after its wait.
    @param auth_token_file: a file whose first line is the token the servers
        want (their C{--auth-token-file}); it is sent as C{auth <token>} first
        on every connection, read from the file again for each.  None:
        C{$JESYNC_AUTH_TOKEN_FILE}, else no token.  A refused token raises
        L{AuthFailed}; a server whose protected mode refuses this client,
        L{AccessRefused} (each with the server's line).
    @param tls: connect to TCP servers with TLS (their C{--port ssl:...}),
        checking their certificate and name.  None: C{$JESYNC_TLS}, else on
        if a CA file or server name is given (by argument or variable).
    @param tls_ca_file: the CA certificates (PEM) to trust; None:
        C{$JESYNC_TLS_CA_FILE}, else the system's trust store.
    @param tls_server_name: the name the certificates must carry; None:
        C{$JESYNC_TLS_SERVER_NAME}, else each server's host as written.
    @param connect_retries: how many times a failed connection attempt is
        retried, pausing C{retry_backoff} seconds first, doubling each time
        up to C{retry_backoff_max} (each pause between half and all of
        that).  A lock's retries stay within its C{wait} (so C{wait=0}
        never retries); a refused token or a certificate that does not check
        out is never retried.
    @param environ: where the variables are read (None: C{os.environ}; C{{}}
        ignores the environment).  See L{jesync.client.config}.
    Connections open on first use.  A dropped connection fails what was
    outstanding on it with L{ConnectionLost} and loses the locks held through
    it; the next request opens a new connection, and the old locks stay lost.

    A cluster's members (C{a|b|c}) are tried in turn, starting with the one
    that answered last, until one answers C{fencing on} within
    C{connect_timeout}: a refused connection (a standby), a connect timeout
    and no answer (a paused leader, whose socket still accepts) all move on
    to the next member; after a pass over all of them, the retries above
    apply.  A refused token or certificate is never failed over.  A JESync
    lock is bound to its connection, so when the leader dies, stops
    answering (a request unanswered for C{read_timeout}) or steps down, the
    locks held through it are lost (their handles say so, their lost
    callbacks are called) like on any dropped connection; the next request
    connects to whichever member answers then (see L{jesync.client.cluster}).
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
        self._servers = [_Server(address, self.options) for address in self.servers]
        # the candidacies and memberships kept over this client (keep_campaigning, keep_joined): close() stops them
        self._kept: weakref.WeakSet[Any] = weakref.WeakSet()
        self.connect_timeout = self.options.connect_timeout
        self.read_timeout = self.options.read_timeout

    def server_for(self, key: str) -> Address:
        """The server C{key} lives on."""
        return self._fleet.server_for(key)

    def _connection(self, index: int, wait: Optional[float] = None) -> _Connection:
        return self._servers[index].connection(self.connect_timeout, self.read_timeout, wait)

    def _connection_for(self, key: str, wait: Optional[float] = None) -> _Connection:
        return self._connection(self._fleet.index_for(key), wait)

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
    ) -> Lock:
        """
        Acquire C{key}: a mutex, or a counting semaphore of C{max_concurrent},
        or, with C{shared}, a read lock.

        @param wait: seconds to wait for it: None waits for ever, 0 not at
            all.  JESync counts whole seconds, so a fraction is rounded up.
        @param expires: the failsafe: the server releases the lock this many
            seconds (rounded up) after granting or renewing it, whatever
            happens to this process.  None (or 0): never.
        @param auto_renew: renew in a background thread every third of
            C{expires}, until released or lost.
        @param shared: a shared (read) lock: held together with the key's
            other shared holders, never with an exclusive one; a waiting
            exclusive request holds back shared ones that come after it.
            (C{max_concurrent} is then not used: leave it 1.)  A
            connection holds a key in one mode: asking the other mode of a
            key it holds is refused (L{KeyBusy} here; the server has no
            upgrade or downgrade).
        @param value: bytes (or a str, sent as UTF-8) the grant carries,
            shown to anyone by C{holders()} and in watch events: say the
            holder's address, in a leader election.  At most 4096 bytes
            (ValueError for more, or for a binary value whose encoding
            would not fit one request line); None (or empty): none.  The
            lock's C{value} is it, as bytes.
        @return: the L{Lock}; its C{token} is the grant's fencing token
            (None from a server that gives none).
        @raise LockTimeout: the wait ran out.
        @raise KeyBusy: this client already holds or is asking for C{key}.
        @raise ServerError: the server refused the request.
        @raise ConnectionLost: the server cannot be reached or the connection
            dropped (L{ConnectFailed} if it never connected).
        """
        arguments = lock_arguments(max_concurrent, wait, expires)
        checked = lock_value(key, value, check_shared(shared, max_concurrent))
        lock = self._connection_for(key, wait).lock(key, *arguments, shared, checked)
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
        shared: bool = False,
    ) -> Lock:
        """
        Acquire every one of C{keys}, all or nothing, a mutex on each (with
        C{shared}: a read lock on each; a key given twice counts once).  The server grants them together when all
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
        distinct, timeout, expires_ = lock_many_arguments(keys, wait, expires, check_shared(shared))
        connection = self._connection(self._fleet.index_for_all(distinct), wait)
        lock = connection.lock_many(distinct, timeout, expires_, shared)
        if auto_renew:
            lock.start_renewing()
        return lock

    def status(self, key: str) -> KeyStatus:
        """How many hold C{key} and how many wait for it."""
        connection = self._connection_for(key)
        return connection.call(connection.session.status, key)

    def holders(self, key: str) -> list[Holder]:
        """
        Who holds C{key} and since when: a L{Holder} per holder, in the order
        they were granted (empty if nobody holds it), with its C{mode} and
        C{value}.  Needs a server with the C{holders} command.
        """
        connection = self._connection_for(key)
        return connection.call(connection.session.holders, key)

    def watch(
        self,
        key: Optional[str] = None,
        *,
        prefix: Optional[str] = None,
        max_events: int = MAX_EVENTS,
        route_by: Optional[str] = None,
    ) -> Watch:
        """
        Watch C{key}, or every key starting with C{prefix} (C{""}: every
        key): the L{Watch} returned is an iterator of L{WatchEvent}s, one per
        change of the key's holders (C{granted}, C{released}, C{expired},
        C{lost}; a prefix watch also C{appeared} and C{disappeared} as keys
        enter and leave the lock table), from the moment this returns::

            with client.watch("leader") as events:
                for event in events:
                    print(event.kind, event.holder, event.value)

        To start from a consistent state, watch first, then ask
        C{holders()}: the changes before its answer are already in it.  With
        several servers a prefix watch watches them all (the order of events
        from two servers is not defined).  Needs a server with watches.

        Events wait for the reader in the watch, at most C{max_events} (by
        default L{jesync.client.watch.MAX_EVENTS}, 10,000): a reader that
        falls further behind gets L{WatchFellBehind} after them, and the
        watch ends.

        With several servers a key is watched on the server it lives on;
        C{route_by} names another key whose server to watch it on (a
        group's member keys live on the group's server: C{route_by} is the
        group's key).

        @raise ServerError: the server refused (its C{max-watches} cap).
        @raise ConnectionLost: as L{lock}; and later, from the iterator,
            if its connection drops.
        """
        what, is_prefix = watch_arguments(key, prefix)
        watch = Watch(what, is_prefix, max_events)
        indexes = self._fleet.watched(what, is_prefix, route_by)
        try:
            for index in indexes:
                watch._subscribe(self._connection(index))
        except BaseException:
            watch.close()
            raise
        return watch

    def group(self, name: str) -> Group:
        """
        Group C{name} on these servers (L{jesync.client.group.Group}):
        create, delete, join, heartbeat, update, leave, members, watch.
        Raise ValueError for a name that cannot be a group's (a C{/}).
        """
        return Group(self, name)

    def groups(self) -> list[str]:
        """Every group on every server, sorted."""
        names: list[str] = []
        for index in range(len(self.servers)):
            connection = self._connection(index)
            reply = connection.call(connection.session.extension, GROUPS_LINE, GROUP_ANSWERS, GROUP_ROWS)
            names.extend(listed_groups(reply))
        return sorted(names)

    def force_release(self, key: str) -> int:
        """
        Release C{key} from every holder (the admin listener's
        C{force-release}: give this client the server's C{--admin-port} and
        its admin token); the number of grants released.  Its holders are
        not told.  L{ServerError} from any other listener.
        """
        word, fields, _ = self._extension_request(
            key, b"force-release " + check_key(key) + b"\r\n", FORCE_RELEASE_ANSWERS, frozenset()
        )
        return int(fields[1])

    def _extension_request(
        self, key: str, line: bytes, answers: frozenset[str], rows: frozenset[str]
    ) -> tuple[str, list[bytes], list[list[bytes]]]:
        """Send an extension command (C{line}) to the server of C{key}; its reply's word, fields and rows."""
        connection = self._connection_for(key)
        return connection.call(connection.session.extension, line, answers, rows)

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
        """
        Close every connection: the server releases everything held through
        them.  The candidacies and memberships kept over this client
        (C{keep_campaigning}, C{keep_joined}) stop first: they neither
        campaign nor join again.  (A later request of the application's
        opens a new connection, as after a dropped one.)
        """
        for kept in list(self._kept):
            kept._halt()
        for server in self._servers:
            server.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
