"""
The memcached listener against yrmcds, over loopback: get/set throughput in
both protocols, yrmcds's object lock/unlock cycles, and memory per cached
item.

jesync is ``twistd -n jesync --memcache-port ...`` of this checkout (with the
``twistd`` next to this Python; ``--jesync NAME=CHECKOUT[:PYTHON]`` and
``--pypy PYTHON`` add others, e.g. the same checkout under PyPy); yrmcds is
Debian's ``yrmcdsd``, started as ``loadgen.py`` starts it (its own config
file, a free loopback port, 2 workers), and skipped with a message when it
is not installed.

Throughput.  Each of N connections (default scenarios 1 and 64; ``--scenario
N``, repeatable) sends one request, waits for the whole reply, checks it and
sends the next (closed loop, no pipelining); every connection has its own
key, stored during set-up, so nothing is contended.  A *cycle*:

``get``     text ``get K`` of a 32-byte item: one round trip.
``set``     text ``set K 0 0 32`` of the same 32 bytes again: one round trip.
``bget``    binary Get (0x00): one round trip.
``bset``    binary Set (0x01, flags 0, no expiry): one round trip.
``lock``    text ``lock K`` then ``unlock K`` (both ``OK``): two round trips.
``block``   binary Lock (0x40) then Unlock (0x42): two round trips.

A text reply must be exactly the bytes expected (``VALUE K 0 32``, the data,
``END``; ``STORED``; ``OK``), a binary one must have status 0 and the
request's opcode; anything else stops the run.  Before measuring, a
self-test checks on each server that a lock taken with ``lock`` makes
another connection's ``set`` answer ``LOCKED`` and that ``unlock`` frees it.

Every round runs every (workload, server) pair of one scenario back to back,
the servers of a workload next to each other, in alternating order from
round to round.  Reported (as loadgen.py and dlock.py, whose helpers this
uses): cycles/s, p50/p99 cycle latency, the server process's CPU time per
cycle (all its threads, from /proc: the figure least disturbed by other
load), the load generator's CPU, the rest of the machine's (noise), and
each jesync target's ratio to yrmcds (and to the first jesync target) for
cycles/s and CPU/cycle: the median of the per-round ratios.
``--max-noise CORES`` works as in loadgen.py and dlock.py: wait (at most
``--wait-quiet`` s) for a quiet second before each round, leave out every
run during which the rest of the machine used more than CORES of a core,
take each ratio over the rounds in which both its runs were quiet, and run
extra rounds (at most ``--extra-rounds``) until each has ``--repeat`` of
them, unless the machine has not gone quiet before a round.  Before the
first round every workload runs unmeasured for ``--prime`` seconds against
each jesync target (PyPy's JIT compiles on it).

Memory.  A fresh server of each kind stores ``--items`` items (default
200,000; keys of ``--key-size`` bytes, 10 by default, values of
``--value-size``, 32) over one connection, pipelined ``set ... noreply`` in
batches, each batch ended by a ``get`` of its last key.  Reported: the
server's RSS (VmRSS) before and after, the growth per item, and the
store's own accounting from ``stats`` (``bytes`` / ``curr_items``; yrmcds
updates its counters only at its next GC pass, up to 10 s later, which the
script waits for).  jesync is started with ``--memcache-memory`` raised to
well above what the items count (key + value + 1024 bytes each, twice
over), so none is evicted; ``curr_items`` is checked against ``--items``.

    python benchmarks/memcache.py --quick                       # ~45 s
    python benchmarks/memcache.py                               # ~4.5 min: 3 rounds of 2 s
    python benchmarks/memcache.py --max-noise 0.1 --pypy /tmp/vpp/bin/python
    python benchmarks/memcache.py --workload get --workload lock --scenario 16 --no-memory
    python benchmarks/memcache.py --memory-only --items 1000000
    python benchmarks/memcache.py --keys-only                   # ~1 min: Keys over 1,000,000 objects

Keys.  ``--keys-only``: a fresh server of each kind (jesync with
``--memcache-memory 1g``) stores ``--keys-items`` objects (default
1,000,000; keys and values as for memory), then one client sends a text
``keys`` (every object: yrmcds's Keys) and reads the whole listing, while
``--keys-clients`` other connections (default 4) each run a closed loop of
text ``get`` and ``set`` of an object of their own.  Reported: the time
from sending ``keys`` to the last byte of ``END``, the keys counted (each
must be listed once), and the other clients' cycle latency (p50, p99, max)
while the listing ran, against the same clients' during the 2 s before it.

Only the Python standard library is used by the clients: raw non-blocking
sockets on one epoll per load-generator process (``--procs``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import closedloop  # noqa: E402
from closedloop import DONE, Tally, connect, run_closed_loop  # noqa: E402
from loadgen import (  # noqa: E402
    BACKLOG,
    REPO,
    ProtocolError,
    Result,
    Server,
    cpu_seconds,
    describe_checkout,
    fmt_cpu,
    fmt_us,
    free_port,
    jesync_target,
    label,
    median_result,
    pair_ratio,
    pin_cpus,
    raise_open_files,
    run_rounds,
    run_workers,
    start_jesync,
    start_yrmcds,
)
from memory import rss_bytes  # noqa: E402

#: Workloads: name -> (label, round trips per cycle).
WORKLOADS = {
    "get": ("text get", 1),
    "set": ("text set", 1),
    "bget": ("binary Get", 1),
    "bset": ("binary Set", 1),
    "lock": ("text lock+unlock", 2),
    "block": ("binary Lock+Unlock", 2),
}
#: Each workload's keys start with these two letters (then 8 digits: 10 bytes).
KEY_PREFIX = {"get": b"ge", "set": b"se", "bget": b"bg", "bset": b"bs", "lock": b"lo", "block": b"bl"}
VALUE = b"v" * 32  # the throughput workloads' items
YRMCDS = "yrmcds"

# -- the binary protocol -----------------------------------------------------------

HEADER = struct.Struct(">BBHBBHIIQ")  # magic, opcode, key length, extras length, type, vbucket/status, body, opaque, CAS
GET, SET, LOCK, UNLOCK = 0x00, 0x01, 0x40, 0x42


def binary(opcode: int, key: bytes, extras: bytes = b"", value: bytes = b"", opaque: int = 0) -> bytes:
    body = len(extras) + len(key) + len(value)
    return HEADER.pack(0x80, opcode, len(key), len(extras), 0, 0, body, opaque, 0) + extras + key + value


def binary_set(key: bytes, value: bytes) -> bytes:
    return binary(SET, key, struct.pack(">II", 0, 0), value)


# -- a connection's conversation ---------------------------------------------------
#
# A step is (request, expected reply): bytes for a text reply that must be
# exactly those bytes, an int for a binary reply that must have that opcode
# and status 0.

def workload_key(workload: str, index: int) -> bytes:
    return KEY_PREFIX[workload] + b"%08d" % index


def conversation(workload: str, index: int) -> tuple[list, list]:
    """A connection's (set-up steps, cycle steps) for a workload."""
    key = workload_key(workload, index)
    store = (b"set %s 0 0 %d\r\n%s\r\n" % (key, len(VALUE), VALUE), b"STORED\r\n")
    if workload == "get":
        return [store], [(b"get %s\r\n" % key, b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(VALUE), VALUE))]
    if workload == "set":
        return [], [store]
    if workload == "bget":
        return [store], [(binary(GET, key), GET)]
    if workload == "bset":
        return [], [(binary_set(key, VALUE), SET)]
    if workload == "lock":
        return [store], [(b"lock %s\r\n" % key, b"OK\r\n"), (b"unlock %s\r\n" % key, b"OK\r\n")]
    if workload == "block":
        return [store], [(binary(LOCK, key), LOCK), (binary(UNLOCK, key), UNLOCK)]
    raise ValueError(workload)


def reply_length(buffer: bytes, expected) -> int:
    """
    How long the reply at the start of C{buffer} is if it has all arrived
    and is the one C{expected}, 0 if more has to arrive; L{ProtocolError}
    if it is not the expected one.
    """
    if isinstance(expected, bytes):
        size = len(expected)
        if len(buffer) < size:
            if not expected.startswith(buffer):
                raise ProtocolError(f"unexpected reply {buffer[:200]!r}, expected {expected[:200]!r}")
            return 0
        if buffer[:size] != expected:
            raise ProtocolError(f"unexpected reply {buffer[:200]!r}, expected {expected[:200]!r}")
        return size
    if len(buffer) < 24:
        return 0
    size = 24 + int.from_bytes(buffer[8:12], "big")
    if buffer[0] != 0x81 or buffer[1] != expected or buffer[6:8] != b"\0\0":
        raise ProtocolError(f"unexpected binary reply {buffer[:size][:200]!r} to opcode {expected:#04x}")
    return size if len(buffer) >= size else 0


def call(sock: socket.socket, request: bytes, expected) -> bytes:
    """One blocking request and its reply (set-up and self-test only)."""
    sock.sendall(request)
    buffer = b""
    while True:
        size = reply_length(buffer, expected)
        if size:
            return buffer[:size]
        chunk = sock.recv(65536)
        if not chunk:
            raise ProtocolError(f"the server closed the connection after {request[:60]!r}")
        buffer += chunk


def exchange(sock: socket.socket, request: bytes) -> bytes:
    """One blocking text request and its one-line reply, whatever it is."""
    sock.sendall(request)
    buffer = b""
    while not buffer.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ProtocolError("the server closed the connection")
        buffer += chunk
    return buffer


def self_test(server: Server) -> None:
    """
    A C{lock} by one connection makes another's C{set} answer LOCKED, and
    after C{unlock} the other's C{lock} succeeds: the cycle really locks and
    really unlocks.
    """
    key = b"selftest%d" % os.getpid()
    with socket.create_connection(server.address) as first, socket.create_connection(server.address) as second:
        call(first, b"set %s 0 0 1\r\nx\r\n" % key, b"STORED\r\n")
        call(first, b"lock %s\r\n" % key, b"OK\r\n")
        reply = exchange(second, b"set %s 0 0 1\r\ny\r\n" % key)
        if reply != b"LOCKED\r\n":
            raise SystemExit(f"self-test ({server.name}): a set of a locked object answered {reply!r}")
        call(first, b"unlock %s\r\n" % key, b"OK\r\n")
        reply = exchange(second, b"lock %s\r\n" % key)
        if reply != b"OK\r\n":
            raise SystemExit(f"self-test ({server.name}): a lock after unlock answered {reply!r}")
        call(second, b"unlock %s\r\n" % key, b"OK\r\n")
        call(second, b"delete %s\r\n" % key, b"DELETED\r\n")


# -- one load-generator process ----------------------------------------------------


class Conn(closedloop.Conn):
    __slots__ = ("step", "steps")

    def __init__(self, sock: socket.socket, steps: list, tally: Tally) -> None:
        super().__init__(sock, steps[0][0], tally)
        self.steps = steps
        self.step = 0


def memcache_reply(conn: Conn, buffer: bytes) -> tuple | None:
    """closedloop's reply handler: the step's expected reply (L{reply_length}); after the last step the cycle is done."""
    steps = conn.steps
    size = reply_length(buffer, steps[conn.step][1])
    if not size:
        return None
    step = conn.step + 1
    if step == len(steps):
        conn.step = 0
        return size, steps[0][0], DONE
    conn.step = step
    return size, steps[step][0], 0


def memcache_worker(address, workload: str, indices: list, warmup: float, seconds: float, cpus, pipe) -> None:
    """
    loadgen.run_worker for memcached requests: connect, run each
    connection's set-up, then closedloop's loop; sends back (cycles,
    latencies in ns, 0 retries, CPU seconds) for the window.
    """

    def open_conns(tally: Tally) -> list:
        conns = []
        for index in indices:
            sock = connect(address)
            setup, steps = conversation(workload, index)
            for request, expected in setup:
                call(sock, request, expected)
            conns.append(Conn(sock, steps, tally))
        return conns

    run_closed_loop(cpus, open_conns, memcache_reply, warmup, seconds, pipe)


def run_memcache(server: Server, workload: str, connections: int, args) -> Result:
    """loadgen.run_scenario for a memcached workload (the same timing and CPU accounting)."""
    procs = max(1, min(args.procs, connections))
    indices = list(range(connections))

    def worker(index: int, pipe) -> tuple:
        share = indices[index::procs]
        return memcache_worker, (server.address, workload, share, args.warmup, args.seconds, args.client_cpus, pipe)

    return run_workers(server, procs, worker, args)


# -- servers -------------------------------------------------------------------------


def start_memcache_jesync(tmp: Path, name: str, checkout: Path, python: str, cpus, memory: int | None = None) -> Server:
    """
    A jesync of C{checkout} under C{python} with a memcached listener on a
    free loopback port (its JESync port is another free one): a Server for
    the memcached port, with the process's pid.
    """
    port = free_port()
    options = ["--memcache-port", f"tcp:{port}:interface=127.0.0.1:backlog={BACKLOG}"]
    if memory is not None:
        options += ["--memcache-memory", str(memory)]
    jesync = start_jesync(tmp, None, cpus, name, checkout, python, tuple(options))
    return Server(name, ("127.0.0.1", port), jesync.process, jesync.log, "memcache").listening()


def start_servers(tmp: Path, targets: list, with_yrmcds: bool, cpus, memory: int | None = None) -> list:
    servers = []
    try:
        for name, checkout, python in targets:
            servers.append(start_memcache_jesync(tmp, name, checkout, python, cpus, memory))
        if with_yrmcds:
            servers.append(start_yrmcds(tmp, cpus))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def python_version(python: str) -> str:
    return subprocess_text([python, "-c", "import sys, platform; print(platform.python_implementation(), sys.version.split()[0])"])


def subprocess_text(command: list) -> str:
    return subprocess.run(command, check=False, capture_output=True, text=True).stdout.strip()


# -- memory ----------------------------------------------------------------------------


def stats(sock: socket.socket) -> dict:
    """A text C{stats}, as {name: value}."""
    sock.sendall(b"stats\r\n")
    buffer = b""
    while not buffer.endswith(b"END\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ProtocolError("the server closed the connection")
        buffer += chunk
    rows = {}
    for line in buffer.decode().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == "STAT":
            rows[fields[1]] = " ".join(fields[2:])
    return rows


def fill(sock: socket.socket, items: int, key_size: int, value_size: int, batch: int = 2000) -> None:
    """Store C{items} distinct items, pipelined C{set ... noreply}, each batch ended by a C{get} of its last key."""
    for first in range(0, items, batch):
        last = min(first + batch, items)
        pieces = []
        for i in range(first, last):
            key = b"m%0*d" % (key_size - 1, i)
            value = b"%0*d" % (value_size, i)
            pieces.append(b"set %s 0 0 %d noreply\r\n%s\r\n" % (key, value_size, value))
        pieces.append(b"get %s\r\n" % key)
        sock.sendall(b"".join(pieces))
        expected = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, value_size, value)
        buffer = b""
        while len(buffer) < len(expected):
            chunk = sock.recv(65536)
            if not chunk:
                raise ProtocolError("the server closed the connection while filling")
            buffer += chunk
        if buffer != expected:
            raise ProtocolError(f"filling: unexpected reply {buffer[:200]!r}")


def measure_memory(server: Server, args) -> dict:
    """RSS before and after storing the items, and the store's own accounting."""
    assert server.pid is not None
    with socket.create_connection(server.address) as sock:
        # Warm: one item stored and read, one stats, before the baseline.
        call(sock, b"set warm 0 0 1\r\nx\r\n", b"STORED\r\n")
        call(sock, b"get warm\r\n", b"VALUE warm 0 1\r\nx\r\nEND\r\n")
        stats(sock)
        time.sleep(0.5)
        before = rss_bytes(server.pid)
        cpu_before = cpu_seconds(server.pid) or 0.0
        started = time.monotonic()
        fill(sock, args.items, args.key_size, args.value_size)
        fill_seconds = time.monotonic() - started
        fill_cpu = (cpu_seconds(server.pid) or 0.0) - cpu_before
        time.sleep(0.5)
        after = rss_bytes(server.pid)
        rows = stats(sock)
        deadline = time.monotonic() + 15
        # yrmcds counts items and bytes at its GC pass (every 10 s by default).
        while int(rows.get("curr_items", 0)) < args.items and time.monotonic() < deadline:
            time.sleep(0.5)
            rows = stats(sock)
        settled = rss_bytes(server.pid)
    items = int(rows.get("curr_items", 0))
    return {
        "before": before,
        "after": after,
        "settled": settled,
        "curr_items": items,
        "bytes": int(rows.get("bytes", 0)),
        "evictions": int(rows.get("evictions", 0)),
        "fill_seconds": fill_seconds,
        "fill_cpu": fill_cpu,
    }


def memory_part(tmp: Path, targets: list, with_yrmcds: bool, args) -> dict:
    """Each server fresh, one at a time (so they do not share the machine while filling)."""
    per_item = args.key_size + args.value_size + 1024  # (more than the store counts per item, whatever it is)
    memory = max(64 * 1024 * 1024, 2 * args.items * per_item)
    print(
        f"\nmemory: {args.items:,} items of a {args.key_size}-byte key and a {args.value_size}-byte value, "
        f"each server fresh (jesync with --memcache-memory {memory})",
        flush=True,
    )
    results = {}
    # One server at a time: each jesync target alone, then yrmcds alone (no targets).
    kinds = [[target] for target in targets] + ([[]] if with_yrmcds else [])
    for chosen in kinds:
        servers = start_servers(tmp, chosen, with_yrmcds and not chosen, args.server_cpus, memory)
        try:
            server = servers[0]
            result = results[server.name] = measure_memory(server, args)
        finally:
            for server in servers:
                server.stop()
        print(
            f"  {server.name}: RSS {result['before'] / 2**20:.1f} -> {result['after'] / 2**20:.1f} MiB "
            f"({(result['after'] - result['before']) / args.items:.0f} B/item; "
            f"{(result['settled'] - result['before']) / args.items:.0f} B/item once stats were read), "
            f"stats curr_items {result['curr_items']:,}, bytes {result['bytes']:,}, evictions {result['evictions']}, "
            f"filled in {result['fill_seconds']:.1f} s, server CPU {result['fill_cpu']:.1f} s",
            flush=True,
        )
        if result["curr_items"] < args.items:
            print(f"  ({server.name}: only {result['curr_items']:,} of the {args.items:,} items counted)")
    return results


# -- Keys over many objects ---------------------------------------------------------------


class LatencyClient(threading.Thread):
    """A closed loop of text get and set of one object, each cycle's start and latency recorded."""

    def __init__(self, address, index: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = b"latency%03d" % index
        self.requests = [
            (b"set %s 0 0 32\r\n%s\r\n" % (key, VALUE), b"STORED\r\n"),
            (b"get %s\r\n" % key, b"VALUE %s 0 32\r\n%s\r\nEND\r\n" % (key, VALUE)),
        ]
        self.samples: list = []  # (start, seconds)
        self.running = True
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while self.running:
                request, expected = self.requests[n % 2]
                n += 1
                started = time.monotonic()
                call(self.sock, request, expected)
                self.samples.append((started, time.monotonic() - started))
        except BaseException as error:  # (reported by the main thread)
            self.error = error
        finally:
            self.sock.close()


def percentile(values: list, fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def measure_keys(server: Server, args) -> dict:
    """Fill, then time one whole text C{keys} listing while other clients get and set."""
    with socket.create_connection(server.address) as sock:
        fill(sock, args.keys_items, args.key_size, args.value_size)
    clients = [LatencyClient(server.address, index) for index in range(args.keys_clients)]
    for client in clients:
        client.start()
    time.sleep(2.5)
    with socket.create_connection(server.address) as lister:
        lister.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        lister.sendall(b"keys\r\n")
        lines = 0
        tail = b""
        first_byte = None
        while True:
            chunk = lister.recv(1 << 18)
            if not chunk:
                raise ProtocolError("the server closed the listing connection")
            if first_byte is None:
                first_byte = time.monotonic() - started
            lines += chunk.count(b"\n")
            tail = (tail + chunk)[-8:]
            if tail.endswith(b"\r\nEND\r\n") or (lines == 1 and tail == b"END\r\n"):
                break
        finished = time.monotonic()
    time.sleep(0.5)
    for client in clients:
        client.running = False
    for client in clients:
        client.join(10)
        if client.error is not None:
            raise ProtocolError(f"a latency client failed: {client.error!r}")
    during = [seconds for client in clients for start, seconds in client.samples if started <= start <= finished]
    before = [seconds for client in clients for start, seconds in client.samples if started - 2 <= start < started]
    return {
        "seconds": finished - started,
        "first_byte": first_byte or 0.0,
        "listed": lines - 1,  # (END)
        "during": during,
        "before": before,
    }


def keys_part(tmp: Path, targets: list, with_yrmcds: bool, args) -> dict:
    """Each server fresh, one at a time."""
    print(
        f"\nkeys: {args.keys_items:,} objects, then one text `keys` read whole while {args.keys_clients} "
        "clients get and set (jesync with --memcache-memory 1g)",
        flush=True,
    )
    results = {}
    kinds = [[target] for target in targets] + ([[]] if with_yrmcds else [])
    for chosen in kinds:
        servers = start_servers(tmp, chosen, with_yrmcds and not chosen, args.server_cpus, 2**30)
        try:
            server = servers[0]
            result = results[server.name] = measure_keys(server, args)
        finally:
            for server in servers:
                server.stop()
        expected = args.keys_items + args.keys_clients
        if result["listed"] != expected:
            print(f"  ({server.name}: listed {result['listed']:,} keys, not {expected:,})")
        print(f"  {server.name}: listing in {result['seconds']:.2f} s", flush=True)
    return results


def keys_report(results: dict, args) -> None:
    print()
    print(
        f"Keys over {args.keys_items:,} objects ({args.key_size}-byte keys; one text `keys` of every object, read "
        f"whole; {args.keys_clients} other clients each in a closed loop of text get/set of their own object):"
    )
    print()
    print("| server | keys listed | first byte s | whole listing s | others' p50 / p99 / max ms during | before (2 s) p50 / p99 ms | cycles during |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        during, before = r["during"], r["before"]
        print(
            f"| {name} | {r['listed']:,} | {r['first_byte']:.3f} | {r['seconds']:.2f} "
            f"| {percentile(during, 0.5) * 1000:.2f} / {percentile(during, 0.99) * 1000:.2f} / "
            f"{max(during, default=float('nan')) * 1000:.1f} "
            f"| {percentile(before, 0.5) * 1000:.2f} / {percentile(before, 0.99) * 1000:.2f} | {len(during):,} |"
        )


def memory_report(results: dict, args) -> None:
    print()
    print(
        f"Memory per cached item ({args.items:,} items, {args.key_size}-byte keys, {args.value_size}-byte values; "
        "RSS = VmRSS of the server process, fresh, before and 0.5 s after the last item; stats = the store's own "
        "`bytes` / `curr_items`):"
    )
    print()
    print("| server | RSS before MiB | RSS after MiB | RSS growth per item | ÷ yrmcds | stats bytes / curr_items | curr_items | fill s (server CPU s) |")
    print("|---|---|---|---|---|---|---|---|")
    reference = results.get(YRMCDS)
    reference_growth = (reference["after"] - reference["before"]) / args.items if reference else None
    for name, r in results.items():
        growth = (r["after"] - r["before"]) / args.items
        ratio = f"{growth / reference_growth:.2f}" if reference_growth else "-"
        accounted = f"{r['bytes'] / r['curr_items']:.0f} B" if r["curr_items"] else "-"
        print(
            f"| {name} | {r['before'] / 2**20:.1f} | {r['after'] / 2**20:.1f} | {growth:.0f} B | {ratio} "
            f"| {accounted} | {r['curr_items']:,} | {r['fill_seconds']:.1f} ({r['fill_cpu']:.1f}) |"
        )


# -- rounds and the report ---------------------------------------------------------------


def plan(workloads: list, names: list) -> list:
    """The runs of a round: for each workload, every server, next to each other."""
    return [(name, workload) for workload in workloads for name in names]


def pairs_of(runs: list, names: list) -> list:
    """(run, reference run) label pairs whose ratios are reported: each jesync to yrmcds, and to the first jesync."""
    jesyncs = [name for name in names if name != YRMCDS]
    pairs = []
    for name, workload in runs:
        if name == YRMCDS:
            continue
        if YRMCDS in names:
            pairs.append((label(name, workload), label(YRMCDS, workload)))
        if name != jesyncs[0]:
            pairs.append((label(name, workload), label(jesyncs[0], workload)))
    return pairs or [(label(*runs[0]), label(*runs[0]))]


def throughput_report(results: dict, runs: list, names: list, args) -> None:
    print()
    rounds_text = "/".join(sorted({str(len(r)) for r in results.values()}))
    jesyncs = [name for name in names if name != YRMCDS]
    noise = args.max_noise is not None
    print(
        f"{rounds_text} round(s) per scenario, {args.seconds:g} s each after {args.warmup:g} s warm-up, "
        f"{args.procs} load-generator process(es).  Per row: the run with the median cycles/s"
        + (f" among those with at most {fmt_cpu(args.max_noise)} other CPU" if noise else "")
        + ".  A cycle: get/set 1 round trip, lock+unlock 2.  CPU = share of one core (other: the rest of the "
        "machine, i.e. noise).  Ratios: the median over rounds of this run / the other server's run of the same "
        "workload in the same round"
        + (", over the rounds where both were quiet; * = no such round, all rounds used" if noise else "")
        + "."
    )
    print()
    ratio_heads = []
    if YRMCDS in names:
        ratio_heads += ["cycles/s ÷ yrmcds", "CPU/cycle ÷ yrmcds"]
    if len(jesyncs) > 1:
        ratio_heads += [f"cycles/s ÷ {jesyncs[0]}", f"CPU/cycle ÷ {jesyncs[0]}"]
    heads = [
        "server", "workload", "quiet runs" if noise else "runs", "cycles/s", "p50 µs", "p99 µs",
        "server CPU µs/cycle", "server CPU", "loadgen CPU", "other CPU", *ratio_heads,
    ]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for n, rounds in results.items():
        for run in runs:
            name = label(*run)
            measured = [r[name] for r in rounds]
            quiet = [m for m in measured if not noise or m.other_cpu <= args.max_noise]
            r = median_result(quiet or measured)
            used = (f"{len(quiet)} of {len(measured)}" if quiet else f"0 of {len(measured)} (noisy)") if noise else str(len(measured))
            cells = []
            references = ([YRMCDS] if YRMCDS in names else []) + ([jesyncs[0]] if len(jesyncs) > 1 else [])
            for reference in references:
                if run[0] == reference:
                    cells += ["1", "1"]
                    continue
                if run[0] == YRMCDS:  # (yrmcds is not compared with a jesync target)
                    cells += ["-", "-"]
                    continue
                for measure in (lambda x: x.cycles_per_second, lambda x: x.server_us_per_cycle):
                    value, note = pair_ratio(rounds, name, label(reference, run[1]), measure, args.max_noise)
                    cells.append("-" if value is None else f"{value:.2f}{note}")
            print(
                f"| {run[0]} | {WORKLOADS[run[1]][0]} x{n} | {used} | {r.cycles_per_second:,.0f} "
                f"| {r.p50_us:,.0f} | {r.p99_us:,.0f} | {fmt_us(r.server_us_per_cycle)} | {fmt_cpu(r.server_cpu)} "
                f"| {fmt_cpu(r.loadgen_cpu)} | {fmt_cpu(r.other_cpu)} | " + " | ".join(cells) + " |"
            )
    # Per request rather than per cycle, and text against binary, within each server.
    print()
    print("Within a server, median over rounds of each round's ratio (cycles/s, server CPU/cycle):")
    for n, rounds in results.items():
        for name in names:
            for a, b in (("bget", "get"), ("bset", "set"), ("set", "get"), ("block", "lock"), ("lock", "get")):
                if (name, a) in runs and (name, b) in runs:
                    cps, note1 = pair_ratio(rounds, label(name, a), label(name, b), lambda x: x.cycles_per_second, args.max_noise)
                    cpu, note2 = pair_ratio(rounds, label(name, a), label(name, b), lambda x: x.server_us_per_cycle, args.max_noise)
                    print(
                        f"  x{n} {name}: {WORKLOADS[a][0]} / {WORKLOADS[b][0]}: cycles/s "
                        + ("-" if cps is None else f"{cps:.2f}{note1}")
                        + ", CPU/cycle " + ("-" if cpu is None else f"{cpu:.2f}{note2}")
                    )


def prime(servers: list, workloads: list, n: int, args) -> None:
    """Every workload, unmeasured, for args.prime seconds against each jesync target (PyPy's JIT)."""
    if args.prime <= 0:
        return
    primed = argparse.Namespace(**vars(args))
    primed.warmup, primed.seconds = 0.0, args.prime
    for server in servers:
        if server.name == YRMCDS:
            continue
        for workload in workloads:
            run_memcache(server, workload, n, primed)
    print(f"  (primed: each workload {args.prime:g} s x{n} against each jesync target)", flush=True)


def throughput_part(servers: list, workloads: list, scenarios: list, args) -> tuple:
    names = [server.name for server in servers]
    by_name = {server.name: server for server in servers}
    runs = plan(workloads, names)
    pairs = pairs_of(runs, names)
    for server in servers:
        if "lock" in workloads or "block" in workloads:
            self_test(server)
    prime(servers, workloads, max(scenarios), args)
    results = run_rounds(
        scenarios,
        runs,
        pairs,
        lambda name, workload, n, attempt: run_memcache(by_name[name], workload, n, args),
        lambda name, workload: f"{name} {WORKLOADS[workload][0]}",
        args,
    )
    return results, runs, names


# -- main --------------------------------------------------------------------------------


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per run (default 2)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each (default 0.5)")
    parser.add_argument("--quick", action="store_true", help="1 s per run, 0.2 s warm-up, 1 round, 0.5 s priming")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per scenario (default 3); medians are reported")
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes (default 1)")
    parser.add_argument(
        "--scenario", type=int, action="append", metavar="N",
        help="N connections, each with its own key; repeatable (default: 1 and 64)",
    )
    parser.add_argument(
        "--workload", choices=list(WORKLOADS), action="append",
        help="run only these workloads (repeatable; default all: " + ", ".join(WORKLOADS) + ")",
    )
    parser.add_argument(
        "--jesync", type=jesync_target, action="append", default=[], metavar="NAME=CHECKOUT[:PYTHON]",
        help="a jesync from CHECKOUT (PYTHONPATH) with the twistd next to PYTHON (default: this Python); "
        "repeatable; default: this checkout, named jesync",
    )
    parser.add_argument(
        "--pypy", metavar="PYTHON",
        help="also this checkout under PYTHON (e.g. a PyPy virtualenv's python), named pypy; skipped with a "
        "message when there is no twistd next to it",
    )
    parser.add_argument("--no-yrmcds", action="store_true", help="skip yrmcds (run when yrmcdsd is installed)")
    parser.add_argument("--max-noise", type=float, metavar="CORES", help="as loadgen.py's (see the description)")
    parser.add_argument(
        "--wait-quiet", type=float, default=15.0, help="with --max-noise: seconds to wait for quiet (default 15)"
    )
    parser.add_argument(
        "--extra-rounds", type=int, default=None, help="with --max-noise: at most this many more rounds (default --repeat)"
    )
    parser.add_argument(
        "--prime", type=float, default=2.0,
        help="seconds each workload runs unmeasured against each jesync target before the first round (default 2)",
    )
    parser.add_argument("--items", type=int, default=200_000, help="items stored for the memory figure (default 200,000)")
    parser.add_argument("--key-size", type=int, default=10, help="their key length (default 10)")
    parser.add_argument("--value-size", type=int, default=32, help="their value length (default 32)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--keys-only", action="store_true", help="only the Keys measurement (see the description)")
    parser.add_argument("--keys-items", type=int, default=1_000_000, help="objects listed by Keys (default 1,000,000)")
    parser.add_argument("--keys-clients", type=int, default=4, help="clients getting and setting meanwhile (default 4)")
    parser.add_argument("--memory-only", action="store_true", help="only the memory measurement")
    parser.add_argument(
        "--pin", choices=["split", "one"],
        help="split: servers on the first CPU, load generator on the others; one: everything on the first CPU",
    )
    args = parser.parse_args(argv)
    pin_cpus(parser, args)
    if args.quick:
        args.seconds, args.warmup, args.repeat, args.prime = 1.0, 0.2, 1, min(args.prime, 0.5)
    if args.extra_rounds is None:
        args.extra_rounds = args.repeat if args.max_noise is not None else 0
    if args.no_memory and args.memory_only:
        parser.error("--no-memory and --memory-only exclude each other")
    if not 2 <= args.key_size <= 250 or args.value_size < 1 or args.items < 1:
        parser.error("--key-size is 2 to 250, --value-size and --items at least 1")
    scenarios = list(dict.fromkeys(args.scenario or [1, 64]))
    if min(scenarios) < 1:
        parser.error("--scenario N needs N >= 1")
    workloads = [w for w in WORKLOADS if w in (args.workload or WORKLOADS)]
    targets = list(args.jesync) or [("jesync", REPO, sys.executable)]
    if args.pypy:
        if not Path(args.pypy).with_name("twistd").exists():
            print(f"no twistd next to {args.pypy}: skipping PyPy")
        else:
            targets.append(("pypy", REPO, os.path.abspath(args.pypy)))
    names = [name for name, _, _ in targets]
    if len(set(names)) != len(names):
        parser.error(f"target names must be distinct: {', '.join(names)}")

    with_yrmcds = False
    print(f"nproc {os.cpu_count()}, load generator python {sys.version.split()[0]}", end="")
    if args.no_yrmcds:
        pass
    elif shutil.which("yrmcdsd") is None:
        print("\nyrmcdsd is not installed: skipping yrmcds (apt-get install yrmcds to get it)", end="")
    else:
        with_yrmcds = True
        version = subprocess_text(["dpkg-query", "-W", "-f", "${Version}", "yrmcds"]) if shutil.which("dpkg-query") else ""
        print(f", yrmcds {version or '(version unknown)'} (2 workers)", end="")
    print()
    for name, checkout, python in targets:
        print(f"  {name}: {checkout} at {describe_checkout(checkout)}, {python} ({python_version(python)})")
    raise_open_files(2 * max(scenarios) + 1000)

    if args.keys_only:
        with tempfile.TemporaryDirectory(prefix="jesync-memcache-bench-") as tmp:
            keys_results = keys_part(Path(tmp), targets, with_yrmcds, args)
        keys_report(keys_results, args)
        return

    with tempfile.TemporaryDirectory(prefix="jesync-memcache-bench-") as tmp:
        if not args.memory_only:
            servers = start_servers(Path(tmp), targets, with_yrmcds, args.server_cpus)
            try:
                print("  pids: " + ", ".join(f"{s.name} {s.pid}" for s in servers), flush=True)
                results, runs, names = throughput_part(servers, workloads, scenarios, args)
            finally:
                for server in servers:
                    server.stop()
        memory = None if args.no_memory else memory_part(Path(tmp), targets, with_yrmcds, args)
    if not args.memory_only:
        throughput_report(results, runs, names, args)
    if memory:
        memory_report(memory, args)


if __name__ == "__main__":
    main()
