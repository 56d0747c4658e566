"""
L{ELockClient} against real servers with an elock listener (the
composition root's, on a reactor of its own in a thread: L{serve_in_thread}),
with a TCP proxy the tests can cut or stall between the client and a
server, to drop its connection, or to make it notice a drop only after the
server's grace period for its session is over.  A server's C{kill} is a
process dying (its connections closed, its table gone), its C{pause} a
SIGSTOP (connections accepted, nothing answered).  The client's sans-I/O
rules are in tests/unit/test_client_elock_wire.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from typing import Any, Optional

from jesync.client import (
    AuthFailed,
    Client,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    KeyBusy,
    LockLost,
    LockTimeout,
    ServerError,
)
from jesync.client.elock import ELockClient, ELockHandle
from tests.client_case import WITHIN, ClientTestCase
from tests.servers import fake_server, free_port, serve_in_thread


class Proxy:
    """
    A TCP proxy on 127.0.0.1 to C{target}: L{cut} drops every connection on
    both sides; L{stall} drops them on the server's side only and forwards
    nothing more (the client sees a silent peer) until L{resume}.
    """

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = threading.Event()
        self._mutex = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._held: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()
        self._listener.close()

    def _connect(self, client: socket.socket) -> None:
        client.settimeout(None)
        with self._mutex:
            self._held.append(client)
        while not self._forwarding.wait(0.05):
            if self._closed.is_set():
                return
        try:
            server = socket.create_connection(self._target, timeout=WITHIN)
        except OSError:
            _close(client)
            return
        server.settimeout(None)
        with self._mutex:
            self._pairs.append((client, server))
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or not self._forwarding.is_set():
                    break
                sink.sendall(data)
        except OSError:
            pass
        if self._forwarding.is_set():
            _close(source)
            _close(sink)

    def cut(self) -> None:
        """Drop every connection, both sides (as a server that went away)."""
        with self._mutex:
            pairs, self._pairs = self._pairs, []
        for client, server in pairs:
            _close(client)
            _close(server)

    def stall(self) -> None:
        """The server sees its connections close; the client sees silence."""
        self._forwarding.clear()
        with self._mutex:
            pairs, self._pairs = self._pairs, []
        for _, server in pairs:
            _close(server)

    def resume(self) -> None:
        self._forwarding.set()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with self._mutex:
            for client in self._held:
                _close(client)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def raw_elock(address: str, *lines: bytes) -> list[bytes]:
    """Send C{lines} on a new elock connection; the reply lines (C{stats}: up to C{END})."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=WITHIN) as sock:
        sock.sendall(b"".join(lines))
        received = b""
        while received.count(b"\r\n") < len(lines) or (b"200 STATS" in received and not received.endswith(b"END\r\n")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received.split(b"\r\n")[:-1]


class ELockServerTestCase(ClientTestCase):
    def elock_server(self, *extra_args: str, **kwargs: Any) -> Any:
        """A server with an elock listener, whose address is its C{elock_address}."""
        port = free_port()
        args = ["--elock-port", f"tcp:{port}:interface=127.0.0.1", *extra_args]
        server: Any = serve_in_thread(self, extra_args=args, **kwargs)
        server.elock_address = f"127.0.0.1:{port}"
        return server

    def elock(self, servers: Any, **options: Any) -> ELockClient:
        client = ELockClient(servers, **options)
        self.addCleanup(client.close)
        return client

    def proxy(self, target: str) -> Proxy:
        proxy = Proxy(target)
        self.addCleanup(proxy.close)
        return proxy

    def monitoring(self, address: str) -> int:
        """Sessions in their grace period on the server at C{address} (elock C{stats})."""
        for line in raw_elock(address, b"stats\r\n"):
            if line.startswith(b"STAT monitoring "):
                return int(line.split()[-1])
        raise AssertionError("no STAT monitoring line")

    def record_lost(self, handle: ELockHandle) -> list[LockLost]:
        calls: list[LockLost] = []
        handle.on_lost(calls.append)
        return calls


class LockingTests(ELockServerTestCase):
    def setUp(self) -> None:
        self.server = self.elock_server()
        self.address = self.server.elock_address
        self.first = self.elock(self.address)
        self.second = self.elock(self.address)

    def test_lock_unlock(self) -> None:
        handle = self.first.lock("report")
        self.assertTrue(handle.held)
        self.assertIsInstance(handle.token, int)
        self.assertTrue(handle.owned())
        self.assertEqual([h.key for h in self.first.held()], ["report"])
        self.assertTrue(handle.release())
        self.assertTrue(handle.released)
        self.assertFalse(handle.release())
        self.assertFalse(self.first.unlock("report"))
        self.assertFalse(handle.owned())
        again = self.first.lock("report")
        assert again.token is not None and handle.token is not None
        self.assertGreater(again.token, handle.token)

    def test_busy_and_timeout(self) -> None:
        self.first.lock("report")
        busy = self.assertRaises(LockTimeout, self.second.lock, "report")
        self.assertIn("held by another session", str(busy))
        start = time.monotonic()
        self.assertRaises(LockTimeout, self.second.lock, "report", wait=0.5)  # rounded up to 1 s
        self.assertGreaterEqual(time.monotonic() - start, 0.9)
        self.assertFalse(self.second.unlock("report"))

    def test_second_client_waits_until_the_first_unlocks(self) -> None:
        handle = self.first.lock("report")
        waiting = self.in_thread(lambda: self.second.lock("report", wait=30))
        self.wait_for(lambda: raw_elock(self.address, b"lock report\r\n") == [b"409 Unavailable"])
        self.assertFalse(waiting["done"].wait(0.2))
        self.assertTrue(handle.release())
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertTrue(waiting["result"].held)
        self.assertRaises(LockTimeout, self.first.lock, "report")

    def test_interrupted_wait_gives_the_lock_back(self) -> None:
        """A caller interrupted while its lock waits (^C) does not leave the session holding it once granted."""

        class Interrupted(Exception):
            pass

        def interrupt(signum: int, frame: Any) -> None:
            raise Interrupted()

        handle = self.first.lock("report")
        previous = signal.signal(signal.SIGALRM, interrupt)
        self.addCleanup(signal.signal, signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        self.assertRaises(Interrupted, self.second.lock, "report", wait=30)
        handle.release()  # granted to the second client's session, which gives it back
        self.wait_for(lambda: raw_elock(self.address, b"lock report\r\n") == [b"200 Acquired"])
        # (the client's own view follows once the answer to its unlock has come back)
        self.wait_for(lambda: self.second.held() == [])

    def test_twice(self) -> None:
        self.first.lock("k")
        self.assertRaises(KeyBusy, self.first.lock, "k")
        self.assertRaises(ValueError, self.first.lock, "a b")
        self.assertRaises(TypeError, self.first.lock, "k2", wait="1")

    def test_unlock_all_and_context_managers(self) -> None:
        with self.first.lock("a") as a:
            self.assertTrue(a.held)
        self.assertTrue(a.released)
        b, c = self.first.lock("b"), self.first.lock("c")
        self.first.unlock_all()
        self.assertTrue(b.released and c.released)
        self.second.lock("b")

    def test_close_ends_the_session(self) -> None:
        with ELockClient(self.address) as client:
            handle = client.lock("k")
            session = client.session_id
        self.assertTrue(handle.released)
        self.second.lock("k")  # at once: quit released it, no grace period
        self.assertEqual(self.monitoring(self.address), 0)
        self.assertRaises(ClientError, client.lock, "j")
        self.assertIsNotNone(session)

    def test_session_id(self) -> None:
        self.assertNotEqual(self.first.session_id, self.second.session_id)
        self.assertEqual(len(self.first.session_id or ""), 22)

    def test_refused_first_member(self) -> None:
        """A member refusing connections (a standby) is passed over."""
        dead = f"127.0.0.1:{free_port()}"
        client = self.elock(f"{dead}|{self.address}")
        self.assertEqual(str(client.address), self.address)
        client.lock("k")
        self.assertRaises(LockTimeout, self.first.lock, "k")

    def test_nobody_answers(self) -> None:
        dead = f"127.0.0.1:{free_port()}|127.0.0.1:{free_port()}"
        error = self.assertRaises(ConnectFailed, ELockClient, dead, connect_retries=1, retry_backoff=0.01)
        self.assertIn("cannot connect", str(error))


class ResumeTests(ELockServerTestCase):
    """The connection drops; the session, and its locks, come back."""

    def setUp(self) -> None:
        self.server = self.elock_server()
        self.address = self.server.elock_address
        self.other = self.elock(self.address)

    def test_cut_connection_keeps_the_lock(self) -> None:
        proxy = self.proxy(self.address)
        client = self.elock(proxy.address, grace=10, heartbeat=0.2, read_timeout=2)
        handle = client.lock("k")
        lost = self.record_lost(handle)
        session = client.session_id
        proxy.cut()
        self.wait_for(lambda: proxy.accepted >= 2)
        self.assertTrue(handle.owned())  # asked on the new connection
        self.assertEqual(client.session_id, session)
        self.assertTrue(handle.held)
        self.assertEqual(lost, [])
        self.assertRaises(LockTimeout, self.other.lock, "k")
        self.assertTrue(handle.release())
        self.other.lock("k")

    def test_resume_after_the_grace_period_reports_the_lock_lost(self) -> None:
        """
        The server drops the connection but the client hears nothing (a
        stalled path) until its reply timeout, by which time the server's
        grace period for the session is over: the resume finds a new empty
        session, and the lock is reported lost.
        """
        proxy = self.proxy(self.address)
        # The server's grace (1 s) is over before the client's reply timeout (2 s);
        # and the stalled proxy forwards nothing before resume() all the same.
        client = self.elock(proxy.address, grace=1, heartbeat=0.2, read_timeout=2)
        handle = client.lock("k")
        lost = self.record_lost(handle)
        proxy.stall()
        self.wait_for(lambda: self.monitoring(self.address) == 1)
        self.wait_for(lambda: self.monitoring(self.address) == 0)  # the grace period is over
        self.other.lock("k")  # so someone else can have it
        self.other.unlock("k")
        proxy.resume()
        self.wait_for(lambda: handle.lost, within=10)
        self.wait_for(lambda: len(lost) == 1)
        self.assertIsInstance(lost[0], LockLost)
        self.assertIn("no longer held", str(lost[0]))
        self.assertIs(handle.lost_reason, lost[0])
        self.assertFalse(handle.release())
        self.assertFalse(client.unlock("k"))
        # the client goes on, under the same session id
        self.assertEqual(client.lock("k").key, "k")
        self.assertRaises(LockTimeout, self.other.lock, "k")
        # and a callback given now is called at once
        late: list[LockLost] = []
        handle.on_lost(late.append)
        self.assertEqual(late, [lost[0]])
        self.assertEqual(len(lost), 1)

    def test_waiting_lock_is_sent_again(self) -> None:
        """A lock waiting when the connection drops waits again on the resumed session."""
        proxy = self.proxy(self.address)
        client = self.elock(proxy.address, grace=10, heartbeat=0.2, read_timeout=2)
        holder = self.other.lock("k")
        waiting = self.in_thread(lambda: client.lock("k", wait=20))
        self.wait_for(lambda: proxy.accepted == 1 and self._waiters("k") == 1)
        proxy.cut()
        self.wait_for(lambda: proxy.accepted == 2 and self._waiters("k") == 1)
        self.assertFalse(waiting["done"].is_set())
        holder.release()
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertTrue(waiting["result"].owned())

    def _waiters(self, key: str) -> int:
        with Client(self.server.address, environ={}) as jesync:
            return jesync.status(key).waiting

    def test_lost_callback_may_use_the_client(self) -> None:
        """Lost callbacks run outside the client's I/O: one may lock again."""
        proxy = self.proxy(self.address)
        # The server's grace (1 s) is over before the client's reply timeout (2 s);
        # and the stalled proxy forwards nothing before resume() all the same.
        client = self.elock(proxy.address, grace=1, heartbeat=0.2, read_timeout=2)
        handle = client.lock("k")
        relocked: list[Any] = []
        handle.on_lost(lambda error: relocked.append(client.lock("k", wait=5)))
        proxy.stall()
        self.wait_for(lambda: self.monitoring(self.address) == 1)
        self.wait_for(lambda: self.monitoring(self.address) == 0)
        proxy.resume()
        self.wait_for(lambda: len(relocked) == 1, within=10)
        self.assertTrue(relocked[0].owned())


class FailoverTests(ELockServerTestCase):
    """The server goes away; the client moves to another member."""

    def setUp(self) -> None:
        self.leader = self.elock_server()
        self.standin = self.elock_server()
        self.members = f"{self.leader.elock_address}|{self.standin.elock_address}"

    def test_new_leader_without_the_session_reports_the_lock_lost(self) -> None:
        """
        An independent server stands in for a new leader that did not get
        the session: the client resumes there, under its id, finds the lock
        not held, and says so.
        """
        client = self.elock(self.members, grace=5, heartbeat=0.2, read_timeout=2)
        handle = client.lock("k")
        lost = self.record_lost(handle)
        session = client.session_id
        self.leader.kill()
        self.wait_for(lambda: len(lost) == 1, within=10)
        self.assertTrue(handle.lost)
        self.assertIn(self.standin.elock_address, str(lost[0]))
        self.assertEqual(str(client.address), self.standin.elock_address)
        self.assertEqual(client.session_id, session)
        relocked = client.lock("k")
        self.assertTrue(relocked.owned())
        self.assertEqual(raw_elock(self.standin.elock_address, b"lock k\r\n"), [b"409 Unavailable"])

    def test_paused_leader(self) -> None:
        """A SIGSTOPped leader accepts connections but never answers: the heartbeat times out, and the client moves on."""
        client = self.elock(self.members, grace=5, heartbeat=0.2, read_timeout=0.5)
        handle = client.lock("k")
        lost = self.record_lost(handle)
        self.leader.pause()
        start = time.monotonic()
        self.wait_for(lambda: len(lost) == 1, within=10)
        # heartbeat + its reply timeout, then one more reply timeout trying the paused leader again
        self.assertLess(time.monotonic() - start, 0.2 + 0.5 + 0.5 + 3)
        self.assertEqual(str(client.address), self.standin.elock_address)
        self.assertTrue(client.lock("k").owned())

    def test_request_during_pause(self) -> None:
        """A lock sent to a paused leader is sent again to the member that answers."""
        client = self.elock(self.members, grace=5, heartbeat=60, read_timeout=0.5)
        self.leader.pause()
        handle = client.lock("k")
        self.assertEqual(str(client.address), self.standin.elock_address)
        self.assertTrue(handle.owned())

    def test_paused_only_member_fails_within_bounds(self) -> None:
        client = self.elock(self.leader.elock_address, grace=0.5, heartbeat=60, read_timeout=0.5)
        handle = client.lock("k")
        self.leader.pause()
        start = time.monotonic()
        error = self.assertRaises(ConnectionLost, client.lock, "j")
        self.assertLess(time.monotonic() - start, 0.5 + 0.5 + 0.5 + 3)
        self.assertIn("no reply within", str(error))
        self.assertTrue(handle.lost)
        self.assertIsNone(client.session_id)
        # The leader comes back: the next request starts a new session.  (The
        # paused leader now reads the "lock j" sent to it and grants it to the
        # old session, which keeps it for its grace period, 0.5 s.)
        self.leader.resume()
        client.lock("j", wait=5)
        self.assertIsNotNone(client.session_id)


class ServerWithoutOwnedTests(ELockServerTestCase):
    """A server without C{owned} (elock itself) cannot say what a resumed session kept: it is all given up."""

    def respond(self, line: bytes) -> Optional[bytes]:
        word = line.rstrip(b"\r").split()
        replies = {
            b"set_timeout": b"200 timeout set",
            b"conn_id": b"200 conn id set" if len(word) > 1 else b"200 s1",
            b"lock": b"200 Acquired",
            b"unlock_all": b"200 OK",
            b"quit": b"200 Hey, it was nice seeing you.",
        }
        reply = replies.get(word[0], b'400 Unknown command: "%s"' % word[0])
        return reply + b"\r\n"

    def test_resume_gives_everything_up(self) -> None:
        server = fake_server(self, self.respond)
        proxy = self.proxy(server.address)
        client = self.elock(proxy.address, grace=5, heartbeat=0.2, read_timeout=2)
        handle = client.lock("k")
        self.assertIsNone(handle.token)  # no fencing on that server
        lost = self.record_lost(handle)
        proxy.cut()
        self.wait_for(lambda: len(lost) == 1)
        self.assertIn("cannot say whether the session kept it", str(lost[0]))
        self.assertIn(b"conn_id s1\r", server.received)
        self.assertIn(b"owned k\r", server.received)
        self.assertEqual(server.received[-1], b"unlock_all\r")
        self.assertRaises(ServerError, client.owned, "k")


class RefusedWhileResumingTests(ELockServerTestCase):
    """A server that refuses the connection while the session is being taken back (its token rotated out, say)."""

    def respond(self, line: bytes) -> Optional[bytes]:
        word = line.rstrip(b"\r").split()
        replies = {
            b"set_timeout": b"200 timeout set",
            b"conn_id": b"200 conn id set" if len(word) > 1 else b"200 s%d" % len(self.sessions),
            b"lock": b"200 Acquired",
            b"owned": b"403 auth failed",
            b"quit": b"200 Hey, it was nice seeing you.",
        }
        if word[0] == b"conn_id" and len(word) == 1:
            self.sessions.append(line)
        reply = replies.get(word[0], b'400 Unknown command: "%s"' % word[0])
        return reply + b"\r\n"

    def test_the_session_is_given_up_and_the_next_request_starts_a_new_one(self) -> None:
        self.sessions: list = []
        server = fake_server(self, self.respond)
        proxy = self.proxy(server.address)
        client = self.elock(proxy.address, grace=2, heartbeat=0.2, read_timeout=2)
        handle = client.lock("k")
        lost = self.record_lost(handle)
        proxy.cut()
        self.wait_for(lambda: len(lost) == 1)  # refused while resuming: the session and its lock are gone
        self.assertIn(b"owned k\r", server.received)
        # The next request starts a new session (it used to find the session stuck half-resumed).
        self.assertTrue(client.lock("k2").held)
        self.assertEqual(len(self.sessions), 2)


class AuthTests(ELockServerTestCase):
    def test_token(self) -> None:
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory, True)
        token_file, wrong_file = os.path.join(directory, "token"), os.path.join(directory, "wrong")
        with open(token_file, "wb") as file:
            file.write(b"s3cret\n")
        with open(wrong_file, "wb") as file:
            file.write(b"wrong\n")
        server = self.elock_server("--auth-token-file", token_file, auth_token=b"s3cret")
        client = self.elock(server.elock_address, auth_token_file=token_file, environ={})
        self.assertTrue(client.lock("k").owned())
        refused = self.assertRaises(AuthFailed, ELockClient, server.elock_address, auth_token_file=wrong_file)
        self.assertIn("refused the auth token", str(refused))
        missing = self.assertRaises(AuthFailed, ELockClient, server.elock_address, environ={})
        self.assertIn("needs an auth token", str(missing))
