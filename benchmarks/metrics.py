"""
What a ``/metrics`` scrape costs a server holding many keys and objects, and
what scrapers in a loop make a lock client wait: one checkout against
another, in one run.

For each target (``--jesync NAME=CHECKOUT[:PYTHON]``, default this checkout
as ``after``), one after the other, the script starts ``twistd -n --pidfile=
jesync --port tcp:P:interface=127.0.0.1 --memcache-port ... --metrics ...
--max-held 0 --max-keys 0 --memcache-memory 2g`` from that checkout and:

1. fills N objects (default 1,000,000) over the memcached text protocol
   (``set object-%07d 0 0 1`` pipelined), then locks every one of them
   (``lock object-%07d``, yrmcds's object lock: the key is held in the lock
   table), so the server has N objects and N held keys, all locked;
2. scrapes ``/metrics`` ``--scrapes`` times, one at a time (HTTP/1.1,
   a new connection each): the time of each scrape, the server's CPU
   time per scrape, and the ``jesync_memcache_locked_items`` it reports;
3. runs a lock client (its own process: JESync ``lock probe`` /
   ``release probe``, one request at a time) for ``--seconds`` seconds
   alone, then again while ``--scrapers`` processes scrape ``/metrics`` in
   a loop (a keep-alive connection each): the client's cycles and its
   round trip's p50, p99 and max, and the scrapes done.

``--lock-path``: instead, what keeping the counts costs the lock path, in
process (no sockets, so the machine's other load matters less): 64 owners
each take and release a key of their own, 200 times over, best of 15, on a
lock table alone and on one with a memcached store (half the keys naming an
object), for each target in ``--rounds`` interleaved rounds: nanoseconds
per lock/release cycle.

Only 127.0.0.1; every loop is bounded in count and time; each server is
stopped before the next starts.

    python benchmarks/metrics.py --jesync before=/work/main --jesync after=.
    python benchmarks/metrics.py --objects 100000 --seconds 5
    python benchmarks/metrics.py --lock-path --jesync before=/tmp/jesync-before --jesync after=.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import re
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import REPO, cpu_seconds, describe_checkout, free_port, jesync_target, start_jesync  # noqa: E402

LOCKED_ITEMS = re.compile(rb"^jesync_memcache_locked_items (\S+)$", re.M)


def connect(address: tuple[str, int], timeout: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def pipeline(sock: socket.socket, requests, reply: bytes, count: int, window: int, deadline: float) -> None:
    """Send C{requests} (C{count} of them), at most C{window} unanswered, each answered C{reply}."""
    requests = iter(requests)
    sent = answered = 0
    pending = b""
    while answered < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"fill: {answered} of {count} answered in time")
        batch = []
        while sent - answered < window and sent < count:
            batch.append(next(requests))
            sent += 1
        if batch:
            sock.sendall(b"".join(batch))
        data = sock.recv(1 << 20)
        if not data:
            raise SystemExit("fill: the server closed the connection")
        complete, _, pending = (pending + data).rpartition(b"\r\n")
        if complete:
            replies = complete.split(b"\r\n")
            bad = [line for line in replies if line + b"\r\n" != reply]
            if bad:
                raise SystemExit(f"fill: unexpected reply {bad[0][:200]!r}")
            answered += len(replies)


def fill(address: tuple[str, int], objects: int, timeout: float) -> tuple[float, socket.socket]:
    """Store and lock C{objects} objects over one connection, which must stay open (it holds the locks)."""
    start = time.monotonic()
    deadline = start + timeout
    sock = connect(address, timeout)
    sets = (b"set object-%07d 0 0 1\r\nv\r\n" % n for n in range(objects))
    pipeline(sock, sets, b"STORED\r\n", objects, 2000, deadline)
    pipeline(sock, (b"lock object-%07d\r\n" % n for n in range(objects)), b"OK\r\n", objects, 2000, deadline)
    return time.monotonic() - start, sock


def scrape(connection: http.client.HTTPConnection) -> bytes:
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"scrape: HTTP {response.status}")
    return body


def scraper(port: int, stop, counts, index: int, timeout: float) -> None:
    """Scrape in a loop (one keep-alive connection) until C{stop} is set."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    done = 0
    while not stop.is_set():
        scrape(connection)
        done += 1
    counts[index] = done
    connection.close()


def lock_client(address: tuple[str, int], seconds: float, timeout: float, pipe) -> None:
    """JESync lock/release of one key, one request at a time, for C{seconds}: every round trip."""
    sock = connect(address, timeout)
    times = []
    end = time.monotonic() + seconds
    buffer = b""
    for request, expected in ((b"lock probe\n", b"GRANTED"), (b"release probe\n", b"RELEASED")) * 10_000_000:
        now = time.perf_counter()
        if time.monotonic() > end:
            break
        sock.sendall(request)
        while b"\n" not in buffer:
            data = sock.recv(4096)
            if not data:
                raise SystemExit("lock client: the server closed the connection")
            buffer += data
        line, _, buffer = buffer.partition(b"\n")
        if not line.startswith(expected):
            raise SystemExit(f"lock client: unexpected reply {line!r}")
        times.append(time.perf_counter() - now)
    sock.close()
    pipe.send(times)


def latency(address: tuple[str, int], seconds: float, timeout: float) -> list[float]:
    """The lock client's round trips (in its own process), sorted; one may take up to C{timeout}."""
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=lock_client, args=(address, seconds, timeout, child))
    process.start()
    if not parent.poll(seconds + timeout + 10):
        process.kill()
        raise SystemExit("lock client: no answer")
    times = sorted(parent.recv())
    process.join(10)
    return times


def describe(times: list[float]) -> str:
    def at(p: float) -> float:
        return times[min(len(times) - 1, int(p * len(times)))] * 1e3

    return f"{len(times):,} round trips, p50 {at(0.5):.2f} ms, p99 {at(0.99):.2f} ms, max {times[-1] * 1e3:.2f} ms"


def measure(name: str, checkout: Path, python: str, args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="jesync-metrics-bench-"))
    memcache_port, metrics_port = free_port(), free_port()
    options = (
        "--memcache-port", f"tcp:{memcache_port}:interface=127.0.0.1",
        "--metrics", f"tcp:{metrics_port}:interface=127.0.0.1",
        "--max-held", "0", "--max-keys", "0", "--max-connections", "0", "--memcache-memory", "2g",
    )  # fmt: skip
    server = start_jesync(tmp, None, name=name, checkout=checkout, python=python, options=options)
    print(f"\n== {name}: {describe_checkout(checkout)} ({python})", flush=True)
    try:
        took, holder = fill(("127.0.0.1", memcache_port), args.objects, args.timeout)
        print(f"filled {args.objects:,} objects, all locked, in {took:.1f} s", flush=True)
        times, locked = [], b"?"
        cpu_before = cpu_seconds(server.pid)
        for _ in range(args.scrapes):
            connection = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=args.timeout)
            start = time.perf_counter()
            body = scrape(connection)
            times.append(time.perf_counter() - start)
            connection.close()
            found = LOCKED_ITEMS.search(body)
            locked = found.group(1) if found else b"(none)"
        cpu_after = cpu_seconds(server.pid)
        cpu = "?"
        if cpu_before is not None and cpu_after is not None:
            cpu = f"{(cpu_after - cpu_before) / args.scrapes * 1e3:.2f} ms"
        print(
            f"scrape ({args.scrapes}, one at a time): median {statistics.median(times) * 1e3:.2f} ms, "
            f"max {max(times) * 1e3:.2f} ms; server CPU {cpu} per scrape; locked_items {locked.decode()}",
            flush=True,
        )
        print(f"lock client alone: {describe(latency(server.address, args.seconds, args.timeout))}", flush=True)
        stop = multiprocessing.Event()
        counts = multiprocessing.Array("l", args.scrapers)
        scrapers = [
            multiprocessing.Process(target=scraper, args=(metrics_port, stop, counts, i, args.timeout))
            for i in range(args.scrapers)
        ]
        for process in scrapers:
            process.start()
        try:
            loaded = latency(server.address, args.seconds, args.timeout)
        finally:
            stop.set()
            for process in scrapers:
                process.join(args.timeout + 10)
                if process.is_alive():
                    process.kill()
        print(
            f"lock client with {args.scrapers} looping scrapers: {describe(loaded)}; "
            f"{sum(counts) / args.seconds:,.0f} scrapes/s",
            flush=True,
        )
        holder.close()
    finally:
        server.stop()


LOCK_PATH = """
import sys, timeit
from twisted.internet.task import Clock
from jesync.service import LockService
service = LockService(Clock())
if sys.argv[1] == "store":
    from jesync.store import ObjectStore
    store = ObjectStore(service)
    for i in range(0, 64, 2):
        store.store("set", b"k%d" % i, b"v", 0, 0, "writer")
pairs = [(f"k{i}", object()) for i in range(64)]
request, release = service.request, service.release
def cycles():
    for key, owner in pairs:
        request(key, owner, 1, -1, 120)
        release(key, owner)
print(min(timeit.repeat(cycles, number=200, repeat=15)) / (200 * 64) * 1e9)
"""


def lock_path(targets, rounds: int) -> None:
    """Nanoseconds per lock/release cycle, in process, per target and table kind: the best round, and every round."""
    results: dict = {}
    for _ in range(rounds):
        for kind in ("plain", "store"):
            for name, checkout, python in targets:
                env = dict(os.environ, PYTHONPATH=str(checkout))
                # (in the checkout: "python -c" puts the working directory ahead of PYTHONPATH)
                out = subprocess.run(
                    [python, "-c", LOCK_PATH, kind],
                    cwd=checkout,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=True,
                )
                results.setdefault((kind, name), []).append(float(out.stdout))
    for (kind, name), values in results.items():
        table = "lock table alone" if kind == "plain" else "lock table + memcached store"
        shown = ", ".join(f"{value:,.0f}" for value in values)
        print(f"{table}, {name}: best {min(values):,.0f} ns/cycle (rounds: {shown})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1_000_000, help="objects stored and locked (default 1,000,000)")
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes timed one at a time (default 20)")
    parser.add_argument("--scrapers", type=int, default=16, help="looping scrapers (default 16)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each lock-client run (default 10)")
    parser.add_argument("--timeout", type=float, default=600.0, help="the most the fill, or one scrape, may take")
    parser.add_argument(
        "--jesync",
        type=jesync_target,
        action="append",
        metavar="NAME=CHECKOUT[:PYTHON]",
        help="a server to measure (repeatable; default: this checkout as 'after')",
    )
    parser.add_argument("--lock-path", action="store_true", help="instead: the lock path's cost, in process")
    parser.add_argument("--rounds", type=int, default=5, help="with --lock-path: interleaved rounds (default 5)")
    args = parser.parse_args()
    targets = args.jesync or [("after", REPO, sys.executable)]
    if args.lock_path:
        lock_path(targets, args.rounds)
        return
    for name, checkout, python in targets:
        measure(name, checkout, python, args)


if __name__ == "__main__":
    main()
