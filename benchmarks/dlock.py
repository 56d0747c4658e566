"""
Closed-loop dlock load generator: jesync's dlock listener against the
reference server (temoto/dlock's ``dlock-server``, Go), over loopback.

Each of N connections (default scenarios 1 and 64; ``--scenario N``,
repeatable) sends one request, waits for its response, sends the next; a
*cycle* is one pass through a workload's requests.  Every connection has
its own keys (no contention).  The workloads:

``Ping``
    one ``Ping`` round trip: pure protocol overhead (framing, protocol
    buffers, the event loop or goroutines), no lock table.  Both servers.
``Lock+Unlock``
    ``Lock [k]`` then ``Unlock [k]``: a free key taken and freed again, two
    round trips.  Both servers (the comparison that matters).
``Lock4+Unlock4``
    the same with four keys per request (``Lock [k.a, k.b, k.c, k.d]``,
    ``Unlock`` of the four), against ``Lock+Unlock`` for the cost of a
    multi-key request.  Both servers.
``JESync lock+release``
    jesync's own text protocol on the same server process (``lock k`` /
    ``release k``, through ``loadgen.py``'s loop): protocol buffers against
    lines for the same lock work.

Why Lock+Unlock is not the same request on both servers.  The reference's
``Unlock`` only removes locks whose ``release_micro`` time has *passed*
(``releaseKeys`` with the Unlock's read time: ``unsafeTouchKey`` deletes a
lock with a non-zero ``Expires`` at or before it, and never one held until
disconnect), so ``Lock [k]`` (release_micro 0) + ``Unlock [k]`` leaves k held
there and the next ``Lock [k]`` is only a renewal by the same client, not an
acquisition.  The alternatives are worse: a fresh key per cycle makes the
reference's per-client key list (searched linearly by ``stringListFind``) and
jesync's ``--max-held`` grow with the run, and reconnecting to release
measures TCP set-up.  So for the reference the ``Lock`` carries
``release_micro`` 1 (1 µs): by the time the ``Unlock`` arrives, a loopback
round trip later, the lock has expired and that ``Unlock`` deletes it -- the
same work as jesync's ``Lock`` (release_micro 0) + ``Unlock``: find the key
free, take it, answer; find it held, free it, answer.  (jesync is not sent
release_micro 1: it would expire the grant by a timer within the round trip,
so its ``Unlock`` would find nothing to do.)  The reference also forgets a
client once its last key is gone (every later ``Lock`` on that connection
fails with ``LockWaitAbort``; docs/protocols/dlock.md lists this bug), so each
connection of a lock workload first takes an *anchor* key it keeps, on
both servers alike.  Before measuring, a self-test runs each lock workload's
cycle once on each server and checks that another connection can then take
the keys at once, i.e. that the cycle really released them.

Reported per server and scenario (median over rounds, as in loadgen.py):
cycles/s, p50/p99 cycle latency, the server process's CPU time per cycle
(from /proc: the figure least disturbed by other load), the load
generator's CPU and the rest of the machine's (noise), and the ratio of
cycles/s and of CPU/cycle to the reference's run of the same workload in the
same round (or, with no reference server, to jesync's JESync lock+release),
the median of the per-round ratios.  Below the table: jesync's multi-key
cost (Lock4 / Lock) and protobuf against lines (dlock Lock+Unlock / JESync
lock+release), also per round.

Each round runs every (server, workload) pair of one scenario back to back,
in alternating order from round to round.  ``--max-noise CORES`` works as in
loadgen.py: wait (at most ``--wait-quiet`` s) for a quiet second before each
round, leave out runs during which the rest of the machine used more than
CORES of a core, compute each ratio over the rounds in which both its runs
were quiet, and run extra rounds (at most ``--extra-rounds``) until each has
``--repeat`` -- except that once the machine has not gone quiet before a
round, no further extra rounds are tried for that scenario (a machine that
stays busy would only make the run longer).  Rows whose runs were all noisy
are marked so.

    python benchmarks/dlock.py                              # ~3 min: 1 and 64 connections, 3 rounds of 3 s
    python benchmarks/dlock.py --repeat 3 --seconds 3 --max-noise 0.3
    python benchmarks/dlock.py --scenario 16 --workload lock --reference /path/to/dlock-server

The reference is ``/tmp/dlock-server`` unless ``--reference PATH`` says
otherwise; when there is no such file it is skipped, with a message.  To
build it (from github.com/temoto/dlock; not part of this repository)::

    apt-get install -y golang-go golang-github-golang-protobuf-1-3-dev
    # the source in /tmp/dlockgo/src/github.com/temoto/dlock, then there:
    GO111MODULE=off GOPATH=/tmp/dlockgo:/usr/share/gocode go build -o /tmp/dlock-server ./dlock-server

Both servers are started on free 127.0.0.1 ports and stopped at the end:
jesync as ``twistd -n jesync --port ... --dlock-port ...`` of this checkout
with the ``twistd`` next to this Python, the reference as ``dlock-server
-bind 127.0.0.1:PORT`` (its defaults: GOMAXPROCS = the CPUs, 60 s idle
timeout).  The clients are raw non-blocking sockets on one epoll per
load-generator process (``--procs``), the messages jesync's generated
``dlock_pb2``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import closedloop  # noqa: E402
from closedloop import DONE, Tally, connect, run_closed_loop  # noqa: E402
from loadgen import (  # noqa: E402
    BACKLOG,
    REPO,
    ProtocolError,
    Result,
    Server,
    fmt_cpu,
    fmt_us,
    free_port,
    label,
    median_result,
    pair_ratio,
    pin_cpus,
    raise_open_files,
    run_rounds,
    run_scenario,
    run_workers,
    start_jesync,
    wait_for_port,
)

sys.path.insert(0, str(REPO))
from jesync.protocols.dlock_pb2 import Lock, Ok, Ping, Request, Response, Unlock  # noqa: E402

DEFAULT_REFERENCE = Path("/tmp/dlock-server")
#: Workloads: name -> its label in the table.
WORKLOADS = {
    "ping": "Ping",
    "lock": "Lock+Unlock",
    "lock4": "Lock4+Unlock4",
    "lines": "lock+release",  # JESync's text protocol
}
#: The reference's Lock lasts this long (µs), so that its Unlock frees it (module docstring).
REFERENCE_RELEASE_MICRO = 1
API_VERSION = 2


# -- messages ----------------------------------------------------------------------


def frame(kind: Any, request_id: int, keys: tuple[str, ...] = (), release_micro: int = 0, wait_micro: int = 0) -> bytes:
    """One Request, encoded and length-prefixed."""
    request = Request(version=API_VERSION, id=request_id, type=kind)
    if keys:
        request.lock.keys.extend(keys)
        request.lock.release_micro = release_micro
        request.lock.wait_micro = wait_micro
    body = request.SerializeToString()
    return len(body).to_bytes(4, "big") + body


def conversation(workload: str, reference: bool, tag: str, index: int) -> tuple[list[bytes], list[bytes], tuple[str, ...]]:
    """
    A connection's (set-up requests, cycle requests, cycle keys) for a dlock
    workload.  Request ids are the step numbers from 1, checked in each
    response; the set-up's are 1000 and up.
    """
    if workload == "ping":
        return [], [frame(Ping, 1)], ()
    base = f"b-{tag}-{index}"
    keys = (base,) if workload == "lock" else tuple(f"{base}.{c}" for c in "abcd")
    release = REFERENCE_RELEASE_MICRO if reference else 0
    setup = [frame(Lock, 1000, (f"{base}.anchor",))]
    return setup, [frame(Lock, 1, keys, release), frame(Unlock, 2, keys)], keys


def read_frame(sock: socket.socket) -> Response:
    """One response, blocking (set-up and self-test only)."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ProtocolError("the server closed the connection")
            data += chunk
        return data

    return Response.FromString(exactly(int.from_bytes(exactly(4), "big")))


def call(sock: socket.socket, request: bytes, expected_id: int | None = None) -> Response:
    sock.sendall(request)
    response = read_frame(sock)
    if response.status != Ok or (expected_id is not None and response.request_id != expected_id):
        raise ProtocolError(f"unexpected response {response!r}".replace("\n", " "))
    return response


def self_test(address: tuple[str, int], workload: str, reference: bool) -> None:
    """
    One cycle of a lock workload on one connection, then a second connection
    locks the same keys without waiting long: it must get them at once, or
    the cycle did not release them.
    """
    tag = f"selftest-{workload}-{os.getpid()}"
    setup, steps, keys = conversation(workload, reference, tag, 0)
    with socket.create_connection(address) as first, socket.create_connection(address) as second:
        for request in setup:
            call(first, request)
        for number, request in enumerate(steps, 1):
            call(first, request, number)
        second.sendall(frame(Lock, 7, keys, 0, wait_micro=300_000))
        response = read_frame(second)
        if response.status != Ok:
            raise SystemExit(
                f"self-test: after one {WORKLOADS[workload]} cycle the keys {keys} were not free "
                f"({'reference' if reference else 'jesync'}): {str(response).strip()!r}"
            )


# -- one load-generator process ----------------------------------------------------


class Conn(closedloop.Conn):
    __slots__ = ("step", "steps")

    def __init__(self, sock: socket.socket, steps: list[bytes], tally: Tally) -> None:
        super().__init__(sock, steps[0], tally)
        self.steps = steps
        self.step = 0


parse_response = Response.FromString


def dlock_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """
    closedloop's reply handler for dlock's framing (a 4-byte big-endian
    length, then a Response): the response must be Ok and answer the step
    out; after the last step the cycle is done.
    """
    if len(buffer) < 4:
        return None
    size = int.from_bytes(buffer[:4], "big") + 4
    if len(buffer) < size:
        return None
    response = parse_response(buffer[4:size])
    step = conn.step + 1
    if response.status != Ok or response.request_id != step:
        raise ProtocolError(f"unexpected response {response!r}".replace("\n", " "))
    if step == len(conn.steps):
        conn.step = 0
        return size, conn.steps[0], DONE
    conn.step = step
    return size, conn.steps[step], 0


def dlock_worker(address, workload: str, reference: bool, tag: str, indices: list[int], warmup, seconds, cpus, pipe) -> None:
    """
    loadgen.run_worker for dlock's framing: connect, run each connection's
    set-up, then closedloop's loop; sends back (cycles, latencies in ns, 0
    retries, CPU seconds) for the window.
    """

    def open_conns(tally: Tally) -> list[Conn]:
        conns = []
        for index in indices:
            sock = connect(address)
            setup, steps, _ = conversation(workload, reference, tag, index)
            for request in setup:
                call(sock, request)
            conns.append(Conn(sock, steps, tally))
        return conns

    run_closed_loop(cpus, open_conns, dlock_reply, warmup, seconds, pipe)


def run_dlock(server: Server, workload: str, reference: bool, connections: int, args, tag: str) -> Result:
    """loadgen.run_scenario for a dlock workload (the same timing and CPU accounting)."""
    procs = max(1, min(args.procs, connections))
    indices = list(range(connections))

    def worker(index: int, pipe) -> tuple:
        share = indices[index::procs]
        return dlock_worker, (server.address, workload, reference, tag, share, args.warmup, args.seconds, args.client_cpus, pipe)

    return run_workers(server, procs, worker, args)


# -- servers -----------------------------------------------------------------------


def start_reference(tmp: Path, path: Path, cpus: set[int] | None) -> Server:
    port = free_port()
    log = tmp / "dlock-reference.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(path), "-bind", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=None if not cpus else (lambda: os.sched_setaffinity(0, cpus)),
        )
    return Server("reference", ("127.0.0.1", port), process, log, protocol="dlock").listening()


# -- rounds and the report ---------------------------------------------------------

# A run is (server, workload); its label keys a round's results.
SERVER_LABELS = {"jesync": "jesync dlock", "reference": "reference dlock", "lines": "jesync JESync"}


def plan(workloads: list[str], with_reference: bool) -> list[tuple[str, str]]:
    """The runs of one round, in order: each reference run next to jesync's of the same workload."""
    runs = []
    for workload in workloads:
        if workload == "lines":
            runs.append(("lines", "lines"))
            continue
        runs.append(("jesync", workload))
        if with_reference:
            runs.append(("reference", workload))
    return runs


def baseline(run: tuple[str, str], runs: list[tuple[str, str]]) -> tuple[str, str] | None:
    """What a run's ratio is to: the reference's run of its workload (JESync: of Lock+Unlock), else JESync's."""
    server, workload = run
    reference = ("reference", "lock" if workload == "lines" else workload)
    if reference in runs:
        return reference
    return ("lines", "lines") if ("lines", "lines") in runs else None


def derived_pairs(runs: list[tuple[str, str]]) -> list[tuple[tuple[str, str], tuple[str, str], str]]:
    """The within-server ratios printed below the table."""
    pairs = []
    for server in ("jesync", "reference"):
        if (server, "lock4") in runs and (server, "lock") in runs:
            pairs.append(((server, "lock4"), (server, "lock"), f"{SERVER_LABELS[server]}: 4-key / 1-key Lock+Unlock"))
    if ("jesync", "lock") in runs and ("lines", "lines") in runs:
        pairs.append((("jesync", "lock"), ("lines", "lines"), "jesync: dlock Lock+Unlock / JESync lock+release"))
    if ("jesync", "ping") in runs and ("jesync", "lock") in runs:
        pairs.append((("jesync", "ping"), ("jesync", "lock"), "jesync dlock: Ping / Lock+Unlock"))
    return pairs


def all_pairs(runs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    pairs = []
    for run in runs:
        base = baseline(run, runs)
        if base is not None and base != run:
            pairs.append((label(*run), label(*base)))
    pairs += [(label(*a), label(*b)) for a, b, _ in derived_pairs(runs)]
    return pairs or [(label(*runs[0]), label(*runs[0]))]


def report(results: dict[int, list[dict[str, Result]]], runs: list[tuple[str, str]], args) -> None:
    print()
    rounds_text = "/".join(sorted({str(len(r)) for r in results.values()}))
    has_reference = any(server == "reference" for server, _ in runs)
    ratio_to = "reference" if has_reference else "JESync"
    print(
        f"{rounds_text} round(s) per scenario, {args.seconds:g} s each after {args.warmup:g} s warm-up, "
        f"{args.procs} load-generator process(es).  Per row: the run with the median cycles/s"
        + (f" among those with at most {fmt_cpu(args.max_noise)} other CPU" if args.max_noise is not None else "")
        + ".  A cycle: Ping = 1 round trip, the others 2.  CPU = share of one core (other: the rest of the "
        "machine, i.e. noise).  Ratios: the median over rounds of this run / "
        + ("the reference's run of the same workload" if has_reference else "jesync's JESync lock+release run")
        + " in the same round"
        + (" (JESync rows: / the reference's Lock+Unlock)" if has_reference else "")
        + (", over the rounds where both were quiet; * = no such round, all rounds used" if args.max_noise is not None else "")
        + "."
    )
    print()
    print(
        f"| server | scenario | {'quiet runs' if args.max_noise is not None else 'runs'} | cycles/s | p50 µs | p99 µs | server CPU µs/cycle | server CPU "
        f"| loadgen CPU | other CPU | cycles/s ÷ {ratio_to} | CPU/cycle ÷ {ratio_to} |"
    )
    print("|" + "---|" * 12)
    for n, rounds in results.items():
        for run in runs:
            name = label(*run)
            measured = [r[name] for r in rounds]
            quiet = [m for m in measured if args.max_noise is None or m.other_cpu <= args.max_noise]
            r = median_result(quiet or measured)
            used = f"{len(quiet)} of {len(measured)}" if quiet else f"0 of {len(measured)} (noisy)"
            if args.max_noise is None:
                used = str(len(measured))
            base = baseline(run, runs)
            if base is None:
                cells = ["-", "-"]
            else:
                cells = []
                for measure in (lambda x: x.cycles_per_second, lambda x: x.server_us_per_cycle):
                    value, note = pair_ratio(rounds, name, label(*base), measure, args.max_noise)
                    cells.append("-" if value is None else f"{value:.2f}{note}")
            print(
                f"| {SERVER_LABELS[run[0]]} | {WORKLOADS[run[1]]} x{n} | {used} | {r.cycles_per_second:,.0f} "
                f"| {r.p50_us:,.0f} | {r.p99_us:,.0f} | {fmt_us(r.server_us_per_cycle)} | {fmt_cpu(r.server_cpu)} "
                f"| {fmt_cpu(r.loadgen_cpu)} | {fmt_cpu(r.other_cpu)} | {cells[0]} | {cells[1]} |"
            )
    pairs = derived_pairs(runs)
    if pairs:
        print()
        print("Within a server, median over rounds of each round's ratio (cycles/s, server CPU/cycle):")
        for n, rounds in results.items():
            for a, b, text in pairs:
                cps, note1 = pair_ratio(rounds, label(*a), label(*b), lambda x: x.cycles_per_second, args.max_noise)
                cpu, note2 = pair_ratio(rounds, label(*a), label(*b), lambda x: x.server_us_per_cycle, args.max_noise)
                print(
                    f"  x{n} {text}: cycles/s " + ("-" if cps is None else f"{cps:.2f}{note1}")
                    + ", CPU/cycle " + ("-" if cpu is None else f"{cpu:.2f}{note2}")
                )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each (default 0.5)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per scenario (default 3); medians are reported")
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes (default 1)")
    parser.add_argument(
        "--scenario",
        type=int,
        action="append",
        metavar="N",
        help="N connections, each with its own keys; repeatable (default: 1 and 64)",
    )
    parser.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        action="append",
        help="run only these workloads (repeatable; default all: " + ", ".join(WORKLOADS) + ")",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help=f"the reference dlock-server binary (default {DEFAULT_REFERENCE}, skipped if missing)",
    )
    parser.add_argument("--no-reference", action="store_true", help="skip the reference server")
    parser.add_argument("--max-noise", type=float, metavar="CORES", help="as loadgen.py's (see the description)")
    parser.add_argument(
        "--wait-quiet", type=float, default=15.0, help="with --max-noise: seconds to wait for quiet (default 15)"
    )
    parser.add_argument(
        "--extra-rounds", type=int, default=None, help="with --max-noise: at most this many more rounds (default --repeat)"
    )
    parser.add_argument(
        "--pin",
        choices=["split", "one"],
        help="split: servers on the first CPU, load generator on the others; one: everything on the first CPU",
    )
    args = parser.parse_args(argv)
    pin_cpus(parser, args)
    if args.extra_rounds is None:
        args.extra_rounds = args.repeat if args.max_noise is not None else 0
    scenarios = list(dict.fromkeys(args.scenario or [1, 64]))
    if min(scenarios) < 1:
        parser.error("--scenario N needs N >= 1")
    workloads = [w for w in WORKLOADS if w in (args.workload or WORKLOADS)]
    reference_path = args.reference or DEFAULT_REFERENCE
    if args.reference is not None and not args.reference.is_file():
        parser.error(f"--reference {args.reference}: no such file")

    most = max(scenarios)
    print(f"nproc {os.cpu_count()}, python {sys.version.split()[0]}", end="")
    raise_open_files(2 * most + 1000)
    jesync_options = ["--dlock-port", f"tcp:{free_port()}:interface=127.0.0.1:backlog={BACKLOG}"]
    if most > 256:
        jesync_options += ["--max-connections", "0"]
    with tempfile.TemporaryDirectory(prefix="jesync-dlock-bench-") as tmp:
        servers: dict[str, Server] = {}
        try:
            jesync = start_jesync(Path(tmp), None, args.server_cpus, options=tuple(jesync_options))
            servers["lines"] = jesync  # the JESync listener
            dlock_port = int(jesync_options[1].split(":")[1])
            servers["jesync"] = Server("jesync", ("127.0.0.1", dlock_port), jesync.process, jesync.log, "dlock")
            assert jesync.log is not None
            wait_for_port(servers["jesync"].address, jesync.process, jesync.log)
            print(f", jesync pid {jesync.pid} (JESync port {jesync.address[1]}, dlock port {dlock_port})", end="")
            if args.no_reference:
                pass
            elif not reference_path.is_file():
                print(f"\nno reference dlock server at {reference_path}: skipping it (see --help to build it)", end="")
            else:
                servers["reference"] = start_reference(Path(tmp), reference_path, args.server_cpus)
                print(f", reference {reference_path} pid {servers['reference'].pid}", end="")
            print(flush=True)
            runs = [(s, w) for s, w in plan(workloads, "reference" in servers)]
            for server, workload in runs:
                if workload in ("lock", "lock4"):
                    self_test(servers[server].address, workload, server == "reference")
            pairs = all_pairs(runs)

            def measure(server: str, workload: str, n: int, attempt: int) -> Result:
                tag = f"{workload}{n}r{attempt}"
                if workload == "lines":
                    return run_scenario(servers["lines"], "uncontended", n, args, tag=tag)
                return run_dlock(servers[server], workload, server == "reference", n, args, tag)

            results = run_rounds(
                scenarios,
                runs,
                pairs,
                measure,
                lambda server, workload: f"{SERVER_LABELS[server]} {WORKLOADS[workload]}",
                args,
            )
        finally:
            stopped = set()
            for target in servers.values():  # the two jesync entries share one process
                if id(target.process) not in stopped:
                    stopped.add(id(target.process))
                    target.stop()
    report(results, runs, args)


if __name__ == "__main__":
    main()
