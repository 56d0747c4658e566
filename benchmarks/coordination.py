"""
Watches and shared locks against a real server, over loopback: events/s to
many watchers of one key (against Redis pub/sub fan-out in the same round),
what idle watchers cost the plain lock path, and what shared mode buys
readers of one key while a writer still gets its turn.

The script starts ``twistd -n jesync`` from ``--jesync NAME=CHECKOUT[:PYTHON]``
(default: this checkout under this Python) and, when ``redis-server`` is
installed and ``--no-redis`` is not given, a throwaway Redis, both on free
127.0.0.1 ports, raises its own open-file limit (the servers inherit it), and
runs the parts asked for (``--part``, repeatable; default all three), each in
``--repeat`` rounds whose runs go back to back in alternating order, so that
the runs compared in a ratio saw the same load on the machine.  Every ratio is
the median of the rounds' own ratios.

``events``
    ``--watchers`` connections (default 1,000) each send ``watch K`` and read
    ``WATCHING K``; then ``--lockers`` connections loop ``lock K`` /
    ``release K`` for ``--seconds`` (default: 1 locker, then 4: one request
    in flight leaves the server idle for each round trip; with four it
    always has work, and the figure is what its CPU can send).  Counted: the ``EVENT``
    lines the watchers receive per second (each cycle is two changes,
    GRANTED and RELEASED, told to every watcher), the lock cycles/s, the
    server's CPU per event delivered, each watcher's count (the least and
    the most: a fair server tells them all), and watchers the server dropped
    (a watcher process that cannot keep up would be: none should be).  One
    watcher's lines are parsed and checked: GRANTED and RELEASED of the key
    alternate, each RELEASED carrying the token of the GRANTED before it.
    The watchers read every ``--read-interval`` (default 20 ms), so that a
    read takes several events: the client side, which shares the 2 cores,
    costs less, the same for both servers (the servers' own rates do not
    depend on it: a locker or publisher does not wait for the watchers).
    The peer: Redis, the same number of ``SUBSCRIBE K`` connections and as
    many publishers looping ``PUBLISH K <payload>`` (each reply must count
    every subscriber), the payload as long as a jesync GRANTED line's
    fields; counted the same way (``message`` frames received per second).
    Redis sends one message per round trip and jesync two events per cycle
    of two round trips: the figure compared is the events delivered per
    second, and the CPU each costs the server (with the server's share of a
    core, to tell a saturated server from a waiting one).
``idle``
    the plain path: loadgen.py's loop, ``--connections`` connections
    (default 64) each locking and releasing its own key, in the same round
    alone, with ``--watchers`` idle connections (each sent one ``status``)
    and with as many connections watching another key (opened before the
    run, closed after it): cycles/s and server CPU per cycle.  The idle
    connections tell what the watches cost from what the connections do.
``shared``
    one key: ``--readers`` connections (default 64) loop
    ``lock-shared K`` / ``release K`` and ``--writers`` (default 1) loop
    ``lock K`` / ``release K``, against ``readers + writers`` connections
    all looping ``lock K`` / ``release K`` (exclusive) in the same round.
    Reported: each role's cycles/s and wait (request sent to GRANTED
    received) p50 / p99 / max; the writer's cycles must be > 0 and its wait
    bounded (a waiting exclusive request holds back the shared requests that
    arrive after it).  The ratio is all cycles with shared readers over all
    cycles with every client exclusive.

``lock-path``
    the idle part's question in process (no sockets, so the machine's other
    load matters less; each checkout under its Python): 64 owners each take
    and release a key of their own, 200 times over, best of 15, on a lock
    service with no watch and on one with ``--watchers`` watches of another
    key, alternated over ``--repeat`` rounds: nanoseconds per cycle.

    python benchmarks/coordination.py                          # ~2 min
    python benchmarks/coordination.py --part events --repeat 5 --seconds 3
    python benchmarks/coordination.py --part shared --jesync after=/work/main

Only the Python standard library is used by the clients (raw non-blocking
sockets, one epoll per client process).  Every loop is bounded in time; the
servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import closedloop  # noqa: E402  (benchmarks/ is on sys.path)
from closedloop import CYCLE, RECORD, Tally, closed_loop  # noqa: E402
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
    run_scenario,
    start_jesync,
    start_redis,
    wait_for_quiet,
)

PARTS = ("events", "idle", "shared", "lock-path")
CONNECT_TIMEOUT = 30.0  # seconds for a client process to open and set up all its connections


def connect(address) -> socket.socket:
    return closedloop.connect(address, CONNECT_TIMEOUT)


def read_until(sock: socket.socket, end: bytes, buffer: bytes = b"") -> tuple[bytes, bytes]:
    """Blocking: read until C{end} is in the buffer; return (up to and with it, the rest)."""
    while end not in buffer:
        data = sock.recv(4096)
        if not data:
            raise ProtocolError(f"the server closed the connection (read so far: {buffer[-200:]!r})")
        buffer += data
    head, _, rest = buffer.partition(end)
    return head + end, rest


# -- watchers --------------------------------------------------------------------
#
# A watcher process opens its connections, subscribes each to the key, says
# "ready" and then either counts what arrives in a measured window or, for
# the idle part, only waits to be told to close.


def subscribe(sock: socket.socket, protocol: str, key: bytes, watch: bool = True) -> bytes:
    """
    Ask for the key's events; return what arrived after the confirmation.
    Without C{watch} (jesync): only C{status K}, a connection that has
    spoken once and then stays idle, watching nothing.
    """
    if protocol == "jesync" and not watch:
        sock.sendall(b"status %s\n" % key)
        line, rest = read_until(sock, b"\n")
        if line != b"STATUS 0 0 %s\n" % key:
            raise ProtocolError(f"status {key!r} -> {line!r}")
        return rest
    if protocol == "jesync":
        sock.sendall(b"watch %s\n" % key)
        line, rest = read_until(sock, b"\n")
        if line != b"WATCHING %s\n" % key:
            raise ProtocolError(f"watch {key!r} -> {line!r}")
        return rest
    sock.sendall(resp(b"SUBSCRIBE", key))
    confirmation = b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(key), key)
    line, rest = read_until(sock, b":1\r\n")
    if line != confirmation:
        raise ProtocolError(f"SUBSCRIBE {key!r} -> {line!r}")
    return rest


# What one delivered event looks like to a counter: a jesync event is a
# line; a Redis one a "message" frame (the pattern never straddles two of
# them, and the last len - 1 bytes of each read are kept for the next, so a
# pattern split between two reads is counted once).
EVENT_MARK = {"jesync": b"\n", "redis": b"$7\r\nmessage\r\n"}


class EventOrder:
    """
    Checks one watcher's jesync event lines: GRANTED and its end (RELEASED;
    LOST when a locker goes at the end of the run; EXPIRED) alternate (one
    holder at a time: exclusive lockers), and the end carries the token of
    the GRANTED before it.
    """

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.buffer = b""
        self.token: bytes | None = None  # the current holder's, between its GRANTED and RELEASED
        self.checked = 0
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        if self.error:
            return
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            fields = line.split()
            if len(fields) < 5 or fields[0] != b"EVENT" or fields[2] != self.key:
                self.error = f"not an event of {self.key!r}: {line!r}"
                return
            kind, token = fields[1], fields[4]
            if kind == b"GRANTED" and self.token is None and fields[5:6] == [b"exclusive"]:
                self.token = token
            elif kind in (b"RELEASED", b"LOST", b"EXPIRED") and token == self.token:
                self.token = None  # LOST: a locker's connection closed while it held the key (the run's end)
            else:
                self.error = f"out of order after {self.checked} events (holder's token {self.token!r}): {line!r}"
                return
            self.checked += 1


@dataclass
class WatcherCounts:
    events: int  # delivered in the window, all watchers
    least: int  # the fewest one watcher got in the window
    most: int
    dropped: int  # connections the server closed
    checked: int  # events of one watcher parsed and found in order
    order_error: str | None
    cpu: float  # the watcher process's CPU seconds in the window


def watcher_worker(address, protocol: str, key: bytes, count: int, read_interval: float, watch: bool, pipe) -> None:
    """
    Open C{count} connections watching C{key} (only idle, without
    C{watch}: L{subscribe}), say "ready", then obey the
    parent: ("measure", start, warmup, seconds) counts what arrives in the
    window and sends a L{WatcherCounts}; ("close",) closes them all and
    sends "closed".
    """
    socks = []
    leftovers = []
    for _ in range(count):
        sock = connect(address)
        leftovers.append(subscribe(sock, protocol, key, watch))
        sock.setblocking(False)
        socks.append(sock)
    pipe.send("ready")
    order = EventOrder(key) if protocol == "jesync" else None
    while True:
        command = pipe.recv()
        if command[0] == "close":
            for sock in socks:
                sock.close()
            pipe.send("closed")
            return
        _, start, warmup, seconds = command
        window = (start + warmup, start + warmup + seconds)
        pipe.send(count_events(socks, leftovers, protocol, order, window, read_interval))


def count_events(socks, leftovers, protocol: str, order: EventOrder | None, window, read_interval) -> WatcherCounts:
    """
    Read every socket (each at most once every C{read_interval} s) until the
    C{window}'s end (time.monotonic()), counting what arrives in the window.
    """
    window_start, end = window
    mark = EVENT_MARK[protocol]
    keep = len(mark) - 1
    poller = select.epoll()
    by_fd = {sock.fileno(): i for i, sock in enumerate(socks)}
    for sock in socks:
        poller.register(sock.fileno(), select.EPOLLIN)
    counts = [0] * len(socks)
    tails = [b""] * len(socks)
    open_ = [True] * len(socks)
    if order is not None and leftovers[0]:
        order.feed(leftovers[0])  # events that came with the WATCHING reply (none, if nothing ran yet)
    cpu_at_window = None
    now = time.monotonic()
    while now < end:
        counting = now >= window_start
        if counting and cpu_at_window is None:
            cpu_at_window = time.process_time()
        ready = poller.poll(0.05)
        for fd, _ in ready:
            i = by_fd[fd]
            try:
                data = socks[i].recv(262144)
            except ConnectionError:
                data = b""
            if not data:
                poller.unregister(fd)
                open_[i] = False
                continue
            if keep:
                data = tails[i] + data
                tails[i] = data[-keep:]
            if counting:
                counts[i] += data.count(mark)
            if i == 0 and order is not None:
                order.feed(data)
        if ready and read_interval:
            time.sleep(read_interval)
        now = time.monotonic()
    poller.close()
    cpu = time.process_time() - (cpu_at_window or time.process_time())
    return WatcherCounts(
        sum(counts),
        min(counts),
        max(counts),
        open_.count(False),
        order.checked if order else 0,
        order.error if order else None,
        cpu,
    )


# -- closed-loop clients -----------------------------------------------------------
#
# A client has a role (a name for the report), and a cycle of steps, each a
# request and the start of its expected reply; it sends one step, waits for
# its reply, sends the next.  The first step's round trip is its wait (for a
# lock: request sent to GRANTED received).


@dataclass
class Role:
    name: str
    steps: list[tuple[bytes, bytes]]  # (request, what its reply starts with)


@dataclass
class RoleCounts:
    cycles: int = 0
    waits: list[int] = field(default_factory=list)  # ns, the first step of each cycle completed in the window


class RoleConn(closedloop.Conn):
    __slots__ = ("role", "step")

    def __init__(self, sock: socket.socket, role: Role, tally: Tally) -> None:
        super().__init__(sock, role.steps[0][0], tally)
        self.role = role
        self.step = 0


def role_reply(conn: RoleConn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """
    closedloop's reply handler: a line that starts as the step expects; the
    first step's reply ends a wait, the last step's a cycle.
    """
    newline = buffer.find(b"\n")
    if newline < 0:
        return None
    line = buffer[:newline]
    steps = conn.role.steps
    step = conn.step
    if not line.startswith(steps[step][1]):
        raise ProtocolError(f"{conn.role.name}: {steps[step][0]!r} -> {line!r}")
    flags = RECORD if step == 0 else 0
    step += 1
    if step == len(steps):
        step = 0
        flags |= CYCLE
    conn.step = step
    return newline + 1, steps[step][0], flags


def loop_worker(address, clients: list[Role], warmup: float, seconds: float, pipe) -> None:
    """
    Connect one socket per client, then closedloop's loop over every
    client's cycle; send ({role: RoleCounts}, CPU seconds in the window).
    """
    tallies = {role.name: Tally() for role in clients}
    conns = [RoleConn(connect(address), role, tallies[role.name]) for role in clients]
    cpu = closed_loop(conns, role_reply, warmup, seconds, pipe, poll_timeout=0.05)
    for conn in conns:
        conn.sock.close()
    pipe.send(({name: RoleCounts(t.cycles, t.latencies) for name, t in tallies.items()}, cpu))


def jesync_locker(name: str, key: bytes, shared: bool = False) -> Role:
    lock = b"lock-shared %s\n" if shared else b"lock %s\n"
    return Role(name, [(lock % key, b"GRANTED "), (b"release %s\n" % key, b"RELEASED ")])


def redis_publisher(key: bytes, payload: bytes, subscribers: int) -> Role:
    return Role("publisher", [(resp(b"PUBLISH", key, payload), b":%d\r" % subscribers)])


# -- running processes together ------------------------------------------------------


def receive(pipe, what: str):
    if not pipe.poll(CONNECT_TIMEOUT + 60):
        raise SystemExit(f"{what}: no answer from its process")
    try:
        return pipe.recv()
    except EOFError:
        raise SystemExit(f"{what}: its process failed (see its traceback above)") from None


def spawn(target, *arguments):
    """A forked process running C{target(*arguments, pipe)}; returns (process, the parent's end)."""
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    process = context.Process(target=target, args=(*arguments, child_end), daemon=True)
    process.start()
    child_end.close()
    return process, parent_end


class Watchers:
    """
    C{count} watchers of C{key} (without C{watch}: connections that watch
    nothing), in C{procs} processes, open until L{close}.
    """

    def __init__(
        self, server: Server, key: bytes, count: int, procs: int, read_interval: float = 0.0, watch: bool = True
    ) -> None:
        shares = [count // procs + (1 if i < count % procs else 0) for i in range(procs)]
        self.workers = [
            spawn(watcher_worker, server.address, server.protocol, key, share, read_interval, watch)
            for share in shares
            if share
        ]
        for _, pipe in self.workers:
            if receive(pipe, "watchers") != "ready":
                raise SystemExit("a watcher process failed to connect")

    def measure(self, start: float, warmup: float, seconds: float) -> None:
        for _, pipe in self.workers:
            pipe.send(("measure", start, warmup, seconds))

    def counts(self) -> list[WatcherCounts]:
        return [receive(pipe, "watchers") for _, pipe in self.workers]

    def close(self) -> None:
        for process, pipe in self.workers:
            pipe.send(("close",))
        for process, pipe in self.workers:
            receive(pipe, "closing watchers")
            process.join(10)


@dataclass
class Window:
    """What the server and the machine did in a measured window."""

    seconds: float
    server_cpu: float | None  # CPU seconds
    other_cpu: float  # cores used by everything else meanwhile (noise), after the clients' own
    client_cpu: float  # cores used by the client processes (lockers and watchers)


def run_loops(server: Server, clients: list[Role], args, watchers: Watchers | None = None):
    """
    The clients' loops (in C{args.procs} processes) and, if given, the
    watchers' counting over the same window; returns ({role: RoleCounts},
    [WatcherCounts], L{Window}).
    """
    procs = max(1, min(args.procs, len(clients)))
    workers = [
        spawn(loop_worker, server.address, clients[i::procs], args.warmup, args.seconds) for i in range(procs)
    ]
    for _, pipe in workers:
        if receive(pipe, "clients") != "ready":
            raise SystemExit("a client process failed to connect")
    start = time.monotonic() + 0.1
    for _, pipe in workers:
        pipe.send(start)
    if watchers:
        watchers.measure(start, args.warmup, args.seconds)
    time.sleep(max(0.0, start + args.warmup - time.monotonic()))
    cpu_before, busy_before = cpu_seconds(server.pid), machine_busy_seconds()
    time.sleep(max(0.0, start + args.warmup + args.seconds - time.monotonic()))
    cpu_after, busy_after = cpu_seconds(server.pid), machine_busy_seconds()
    counts: dict[str, RoleCounts] = {}
    client_cpu = 0.0
    for process, pipe in workers:
        per_role, cpu = receive(pipe, "clients")
        client_cpu += cpu
        for name, role_counts in per_role.items():
            total = counts.setdefault(name, RoleCounts())
            total.cycles += role_counts.cycles
            total.waits += role_counts.waits
        process.join(10)
    watcher_counts = watchers.counts() if watchers else []
    client_cpu += sum(w.cpu for w in watcher_counts)
    server_cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    other = (busy_after - busy_before - (server_cpu or 0.0) - client_cpu) / args.seconds
    return counts, watcher_counts, Window(args.seconds, server_cpu, max(0.0, other), client_cpu / args.seconds)


def percentile(values: list[int], p: float) -> float:
    """The p-quantile of C{values} (ns) in ms; nan for none."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] / 1e6


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def cpu_per(window: Window, count: float, scale: float = 1e6) -> float | None:
    """Server CPU per thing counted, in µs (C{scale} 1e6)."""
    if window.server_cpu is None or not count:
        return None
    return scale * window.server_cpu / count


def ratio_line(name: str, values: list[tuple[float | None, float | None]]) -> str:
    """The median of the rounds' ratios a/b, with their range."""
    ratios = [a / b for a, b in values if a is not None and b]
    if not ratios:
        return f"{name}: -"
    return f"{name}: **{median(ratios):.2f}x** (rounds {min(ratios):.2f}-{max(ratios):.2f})"


# -- the parts -----------------------------------------------------------------------


def event_payload(server: Server, key: bytes) -> bytes:
    """What a jesync GRANTED event says after "EVENT " (a 16-digit token), for the Redis payload's length."""
    return b"GRANTED %s %s:%d %d exclusive" % (key, server.address[0].encode(), 54321, 10**15)


def events_part(targets: list[Server], redis: Server | None, lockers: int, args) -> None:
    print(f"\n## events: {args.watchers:,} watchers of one key, {lockers} locker(s) / publisher(s)\n", flush=True)
    servers = targets + ([redis] if redis else [])
    rounds = []
    for attempt in range(args.repeat):
        if args.quiet is not None:
            wait_for_quiet(args.quiet, 30.0)
        measured = {}
        for server in servers if attempt % 2 == 0 else servers[::-1]:
            key = b"hot-%d-%d" % (lockers, attempt)
            watchers = Watchers(server, key, args.watchers, args.watcher_procs, args.read_interval)
            try:
                if server.protocol == "redis":
                    payload = event_payload(targets[0], key)
                    clients = [redis_publisher(key, payload, args.watchers) for _ in range(lockers)]
                else:
                    clients = [jesync_locker("locker", key) for _ in range(lockers)]
                counts, watcher_counts, window = run_loops(server, clients, args, watchers)
            finally:
                watchers.close()
            cycles = sum(c.cycles for c in counts.values())
            events = sum(w.events for w in watcher_counts)
            result = SimpleNamespace(
                events_per_second=events / window.seconds,
                cycles_per_second=cycles / window.seconds,
                cpu_per_event=cpu_per(window, events),
                least=min(w.least for w in watcher_counts),
                most=max(w.most for w in watcher_counts),
                dropped=sum(w.dropped for w in watcher_counts),
                checked=sum(w.checked for w in watcher_counts),
                order_error=next((w.order_error for w in watcher_counts if w.order_error), None),
                window=window,
            )
            measured[server.name] = result
            print(
                f"  round {attempt + 1} {server.name}: {result.events_per_second:,.0f} events/s delivered, "
                f"{result.cycles_per_second:,.0f} {'publishes' if server.protocol == 'redis' else 'lock cycles'}/s, "
                f"server CPU {fmt(window.server_cpu and window.server_cpu / window.seconds * 100)}% "
                f"({fmt(result.cpu_per_event, '.2f')} µs/event), per watcher {result.least:,}-{result.most:,}, "
                f"dropped {result.dropped}, "
                + (f"order checked on {result.checked:,} events: {result.order_error or 'ok'}, "
                   if server.protocol == "jesync" else "")
                + f"clients' CPU {window.client_cpu * 100:.0f}%, other CPU {window.other_cpu * 100:.0f}%",
                flush=True,
            )
            if result.order_error or result.dropped:
                print(f"  ** {server.name}: {result.order_error or ''} {result.dropped} watcher(s) dropped", flush=True)
        rounds.append(measured)
    print()
    print("| server | events/s delivered (median round) | cycles or publishes/s | server CPU | server CPU/event | "
          "events per watcher (least-most) | dropped |")
    print("|---|---|---|---|---|---|---|")
    for server in servers:
        runs = sorted((r[server.name] for r in rounds), key=lambda r: r.events_per_second)
        r = runs[(len(runs) - 1) // 2]
        print(
            f"| {server.name} | {r.events_per_second:,.0f} | {r.cycles_per_second:,.0f} | "
            f"{fmt(r.window.server_cpu and 100 * r.window.server_cpu / r.window.seconds)}% | "
            f"{fmt(r.cpu_per_event, '.2f')} µs | {r.least:,}-{r.most:,} | {r.dropped} |"
        )
    print()
    # Each jesync target against the first, then each against Redis.
    pairs = [(target.name, targets[0].name) for target in targets[1:]]
    pairs += [(target.name, redis.name) for target in targets] if redis else []
    for name, reference in pairs:
        print(ratio_line(
            f"{name}/{reference} events/s",
            [(r[name].events_per_second, r[reference].events_per_second) for r in rounds],
        ))
        print(ratio_line(
            f"{name}/{reference} server CPU/event",
            [(r[name].cpu_per_event, r[reference].cpu_per_event) for r in rounds],
        ))


def idle_part(server: Server, args) -> None:
    print(
        f"\n## idle: {args.connections} connections, a key each, alone (plain), with {args.watchers:,} idle "
        f"connections (connected) and with {args.watchers:,} watchers of another key (watched) ({server.name})\n",
        flush=True,
    )
    options = SimpleNamespace(procs=1, warmup=args.warmup, seconds=args.seconds, client_cpus=None)
    rounds = []
    for attempt in range(args.repeat):
        if args.quiet is not None:
            wait_for_quiet(args.quiet, 30.0)
        measured = {}
        workloads = ("plain", "connected", "watched")
        for workload in workloads if attempt % 2 == 0 else workloads[::-1]:
            watchers = None
            if workload != "plain":
                key = b"idle-other-%d" % attempt
                watch = workload == "watched"
                watchers = Watchers(server, key, args.watchers, args.watcher_procs, watch=watch)
            try:
                tag = f"idle-{workload}-{attempt}"
                result = run_scenario(server, "uncontended", args.connections, options, tag=tag)
            finally:
                if watchers:
                    watchers.close()
            measured[workload] = result
            print(
                f"  round {attempt + 1} {workload}: {result.cycles_per_second:,.0f} cycles/s, "
                f"p50 {result.p50_us:,.0f} µs, p99 {result.p99_us:,.0f} µs, "
                f"server {fmt(result.server_us_per_cycle, '.1f')} µs/cycle, other CPU {result.other_cpu * 100:.0f}%",
                flush=True,
            )
        rounds.append(measured)
    print()
    print("| workload | cycles/s (median round) | p50 µs | p99 µs | server CPU/cycle |")
    print("|---|---|---|---|---|")
    for workload in ("plain", "connected", "watched"):
        runs = sorted((r[workload] for r in rounds), key=lambda r: r.cycles_per_second)
        r = runs[(len(runs) - 1) // 2]
        print(
            f"| {workload} | {r.cycles_per_second:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} | "
            f"{fmt(r.server_us_per_cycle, '.1f')} µs |"
        )
    print()
    for name, reference in (("watched", "plain"), ("connected", "plain"), ("watched", "connected")):
        print(ratio_line(f"{name}/{reference} cycles/s",
                         [(r[name].cycles_per_second, r[reference].cycles_per_second) for r in rounds]))
        print(ratio_line(f"{name}/{reference} server CPU/cycle",
                         [(r[name].server_us_per_cycle, r[reference].server_us_per_cycle) for r in rounds]))


def shared_part(server: Server, args) -> None:
    total = args.readers + args.writers
    print(
        f"\n## shared: one key, {args.readers} readers (lock-shared) + {args.writers} writer(s) (lock), "
        f"against {total} exclusive clients ({server.name})\n",
        flush=True,
    )
    rounds = []
    for attempt in range(args.repeat):
        if args.quiet is not None:
            wait_for_quiet(args.quiet, 30.0)
        measured = {}
        for workload in ("shared", "exclusive") if attempt % 2 == 0 else ("exclusive", "shared"):
            key = b"rw-%s-%d" % (workload.encode(), attempt)
            if workload == "shared":
                clients = [jesync_locker("writer", key) for _ in range(args.writers)]
                clients += [jesync_locker("reader", key, shared=True) for _ in range(args.readers)]
            else:
                clients = [jesync_locker("exclusive", key) for _ in range(total)]
            counts, _, window = run_loops(server, clients, args)
            measured[workload] = (counts, window)
            cycles = sum(c.cycles for c in counts.values())
            print(
                f"  round {attempt + 1} {workload}: "
                + ", ".join(
                    f"{name} {c.cycles / window.seconds:,.0f} cycles/s (wait p50 {percentile(c.waits, 0.5):.2f} "
                    f"p99 {percentile(c.waits, 0.99):.2f} max {percentile(c.waits, 1.0):.2f} ms)"
                    for name, c in sorted(counts.items())
                )
                + f", server {fmt(cpu_per(window, cycles), '.1f')} µs/cycle, other CPU {window.other_cpu * 100:.0f}%",
                flush=True,
            )
            if workload == "shared" and not counts["writer"].cycles:
                print("  ** the writer completed no cycle in the window: starved", flush=True)
        rounds.append(measured)

    def median_round(workload: str):
        ordered = sorted(
            (r[workload] for r in rounds), key=lambda m: sum(c.cycles for c in m[0].values())
        )
        return ordered[(len(ordered) - 1) // 2]

    print()
    print("| workload | role | cycles/s | wait p50 ms | p99 ms | max ms | server CPU/cycle |")
    print("|---|---|---|---|---|---|---|")
    for workload in ("shared", "exclusive"):
        counts, window = median_round(workload)
        cycles = sum(c.cycles for c in counts.values())
        for name, c in sorted(counts.items()):
            print(
                f"| {workload} | {name} | {c.cycles / window.seconds:,.0f} | {percentile(c.waits, 0.5):.2f} | "
                f"{percentile(c.waits, 0.99):.2f} | {percentile(c.waits, 1.0):.2f} | "
                f"{fmt(cpu_per(window, cycles), '.1f')} µs |"
            )
    print()

    def all_cycles(measured, workload: str) -> int:
        return sum(c.cycles for c in measured[workload][0].values())

    print(ratio_line("shared/exclusive cycles/s (all clients)",
                     [(all_cycles(r, "shared"), all_cycles(r, "exclusive")) for r in rounds]))
    print(ratio_line("shared/exclusive server CPU/cycle",
                     [(cpu_per(r["shared"][1], all_cycles(r, "shared")),
                       cpu_per(r["exclusive"][1], all_cycles(r, "exclusive"))) for r in rounds]))
    writer_cycles = [r["shared"][0]["writer"].cycles for r in rounds]
    print(f"writer cycles per round: {', '.join(f'{c:,}' for c in writer_cycles)}"
          f" ({'never starved' if all(writer_cycles) else 'STARVED in some round'})")


# One measurement of the lock path, run under a target's Python with its
# checkout first on the path: argv[1] watches of a key nobody locks.
LOCK_PATH = """
import gc, sys, time
from twisted.internet.task import Clock
from jesync.service import LockService

class Owner:
    __slots__ = ("__weakref__", "n")
    def __init__(self, n):
        self.n = n

service = LockService(Clock())
for i in range(int(sys.argv[1])):
    service.watch(Owner(-1 - i), "watched-key", lambda event: None)
owners = [(Owner(i), "key-%d" % i) for i in range(64)]
best = None
gc.disable()
for _ in range(15):
    start = time.perf_counter_ns()
    for _ in range(200):
        for owner, key in owners:
            service.acquire(key, owner)
            service.release(key, owner)
    elapsed = (time.perf_counter_ns() - start) / (200 * 64)
    best = elapsed if best is None else min(best, elapsed)
print(best)
"""


def lock_path_part(targets_wanted, args) -> None:
    print(f"\n## lock-path: in process, 64 owners, without and with {args.watchers:,} watches of another key\n")
    for name, checkout, python in targets_wanted:
        rounds = []
        for attempt in range(args.repeat):
            measured = {}
            for watches in (0, args.watchers) if attempt % 2 == 0 else (args.watchers, 0):
                # (in the checkout: "python -c" puts the working directory first on the path)
                out = subprocess.run(
                    [python, "-c", LOCK_PATH, str(watches)],
                    cwd=checkout,
                    env=dict(os.environ, PYTHONPATH=str(checkout)),
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=True,
                )
                measured[watches] = float(out.stdout)
            rounds.append(measured)
        for watches in (0, args.watchers):
            shown = ", ".join(f"{r[watches]:,.0f}" for r in rounds)
            best = min(r[watches] for r in rounds)
            print(f"{name}, {watches:,} watches: best {best:,.0f} ns/cycle (rounds: {shown})")
        print(ratio_line(f"{name}, {args.watchers:,} watches / none, ns/cycle",
                         [(r[args.watchers], r[0]) for r in rounds]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=PARTS, action="append", help="run this part (repeatable; default all)")
    parser.add_argument(
        "--jesync",
        type=jesync_target,
        action="append",
        default=[],
        metavar="NAME=CHECKOUT[:PYTHON]",
        help="start a jesync from CHECKOUT (PYTHONPATH), with the twistd next to PYTHON (default: this "
        "checkout, this Python); repeatable: the events part then compares them all, the others use the first",
    )
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis pub/sub comparison")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each (default 0.5)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per part (default 3)")
    parser.add_argument("--watchers", type=int, default=1000, help="watchers / subscribers (default 1,000)")
    parser.add_argument(
        "--watcher-procs", type=int, default=1, help="processes the watchers are split over (default 1)"
    )
    parser.add_argument(
        "--read-interval",
        type=float,
        default=0.02,
        help="events: seconds a watcher process sleeps after each pass over its ready sockets (default 0.02)",
    )
    parser.add_argument(
        "--quiet",
        type=float,
        metavar="CORES",
        help="before each round wait (at most 30 s) for a second in which the machine used less than CORES "
        "of a core (e.g. 0.3); the rounds' other-CPU figures say how quiet each run was",
    )
    parser.add_argument(
        "--lockers",
        type=int,
        nargs="+",
        default=[1, 4],
        help="events: lock/release loops or publishers, one run of the part per number (default 1 4)",
    )
    parser.add_argument("--connections", type=int, default=64, help="idle: lock/release connections (default 64)")
    parser.add_argument("--readers", type=int, default=64, help="shared: readers (default 64)")
    parser.add_argument("--writers", type=int, default=1, help="shared: writers (default 1)")
    parser.add_argument("--procs", type=int, default=1, help="processes the looping clients are split over (default 1)")
    parser.add_argument(
        "--profile-server",
        metavar="FILE",
        help="run the first jesync under cProfile and save its stats to FILE (python -m pstats FILE)",
    )
    args = parser.parse_args(argv)
    parts = args.part or list(PARTS)
    targets_wanted = args.jesync or [("jesync", REPO, sys.executable)]

    print(f"nproc {os.cpu_count()}, python {sys.version.split()[0]}", end="")
    raise_open_files(2 * args.watchers + args.connections + args.readers + 1000)
    with tempfile.TemporaryDirectory(prefix="jesync-coordination-") as tmp:
        targets: list[Server] = []
        redis = None
        try:
            for name, checkout, python in targets_wanted:
                profile = args.profile_server and not targets and os.path.abspath(args.profile_server)
                targets.append(start_jesync(Path(tmp), profile or None, None, name, checkout, python))
            if "events" in parts and not args.no_redis:
                if shutil.which("redis-server") is None:
                    print("\nredis-server is not installed: skipping the Redis comparison", end="")
                else:
                    version = subprocess.run(
                        ["redis-server", "--version"], check=False, capture_output=True, text=True
                    ).stdout
                    print(f", redis {version.split()[2].removeprefix('v=')}", end="")
                    redis = start_redis(Path(tmp), None, maxclients=args.watchers + max(args.lockers) + 100)
            print()
            for name, checkout, python in targets_wanted:
                print(f"  {name}: {checkout} at {describe_checkout(checkout)}, {python}")
            print(
                f"{args.repeat} round(s) per part, {args.seconds:g} s each after {args.warmup:g} s warm-up; "
                "CPU figures are server CPU time per thing counted (from /proc), other CPU the rest of the "
                "machine's use meanwhile (noise)"
            )
            if "events" in parts:
                for lockers in args.lockers:
                    events_part(targets, redis, lockers, args)
            if "idle" in parts:
                idle_part(targets[0], args)
            if "shared" in parts:
                shared_part(targets[0], args)
            if "lock-path" in parts:
                lock_path_part(targets_wanted, args)
        finally:
            for server in targets + ([redis] if redis else []):
                server.stop()


if __name__ == "__main__":
    main()
