"""
The blocking client's own ways, against the real server in a thread of this
process over real TCP (L{tests.servers.serve_in_thread}): its C{with}
statement, a wait interrupted by KeyboardInterrupt, threads sharing one
connection, a Unix socket, IPv6 and a host name.  What every client
promises is said once, in L{tests.tcp.test_client_contract}.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from unittest import SkipTest

from jesync.client import Client, KeyBusy, KeyStatus, LockLost
from tests.client_case import WITHIN, ClientTestCase
from tests.servers import have_ipv6, serve_in_thread


class LockingTests(ClientTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)
        self.first = self.client(self.server.address)
        self.second = self.client(self.server.address)

    def test_context_manager(self) -> None:
        with self.first.lock("report", wait=10) as lock:
            self.assertEqual(self.second.status("report"), KeyStatus("report", 1, 0))
            self.assertTrue(lock.held)
        self.assertTrue(lock.released)
        self.assertEqual(self.second.status("report"), KeyStatus("report", 0, 0))

    def test_client_as_context_manager(self) -> None:
        """A client used in a C{with} statement closes at its end: the server releases what it held."""
        with Client(self.server.address) as client:
            client.lock("report")
            self.assertEqual(self.second.status("report"), KeyStatus("report", 1, 0))
        self.wait_for(lambda: self.second.status("report") == KeyStatus("report", 0, 0))

    def test_context_manager_releases_on_error(self) -> None:
        with self.assertRaises(ZeroDivisionError):
            with self.first.lock("report"):
                1 / 0
        self.assertEqual(self.second.status("report"), KeyStatus("report", 0, 0))

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


class ServerGoneTests(ClientTestCase):
    def test_with_block_raises_when_the_server_dies(self) -> None:
        """
        The server dies inside a C{with} block: the block raises LockLost
        (the rest of a dead server's story is the contract's:
        L{tests.tcp.test_client_contract.ClientContract.test_server_killed_while_holding}).
        """
        server = serve_in_thread(self)
        client = self.client(server.address)
        told = threading.Event()
        with self.assertRaises(LockLost):
            with client.lock("block") as lock:
                lock.add_lost_callback(lambda error: told.set())
                server.kill()
                self.assertTrue(told.wait(WITHIN))
        self.assertTrue(lock.lost)
        self.assertIn("connection", lock.lost_reason.reason)


class AddressTests(ClientTestCase):
    def test_unix_socket(self) -> None:
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        server = serve_in_thread(self, unix_socket=os.path.join(directory, "jesync.sock"))
        client = self.client(server.address)
        with client.lock("report"):
            self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))

    def test_ipv6(self) -> None:
        if not have_ipv6():
            raise SkipTest("no IPv6 loopback here")
        server = serve_in_thread(self, ipv6=True)
        self.assertTrue(server.address.startswith("[::1]:"))
        client = self.client(server.address)
        with client.lock("report"):
            self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))

    def test_host_name(self) -> None:
        server = serve_in_thread(self)
        client = self.client(server.address.replace("127.0.0.1", "localhost"))
        self.assertEqual(client.status("report"), KeyStatus("report", 0, 0))
