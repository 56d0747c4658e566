"""
A leader on an etcd that is slow on every request: every answer etcd sends
comes L{DELAY} (0.5 s) late, yet the member becomes leader, answers elock's
durable lock/unlock one after another, and keeps leading (issue 27).

The member is C{twistd jesync --etcd ... --lease-ttl 5}, its only etcd
endpoint a TCP proxy of this test's (L{DelayingProxy}, in threads of the
test's process, on loopback) that forwards what the member sends at once
and every chunk etcd sends back L{DELAY} seconds after it came (each chunk
on its own schedule: a chunk is not also held up by the ones before it, so
an answer arrives L{DELAY} late, not later).  A request still reaches etcd
at once, so an attempt the member gives up on may be applied all the same:
the retries this test provokes are the ones jesync.cluster.etcd says are
safe.

Why these numbers (jesync.cluster.etcd's rules; TTL 5 gives a request a
4 s window, C{Timing(5).certainty}):
 - Until etcd has been learned slow, an attempt waits 0.4 s and is given
   up, but a request's last attempt takes what is left when less than two
   attempts' worth is: after eight 0.4 s attempts about 0.8 s.  So a delay
   must stay under that for any request to be answered: 0.5 s is.  Each
   of those first requests takes about 3.7 s.  (At TTL 3, 2.25 s, that
   last attempt gets 0.65 s: 0.5 s is learned there too, with little to
   spare on a loaded machine.  No TTL lets it get 0.8 s or more: the
   largest delay a member sustains is just under 0.8 s.  At TTL 5, 0.7
   and 0.75 s pass here; at 0.8 s the last attempt gets 0.785 s, no
   request is ever answered, and the member never leads.)
 - Once the last 8 answers all took over 0.1 s, an attempt may take 4
   times the fastest (2 s, capped at half the window, 2 s): every request
   is then answered at its first attempt, in about 0.5 s.
 - A leader keeps its lease with a keep-alive every TTL/3 (1.7 s) and
   steps down when none has been answered for the certainty window (4 s):
   answered in 0.5 s, a keep-alive keeps it with room to spare.  Before
   etcd is learned slow (3.7 s per answer), a term can lapse: the member
   may step down while it learns (allowed), but not once it leads with
   etcd learned, which is what this test holds it to.
 - Becoming leader: the member's first requests (lease, campaign, the
   journal's reads and first write) each take up to the 4 s window until
   8 answers are in, and a term that lapsed meanwhile is campaigned for
   again after a second: about 30 s measured, twice stepping down on the
   way; L{LEAD_WITHIN} (60 s) bounds it.  It is printed (stderr) each run.

Every wait is bounded and on an event (the member's /health, a reply); the
10 s of traffic (L{TRAFFIC}) is lock/unlock after lock/unlock, each reply
checked, as long as it lasts.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
import unittest
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from tests.cluster import MemberProcess
from tests.etcd_server import require_etcd, shared_etcd
from tests.servers import free_port

#: Seconds every chunk etcd sends back is held by the proxy (C{JESYNC_SLOW_ETCD_DELAY}, default 0.5).
DELAY = float(os.environ.get("JESYNC_SLOW_ETCD_DELAY", "0.5"))
#: The member's lease TTL (see the module docstring).
TTL = 5
#: The most the member may take to lead and serve, once its /health answers: 8 answers at up to the
#: 4 s window each before etcd is learned slow (32 s; about 30 s measured), a 1 s wait before each
#: campaign after a term that lapsed meanwhile, then a few 0.5 s requests: 60 s, room for a loaded machine.
LEAD_WITHIN = 60.0
#: Seconds of elock traffic the leader must ride out without stepping down.
TRAFFIC = 10.0
#: How long one elock reply may take: a durable write waits for one etcd transaction, answered within the 4 s
#: window (measured: 1 s, the journal's first try on its lean path, jesync.cluster.txn_channel, being given
#: up at its fixed 0.5 s, and the transaction sent again through the etcd client, which has learned etcd slow).
REPLY_WITHIN = 4.0
#: lock/unlock cycles answered in a row before the long run.
IN_A_ROW = 5


class _Pipe:
    """One proxied connection: member to etcd at once; etcd to member each chunk C{delay} s after it came."""

    def __init__(self, downstream: socket.socket, upstream: socket.socket, delay: float, proxy: DelayingProxy):
        self.downstream, self.upstream, self.delay, self.proxy = downstream, upstream, delay, proxy
        self.held: queue.Queue[Tuple[float, Optional[bytes]]] = queue.Queue()
        for target in (self._forward, self._hold, self._deliver):
            threading.Thread(target=target, daemon=True).start()

    def _forward(self) -> None:
        try:
            while True:
                data = self.downstream.recv(65536)
                if not data:
                    break
                self.upstream.sendall(data)
        except OSError:
            pass
        self.close()

    def _hold(self) -> None:
        try:
            while True:
                data = self.upstream.recv(65536)
                if not data:
                    break
                self.held.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        self.held.put((time.monotonic() + self.delay, None))

    def _deliver(self) -> None:
        try:
            while True:
                due, data = self.held.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # (the delay itself: what this proxy is for)
                if data is None:
                    break
                self.downstream.sendall(data)
                self.proxy.delivered()
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        for sock in (self.downstream, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class DelayingProxy:
    """A TCP proxy on 127.0.0.1 to C{target} (host, port) that delays what the target sends (L{_Pipe})."""

    def __init__(self, target: Tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pipes: List[_Pipe] = []
        self.chunks = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def delivered(self) -> None:
        with self._lock:
            self.chunks += 1

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                downstream.close()
                continue
            for sock in (downstream, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.pipes.append(_Pipe(downstream, upstream, self.delay, self))

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            pipes, self.pipes = self.pipes, []
        for pipe in pipes:
            pipe.close()


class ElockLine:
    """An elock connection: a request, its reply line, within L{REPLY_WITHIN}."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_WITHIN)
        self.file = self.sock.makefile("rb")
        self.slowest = 0.0

    def ask(self, request: str) -> str:
        started = time.monotonic()
        self.sock.sendall(request.encode() + b"\r\n")
        reply = self.file.readline().decode(errors="replace").rstrip("\r\n")
        self.slowest = max(self.slowest, time.monotonic() - started)
        return reply

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def terms(member: MemberProcess) -> int:
    """The member's elections won, as its metrics say."""
    for line in member.metrics().splitlines():
        if line.startswith("jesync_cluster_terms_total ") or line.startswith("jesync_cluster_terms "):
            return int(float(line.split()[1]))
    raise AssertionError("no jesync_cluster_terms in the metrics")


def etcd_round_trips(member: MemberProcess) -> Dict[str, Tuple[int, float]]:
    """Per etcd operation, the member's answered requests and their mean round trip (its metrics)."""
    counts: Dict[str, float] = {}
    sums: Dict[str, float] = {}
    for line in member.metrics().splitlines():
        for suffix, into in (("_count", counts), ("_sum", sums)):
            prefix = f"jesync_etcd_request_seconds{suffix}{{"
            if line.startswith(prefix):
                labels, value = line[len(prefix) :].split("} ")
                operation = labels.split('operation="')[1].split('"')[0]
                into[operation] = float(value)
    return {operation: (int(count), sums[operation] / count) for operation, count in counts.items() if count}


def step_downs(member: MemberProcess) -> List[str]:
    return [line for line in member.log().splitlines() if " steps down: " in line]


class SlowEtcdTests(unittest.TestCase):
    def setUp(self) -> None:
        require_etcd()
        etcd = urlsplit(shared_etcd().endpoint)
        self.proxy = DelayingProxy((etcd.hostname or "127.0.0.1", etcd.port or 2379), DELAY)
        self.addCleanup(self.proxy.close)
        self.member = MemberProcess([self.proxy.endpoint], f"slow-{free_port()}", TTL)
        self.addCleanup(self.member.close)

    def wait_to_lead(self) -> float:
        """Seconds until the member leads and serves, bounded by L{LEAD_WITHIN}."""
        started = time.monotonic()
        while not (self.member.health() == "leader" and self.member.serves()):
            assert self.member.process is not None
            if self.member.process.poll() is not None:
                self.fail(f"the member exited:\n{self.member.log()}")
            if time.monotonic() - started > LEAD_WITHIN:
                self.fail(f"the member did not lead within {LEAD_WITHIN} s:\n{self.member.log()}")
            time.sleep(0.05)
        return time.monotonic() - started

    def test_a_leader_on_a_slow_etcd_leads_and_answers(self) -> None:
        self.member.start()
        took = self.wait_to_lead()
        sys.stderr.write(f"slow etcd ({DELAY} s a chunk): the member led after {took:.1f} s\n")
        self.assertGreater(self.proxy.chunks, 0)
        term = terms(self.member)
        before = len(step_downs(self.member))

        elock = ElockLine(self.member.elock_port)
        self.addCleanup(elock.close)
        for _ in range(IN_A_ROW):
            self.assertEqual(elock.ask("lock slow"), "200 Acquired")
            self.assertEqual(elock.ask("unlock slow"), "200 Unlocked")
        # (each durable reply waited for etcd's delayed answer)
        self.assertGreaterEqual(elock.slowest, DELAY)

        cycles = 0
        end = time.monotonic() + TRAFFIC
        while time.monotonic() < end:
            self.assertEqual(elock.ask(f"lock slow-{cycles}"), "200 Acquired", self.member.log())
            self.assertEqual(elock.ask(f"unlock slow-{cycles}"), "200 Unlocked", self.member.log())
            cycles += 1
        sys.stderr.write(
            f"slow etcd: {cycles} lock/unlock cycles in {TRAFFIC} s, slowest reply {elock.slowest:.2f} s\n"
        )
        # Over TRAFFIC s at two durable replies (1 s each, measured) a cycle: several cycles, none refused.
        self.assertGreaterEqual(cycles, 3)
        self.assertEqual(step_downs(self.member)[before:], [], self.member.log())
        self.assertEqual(self.member.health(), "leader")
        self.assertEqual(terms(self.member), term)
        # The member saw etcd slow: its transactions' mean round trip is at least the delay.
        round_trips = etcd_round_trips(self.member)
        sys.stderr.write(
            "slow etcd: the member's etcd round trips: "
            + ", ".join(f"{op} {n} x {mean:.2f} s" for op, (n, mean) in sorted(round_trips.items()))
            + "\n"
        )
        self.assertGreaterEqual(round_trips["txn"][1], DELAY)


if __name__ == "__main__":
    unittest.main()
