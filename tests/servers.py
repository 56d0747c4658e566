"""
Real jesync servers for the tcp and process tiers, on real ports:
L{ServerThread} (L{serve_in_thread}), the server C{twistd jesync} would
build, in a thread of the test's process, for the tests that need a real
server over real TCP; L{ServerProcess} (L{start_server}), C{twistd jesync}
itself, for the tests about the process; and L{FakeServer}, a misbehaving
one.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Set

from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.threads import blockingCallFromThread
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from jesync.server import build_server
from jesync.tap import Options, settings_from

ROOT = Path(__file__).resolve().parent.parent
READY_WITHIN = 20.0


def environment() -> dict[str, str]:
    """The environment for a subprocess that must import this checkout's jesync."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))


def shell_environment(testcase, server_address: str) -> dict[str, str]:
    """
    The environment for a docs page's shell lines: a C{jesync} command on
    the PATH (this checkout's, as C{pip install .} would install it, removed
    when C{testcase} ends) and C{JESYNC_SERVERS} naming the test's server.
    """
    bin_directory = tempfile.mkdtemp()
    testcase.addCleanup(shutil.rmtree, bin_directory)
    shim = Path(bin_directory, "jesync")
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m jesync.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return dict(environment(), PATH=bin_directory + os.pathsep + os.environ.get("PATH", ""), JESYNC_SERVERS=server_address)


def run_command_line(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """
    The C{jesync} command of this checkout run to completion (stdin not a
    terminal), with no C{JESYNC_} variable in its environment but
    C{variables}.
    """
    env = {name: value for name, value in environment().items() if not name.startswith("JESYNC_")}
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-m", "jesync.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


# On Linux the server is killed if the test process dies without cleaning up
# (prctl PR_SET_PDEATHSIG survives the exec), so no server outlives a test run.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def twistd_command() -> list[str]:
    twistd = Path(sys.executable).with_name("twistd")
    if not twistd.exists():
        return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
    if sys.platform == "linux":
        return [sys.executable, "-c", _DIE_WITH_PARENT, str(twistd)]
    return [str(twistd)]


def _ports_below_the_ephemeral_range() -> range:
    """
    Ports no outgoing connection takes as its own: below the system's
    ephemeral range (Linux's C{ip_local_port_range}; elsewhere IANA's, 49152
    up).  A port picked by binding to port 0 comes from that range, so a
    client connection (of this test run, or of a tool such as memccapable)
    may take it between the pick and the server's listen.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            low = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 49152
    return range(max(1024, low - 12000), low)


def _this_workers_ports() -> range:
    """
    This test process's share of L{_ports_below_the_ephemeral_range}: under
    pytest-xdist each worker (C{PYTEST_XDIST_WORKER} C{gwN} of
    C{PYTEST_XDIST_WORKER_COUNT}) picks from a slice of its own, so two
    workers never pick the same port between one's pick and its listen.
    """
    ports = _ports_below_the_ephemeral_range()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker[2:]) if worker.startswith("gw") else 0
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        return ports
    if not 0 <= index < count:
        return ports
    share = len(ports) // count
    return ports[index * share : (index + 1) * share]


_picker = random.Random()
_handed_out: Set[int] = set()


def free_port(ipv6: bool = False) -> int:
    """
    A port on loopback nothing listens on now, no outgoing connection will
    take meanwhile, and no other call in this test run returns: a test that
    picks two ports before it listens on either (a server and its memcached
    listener) gets two different ones.
    """
    family, host = (socket.AF_INET6, "::1") if ipv6 else (socket.AF_INET, "127.0.0.1")
    ports = _this_workers_ports()
    for _ in range(100):
        port = _picker.choice(ports)
        if port in _handed_out:
            continue
        with socket.socket(family) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(family) as probe:  # (a crowded range: any port the system gives)
        probe.bind((host, 0))
        return probe.getsockname()[1]


def have_ipv6() -> bool:
    """Whether this host can listen on ::1."""
    try:
        free_port(ipv6=True)
    except OSError:
        return False
    return True


class LocalServer:
    """
    Where a test's server listens, and how the test knows it answers: on
    127.0.0.1 (or ::1) on a port of its own, or on a Unix socket; C{listen}
    is its C{--port} endpoint, C{address} what a client is given.  What
    starts it is a subclass's: L{ServerProcess} (twistd), L{ServerThread}.
    """

    def __init__(
        self,
        unix_socket: Optional[str] = None,
        ipv6: bool = False,
        extra_args: Sequence[str] = (),
        auth_token: Optional[bytes] = None,
    ) -> None:
        self.ipv6 = ipv6
        self.port = free_port(ipv6)
        self.unix_socket = unix_socket
        # More twistd jesync options (--memcache-port ..., --auth-token-file
        # ...), and the token the readiness probe authenticates with.
        self.extra_args = list(extra_args)
        self.auth_token = auth_token

    @property
    def address(self) -> str:
        if self.unix_socket:
            return f"unix:{self.unix_socket}"
        return f"[::1]:{self.port}" if self.ipv6 else f"127.0.0.1:{self.port}"

    @property
    def listen(self) -> str:
        if self.unix_socket:
            return f"unix:{self.unix_socket}"
        if self.ipv6:
            return f"tcp6:{self.port}:interface=\\:\\:1"
        return f"tcp:{self.port}:interface=127.0.0.1"

    def _wait_until_answering(self, ended: Callable[[], Optional[str]]) -> None:
        """
        Return once the server answers a request; raise (after L{kill}) if it
        does not within L{READY_WITHIN} s, or (at once) if C{ended()} says why
        it never will.
        """
        deadline = time.monotonic() + READY_WITHIN
        while True:
            why = ended()
            if why is not None:
                raise RuntimeError(f"{why}:\n{self.log()}")
            try:
                with self._connect() as probe:
                    if self._answers(probe):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the server did not answer within {READY_WITHIN} s:\n{self.log()}")
            time.sleep(0.01)

    def _answers(self, probe: socket.socket) -> bool:
        """Whether the server answers a status request (after C{auth}, with a token)."""
        if self.auth_token is None:
            probe.sendall(b"status ready-probe\n")
            return probe.recv(100) == b"STATUS 0 0 ready-probe\n"
        expected = b"OK\nSTATUS 0 0 ready-probe\n"
        probe.sendall(b"auth " + self.auth_token + b"\nstatus ready-probe\n")
        received = b""
        while len(received) < len(expected):
            chunk = probe.recv(len(expected) - len(received))
            if not chunk:
                break
            received += chunk
        return received == expected

    def _connect(self) -> socket.socket:
        if self.unix_socket:
            probe = socket.socket(socket.AF_UNIX)
            probe.settimeout(1)
            probe.connect(self.unix_socket)
            return probe
        return socket.create_connection(("::1" if self.ipv6 else "127.0.0.1", self.port), timeout=1)

    def kill(self) -> None:
        raise NotImplementedError

    def log(self) -> str:
        raise NotImplementedError


class ServerProcess(LocalServer):
    """
    C{twistd -n jesync} listening on 127.0.0.1 on a port of its own (or a
    Unix socket), started with L{start} and waited for until it answers.
    """

    def __init__(
        self,
        unix_socket: Optional[str] = None,
        ipv6: bool = False,
        extra_args: Sequence[str] = (),
        auth_token: Optional[bytes] = None,
    ) -> None:
        super().__init__(unix_socket, ipv6, extra_args, auth_token)
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._log = tempfile.TemporaryFile()

    def start(self) -> ServerProcess:
        """Start (or restart, on the same port) and return once it answers a request."""
        self.process = subprocess.Popen(
            [*self.twistd_command(), "-n", "--pidfile=", "jesync", "--port", self.listen, *self.extra_args],
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=tempfile.gettempdir(),
        )
        self._wait_until_ready()
        return self

    def twistd_command(self) -> list[str]:
        """How to run twistd (a subclass may run it with a change of its own)."""
        return twistd_command()

    def _wait_until_ready(self) -> None:
        self._wait_until_answering(self._exited)

    def _exited(self) -> Optional[str]:
        assert self.process is not None
        if self.process.poll() is None:
            return None
        return f"twistd exited with {self.process.returncode}"

    def kill(self) -> None:
        """SIGKILL: the server vanishes, and the kernel closes its connections."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.unix_socket and os.path.exists(self.unix_socket):
            os.unlink(self.unix_socket)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        self.kill()
        self._log.close()


def start_server(
    testcase,
    unix_socket: Optional[str] = None,
    ipv6: bool = False,
    extra_args: Sequence[str] = (),
    auth_token: Optional[bytes] = None,
) -> ServerProcess:
    """
    A running twistd server, stopped when C{testcase} ends (anything with an
    C{addCleanup}); C{extra_args} are more C{twistd jesync} options, and
    C{auth_token} the token of its C{--auth-token-file}, if any.
    """
    server = ServerProcess(unix_socket, ipv6, extra_args, auth_token)
    testcase.addCleanup(server.close)
    return server.start()


class ServerThread(LocalServer):
    """
    The real server in this process: C{twistd jesync}'s own options
    (L{jesync.tap.Options}) turned into settings and built by the
    composition root (L{jesync.server.build_server}), on a reactor of its
    own running in a thread of its own, listening on 127.0.0.1 on a port of
    its own (or a Unix socket).  The same face as L{ServerProcess}
    (C{start}, C{address}, C{kill}, C{stop}, C{log}), without a process to
    start: a blocking client or a subprocess (the command line, an example)
    talks to it over real TCP while the test's thread waits, and it starts
    in milliseconds where C{twistd} takes a quarter of a second (CPython) to
    more than half a second (PyPy).

    L{kill} is the process dying: every socket closed at once, the lock
    table gone (a restart on the same port starts empty); L{pause} is
    SIGSTOP: connections are still accepted by the kernel, nothing is
    answered until L{resume}.
    """

    def __init__(
        self,
        unix_socket: Optional[str] = None,
        ipv6: bool = False,
        extra_args: Sequence[str] = (),
        auth_token: Optional[bytes] = None,
    ) -> None:
        super().__init__(unix_socket, ipv6, extra_args, auth_token)
        self.reactor: Any = None
        self.server: Any = None
        self._running: Optional[ReactorThread] = None
        self._paused: Optional[threading.Event] = None
        self._lines: list[str] = []

    def _observe(self, event: dict) -> None:
        # (read once: kill() may clear it from the test's thread meanwhile)
        running = self._running
        if running is not None and threading.current_thread() is running.thread:
            self._lines.append(formatEvent(event) or "")

    def start(self) -> "ServerThread":
        """Start (or restart, on the same port) and return once it answers a request."""
        options = Options()
        options.parseOptions(["--port", self.listen, *self.extra_args])
        settings = settings_from(options)
        self._running = running = ReactorThread()
        self.reactor = running.reactor
        globalLogPublisher.addObserver(self._observe)

        def serve() -> defer.Deferred[None]:
            self.server = build_server(running.reactor, settings)
            self.server.startService()
            return self.server.when_listening()

        try:
            running.call(serve)
        except BaseException as error:
            self.kill()
            raise RuntimeError(f"the server did not start: {error}\n{self.log()}") from error
        self._wait_until_answering(lambda: None)
        return self

    def kill(self) -> None:
        """The process dying: every listening socket and connection closed at once; the lock table gone."""
        if self._running is None:
            return
        self.resume()
        running, self._running = self._running, None

        def close_everything() -> None:
            selectables = running.reactor.removeAll()
            # Every socket shut at once, as the kernel does for a dead process,
            # before any connection is told: a connection lost first would
            # make the service answer one not lost yet (a waiter granted what
            # a dead holder released), and a dead process writes nothing.
            for selectable in selectables:
                try:
                    selectable.socket.shutdown(socket.SHUT_RDWR)
                except (AttributeError, OSError):
                    pass
            for selectable in selectables:
                selectable.connectionLost(Failure(ConnectionDone("the server was killed")))
            running.reactor.removeAll()  # (whatever those answers registered to write)

        try:
            running.stop(last=close_everything)
        finally:
            globalLogPublisher.removeObserver(self._observe)
            if self.unix_socket and os.path.exists(self.unix_socket):
                os.unlink(self.unix_socket)

    def stop(self) -> None:
        """A graceful stop (SIGTERM): the server's own stopService, then the reactor stops."""
        if self._running is None:
            return
        self.resume()
        self._running.call(self.server.stopService)
        self.kill()

    def pause(self) -> None:
        """SIGSTOP: the server's thread answers nothing (the kernel still accepts connections) until L{resume}."""
        if self._paused is None and self._running is not None:
            self._paused = paused = threading.Event()
            held = threading.Event()

            def hold() -> None:
                held.set()
                paused.wait()

            # Return once the thread is held: until then it would still answer what comes in.
            self.reactor.callFromThread(hold)
            if not held.wait(READY_WITHIN):
                raise RuntimeError("the server thread was not paused")

    def resume(self) -> None:
        """SIGCONT."""
        if self._paused is not None:
            self._paused.set()
            self._paused = None

    def log(self) -> str:
        return "\n".join(self._lines)

    def close(self) -> None:
        self.kill()


class ReactorThread:
    """
    A reactor of its own (not the installed one), running in a thread of its
    own from now until L{stop}: a L{ServerThread}'s, or a client's that a
    synchronous test drives (L{call}).  Stopping it closes what the reactor
    itself holds open (its waker, its poller), so that a run of thousands of
    tests does not run out of file descriptors.
    """

    def __init__(self) -> None:
        self.reactor = _new_reactor()
        self.thread = threading.Thread(target=self.reactor.run, kwargs={"installSignalHandlers": False}, daemon=True)
        _thread_reactors[self.thread] = self.reactor
        self.thread.start()

    def call(self, function: Callable[[], Any]) -> Any:
        """Run C{function} in the reactor's thread; return what it returned (or what its Deferred fired with)."""
        return blockingCallFromThread(self.reactor, function)

    def stop(self, last: Optional[Callable[[], None]] = None) -> None:
        """Run C{last} (if given) in the reactor's thread, stop the reactor, and wait for the thread to end."""
        reactor = self.reactor

        def stopping() -> None:
            try:
                if last is not None:
                    last()
            finally:
                reactor.stop()

        reactor.callFromThread(stopping)
        self.thread.join(READY_WITHIN)
        if self.thread.is_alive():
            raise RuntimeError("the reactor's thread did not stop")
        _thread_reactors.pop(self.thread, None)
        waker = getattr(reactor, "waker", None)
        if waker is not None:
            waker.connectionLost(None)
        poller = getattr(reactor, "_poller", None)  # (epoll's file descriptor)
        if poller is not None and hasattr(poller, "close"):
            poller.close()


# Twisted's TLS wrapper (twisted.protocols.tls) times its writes on a clock
# it takes, when given none (as the "ssl:" listeners give none), from the
# installed reactor: a server thread's TLS connections would then wait for a
# reactor that is not running (in a plain SynchronousTestCase), or write from
# the wrong thread.  In a server thread, the clock is that thread's reactor.
_thread_reactors: dict[threading.Thread, Any] = {}


def _install_thread_clocks() -> None:
    from twisted.protocols import tls

    installed_default = getattr(tls, "_get_default_clock", None)
    if installed_default is None:  # (another Twisted: its TLS takes its clock some other way)
        return

    def default_clock() -> Any:
        return _thread_reactors.get(threading.current_thread()) or installed_default()

    tls._get_default_clock = default_clock


_install_thread_clocks()


def _new_reactor() -> Any:
    """A reactor of its own (not the installed one), for a server thread."""
    try:
        from twisted.internet.epollreactor import EPollReactor

        return EPollReactor()
    except ImportError:  # (not Linux)
        from twisted.internet.pollreactor import PollReactor

        return PollReactor()


def serve_in_thread(
    testcase,
    unix_socket: Optional[str] = None,
    ipv6: bool = False,
    extra_args: Sequence[str] = (),
    auth_token: Optional[bytes] = None,
) -> ServerThread:
    """
    A running L{ServerThread}, killed when C{testcase} ends: L{start_server}'s
    in-process twin, for the tests that need a real server over real TCP
    but not a process of its own.
    """
    server = ServerThread(unix_socket, ipv6, extra_args, auth_token)
    testcase.addCleanup(server.close)
    return server.start()


class FakeServer:
    """
    A misbehaving server for the blocking and asyncio clients: on 127.0.0.1,
    it answers each request line with C{respond(line)} (nothing if None).
    """

    def __init__(self, respond: Callable[[bytes], Optional[bytes]]) -> None:
        self._respond = respond
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.received: list[bytes] = []
        self._connections: list[socket.socket] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                continue
            connection.settimeout(None)
            self._connections.append(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()
        self._listener.close()

    def _serve(self, connection: socket.socket) -> None:
        buffer = b""
        try:
            while True:
                data = connection.recv(65536)
                if not data:
                    return
                *lines, buffer = (buffer + data).split(b"\n")
                for line in lines:
                    self.received.append(line)
                    reply = self._respond(line)
                    if reply is not None:
                        connection.sendall(reply)
        except OSError:
            return

    def close(self) -> None:
        self._stopped.set()
        for connection in self._connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()


def fake_server(testcase, respond: Callable[[bytes], Optional[bytes]]) -> FakeServer:
    server = FakeServer(respond)
    testcase.addCleanup(server.close)
    return server
