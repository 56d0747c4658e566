"""
Every client tells the server's refusal: the blocking, asyncio, Twisted and
elock clients and the C{jesync} command, each refused by protected mode, for
a wrong token and for a missing one, over plain TCP and over TLS, against
real servers (the protected one a C{twistd jesync} process, the one wanting
a token in a thread of this process).  The server's own line must reach the
exception (its C{message}, word for word, and its text) and the command's
stderr, with the documented exception type and exit status (76).

Protected mode refuses clients that are not on the server's host, and every
test client is on loopback: the protected server here is the real C{twistd
jesync}, run in a child process whose locality check
(C{jesync.connections.connection.is_local}) is replaced by one that finds
every peer remote.  That is the only change; no server option is involved.
It must be a process of its own: in this one, the replaced check would
refuse every other test's clients.

The refusal and the clients' first requests cross on the wire in every
order (a line before anything is sent, in answer to C{auth} or to C{fencing
on}, a send that fails because the server has closed, TLS's close_notify
right behind the line): L{SessionTests} drives those orders without I/O.
The orders a real server shows only by chance, and the other closing lines,
are forced by a stand-in server on a socket (L{StandIn}): TLS 1.2's last
handshake message, the line and the close_notify in one segment; an asyncio
write that fails before the loop has read the line; C{max-connections
exceeded} in answer to C{auth}.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import sys
import tempfile
import threading
import time
from typing import Any, Callable, NamedTuple, Optional
from unittest import SkipTest

from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from jesync.cli import EXIT_REFUSED, EXIT_UNAVAILABLE
from jesync.client import (
    AccessRefused,
    AsyncClient,
    AuthFailed,
    Client,
    ConnectFailed,
    ConnectionLost,
    ELockClient,
    ServerError,
    TwistedClient,
)
from jesync.client.pipeline import discard
from jesync.client.session import Session
from jesync.errors import ProtectedMode
from tests.client_pki import PKI, TOKEN, _AtExit, skip_without_tls, temp_dir, write
from tests.servers import ServerProcess, ServerThread, free_port, run_command_line

#: What the server says to a client that protected mode refuses (JESync's limit reply).
PROTECTED_LINE = "INVALID_PARAMETER: " + ProtectedMode.MESSAGE
AUTH_LINE = "INVALID_PARAMETER: auth failed"

# The real twistd, with a locality check that finds every peer remote (and,
# on Linux, killed with the test process, as tests.servers does).
_EVERY_PEER_REMOTE = """\
import signal, sys
if sys.platform == "linux":
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
import jesync.connections.connection as connection
import jesync.metrics_connections as metrics_connections
connection.is_local = metrics_connections.is_local = lambda address: False
from twisted.scripts.twistd import run
sys.argv = ["twistd", *sys.argv[1:]]
run()
"""


def tls_endpoint(port: int, pki: PKI) -> str:
    return f"ssl:{port}:privateKey={pki.key_file}:certKey={pki.certificate_file}:interface=127.0.0.1"


class Listeners:
    """The four listeners of a test server: JESync and elock, each on plain TCP and on TLS."""

    def __init__(self, pki: PKI) -> None:
        self.jesync, self.jesync_tls, self.elock, self.elock_tls = (free_port() for _ in range(4))
        self.arguments = [
            "--port",
            f"tcp:{self.jesync}:interface=127.0.0.1",
            "--port",
            tls_endpoint(self.jesync_tls, pki),
            "--elock-port",
            f"tcp:{self.elock}:interface=127.0.0.1",
            "--elock-port",
            tls_endpoint(self.elock_tls, pki),
        ]

    def address(self, protocol: str, tls: bool) -> str:
        ports = {("jesync", False): self.jesync, ("jesync", True): self.jesync_tls}
        ports.update({("elock", False): self.elock, ("elock", True): self.elock_tls})
        return f"127.0.0.1:{ports[protocol, tls]}"


class ProtectedServer(ServerProcess):
    """
    C{twistd jesync} in protected mode (no token) that counts every client as
    remote.  A process is the point: its locality check is replaced for the
    whole process, which in this one would refuse every other test's clients.
    """

    def __init__(self, pki: PKI) -> None:
        self.listeners = Listeners(pki)
        super().__init__(extra_args=self.listeners.arguments)

    def twistd_command(self) -> list[str]:
        return [sys.executable, "-c", _EVERY_PEER_REMOTE]

    def _answers(self, probe: socket.socket) -> bool:
        """Ready once a loopback client gets the protected-mode refusal (so the stand-in is in place)."""
        return probe.makefile("rb").readline() == PROTECTED_LINE.encode() + b"\n"


class Servers:
    """The two servers every test here uses: one in protected mode, one wanting L{TOKEN}."""

    def __init__(self, test: Any) -> None:
        directory = temp_dir(test)
        self.pki = PKI(directory)
        self.token_file = write(directory, "token", TOKEN + b"\n")
        self.wrong_token_file = write(directory, "wrong-token", b"not-the-token\n")
        self.protected = ProtectedServer(self.pki)
        test.addCleanup(self.protected.close)
        self.protected.start()
        self.secured_listeners = Listeners(self.pki)
        secured = ServerThread(
            extra_args=["--auth-token-file", self.token_file, *self.secured_listeners.arguments], auth_token=TOKEN
        )
        # Its readiness probe uses its own --port; the listeners' ports are what the tests use.
        test.addCleanup(secured.close)
        self.secured = secured.start()


_shared: list[Servers] = []


def servers() -> Servers:
    """The L{Servers}, started on first use and stopped when the test run ends."""
    if skip_without_tls:
        raise SkipTest(skip_without_tls)
    if not _shared:
        _shared.append(Servers(_AtExit()))
    return _shared[0]


class Refusal(NamedTuple):
    """One way to be refused: which server, with which token file, and what the client must report."""

    protected: bool  # the protected server, else the one wanting a token
    token: Optional[str]  # "right", "wrong" or None
    error: type  # the exception's class
    jesync_line: str  # the server's line, as a JESync client's exception's message
    elock_line: str  # the same, from the elock listener
    hint: str  # in the exception's text (and the command's stderr)


REFUSALS = {
    "protected_mode": Refusal(
        True, None, AccessRefused, PROTECTED_LINE, "503 " + ProtectedMode.MESSAGE, "refused the connection"
    ),
    "wrong_token": Refusal(False, "wrong", AuthFailed, AUTH_LINE, "403 auth failed", "refused the auth token"),
    "missing_token": Refusal(False, None, AuthFailed, AUTH_LINE, "403 auth failed", "needs an auth token"),
}


def client_options(refusal: Refusal, tls: bool) -> dict[str, Any]:
    """The client's arguments (no retries: a refusal is never retried anyway, so none may be needed)."""
    shared = servers()
    options: dict[str, Any] = {"environ": {}, "connect_retries": 0}
    if refusal.token is not None:
        options["auth_token_file"] = shared.token_file if refusal.token == "right" else shared.wrong_token_file
    if tls:
        options["tls_ca_file"] = shared.pki.ca_file
    return options


def address(refusal: Refusal, tls: bool, protocol: str = "jesync") -> str:
    shared = servers()
    listeners = shared.protected.listeners if refusal.protected else shared.secured_listeners
    return listeners.address(protocol, tls)


def for_each_refusal(check: Callable[..., Any]) -> Callable[[type], type]:
    """A class decorator: a test_<refusal>_<tcp|tls> method per refusal and transport, each calling C{check}."""

    def decorate(cls: type) -> type:
        for name, refusal in REFUSALS.items():
            for tls in (False, True):

                def test(self: Any, refusal: Refusal = refusal, tls: bool = tls) -> Any:
                    return check(self, refusal, tls)

                test.__name__ = f"test_{name}_{'tls' if tls else 'tcp'}"
                test.__doc__ = f"{name.replace('_', ' ')} over {'TLS' if tls else 'plain TCP'}"
                setattr(cls, test.__name__, test)
        return cls

    return decorate


def assert_refusal(test: Any, error: BaseException, refusal: Refusal, line: str) -> None:
    """C{error} is the refusal's exception, carrying the server's line word for word."""
    test.assertIsInstance(error, refusal.error)
    assert isinstance(error, AccessRefused)
    test.assertEqual(error.message, line)
    test.assertIn(line, str(error))
    test.assertIn(refusal.hint, str(error))
    test.assertNotIn(TOKEN.decode(), str(error))


# -- the blocking client -------------------------------------------------------------


def _blocking(test: SynchronousTestCase, refusal: Refusal, tls: bool) -> None:
    client = Client(address(refusal, tls), **client_options(refusal, tls))
    test.addCleanup(client.close)
    start = time.monotonic()
    with test.assertRaises(AccessRefused) as caught:
        client.lock("refused", wait=0)
    assert_refusal(test, caught.exception, refusal, refusal.jesync_line)
    test.assertLess(time.monotonic() - start, 5)
    with test.assertRaises(AccessRefused):  # every try says so, not only the first
        client.status("refused")


@for_each_refusal(_blocking)
class BlockingClientTests(SynchronousTestCase):
    pass


# -- the asyncio client --------------------------------------------------------------


def _asyncio(test: SynchronousTestCase, refusal: Refusal, tls: bool) -> None:
    async def status() -> None:
        async with AsyncClient(address(refusal, tls), **client_options(refusal, tls)) as client:
            await client.status("refused")

    with test.assertRaises(AccessRefused) as caught:
        asyncio.run(asyncio.wait_for(status(), 20))
    assert_refusal(test, caught.exception, refusal, refusal.jesync_line)


@for_each_refusal(_asyncio)
class AsyncClientTests(SynchronousTestCase):
    pass


# -- the Twisted client --------------------------------------------------------------


async def _twisted(test: TestCase, refusal: Refusal, tls: bool) -> None:
    client = TwistedClient(reactor, address(refusal, tls), **client_options(refusal, tls))
    test.addCleanup(client.close)
    with test.assertRaises(AccessRefused) as caught:
        await client.status("refused")
    assert_refusal(test, caught.exception, refusal, refusal.jesync_line)


@for_each_refusal(_twisted)
class TwistedClientTests(TestCase):
    timeout = 60


# -- the elock client ------------------------------------------------------------------


def _elock(test: SynchronousTestCase, refusal: Refusal, tls: bool) -> None:
    with test.assertRaises(AccessRefused) as caught:
        options = client_options(refusal, tls)
        ELockClient(address(refusal, tls, "elock"), connect_timeout=5, read_timeout=5, **options).close()
    assert_refusal(test, caught.exception, refusal, refusal.elock_line)


@for_each_refusal(_elock)
class ELockClientTests(SynchronousTestCase):
    pass


# -- the command line -------------------------------------------------------------------


def cli_variables(refusal: Refusal, tls: bool) -> dict[str, str]:
    options = client_options(refusal, tls)
    variables = {"JESYNC_SERVERS": address(refusal, tls)}
    if "auth_token_file" in options:
        variables["JESYNC_AUTH_TOKEN_FILE"] = options["auth_token_file"]
    if tls:
        variables["JESYNC_TLS_CA_FILE"] = options["tls_ca_file"]
    return variables


def _command_line(test: SynchronousTestCase, refusal: Refusal, tls: bool) -> None:
    done = run_command_line("status", "refused", **cli_variables(refusal, tls))
    test.assertEqual(done.returncode, EXIT_REFUSED, done.stderr)
    test.assertEqual(done.stdout, "")
    [line] = done.stderr.splitlines()
    test.assertTrue(line.startswith(f"jesync: {address(refusal, tls)}: "), line)
    test.assertIn(refusal.hint, line)
    test.assertIn(refusal.jesync_line, line)


@for_each_refusal(_command_line)
class CommandLineTests(SynchronousTestCase):
    def test_every_command(self) -> None:
        """Every command exits 76 with the protected-mode line, the lock's COMMAND never running."""
        variables = cli_variables(REFUSALS["protected_mode"], tls=False)
        marker = os.path.join(tempfile.mkdtemp(), "ran")
        for args in (["list"], ["ping"], ["lock", "refused", "--", sys.executable, "-c", f"open({marker!r}, 'w')"]):
            done = run_command_line(*args, **variables)
            self.assertEqual(done.returncode, EXIT_REFUSED, (args, done.stderr))
            self.assertIn(PROTECTED_LINE, done.stderr)
        self.assertFalse(os.path.exists(marker))


# -- the orders on the wire, without I/O -------------------------------------------------


class SessionTests(SynchronousTestCase):
    """The refusal line, and the server closing, in every order the clients can see them."""

    def session(self) -> tuple[Session, list[Any]]:
        """A session, and where its handshake's outcome goes."""
        return Session("server:1", lambda data: None, lambda *args: None), []  # type: ignore[arg-type]

    def test_protected_mode_before_anything_sent(self) -> None:
        """The line arrives before the handshake is sent (TLS: with the end of the handshake)."""
        session, outcome = self.session()
        session.line_received(PROTECTED_LINE.encode())
        self.assertTrue(session.closed)
        session.handshake(None, outcome.append, outcome.append)
        [error] = outcome
        self.assertIsInstance(error, AccessRefused)
        self.assertEqual(error.message, PROTECTED_LINE)

    def test_protected_mode_answering_auth(self) -> None:
        """With a token the line answers C{auth}: access refused, not a refused token."""
        session, outcome = self.session()
        session.handshake(TOKEN, outcome.append, outcome.append)
        session.line_received(PROTECTED_LINE.encode())
        [error] = outcome
        self.assertIs(type(error), AccessRefused)
        self.assertEqual(error.message, PROTECTED_LINE)

    def test_protected_mode_answering_fencing(self) -> None:
        """Without a token the session is ready at once; the line (to C{fencing on}) fails what follows."""
        session, outcome = self.session()
        session.handshake(None, outcome.append, outcome.append)
        self.assertEqual(outcome, [None])
        errors: list[Exception] = []
        session.status("k", discard, errors.append)
        session.line_received(PROTECTED_LINE.encode())
        [error] = errors
        self.assertIsInstance(error, AccessRefused)
        session.server_closed("sending failed: Broken pipe")
        self.assertRaises(AccessRefused, session.status, "k", discard, discard)

    def test_last_words_answering_fencing(self) -> None:
        """Another error to C{fencing on}, then the close: the line is the reason, not the broken pipe."""
        session, outcome = self.session()
        session.handshake(None, outcome.append, outcome.append)
        errors: list[Exception] = []
        session.status("k", discard, errors.append)
        session.line_received(b"INVALID_PARAMETER: max-connections exceeded (10)")
        self.assertFalse(session.closed)  # (an older server refuses fencing on: then it goes on)
        session.server_closed("sending failed: Broken pipe")
        [error] = errors
        assert isinstance(error, ConnectionLost)
        self.assertEqual(
            error.reason, "the server closed the connection: INVALID_PARAMETER: max-connections exceeded (10)"
        )

    def test_older_server_without_fencing_then_closed(self) -> None:
        """A fencing refusal followed by other replies is not the reason the connection ends later."""
        session, outcome = self.session()
        session.handshake(None, outcome.append, outcome.append)
        session.line_received(b"INVALID_COMMAND")
        errors: list[Exception] = []
        session.status("k", discard, errors.append)
        session.line_received(b"STATUS 0 0 k")
        session.status("k", discard, errors.append)
        session.server_closed()
        [error] = errors
        assert isinstance(error, ConnectionLost)
        self.assertEqual(error.reason, "the server closed the connection")

    def test_line_answering_no_request(self) -> None:
        """An error line while nothing is owed (an idle timeout): the connection fails with it."""
        session, outcome = self.session()
        session.handshake(None, outcome.append, outcome.append)
        session.line_received(b"FENCING ON")
        session.line_received(b"INVALID_PARAMETER: idle-timeout exceeded (30)")
        self.assertTrue(session.closed)
        with self.assertRaises(ConnectionLost) as caught:
            session.status("k", discard, discard)
        self.assertEqual(
            caught.exception.reason, "the server closed the connection: INVALID_PARAMETER: idle-timeout exceeded (30)"
        )

    def test_refused_token_is_not_access_refused_only(self) -> None:
        """L{AuthFailed} is an L{AccessRefused} (and still a ServerError), so one except clause takes both."""
        session, outcome = self.session()
        session.handshake(TOKEN, outcome.append, outcome.append)
        session.line_received(AUTH_LINE.encode())
        [error] = outcome
        self.assertIsInstance(error, AuthFailed)
        self.assertIsInstance(error, AccessRefused)

    def test_other_closing_line_answering_auth(self) -> None:
        """With a token, a closing line that is not the auth refusal is the connection's end, not a refused token."""
        for confirm in (False, True):
            session, outcome = self.session()
            session.handshake(TOKEN, outcome.append, outcome.append, confirm)
            errors: list[Exception] = []
            session.status("k", discard, errors.append)
            session.line_received(MAX_CONNECTIONS_LINE.encode())
            [error] = outcome
            self.assertIs(type(error), ConnectionLost, confirm)
            assert isinstance(error, ConnectionLost)
            self.assertEqual(error.reason, f"the server closed the connection: {MAX_CONNECTIONS_LINE}")
            self.assertEqual(errors, [error])
            self.assertTrue(session.closed)

    def test_server_without_auth(self) -> None:
        """A server that does not know C{auth} (C{INVALID_COMMAND}) refused the request: a ServerError, never ready."""
        for confirm in (False, True):
            session, outcome = self.session()
            session.handshake(TOKEN, outcome.append, outcome.append, confirm)
            session.line_received(b"INVALID_COMMAND")
            [error] = outcome
            self.assertIs(type(error), ServerError, confirm)
            self.assertEqual(str(error), "INVALID_COMMAND")
            self.assertTrue(session.closed)

    def test_older_server_refusing_fencing_then_closing(self) -> None:
        """C{INVALID_COMMAND} to C{fencing on} (JESync 0.8), then the close: not the server's last words."""
        session, outcome = self.session()
        session.handshake(None, outcome.append, outcome.append)
        errors: list[Exception] = []
        session.status("k", discard, errors.append)
        session.line_received(b"INVALID_COMMAND")
        self.assertFalse(session.closed)
        session.server_closed("sending failed: Broken pipe")
        [error] = errors
        assert isinstance(error, ConnectionLost)
        self.assertEqual(error.reason, "sending failed: Broken pipe")

    def test_protected_mode_prefix_is_the_servers(self) -> None:
        """The clients know protected mode by the start of the server's own message."""
        from jesync.client import elock_wire, session as session_module

        self.assertTrue(PROTECTED_LINE.encode().startswith(session_module.PROTECTED_MODE))
        self.assertTrue(elock_wire.refuses_connection(elock_wire.parse_reply(b"503 " + ProtectedMode.MESSAGE.encode())))
        self.assertFalse(elock_wire.refuses_connection(elock_wire.parse_reply(b"503 max-connections exceeded (1)")))


# -- orders a real server shows only by chance: a stand-in server on a socket ------------

#: What a server at its connection limit says before it closes (JESync's limit reply).
MAX_CONNECTIONS_LINE = "INVALID_PARAMETER: max-connections exceeded (1)"
#: How long a stand-in waits for anything (far more than it needs).
WITHIN = 10.0


class StandIn:
    """
    A server on loopback that hands each connection to C{serve} (in its
    thread, one connection at a time), then closes it; stopped when the test ends.
    """

    def __init__(self, test: Any, serve: Callable[[socket.socket], None]) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.served = threading.Event()  # set once a connection has been served (and closed)
        self.failures: list[BaseException] = []
        self._serve = serve
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        test.addCleanup(self._stop, thread)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # stopped
            connection.settimeout(WITHIN)
            try:
                self._serve(connection)
            except Exception as error:  # reported by the test (a handshake the client cut short is fine)
                self.failures.append(error)
            finally:
                connection.close()
                self.served.set()

    def _stop(self, thread: threading.Thread) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        thread.join(WITHIN)


def reset(connection: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), at once."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


def drain(connection: socket.socket) -> None:
    """Read until the client closes (or the stand-in's patience ends)."""
    try:
        while connection.recv(65536):
            pass
    except OSError:
        pass


class TLS12Refusal:
    """
    A TLS 1.2 server that writes its last handshake message, C{line} and its
    close_notify in one write, as soon as the handshake is done: the client
    reads them in one recv, while it is still in its own handshake.
    """

    def __init__(self, test: Any, line: str) -> None:
        self.pki = PKI(temp_dir(test))
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(self.pki.certificate_file, self.pki.key_file)
        self._context.maximum_version = ssl.TLSVersion.TLSv1_2
        self._line = line.encode() + b"\n"
        self.stand_in = StandIn(test, self._serve)

    def _serve(self, connection: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self._context.wrap_bio(incoming, outgoing, server_side=True)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    connection.sendall(outgoing.read())
                data = connection.recv(65536)
                if not data:
                    return
                incoming.write(data)
        tls.write(self._line)
        try:
            tls.unwrap()
        except ssl.SSLWantReadError:
            pass  # (the client's close_notify is not awaited)
        connection.sendall(outgoing.read())  # Finished, the line and close_notify in one go
        drain(connection)

    def client_options(self) -> dict[str, Any]:
        return {"tls_ca_file": self.pki.ca_file, "tls_server_name": "localhost", "environ": {}, "connect_retries": 0}


class TLS12Tests(SynchronousTestCase):
    """The refusal line behind the end of a TLS 1.2 handshake reaches the blocking and elock clients."""

    def setUp(self) -> None:
        if skip_without_tls:
            raise SkipTest(skip_without_tls)

    def test_blocking(self) -> None:
        server = TLS12Refusal(self, PROTECTED_LINE)
        client = Client(server.stand_in.address, **server.client_options())
        self.addCleanup(client.close)
        with self.assertRaises(AccessRefused) as caught:
            client.status("refused")
        self.assertEqual(caught.exception.message, PROTECTED_LINE)

    def test_elock(self) -> None:
        line = "503 " + ProtectedMode.MESSAGE
        server = TLS12Refusal(self, line)
        with self.assertRaises(AccessRefused) as caught:
            ELockClient(server.stand_in.address, connect_timeout=WITHIN, read_timeout=WITHIN, **server.client_options())
        self.assertEqual(caught.exception.message, line)


class AsyncioWriteFailsFirstTests(SynchronousTestCase):
    """
    The asyncio client's write fails (the server has reset the connection)
    before its loop has read the server's line: the line is still reported.
    """

    def refused(self, line: str) -> list[BaseException]:
        """Two requests sent once the server has said C{line} and reset the connection; their errors."""
        closed = threading.Event()

        def serve(connection: socket.socket) -> None:
            connection.recv(65536)  # the handshake (fencing on)
            connection.sendall(line.encode() + b"\n")
            reset(connection)
            closed.set()

        server = StandIn(self, serve)

        async def requests() -> list[BaseException]:
            async with AsyncClient(server.address, environ={}, connect_retries=0) as client:
                await client._connection(0)  # connected (ready at once without a token)
                # The loop is busy (blocked here) while the line and the reset arrive.
                self.assertTrue(closed.wait(WITHIN))
                return await asyncio.gather(client.status("a"), client.status("b"), return_exceptions=True)

        return asyncio.run(asyncio.wait_for(requests(), WITHIN))

    def test_protected_mode(self) -> None:
        for error in self.refused(PROTECTED_LINE):
            self.assertIsInstance(error, AccessRefused)
            assert isinstance(error, AccessRefused)
            self.assertEqual(error.message, PROTECTED_LINE)

    def test_closing_line(self) -> None:
        for error in self.refused(MAX_CONNECTIONS_LINE):
            self.assertIs(type(error), ConnectionLost)
            assert isinstance(error, ConnectionLost)
            self.assertEqual(error.reason, f"the server closed the connection: {MAX_CONNECTIONS_LINE}")


class MaxConnectionsWithTokenTests(SynchronousTestCase):
    """A server at its connection limit answers C{auth} with its limit line: the connection's end, not the token."""

    def setUp(self) -> None:
        def serve(connection: socket.socket) -> None:
            connection.sendall(MAX_CONNECTIONS_LINE.encode() + b"\n")
            drain(connection)

        self.server = StandIn(self, serve)
        self.token_file = write(temp_dir(self), "token", TOKEN + b"\n")

    def test_blocking(self) -> None:
        client = Client(self.server.address, environ={}, connect_retries=0, auth_token_file=self.token_file)
        self.addCleanup(client.close)
        with self.assertRaises(ConnectFailed) as caught:
            client.status("k")
        self.assertNotIsInstance(caught.exception, AccessRefused)
        self.assertIn(f"the server closed the connection: {MAX_CONNECTIONS_LINE}", str(caught.exception))

    def test_command_line(self) -> None:
        done = run_command_line("status", "k", JESYNC_SERVERS=self.server.address, JESYNC_AUTH_TOKEN_FILE=self.token_file)
        self.assertEqual(done.returncode, EXIT_UNAVAILABLE, done.stderr)
        self.assertIn(MAX_CONNECTIONS_LINE, done.stderr)
        self.assertNotIn("auth token", done.stderr)


class ELockReadTimeoutTests(SynchronousTestCase):
    """An elock error reply then silence: the client says no reply came, not that the server closed."""

    def test_error_reply_then_silence(self) -> None:
        def serve(connection: socket.socket) -> None:
            connection.recv(65536)  # set_timeout, fencing on, conn_id
            connection.sendall(b"503 busy\r\n")
            drain(connection)  # and nothing more

        server = StandIn(self, serve)
        with self.assertRaises(ConnectFailed) as caught:
            ELockClient(server.address, environ={}, connect_retries=0, connect_timeout=WITHIN, read_timeout=0.5)
        self.assertIn("no reply within 0.5 s", caught.exception.reason)
        self.assertNotIn("closed", caught.exception.reason)

    def test_error_reply_then_close(self) -> None:
        def serve(connection: socket.socket) -> None:
            connection.recv(65536)
            connection.sendall(b"503 max-connections exceeded (1)\r\n")

        server = StandIn(self, serve)
        with self.assertRaises(ConnectFailed) as caught:
            ELockClient(server.address, environ={}, connect_retries=0, connect_timeout=WITHIN, read_timeout=WITHIN)
        self.assertIn("the server closed the connection: 503 max-connections exceeded (1)", caught.exception.reason)
