"""
A big status listing against a real server, over TCP: what it costs, and
what it makes the other clients wait.

The script starts ``twistd -n --pidfile= jesync --port tcp:PORT:interface=127.0.0.1
--max-held 0 --max-keys 0 --max-connections 0`` from the checkout given by
``--checkout`` (PYTHONPATH), with the ``twistd`` next to ``--python``, and:

1. fills N keys (default 1,000,000): a handful of connections pipeline
   ``lock key-%07d 1 0 0`` lines and read the ``GRANTED`` replies; the
   server's RSS (``VmRSS`` from /proc) is read before and after.  The keys
   go in in order, so the server's table is already sorted and the sort is
   as cheap as it gets; ``--shuffled`` takes them in a random order;
2. one client sends ``status-by-key`` and reads the whole listing as fast as
   it can, while a second client (its own process) sends ``status probe``
   in a loop, one request at a time, timing each round trip.

Reported: time to the listing's first byte, total listing time, bytes and
lines; the server's CPU time meanwhile; the probe's round trips while idle
and during the listing (p50, p99, max: the longest the listing made another
client wait) and its three longest; the server's RSS peak during the
listing.

``--slow-reader``: instead, the listing client sends ``status-by-key`` and
does not read at all for ``--stall`` seconds (the probe keeps going).
Reported: the server's RSS growth during the stall, whether the server
dropped the connection (TCP state CLOSE_WAIT, and whether ``END`` ever
arrives when the client reads what is left), and the probe's round trips.

``--non-readers N``: instead, N clients (receive buffers of 4 KiB) each send
``status-by-key`` and never read, one after the other (with ``--churn``, a
lock taken and released between two of them, so that the table changes and
no two can share a snapshot); then one more client reads the whole listing.
Reported: the server's RSS growth once they have all asked and ``--stall``
seconds have passed, how many of them got a listing and how many the
``max-listing-memory`` limit reply, and whether the reading client got its
whole listing.  ``--server-option`` passes an option to the server (as
``--server-option=--max-listing-memory=16m``).

    python benchmarks/listing.py --keys 100000
    python benchmarks/listing.py --keys 100000 --slow-reader
    python benchmarks/listing.py --keys 300000 --non-readers 50
    python benchmarks/listing.py --keys 300000 --non-readers 50 --churn
    python benchmarks/listing.py --shuffled
    python benchmarks/listing.py --checkout /tmp/jesync-before --python /tmp/venv-before/bin/python

Only 127.0.0.1; every loop is bounded in count and time; the server is
stopped at the end.
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing
import os
import random
import select
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from array import array
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import REPO, Server, cpu_seconds, machine_busy_seconds, start_jesync  # noqa: E402  (on sys.path)

PROBE = b"status probe\n"
PROBE_REPLY = b"STATUS 0 0 probe\n"
TCP_CLOSE_WAIT = 8  # tcpi_state: the peer has closed its side


# -- helpers -------------------------------------------------------------------------


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def mib(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1024:,.1f} MiB"


def connect(address: tuple[str, int], timeout: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def tcp_state(sock: socket.socket) -> int:
    """The kernel's tcpi_state for the socket (1 = ESTABLISHED, 8 = CLOSE_WAIT)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def unread_bytes(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive queue."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


class RSSSampler(threading.Thread):
    """Samples the server's VmRSS every C{interval} s until stopped (at most C{limit} samples)."""

    def __init__(self, pid: int | None, interval: float = 0.01, limit: int = 200_000) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.limit = pid, interval, limit
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and len(self.samples) < self.limit:
            value = rss_kib(self.pid)
            if value is not None:
                self.samples.append((time.monotonic(), value))
            self.done.wait(self.interval)

    def stop(self) -> None:
        self.done.set()
        self.join(5)

    def peak(self, start: float = 0.0, end: float = float("inf")) -> int | None:
        values = [v for t, v in self.samples if start <= t <= end]
        return max(values) if values else None


# -- filling ---------------------------------------------------------------------


class Filler:
    """One filling connection: its keys, how many it sent and got, its partial line."""

    def __init__(self, sock: socket.socket, keys: Sequence[int]) -> None:
        self.sock, self.keys = sock, iter(keys)
        self.total, self.sent, self.granted = len(keys), 0, 0
        self.partial = b""

    def top_up(self, window: int) -> None:
        batch = []
        while self.sent - self.granted < window and self.sent < self.total:
            batch.append(b"lock key-%07d 1 0 0\n" % next(self.keys))
            self.sent += 1
        if batch:
            self.sock.sendall(b"".join(batch))  # bounded: at most `window` lines unanswered

    def receive(self) -> int:
        """Read the replies that have arrived; return how many locks they granted."""
        data = self.sock.recv(1 << 20)
        if not data:
            raise SystemExit("fill: the server closed a connection")
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if not line.startswith(b"GRANTED 1 0 key-"):
                raise SystemExit(f"fill: unexpected reply {line[:200]!r}")
        self.granted += len(lines)
        return len(lines)


def fill(
    address, keys: int, connections: int, window: int, timeout: float, shuffled: bool = False
) -> tuple[float, list[socket.socket]]:
    """
    Take C{keys} locks (key-0000000 ...) over C{connections} connections, each
    keeping at most C{window} requests unanswered; in key order, or
    C{shuffled} (so the server's table is not already sorted).  Returns the
    seconds taken and the connections, which must stay open (closing one
    releases its locks).
    """
    deadline = time.monotonic() + timeout
    order: Sequence[int] = range(keys)
    if shuffled:
        order = array("i", range(keys))
        random.Random(1).shuffle(order)  # type: ignore[arg-type]
    fillers = {}
    for i in range(connections):
        sock = connect(address, timeout)
        fillers[sock.fileno()] = Filler(sock, order[i::connections])
    poller = select.epoll()
    for fd in fillers:
        poller.register(fd, select.EPOLLIN)
    started = time.monotonic()
    for filler in fillers.values():
        filler.top_up(window)
    remaining = keys
    while remaining > 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"fill: timed out with {remaining:,} locks not granted")
        for fd, _ in poller.poll(1.0):
            remaining -= fillers[fd].receive()
            fillers[fd].top_up(window)
    poller.close()
    return time.monotonic() - started, [f.sock for f in fillers.values()]


# -- the probe: a second client, in its own process ------------------------------------


def probe_worker(address, pipe, limit: int, max_seconds: float) -> None:
    """
    After "go", send `status probe` one at a time until "stop" (or C{limit}
    probes, or C{max_seconds}); send back (start times, round trips), as
    arrays of seconds on the monotonic clock, which every process shares.
    """
    sock = connect(address, 30.0)
    pipe.send("ready")
    pipe.recv()
    starts, rtts = array("d"), array("d")
    clock = time.monotonic
    deadline = clock() + max_seconds
    error = None
    while len(rtts) < limit:
        if pipe.poll():
            pipe.recv()
            break
        start = clock()
        if start > deadline:
            error = "probe: time limit reached"
            break
        error = ask_probe(sock)
        if error is not None:
            break
        end = clock()
        starts.append(start)
        rtts.append(end - start)
    sock.close()
    pipe.send((starts.tobytes(), rtts.tobytes(), error))


class Probe:
    def __init__(self, address, limit: int, max_seconds: float) -> None:
        context = multiprocessing.get_context("fork")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=probe_worker, args=(address, child, limit, max_seconds))
        self.process.start()
        child.close()
        if self.pipe.recv() != "ready":
            raise SystemExit("probe failed to connect")

    def go(self) -> None:
        self.pipe.send("go")

    def stop(self) -> tuple[list[tuple[float, float]], str | None]:
        self.pipe.send("stop")
        if not self.pipe.poll(60):
            self.process.kill()
            raise SystemExit("probe did not answer")
        starts, rtts, error = self.pipe.recv()
        self.process.join(10)
        s, r = array("d"), array("d")
        s.frombytes(starts)
        r.frombytes(rtts)
        return list(zip(s, r)), error


def ask_probe(sock: socket.socket) -> str | None:
    """One `status probe` round trip; what went wrong, or None."""
    try:
        sock.sendall(PROBE)
        reply = b""
        while not reply.endswith(b"\n"):
            data = sock.recv(4096)
            if not data:
                raise OSError("connection closed")
            reply += data
    except OSError as e:
        return f"probe: {e}"
    if reply != PROBE_REPLY:
        return f"probe: unexpected reply {reply[:200]!r}"
    return None


def probe_stats(
    samples: list[tuple[float, float]], start: float = 0.0, end: float = float("inf"), within: bool = False
) -> str:
    """p50/p99/max of the probes that overlapped [start, end] (C{within}: that lay wholly inside it)."""
    if within:
        rtts = sorted(r for s, r in samples if s >= start and s + r <= end)
    else:
        rtts = sorted(r for s, r in samples if s <= end and s + r >= start)
    if not rtts:
        return "no probes"
    return (
        f"{len(rtts):,} probes, p50 {fmt_ms(percentile(rtts, 0.5))}, "
        f"p99 {fmt_ms(percentile(rtts, 0.99))}, max {fmt_ms(rtts[-1])}"
    )


def longest_probes(samples: list[tuple[float, float]], since: float, count: int = 3) -> str:
    """The C{count} longest round trips of the probes that ended after C{since}, with when they began."""
    longest = sorted(((r, s) for s, r in samples if s + r >= since), reverse=True)[:count]
    return ", ".join(f"{fmt_ms(r)} from {s - since:+,.3f} s" for r, s in longest) or "none"


# -- the listing -----------------------------------------------------------------------


def read_listing(sock: socket.socket, sent_at: float, deadline: float):
    """
    Read until the listing's END line, EOF, or C{deadline}.  Returns (time of
    first byte or None, time of last byte, bytes, lines, ended with END,
    error or None).
    """
    first = None
    last = sent_at
    total = lines = 0
    tail = b""
    error = None
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    sock.settimeout(1.0)
    while True:
        if time.monotonic() > deadline:
            error = "timed out"
            break
        try:
            n = sock.recv_into(view)
        except socket.timeout:
            continue
        except OSError as e:
            error = f"{type(e).__name__}: {e}"
            break
        now = time.monotonic()
        if not n:
            error = "the server closed the connection"
            break
        if first is None:
            first = now
        last = now
        total += n
        chunk = view[:n]
        lines += buffer.count(b"\n", 0, n)
        tail = (tail + bytes(chunk[-8:]))[-8:]
        if tail.endswith(b"\nEND\n") or (total == 4 and tail == b"END\n"):
            return first, last, total, lines, True, None
        if lines == 1 and total == n and bytes(chunk).startswith(b"INVALID_PARAMETER: "):
            error = f"refused: {bytes(chunk).decode(errors='replace').strip()}"
            break
    return first, last, total, lines, False, error


def run_listing(server: Server, args, sampler: RSSSampler) -> None:
    sock = connect(server.address, 30.0)
    probe = Probe(server.address, args.probe_limit, args.max_seconds)
    probe.go()
    time.sleep(args.idle_probe)  # the probe alone first: its round trips on an idle server
    idle_end = time.monotonic()
    rss_before = rss_kib(server.pid)
    cpu_before, busy_before = cpu_seconds(server.pid), machine_busy_seconds()
    sent_at = time.monotonic()
    sock.sendall(b"status-by-key\n")
    first, last, total, lines, ended, error = read_listing(sock, sent_at, sent_at + args.max_seconds)
    cpu_after, busy_after = cpu_seconds(server.pid), machine_busy_seconds()
    samples, probe_error = probe.stop()
    rss_after = rss_kib(server.pid)
    sock.close()
    print(f"listing: status-by-key, read as fast as possible")
    if first is None:
        print(f"  no listing byte arrived ({error})")
        return
    span = last - sent_at
    print(f"  first byte after {fmt_ms(first - sent_at)}; whole listing {span:,.3f} s")
    print(
        f"  {total:,} bytes, {lines:,} lines ({lines - ended:,} STATUS lines"
        f"{', then END' if ended else ''}); {total / span / 2**20:,.1f} MiB/s, {lines / span:,.0f} lines/s"
    )
    if not ended:
        print(f"  INCOMPLETE: {error}")
    elif lines - 1 != args.keys:
        print(f"  WARNING: expected {args.keys:,} STATUS lines")
    if cpu_before is not None and cpu_after is not None:
        span_cpu = cpu_after - cpu_before
        busy = busy_after - busy_before
        print(
            f"  server CPU during the listing {span_cpu:,.2f} s; the rest of the machine "
            f"{max(0.0, busy - span_cpu):,.2f} CPU-s (the probe, this reader, kernel threads, other work)"
        )
    print(f"  probe, idle before the listing: {probe_stats(samples, 0.0, idle_end, within=True)}")
    print(f"  probe, during the listing:      {probe_stats(samples, sent_at, last)}")
    print(f"  probe, waiting for first byte:  {probe_stats(samples, sent_at, first)}")
    print(f"  probe, longest (start, from the request): {longest_probes(samples, sent_at)}")
    if probe_error:
        print(f"  {probe_error}")
    peak = sampler.peak(sent_at, last)
    print(
        f"  server RSS: {mib(rss_before)} before, peak {mib(peak)} during "
        f"(+{mib((peak or 0) - (rss_before or 0))}), {mib(rss_after)} after"
    )


def run_slow_reader(server: Server, args, sampler: RSSSampler) -> None:
    sock = connect(server.address, 30.0)
    probe = Probe(server.address, args.probe_limit, args.max_seconds)
    probe.go()
    time.sleep(args.idle_probe)
    idle_end = time.monotonic()
    rss_before = rss_kib(server.pid)
    sent_at = time.monotonic()
    sock.sendall(b"status-by-key\n")
    closed_at = None
    stall_end = sent_at + args.stall
    steps = 0
    while (now := time.monotonic()) < stall_end and steps < 100_000:
        steps += 1
        if closed_at is None and tcp_state(sock) == TCP_CLOSE_WAIT:
            closed_at = now
        time.sleep(0.02)
    queued = unread_bytes(sock)
    state = tcp_state(sock)
    if closed_at is None and state == TCP_CLOSE_WAIT:
        closed_at = time.monotonic()
    rss_stalled = rss_kib(server.pid)
    peak_stall = sampler.peak(sent_at, time.monotonic())
    # Then read what is left, to see whether it is all there.
    drain_from = time.monotonic()
    first, last, total, lines, ended, error = read_listing(sock, drain_from, drain_from + args.max_seconds)
    samples, probe_error = probe.stop()
    rss_after = rss_kib(server.pid)
    sock.close()
    print(f"listing: status-by-key, not read for {args.stall:g} s (slow reader)")
    print(
        f"  server RSS: {mib(rss_before)} before; after the stall {mib(rss_stalled)}, peak during it "
        f"{mib(peak_stall)} (+{mib((peak_stall or 0) - (rss_before or 0))}); "
        f"{mib(rss_after)} after the drain"
    )
    print(f"  unread in the client's receive queue at the end of the stall: {queued:,} bytes")
    if closed_at is not None:
        print(f"  server DROPPED the connection {closed_at - sent_at:,.2f} s after the request (TCP CLOSE_WAIT)")
    else:
        print(f"  server did not drop the connection during the stall (TCP state {state})")
    print(
        f"  then read: {total:,} bytes, {lines:,} lines in {last - drain_from:,.3f} s; "
        + ("ended with END" if ended else f"no END ({error})")
    )
    print(f"  probe, idle before:        {probe_stats(samples, 0.0, idle_end, within=True)}")
    print(f"  probe, during the stall:   {probe_stats(samples, sent_at, stall_end)}")
    print(f"  probe, during the drain:   {probe_stats(samples, drain_from, last)}")
    print(f"  probe, longest (start, from the request): {longest_probes(samples, sent_at)}")
    print(f"  the drain began {drain_from - sent_at:,.3f} s after the request")
    if probe_error:
        print(f"  {probe_error}")


def run_non_readers(server: Server, args, sampler: RSSSampler) -> None:
    churner = connect(server.address, 30.0)
    probe_sock = connect(server.address, 30.0)
    rss_before = rss_kib(server.pid)
    started = time.monotonic()
    silent = []
    for n in range(args.non_readers):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting: no autotuning)
        sock.settimeout(30.0)
        sock.connect(server.address)
        silent.append(sock)
        if args.churn and n:
            churner.sendall(b"lock churn 1 0 0\nrelease churn\n")
            expect_lines(churner, 2)
        sock.sendall(b"status-by-key\n")
        # One round trip on another connection after each: the request has been read by then.
        error = ask_probe(probe_sock)
        if error is not None:
            raise SystemExit(error)
    asked = time.monotonic()
    rss_asked = rss_kib(server.pid)
    time.sleep(args.stall)
    rss_stalled = rss_kib(server.pid)
    peak = sampler.peak(started, time.monotonic())
    # A client that reads, meanwhile.
    reader = connect(server.address, 30.0)
    sent_at = time.monotonic()
    reader.sendall(b"status-by-key\n")
    first, last, total, lines, ended, error = read_listing(reader, sent_at, sent_at + args.max_seconds)
    rss_read = rss_kib(server.pid)
    # What each silent client was sent first: a listing, or the limit reply.
    listed = refused = other = 0
    for sock in silent:
        head = sock.recv(64, socket.MSG_PEEK)
        if head.startswith(b"STATUS ") or head == b"END\n":
            listed += 1
        elif head.startswith(b"INVALID_PARAMETER: max-listing-memory exceeded"):
            refused += 1
        else:
            other += 1
    for sock in silent:
        sock.close()
    reader.close()
    churner.close()
    probe_sock.close()
    time.sleep(1.0)
    rss_after = rss_kib(server.pid)
    print(
        f"listing: {args.non_readers} clients send status-by-key and never read"
        f"{' (the table changes between two of them)' if args.churn else ' (the table does not change)'}"
    )
    print(
        f"  asked in {asked - started:,.2f} s; {listed} got a listing, {refused} the limit reply, "
        f"{other} something else"
    )
    print(
        f"  server RSS: {mib(rss_before)} before; {mib(rss_asked)} once all had asked "
        f"(+{mib((rss_asked or 0) - (rss_before or 0))}); {mib(rss_stalled)} after {args.stall:g} s more "
        f"(+{mib((rss_stalled or 0) - (rss_before or 0))}); peak {mib(peak)} (+{mib((peak or 0) - (rss_before or 0))})"
    )
    if first is None:
        print(f"  the reading client got nothing ({error})")
    else:
        print(
            f"  a reading client meanwhile: {total:,} bytes, {lines:,} lines in {last - sent_at:,.3f} s, "
            + ("ended with END" if ended else f"no END ({error})")
            + (f"; {lines - 1:,} STATUS lines" if ended else "")
        )
    print(f"  server RSS after the reader: {mib(rss_read)}; 1 s after every client closed: {mib(rss_after)}")


def expect_lines(sock: socket.socket, count: int) -> None:
    """Read C{count} reply lines (bounded by the socket's timeout)."""
    data = b""
    while data.count(b"\n") < count:
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit("the server closed the connection")
        data += chunk


# -- main ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys to fill (default 1,000,000)")
    parser.add_argument("--checkout", type=Path, default=REPO, help="the jesync checkout to run (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="the Python whose twistd runs it (default: this one)")
    parser.add_argument("--fill-connections", type=int, default=4, help="connections that hold the keys (default 4)")
    parser.add_argument("--window", type=int, default=1000, help="unanswered lock requests per filling connection")
    parser.add_argument(
        "--shuffled",
        action="store_true",
        help="take the locks in a random key order (the table's own order is then not sorted: a realistic sort)",
    )
    parser.add_argument("--slow-reader", action="store_true", help="do not read the listing for --stall seconds")
    parser.add_argument("--stall", type=float, default=5.0, help="slow reader: seconds without reading (default 5)")
    parser.add_argument("--non-readers", type=int, default=0, help="clients that ask for the listing and never read")
    parser.add_argument("--churn", action="store_true", help="non-readers: change the table between two of them")
    parser.add_argument(
        "--server-option", action="append", default=[], help="an option for the server (repeat for more)"
    )
    parser.add_argument("--idle-probe", type=float, default=1.0, help="seconds of probing before the listing")
    parser.add_argument("--probe-limit", type=int, default=2_000_000, help="most probes to send")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="time limit of each phase")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    python = os.path.abspath(args.python)
    if not (checkout / "jesync" / "__init__.py").is_file():
        parser.error(f"{checkout} is not a jesync checkout")
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"nproc {os.cpu_count()}; jesync {checkout} ({commit or '?'}), {python}; {args.keys:,} keys")

    with tempfile.TemporaryDirectory(prefix="jesync-listing-") as tmp:
        server = start_jesync(
            Path(tmp),
            None,
            name="jesync",
            checkout=checkout,
            python=python,
            options=("--max-held", "0", "--max-keys", "0", "--max-connections", "0", *args.server_option),
        )
        sampler = RSSSampler(server.pid)
        holders: list[socket.socket] = []
        try:
            time.sleep(0.5)
            rss_start = rss_kib(server.pid)
            elapsed, holders = fill(
                server.address, args.keys, args.fill_connections, args.window, args.max_seconds, args.shuffled
            )
            time.sleep(0.5)
            rss_filled = rss_kib(server.pid)
            print(
                f"fill: {args.keys:,} locks{' in random key order' if args.shuffled else ''} "
                f"over {args.fill_connections} connections in {elapsed:,.2f} s "
                f"({args.keys / elapsed:,.0f}/s); server RSS {mib(rss_start)} -> {mib(rss_filled)} "
                f"({((rss_filled or 0) - (rss_start or 0)) * 1024 / max(1, args.keys):,.0f} B per lock)"
            )
            sampler.start()
            if args.non_readers:
                run_non_readers(server, args, sampler)
            elif args.slow_reader:
                run_slow_reader(server, args, sampler)
            else:
                run_listing(server, args, sampler)
        finally:
            sampler.stop()
            for sock in holders:
                sock.close()
            server.stop()


if __name__ == "__main__":
    main()
