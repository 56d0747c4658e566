"""
Release -> grant handoff cost against the length of a key's wait queue.

One key, one holder and N waiters (all with the default max_concurrent=1) on
a L{LockService} driven by a L{twisted.internet.task.Clock}.  Each step the
holder releases, which grants the lock to the head of the queue, and then
asks again, joining the tail, so the queue stays exactly N long.  If a
release scanned the queue, the cost per step would grow with N; it should be
flat.  Reported per N: the release call alone (which includes granting the
next waiter and firing its Deferred) and the whole step (release + re-queue).

    python benchmarks/handoff.py
    python benchmarks/handoff.py --sizes 100 1000 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout's jesync, not an installed copy

from twisted.internet.task import Clock

from jesync.service import Grant, LockService

KEY = "hot"


class Owner:
    """Stands in for a connection."""

    __slots__ = ("__weakref__", "name")

    def __init__(self, name: int) -> None:
        self.name = name


def rotate(waiters: int, steps: int) -> tuple[float, float]:
    """
    Build a queue of C{waiters} behind one holder, run C{steps} handoffs,
    and return (ns per release, ns per step).
    """
    service = LockService(Clock())
    owners = [Owner(i) for i in range(waiters + 1)]
    holder: list[Owner] = []

    def on_grant(grant: Grant) -> None:
        holder.append(grant.owner)

    for owner in owners:
        service.acquire(KEY, owner).addCallback(on_grant)
    assert holder == [owners[0]] and service.status(KEY).waiting == waiters

    clock = time.perf_counter_ns
    releasing = 0
    start = clock()
    for _ in range(steps):
        current = holder[-1]
        before = clock()
        service.release(KEY, current)
        releasing += clock() - before
        service.acquire(KEY, current).addCallback(on_grant)
    total = clock() - start

    # FIFO: after `steps` handoffs, owner number `steps mod (N + 1)` holds the key.
    assert holder[-1] is owners[steps % (waiters + 1)], "the queue was not served in order"
    assert len(holder) == steps + 1 and service.status(KEY).waiting == waiters
    return releasing / steps, total / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[100, 1000, 10_000, 100_000],
        help="queue lengths (default 100 1000 10000 100000)",
    )
    parser.add_argument("--steps", type=int, default=20_000, help="handoffs per run (default 20,000)")
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per size; median and best shown (default 5)"
    )
    parser.add_argument("--gc", action="store_true", help="leave the garbage collector on while timing")
    args = parser.parse_args(argv)

    print(
        f"python {sys.version.split()[0]}, {args.steps:,} handoffs per run, {args.repeat} runs per size, "
        f"gc {'on' if args.gc else 'off'} while timing"
    )
    print()
    print("| waiters | release -> grant, median | best | whole step (release + re-queue), median | best |")
    print("|---|---|---|---|---|")
    medians = []
    for size in args.sizes:
        runs = []
        for _ in range(args.repeat):
            gc.collect()
            if not args.gc:
                gc.disable()
            try:
                runs.append(rotate(size, args.steps))
            finally:
                gc.enable()
        release = [r[0] / 1000 for r in runs]
        step = [r[1] / 1000 for r in runs]
        medians.append(statistics.median(release))
        print(
            f"| {size:,} | {statistics.median(release):.2f} µs | {min(release):.2f} µs "
            f"| {statistics.median(step):.2f} µs | {min(step):.2f} µs |"
        )
    print()
    print(
        f"largest / smallest queue, median release -> grant: {medians[-1] / medians[0]:.2f}x "
        f"(flat: constant-time handoff)"
    )


if __name__ == "__main__":
    main()
