"""
The blocking client against real servers: C{twistd jesync} subprocesses on
real ports (and a misbehaving fake server where a real one cannot misbehave).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable
from unittest import SkipTest

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    Client,
    ConnectFailed,
    ConnectionLost,
    KeyBusy,
    KeyStatus,
    LockLost,
    LockTimeout,
    ServerError,
)
from tests.servers import environment, fake_server, have_ipv6, start_server

WITHIN = 5.0  # seconds anything that should happen "at once" may take


class ClientTestCase(SynchronousTestCase):
    def client(self, servers: Any, **options: Any) -> Client:
        client = Client(servers, **options)
        self.addCleanup(client.close)
        return client

    def in_thread(self, function: Callable[[], Any]) -> dict[str, Any]:
        """Run C{function} in a thread; the dict gets its C{result} or C{error}, then C{done} is set."""
        outcome: dict[str, Any] = {"done": threading.Event()}

        def run() -> None:
            try:
                outcome["result"] = function()
            except BaseException as error:
                outcome["error"] = error
            outcome["done"].set()

        threading.Thread(target=run, daemon=True).start()
        return outcome

    def wait_for(self, condition: Callable[[], bool], within: float = WITHIN) -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for a condition")
            time.sleep(0.01)


class LockingTests(ClientTestCase):
    def setUp(self) -> None:
        self.server = start_server(self)
        self.first = self.client(self.server.address)
        self.second = self.client(self.server.address)

    def test_contention(self) -> None:
        """A held mutex makes another client wait until it is released; then that client gets it."""
        lock = self.first.lock("report")
        self.assertRaises(LockTimeout, self.second.lock, "report", wait=0)
        waiting = self.in_thread(lambda: self.second.lock("report"))
        self.wait_for(lambda: self.first.status("report") == KeyStatus("report", 1, 1))
        self.assertFalse(waiting["done"].is_set())
        self.assertTrue(lock.release())
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertTrue(waiting["result"].held)
        self.assertEqual(self.first.status("report"), KeyStatus("report", 1, 0))
        self.assertFalse(lock.held)
        self.assertFalse(lock.release())  # a second release does nothing

    def test_wait_timeout(self) -> None:
        """A wait times out with LockTimeout; a fractional wait is rounded up to whole seconds."""
        self.first.lock("report")
        started = time.monotonic()
        with self.assertRaises(LockTimeout) as caught:
            self.second.lock("report", wait=0.3)
        self.assertEqual(caught.exception.key, "report")
        self.assertTrue(1.0 <= time.monotonic() - started < 1.0 + WITHIN)
        self.assertEqual(self.second.status("report"), KeyStatus("report", 1, 0))

    def test_context_manager(self) -> None:
        with self.first.lock("report", wait=10) as lock:
            self.assertEqual(self.second.status("report"), KeyStatus("report", 1, 0))
            self.assertTrue(lock.held)
        self.assertTrue(lock.released)
        self.assertEqual(self.second.status("report"), KeyStatus("report", 0, 0))

    def test_context_manager_releases_on_error(self) -> None:
        with self.assertRaises(ZeroDivisionError):
            with self.first.lock("report"):
                1 / 0
        self.assertEqual(self.second.status("report"), KeyStatus("report", 0, 0))

    def test_semaphore(self) -> None:
        third = self.client(self.server.address)
        self.first.lock("slots", max_concurrent=2)
        self.second.lock("slots", max_concurrent=2)
        self.assertRaises(LockTimeout, third.lock, "slots", max_concurrent=2, wait=0)
        self.assertEqual(third.status("slots"), KeyStatus("slots", 2, 0))

    def test_renewal_keeps_the_lock_past_expires(self) -> None:
        """
        Renewed automatically, a lock with a 1 s failsafe is still held after
        2.5 s; the same lock without renewal expired, and its release says so.
        """
        renewed = self.first.lock("renewed", expires=1, auto_renew=True)
        forgotten = self.first.lock("forgotten", expires=1)
        self.assertEqual(renewed.renew_interval, 1 / 3)
        time.sleep(2.5)
        self.assertEqual(self.second.status("renewed"), KeyStatus("renewed", 1, 0))
        self.assertRaises(LockTimeout, self.second.lock, "renewed", wait=0)
        self.assertEqual(self.second.status("forgotten"), KeyStatus("forgotten", 0, 0))
        self.assertTrue(renewed.held and 0 < renewed.seconds_left <= 1)
        self.assertFalse(forgotten.release())
        self.assertTrue(forgotten.lost)
        self.assertIn("expired", forgotten.lost_reason.reason)
        self.assertTrue(renewed.release())
        time.sleep(2 * renewed.renew_interval)  # a renewal sent now would take it again
        self.assertEqual(self.second.status("renewed"), KeyStatus("renewed", 0, 0))

    def test_renew_by_hand(self) -> None:
        lock = self.first.lock("report", expires=60)
        lock.renew()
        self.assertTrue(59 < lock.seconds_left <= 60)
        lock.release()
        self.assertRaises(LockLost, lock.renew)

    def test_expires_never(self) -> None:
        lock = self.first.lock("report", expires=None)
        self.assertIsNone(lock.seconds_left)
        self.assertIsNone(lock.renew_interval)

    def test_one_request_per_key(self) -> None:
        """A client holds a key once; asking again is refused locally."""
        lock = self.first.lock("report")
        self.assertRaises(KeyBusy, self.first.lock, "report", wait=0)
        lock.release()
        self.first.lock("report").release()

    def test_interrupted_wait_does_not_leave_the_lock_held(self) -> None:
        """
        KeyboardInterrupt during a wait cannot withdraw the request from the
        server; when it is granted later, the client releases it at once.
        """
        holder = self.first.lock("report")
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        self.addCleanup(timer.cancel)
        with self.assertRaises(KeyboardInterrupt):
            self.second.lock("report")
        self.assertEqual(self.first.status("report"), KeyStatus("report", 1, 1))
        self.assertRaises(KeyBusy, self.second.lock, "report", wait=0)
        holder.release()
        self.wait_for(lambda: self.first.status("report") == KeyStatus("report", 0, 0))
        self.second.lock("report", wait=0).release()

    def test_threads_share_a_connection(self) -> None:
        """One client's waiting lock does not hold up its other requests, nor its renewals."""
        self.second.lock("b")
        renewed = self.first.lock("a", expires=1, auto_renew=True)
        waiting = self.in_thread(lambda: self.first.lock("b"))
        time.sleep(1.5)
        self.assertEqual(self.first.status("a"), KeyStatus("a", 1, 0))
        self.assertTrue(renewed.held)
        self.assertFalse(waiting["done"].is_set())
        self.assertEqual(self.first.status("b"), KeyStatus("b", 1, 1))

    def test_listing_and_ping(self) -> None:
        self.first.lock("b", max_concurrent=2)
        self.second.lock("b", max_concurrent=2)
        self.first.lock("a")
        waiting = self.in_thread(lambda: self.second.lock("a"))
        self.wait_for(lambda: self.first.status("a").waiting == 1)
        self.assertEqual(self.first.listing(), [KeyStatus("a", 1, 1), KeyStatus("b", 2, 0)])
        self.assertEqual([row.key for row in self.first.listing("grants")], ["b", "a"])
        self.assertEqual([row.key for row in self.first.listing("requests")], ["a", "b"])
        self.assertRaises(ValueError, self.first.listing, "size")
        [(address, seconds)] = self.first.ping().items()
        self.assertEqual(address, self.server.address)
        self.assertTrue(0 < seconds < WITHIN)
        self.assertFalse(waiting["done"].is_set())

    def test_bad_arguments_never_reach_the_server(self) -> None:
        self.assertRaises(ValueError, self.first.lock, "two words")
        self.assertRaises(ValueError, self.first.lock, "k", max_concurrent=0)
        self.assertRaises(ValueError, self.first.lock, "k", wait=-1)
        self.assertRaises(ValueError, self.first.status, "")

    def test_no_reactor(self) -> None:
        """The blocking client never touches the Twisted reactor."""
        script = (
            "import sys\n"
            "from jesync.client import Client\n"
            f"with Client({self.server.address!r}) as client:\n"
            "    client.lock('k').release()\n"
            "assert 'twisted.internet.reactor' not in sys.modules\n"
        )
        subprocess.run([sys.executable, "-c", script], env=environment(), check=True, timeout=30)


class ServerGoneTests(ClientTestCase):
    def test_server_killed_while_holding(self) -> None:
        """
        SIGKILL the server: held locks are lost (callbacks called, renewal
        stopped, release() False, the with block raises LockLost), waiting
        requests fail with ConnectionLost, the server is unreachable; once it
        is back, the client reconnects but the old locks stay lost.
        """
        server = start_server(self)
        client = self.client(server.address)
        other = self.client(server.address)
        other.lock("busy")
        held = client.lock("report", expires=1, auto_renew=True)
        lost = []
        told = threading.Event()
        held.add_lost_callback(lost.append)
        held.add_lost_callback(lambda error: told.set())
        waiting = self.in_thread(lambda: client.lock("busy"))
        self.wait_for(lambda: other.status("busy").waiting == 1)
        with self.assertRaises(LockLost):
            with client.lock("block"):
                server.kill()
                self.assertTrue(told.wait(WITHIN))
        self.assertTrue(held.lost)
        self.assertEqual(len(lost), 1)
        self.assertIn("connection", lost[0].reason)
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertIsInstance(waiting["error"], ConnectionLost)
        self.assertFalse(held.release())
        self.assertRaises(LockLost, held.renew)
        self.assertRaises(ConnectFailed, client.status, "report")
        server.start()
        self.assertEqual(client.status("report"), KeyStatus("report", 0, 0))
        self.assertTrue(held.lost)
        again = client.lock("report", wait=0)
        self.assertTrue(again.held)
        self.assertFalse(held.release())
        self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))
        held.add_lost_callback(lost.append)  # already lost: called at once
        self.assertEqual(len(lost), 2)

    def test_unreachable(self) -> None:
        from tests.servers import free_port

        client = self.client(f"127.0.0.1:{free_port()}", connect_timeout=2)
        with self.assertRaises(ConnectFailed) as caught:
            client.lock("report")
        self.assertIn("cannot connect", str(caught.exception))

    def test_silent_server(self) -> None:
        """A server that stops answering is given up for dead after read_timeout."""
        server = fake_server(self, lambda line: None)
        client = self.client(server.address, read_timeout=0.5)
        started = time.monotonic()
        with self.assertRaises(ConnectionLost) as caught:
            client.status("report")
        self.assertIn("no reply within 0.5 s", str(caught.exception))
        self.assertTrue(0.5 <= time.monotonic() - started < WITHIN)

    def test_waiting_is_not_silence(self) -> None:
        """A lock that waits owes no reply: the read timeout does not cut it short."""
        server = start_server(self)
        self.client(server.address).lock("report")
        client = self.client(server.address, read_timeout=0.3)
        with self.assertRaises(LockTimeout):
            client.lock("report", wait=1)

    def test_server_error(self) -> None:
        """A refusal carries the server's message; the connection stays usable."""

        def respond(line: bytes) -> bytes:
            if line.startswith(b"lock"):
                return b"INVALID_PARAMETER: no thanks\n"
            if line.startswith(b"status"):
                return b"STATUS 0 0 %s\n" % line.split()[1]
            return b"INVALID_COMMAND\n"  # fencing: an older server

        client = self.client(fake_server(self, respond).address)
        with self.assertRaises(ServerError) as caught:
            client.lock("report")
        self.assertEqual(caught.exception.message, "INVALID_PARAMETER: no thanks")
        self.assertEqual(client.status("report"), KeyStatus("report", 0, 0))

    def test_garbage_reply(self) -> None:
        client = self.client(fake_server(self, lambda line: b"HELLO\n").address)
        with self.assertRaises(ConnectionLost) as caught:
            client.status("report")
        self.assertIn("not a JESync reply", str(caught.exception))


class AddressTests(ClientTestCase):
    def test_unix_socket(self) -> None:
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        server = start_server(self, unix_socket=os.path.join(directory, "jesync.sock"))
        client = self.client(server.address)
        with client.lock("report"):
            self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))

    def test_ipv6(self) -> None:
        if not have_ipv6():
            raise SkipTest("no IPv6 loopback here")
        server = start_server(self, ipv6=True)
        self.assertTrue(server.address.startswith("[::1]:"))
        client = self.client(server.address)
        with client.lock("report"):
            self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))

    def test_host_name(self) -> None:
        server = start_server(self)
        client = self.client(server.address.replace("127.0.0.1", "localhost"))
        self.assertEqual(client.status("report"), KeyStatus("report", 0, 0))

    def test_several_servers_php_placement(self) -> None:
        """
        With the PHP placement, nightly-report (md5 c38..., 3128) lives on
        the first of two servers and user:42 (56d..., 1389) on the second.
        """
        first, second = start_server(self), start_server(self)
        client = self.client([first.address, second.address], placement="php")
        client.lock("nightly-report")
        client.lock("user:42")
        self.assertEqual(str(client.server_for("nightly-report")), first.address)
        self.assertEqual(self.client(first.address).listing(), [KeyStatus("nightly-report", 1, 0)])
        self.assertEqual(self.client(second.address).listing(), [KeyStatus("user:42", 1, 0)])
        self.assertEqual([row.key for row in client.listing()], ["nightly-report", "user:42"])
        self.assertEqual(sorted(client.ping()), sorted([first.address, second.address]))
