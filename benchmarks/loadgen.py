"""
Closed-loop lock/release load generator: jesync against Redis, over loopback.

Each connection repeatedly locks a key, waits for the grant, releases it and
waits for the reply; one such round trip pair is a *cycle*.  Scenarios:
1, 16 and 64 connections each on its own key (uncontended), and 64
connections on one key (contended); ``--scenario KIND:N`` runs any others
(e.g. ``contended:16``, ``uncontended:10000``: the open-file limit is raised,
and the servers' connection limits and jesync's listen backlog are set
above N).  yrmcds (memcached text ``lock``/``unlock``, a spin under
contention) runs too when ``yrmcdsd`` is installed, and elock (``lock KEY
60``, which queues) with ``--elock EBIN``, and dflockd (``l``/``r``, which
queues) with ``--dflockd SRC``; contended scenarios are also
compared with the loopback limit, 2 / (Redis's 1-connection p50).  For every scenario the same loop runs
against jesync and, when ``redis-server`` is installed, against a throwaway
Redis (``SET key 1 NX PX 120000`` / ``DEL key``; under contention the Redis
loop re-sends the SET until it succeeds: a spin, where jesync queues).

By default the script starts both servers itself on free 127.0.0.1 ports and
stops them at the end::

    python benchmarks/loadgen.py                 # ~5 s per scenario and server
    python benchmarks/loadgen.py --quick         # ~1 s each
    python benchmarks/loadgen.py --repeat 5      # median of 5 interleaved rounds
    python benchmarks/loadgen.py --connections 1 --pin one   # latency on one CPU
    python benchmarks/loadgen.py --server 127.0.0.1:11400 --no-redis

Several jesync servers can be measured in one run, each round running them
all and Redis back to back (in alternating order), e.g. a baseline checkout
with its own virtualenv against this working tree::

    python benchmarks/loadgen.py --only uncontended --connections 64 --repeat 5 \
        --jesync before=/tmp/jesync-before:/tmp/venv-before/bin/python --jesync after=.

``--jesync NAME=CHECKOUT[:PYTHON]`` starts ``twistd jesync`` from CHECKOUT
(PYTHONPATH), with the ``twistd`` next to PYTHON (default: this Python);
``--server [NAME=]HOST:PORT`` uses a running one.  Both are repeatable.  The
ratios are then given for each jesync target against Redis, and against the
first jesync target.  ``--reactor NAME=REACTOR`` runs the target NAME under
``twistd --reactor REACTOR`` (two targets from one checkout compare
reactors: ``--jesync epoll=. --jesync jesync-epoll=. --reactor
epoll=epoll --reactor jesync-epoll=jesync-epoll``).

On a machine shared with other work, ``--max-noise 0.1`` waits for a quiet
second before each round, leaves out every run during which the rest of the
machine used more than 0.1 of a core, computes each ratio over the rounds
in which both of its servers ran quietly, and runs more rounds (at most
``--extra-rounds``) until each ratio has ``--repeat`` of them.

Reported per scenario: cycles per second, p50/p99 cycle latency, the
server's CPU use over the measured window (when its pid is known; also as
CPU time per cycle, the figure least disturbed by other load, and the part of
it spent in the kernel: system calls and loopback TCP; and how often per
cycle it went to sleep with nothing to do, each a wake-up a closed loop
waits on), the load
generator's own, the rest of the machine's (noise), and the jesync/Redis
ratios.  Only the Python standard
library is used; the clients are raw non-blocking sockets on one epoll per
load-generator process, in closedloop.py's loop (the one every throughput
benchmark here shares: this script gives it each protocol's requests and
reply handler).
"""

from __future__ import annotations

import argparse
import ipaddress
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import closedloop  # noqa: E402
from closedloop import DONE, RETRY, ProtocolError, Tally, connect, run_closed_loop  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = [("uncontended", 1), ("uncontended", 16), ("uncontended", 64), ("contended", 64)]
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
BACKLOG = 4096  # listen backlog for the large scenarios (the kernel caps it at net.core.somaxconn)


# -- the wire protocols ----------------------------------------------------------
#
# A protocol is a pair of functions: one making a key's (lock, release)
# requests, and closedloop's reply handler: it gets the connection and its
# buffer, and returns (bytes the reply line took, next request to send,
# DONE when a cycle has just completed, RETRY when the lock request has to
# be sent again), or None until a whole line has arrived.


class Conn(closedloop.Conn):
    """One client connection's state: its key and requests, and whether its lock request is the one out."""

    __slots__ = ("key", "lock", "locking", "release")

    def __init__(self, sock: socket.socket, key: bytes, lock: bytes, release: bytes, tally: Tally) -> None:
        super().__init__(sock, lock, tally)
        self.key = key
        self.lock = lock
        self.release = release
        self.locking = True


def jesync_requests(key: bytes) -> tuple[bytes, bytes]:
    return b"lock %s\n" % key, b"release %s\n" % key


def jesync_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """GRANTED g w KEY secs -> release; RELEASED g w KEY -> cycle done."""
    newline = buffer.find(b"\n")
    if newline < 0:
        return None
    fields = buffer[:newline].split()
    if len(fields) >= 4 and fields[3] == conn.key:
        if conn.locking and fields[0] == b"GRANTED":
            conn.locking = False
            return newline + 1, conn.release, 0
        if not conn.locking and fields[0] == b"RELEASED":
            conn.locking = True
            return newline + 1, conn.lock, DONE
    raise ProtocolError(f"unexpected reply {buffer[:newline]!r} for {conn.key!r}")


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def redis_requests(key: bytes) -> tuple[bytes, bytes]:
    return _resp(b"SET", key, b"1", b"NX", b"PX", b"120000"), _resp(b"DEL", key)


def redis_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """+OK -> release; $-1 (someone else holds it) -> SET again; :1 -> cycle done."""
    newline = buffer.find(b"\n")
    if newline < 0:
        return None
    line = buffer[:newline]
    if conn.locking:
        if line == b"+OK\r":
            conn.locking = False
            return newline + 1, conn.release, 0
        if line == b"$-1\r":
            return newline + 1, conn.lock, RETRY
    elif line == b":1\r":
        conn.locking = True
        return newline + 1, conn.lock, DONE
    raise ProtocolError(f"unexpected reply {line!r} for {conn.key!r}")


def yrmcds_requests(key: bytes) -> tuple[bytes, bytes]:
    return b"lock %s\r\n" % key, b"unlock %s\r\n" % key


def yrmcds_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """memcached text protocol: OK -> unlock; LOCKED (someone else holds it) -> lock again; OK -> cycle done."""
    newline = buffer.find(b"\n")
    if newline < 0:
        return None
    line = buffer[:newline]
    if line == b"OK\r":
        if conn.locking:
            conn.locking = False
            return newline + 1, conn.release, 0
        conn.locking = True
        return newline + 1, conn.lock, DONE
    if conn.locking and line == b"LOCKED\r":
        return newline + 1, conn.lock, RETRY
    raise ProtocolError(f"unexpected reply {line!r} for {conn.key!r}")


def yrmcds_prepare(sock: socket.socket, key: bytes) -> None:
    """A yrmcds lock needs an existing object: store one (blocking, before the clock starts)."""
    sock.sendall(b"set %s 0 0 1\r\nx\r\n" % key)
    reply = b""
    while not reply.endswith(b"\r\n"):
        reply += sock.recv(64) or b"?\r\n"
    if reply != b"STORED\r\n":
        raise ProtocolError(f"yrmcds: set {key!r} -> {reply!r}")


def elock_requests(key: bytes) -> tuple[bytes, bytes]:
    # The waiting form ("lock KEY SECONDS"), so that under contention elock queues, as jesync does.
    return b"lock %s 60\r\n" % key, b"unlock %s\r\n" % key


def elock_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """200 Acquired -> unlock; 200 Unlocked -> cycle done."""
    newline = buffer.find(b"\n")
    if newline < 0:
        return None
    line = buffer[:newline]
    if conn.locking and line == b"200 Acquired\r":
        conn.locking = False
        return newline + 1, conn.release, 0
    if not conn.locking and line == b"200 Unlocked\r":
        conn.locking = True
        return newline + 1, conn.lock, DONE
    raise ProtocolError(f"unexpected reply {line!r} for {conn.key!r}")


PROTOCOLS = {
    "jesync": (jesync_requests, jesync_reply),
    "redis": (redis_requests, redis_reply),
    "yrmcds": (yrmcds_requests, yrmcds_reply),
    "elock": (elock_requests, elock_reply),
}
PREPARE = {"yrmcds": yrmcds_prepare}
PEERS = ("redis", "yrmcds", "elock", "dflockd")  # the names of the servers that are not jesync


# -- one load-generator process --------------------------------------------------


def run_worker(address, protocol: str, keys: list[bytes], warmup: float, seconds: float, cpus, pipe) -> None:
    """
    Connect one socket per key (yrmcds: and store its object), then
    closedloop's loop with the protocol's reply handler; sends back (cycles,
    latencies in ns, retries, CPU seconds) for the window.
    """
    make_requests, handle = PROTOCOLS[protocol]
    prepare = PREPARE.get(protocol)

    def open_conns(tally: Tally) -> list[Conn]:
        conns = []
        for key in keys:
            sock = connect(address)
            if prepare:
                prepare(sock, key)
            conns.append(Conn(sock, key, *make_requests(key), tally))
        return conns

    run_closed_loop(cpus, open_conns, handle, warmup, seconds, pipe)


# -- servers ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(address, process: subprocess.Popen | None, log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        try:
            socket.create_connection(address, timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise SystemExit(f"server at {address[0]}:{address[1]} did not start:\n{tail}")


@dataclass
class Server:
    name: str
    address: tuple[str, int]
    process: subprocess.Popen | None = None
    log: Path | None = None
    protocol: str = "jesync"  # a key of PROTOCOLS

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def listening(self) -> Server:
        """This server, once it accepts connections; stopped (and the script ended) if it never does."""
        assert self.log is not None
        try:
            wait_for_port(self.address, self.process, self.log)
        except BaseException:
            self.stop()  # it may still be running, only not listening
            raise
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def pinning(cpus: set[int] | None):
    """A preexec_fn that pins the child (and every thread it starts) to C{cpus}."""
    return None if not cpus else lambda: os.sched_setaffinity(0, cpus)


def start_jesync(
    tmp: Path,
    profile: str | None,
    cpus: set[int] | None = None,
    name: str = "jesync",
    checkout: Path = REPO,
    python: str = sys.executable,
    options: tuple[str, ...] = (),
    reactor: str | None = None,
) -> Server:
    """
    C{twistd -n jesync} from C{checkout} (default: this one), on a free
    loopback port, with C{options} added to jesync's own, under twistd's
    C{--reactor reactor} if one is given.
    """
    port = free_port()
    twistd = Path(python).with_name("twistd")
    command = [str(twistd), "-n", "--pidfile="]
    if reactor:
        command += ["--reactor", reactor]
    if profile:
        command += [f"--profile={profile}", "--profiler=cprofile", "--savestats"]
    # Twisted's default listen backlog is 50: a load generator opening thousands of
    # connections one after the other overflows it, and each dropped SYN costs 1 s.
    backlog = f":backlog={BACKLOG}" if "--max-connections" in options else ""
    command += ["jesync", "--port", f"tcp:{port}:interface=127.0.0.1{backlog}", *options]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, preexec_fn=pinning(cpus)
        )
    return Server(name, ("127.0.0.1", port), process, log).listening()


def start_redis(tmp: Path, cpus: set[int] | None = None, maxclients: int = 10000) -> Server:
    """A throwaway redis-server: loopback only, no persistence."""
    port = free_port()
    command = [
        "redis-server",
        "--maxclients",
        str(maxclients),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        str(tmp),
    ]
    log = tmp / "redis.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinning(cpus))
    return Server("redis", ("127.0.0.1", port), process, log, protocol="redis").listening()


def start_yrmcds(tmp: Path, cpus: set[int] | None = None, maxclients: int = 10000) -> Server:
    """A throwaway yrmcdsd with its own config file: loopback, 2 workers (one per core here), no counter."""
    port = free_port()
    config = tmp / "yrmcds.conf"
    config.write_text(
        "virtual_ip = 127.0.0.1\n"
        f"port = {port}\n"
        f"repl_port = {free_port()}\n"
        f"max_connections = {maxclients}\n"
        f'temp_dir = "{tmp}"\n'
        "log.threshold = warning\n"
        f'log.file = "{tmp}/yrmcds-server.log"\n'
        "workers = 2\n"
        "counter.enable = false\n"
    )
    log = tmp / "yrmcds.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["yrmcdsd", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinning(cpus)
        )
    return Server("yrmcds", ("127.0.0.1", port), process, log, protocol="yrmcds").listening()


def start_elock(tmp: Path, ebin: Path, cpus: set[int] | None = None) -> Server:
    """
    elock (github.com/dustin/elock), compiled beforehand with erlc into
    C{ebin}: its lock_serv and a listener on a free port (it listens on
    every interface; the load generator only connects over loopback).
    """
    port = free_port()
    command = [
        "erl", "-noshell", "-noinput", "-pa", str(ebin),
        "-eval", f"{{ok, _}} = lock_serv:start_link(), lock_tcp_listener:start({port})",
    ]
    log = tmp / "elock.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinning(cpus))
    return Server("elock", ("127.0.0.1", port), process, log, protocol="elock").listening()


# -- dflockd (github.com/mtingers/dflockd, a Python asyncio lock server; --dflockd SRC) -----
#
# Run from its source tree (its code is not copied here) or an installed `dflockd` command.  Its
# protocol: a request is three lines, COMMAND\nKEY\nARG\n, a reply one line.  `l\nKEY\n60 120\n`
# acquires (waiting up to 60 s, in FIFO order: it queues, as jesync does) with a 120 s lease and
# answers `ok TOKEN 120`; `r\nKEY\nTOKEN\n` releases and answers `ok`.


def dflockd_requests(key: bytes) -> tuple[bytes, bytes]:
    # The release is completed with the token of each grant (dflockd_reply).
    return b"l\n%s\n60 120\n" % key, b"r\n%s\n" % key


def dflockd_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """ok TOKEN LEASE -> r KEY TOKEN; ok -> cycle done."""
    newline = buffer.find(b"\n")
    if newline < 0:
        return None
    line = buffer[:newline]
    if conn.locking and line.startswith(b"ok "):
        conn.locking = False
        return newline + 1, conn.release + line.split()[1] + b"\n", 0
    if not conn.locking and line == b"ok":
        conn.locking = True
        return newline + 1, conn.lock, DONE
    raise ProtocolError(f"unexpected reply {line!r} for {conn.key!r}")


PROTOCOLS["dflockd"] = (dflockd_requests, dflockd_reply)


def dflockd_command(source: str) -> tuple[list[str], Path | None, str] | None:
    """
    C{--dflockd SRC}: (command, PYTHONPATH, version) -- a source tree run
    with this Python (C{src/dflockd/server.py} or C{dflockd/server.py}), or
    an installed C{dflockd} command; None if SRC is neither.
    """
    root = Path(source).expanduser()
    for path in (root / "src", root):
        if (path / "dflockd" / "server.py").is_file():
            version = "?"
            pyproject = root / "pyproject.toml"
            if pyproject.is_file():
                for line in pyproject.read_text().splitlines():
                    if line.startswith("version"):
                        version = line.partition("=")[2].strip().strip('"')
                        break
            return [sys.executable, "-m", "dflockd.server"], path.resolve(), f"{version} from {root.resolve()}"
    executable = shutil.which(source) if not root.is_dir() else None
    if executable:
        return [executable], None, executable
    return None


def start_dflockd(tmp: Path, command: list[str], pythonpath: Path | None, cpus: set[int] | None = None) -> Server:
    """
    dflockd on a free loopback port, with its defaults but for the number
    of keys (--max-locks: 1024 would refuse keys of later rounds and the
    large scenarios) and the read timeout (23 s: raised, so that no
    connection is dropped while thousands open).  Its log (a line per
    request, at its fixed INFO level) goes to a file.
    """
    port = free_port()
    # Its environment variables take precedence over its options: none of them is passed on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLOCKD_") and k != "MAX_LOCKS"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    options = ["--host", "127.0.0.1", "--port", str(port), "--max-locks", "100000000", "--read-timeout", "3600"]
    log = tmp / "dflockd.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command + options, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinning(cpus)
        )
    return Server("dflockd", ("127.0.0.1", port), process, log, protocol="dflockd").listening()


def cpu_times(pid: int | None) -> tuple[float, float] | None:
    """User and system CPU time of a process (all its threads), from /proc."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICK, int(fields[12]) / CLOCK_TICK


def voluntary_switches(pid: int | None) -> int | None:
    """
    How many times a process (its main thread) has gone to sleep waiting,
    e.g. in epoll_wait with nothing ready: /proc's voluntary_ctxt_switches.
    """
    if pid is None:
        return None
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process (all its threads), from /proc."""
    times = cpu_times(pid)
    return None if times is None else sum(times)


def machine_busy_seconds() -> float:
    """CPU seconds spent not idle by the whole machine (all CPUs), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICK


def wait_for_quiet(limit: float, timeout: float) -> bool:
    """
    Wait (at most C{timeout} s) for a second in which the machine used less
    than C{limit} of a core (nothing of ours runs between rounds).
    """
    deadline = time.monotonic() + timeout
    steps = 0
    while time.monotonic() < deadline and steps < 100_000:
        steps += 1
        before = machine_busy_seconds()
        time.sleep(1.0)
        if machine_busy_seconds() - before < limit:
            return True
    print(f"  (the machine did not go quiet within {timeout:g} s)", flush=True)
    return False


def loopback_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    address = socket.gethostbyname(host or "127.0.0.1")
    if not ipaddress.ip_address(address).is_loopback:
        raise argparse.ArgumentTypeError(f"{text}: only loopback servers may be targeted")
    return address, int(port)


def named_server(text: str) -> tuple[str, tuple[str, int]]:
    """C{[NAME=]HOST:PORT} for --server; the name defaults to "jesync"."""
    name, _, address = text.rpartition("=")
    return check_name(name or "jesync"), loopback_address(address)


def pin_cpus(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """
    C{--pin}: set C{args.server_cpus} and C{args.client_cpus} (None: not
    pinned) -- split: servers on the first CPU, load generators on the
    others; one: everything on the first CPU.
    """
    args.server_cpus = args.client_cpus = None
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if args.pin == "split" and len(cpus) < 2:
            parser.error("--pin split needs at least 2 CPUs")
        args.server_cpus = {cpus[0]}
        args.client_cpus = set(cpus[1:]) if args.pin == "split" else {cpus[0]}


def jesync_target(text: str) -> tuple[str, Path, str]:
    """C{NAME=CHECKOUT[:PYTHON]} for --jesync."""
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise argparse.ArgumentTypeError(f"{text}: expected NAME=CHECKOUT[:PYTHON]")
    checkout, _, python = rest.partition(":")
    checkout_path = Path(checkout).resolve()
    if not (checkout_path / "jesync" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text}: {checkout_path} has no jesync/__init__.py")
    python = os.path.abspath(python) if python else sys.executable  # not resolved: keep the venv
    if not Path(python).with_name("twistd").exists():
        raise argparse.ArgumentTypeError(f"{text}: no twistd next to {python}")
    return check_name(name), checkout_path, python


def reactor_choice(text: str) -> tuple[str, str]:
    """C{[NAME=]REACTOR} for --reactor (NAME: a --jesync target; default: the jesync started by default)."""
    name, sep, reactor = text.rpartition("=")
    if not reactor:
        raise argparse.ArgumentTypeError(f"{text}: expected [NAME=]REACTOR")
    return (check_name(name) if sep else "jesync"), reactor


def check_name(name: str) -> str:
    if name in PEERS or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(f"{name!r}: a target name is letters, digits, -_. and not {', '.join(PEERS)}")
    return name


def describe_checkout(checkout: Path) -> str:
    """The checkout's commit, with '+changes' if its work tree differs from it."""
    def git(*command: str) -> str:
        return subprocess.run(
            ["git", "-C", str(checkout), *command], check=False, capture_output=True, text=True
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


# -- running scenarios -----------------------------------------------------------


@dataclass
class Result:
    cycles_per_second: float
    p50_us: float
    p99_us: float
    server_cpu: float | None  # share of one core over the window
    loadgen_cpu: float  # share of one core, summed over load-generator processes
    retries_per_cycle: float
    other_cpu: float  # everything else the machine ran meanwhile (noise), in cores
    server_system_cpu: float | None = None  # the part of server_cpu spent in the kernel
    server_sleeps: float | None = None  # per second: the server waiting with nothing to do, woken again

    @property
    def server_us_per_cycle(self) -> float | None:
        """Server CPU time per cycle: less sensitive to other load on the machine than cycles/s."""
        if self.server_cpu is None or not self.cycles_per_second:
            return None
        return 1e6 * self.server_cpu / self.cycles_per_second

    @property
    def server_system_us_per_cycle(self) -> float | None:
        """The kernel's part of L{server_us_per_cycle} (system calls, loopback TCP): the rest is the server's own code."""
        if self.server_system_cpu is None or not self.cycles_per_second:
            return None
        return 1e6 * self.server_system_cpu / self.cycles_per_second

    @property
    def server_sleeps_per_cycle(self) -> float | None:
        """How often the server slept (and had to be woken) per cycle: a latency a closed loop waits on."""
        if self.server_sleeps is None or not self.cycles_per_second:
            return None
        return self.server_sleeps / self.cycles_per_second


def receive(pipe):
    try:
        return pipe.recv()
    except EOFError:
        raise SystemExit("a load generator process failed (see its traceback above)") from None


def run_scenario(server: Server, kind: str, connections: int, args, tag: str) -> Result:
    """One scenario against one server, with C{args.procs} load-generator processes."""
    keys = [b"bench-%s-%d" % (tag.encode(), i) for i in range(connections)]
    if kind == "contended":
        keys = [b"bench-%s-hot" % tag.encode()] * connections
    procs = max(1, min(args.procs, connections))

    def worker(index: int, pipe) -> tuple:
        share = keys[index::procs]
        return run_worker, (server.address, server.protocol, share, args.warmup, args.seconds, args.client_cpus, pipe)

    return run_workers(server, procs, worker, args)


def run_workers(server: Server, procs: int, worker, args) -> Result:
    """
    Run C{procs} load-generator processes against C{server} and measure them
    together: C{worker(index, pipe)} gives each one's target and arguments.
    A worker sends "ready" once connected, waits for the start time, runs
    C{args.warmup} then C{args.seconds}, and sends (cycles, latencies in ns,
    retries, its CPU seconds) for the measured window.
    """
    context = multiprocessing.get_context("fork")
    workers = []
    for index in range(procs):
        parent_end, child_end = context.Pipe()
        target, arguments = worker(index, child_end)
        process = context.Process(target=target, args=arguments)
        process.start()
        child_end.close()  # so that recv() fails, rather than hangs, if the worker dies
        workers.append((process, parent_end))
    for _, pipe in workers:
        if receive(pipe) != "ready":
            raise SystemExit("a load generator failed to connect")
    start = time.monotonic() + 0.1
    for _, pipe in workers:
        pipe.send(start)
    time.sleep(max(0.0, start + args.warmup - time.monotonic()))
    cpu_before, busy_before = cpu_times(server.pid), machine_busy_seconds()
    sleeps_before = voluntary_switches(server.pid)
    time.sleep(max(0.0, start + args.warmup + args.seconds - time.monotonic()))
    cpu_after, busy_after = cpu_times(server.pid), machine_busy_seconds()
    sleeps_after = voluntary_switches(server.pid)
    cycles, latencies, retries, loadgen_cpu = 0, [], 0, 0.0
    for process, pipe in workers:
        n, lat, r, cpu = receive(pipe)
        cycles += n
        latencies += lat
        retries += r
        loadgen_cpu += cpu
        process.join()
        if process.exitcode:
            raise SystemExit(f"a load generator failed (exit code {process.exitcode})")
    latencies.sort()

    def percentile(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1000 if latencies else float("nan")
        )

    server_cpu = server_system_cpu = None
    if cpu_before is not None and cpu_after is not None:
        server_cpu = (sum(cpu_after) - sum(cpu_before)) / args.seconds
        server_system_cpu = (cpu_after[1] - cpu_before[1]) / args.seconds
    busy = (busy_after - busy_before) / args.seconds
    return Result(
        cycles / args.seconds,
        percentile(0.50),
        percentile(0.99),
        server_cpu,
        loadgen_cpu / args.seconds,
        retries / cycles if cycles else 0.0,
        max(0.0, busy - (server_cpu or 0.0) - loadgen_cpu / args.seconds),
        server_system_cpu,
        None if sleeps_before is None or sleeps_after is None else (sleeps_after - sleeps_before) / args.seconds,
    )


def median(values: list[float]) -> float:
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def median_result(results: list[Result]) -> Result:
    """The run with the median cycles per second (its latencies come with it)."""
    return sorted(results, key=lambda r: r.cycles_per_second)[(len(results) - 1) // 2]


def fmt_cpu(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def fmt_us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fmt_sleeps(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ratios(rounds: list[dict[str, Result]], measure, name: str = "jesync", reference: str = "redis") -> float:
    """The median over rounds of name/reference, each round's pair measured back to back."""
    return median([measure(r[name]) / measure(r[reference]) for r in rounds])


def quiet_rounds(
    rounds: list[dict[str, Result]], names: tuple[str, ...], max_noise: float | None
) -> list[dict[str, Result]]:
    """The rounds in which every one of C{names} ran with at most C{max_noise} other CPU (all, without a limit)."""
    if max_noise is None:
        return rounds
    return [r for r in rounds if all(r[name].other_cpu <= max_noise for name in names)]


def label(server: str, workload: str) -> str:
    """A run's name in a round: which server, which workload."""
    return f"{server}/{workload}"


def pair_ratio(rounds, name: str, reference: str, measure, max_noise: float | None) -> tuple[float | None, str]:
    """The median per-round ratio over the rounds where both ran quietly (all rounds, marked *, if none did)."""
    quiet = quiet_rounds(rounds, (name, reference), max_noise)
    note = ""
    if not quiet:
        quiet, note = rounds, "*"
    try:
        return ratios(quiet, measure, name, reference), note
    except (TypeError, ZeroDivisionError):
        return None, note


def run_rounds(scenarios, runs, pairs, measure, describe, args) -> dict:
    """
    For each scenario (N connections), rounds of every run of C{runs}
    ((server, workload) pairs) back to back, in reverse order every other
    round, until each of C{pairs} (run label pairs) has C{args.repeat} rounds
    in which both ran quietly (L{quiet_rounds}), or C{args.repeat} +
    C{args.extra_rounds} rounds have run, or the machine did not go quiet
    for an extra round.  C{measure(server, workload, n, attempt)} runs one
    and returns its L{Result}; C{describe(server, workload)} names it in the
    progress lines.  Returns {n: [{label: Result}, ...]}.
    """
    results: dict = {}
    for n in scenarios:
        rounds = results[n] = []
        attempt = 0
        loud = False
        while attempt < args.repeat + args.extra_rounds and not all(
            len(quiet_rounds(rounds, pair, args.max_noise)) >= args.repeat for pair in pairs
        ):
            if loud and attempt >= args.repeat:
                print(f"  x{n}: the machine did not go quiet; no extra rounds", flush=True)
                break
            if args.max_noise is not None:
                loud = not wait_for_quiet(args.max_noise, args.wait_quiet)
            measured: dict = {}
            rounds.append(measured)
            for server, workload in runs if attempt % 2 == 0 else runs[::-1]:
                result = measure(server, workload, n, attempt)
                measured[label(server, workload)] = result
                noisy = args.max_noise is not None and result.other_cpu > args.max_noise
                print(
                    f"  round {attempt + 1} x{n} {describe(server, workload)}: "
                    f"{result.cycles_per_second:,.0f} cycles/s, p50 {result.p50_us:,.0f} µs, "
                    f"p99 {result.p99_us:,.0f} µs, server CPU {fmt_cpu(result.server_cpu)} "
                    f"({fmt_us(result.server_us_per_cycle)} µs/cycle, {fmt_us(result.server_system_us_per_cycle)} of it system; "
                    f"{fmt_sleeps(result.server_sleeps_per_cycle)} sleeps/cycle), loadgen CPU {fmt_cpu(result.loadgen_cpu)}, "
                    f"other CPU {fmt_cpu(result.other_cpu)}" + (" (noisy)" if noisy else ""),
                    flush=True,
                )
            attempt += 1
    return results


def pairs(names: list[str]) -> list[tuple[str, str]]:
    """
    The (name, reference) pairs reported: each jesync target against the
    first, and each jesync target and each other peer against Redis.
    """
    jesyncs = [name for name in names if name not in PEERS]
    result = [(name, jesyncs[0]) for name in jesyncs[1:]]
    if "redis" in names:
        result += [(name, "redis") for name in names if name != "redis"]
    return result or [(jesyncs[0], jesyncs[0])]


def report(results: dict[tuple[str, int], list[dict[str, Result]]], args) -> None:
    print()
    print(
        f"{'/'.join(sorted({str(len(r)) for r in results.values()}))} round(s) per scenario, "
        f"{args.seconds:g} s each after {args.warmup:g} s warm-up, "
        f"{args.procs} load-generator process(es).  Per server: the round with the median cycles/s"
        + (f" among its runs with at most {fmt_cpu(args.max_noise)} other CPU" if args.max_noise is not None else "")
        + ".  CPU = share of one core (other: the rest of the machine, i.e. noise); server CPU/cycle in µs."
    )
    print()
    print(
        "| scenario | server | cycles/s | p50 µs | p99 µs | server CPU | server CPU/cycle | of which system "
        "| server sleeps/cycle | loadgen CPU | other CPU | SET retries/cycle |"
    )
    print("|" + "---|" * 12)
    for (kind, n), rounds in results.items():
        for name in rounds[0]:
            runs = [round_[name] for round_ in rounds]
            quiet = [run for run in runs if args.max_noise is None or run.other_cpu <= args.max_noise]
            r = median_result(quiet or runs)
            print(
                f"| {kind} x{n} | {name} | {r.cycles_per_second:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} "
                f"| {fmt_cpu(r.server_cpu)} | {fmt_us(r.server_us_per_cycle)} | {fmt_us(r.server_system_us_per_cycle)} "
                f"| {fmt_sleeps(r.server_sleeps_per_cycle)} | {fmt_cpu(r.loadgen_cpu)} "
                f"| {fmt_cpu(r.other_cpu)} | {r.retries_per_cycle:.1f} |"
            )
    all_names = list(next(iter(results.values()))[0])
    names = [name for name in all_names if name not in PEERS]
    if len(names) > 1:
        # Several jesync targets: each against the first, then each against Redis.
        for name in names[1:]:
            ratio_table(results, name, names[0], args.max_noise)
    if not all("redis" in rounds[0] for rounds in results.values()):
        return
    summaries = {name: ratio_table(results, name, "redis", args.max_noise) for name in all_names if name != "redis"}
    handoff_limit(results, all_names, args.max_noise)
    print()
    print("\n(the CPython targets of issue 10; on PyPy they are >= 0.85x and <= 1.0x)")
    for name, summary in summaries.items():
        if name in PEERS:
            continue
        label = "jesync" if name == "jesync" else f"jesync {name}"
        if ("uncontended", 64) in summary:
            ratio = summary["uncontended", 64][0]
            print(
                f"target: 64 connections uncontended, {label} >= 0.5x Redis cycles/s: "
                f"{'MET' if ratio >= 0.5 else 'MISSED'} ({ratio:.2f}x)"
            )
        if ("uncontended", 1) in summary:
            ratio = summary["uncontended", 1][1]
            print(
                f"target: 1 connection, {label} p50 <= 1.25x Redis: {'MET' if ratio <= 1.25 else 'MISSED'} ({ratio:.2f}x)"
            )


def handoff_limit(results, names: list[str], max_noise: float | None) -> None:
    """
    Contended scenarios against the loopback limit: a hand-off costs at
    least one round trip, so at most 2 / (p50 of one Redis lock+release
    cycle on one connection, this run) hand-offs per second.
    """
    contended = [(kind, n) for kind, n in results if kind == "contended"]
    if not contended or ("uncontended", 1) not in results:
        return
    redis_runs = [r["redis"] for r in results["uncontended", 1]]
    quiet = [r for r in redis_runs if max_noise is None or r.other_cpu <= max_noise] or redis_runs
    p50 = median([r.p50_us for r in quiet])
    limit = 2e6 / p50
    print()
    print(
        f"contended (hand-off) cycles/s against the loopback limit 2 / (Redis 1-connection p50 {p50:.1f} µs) "
        f"= {limit:,.0f}/s; median over the quiet runs:"
    )
    print()
    print("| scenario | server | runs | cycles/s | / limit |")
    print("|---|---|---|---|---|")
    for kind, n in contended:
        for name in names:
            runs = [r[name] for r in results[kind, n]]
            ok = [r for r in runs if max_noise is None or r.other_cpu <= max_noise]
            value = median([r.cycles_per_second for r in (ok or runs)])
            used = f"{len(ok)} of {len(runs)}" if ok else f"{len(runs)}, all noisy"
            print(f"| {kind} x{n} | {name} | {used} | {value:,.0f} | {value / limit:.2f} |")


def ratio_table(
    results: dict[tuple[str, int], list[dict[str, Result]]], name: str, reference: str, max_noise: float | None = None
):
    """
    Print name/reference per scenario, over the rounds in which both ran
    quietly (C{max_noise}; all rounds if none did); return {scenario:
    [cycles/s, p50, p99, CPU/cycle ratios]}.
    """
    print()
    print(f"{name}/{reference}, median over rounds of each round's ratio:")
    print()
    print("| scenario | rounds | cycles/s | p50 | p99 | server CPU/cycle |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for (kind, n), all_rounds in results.items():
        rounds = quiet_rounds(all_rounds, (name, reference), max_noise)
        used = f"{len(rounds)} of {len(all_rounds)}" if max_noise is not None else f"{len(all_rounds)}"
        if not rounds:
            rounds, used = all_rounds, f"{len(all_rounds)}, all noisy"
        cpu_known = rounds[0][name].server_cpu is not None and rounds[0][reference].server_cpu is not None
        summary[kind, n] = row = [
            ratios(rounds, lambda r: r.cycles_per_second, name, reference),
            ratios(rounds, lambda r: r.p50_us, name, reference),
            ratios(rounds, lambda r: r.p99_us, name, reference),
            ratios(rounds, lambda r: r.server_us_per_cycle, name, reference) if cpu_known else None,
        ]
        print(f"| {kind} x{n} | {used} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in row) + " |")
    return summary


def scenario_spec(text: str) -> tuple[str, int]:
    kind, _, n = text.partition(":")
    if kind not in ("uncontended", "contended") or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected uncontended:N or contended:N")
    return kind, int(n)


def raise_open_files(needed: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE (inherited by the servers and load generators) to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        soft = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < needed:
        print(f"\nthe open-file limit is {soft}, below the {needed} needed: the largest scenarios will fail", end="")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per scenario (default 5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0.5, help="unmeasured seconds before each (default 0.5)"
    )
    parser.add_argument("--quick", action="store_true", help="1 s per scenario, 0.2 s warm-up")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per scenario and server; the median is reported"
    )
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes (default 1)")
    parser.add_argument(
        "--server",
        type=named_server,
        action="append",
        default=[],
        metavar="[NAME=]HOST:PORT",
        help="use this running jesync (loopback only) instead of starting one; repeatable, "
        "with distinct names (default name: jesync)",
    )
    parser.add_argument(
        "--jesync",
        type=jesync_target,
        action="append",
        default=[],
        metavar="NAME=CHECKOUT[:PYTHON]",
        help="start a jesync from CHECKOUT (PYTHONPATH), with the twistd next to PYTHON "
        "(default: this Python); repeatable.  Every round runs all targets back to back",
    )
    parser.add_argument(
        "--reactor",
        type=reactor_choice,
        action="append",
        default=[],
        metavar="[NAME=]REACTOR",
        help="run the jesync started as --jesync NAME (without NAME=: the one started by default) under "
        "twistd's --reactor REACTOR (e.g. jesync-epoll); repeatable, one per target",
    )
    parser.add_argument(
        "--max-noise",
        type=float,
        metavar="CORES",
        help="on a shared machine: before each round wait (up to --wait-quiet s) for a second in which "
        "the machine used less than CORES of a core (e.g. 0.1); a run with more other CPU than that is "
        "left out of the figures, and a ratio uses only the rounds in which both its servers ran quietly; "
        "rounds go on (at most --extra-rounds more) until every ratio has --repeat of them",
    )
    parser.add_argument(
        "--wait-quiet", type=float, default=60.0, help="with --max-noise: seconds to wait for quiet (default 60)"
    )
    parser.add_argument(
        "--extra-rounds",
        type=int,
        default=None,
        help="with --max-noise: rounds that may be measured again (default: as many as --repeat)",
    )
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis comparison")
    parser.add_argument("--only", choices=["uncontended", "contended"], help="run only these scenarios")
    parser.add_argument(
        "--connections",
        type=int,
        action="append",
        metavar="N",
        help="run only scenarios with N connections (repeatable)",
    )
    parser.add_argument(
        "--scenario",
        type=scenario_spec,
        action="append",
        metavar="KIND:N",
        help="run this scenario (uncontended:N = N connections a key each, contended:N = N connections on "
        "one key); repeatable, replaces the default list and --only/--connections",
    )
    parser.add_argument("--no-yrmcds", action="store_true", help="skip yrmcds (run when yrmcdsd is installed)")
    parser.add_argument(
        "--elock",
        metavar="EBIN",
        type=Path,
        help="also run elock, compiled with erlc into the directory EBIN (see benchmarks/README.md)",
    )
    parser.add_argument(
        "--dflockd",
        metavar="SRC",
        help="also run dflockd: its source tree (run with this Python) or an installed dflockd command",
    )
    parser.add_argument(
        "--profile-server",
        metavar="FILE",
        help="run the started jesync under cProfile and save its stats to FILE",
    )
    parser.add_argument(
        "--pin",
        choices=["split", "one"],
        help="split: servers on the first CPU, load generator on the others; "
        "one: everything on the first CPU (latency without cross-CPU wake-ups)",
    )
    args = parser.parse_args(argv)
    pin_cpus(parser, args)
    if args.quick:
        args.seconds, args.warmup = 1.0, 0.2
    if args.extra_rounds is None:
        args.extra_rounds = args.repeat if args.max_noise is not None else 0
    target_names = [name for name, _ in args.server] + [name for name, _, _ in args.jesync]
    if len(set(target_names)) != len(target_names):
        parser.error(f"target names must be distinct: {', '.join(target_names)}")
    if args.profile_server and (args.server or args.jesync):
        parser.error("--profile-server profiles the one jesync started by default; not with --server or --jesync")
    reactors = dict(args.reactor)
    started = [name for name, _, _ in args.jesync] or ([] if args.server else ["jesync"])
    if len(reactors) != len(args.reactor) or not set(reactors) <= set(started):
        parser.error(f"--reactor: one per started jesync ({', '.join(started) or 'none'}), by its name")
    if args.scenario:
        scenarios = list(dict.fromkeys(args.scenario))
    elif args.connections:
        # Any N, not only the default ones (e.g. 1000, 10000); one connection is never "contended".
        kinds = [args.only] if args.only else ["uncontended", "contended"]
        scenarios = [(k, n) for n in args.connections for k in kinds if not (k == "contended" and n == 1)]
    else:
        scenarios = [(k, n) for k, n in SCENARIOS if args.only in (None, k)]
    most = max(n for _, n in scenarios)
    # Above jesync's default connection limit (10,000), or large enough to overflow its listen backlog.
    jesync_options = ("--max-connections", "0") if most > 256 else ()

    print(f"nproc {os.cpu_count()}, python {sys.version.split()[0]}", end="")
    raise_open_files(most + 1000)  # a server and a load generator each hold one end of every connection
    with tempfile.TemporaryDirectory(prefix="jesync-bench-") as tmp:
        servers: list[Server] = []
        try:
            for name, address in args.server:
                servers.append(Server(name, address))
            for name, checkout, python in args.jesync:
                servers.append(
                    start_jesync(
                        Path(tmp), None, args.server_cpus, name, checkout, python, jesync_options, reactors.get(name)
                    )
                )
            if not servers:
                servers.append(
                    start_jesync(
                        Path(tmp),
                        args.profile_server and os.path.abspath(args.profile_server),
                        args.server_cpus,
                        options=jesync_options,
                        reactor=reactors.get("jesync"),
                    )
                )
            if args.no_redis:
                pass
            elif shutil.which("redis-server") is None:
                print(
                    "\nredis-server is not installed: skipping the Redis comparison "
                    "(apt-get install redis-server to get it)",
                    end="",
                )
            else:
                version = subprocess.run(
                    ["redis-server", "--version"], check=False, capture_output=True, text=True
                ).stdout
                print(f", redis {version.split()[2].removeprefix('v=')}", end="")
                servers.append(start_redis(Path(tmp), args.server_cpus, maxclients=most + 100))
            if args.no_yrmcds:
                pass
            elif shutil.which("yrmcdsd") is None:
                print("\nyrmcdsd is not installed: skipping yrmcds (apt-get install yrmcds to get it)", end="")
            else:
                print(", yrmcds", end="")
                servers.append(start_yrmcds(Path(tmp), args.server_cpus, maxclients=most + 100))
            if args.elock is None:
                pass
            elif shutil.which("erl") is None or not (args.elock / "lock_serv.beam").is_file():
                print(f"\nno erl, or no lock_serv.beam in {args.elock}: skipping elock", end="")
            else:
                print(", elock", end="")
                servers.append(start_elock(Path(tmp), args.elock.resolve(), args.server_cpus))
            dflockd = args.dflockd and dflockd_command(args.dflockd)
            if args.dflockd is None:
                print("\nno --dflockd SRC: skipping dflockd", end="")
            elif not dflockd:
                print(f"\n{args.dflockd}: no dflockd source tree or command: skipping dflockd", end="")
            else:
                print(f", dflockd {dflockd[2]}", end="")
                servers.append(start_dflockd(Path(tmp), dflockd[0], dflockd[1], args.server_cpus))
            print()
            for name, checkout, python in args.jesync:
                print(f"  {name}: {checkout} at {describe_checkout(checkout)}, {python}", end="")
                print(f", --reactor {reactors[name]}" if name in reactors else "")
            results: dict[tuple[str, int], list[dict[str, Result]]] = {}
            names = [server.name for server in servers]
            for kind, n in scenarios:
                rounds = results[kind, n] = []

                def enough() -> bool:
                    """Every reported pair has --repeat rounds in which both ran quietly."""
                    return all(
                        len(quiet_rounds(rounds, pair, args.max_noise)) >= args.repeat for pair in pairs(names)
                    )

                attempt = 0
                while not enough() and attempt < args.repeat + args.extra_rounds:
                    if args.max_noise is not None:
                        wait_for_quiet(args.max_noise, args.wait_quiet)
                    # Back to back, in alternating order, so both see the same noise.
                    rounds.append(measured := {})
                    for server in servers if attempt % 2 == 0 else servers[::-1]:
                        result = run_scenario(server, kind, n, args, tag=f"{kind}{n}-{attempt}")
                        measured[server.name] = result
                        print(
                            f"  {kind} x{n} {server.name}: {result.cycles_per_second:,.0f} cycles/s, "
                            f"p50 {result.p50_us:,.0f} µs, p99 {result.p99_us:,.0f} µs, "
                            f"server CPU {fmt_cpu(result.server_cpu)} ({fmt_us(result.server_us_per_cycle)} µs/cycle, "
                            f"{fmt_us(result.server_system_us_per_cycle)} of it system; "
                            f"{fmt_sleeps(result.server_sleeps_per_cycle)} sleeps/cycle), "
                            f"loadgen CPU {fmt_cpu(result.loadgen_cpu)}, other CPU {fmt_cpu(result.other_cpu)}"
                            + (" (noisy)" if args.max_noise is not None and result.other_cpu > args.max_noise else ""),
                            flush=True,
                        )
                    attempt += 1
        finally:
            for server in servers:
                server.stop()
    report(results, args)
    if args.profile_server:
        print(f"\nserver profile saved to {args.profile_server} (python -m pstats {args.profile_server})")


if __name__ == "__main__":
    main()
