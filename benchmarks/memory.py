"""
Memory per held lock, with (by default) 1,000,000 locks held.

In-process, on a L{LockService} driven by a L{twisted.internet.task.Clock}:
distinct keys, owners spread round-robin over C{--owners} owner objects,
every grant with the default 120 s expiry (so each one also sits in the
expiry queue).  The key strings are created inside the measurement and are
counted: the server has to store them.  Two measurements, each in a fresh
child process:

 - tracemalloc: Python heap bytes still allocated once the locks are held;
 - RSS: growth of the process's resident set (what the OS sees, including
   allocator slack), without tracemalloc's own overhead.

With C{--server-process}, also a real server: C{twistd jesync} is started
on a loopback port, C{--connections} connections each take their share of
the locks over TCP, and the server's RSS is read from /proc.

    python benchmarks/memory.py
    python benchmarks/memory.py --spread 119 --server-process
    python benchmarks/memory.py --server-only --checkout /tmp/jesync-head --python /tmp/vhead-pypy/bin/python

C{--server-only} skips the in-process measurements (tracemalloc is not
available under PyPy); C{--checkout} and C{--python} choose the server
measured (default: this checkout, with the twistd next to this Python).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout's jesync, not an installed copy

from twisted.internet.task import Clock

from jesync.service import LockService

TARGET_BYTES = 400  # issue 10: <= 400 B per held lock on CPython


class Owner:
    """Stands in for a connection: an owner is any hashable object."""

    __slots__ = ("__weakref__",)


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def make_key(i: int) -> str:
    return f"lock-{i:08d}"  # 13 ASCII characters


def hold_locks(locks: int, owners: int, spread: float) -> tuple[LockService, list[str]]:
    """
    Take C{locks} locks on distinct keys, advancing the clock by C{spread}
    seconds in all (in steps of 100 grants) so that the expiries fall into
    many 10 ms buckets (0: all in one).
    """
    clock = Clock()
    service = LockService(clock)
    people = [Owner() for _ in range(owners)]
    keys = []
    step = 100
    for start in range(0, locks, step):
        for i in range(start, min(start + step, locks)):
            key = make_key(i)
            keys.append(key)
            service.acquire(key, people[i % owners])
        if spread:
            clock.advance(spread * step / locks)
    assert len(service._locks) == locks
    return service, keys


def measure(method: str, locks: int, owners: int, spread: float, pipe) -> None:
    """Run in a child process; send back (bytes for keys, bytes for everything)."""
    gc.collect()
    if method == "tracemalloc":
        import tracemalloc  # not in PyPy: imported only when used

        tracemalloc.start()

        def read() -> int:
            return tracemalloc.get_traced_memory()[0]
    else:
        read = rss_bytes
    before = read()
    keys = [make_key(i) for i in range(locks)]
    keys_only = read() - before - sys.getsizeof(keys)
    del keys
    gc.collect()
    before = read()
    service, keys = hold_locks(locks, owners, spread)
    gc.collect()
    total = read() - before
    # The list of keys is this benchmark's, not the server's: take it off.
    list_bytes = sys.getsizeof(keys)
    pipe.send((keys_only, total - list_bytes, len(service._expiries._buckets)))


def in_process(method: str, args) -> tuple[int, int, int]:
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    child = context.Process(target=measure, args=(method, args.locks, args.owners, args.spread, child_end))
    child.start()
    result = parent_end.recv()
    child.join()
    return result


def server_process(args) -> tuple[int, int, int]:
    """
    RSS growth of a real jesync server while C{args.connections} connections
    hold C{args.locks} locks between them; returns (idle RSS, RSS with the
    locks held, RSS once they are all released).
    """
    from loadgen import start_jesync  # benchmarks/ is on sys.path when run as a script

    per_connection = args.locks // args.connections
    batch = 1000
    with tempfile.TemporaryDirectory(prefix="jesync-memory-") as tmp:
        server = start_jesync(Path(tmp), None, checkout=args.checkout.resolve(), python=args.python)
        try:
            conns = [socket.create_connection(server.address) for _ in range(args.connections)]
            time.sleep(0.5)
            idle = rss_bytes(server.pid)
            for c, conn in enumerate(conns):
                for start in range(0, per_connection, batch):
                    count = min(batch, per_connection - start)
                    conn.sendall(
                        b"".join(
                            b"lock %s\n" % make_key(c * per_connection + start + i).encode()
                            for i in range(count)
                        )
                    )
                    replies = b""
                    while replies.count(b"\n") < count:
                        replies += conn.recv(1 << 20)
                    if not replies.startswith(b"GRANTED 1 0 "):
                        raise SystemExit(f"unexpected reply: {replies[:80]!r}")
            time.sleep(0.5)
            held = rss_bytes(server.pid)
            for conn in conns:
                conn.close()
            time.sleep(2)
            released = rss_bytes(server.pid)
        finally:
            server.stop()
    return idle, held, released


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locks", type=int, default=1_000_000, help="locks held (default 1,000,000)")
    parser.add_argument("--owners", type=int, default=1000, help="owner objects (default 1000)")
    parser.add_argument(
        "--spread",
        type=float,
        default=0.0,
        help="seconds the clock advances while the locks are taken, spreading the "
        "expiries over that many 10 ms buckets (default 0: one bucket; at most 119)",
    )
    parser.add_argument(
        "--server-process", action="store_true", help="also measure a real server's RSS, locks taken over TCP"
    )
    parser.add_argument("--connections", type=int, default=100, help="connections for --server-process")
    parser.add_argument("--server-only", action="store_true", help="only the real server (implies --server-process)")
    parser.add_argument("--checkout", type=Path, default=REPO, help="the jesync checkout the server runs (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="the Python whose twistd runs the server (default: this one)")
    args = parser.parse_args(argv)
    args.server_process = args.server_process or args.server_only
    if not 0 <= args.spread < 120:
        parser.error("--spread must be in [0, 120): every grant must still be live")

    n = args.locks
    print(
        f"python {sys.version.split()[0]}, {n:,} locks on distinct {len(make_key(0))}-character keys, "
        f"{args.owners} owners, expires=120, expiries spread over {args.spread:g} s"
    )
    if not args.server_only:
        print()
        print("| method | keys only | everything, keys included | per lock | target <= 400 B |")
        print("|---|---|---|---|---|")
    for method in () if args.server_only else ("tracemalloc", "rss"):
        keys_only, total, buckets = in_process(method, args)
        print(
            f"| in-process, {method} | {keys_only / n:.0f} B/lock | {total / 2**20:,.0f} MiB "
            f"| {total / n:.0f} B | {'met' if total / n <= TARGET_BYTES else 'MISSED'} |"
        )
    if not args.server_only:
        print(f"\n(the expiry queue held {buckets:,} bucket(s))")
    if args.server_process:
        idle, held, released = server_process(args)
        per_lock = (held - idle) / n
        print()
        print(f"server process ({args.python}, {args.checkout}), {args.connections} connections x {n // args.connections:,} locks over TCP:")
        print(
            f"  RSS idle {idle / 2**20:.0f} MiB, holding {held / 2**20:.0f} MiB, "
            f"after all connections closed {released / 2**20:.0f} MiB"
        )
        print(
            f"  {per_lock:.0f} B per held lock, keys included: "
            f"target {'met' if per_lock <= TARGET_BYTES else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
