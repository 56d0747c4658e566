"""
The benchmarks' one closed-loop driver (benchmarks/closedloop.py) over real
loopback TCP, against a small line server in a thread of this process: a
whole run of loadgen.py's worker counts the cycles, latencies and retries of
its measured window only, and stops on a reply it does not expect or a
closed connection; the reply handlers frame one reply at a time and say what
it completed.  (The benchmarks' figures themselves are BENCHMARKS.md's; this
is the loop's accounting, which every throughput benchmark shares.)
"""

from __future__ import annotations

import multiprocessing
import selectors
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from twisted.trial.unittest import SynchronousTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import closedloop  # noqa: E402
import coordination  # noqa: E402
import loadgen  # noqa: E402

WARMUP = 0.2  # s: long enough for many cycles over loopback
SECONDS = 0.3
TIMEOUT = 10.0  # s: a bound on anything waited for


class LineServer(threading.Thread):
    """
    A loopback server answering each line (with its "\\n") by
    C{answer(state, line)}, C{state} a dict per connection; C{close_on} a
    line that makes it close the connection instead.
    """

    def __init__(self, answer: Callable[[dict, bytes], bytes], close_on: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.answer = answer
        self.close_on = close_on
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.address = self.listener.getsockname()
        self.stopping = threading.Event()

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        buffers: dict = {}
        while not self.stopping.is_set():
            for key, _ in selector.select(0.05):
                if key.fileobj is self.listener:
                    sock, _ = self.listener.accept()
                    selector.register(sock, selectors.EVENT_READ, {})
                    buffers[sock] = b""
                    continue
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                    buffers[sock] += data
                    while data and b"\n" in buffers[sock]:
                        line, _, buffers[sock] = buffers[sock].partition(b"\n")
                        if line + b"\n" == self.close_on:
                            data = b""
                            break
                        sock.sendall(self.answer(key.data, line + b"\n"))
                except OSError:  # the client went first (a test of a run that stops)
                    data = b""
                if not data:
                    selector.unregister(sock)
                    sock.close()
        for key in list(selector.get_map().values()):
            key.fileobj.close()
        selector.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(TIMEOUT)


def yrmcds(unlocks: list) -> Callable[[dict, bytes], bytes]:
    """yrmcds's text lock protocol, refusing every lock once (LOCKED) before granting it; each unlock noted in C{unlocks}."""

    def answer(state: dict, line: bytes) -> bytes:
        word = line.split()[0]
        if word == b"set":
            return b"STORED\r\n"
        if word == b"x":  # the set's data line
            return b""
        if word == b"lock":
            state["refused"] = not state.get("refused")
            return b"LOCKED\r\n" if state["refused"] else b"OK\r\n"
        unlocks.append(line)
        return b"OK\r\n"

    return answer


def run_worker(server: LineServer, protocol: str, keys: list[bytes]) -> tuple:
    """loadgen's worker in this process against C{server}: (what it sent first, its result)."""
    parent, child = multiprocessing.Pipe()
    parent.send(time.monotonic() + 0.05)  # the start time, read once it is "ready"
    try:
        loadgen.run_worker(server.address, protocol, keys, WARMUP, SECONDS, None, child)
        if not parent.poll(TIMEOUT):
            raise AssertionError("the worker sent nothing")
        return parent.recv(), parent.recv()
    finally:
        parent.close()
        child.close()


class DriverTests(SynchronousTestCase):
    def serve(self, answer, close_on: bytes | None = None) -> LineServer:
        server = LineServer(answer, close_on)
        server.start()
        self.addCleanup(server.stop)
        return server

    def test_counts_the_window_only(self) -> None:
        """
        Cycles, latencies and retries are those of the measured window: the
        server answered more cycles (the warm-up's), every counted cycle has
        its latency, and each had its one refused lock sent again.
        """
        keys = [b"k%d" % i for i in range(3)]
        unlocks: list = []
        server = self.serve(yrmcds(unlocks))
        ready, (cycles, latencies, retries, cpu) = run_worker(server, "yrmcds", keys)
        self.assertEqual(ready, "ready")
        self.assertGreater(cycles, 10)
        self.assertEqual(len(latencies), cycles)
        self.assertGreater(len(unlocks), cycles)  # the warm-up's cycles were served, not counted
        self.assertLessEqual(abs(retries - cycles), 2 * len(keys))  # at the window's two edges, a key each
        self.assertTrue(all(0 < latency < (WARMUP + SECONDS) * 1e9 for latency in latencies))
        self.assertTrue(0 <= cpu <= 2 * SECONDS, cpu)

    def test_an_unexpected_reply_stops_the_run(self) -> None:
        server = self.serve(lambda state, line: b"GRANTED 1 0 someone-else 60\n")
        with self.assertRaisesRegex(closedloop.ProtocolError, "unexpected reply b'GRANTED 1 0 someone-else 60'"):
            run_worker(server, "jesync", [b"mine"])

    def test_a_closed_connection_stops_the_run(self) -> None:
        server = self.serve(lambda state, line: b"", close_on=b"lock k\n")
        with self.assertRaisesRegex(closedloop.ProtocolError, "the server closed a connection"):
            run_worker(server, "jesync", [b"k"])


class ReplyHandlerTests(SynchronousTestCase):
    def conn(self) -> loadgen.Conn:
        return loadgen.Conn(socket.socket(), b"k", *loadgen.jesync_requests(b"k"), closedloop.Tally())

    def test_one_reply_at_a_time(self) -> None:
        """A handler takes the first whole line only, and None until one has arrived."""
        conn = self.conn()
        self.addCleanup(conn.sock.close)
        self.assertIsNone(loadgen.jesync_reply(conn, b"GRANTED 1 0 k 6"))
        both = b"GRANTED 1 0 k 60\nRELEASED 0 0 k\n"
        self.assertEqual(loadgen.jesync_reply(conn, both), (17, b"release k\n", 0))
        self.assertEqual(loadgen.jesync_reply(conn, both[17:]), (15, b"lock k\n", closedloop.DONE))

    def test_a_refused_lock_is_a_retry(self) -> None:
        conn = self.conn()
        self.addCleanup(conn.sock.close)
        self.assertEqual(loadgen.redis_reply(conn, b"$-1\r\n"), (5, conn.lock, closedloop.RETRY))
        self.assertEqual(loadgen.redis_reply(conn, b"+OK\r\n"), (5, conn.release, 0))
        self.assertEqual(loadgen.redis_reply(conn, b":1\r\n"), (4, conn.lock, closedloop.DONE))

    def test_a_role_records_its_first_step_and_counts_its_last(self) -> None:
        role = coordination.jesync_locker("reader", b"k", shared=True)
        with socket.socket() as sock:
            conn = coordination.RoleConn(sock, role, closedloop.Tally())
            self.assertEqual(coordination.role_reply(conn, b"GRANTED 1 0 k 60 7 shared\n")[1:], (b"release k\n", closedloop.RECORD))
            self.assertEqual(coordination.role_reply(conn, b"RELEASED 0 0 k\n")[1:], (b"lock-shared k\n", closedloop.CYCLE))
            single = coordination.redis_publisher(b"k", b"x", 3)
            conn = coordination.RoleConn(sock, single, closedloop.Tally())
            self.assertEqual(coordination.role_reply(conn, b":3\r\n")[2], closedloop.RECORD | closedloop.CYCLE)
            with self.assertRaises(closedloop.ProtocolError):
                coordination.role_reply(conn, b":2\r\n")
