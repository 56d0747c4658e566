"""
Many idle connections against a real server, over TCP: what each costs the
server in memory, how fast they open, what opening and closing them all
makes another client wait, and whether they slow the busy connections.

The script raises its own RLIMIT_NOFILE to the hard limit (the server it
starts inherits it), starts ``twistd -n --pidfile= jesync --port
tcp:PORT:interface=127.0.0.1 --max-connections 0`` from ``--checkout``
(PYTHONPATH), with the ``twistd`` next to ``--python``, and:

1. (on by default; ``--no-throughput`` skips it) runs loadgen's
   64-connection uncontended lock/release loop ``--rounds`` times with no
   idle connection open (a run during which the rest of the machine used
   more than ``--max-noise`` of a core is run again, and left out);
2. opens N connections (default 20,000) from ``--procs`` client processes,
   each keeping at most its share of ``--window`` connections unanswered
   (connect, send ``status kI``, read ``STATUS 0 0 kI``); the connections
   then stay open and silent.  Reported: the time to open them all, each
   one's connect-to-reply time, the server's CPU per connection, and its
   RSS (``VmRSS``) before and after, i.e. bytes per connection;
3. runs the 64-connection loop again, with the N idle connections open;
4. closes all N at once (every client process closes its sockets as fast
   as it can) and measures how long the server takes to close its side of
   them all (until the machine's count of TCP sockets in use, from
   /proc/net/sockstat, is back to what it was before they opened), how long
   until its CPU goes quiet, and its open file count afterwards.

Throughout, a probe client (its own process) sends ``status probe`` one at
a time every ``--probe-interval`` seconds and times each round trip: idle
before, while the connections open, with them open, while they close and
after.  (It pauses during the throughput runs.)

    python benchmarks/connections.py                   # 20,000 connections
    python benchmarks/connections.py --connections 2000 --no-throughput
    python benchmarks/connections.py --checkout /tmp/jesync-before --python /tmp/venv-before/bin/python

If the hard limit on open files is too low for N connections plus the
server's own files and the load generator's, N is lowered to what fits, and
the script says so.  Only 127.0.0.1; every loop is bounded in count and
time; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import errno
import multiprocessing
import os
import resource
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from listing import RSSSampler, ask_probe, fmt_ms, mib, percentile, rss_kib  # noqa: E402  (benchmarks/ is on sys.path)
from loadgen import (  # noqa: E402
    REPO,
    Server,
    cpu_seconds,
    median,
    median_result,
    run_scenario,
    start_jesync,
    wait_for_quiet,
)

# Files besides the idle connections: the load generator's 64 connections,
# the probe's, and some slack.
RESERVE = 64 + 1 + 16


# -- helpers -------------------------------------------------------------------------


def open_files(pid: int | None) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, TypeError):
        return None


def sockstat() -> dict[str, int]:
    """The TCP line of /proc/net/sockstat: inuse, orphan, tw (TIME_WAIT), alloc, mem (pages)."""
    with open("/proc/net/sockstat") as stat:
        for line in stat:
            if line.startswith("TCP:"):
                fields = line.split()[1:]
                return {fields[i]: int(fields[i + 1]) for i in range(0, len(fields) - 1, 2)}
    return {}


def stats_ms(values: list[float]) -> str:
    """n, p50, p99, max of some durations in seconds."""
    values = sorted(values)
    if not values:
        return "none"
    return (
        f"{len(values):,}: p50 {fmt_ms(percentile(values, 0.5))}, p99 {fmt_ms(percentile(values, 0.99))}, "
        f"max {fmt_ms(values[-1])}"
    )


# -- the probe: one request at a time, at a steady pace, in its own process ----------


def probe_worker(address, pipe, interval: float, limit: int, max_seconds: float) -> None:
    """
    Until "stop" (or C{limit} probes, or C{max_seconds}): every C{interval}
    s send `status probe` and time the reply; "pause" and "resume" suspend
    it.  Sends back (start times, round trips) as arrays of monotonic
    seconds, and an error or None.
    """
    sock = socket.create_connection(address, timeout=30.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipe.send("ready")
    starts, rtts = array("d"), array("d")
    clock = time.monotonic
    deadline = clock() + max_seconds
    running, error = False, None
    while len(rtts) < limit:
        if pipe.poll(0 if running else 1.0):
            command = pipe.recv()
            if command == "stop":
                break
            running = command != "pause"
            pipe.send(command)  # acknowledged: the probe is (no longer) running
            continue
        start = clock()
        if start > deadline:
            error = "probe: time limit reached"
            break
        if not running:
            continue
        error = ask_probe(sock)
        if error is not None:
            break
        end = clock()
        starts.append(start)
        rtts.append(end - start)
        pause = start + interval - clock()
        if pause > 0:
            time.sleep(pause)
    sock.close()
    pipe.send((starts.tobytes(), rtts.tobytes(), error))


class Probe:
    def __init__(self, address, interval: float, limit: int, max_seconds: float) -> None:
        context = multiprocessing.get_context("fork")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=probe_worker, args=(address, child, interval, limit, max_seconds))
        self.process.start()
        child.close()
        if not self.pipe.poll(60) or self.pipe.recv() != "ready":
            raise SystemExit("probe failed to connect")
        self.samples: list[tuple[float, float]] = []
        self.error: str | None = None

    def command(self, what: str) -> None:
        self.pipe.send(what)
        if not self.pipe.poll(60) or self.pipe.recv() != what:
            raise SystemExit(f"probe did not acknowledge {what!r}")

    def stop(self) -> None:
        self.pipe.send("stop")
        if not self.pipe.poll(60):
            self.process.kill()
            raise SystemExit("probe did not answer")
        starts, rtts, self.error = self.pipe.recv()
        self.process.join(10)
        s, r = array("d"), array("d")
        s.frombytes(starts)
        r.frombytes(rtts)
        self.samples = list(zip(s, r))

    def rtts(self, start: float, end: float) -> list[float]:
        """Round trips of the probes sent in [start, end)."""
        return [r for s, r in self.samples if start <= s < end]

    def stats(self, start: float, end: float) -> str:
        return stats_ms(self.rtts(start, end))


# -- the idle connections: client processes --------------------------------------------


def opener_worker(address, first: int, count: int, window: int, pipe, max_seconds: float) -> None:
    """
    Open C{count} connections, keys k<first> ..., at most C{window}
    unanswered at once; each sends `status kI` and reads its reply.  Report
    (opened, failures, connect-to-reply times, finish time, first error);
    then keep them open, silent, until "close", close them all as fast as
    possible and report the time that took.
    """
    pipe.send("ready")
    start = pipe.recv()
    time.sleep(max(0.0, start - time.monotonic()))
    clock = time.monotonic
    deadline = clock() + max_seconds
    poller = select.epoll()
    pending: dict[int, tuple[socket.socket, int, float, bytearray]] = {}
    opened: list[socket.socket] = []
    times = array("d")
    failures, first_error = 0, None
    next_key = first
    end_key = first + count

    def fail(fd: int, why: str) -> None:
        nonlocal failures, first_error
        failures += 1
        first_error = first_error or why
        sock = pending.pop(fd)[0]
        poller.unregister(fd)
        sock.close()

    while (next_key < end_key or pending) and clock() < deadline and failures < 100:
        while next_key < end_key and len(pending) < window:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code not in (0, errno.EINPROGRESS):
                sock.close()
                failures += 1
                first_error = first_error or f"connect: {os.strerror(code)}"
                next_key += 1
                continue
            pending[sock.fileno()] = (sock, next_key, clock(), bytearray())
            poller.register(sock.fileno(), select.EPOLLOUT)
            next_key += 1
        for fd, events in poller.poll(0.5):
            sock, key, started, buffer = pending[fd]
            if events & select.EPOLLOUT:
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    fail(fd, f"connect: {os.strerror(code)}")
                    continue
                try:
                    sock.send(b"status k%d\n" % key)  # a dozen bytes into an empty buffer: all sent
                except OSError as e:
                    fail(fd, f"send: {e}")
                    continue
                poller.modify(fd, select.EPOLLIN)
                continue
            try:
                data = sock.recv(4096)
            except OSError as e:
                fail(fd, f"recv: {e}")
                continue
            if not data:
                fail(fd, "the server closed the connection")
                continue
            buffer += data
            if buffer.endswith(b"\n"):
                if bytes(buffer) != b"STATUS 0 0 k%d\n" % key:
                    fail(fd, f"unexpected reply {bytes(buffer)[:200]!r}")
                    continue
                times.append(clock() - started)
                poller.unregister(fd)
                del pending[fd]
                opened.append(sock)
    finished = clock()
    for sock, *_ in pending.values():
        sock.close()
    if pending:
        first_error = first_error or f"{len(pending)} not answered in time"
    poller.close()
    pipe.send((len(opened), failures + len(pending), times.tobytes(), finished, first_error))
    # Idle, until told to close (or after the time limit, so it never hangs).
    command = pipe.recv() if pipe.poll(max_seconds * 4) else "close"
    if command == "close-at":
        at = pipe.recv()
        time.sleep(max(0.0, at - clock()))
    started = clock()
    for sock in opened:
        sock.close()
    pipe.send(clock() - started)


class Openers:
    def __init__(self, address, connections: int, procs: int, window: int, max_seconds: float) -> None:
        context = multiprocessing.get_context("fork")
        self.workers = []
        share, extra = divmod(connections, procs)
        first = 0
        for index in range(procs):
            count = share + (index < extra)
            parent, child = context.Pipe()
            process = context.Process(
                target=opener_worker,
                args=(address, first, count, max(1, window // procs), child, max_seconds),
            )
            process.start()
            child.close()
            self.workers.append((process, parent))
            first += count
        for _, pipe in self.workers:
            if not pipe.poll(60) or pipe.recv() != "ready":
                raise SystemExit("an opener process did not start")
        self.max_seconds = max_seconds

    def open(self, start: float) -> tuple[int, int, list[float], float, str | None]:
        """Start at C{start}; wait for every process's report."""
        for _, pipe in self.workers:
            pipe.send(start)
        opened = failures = 0
        times: list[float] = []
        finished = start
        error = None
        for _, pipe in self.workers:
            if not pipe.poll(self.max_seconds + 60):
                raise SystemExit("an opener process did not report")
            n, f, t, end, e = pipe.recv()
            opened += n
            failures += f
            values = array("d")
            values.frombytes(t)
            times += values
            finished = max(finished, end)
            error = error or e
        return opened, failures, times, finished, error

    def close(self, at: float) -> float:
        """All close their sockets from C{at}; returns the longest any took."""
        for _, pipe in self.workers:
            pipe.send("close-at")
            pipe.send(at)
        longest = 0.0
        for process, pipe in self.workers:
            longest = max(longest, pipe.recv() if pipe.poll(120) else float("nan"))
            process.join(30)
        return longest

    def kill(self) -> None:
        for process, _ in self.workers:
            if process.is_alive():
                process.kill()
                process.join(5)


# -- throughput ------------------------------------------------------------------------


def throughput(server: Server, args, label: str, tag: str) -> list:
    """
    The 64-connection uncontended loop, until C{args.rounds} runs had at
    most C{args.max_noise} other CPU (at most twice as many runs in all;
    each waits for a quiet second first); prints each run and returns the
    quiet ones, or all if none was.
    """
    options = SimpleNamespace(procs=1, warmup=0.5, seconds=args.seconds, client_cpus=None)
    quiet, noisy = [], []
    attempt = 0
    while len(quiet) < args.rounds and attempt < 2 * args.rounds:
        wait_for_quiet(args.max_noise, 60.0)
        result = run_scenario(server, "uncontended", 64, options, tag=f"{tag}-{attempt}")
        attempt += 1
        (quiet if result.other_cpu <= args.max_noise else noisy).append(result)
        print(
            f"  64 connections, {label}: {result.cycles_per_second:,.0f} cycles/s, p50 {result.p50_us:,.0f} µs, "
            f"p99 {result.p99_us:,.0f} µs, server {result.server_us_per_cycle or 0:.1f} µs CPU/cycle, "
            f"other CPU {100 * result.other_cpu:.0f}%" + ("" if result.other_cpu <= args.max_noise else " (noisy)"),
            flush=True,
        )
    return quiet or noisy


# -- closing ---------------------------------------------------------------------------


def watch_closing(server: Server, inuse_base: int, start: float, limit: float, quiet_cpu: float):
    """
    Sample every 10 ms from C{start}: the machine's TCP sockets in use (both
    ends of a connection stay in use until the server has closed its side
    too) and the server's CPU.  Returns (seconds until the count was back
    to C{inuse_base}, or None; seconds until the server's CPU, having been
    busy, stayed under C{quiet_cpu} of a core for 200 ms, or None).
    """
    all_closed = quiet = calm_since = None
    busy_seen = False
    cpu_last, t_last = cpu_seconds(server.pid), time.monotonic()
    steps = 0
    while time.monotonic() < start + limit and steps < 1_000_000:
        steps += 1
        time.sleep(0.01)
        now = time.monotonic()
        if all_closed is None and now > start and sockstat().get("inuse", 0) <= inuse_base:
            all_closed = now - start
        cpu = cpu_seconds(server.pid)
        busy = (cpu - cpu_last) / max(1e-6, now - t_last)
        cpu_last, t_last = cpu, now
        if busy >= quiet_cpu:
            busy_seen, calm_since, quiet = True, None, None
        elif busy_seen:
            calm_since = calm_since or now
            if now - calm_since >= 0.2:
                quiet = calm_since - start
                if all_closed is not None:
                    break
    return all_closed, quiet


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=20_000, help="idle connections (default 20,000)")
    parser.add_argument("--procs", type=int, default=2, help="client processes holding them (default 2)")
    parser.add_argument(
        "--window",
        type=int,
        default=48,
        help="connections opening at once, over all processes (default 48: under Twisted's listen backlog of 50)",
    )
    parser.add_argument("--checkout", type=Path, default=REPO, help="the jesync checkout to run (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="the Python whose twistd runs it (default: this one)")
    parser.add_argument("--no-throughput", dest="throughput", action="store_false", help="skip the 64-connection runs")
    parser.add_argument("--rounds", type=int, default=3, help="64-connection runs before and after (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per 64-connection run (default 3)")
    parser.add_argument(
        "--max-noise",
        type=float,
        default=0.1,
        metavar="CORES",
        help="a 64-connection run during which the rest of the machine used more than CORES of a core is "
        "run again (at most --rounds more runs) and left out of the medians (default 0.1)",
    )
    parser.add_argument("--probe-interval", type=float, default=0.002, help="seconds between probes (default 0.002)")
    parser.add_argument(
        "--slow-probe", type=float, default=0.005, help="a probe round trip counted as slow, in s (default 0.005)"
    )
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of idle probing between phases")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="time limit of each phase (default 300)")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    python = os.path.abspath(args.python)
    if not (checkout / "jesync" / "__init__.py").is_file():
        parser.error(f"{checkout} is not a jesync checkout")
    if args.connections < 1 or args.procs < 1 or args.window < 1:
        parser.error("--connections, --procs and --window must be positive")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, args.connections + 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"nproc {os.cpu_count()}; jesync {checkout} ({commit or '?'}), {python}; "
        f"RLIMIT_NOFILE {soft} -> {wanted} (hard {hard})"
    )

    with tempfile.TemporaryDirectory(prefix="jesync-connections-") as tmp:
        server = start_jesync(
            Path(tmp), None, name="jesync", checkout=checkout, python=python, options=("--max-connections", "0")
        )
        openers = probe = sampler = None
        try:
            time.sleep(0.5)
            base_files = open_files(server.pid) or 0
            fits = wanted - base_files - RESERVE
            n = args.connections
            if n > fits:
                n = fits
                print(
                    f"the hard limit on open files ({hard}) leaves room for {fits:,} idle connections in the server "
                    f"(it has {base_files} files open; {RESERVE} kept for the load generator and probe): "
                    f"opening {n:,}, not {args.connections:,}"
                )
            procs = min(args.procs, n)
            if -(-n // procs) + 64 > wanted:
                parser.error(f"--procs {procs}: each client process would need more than {wanted} files")

            before = throughput(server, args, "no idle connection", "none") if args.throughput else []

            openers = Openers(server.address, n, procs, args.window, args.max_seconds)
            probe = Probe(server.address, args.probe_interval, 5_000_000, 4 * args.max_seconds + 600)
            sampler = RSSSampler(server.pid, interval=0.05)
            sampler.start()
            probe.command("go")
            idle_start = time.monotonic()
            time.sleep(args.settle)
            rss_before = rss_kib(server.pid)
            cpu_before = cpu_seconds(server.pid)
            tcp_before = sockstat()

            start = time.monotonic() + 0.05
            opened, failures, times, finished, error = openers.open(start)
            open_time = finished - start
            cpu_open = cpu_seconds(server.pid) - cpu_before
            time.sleep(args.settle)
            settled = time.monotonic()
            rss_after = rss_kib(server.pid)
            tcp_after = sockstat()
            files_open = open_files(server.pid)

            print(f"\nopening {n:,} connections ({procs} client processes, {args.window} opening at once at most):")
            print(
                f"  opened {opened:,} in {open_time:,.2f} s ({opened / max(open_time, 1e-9):,.0f}/s)"
                + (f"; {failures:,} FAILED ({error})" if failures else "")
            )
            print(f"  connect to reply, each:       {stats_ms(times)}")
            print(
                f"  server CPU while opening:     {cpu_open:,.2f} s ({1e6 * cpu_open / max(opened, 1):,.0f} µs per "
                f"connection); {files_open:,} files open after (was {base_files})"
            )
            peak = sampler.peak(start, settled)
            print(
                f"  server RSS: {mib(rss_before)} before, {mib(rss_after)} after {args.settle:g} s, peak {mib(peak)}: "
                f"{((rss_after or 0) - (rss_before or 0)) * 1024 / max(opened, 1):,.0f} bytes per connection"
            )
            pages = tcp_after.get("mem", 0) - tcp_before.get("mem", 0)
            print(
                f"  kernel TCP buffers (sockstat mem, both ends of every connection): {pages:+,} pages "
                f"({pages * resource.getpagesize() / 2**20:+,.1f} MiB)"
            )

            after = []
            if args.throughput:
                probe.command("pause")
                after = throughput(server, args, f"{opened:,} idle connections open", "idle")
                probe.command("resume")
                time.sleep(args.settle)

            rss_open = rss_kib(server.pid)
            cpu_open_end = cpu_seconds(server.pid)
            close_start = time.monotonic() + 0.05
            closing: dict[str, float] = {}
            closer = threading.Thread(
                target=lambda: closing.update(took=openers.close(close_start)), daemon=True  # type: ignore[union-attr]
            )
            closer.start()
            all_closed, quiet = watch_closing(
                server, tcp_before.get("inuse", 0) + 8, close_start, args.max_seconds, 0.05
            )
            closer.join(120)
            quiet_end = time.monotonic()
            cpu_close = cpu_seconds(server.pid) - cpu_open_end
            time.sleep(args.settle)
            end = time.monotonic()
            probe.stop()
            rss_closed = rss_kib(server.pid)
            files_closed = open_files(server.pid)

            print(f"\nclosing all {opened:,} at once:")
            print(f"  the clients took {closing.get('took', float('nan')):,.3f} s to close their sockets")
            print(
                "  the server had closed its side of all of them after "
                + (f"{all_closed:,.3f} s" if all_closed is not None else "(not seen: TCP sockets still in use)")
            )
            print(
                "  server CPU quiet (< 5% of a core for 200 ms) from "
                + (f"{quiet:,.3f} s" if quiet is not None else "(never, within the time limit)")
            )
            per_connection = 1e6 * cpu_close / max(opened, 1)
            print(f"  server CPU while closing: {cpu_close:,.2f} s ({per_connection:,.0f} µs per connection)")
            print(f"  server files open: {files_closed} (was {base_files} before opening)")
            print(f"  server RSS: {mib(rss_open)} with them open, {mib(rss_closed)} after closing")

            print(f"\nthe probe (status probe, one every {1e3 * args.probe_interval:g} ms), round trips:")
            print(f"  idle, before opening:            {probe.stats(idle_start, start)}")
            print(f"  while they opened:               {probe.stats(start, finished)}")
            print(f"  with them open, idle:            {probe.stats(finished, settled)}")
            print(f"  while they closed (until quiet): {probe.stats(close_start, quiet_end)}")
            print(f"  after:                           {probe.stats(quiet_end, end)}")
            for label, since in (("opening", start), ("closing", close_start)):
                until = finished if label == "opening" else quiet_end
                slow = [s + r - since for s, r in probe.samples if since <= s < until and r > args.slow_probe]
                if slow:
                    print(
                        f"  {label}: {len(slow):,} probes over {fmt_ms(args.slow_probe)}; the last ended "
                        f"{max(slow):,.3f} s after the {label} began"
                    )
            if probe.error:
                print(f"  {probe.error}")

            if before and after:
                b, a = median_result(before), median_result(after)
                print(
                    f"\n64 connections: median {b.cycles_per_second:,.0f} cycles/s without idle connections, "
                    f"{a.cycles_per_second:,.0f} with {opened:,} open "
                    f"({a.cycles_per_second / b.cycles_per_second:.2f}x); server CPU per cycle "
                    f"{median([r.server_us_per_cycle for r in before]):.1f} -> "
                    f"{median([r.server_us_per_cycle for r in after]):.1f} µs"
                )
        finally:
            if sampler is not None:
                sampler.stop()
            if openers is not None:
                openers.kill()
            if probe is not None and probe.process.is_alive():
                probe.process.kill()
            server.stop()


if __name__ == "__main__":
    main()
