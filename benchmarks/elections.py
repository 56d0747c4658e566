"""
Elections and groups (issue 25) against a real server, over loopback: how
long leadership takes to pass to the next candidate, and how many join and
leave events a group's watchers are told per second.

An election ``E`` is the key ``election:E`` (no server code of its own):
campaigning is ``lock election:E 1 -1 0 <value>`` (exclusive, waiting in
arrival order, never expiring), resigning ``release election:E``; a group
member ``M`` of ``G`` is the holder of ``group:G/M`` (``group-join`` /
``group-leave``), and ``watch-prefix group:G/`` tells of every join and
leave.  So both are measured against the plain lock path they are made of,
in the same round, and the ratio should be about 1.

The script starts ``twistd -n jesync`` from ``--jesync NAME=CHECKOUT[:PYTHON]``
(default: this checkout under this Python; repeatable: every part runs on
each) and, when ``redis-server`` is installed and ``--no-redis`` is not given,
a throwaway Redis, on free 127.0.0.1 ports, and runs the parts asked for
(``--part``, repeatable; default both), each in ``--repeat`` rounds whose
runs go back to back in alternating order.  Ratios are the median of the
rounds' own ratios.

``handover``
    ``--candidates`` connections (default 17: a leader and 16 waiting)
    campaign for one election, in a known order (each one's request is seen
    queued, by ``status``, before the next is sent); one more connection
    watches the key.  Then, ``--handovers`` times (default 2,000): the
    leader sends ``release election:E`` and the time from sending it to the
    next candidate reading its ``GRANTED`` is the hand-over; the old leader
    campaigns again (and is seen queued last) before the next hand-over, so
    every hand-over has 16 waiting.  Each run starts with
    ``--warmup-handovers`` (default 200) unmeasured ones (PyPy's JIT).  Checked each time: the candidate granted
    is the one that has waited longest, and the watcher's events name it
    (its ``EVENT GRANTED`` is timed too: release sent to the observer told).
    Measured the same way in the same round:

    - ``mutex``: the same clients and watcher, ``lock K`` / ``release K`` of
      a plain key with no value (the same mechanism: the ratio should be 1);
    - ``disconnect``: the leader closes its socket instead of releasing (a
      crashed leader); time from the close to the next candidate's
      ``GRANTED``; a new connection campaigns in its place
      (``--disconnects``, default 500);
    - ``redis``: the fair queue Redis has, one token in a list: waiting
      candidates block in ``BLPOP token 0`` (Redis serves blocked clients in
      the order they blocked), the leader resigns with ``RPUSH token 1``;
      the time from the ``RPUSH`` sent to the next candidate's ``BLPOP``
      reply.  Redis has no hand-over on a disconnect (a token held by a
      closed connection is lost; ``SET NX PX`` locks pass on only when the
      lease expires and a client polls): none is measured.

    Reported: p50, p99 and max in µs per workload, each round's (with the
    rest of the machine's CPU use meanwhile: noise), and the ratios
    election/mutex, disconnect/election and election/redis of the p50s.
    On a shared machine, ``--max-noise 0.1`` leaves out of the tables and
    ratios the runs during which the rest of it used more than a tenth of a
    core (latencies move both ways with it: a busy machine keeps the CPUs
    awake), and ``--quiet`` waits for a quiet second before each round.
    The clients are one process: a hand-over's time includes its reads.

``groups``
    One group (``group-create``); ``--watchers`` connections (default 0,
    100, then 1,000: a run of the part for each) each ``watch-prefix
    group:G/``; ``--members`` connections (default 16) each loop
    ``group-join G m<i> 0`` / ``group-leave G m<i>`` for ``--seconds``.  Every join is two events to every watcher
    (``APPEARED``, ``GRANTED``) and every leave two (``RELEASED``,
    ``DISAPPEARED``).  Counted: the events the watchers receive per second,
    joins + leaves per second, the join's round trip p50/p99, the server's
    CPU per event delivered and per join or leave, each watcher's count
    (the least and the most) and watchers dropped (none should be).  One
    watcher's events are checked: for every member key APPEARED, GRANTED,
    RELEASED, DISAPPEARED in turn.  In the same round, ``plain``: the same
    loop as ``lock plain:G/m<i> 1 -1 0`` / ``release plain:G/m<i>`` watched
    by ``watch-prefix plain:G/`` (the same events, no group table): what the
    group table adds.

    python benchmarks/elections.py                              # ~1 min
    python benchmarks/elections.py --part handover --repeat 5
    python benchmarks/elections.py --part groups --watchers 1000 --jesync pypy=.:/path/to/pypy-venv/bin/python

The clients use only the Python standard library (raw sockets; the groups
part reuses coordination.py's client processes).  Every wait is bounded;
the servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordination import (  # noqa: E402  (benchmarks/ is on sys.path)
    Role,
    Watchers,
    connect,
    count_events,
    cpu_per,
    fmt,
    percentile,
    read_until,
    receive,
    run_loops,
    spawn,
)
from loadgen import (  # noqa: E402
    REPO,
    ProtocolError,
    Server,
    _resp as resp,
    cpu_seconds,
    describe_checkout,
    jesync_target,
    machine_busy_seconds,
    median,
    raise_open_files,
    start_jesync,
    start_redis,
    wait_for_quiet,
)

PARTS = ("handover", "groups")
REPLY_TIMEOUT = 10.0  # seconds: the longest any expected reply may take before the run is abandoned


# -- hand-over ----------------------------------------------------------------------
#
# One process, one thread: the candidates' sockets and the observer's are
# all read through one epoll, and the time of a hand-over is taken when the
# granted candidate's reply is read (what a client would see).


class Lines:
    """A socket read a line at a time (C{end}: the line ending), without blocking the others."""

    def __init__(self, sock: socket.socket, end: bytes = b"\n") -> None:
        self.sock = sock
        self.end = end
        self.buffer = b""

    def fileno(self) -> int:
        return self.sock.fileno()

    def take(self) -> list[bytes]:
        """Read what is there; the complete lines it made."""
        data = self.sock.recv(65536)
        if not data:
            raise ProtocolError("the server closed a connection")
        self.buffer += data
        *lines, self.buffer = self.buffer.split(self.end)
        return lines


class Handover:
    """One workload's candidates, observer and the rules of its wire."""

    def __init__(self, server: Server, workload: str, candidates: int, tag: str) -> None:
        self.server = server
        self.workload = workload
        self.key = (b"election:bench-%s" if workload != "mutex" else b"bench-mutex-%s") % tag.encode()
        self.redis = workload == "redis"
        self.poller = select.epoll()
        self.queue: list[Lines] = []  # the leader first, then the waiting in arrival order
        self.names: dict[int, bytes] = {}  # fd -> the candidate's value (its name)
        self.serial = 0
        self.observer = self.open()
        if not self.redis:
            self.observer.sock.sendall(b"watch %s\n" % self.key)
            self.expect(self.observer, b"WATCHING ")
        for _ in range(candidates):
            self.campaign(self.open())

    def open(self) -> Lines:
        sock = connect(self.server.address)
        conn = Lines(sock, b"\r\n" if self.redis else b"\n")
        self.poller.register(sock.fileno(), select.EPOLLIN)
        return conn

    def fill(self, conn: Lines, size: int) -> None:
        """Block (bounded) until C{conn}'s buffer has C{size} bytes."""
        deadline = time.monotonic() + REPLY_TIMEOUT
        while len(conn.buffer) < size:
            if time.monotonic() > deadline or not select.select([conn.sock], [], [], REPLY_TIMEOUT)[0]:
                raise ProtocolError(f"{self.workload}: no reply")
            data = conn.sock.recv(65536)
            if not data:
                raise ProtocolError(f"{self.workload}: the server closed a connection")
            conn.buffer += data

    def expect(self, conn: Lines, start: bytes) -> bytes:
        """Block (bounded) for C{conn}'s next line; it must start with C{start}."""
        while conn.end not in conn.buffer:
            self.fill(conn, len(conn.buffer) + 1)
        line, conn.buffer = conn.buffer.split(conn.end, 1)
        if not line.startswith(start):
            raise ProtocolError(f"{self.workload}: expected {start!r}, got {line!r}")
        return line

    def campaign(self, conn: Lines) -> None:
        """C{conn} asks for the key (the token), and is seen queued last (or granted, if first)."""
        self.serial += 1
        name = b"candidate-%d" % self.serial
        self.names[conn.fileno()] = name
        if self.redis:
            if not self.queue:  # the first holds the token: there is none in the list
                self.observer.sock.sendall(resp(b"DEL", self.key))
                self.expect(self.observer, b":")
            else:
                conn.sock.sendall(resp(b"BLPOP", self.key, b"0"))
        elif self.workload == "mutex":
            conn.sock.sendall(b"lock %s 1 -1 0\n" % self.key)
        else:
            conn.sock.sendall(b"lock %s 1 -1 0 %s\n" % (self.key, name))
        self.queue.append(conn)
        if not self.redis and len(self.queue) == 1:
            self.expect(conn, b"GRANTED 1 0 ")
            self.expect(self.observer, b"EVENT GRANTED ")
            return
        self.wait_queued(len(self.queue) - 1)

    def wait_queued(self, waiting: int) -> None:
        """Ask (the observer) until the key has C{waiting} requests waiting (bounded)."""
        deadline = time.monotonic() + REPLY_TIMEOUT
        while time.monotonic() < deadline:
            if self.redis:
                self.observer.sock.sendall(resp(b"INFO", b"clients"))
                size = int(self.expect(self.observer, b"$")[1:])  # a bulk string: its length, then CRLF
                self.fill(self.observer, size + 2)
                body, self.observer.buffer = self.observer.buffer[:size], self.observer.buffer[size + 2 :]
                if b"blocked_clients:%d\r\n" % waiting in body:
                    return
            else:
                self.observer.sock.sendall(b"status %s\n" % self.key)
                if self.expect(self.observer, b"STATUS ") == b"STATUS 1 %d %s" % (waiting, self.key):
                    return
        raise ProtocolError(f"{self.workload}: never saw {waiting} waiting")

    def hand_over(self, disconnect: bool) -> tuple[int, int | None]:
        """
        The leader resigns (or, C{disconnect}, closes); returns (ns to the
        next candidate's grant, ns to the observer's event of it).
        """
        leader, successor = self.queue[0], self.queue[1]
        observed = None
        granted = None
        successor_lines: list[bytes] = []
        replied = disconnect
        sent = time.perf_counter_ns()
        if disconnect:
            self.poller.unregister(leader.fileno())
            leader.sock.close()
        elif self.redis:
            leader.sock.sendall(resp(b"RPUSH", self.key, b"1"))
        else:
            leader.sock.sendall(b"release %s\n" % self.key)
        deadline = time.monotonic() + REPLY_TIMEOUT
        while granted is None or not replied or (observed is None and not self.redis):
            ready = self.poller.poll(REPLY_TIMEOUT)
            now = time.perf_counter_ns()
            if not ready or time.monotonic() > deadline:
                raise ProtocolError(f"{self.workload}: the hand-over did not complete")
            for fd, _ in ready:
                conn = next(c for c in (self.observer, *self.queue) if c.fileno() == fd)
                for line in conn.take():
                    if conn is successor:
                        if granted is None and not line.startswith(b"*2" if self.redis else b"GRANTED 1 "):
                            raise ProtocolError(f"{self.workload}: the next candidate got {line!r}")
                        granted = now - sent if granted is None else granted
                        successor_lines.append(line)
                    elif conn is leader:
                        if not line.startswith(b":" if self.redis else b"RELEASED "):
                            raise ProtocolError(f"{self.workload}: the leader's release got {line!r}")
                        replied = True
                    elif conn is self.observer:
                        if line.startswith(b"EVENT GRANTED "):
                            if self.workload == "election" and not line.endswith(b" " + self.names[successor.fileno()]):
                                raise ProtocolError(f"{self.workload}: the observer was told {line!r}")
                            observed = now - sent
                        elif not line.startswith((b"EVENT RELEASED ", b"EVENT LOST ")):
                            raise ProtocolError(f"{self.workload}: the observer got {line!r}")
                    else:
                        raise ProtocolError(f"{self.workload}: a waiting candidate got {line!r}")
        if self.redis:  # BLPOP's reply is five lines: *2, the key's length, the key, the value's, the value
            while len(successor_lines) < 5:
                successor_lines.append(self.expect(successor, b""))
            if successor_lines[2:] != [self.key, b"$1", b"1"]:
                raise ProtocolError(f"{self.workload}: the next candidate got {successor_lines!r}")
        self.queue.pop(0)
        self.campaign(self.open() if disconnect else leader)
        return granted, observed

    def close(self) -> None:
        for conn in (self.observer, *self.queue):
            conn.sock.close()
        self.poller.close()


def handover_part(targets: list[Server], redis: Server | None, args) -> None:
    print(
        f"\n## handover: {args.candidates} candidates (a leader and {args.candidates - 1} waiting) and one "
        f"observer; {args.handovers:,} resignations, {args.disconnects:,} disconnects a run\n",
        flush=True,
    )
    workloads = []
    for server in targets:
        workloads += [(server, "election"), (server, "mutex"), (server, "disconnect")]
    if redis:
        workloads.append((redis, "redis"))
    rounds = []
    for attempt in range(args.repeat):
        if args.quiet is not None:
            wait_for_quiet(args.quiet, 30.0)
        measured = {}
        for server, workload in workloads if attempt % 2 == 0 else workloads[::-1]:
            name = f"{server.name} {workload}"
            handover = Handover(server, "election" if workload == "disconnect" else workload, args.candidates,
                                f"{attempt}-{workload}")
            disconnect = workload == "disconnect"
            try:
                for _ in range(args.warmup_handovers):  # unmeasured: PyPy's JIT, the caches
                    handover.hand_over(disconnect)
            except BaseException:
                handover.close()
                raise
            started, own_before = time.monotonic(), time.process_time()
            cpu_before, busy_before = cpu_seconds(server.pid), machine_busy_seconds()
            try:
                times = [handover.hand_over(disconnect) for _ in range(args.disconnects if disconnect else args.handovers)]
            finally:
                handover.close()
            cpu_after, busy_after = cpu_seconds(server.pid), machine_busy_seconds()
            elapsed = time.monotonic() - started
            server_cpu = 0.0 if cpu_before is None or cpu_after is None else cpu_after - cpu_before
            other = (busy_after - busy_before - server_cpu - (time.process_time() - own_before)) / elapsed
            granted = [g for g, _ in times]
            observed = [o for _, o in times if o is not None]
            result = SimpleNamespace(
                p50=percentile(granted, 0.5) * 1000,
                p99=percentile(granted, 0.99) * 1000,
                max=percentile(granted, 1.0) * 1000,
                observed_p50=percentile(observed, 0.5) * 1000,
                count=len(granted),
                other=max(0.0, other),
            )
            measured[name] = result
            print(
                f"  round {attempt + 1} {name}: hand-over p50 {result.p50:,.0f} µs, p99 {result.p99:,.0f}, "
                f"max {result.max:,.0f} ({result.count:,}); observer told p50 {fmt(result.observed_p50 if observed else None)} µs; "
                f"other CPU {result.other * 100:.0f}%",
                flush=True,
            )
        rounds.append(measured)
    print()
    print("| workload | hand-over p50 µs (median run) | p99 µs | max µs (of the runs) | observer told p50 µs |")
    print("|---|---|---|---|---|")
    for server, workload in workloads:
        name = f"{server.name} {workload}"
        runs = sorted((r[name] for r in rounds if r[name].other <= args.max_noise), key=lambda r: r.p50)
        if not runs:
            print(f"| {name} | no run quiet enough | | | |")
            continue
        r = runs[(len(runs) - 1) // 2]
        worst = max(run.max for run in runs)
        observed = "-" if workload == "redis" else f"{r.observed_p50:,.0f}"
        print(f"| {name} | {r.p50:,.0f} | {r.p99:,.0f} | {worst:,.0f} | {observed} |")
    print()
    for server in targets:
        pairs = [("election", "mutex"), ("disconnect", "election")]
        for a, b in pairs:
            print(p50_ratio(f"{server.name} {a}", f"{server.name} {b}", rounds, args.max_noise))
        if redis:
            print(p50_ratio(f"{server.name} election", f"{redis.name} redis", rounds, args.max_noise))


def p50_ratio(a: str, b: str, rounds, max_noise: float) -> str:
    """The median of the rounds' ratios a/b of the p50s (and of the p99s), of the rounds both ran quietly in."""
    quiet = [r for r in rounds if r[a].other <= max_noise and r[b].other <= max_noise and r[b].p50]
    ratios = [r[a].p50 / r[b].p50 for r in quiet]
    p99 = [r[a].p99 / r[b].p99 for r in quiet]
    if not ratios:
        return f"{a} / {b}: -"
    return (
        f"{a} / {b}: p50 **{median(ratios):.2f}x** (rounds {min(ratios):.2f}-{max(ratios):.2f}), "
        f"p99 {median(p99):.2f}x, {len(quiet)} of {len(rounds)} rounds"
    )


# -- groups ------------------------------------------------------------------------


class PrefixEventOrder:
    """
    Checks one prefix watcher's event lines: for every key, APPEARED,
    GRANTED, then its end (RELEASED; EXPIRED; LOST when a member goes at
    the end of the run) and DISAPPEARED, in turn (one holder a key).
    """

    NEXT = {None: (b"APPEARED",), b"APPEARED": (b"GRANTED",), b"GRANTED": (b"RELEASED", b"EXPIRED", b"LOST"),
            b"RELEASED": (b"DISAPPEARED",), b"EXPIRED": (b"DISAPPEARED",), b"LOST": (b"DISAPPEARED",)}

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.buffer = b""
        self.state: dict[bytes, bytes | None] = {}
        self.checked = 0
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        if self.error:
            return
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            fields = line.split()
            if len(fields) < 3 or fields[0] != b"EVENT" or not fields[2].startswith(self.prefix):
                self.error = f"not an event under {self.prefix!r}: {line!r}"
                return
            kind, key = fields[1], fields[2]
            if kind not in self.NEXT[self.state.get(key)]:
                self.error = f"out of order after {self.checked} events ({key!r} was {self.state.get(key)!r}): {line!r}"
                return
            self.state[key] = None if kind == b"DISAPPEARED" else kind
            self.checked += 1


def prefix_watcher_worker(address, prefix: bytes, count: int, read_interval: float, pipe) -> None:
    """coordination.watcher_worker's protocol, the connections watching a prefix."""
    socks = []
    leftovers = []
    for _ in range(count):
        sock = connect(address)
        sock.sendall(b"watch-prefix %s\n" % prefix)
        line, rest = read_until(sock, b"\n")
        if line != b"WATCHING-PREFIX %s\n" % prefix:
            raise ProtocolError(f"watch-prefix {prefix!r} -> {line!r}")
        leftovers.append(rest)
        sock.setblocking(False)
        socks.append(sock)
    pipe.send("ready")
    order = PrefixEventOrder(prefix)
    while True:
        command = pipe.recv()
        if command[0] == "close":
            for sock in socks:
                sock.close()
            pipe.send("closed")
            return
        _, start, warmup, seconds = command
        window = (start + warmup, start + warmup + seconds)
        pipe.send(count_events(socks, leftovers, "jesync", order, window, read_interval))  # type: ignore[arg-type]


class PrefixWatchers(Watchers):
    """C{count} watchers of C{prefix} in C{procs} processes (coordination.Watchers' interface)."""

    def __init__(self, server: Server, prefix: bytes, count: int, procs: int, read_interval: float) -> None:
        shares = [count // procs + (1 if i < count % procs else 0) for i in range(procs)]
        self.workers = [
            spawn(prefix_watcher_worker, server.address, prefix, share, read_interval) for share in shares if share
        ]
        for _, pipe in self.workers:
            if receive(pipe, "watchers") != "ready":
                raise SystemExit("a watcher process failed to connect")


def command(server: Server, line: bytes, reply: bytes) -> None:
    with connect(server.address) as sock:
        sock.sendall(line)
        got, _ = read_until(sock, b"\n")
        if got != reply:
            raise ProtocolError(f"{line!r} -> {got!r}, expected {reply!r}")


def groups_part(targets: list[Server], watchers: int, args) -> None:
    print(
        f"\n## groups: {watchers:,} watchers of the group's prefix, {args.members} members joining and leaving "
        f"in a loop; plain: the same as lock/release of keys under a prefix\n",
        flush=True,
    )
    workloads = [(server, workload) for server in targets for workload in ("group", "plain")]
    rounds = []
    for attempt in range(args.repeat):
        if args.quiet is not None:
            wait_for_quiet(args.quiet, 30.0)
        measured = {}
        for server, workload in workloads if attempt % 2 == 0 else workloads[::-1]:
            group = b"bench-%d-%d" % (watchers, attempt)
            if workload == "group":
                command(server, b"group-create %s\n" % group, b"GROUP-CREATED %s\n" % group)
                prefix = b"group:%s/" % group
                clients = [
                    Role("member", [(b"group-join %s m%d 0\n" % (group, i), b"JOINED "),
                                    (b"group-leave %s m%d\n" % (group, i), b"LEFT ")])
                    for i in range(args.members)
                ]
            else:
                prefix = b"plain:%s/" % group
                clients = [
                    Role("member", [(b"lock %sm%d 1 -1 0\n" % (prefix, i), b"GRANTED "),
                                    (b"release %sm%d\n" % (prefix, i), b"RELEASED ")])
                    for i in range(args.members)
                ]
            watching = PrefixWatchers(server, prefix, watchers, args.watcher_procs, args.read_interval) if watchers else None
            try:
                counts, watcher_counts, window = run_loops(server, clients, args, watching)
            finally:
                if watching:
                    watching.close()
            if workload == "group":
                command(server, b"group-delete %s\n" % group, b"GROUP-DELETED %s\n" % group)
            member = counts["member"]
            events = sum(w.events for w in watcher_counts)
            changes = 2 * member.cycles  # a join and a leave a cycle
            result = SimpleNamespace(
                events_per_second=events / window.seconds,
                changes_per_second=changes / window.seconds,
                join_p50=percentile(member.waits, 0.5) * 1000,
                join_p99=percentile(member.waits, 0.99) * 1000,
                cpu_per_event=cpu_per(window, events),
                cpu_per_change=cpu_per(window, changes),
                least=min((w.least for w in watcher_counts), default=0),
                most=max((w.most for w in watcher_counts), default=0),
                dropped=sum(w.dropped for w in watcher_counts),
                checked=sum(w.checked for w in watcher_counts),
                order_error=next((w.order_error for w in watcher_counts if w.order_error), None),
                window=window,
            )
            name = f"{server.name} {workload}"
            measured[name] = result
            print(
                f"  round {attempt + 1} {name}: {result.events_per_second:,.0f} events/s delivered, "
                f"{result.changes_per_second:,.0f} joins+leaves/s (join p50 {result.join_p50:,.0f} µs, "
                f"p99 {result.join_p99:,.0f}), server CPU "
                f"{fmt(window.server_cpu and window.server_cpu / window.seconds * 100)}% "
                f"({fmt(result.cpu_per_event, '.2f')} µs/event, {fmt(result.cpu_per_change, '.0f')} µs/join or leave), "
                f"per watcher {result.least:,}-{result.most:,}, dropped {result.dropped}, "
                f"order: {result.checked:,} checked, {result.order_error or 'ok'}, "
                f"clients' CPU {window.client_cpu * 100:.0f}%, other CPU {window.other_cpu * 100:.0f}%",
                flush=True,
            )
            if result.order_error or result.dropped:
                print(f"  ** {name}: {result.order_error or ''} {result.dropped} watcher(s) dropped", flush=True)
        rounds.append(measured)
    print()
    print("| workload | events/s delivered (median round) | joins+leaves/s | join p50 µs | p99 µs | server CPU | "
          "server CPU/event | CPU/join or leave | events per watcher (least-most) | dropped |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for server, workload in workloads:
        name = f"{server.name} {workload}"
        runs = sorted(
            (r[name] for r in rounds if r[name].window.other_cpu <= args.max_noise),
            key=lambda r: r.changes_per_second,
        )
        if not runs:
            print(f"| {name} | no run quiet enough | | | | | | | | |")
            continue
        r = runs[(len(runs) - 1) // 2]
        print(
            f"| {name} | {r.events_per_second:,.0f} | {r.changes_per_second:,.0f} | {r.join_p50:,.0f} | "
            f"{r.join_p99:,.0f} | {fmt(r.window.server_cpu and 100 * r.window.server_cpu / r.window.seconds)}% | "
            f"{fmt(r.cpu_per_event, '.2f')} µs | {fmt(r.cpu_per_change, '.0f')} µs | {r.least:,}-{r.most:,} | "
            f"{r.dropped} |"
        )
    print()
    for server in targets:
        group, plain = f"{server.name} group", f"{server.name} plain"
        for what in ("events_per_second", "cpu_per_event", "changes_per_second", "cpu_per_change"):
            quiet = [r for r in rounds if max(r[group].window.other_cpu, r[plain].window.other_cpu) <= args.max_noise]
            ratios = [getattr(r[group], what) / getattr(r[plain], what) for r in quiet
                      if getattr(r[group], what) and getattr(r[plain], what)]
            if ratios:
                print(f"{group}/{plain} {what.replace('_', ' ')}: **{median(ratios):.2f}x** "
                      f"(rounds {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} of {len(rounds)})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=PARTS, action="append", help="run this part (repeatable; default both)")
    parser.add_argument(
        "--jesync",
        type=jesync_target,
        action="append",
        default=[],
        metavar="NAME=CHECKOUT[:PYTHON]",
        help="start a jesync from CHECKOUT (PYTHONPATH), with the twistd next to PYTHON (default: this "
        "checkout, this Python); repeatable: every part measures each",
    )
    parser.add_argument("--no-redis", action="store_true", help="handover: skip the Redis BLPOP queue")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per part (default 3)")
    parser.add_argument("--candidates", type=int, default=17, help="handover: candidates (default 17)")
    parser.add_argument("--handovers", type=int, default=2000, help="handover: resignations a run (default 2,000)")
    parser.add_argument("--disconnects", type=int, default=500, help="handover: disconnects a run (default 500)")
    parser.add_argument(
        "--warmup-handovers", type=int, default=200,
        help="handover: unmeasured hand-overs (of the run's kind) before each run (default 200)",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="groups: measured seconds a run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="groups: unmeasured seconds before (default 0.5)")
    parser.add_argument(
        "--watchers", type=int, nargs="+", default=[0, 100, 1000],
        help="groups: watchers of the prefix, one run of the part per number (default 0 100 1000)",
    )
    parser.add_argument("--members", type=int, default=16, help="groups: members joining and leaving (default 16)")
    parser.add_argument(
        "--watcher-procs", type=int, default=1, help="groups: processes the watchers are split over (default 1)"
    )
    parser.add_argument(
        "--read-interval", type=float, default=0.02,
        help="groups: seconds a watcher process sleeps after each pass over its ready sockets (default 0.02)",
    )
    parser.add_argument(
        "--quiet", type=float, metavar="CORES",
        help="before each round wait (at most 30 s) for a second in which the machine used less than CORES "
        "of a core (e.g. 0.3)",
    )
    parser.add_argument(
        "--max-noise", type=float, default=float("inf"), metavar="CORES",
        help="leave out of the tables and ratios the runs during which the rest of the machine used more "
        "than CORES of a core (e.g. 0.1; a ratio uses the rounds in which both its runs were quiet)",
    )
    args = parser.parse_args(argv)
    args.procs = 1  # the members' loops: one client process (coordination.run_loops)
    parts = args.part or list(PARTS)
    targets_wanted = args.jesync or [("jesync", REPO, sys.executable)]

    print(f"nproc {os.cpu_count()}, python {sys.version.split()[0]}", end="")
    raise_open_files(2 * max(args.watchers) + args.members + args.candidates + 1000)
    with tempfile.TemporaryDirectory(prefix="jesync-elections-") as tmp:
        targets: list[Server] = []
        redis = None
        try:
            for name, checkout, python in targets_wanted:
                targets.append(start_jesync(Path(tmp), None, None, name, checkout, python))
            if "handover" in parts and not args.no_redis:
                if shutil.which("redis-server") is None:
                    print("\nredis-server is not installed: skipping the Redis comparison", end="")
                else:
                    version = subprocess.run(
                        ["redis-server", "--version"], check=False, capture_output=True, text=True
                    ).stdout
                    print(f", redis {version.split()[2].removeprefix('v=')}", end="")
                    redis = start_redis(Path(tmp), None)
            print()
            for name, checkout, python in targets_wanted:
                print(f"  {name}: {checkout} at {describe_checkout(checkout)}, {python}")
            print(f"{args.repeat} round(s) per part")
            if "handover" in parts:
                handover_part(targets, redis, args)
            if "groups" in parts:
                for watchers in args.watchers:
                    groups_part(targets, watchers, args)
        finally:
            for server in targets + ([redis] if redis else []):
                server.stop()


if __name__ == "__main__":
    main()
