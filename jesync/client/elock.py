"""
A blocking client of the elock protocol whose session survives a dropped
connection and a cluster's failover.

An elock session owns its locks and outlives its connection for a grace
period (C{set_timeout}); a new connection takes it back with C{conn_id
<id>}.  L{ELockClient} starts a session when it is made and keeps it: one
background thread does all its I/O, one request at a time (elock answers in
request order, and a waiting C{lock} holds back what follows it).  While
idle, the thread watches the connection and sends a heartbeat (C{conn_id})
every C{heartbeat} seconds, so a server that died, closed the connection or
stopped answering (a paused leader still accepts connections) is noticed
without waiting for the next request.

Then it reconnects to whichever member answers (the one that last answered
first, then the others in order, in rounds with backoff, for at most the
grace period), resumes the session, and asks C{owned <key>} for every key it
held: a resumed session may have lost locks (its grace period ran out, or the
new leader never had them), and on jesync C{conn_id <unknown id>} starts a
new empty session, so a successful C{conn_id} alone proves nothing.  Keys it
no longer holds are reported lost: their handle's C{lost} becomes true and
its C{on_lost} callbacks are called once, from a thread of their own (never
under the client's lock, never blocking its I/O).  A request interrupted by
the failover is settled by L{jesync.client.elock_wire.after_resume}.
The session's id, connection and member change only along its declared
failover machine (L{jesync.client.elock_session}: unattached, attached,
resuming, ended).  The session keeps the bookkeeping (its heartbeat's
liveness, the handles it holds and which are lost); this module is its I/O:
the connection, the thread, the request queue and driving the failover.

Nothing here needs the Twisted reactor.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Deque, Mapping, Optional, Sequence, Union

import jesync.client.elock_wire as elock_wire
from jesync.client.address import Address, Member
from jesync.client.blocking import open_connection, start_background
from jesync.client.config import Backoff, ConnectKeywords, ConnectOptions, client_options
from jesync.client.elock_session import ELockHandle, ELockSession, Lost, LostCallback, call_quietly
from jesync.client.elock_wire import AGAIN, ELockReply, Owned, Request
from jesync.client.errors import (
    AccessRefused,
    AuthFailed,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    LockLost,
    ServerError,
    describe,
)
from jesync.client.wire import LineSplitter, UnexpectedReply

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("jesync.client.elock")

__all__ = ["ELockClient", "ELockHandle"]

#: A request is sent again after at most this many failovers; then it fails.
MAX_FAILOVERS_PER_REQUEST = 3
#: The resume asks C{owned} about this many keys per round trip.
OWNED_BATCH = 128
#: The longest pause between heartbeats (a shorter grace period pings more often).
HEARTBEAT_MAX = 5.0

class _Broken(Exception):
    """
    The connection failed (the reason is the message); the session may still
    be resumed.  C{closed}: the server ended it (an end of file, a reset, a
    send that failed), rather than the client giving it up (no reply in
    time, a reply that is not elock).
    """

    def __init__(self, reason: str, closed: bool = False) -> None:
        super().__init__(reason)
        self.closed = closed


class _AuthRefused(Exception):
    """
    The server refused the connection (L{elock_wire.refuses_connection});
    it closes the connection.  The argument is its reply.
    """


class _Refused(Exception):
    """A member answered but cannot take the session back now (C{403 cannot set conn id})."""


class _Pending:
    """A request waiting for the I/O thread: what to send, its wait's deadline, and where its result goes."""

    def __init__(self, request: Request, wait: int = 0) -> None:
        self.request = request
        self.wait = wait
        self.deadline = time.monotonic() + wait
        self.future: Future[Any] = Future()

    def wait_left(self) -> int:
        """A lock's wait left, whole seconds rounded up (0 once its time is up: one last try)."""
        left = self.deadline - time.monotonic()
        return max(0, int(-(-left // 1)))


class _Connection:
    """One connection to one member: a socket (maybe TLS), and its reply lines."""

    def __init__(self, address: Member, options: ConnectOptions, connect_timeout: Optional[float]) -> None:
        self.address = address
        self.sock, self._tls = open_connection(address, options, connect_timeout)
        self.sock.settimeout(connect_timeout)  # bounds every send
        self._splitter = LineSplitter()
        self._lines: Deque[bytes] = deque()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        if self._tls is not None:
            try:
                self._decode(b"")  # what came with the end of the TLS handshake (maybe all the server will say)
            except _Broken as broken:
                self.close()
                raise ConnectFailed(str(address), str(broken)) from None

    def send(self, data: bytes) -> None:
        try:
            if self._tls is not None:
                self._tls.send(data)
            else:
                self.sock.sendall(data)
        except OSError as error:
            raise _Broken(f"sending failed: {describe(error)}", closed=True) from None

    def reply(self, timeout: float) -> ELockReply:
        """The next reply, waiting at most C{timeout} seconds for it; raise L{_Broken}."""
        deadline = time.monotonic() + timeout
        while not self._lines:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Broken(f"no reply within {timeout:g} s")
            if self._selector.select(left):
                self._receive()
        try:
            reply = elock_wire.parse_reply(self._lines.popleft())
        except UnexpectedReply as error:
            raise _Broken(str(error)) from None
        if elock_wire.refuses_connection(reply):
            raise _AuthRefused(reply)
        return reply

    def ask(self, lines: Sequence[bytes], timeout: float) -> list[ELockReply]:
        """
        Send C{lines} together; their replies, each within C{timeout} of the
        one before.  If the server closes the connection (an end of file, a
        reset, a send that failed) after an error reply, that reply is the
        reason of the L{_Broken}; any other failure (no reply in time) is
        its own reason.
        """
        replies: list[ELockReply] = []
        try:
            try:
                self.send(b"".join(lines))
            except _Broken:
                self._read_what_is_there()  # the server may have said why before it closed
                if not self._lines:
                    raise
                replies.append(self.reply(0))
                raise
            while len(replies) < len(lines):
                replies.append(self.reply(timeout))
        except _Broken as broken:
            if broken.closed and replies and replies[-1].status >= 400:
                raise _Broken(f"the server closed the connection: {replies[-1]}", closed=True) from broken
            raise
        return replies

    def _read_what_is_there(self) -> None:
        """Read the lines already received, without waiting."""
        try:
            while not self._lines and self._selector.select(0):
                self._receive()
        except _Broken:
            pass

    def watch(self, timeout: float, wake: socket.socket) -> None:
        """
        While idle: wait up to C{timeout} for C{wake} to be readable; raise
        L{_Broken} if meanwhile the server closes the connection or says
        anything (nothing was asked).
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ, "server")
            selector.register(wake, selectors.EVENT_READ, "wake")
            for key, _ in selector.select(timeout):
                if key.data == "server":
                    self._receive()
                    if self._lines:
                        raise _Broken(f"an unexpected reply: {self._lines[0]!r}")

    def _receive(self) -> None:
        try:
            data = self.sock.recv(65536)
        except OSError as error:
            raise _Broken(describe(error), closed=True) from None
        if not data:
            raise _Broken("the server closed the connection", closed=True)
        self._decode(data)

    def _decode(self, data: bytes) -> None:
        """Queue the reply lines C{data} (from the socket: TLS's ciphertext) completes."""
        try:
            if self._tls is not None:
                data = self._tls.received(data)  # (after the server's end of TLS, the next recv is the end of file)
            self._lines.extend(self._splitter.feed(data))
        except UnexpectedReply as error:
            raise _Broken(str(error)) from None
        except OSError as error:  # ssl.SSLError: a broken TLS stream
            raise _Broken(describe(error), closed=True) from None

    def close(self) -> None:
        self._selector.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _seconds(name: str, value: Optional[float]) -> float:
    """An elock timeout: a number of seconds, more than 0 (never None: a session's failover needs a bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds, more than 0, not {value!r}")
    return float(value)


class ELockClient:
    """
    A client of one elock server or of one jesync cluster's members, holding
    one session.

    @param servers: one address (C{"host:port"}; a host alone means the
        elock port, 11401; C{"unix:/path"}), or the members of one cluster
        separated by C{|} (C{"a:11401|b:11401|c:11401"}), or an address
        object, or a list of the members.
    @param grace: the session's grace period, in seconds (C{set_timeout}):
        how long the server keeps its locks after its connection drops, and
        how long this client keeps trying to get it back.
    @param connect_timeout: seconds to wait for a connection (and for each send).
    @param read_timeout: seconds a server may take to answer (beyond a
        lock's own wait) before the connection is given up for dead and the
        client fails over.
    @param heartbeat: seconds between heartbeats while idle (None: a third of
        C{grace}, at most 5).
    @param options: the connection settings, one L{ConnectOptions} (its
        timeouts must be numbers, more than 0); or, instead, the keywords
        below and C{auth_token_file}, C{tls}, C{tls_ca_file},
        C{tls_server_name} as for L{jesync.client.Client} (read from
        C{$JESYNC_...} when not given).
    @param environ: as for L{jesync.client.Client}.
    @param connect_retries, retry_backoff, retry_backoff_max: how starting a
        new session retries (L{jesync.client.config.Backoff}); a resume
        retries with the same backoff for the grace period instead.

    Making it connects and starts the session (raising L{ConnectFailed} or
    L{AccessRefused} if no member lets it: a refused or missing token is
    L{AuthFailed}, protected mode an L{AccessRefused}, with the server's
    line).  If the session cannot be resumed
    within its grace period, every lock is reported lost, the request that
    was waiting raises L{ConnectionLost}, and the next request starts a new
    session.
    """

    def __init__(
        self,
        servers: Union[str, Address, Sequence[Union[str, Member]]],
        *,
        grace: float = 30.0,
        heartbeat: Optional[float] = None,
        options: Optional[ConnectOptions] = None,
        environ: Optional[Mapping[str, str]] = None,
        **keywords: Unpack[ConnectKeywords],
    ) -> None:
        self.members = elock_wire.parse_members(servers)
        _, self.options = client_options(self.members[0], options, environ, keywords)
        self._grace_ms = elock_wire.grace_milliseconds(grace)
        self.grace = self._grace_ms / 1000
        self.connect_timeout = _seconds("connect_timeout", self.options.connect_timeout)
        self.read_timeout = _seconds("read_timeout", self.options.read_timeout)
        if heartbeat is None:
            heartbeat = min(HEARTBEAT_MAX, max(self.grace / 3, 0.05))
        elif isinstance(heartbeat, bool) or not isinstance(heartbeat, (int, float)) or not heartbeat > 0:
            raise ValueError(f"heartbeat must be a number of seconds, more than 0, not {heartbeat!r}")
        self.heartbeat = float(heartbeat)

        self._mutex = threading.Lock()  # guards the queue and closing
        self._queue: Deque[_Pending] = deque()
        self._closing = False
        self._stopped = threading.Event()
        # the session's id, connection and member, changed only along its failover machine;
        # its heartbeat's liveness, and the handles it holds
        self._session = ELockSession(heartbeat=self.heartbeat, report_lost=self._tell_lost)
        self._fencing = True
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        try:
            self._start_session()
        except BaseException:
            self._wake_reader.close()
            self._wake_writer.close()
            raise
        self._thread_done = threading.Event()
        start_background(self._run, "jesync elock client")

    def __repr__(self) -> str:
        return f"<ELockClient session {self._session.id} via {self.address}>"

    # -- the public operations ----------------------------------------------

    @property
    def session_id(self) -> Optional[str]:
        """The session's id (None while it has none: after one was given up, until the next request)."""
        return self._session.id

    @property
    def address(self) -> Member:
        """The member the client talks to (or last talked to)."""
        return self.members[self._session.member_index]

    def lock(self, key: str, wait: float = 0) -> ELockHandle:
        """
        Acquire C{key} for the session.

        @param wait: seconds to wait for it if someone else holds it (0: do
            not wait); elock counts whole seconds, so a fraction is rounded up.
        @raise LockTimeout: someone else holds it (and still did after C{wait}).
        @raise KeyBusy: this client holds it already, or is asking for it.
        @raise ServerError: the server refused the request (e.g. a limit).
        @raise ConnectionLost: no member answered within the grace period
            (L{ConnectFailed}: none would start a new session).
        """
        request = Request("lock", key)
        request.line()  # check the key now
        seconds = elock_wire.wait_seconds(wait)
        holds = self._session.holds
        holds.ask(key)
        pending = _Pending(request, seconds)
        try:
            return self._call(pending)
        except BaseException:
            if not pending.future.done():
                # The caller stopped waiting (KeyboardInterrupt): don't leave the session holding it.
                pending.future.add_done_callback(self._unlock_unwanted)
            raise
        finally:
            holds.asked(key)

    def unlock(self, key: str) -> bool:
        """
        Release C{key}: True if the session held it until now; False if not
        (never held, released already, or lost: that raises nothing).
        """
        Request("unlock", key).line()
        if self._session.holds.released_or_lost(key):
            return False
        result: bool = self._call(_Pending(Request("unlock", key)))
        return result

    def unlock_all(self) -> None:
        """Release every lock of the session."""
        self._call(_Pending(Request("unlock_all")))

    def owned(self, key: str) -> bool:
        """
        Ask the server whether the session holds C{key}.  A handle the server
        says is not held any more is lost (its callbacks are called).  Needs
        a server with C{owned} (jesync; L{ServerError} from others).
        """
        Request("owned", key).line()
        result: bool = self._call(_Pending(Request("owned", key)))
        return result

    def held(self) -> list[ELockHandle]:
        """The handles the session holds, as far as this client knows."""
        return self._session.holds.held()

    def close(self) -> None:
        """
        End the session (C{quit}): the server releases its locks at once.
        Waits for a request another thread has outstanding (a C{lock} waits
        up to its C{wait}).  Never raises for an unreachable server: its
        locks then end with the grace period.
        """
        with self._mutex:
            if self._closing:
                return
            self._closing = True
            quitting = _Pending(Request("quit"))
            self._queue.append(quitting)
        self._wake()
        try:
            quitting.future.result()
        except ClientError as error:
            log.info("could not end the elock session %s: %s", self._session.id, error)
        self._thread_done.wait()
        self._wake_reader.close()
        self._wake_writer.close()

    def __enter__(self) -> ELockClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- handing requests to the I/O thread -------------------------------

    def _call(self, pending: _Pending) -> Any:
        with self._mutex:
            if self._closing:
                raise ClientError("the elock client is closed")
            self._queue.append(pending)
        self._wake()
        return pending.future.result()

    def _unlock_unwanted(self, future: Future[Any]) -> None:
        """A lock nobody waits for any more was granted: queue its unlock (in the I/O thread: never wait)."""
        if future.cancelled() or future.exception() is not None:
            return
        with self._mutex:
            if not self._closing:
                self._queue.append(_Pending(Request("unlock", future.result().key)))

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"x")
        except OSError:
            pass  # its buffer is full: the thread is awake anyway

    def _drain_wake(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except OSError:
            pass

    # -- the I/O thread -----------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                pending = self._next()
                if pending is None:
                    return
                self._serve(pending)
        except BaseException:
            log.exception("the elock client's I/O thread failed")
        finally:
            self._stop()

    def _next(self) -> Optional[_Pending]:
        """The next request; meanwhile watch the connection and send heartbeats."""
        while True:
            self._drain_wake()
            with self._mutex:
                if self._queue:
                    return self._queue.popleft()
                if self._closing:
                    return None
            connection = self._connection
            if connection is None:
                with selectors.DefaultSelector() as selector:
                    selector.register(self._wake_reader, selectors.EVENT_READ)
                    selector.select()
                continue
            due_in = self._session.heartbeat_due_in()
            if due_in <= 0:
                return _Pending(Request("ping"))
            try:
                connection.watch(due_in, self._wake_reader)
            except _Broken as broken:
                try:
                    self._fail_over(str(broken), None)
                except ClientError as error:
                    log.warning("elock session lost: %s", error)

    def _serve(self, pending: _Pending) -> None:
        request = pending.request
        failovers = 0
        try:
            if self._connection is None:
                if request.kind == "quit":
                    pending.future.set_result(self._done(request, None))
                    return
                self._start_session()
            while True:
                connection = self._connection
                assert connection is not None
                try:
                    connection.send(request.line(pending.wait_left()))
                    reply = connection.reply(pending.wait_left() + self.read_timeout)
                    self._session.heard()
                    result = self._answered(request, reply, pending.wait)
                except _Broken as broken:
                    if failovers == MAX_FAILOVERS_PER_REQUEST:
                        raise ConnectionLost(str(connection.address), f"{broken} (after {failovers} failovers)")
                    failovers += 1
                    held = self._fail_over(str(broken), request)
                    outcome = elock_wire.after_resume(request, held)
                    if outcome is AGAIN:
                        continue
                    result = self._done(request, outcome)
                break
        except BaseException as error:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)

    def _answered(self, request: Request, reply: ELockReply, wait: int) -> Any:
        """A request's result from its reply (raising its error)."""
        if request.kind == "lock":
            return self._done(request, elock_wire.acquired(reply, request.key or "", wait))
        if request.kind == "unlock":
            return self._done(request, elock_wire.unlocked(reply))
        if request.kind == "owned":
            return self._done(request, elock_wire.owned(reply))
        if request.kind == "ping":
            try:
                answered = elock_wire.session_id(reply)
            except UnexpectedReply as error:
                raise _Broken(str(error)) from None
            if answered != self._session.id:
                raise _Broken(f"the heartbeat's conn_id answered another session: {reply}")
            return None
        if request.kind == "unlock_all":
            if reply.status != 200:
                raise elock_wire.refused(reply)
            return self._done(request, None)
        return self._done(request, None)  # quit: the server closes the connection

    def _done(self, request: Request, outcome: Any) -> Any:
        """Bring the session's handles up to date with a request's outcome; the caller's result."""
        key = request.key or ""
        holds = self._session.holds
        if request.kind == "lock":
            return holds.granted(self, key, outcome)
        if request.kind == "unlock":
            holds.released(key)
            return outcome
        if request.kind == "owned":
            assert isinstance(outcome, Owned)
            holds.owned(key, outcome.held, outcome.token)
            return outcome.held
        if request.kind in ("unlock_all", "quit"):
            holds.release_all()
            if request.kind == "quit":
                self._session.end()
            return None
        return outcome

    # -- sessions -------------------------------------------------------------

    def _members_from(self, index: int) -> list[tuple[int, Member]]:
        """Every member, starting with the one at C{index}."""
        order = list(range(index, len(self.members))) + list(range(index))
        return [(i, self.members[i]) for i in order]

    def _open(self, address: Member) -> tuple[_Connection, list[bytes]]:
        """A connection to C{address}, and the lines that must open it (C{auth <token>})."""
        try:
            token = self.options.token()
        except ValueError as error:
            raise ConnectFailed(str(address), str(error), retryable=False) from None
        connection = _Connection(address, self.options, self.connect_timeout)
        return connection, [] if token is None else [elock_wire.auth_request(token)]

    def _authenticate(self, connection: _Connection, opening: list[bytes], lines: list[bytes]) -> list[ELockReply]:
        """
        Send C{opening} (C{auth <token>}, or nothing) and C{lines}; the
        replies to C{lines}.  Raise L{AccessRefused} if the server refuses
        the connection (protected mode), L{AuthFailed} if it refuses the
        token, or wants one and got none.
        """
        try:
            replies = connection.ask(opening + lines, self.read_timeout)
        except _AuthRefused as refusal:
            (reply,) = refusal.args
            raise elock_wire.connection_refused(str(connection.address), reply, bool(opening)) from None
        if opening and replies[0].status != 200:
            raise AuthFailed(str(connection.address), str(replies[0]), True)
        return replies[len(opening) :]

    def _settle(self, connection: _Connection, opening: list[bytes], lines: list[bytes]) -> list[ELockReply]:
        """
        The session's settings on a new connection (after C{opening}:
        C{set_timeout}, then C{fencing on} if the server has it), with
        C{lines} after them; their replies.
        """
        head = [elock_wire.set_timeout_request(self._grace_ms)] + ([elock_wire.FENCING_ON] if self._fencing else [])
        replies = self._authenticate(connection, opening, head + lines)
        if replies[0].status != 200:
            raise elock_wire.refused(replies[0])
        if self._fencing and replies[1].status != 200:
            if not elock_wire.is_unknown_command(replies[1]):
                raise elock_wire.refused(replies[1])
            self._fencing = False  # a server without fencing tokens: grants carry none
        return replies[len(head) :]

    def _start_session(self) -> None:
        """Connect to a member and start a new session; raise L{ConnectFailed} (or L{AccessRefused})."""
        backoff = self.options.backoff(None, time.monotonic())
        while True:
            failures = []
            for index, address in self._members_from(self._session.member_index):
                try:
                    connection, opening = self._open(address)
                except ConnectFailed as error:
                    if not error.retryable:
                        raise
                    failures.append(error.reason)
                    continue
                try:
                    (reply,) = self._settle(connection, opening, [elock_wire.CONN_ID])
                    session_id = elock_wire.session_id(reply)
                except (_Broken, UnexpectedReply) as broken:
                    connection.close()
                    failures.append(f"{address}: {broken}")
                    continue
                except ClientError:
                    connection.close()
                    raise
                try:
                    self._session.start(connection, index, session_id)
                except BaseException:
                    connection.close()
                    raise
                return
            pause = backoff.next_pause(time.monotonic())
            if pause is None:
                raise ConnectFailed(_names(self.members), "; ".join(failures))
            if self._stopped.wait(pause):
                raise ConnectFailed(_names(self.members), "the client was closed")

    @property
    def _connection(self) -> Optional[_Connection]:
        connection: Optional[_Connection] = self._session.connection
        return connection

    def _fail_over(self, reason: str, request: Optional[Request]) -> Optional[dict[str, Optional[int]]]:
        """
        The connection failed: resume the session through whichever member
        answers within the grace period, report lost the keys it no longer
        holds, and return what it holds of those asked about (None if the
        server could not say).  Raise L{ConnectionLost} if no member took the
        session back in time: every lock is lost, and the next request
        starts a new session.
        """
        failed = self._connection.address if self._connection is not None else self.address
        self._session.broke()
        log.info("elock session %s: connection to %s failed (%s); resuming it", self._session.id, failed, reason)
        keys = elock_wire.keys_to_check(self._session.holds.held_keys(), request)
        quitting = request is not None and request.kind == "quit"
        retries = 0 if quitting else 1 + int(self.grace / max(self.options.retry_backoff, 0.01))
        backoff = Backoff(
            retries, self.options.retry_backoff, self.options.retry_backoff_max, self.grace, time.monotonic()
        )
        failures: list[str] = [f"{failed}: {reason}"]
        resumed = False
        try:
            while True:
                for index, address in self._members_from(self._session.member_index):
                    try:
                        held = self._resume(address, keys)
                    except AccessRefused as error:  # a refused token too: trying again cannot mend it
                        failures.append(str(error))
                        break
                    except ConnectFailed as error:
                        failures.append(str(error))
                        if not error.retryable:
                            break
                        continue
                    except (_Broken, _Refused, UnexpectedReply, ServerError) as error:
                        failures.append(f"{address}: {error}")
                        continue
                    resumed = True
                    self._lose_unheld(held, address, request)
                    return held
                else:
                    pause = backoff.next_pause(time.monotonic())
                    if pause is not None and not self._stopped.wait(pause):
                        continue
                break
        except BaseException:
            # Anything else that escapes (a bug, an interrupt) leaves no session half-resumed.
            if not resumed:
                self._session.give_up()
            raise
        # Out of time, or a failure trying again cannot mend: the session is gone.
        self._session.give_up()
        if request is not None and request.kind == "quit":
            self._done(request, None)  # it was ending anyway: its locks end with the grace period
        else:
            self._session.holds.lose_all(f"no member took the session back within its grace period ({self.grace:g} s)")
        raise ConnectionLost(_names(self.members), "; ".join(failures[-len(self.members) - 1 :]))

    def _resume(self, address: Member, keys: list[str]) -> Optional[dict[str, Optional[int]]]:
        """Take the session back through C{address}; what it holds of C{keys} (None: the server cannot say)."""
        assert self._session.id is not None
        connection, opening = self._open(address)
        try:
            (reply,) = self._authenticate(connection, opening, [elock_wire.resume_request(self._session.id)])
            if reply.status == 403:
                raise _Refused(f"{reply} (still attached to the old connection?)")
            if reply.status != 200:
                raise elock_wire.refused(reply)
            self._settle(connection, [], [])
            held: Optional[dict[str, Optional[int]]] = {}
            for start in range(0, len(keys), OWNED_BATCH):
                batch = keys[start : start + OWNED_BATCH]
                answers = self._ask_resumed(connection, opening, [elock_wire.owned_request(key) for key in batch])
                if any(elock_wire.is_unknown_command(answer) for answer in answers):
                    # It cannot say what the session kept: give everything up.
                    self._ask_resumed(connection, opening, [elock_wire.UNLOCK_ALL])
                    held = None
                    break
                assert held is not None
                for key, answer in zip(batch, answers):
                    verdict = elock_wire.owned(answer)
                    if verdict.held:
                        held[key] = verdict.token
        except BaseException:
            connection.close()
            raise
        self._session.resume(connection, self.members.index(address))
        log.info("elock session %s resumed through %s", self._session.id, address)
        return held

    def _ask_resumed(self, connection: _Connection, opening: list[bytes], lines: list[bytes]) -> list[ELockReply]:
        """C{connection.ask}, on a connection taking a session back: a refusal of the connection is L{AccessRefused}."""
        try:
            return connection.ask(lines, self.read_timeout)
        except _AuthRefused as refusal:
            (reply,) = refusal.args
            raise elock_wire.connection_refused(str(connection.address), reply, bool(opening)) from None

    def _lose_unheld(
        self, held: Optional[dict[str, Optional[int]]], address: Member, request: Optional[Request]
    ) -> None:
        """
        Report lost the handles whose keys the resumed session does not hold
        (but not those an interrupted C{unlock}, C{unlock_all} or C{quit}
        was giving back: they are released).
        """
        if request is not None and request.kind in ("unlock_all", "quit"):
            return
        reason = (
            f"{address} cannot say whether the session kept it (no owned command), so it was released"
            if held is None
            else f"the session no longer held it when resumed through {address}"
        )
        spare = [request.key or ""] if request is not None and request.kind == "unlock" else []
        self._session.holds.keep_only(held or {}, reason, spare)

    def _tell_lost(self, lost: Lost) -> None:
        """Call the lost callbacks from a thread of their own (a callback may use this client)."""
        calls = [(callback, handle.lost_reason) for handle, callbacks in lost for callback in callbacks]
        for handle, _ in lost:
            log.warning("elock session %s lost %r: %s", self._session.id, handle.key, handle.lost_reason)
        if calls:
            start_background(_call_all, "jesync elock lost callbacks", calls)

    def _stop(self) -> None:
        """The I/O thread ends: fail whatever is queued, drop the connection."""
        self._stopped.set()
        with self._mutex:
            self._closing = True
            queued = list(self._queue)
            self._queue.clear()
        self._session.holds.release_all()
        for pending in queued:
            if pending.request.kind == "quit":
                pending.future.set_result(None)
            else:
                pending.future.set_exception(ClientError("the elock client is closed"))
        self._session.end()
        self._thread_done.set()


def _call_all(calls: list[tuple[LostCallback, LockLost]]) -> None:
    for callback, error in calls:
        call_quietly(callback, error)


def _names(members: Sequence[Member]) -> str:
    return "|".join(str(member) for member in members)
