"""
How long a real server takes to notice that the peers of connections it has
stopped reading are gone.

Starts ``twistd -n --pidfile= jesync`` from ``--checkout`` (PYTHONPATH),
with the ``twistd`` next to ``--python``, on free 127.0.0.1 ports for JESync
and elock.  A JESync client takes key ``K``; ``--connections`` elock clients
(default 20) each send ``lock K 3600`` and ``--behind`` bytes (default
420 KB) of requests pipelined behind it, so the server holds them back and
stops reading each connection.  Once ``status K`` shows every wait, each
client closes its socket: with an RST (``SO_LINGER`` 0), or a plain close
(a FIN).  Reported, from that moment: the time until ``status K`` shows no
waiter and until the server's open descriptors (``/proc/PID/fd``) are back
to what they were before the clients connected, and what a ``release K``
then answers (``RELEASED 0 0 K``: granted to nobody).

    python benchmarks/paused.py
    python benchmarks/paused.py --checkout /tmp/jesync-before --close fin

Only 127.0.0.1; every wait is bounded (``--limit`` seconds, default 30);
the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import REPO, free_port, start_jesync, wait_for_port  # noqa: E402  (benchmarks/ is on sys.path)


def ask(sock: socket.socket, request: bytes) -> bytes:
    """Send one JESync request, read its one-line reply."""
    sock.sendall(request)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit(f"the server closed the connection after {reply!r}")
        reply += chunk
    return reply


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def send_what_goes(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Send as much of C{data} as the connection takes within C{seconds} (the server stops reading)."""
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(data[sent:])
        except BlockingIOError:
            time.sleep(0.01)
    return sent


def wait_for(predicate, limit: float, start: float) -> float | None:
    """Seconds from C{start} until C{predicate()} is true (checked every 10 ms), or None after C{limit}."""
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > limit:
            return None
        time.sleep(0.01)


def fmt_seconds(value: float | None, limit: float) -> str:
    return f"> {limit} s" if value is None else f"{value:.3f} s"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=REPO, help="the jesync checkout to run (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="the Python whose twistd runs it (default: this one)")
    parser.add_argument("--connections", type=int, default=20, help="elock clients (default 20)")
    parser.add_argument(
        "--behind", type=int, default=420_000, help="bytes pipelined behind each wait (default 420,000)"
    )
    parser.add_argument("--close", choices=["rst", "fin"], default="rst", help="how the clients go (default rst)")
    parser.add_argument("--limit", type=float, default=30.0, help="seconds to wait for the server (default 30)")
    args = parser.parse_args(argv)

    elock_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_jesync(
            Path(tmp),
            None,
            checkout=args.checkout,
            python=args.python,
            options=("--elock-port", f"tcp:{elock_port}:interface=127.0.0.1"),
        )
        try:
            elock_address = ("127.0.0.1", elock_port)
            wait_for_port(elock_address, server.process, server.log or Path(tmp) / "log")
            pid = server.pid
            assert pid is not None
            holder = socket.create_connection(server.address)
            # (never expiring: a wait can only end by its own timeout or its connection going)
            print(ask(holder, b"lock K 1 -1 0\n").decode().strip())
            files_before = open_files(pid)
            behind = b"stats\r\n" * (args.behind // len(b"stats\r\n"))
            clients = []
            for _ in range(args.connections):
                client = socket.create_connection(elock_address)
                client.sendall(b"lock K 3600\r\n")
                clients.append(client)
            expected = b"STATUS 1 %d K\n" % args.connections
            waiting = wait_for(lambda: ask(holder, b"status K\n") == expected, args.limit, time.monotonic())
            if waiting is None:
                raise SystemExit("the waits did not all start: %r" % ask(holder, b"status K\n"))
            sent = [send_what_goes(client, behind, 1.0) for client in clients]
            print(
                f"{args.connections} elock clients wait for K, each with {min(sent):,}-{max(sent):,} bytes "
                f"pipelined behind it; the server has {open_files(pid)} files open ({files_before} before)"
            )
            start = time.monotonic()
            for client in clients:
                if args.close == "rst":
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
            no_waiter = wait_for(lambda: ask(holder, b"status K\n") == b"STATUS 1 0 K\n", args.limit, start)
            files_back = wait_for(lambda: open_files(pid) <= files_before, args.limit, start)
            print(f"closed with {args.close.upper()} from {args.checkout}:")
            print(f"  no waiter on K after: {fmt_seconds(no_waiter, args.limit)}")
            print(f"  descriptors closed after: {fmt_seconds(files_back, args.limit)}")
            status = ask(holder, b"status K\n").decode().strip()
            release = ask(holder, b"release K\n").decode().strip()
            print(f"  then: status K -> {status}; release K -> {release}; {open_files(pid)} files open")
            holder.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
