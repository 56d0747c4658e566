"""
Fencing tokens keep increasing when the server is stopped and started
again (L{jesync.fencing}'s high-water mark in C{--state-dir}, or, without
one, the clock), through the real server: C{twistd jesync}'s own options
built by the composition root (L{tests.servers.ServerThread}), stopped
gracefully and started again on the same port, each start a new lock table
that reads the mark afresh.  What only a C{twistd} process shows (its exit
status, its log) is in L{tests.process.test_operations_twistd}.

Each step waits for a reply or for the stop to finish, with a bounded
timeout; nothing sleeps.
"""

from __future__ import annotations

import socket
import time
from typing import Optional

from twisted.trial.unittest import SynchronousTestCase

from jesync.fencing import AHEAD, ROOM, TokenMark
from tests.servers import ServerThread
from tests.support import TIMEOUT, short_temp_dir

#: How many times L{RestartTests} restarts a server with a state directory.
RESTARTS = 20


class RestartTests(SynchronousTestCase):
    """Tokens keep increasing when the server is stopped and started again."""

    server: Optional[ServerThread] = None

    def granted_token(self, *args: str) -> int:
        """Start the server (again, on the same port), take a lock with fencing on, stop it gracefully; the token."""
        if self.server is None:
            self.server = ServerThread(extra_args=args)
            self.addCleanup(self.server.close)
        server = self.server
        server.start()
        with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as client:
            client.sendall(b"fencing on\nlock k\n")
            reply = b""
            while reply.count(b"\n") < 2:
                chunk = client.recv(4096)
                self.assertTrue(chunk, f"closed after {reply!r}")
                reply += chunk
        token = int(reply.split()[-1])
        server.stop()
        # A graceful stop: its summary, and nothing went wrong on the way.
        log = server.log()
        self.assertIn("jesync stopped: closed ", log)
        self.assertNotIn("Traceback", log)
        self.assertNotIn("Unhandled", log)
        return token

    def wait_for_the_clock(self, microseconds: int) -> None:
        """Return once the clock (C{time.time()}, the server's) has reached C{microseconds}."""
        deadline = time.monotonic() + TIMEOUT
        while time.time() * 1e6 < microseconds:
            self.assertLess(time.monotonic(), deadline, "the clock did not get there")
            time.sleep(0.005)

    def test_without_state(self) -> None:
        first = self.granted_token()
        second = self.granted_token()
        self.assertGreater(second, first)
        self.assertLess(abs(first - time.time() * 1e6), 60e6)

    def test_with_state_the_mark_wins_over_the_clock(self) -> None:
        directory = short_temp_dir(self)
        # As if an earlier run had given tokens a day ahead of this clock.
        ahead = int(time.time() * 1e6) + 86400 * 10**6
        TokenMark(directory).write(ahead)
        first = self.granted_token("--state-dir", directory)
        self.assertEqual(first, ahead + 1)
        self.assertEqual(TokenMark(directory).read(), ahead + ROOM)
        second = self.granted_token("--state-dir", directory)
        self.assertEqual(second, ahead + ROOM + 1)

    def test_with_state_restarts_keep_tokens_near_the_clock(self) -> None:
        """
        Restart after restart, tokens stay above every earlier one and within
        AHEAD of the clock.  Each start comes at least C{ROOM} microseconds
        after the reservation of the one before, as a process's would (it
        takes longer than that to start): a start sooner than that may add
        up to C{ROOM} (L{jesync.fencing}).
        """
        directory = short_temp_dir(self)
        tokens: list[int] = []
        for _ in range(RESTARTS):
            self.wait_for_the_clock(TokenMark(directory).read() - AHEAD + ROOM)
            token = self.granted_token("--state-dir", directory)
            self.assertGreater(token, max(tokens, default=0))
            tokens.append(token)
        self.assertLessEqual(tokens[-1] - time.time() * 1e6, AHEAD)
        self.assertLessEqual(TokenMark(directory).read() - time.time() * 1e6, AHEAD)
