"""
Cluster mode against real etcd processes and real C{twistd jesync --etcd}
members (tests.etcd_server, tests.cluster): the election, a takeover after kill -9
with elock sessions, dlock timed grants and fencing tokens checked across
it, JESync's shared locks and watches ended by a takeover, resigning on SIGTERM, twelve takeovers in a row keeping fencing tokens
increasing and within 10 s of the clock, a leader paused past its lease (SIGSTOP) with a
checker recording every grant from both sides, etcd killed and restarted,
and a three-member etcd cluster losing a member.  Leases are 2 s (etcd's
smallest), so each takeover takes seconds, not minutes.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import unittest
from dataclasses import dataclass
from typing import List, Optional, Tuple

from jesync.fencing import AHEAD
from jesync.protocols.dlock_pb2 import Response
from tests.cluster import TAKEOVER_WITHIN, TTL, MemberProcess, start_cluster
from tests.dlock_messages import lock as dlock_lock, status_name
from tests.etcd_server import start_etcd, start_etcd_cluster
from tests.servers import environment, twistd_command

WITHIN = 20.0


class LineClient:
    """A raw line-protocol connection (JESync or elock), answers read one line at a time."""

    def __init__(self, port: int, terminator: bytes, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")
        self.terminator = terminator

    def ask(self, line: str) -> str:
        self.sock.sendall(line.encode() + self.terminator)
        answer = self.file.readline()
        if not answer:
            raise ConnectionError("closed")
        return answer.decode().rstrip("\r\n")

    def close(self) -> None:
        self.sock.close()


class DlockClient:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def ask(self, request) -> Response:
        body = request.SerializeToString()
        self.sock.sendall(len(body).to_bytes(4, "big") + body)
        size = int.from_bytes(self._read(4), "big")
        return Response.FromString(self._read(size))

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def connect_within(port: int, terminator: bytes, within: float = WITHIN) -> Tuple[LineClient, float]:
    """A connection to C{port} once it accepts one (bounded), and when (monotonic)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return LineClient(port, terminator), time.monotonic()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class ElectionTests(unittest.TestCase):
    def test_one_of_three_leads_and_the_standbys_listen_on_nothing(self) -> None:
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint])
        leader = cluster.leader()
        standbys = [member for member in cluster.members if member is not leader]
        self.assertEqual([member.health() for member in standbys], ["standby", "standby"])
        for standby in standbys:
            self.assertTrue(standby.refuses(), "a standby accepted a client connection")
        self.assertIn("jesync_cluster_leader 1.0", leader.metrics())
        self.assertIn("jesync_cluster_leader 0.0", standbys[0].metrics())
        client = LineClient(leader.port, b"\n")
        self.addCleanup(client.close)
        self.assertEqual(client.ask("lock a 1 0 10"), "GRANTED 1 0 a 10")
        elock = LineClient(leader.elock_port, b"\r\n")
        self.addCleanup(elock.close)
        self.assertEqual(elock.ask("lock b"), "200 Acquired")
        metrics = leader.metrics()
        for line in ("jesync_cluster_terms_total 1.0", "jesync_keys 2.0", "jesync_connections 2.0"):
            self.assertIn(line, metrics)
        for name in ("jesync_durable_transactions_total", "jesync_durable_writes_total"):
            self.assertRegex(metrics, rf"(?m)^{name} [1-9]")
        self.assertRegex(metrics, r'(?m)^jesync_etcd_request_seconds_count\{operation="grant"\} [1-9]')
        self.assertRegex(metrics, r'(?m)^jesync_etcd_request_seconds_count\{operation="txn"\} [1-9]')
        self.assertIn("jesync_keys 0.0", standbys[0].metrics())
        # A standby stopped (SIGTERM) exits cleanly, as a leader does.
        standbys[1].stop()
        self.assertEqual(standbys[1].process.returncode, 0, standbys[1].log())

    def test_a_member_that_cannot_listen_resigns_and_tries_again(self) -> None:
        etcd = start_etcd(self)
        member = MemberProcess([etcd.endpoint], "test-cannot-listen")
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", member.port))
        blocker.listen(1)
        self.addCleanup(member.close)
        member.start()
        deadline = time.monotonic() + WITHIN
        while "cannot serve" not in member.log():
            self.assertLess(time.monotonic(), deadline, member.log())
            time.sleep(0.02)
        self.assertIsNone(member.process.poll(), "the member exited")
        blocker.close()
        deadline = time.monotonic() + WITHIN
        while not member.serves():
            self.assertLess(time.monotonic(), deadline, member.log())
            time.sleep(0.02)
        self.assertEqual(member.health(), "leader")

    def test_a_member_whose_metrics_cannot_listen_does_not_start(self) -> None:
        """As any jesync server: an endpoint that cannot listen stops it, with one line and status 1."""
        etcd = start_etcd(self)
        member = MemberProcess([etcd.endpoint], "test-metrics-taken")
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", member.metrics_port))
        blocker.listen(1)
        self.addCleanup(blocker.close)
        self.addCleanup(member.close)
        member.process = subprocess.Popen(
            [
                *twistd_command(),
                "-n",
                "--pidfile=",
                "jesync",
                "--port",
                f"tcp:{member.port}:interface=127.0.0.1",
                *member.extra_args,
            ],
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output, _ = member.process.communicate(timeout=WITHIN)
        self.assertEqual(member.process.returncode, 1, output.decode())
        self.assertIn(f"cannot listen on tcp:{member.metrics_port}", output.decode())
        self.assertNotIn(b"joins", output)


class TakeoverTests(unittest.TestCase):
    def test_kill_9_keeps_sessions_timed_grants_and_tokens(self) -> None:
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint])
        old = cluster.leader()

        # An elock session holding two keys, with their tokens.
        elock = LineClient(old.elock_port, b"\r\n")
        self.assertEqual(elock.ask("set_timeout 20000"), "200 timeout set")
        session = elock.ask("conn_id").split()[1]
        self.assertEqual(elock.ask("fencing on"), "200 fencing on")
        tokens = {key: int(elock.ask(f"lock {key}").split()[2]) for key in ("s1", "s2")}
        # A dlock grant for 6 s, and one until disconnect.
        dlock = DlockClient(old.dlock_port)
        release_at = time.time() + 6
        timed = dlock.ask(dlock_lock(["t1"], release_micro=6_000_000, fencing_tokens=True))
        self.assertEqual(status_name(timed), "Ok")
        self.assertEqual(status_name(dlock.ask(dlock_lock(["d1"], id=2))), "Ok")
        # A JESync lock: connection-bound.
        jesync = LineClient(old.port, b"\n")
        self.assertEqual(jesync.ask("fencing on"), "FENCING ON")
        before = int(jesync.ask("lock j1 1 0 60").split()[-1])
        highest_before = max(before, timed.fencing_tokens[0], *tokens.values())

        old.kill()
        killed = time.monotonic()
        new = cluster.leader(besides=[old])
        client, connected = connect_within(new.port, b"\n")
        self.addCleanup(client.close)
        self.assertEqual(client.ask("fencing on"), "FENCING ON")
        granted = client.ask("lock j1 1 0 60")  # connection-bound: gone with the old leader
        first_grant = time.monotonic()
        self.assertTrue(granted.startswith("GRANTED 1 0 j1 60 "), granted)
        self.assertLess(first_grant - killed, TAKEOVER_WITHIN)
        self.assertGreater(int(granted.split()[-1]), highest_before)

        # The session, resumed on the new leader, still holds its keys with their tokens.
        resumed = LineClient(new.elock_port, b"\r\n")
        self.addCleanup(resumed.close)
        self.assertEqual(resumed.ask(f"conn_id {session}"), "200 conn id set")
        self.assertEqual(resumed.ask("fencing on"), "200 fencing on")
        for key, token in tokens.items():
            self.assertEqual(resumed.ask(f"owned {key}"), f"200 owned {token}")
        self.assertEqual(client.ask("lock s1 1 0 60"), "TIMEOUT 1 0 s1")
        # The timed dlock grant is held until its original release time, the other is gone.
        other = DlockClient(new.dlock_port)
        self.addCleanup(other.close)
        self.assertEqual(status_name(other.ask(dlock_lock(["d1"], wait_micro=1))), "Ok")
        busy = other.ask(dlock_lock(["t1"], id=3, wait_micro=1))
        self.assertEqual(status_name(busy), "AcquireTimeout")
        self.assertLess(time.time(), release_at)
        waited = other.ask(dlock_lock(["t1"], id=4, wait_micro=10_000_000, fencing_tokens=True))
        self.assertEqual(status_name(waited), "Ok")
        self.assertGreaterEqual(time.time(), release_at - 0.05)
        self.assertGreater(waited.fencing_tokens[0], highest_before)

    def test_a_takeover_ends_connection_bound_shared_locks_and_watches(self) -> None:
        """
        JESync's shared locks and their values are bound to their connection,
        so a takeover ends them as a disconnect does (nothing is granted
        twice: the new leader has none of them); a watcher is told by its
        connection closing, and watches again on the new leader, where an
        elock session's lock, which survives, is reported as it changes.
        """
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint])
        old = cluster.leader()
        elock = LineClient(old.elock_port, b"\r\n")
        self.assertEqual(elock.ask("set_timeout 20000"), "200 timeout set")
        session = elock.ask("conn_id").split()[1]
        self.assertEqual(elock.ask("lock s1"), "200 Acquired")
        reader = LineClient(old.port, b"\n")
        self.assertTrue(reader.ask("lock-shared config -1 60 10.0.0.7:80").startswith("GRANTED 1 0 config 60"))
        watcher = LineClient(old.port, b"\n", timeout=WITHIN)
        for connection in (elock, reader, watcher):
            self.addCleanup(connection.close)
        self.assertEqual(watcher.ask("watch config"), "WATCHING config")

        old.kill()
        self.assertEqual(watcher.file.readline(), b"", "the watcher's connection outlived its leader")
        new = cluster.leader(besides=[old])
        watcher, _ = connect_within(new.port, b"\n")
        self.addCleanup(watcher.close)
        self.assertEqual(watcher.ask("watch config"), "WATCHING config")
        self.assertEqual(watcher.ask("watch s1"), "WATCHING s1")
        self.assertEqual(watcher.ask("holders config"), "END")  # the reader's connection was the old leader's
        writer = LineClient(new.port, b"\n")
        self.addCleanup(writer.close)
        self.assertTrue(writer.ask("lock config 1 0 60").startswith("GRANTED 1 0 config 60"))
        self.assertTrue(watcher.file.readline().decode().startswith("EVENT GRANTED config "))
        self.assertEqual(writer.ask("lock-shared s1 0"), "TIMEOUT 1 0 s1")  # the session's lock survived
        resumed = LineClient(new.elock_port, b"\r\n")
        self.addCleanup(resumed.close)
        self.assertEqual(resumed.ask(f"conn_id {session}"), "200 conn id set")
        self.assertEqual(resumed.ask("unlock s1"), "200 Unlocked")
        self.assertTrue(watcher.file.readline().decode().startswith("EVENT RELEASED s1 "))

    def test_sigterm_hands_over_without_waiting_for_the_lease(self) -> None:
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint], ttl=10)
        old = cluster.leader()
        elock = LineClient(old.elock_port, b"\r\n")
        session = elock.ask("conn_id")
        session = session.split()[1]
        self.assertEqual(elock.ask("lock kept"), "200 Acquired")
        stopped = time.monotonic()
        old.stop()
        self.assertEqual(old.process.returncode, 0, old.log())
        self.assertIn("resigns", old.log())
        new = cluster.leader(besides=[old])
        self.assertLess(time.monotonic() - stopped, 5.0, "the standby waited for the 10 s lease")
        resumed = LineClient(new.elock_port, b"\r\n")
        self.addCleanup(resumed.close)
        self.assertEqual(resumed.ask(f"conn_id {session}"), "200 conn id set")
        self.assertEqual(resumed.ask("owned kept"), "200 owned")


#: Hand-overs in L{TokensNearTheClockTests}: SIGTERM ones (fast), then kill -9 ones.
HANDOVERS = 10
KILLS = 2


class TokensNearTheClockTests(unittest.TestCase):
    def test_repeated_takeovers_keep_tokens_increasing_and_near_the_clock(self) -> None:
        """
        Twelve takeovers in a row (ten SIGTERM hand-overs, then two kill -9),
        the stopped member started again each time: the first token after
        each is above every token before, and the last is within AHEAD of
        the clock (a reservation counted from the old mark would be about
        AHEAD further ahead with each).
        """
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint])
        tokens: List[int] = []

        def first_token(leader: MemberProcess) -> int:
            client, _ = connect_within(leader.port, b"\n")
            try:
                self.assertEqual(client.ask("fencing on"), "FENCING ON")
                reply = client.ask(f"lock k{len(tokens)} 1 0 60")
            finally:
                client.close()
            self.assertTrue(reply.startswith("GRANTED "), reply)
            return int(reply.split()[-1])

        leader = cluster.leader()
        tokens.append(first_token(leader))
        for number in range(HANDOVERS + KILLS):
            if number < HANDOVERS:
                leader.stop()
            else:
                leader.kill()
            new = cluster.leader(besides=[leader])
            token = first_token(new)
            self.assertGreater(token, max(tokens), f"takeover {number + 1}")
            tokens.append(token)
            leader.start()  # a standby again, for the next takeover
            leader = new
        self.assertLessEqual(tokens[-1] - time.time() * 1e6, AHEAD, tokens)


@dataclass
class Grant:
    member: int  # the port that granted it
    token: int
    received: float  # wall time the grant was read
    released: float  # wall time the release was sent (or the hold given up)


class PausedLeaderTests(unittest.TestCase):
    def test_a_leader_paused_past_its_lease_grants_nothing_once_resumed(self) -> None:
        """
        Clients take turns on one key through whichever member answers,
        recording every grant (member, fencing token, wall time received and
        released).  The leader is paused past its lease, a standby takes
        over, and the old leader is resumed: it must be deposed before it
        grants anything, and no two members' grants may overlap.
        """
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint], size=2)
        old = cluster.leader()
        ports = [member.port for member in cluster.members]
        grants: List[Grant] = []
        lock = threading.Lock()
        stop = threading.Event()

        def worker() -> None:
            client: Optional[LineClient] = None
            member = 0
            while not stop.is_set():
                try:
                    if client is None:
                        client = LineClient(ports[member], b"\n", timeout=0.5)
                        client.ask("fencing on")
                    answer = client.ask("lock shared 1 1 30")
                    if answer.startswith("GRANTED"):
                        received = time.time()
                        time.sleep(0.005)
                        released = time.time()
                        with lock:
                            grants.append(Grant(ports[member], int(answer.split()[-1]), received, released))
                        client.ask("release shared")
                except OSError:  # refused, reset, or no answer in time: the next member
                    if client is not None:
                        client.close()
                    client = None
                    member = (member + 1) % len(ports)
            if client is not None:
                client.close()

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
        for thread in workers:
            thread.start()
        self.addCleanup(stop.set)

        def granted_by(port: int, at_least: int, after: float = 0.0) -> None:
            deadline = time.monotonic() + WITHIN
            while sum(1 for grant in list(grants) if grant.member == port and grant.received > after) < at_least:
                self.assertLess(time.monotonic(), deadline, f"fewer than {at_least} grants from {port}")
                time.sleep(0.01)

        granted_by(old.port, 20)
        old.pause()
        paused = time.time()
        new = cluster.leader(besides=[old])
        granted_by(new.port, 20)
        old.resume()
        resumed = time.time()
        # Resumed, the old member finds itself deposed and stands by; the
        # clients go on with the new leader meanwhile.
        deadline = time.monotonic() + WITHIN
        while old.health() != "standby":
            self.assertLess(time.monotonic(), deadline, old.log())
            time.sleep(0.02)
        granted_by(new.port, 20, after=time.time())
        stop.set()
        for thread in workers:
            thread.join(10)

        from_old = [grant for grant in grants if grant.member == old.port]
        from_new = [grant for grant in grants if grant.member == new.port]
        self.assertTrue(from_old and from_new, (len(from_old), len(from_new)))
        self.assertFalse(
            [grant for grant in from_old if grant.received > paused], "the old leader granted after its pause"
        )
        first_new = min(grant.received for grant in from_new)
        self.assertLess(max(grant.released for grant in from_old), first_new)
        self.assertLess(max(grant.token for grant in from_old), min(grant.token for grant in from_new))
        ordered = sorted(grants, key=lambda grant: grant.received)
        self.assertEqual([grant.token for grant in ordered], sorted(grant.token for grant in grants))
        for earlier, later in zip(ordered, ordered[1:]):
            self.assertLessEqual(earlier.received, later.received)
        self.assertIn("steps down", old.log())
        self.assertGreater(resumed, paused)


class EtcdOutageTests(unittest.TestCase):
    def test_etcd_killed_the_leader_steps_down_and_etcd_back_a_leader_serves_the_same_state(self) -> None:
        etcd = start_etcd(self)
        cluster = start_cluster(self, [etcd.endpoint], size=2)
        leader = cluster.leader()
        elock = LineClient(leader.elock_port, b"\r\n")
        session = elock.ask("conn_id").split()[1]
        self.assertEqual(elock.ask("set_timeout 60000"), "200 timeout set")
        self.assertEqual(elock.ask("lock survives"), "200 Acquired")
        etcd.kill()
        killed = time.monotonic()
        deadline = killed + WITHIN
        while not all(member.refuses() for member in cluster.members):
            self.assertLess(time.monotonic(), deadline, leader.log())
            time.sleep(0.02)
        self.assertLess(time.monotonic() - killed, TTL + 1.0, "the leader served past its lease")
        self.assertEqual([member.health() for member in cluster.members], ["standby", "standby"])
        etcd.restart()
        again = cluster.leader()
        resumed = LineClient(again.elock_port, b"\r\n")
        self.addCleanup(resumed.close)
        self.assertEqual(resumed.ask(f"conn_id {session}"), "200 conn id set")
        self.assertEqual(resumed.ask("owned survives"), "200 owned")

    def test_an_etcd_cluster_losing_a_member_keeps_the_leader_serving(self) -> None:
        etcd = start_etcd_cluster(self, 3)
        # The lease outlasts an election among the etcd members (their
        # election timeout is 1 s): 5 s, the default.
        cluster = start_cluster(self, etcd.endpoints, size=2, ttl=5)
        leader = cluster.leader()
        elock = LineClient(leader.elock_port, b"\r\n")
        self.addCleanup(elock.close)
        self.assertEqual(elock.ask("lock before"), "200 Acquired")
        etcd.members[0].kill()  # the endpoint every member talks to first
        lost = time.monotonic()
        count = 0
        try:
            while time.monotonic() - lost < 8:
                self.assertEqual(elock.ask(f"lock during{count}"), "200 Acquired")
                self.assertEqual(elock.ask(f"unlock during{count}"), "200 Unlocked")
                count += 1
        except OSError as error:
            raise AssertionError(f"{error} after {time.monotonic() - lost:.1f} s:\n{leader.log()}") from None
        self.assertEqual(leader.health(), "leader")
        self.assertNotIn("steps down", leader.log())
        self.assertIn("jesync_cluster_terms_total 1.0", leader.metrics())
