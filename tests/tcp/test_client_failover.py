"""
Failing over between the members of a cluster (C{a:1|b:2|c:3}): the
blocking, asyncio and Twisted clients against real servers standing in for
the members (the composition root's, each on a reactor of its own in a
thread: L{serve_in_thread}).  The stand-ins share nothing, which is all
client-side failover needs: a member whose port is closed (a standby), one
killed (a dead leader: its connections close, as on SIGKILL), and one
paused (as on SIGSTOP: its socket still accepts connections, and nothing
answers).  The rule alone is in tests/unit/test_client_failover_rules.py;
the command line's failover in tests/process/test_cli_failover.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from twisted.internet import defer, reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from jesync.client import (
    AsyncClient,
    AuthFailed,
    Client,
    ConnectFailed,
    ConnectionLost,
    KeyStatus,
    LockLost,
    LockTimeout,
    TwistedClient,
)
from jesync.client.address import ClusterAddress
from tests.failover import WITHIN, closed_address, watch
from tests.servers import ServerThread, fake_server, serve_in_thread

#: Short timeouts, so that a paused member is passed over quickly.
FAST = dict(connect_timeout=0.5, read_timeout=0.5, retry_backoff=0.05, retry_backoff_max=0.1)


def pause(testcase: Any, server: ServerThread) -> None:
    """Pause C{server} (its listening socket still accepts); resume it when the test ends."""
    server.pause()
    testcase.addCleanup(server.resume)


# -- the blocking client ---------------------------------------------------


class BlockingFailoverTests(SynchronousTestCase):
    def client(self, servers: str, **options: Any) -> Client:
        client = Client(servers, environ={}, **dict(FAST, **options))
        self.addCleanup(client.close)
        return client

    def test_first_member_refuses(self) -> None:
        """A refused connection (a standby) moves on to the next member."""
        member = serve_in_thread(self)
        client = self.client(f"{closed_address()}|{member.address}")
        self.assertIsInstance(client.servers[0], ClusterAddress)
        with client.lock("report") as lock:
            self.assertEqual(lock.server, member.address)
            self.assertEqual(watch(self, member.address).status("report"), KeyStatus("report", 1, 0))

    def test_member_killed_while_a_lock_is_held(self) -> None:
        """The lock is lost (callback, owned() False); the next lock goes to the next member."""
        first, second = serve_in_thread(self), serve_in_thread(self)
        client = self.client(f"{first.address}|{second.address}")
        lock = client.lock("report", expires=60)
        self.assertEqual(lock.server, first.address)
        lost = threading.Event()
        reasons: list[LockLost] = []
        lock.add_lost_callback(lambda error: (reasons.append(error), lost.set()))
        first.kill()
        self.assertTrue(lost.wait(WITHIN))
        self.assertTrue(lock.lost)
        self.assertIn(f"the connection to {first.address} was lost", reasons[0].reason)
        self.assertFalse(lock.owned())
        again = client.lock("report")
        self.assertEqual(again.server, second.address)
        self.assertTrue(again.owned())
        self.assertFalse(lock.release())

    def test_paused_member_is_passed_over(self) -> None:
        """A paused member's socket accepts, but it never answers: the client moves on within the connect timeout."""
        paused, serving = serve_in_thread(self), serve_in_thread(self)
        pause(self, paused)
        client = self.client(f"{paused.address}|{serving.address}")
        started = time.monotonic()
        lock = client.lock("report")
        self.assertLess(time.monotonic() - started, WITHIN)
        self.assertEqual(lock.server, serving.address)
        self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))

    def test_leader_paused_while_a_lock_is_held(self) -> None:
        """A request the paused leader never answers fails the connection: the lock is lost, the next call fails over."""
        first, second = serve_in_thread(self), serve_in_thread(self)
        client = self.client(f"{first.address}|{second.address}")
        lock = client.lock("report")
        pause(self, first)
        started = time.monotonic()
        with self.assertRaises(LockLost) as caught:
            lock.renew()
        self.assertLess(time.monotonic() - started, WITHIN)
        self.assertIn("no reply within 0.5 s", caught.exception.reason)
        self.assertTrue(lock.lost)
        self.assertEqual(client.status("report"), KeyStatus("report", 0, 0))  # from the second member
        self.assertEqual(client.lock("report").server, second.address)

    def test_waiting_lock_on_a_paused_leader(self) -> None:
        """A lock waiting up to 1 s on a leader that pauses gives up 1 s + read_timeout later."""
        first, second = serve_in_thread(self), serve_in_thread(self)
        watch(self, first.address).lock("report")  # held by another client, on the first member
        client = self.client(f"{first.address}|{second.address}")
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def wait_for_it() -> None:
            try:
                client.lock("report", wait=1)
            except BaseException as error:
                outcome["error"] = error
            done.set()

        threading.Thread(target=wait_for_it, daemon=True).start()
        deadline = time.monotonic() + WITHIN
        while watch(self, first.address).status("report") != KeyStatus("report", 1, 1):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        pause(self, first)
        self.assertTrue(done.wait(WITHIN))
        self.assertIsInstance(outcome["error"], ConnectionLost)
        self.assertNotIsInstance(outcome["error"], LockTimeout)
        self.assertIn("no answer to the lock on 'report' within 0.5 s after its wait", str(outcome["error"]))
        self.assertEqual(client.lock("report", wait=0).server, second.address)

    def test_sticky(self) -> None:
        """After a failover, new connections go to the member that answered, even once the first is back."""
        first, second = serve_in_thread(self), serve_in_thread(self)
        client = self.client(f"{first.address}|{second.address}")
        a = client.lock("a")
        self.assertEqual(a.server, first.address)
        lost = threading.Event()
        a.add_lost_callback(lambda error: lost.set())
        first.kill()
        # Once the client has seen the connection close: a lock sent before that
        # is in flight when it closes, and fails with ConnectionLost instead.
        self.assertTrue(lost.wait(WITHIN))
        self.assertEqual(client.lock("b").server, second.address)
        first.start()  # back, on the same port
        client.close()  # the next request connects again
        self.assertEqual(client.lock("c").server, second.address)
        self.assertEqual(watch(self, first.address).listing(), [])

    def test_no_member_answers(self) -> None:
        """Every member refusing, through every retry: one error naming each."""
        one, two = closed_address(), closed_address()
        client = self.client(f"{one}|{two}", connect_retries=1)
        with self.assertRaises(ConnectFailed) as caught:
            client.status("report")
        message = str(caught.exception)
        self.assertIn("no member of the cluster answered", message)
        self.assertIn(f"{one}: cannot connect", message)
        self.assertIn(f"{two}: cannot connect", message)

    def test_refused_token_is_not_failed_over(self) -> None:
        """A member refusing the auth token raises AuthFailed; the next member is never tried."""
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory, True)
        token_file = os.path.join(directory, "token")
        Path(token_file).write_text("right\n")
        wrong_file = os.path.join(directory, "wrong")
        Path(wrong_file).write_text("wrong\n")
        secured = serve_in_thread(self, extra_args=["--auth-token-file", token_file], auth_token=b"right")
        other = fake_server(self, lambda line: None)
        client = self.client(f"{secured.address}|{other.address}", auth_token_file=wrong_file)
        with self.assertRaises(AuthFailed):
            client.status("report")
        self.assertEqual(other.received, [])


# -- the asyncio client ----------------------------------------------------


def run(test: Callable[[], Any]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(test(), 30)

    return asyncio.run(bounded())


class AsyncFailoverTests(SynchronousTestCase):
    def test_paused_then_killed(self) -> None:
        """Past a paused member to a serving one; that one killed: the lock is lost, the next goes elsewhere."""
        paused, first, second = serve_in_thread(self), serve_in_thread(self), serve_in_thread(self)
        pause(self, paused)

        async def test() -> None:
            async with AsyncClient(f"{paused.address}|{first.address}|{second.address}", environ={}, **FAST) as client:
                lock = await client.lock("report")
                self.assertEqual(lock.server, first.address)
                lost = asyncio.get_running_loop().create_future()
                lock.add_lost_callback(lost.set_result)
                first.kill()
                error = await asyncio.wait_for(lost, WITHIN)
                self.assertIsInstance(error, LockLost)
                self.assertFalse(await lock.owned())
                again = await client.lock("report")
                self.assertEqual(again.server, second.address)  # the paused one is passed over again
                self.assertTrue(await again.owned())

        run(test)


# -- the Twisted client ----------------------------------------------------


class TwistedFailoverTests(TestCase):
    timeout = 60

    def client(self, servers: str) -> TwistedClient:
        client = TwistedClient(reactor, servers, environ={}, **FAST)
        self.addCleanup(client.close)
        return client

    async def test_paused_and_closed_then_killed(self) -> None:
        closed = closed_address()
        paused, first, second = serve_in_thread(self), serve_in_thread(self), serve_in_thread(self)
        pause(self, paused)
        client = self.client(f"{closed}|{paused.address}|{first.address}|{second.address}")
        lock = await client.lock("report")
        self.assertEqual(lock.server, first.address)
        lost: defer.Deferred[LockLost] = defer.Deferred()
        lock.add_lost_callback(lost.callback)
        first.kill()
        error = await lost.addTimeout(WITHIN, reactor)
        self.assertIsInstance(error, LockLost)
        self.assertFalse(await lock.owned())
        again = await client.lock("report")
        self.assertEqual(again.server, second.address)
        self.assertEqual(await client.status("report"), KeyStatus("report", 1, 0))
        # still sticky to the second, though the paused one is back
        paused.resume()
        await client.close()
        self.assertEqual((await client.lock("other")).server, second.address)
