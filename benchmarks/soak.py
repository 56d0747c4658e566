"""
Soak: storms of clients that connect, lock, wait, release, drop and quit,
against a real C{twistd jesync}, for minutes (C{--quick}) or an hour.

Each round, C{--clients} connections open at once; each runs a random
script over a small key space (so keys are contended): locks with random
C{max_concurrent}, timeouts and expiries, renewals, releases, status and
listing requests, and then ends in one of three ways: C{quit}, a clean
close, or an abort (RST) while it may still hold and wait.  Between rounds
the server must be back to an empty table.  At the end the script checks,
through the protocol, that no lock is held or waited for, and compares the
server's RSS with its baseline (taken after a warm-up round, once the
interpreter's pools have grown).

    python benchmarks/soak.py --quick            # ~1 minute
    python benchmarks/soak.py --minutes 60

Only 127.0.0.1 is ever targeted; the server is stopped at the end.  Exit
status 0 if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import start_jesync  # noqa: E402
from memory import rss_bytes  # noqa: E402

KEYS = [f"soak-{n}".encode() for n in range(40)]
# A client that has not heard back in this long has found a server bug.
REPLY_TIMEOUT = 30.0


async def client(address: tuple[str, int], rng: random.Random, stats: dict[str, int]) -> None:
    """One connection's random script, ending in quit, a close or an abort."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        for _ in range(rng.randint(1, 12)):
            key = rng.choice(KEYS)
            action = rng.random()
            if action < 0.55:
                timeout = rng.choice([0, 0, 1, 2, -1])
                expires = rng.choice([0, 1, 3, 120])
                writer.write(b"lock %s %d %d %d\n" % (key, rng.randint(1, 3), timeout, expires))
                stats["locks"] += 1
                if timeout == -1:
                    # Leave while it may still wait, and the server must cancel
                    # it (waiting here could deadlock two clients for ever).
                    break
                line = await asyncio.wait_for(reader.readline(), REPLY_TIMEOUT)
                stats["granted" if line.startswith(b"GRANTED") else "timed out"] += 1
            elif action < 0.75:
                writer.write(b"release %s\n" % key)
                await asyncio.wait_for(reader.readline(), REPLY_TIMEOUT)
            elif action < 0.9:
                writer.write(b"status %s\n" % key)
                await asyncio.wait_for(reader.readline(), REPLY_TIMEOUT)
            else:
                writer.write(b"status-by-requests\n")
                while (await asyncio.wait_for(reader.readline(), REPLY_TIMEOUT)) != b"END\n":
                    pass
        ending = rng.random()
        if ending < 0.3:
            writer.write(b"quit\n")
            stats["quit"] += 1
        elif ending < 0.6:
            writer.transport.abort()
            stats["aborted"] += 1
            return
        else:
            stats["closed"] += 1
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def table(address: tuple[str, int]) -> list[bytes]:
    """The server's listing: every key in use (empty when nothing is held or waited for)."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(b"status-by-key\n")
    rows = []
    while (line := await asyncio.wait_for(reader.readline(), REPLY_TIMEOUT)) != b"END\n":
        rows.append(line)
    writer.close()
    await writer.wait_closed()
    return rows


async def settle(address: tuple[str, int], within: float) -> list[bytes]:
    """The listing once the server has caught up with the closes (bounded)."""
    deadline = time.monotonic() + within
    while (rows := await table(address)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return rows


async def soak(address: tuple[str, int], pid: int, args) -> bool:
    rng = random.Random(args.seed)
    stats = {key: 0 for key in ["rounds", "connections", "locks", "granted", "timed out", "quit", "closed", "aborted"]}
    # Warm-up round, then the baseline.
    await asyncio.gather(*(client(address, rng, stats) for _ in range(args.clients)))
    await settle(address, 10)
    baseline = rss_bytes(pid)
    peak = baseline
    started = time.monotonic()
    ok = True
    while time.monotonic() - started < args.minutes * 60:
        await asyncio.gather(*(client(address, rng, stats) for _ in range(args.clients)))
        peak = max(peak, rss_bytes(pid))
        stats["rounds"] += 1
        stats["connections"] += args.clients
        left = await settle(address, 10)
        if left:
            print(f"round {stats['rounds']}: keys still in use after every client left: {left[:5]}")
            ok = False
            break
    elapsed = time.monotonic() - started
    final = rss_bytes(pid)
    growth = final - baseline
    memory_ok = growth <= max(args.tolerance_mib * 2**20, 0.05 * baseline)
    print(
        f"{stats['rounds']} rounds in {elapsed:.0f} s: {stats['connections']:,} connections "
        f"({stats['connections'] / elapsed:,.0f}/s), {stats['locks']:,} lock requests "
        f"({stats['granted']:,} answered GRANTED, {stats['timed out']:,} TIMEOUT, the rest left waiting), "
        f"endings: {stats['quit']:,} quit, {stats['closed']:,} closed, {stats['aborted']:,} aborted"
    )
    print(f"locks left held or waited for at the end: {len(await table(address))} (must be 0)")
    print(
        f"server RSS: baseline {baseline / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB, "
        f"end {final / 2**20:.1f} MiB ({growth / 2**20:+.1f} MiB): "
        + ("back to baseline" if memory_ok else "DID NOT RETURN TO BASELINE")
    )
    return ok and memory_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long to churn (default 60)")
    parser.add_argument("--quick", action="store_true", help="one minute")
    parser.add_argument("--clients", type=int, default=200, help="connections per storm (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--tolerance-mib", type=float, default=4.0, help="RSS growth still counted as back to baseline (or 5%%)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes = 1.0
    with tempfile.TemporaryDirectory(prefix="jesync-soak-") as tmp:
        server = start_jesync(Path(tmp), profile=None)
        try:
            ok = asyncio.run(soak(server.address, server.pid, args))
        finally:
            server.stop()
    print("soak: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
