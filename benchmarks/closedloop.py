"""
The closed loop every throughput benchmark here runs in its load-generator
processes: one driver, so that a cycle, a latency and the measured window
mean the same thing in loadgen.py, dlock.py, memcache.py, http_api.py and
coordination.py, and a fix to the loop is made once.

A load-generator process opens its connections (blocking, each with
whatever set-up its protocol needs, before any clock starts), then
L{closed_loop} makes them non-blocking on one epoll, says "ready" on its
pipe, waits for the start time the parent sends (a C{time.monotonic()}
value, the same clock in every process), sends each connection's first
request and from then on keeps exactly one request out per connection: a
complete reply is answered by the next request at once (no pipelining, no
think time).  What differs between protocols is one function, C{reply(conn,
buffer)}: it finds the first whole reply at the start of the connection's
buffer (None if it has not all arrived), checks it (L{ProtocolError} if it
is not the one expected), moves the connection's own state on and returns
(bytes the reply took, the request to send next, flags).  The flags say what
the reply completed:

- L{RECORD}: a latency, the time since the connection's cycle started;
- L{CYCLE}: a cycle (its clock starts again from this reply);
- L{RETRY}: a request sent again (e.g. a lock someone else holds, a spin).

Only replies read inside the window, C{start + warmup} to C{start + warmup
+ seconds}, are counted (cycles, latencies, retries), into the connection's
L{Tally}; the loop stops at the window's end.  The process's own CPU time
over the window is measured too: a load generator shares the machine with
the server it drives.  Only the Python standard library is used: raw
non-blocking sockets, one C{select.epoll} per process.
"""

from __future__ import annotations

import os
import select
import socket
import time
from typing import Callable, Optional, Tuple

RECORD = 1  # the reply ends what a latency measures: record now - the cycle's start
CYCLE = 2  # the reply ends a cycle: count it and start the next one's clock
RETRY = 4  # the next request is one sent again
DONE = RECORD | CYCLE  # the usual end of a cycle: its latency is the whole cycle

#: C{reply(conn, buffer)}: (bytes used, next request, flags), or None until a whole reply has arrived.
Reply = Callable[..., Optional[Tuple[int, bytes, int]]]


class ProtocolError(Exception):
    pass


class Tally:
    """What the replies counted in the window add up to (one per process, or one per role)."""

    __slots__ = ("cycles", "latencies", "retries")

    def __init__(self) -> None:
        self.cycles = 0
        self.latencies: list[int] = []  # ns
        self.retries = 0


class Conn:
    """
    One client connection of the loop: its socket, the bytes read and not
    yet used, the request that opens its loop, when its current cycle
    started (perf_counter ns) and the L{Tally} it counts into.  A protocol
    subclasses it for its own state (with __slots__ of its own).
    """

    __slots__ = ("buffer", "first", "sock", "started", "tally")

    def __init__(self, sock: socket.socket, first: bytes, tally: Tally) -> None:
        self.sock = sock
        self.first = first
        self.tally = tally
        self.started = 0
        self.buffer = b""


def connect(address, timeout: float | None = None) -> socket.socket:
    """A blocking TCP connection with Nagle's algorithm off (a request is sent as one small write)."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def closed_loop(conns: list, reply: Reply, warmup: float, seconds: float, pipe, poll_timeout: float = 0.1) -> float:
    """
    Run C{conns} (set up, still blocking) in the closed loop described in
    the module docstring: "ready" on C{pipe}, the start time from it, then
    C{warmup} + C{seconds}.  Returns this process's CPU seconds in the
    window; the counts are in the connections' tallies.  The sockets are
    left open (a protocol may have to end something on them).
    """
    poller = select.epoll()
    by_fd = {}
    for conn in conns:
        conn.sock.setblocking(False)
        by_fd[conn.sock.fileno()] = conn
        poller.register(conn.sock.fileno(), select.EPOLLIN)
    pipe.send("ready")
    start = pipe.recv()
    time.sleep(max(0.0, start - time.monotonic()))

    clock = time.perf_counter_ns
    offset = clock() - int(time.monotonic() * 1e9)  # perf_counter -> monotonic, in ns
    window_start = int((start + warmup) * 1e9) + offset
    end = int((start + warmup + seconds) * 1e9) + offset
    poll = poller.poll
    cpu_at_window = None

    now = clock()
    for conn in conns:
        conn.started = now
        conn.sock.send(conn.first)
    while now < end:
        if cpu_at_window is None and now >= window_start:
            cpu_at_window = time.process_time()
        for fd, _ in poll(poll_timeout):
            conn = by_fd[fd]
            data = conn.sock.recv(65536)
            if not data:
                raise ProtocolError("the server closed a connection")
            buffer = conn.buffer + data if conn.buffer else data
            while buffer:
                step = reply(conn, buffer)
                if step is None:
                    break
                used, request, flags = step
                buffer = buffer[used:]
                if flags:
                    now = clock()
                    if window_start <= now < end:
                        tally = conn.tally
                        if flags & RECORD:
                            tally.latencies.append(now - conn.started)
                        if flags & CYCLE:
                            tally.cycles += 1
                        if flags & RETRY:
                            tally.retries += 1
                    if flags & CYCLE:
                        conn.started = now
                conn.sock.send(request)
            conn.buffer = buffer
        now = clock()
    poller.close()
    return time.process_time() - (cpu_at_window or time.process_time())


def run_closed_loop(cpus, open_conns: Callable[[Tally], list], reply: Reply, warmup: float, seconds: float, pipe) -> None:
    """
    The whole of a load-generator process as loadgen.run_workers expects
    it: pinned to C{cpus} (if any), C{open_conns(tally)} opens and sets up
    the connections, L{closed_loop} runs them, the sockets are closed and
    (cycles, latencies in ns, retries, CPU seconds) of the window go back
    on C{pipe}.
    """
    if cpus:
        os.sched_setaffinity(0, cpus)
    tally = Tally()
    conns = open_conns(tally)
    try:
        cpu = closed_loop(conns, reply, warmup, seconds, pipe)
    finally:
        for conn in conns:
            conn.sock.close()
    pipe.send((tally.cycles, tally.latencies, tally.retries, cpu))
