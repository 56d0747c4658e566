"""
Failing over between the members of a cluster (C{a:1|b:2|c:3}): the rule
(L{jesync.client.cluster}, L{jesync.client.session}) on a fake clock, then
the blocking, asyncio and Twisted clients and the command line against real
C{twistd jesync} servers standing in for the members.  The stand-ins share
nothing, which is all client-side failover needs: a member whose port is
closed (a standby), one killed with SIGKILL (a dead leader: its connections
close), and one paused with SIGSTOP (its socket still accepts connections,
and nothing answers).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from twisted.internet import defer, reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from jesync.cli import EXIT_LOCK_LOST, parse_arguments
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
    parse_address,
)
from jesync.client.address import ClusterAddress, TCPAddress
from jesync.client.cluster import Members
from jesync.client.config import Backoff
from jesync.client.errors import ConnectFailed as Failed
from tests.servers import ServerProcess, environment, fake_server, free_port, start_server
from tests.tcp.test_client_handles import FakeSession

WITHIN = 10.0  # seconds anything bounded here may take, on a loaded machine
#: Short timeouts, so that a paused member is passed over quickly.
FAST = dict(connect_timeout=0.5, read_timeout=0.5, retry_backoff=0.05, retry_backoff_max=0.1)


def closed_address() -> str:
    """A loopback address nothing listens on: a standby, which refuses connections."""
    return f"127.0.0.1:{free_port()}"


def pause(testcase: Any, server: ServerProcess) -> None:
    """SIGSTOP C{server} (its listening socket still accepts); SIGCONT it when the test ends."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    testcase.addCleanup(resume, server)


def resume(server: ServerProcess) -> None:
    if server.process is not None and server.process.poll() is None:
        server.process.send_signal(signal.SIGCONT)


def watch(testcase: Any, address: str) -> Client:
    """A client of one stand-in alone, to see what it holds (closed when the test ends)."""
    client = Client(address, environ={})
    testcase.addCleanup(client.close)
    return client


# -- the rule, on a fake clock --------------------------------------------


def failure(member: str, retryable: bool = True) -> Failed:
    return Failed(member, "cannot connect: Connection refused", retryable)


class MemberOrderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.cluster = parse_address("a:1|b:2|c:3")
        self.a, self.b, self.c = self.cluster.members  # type: ignore[union-attr]

    def backoff(self, retries: int = 1, wait: Optional[float] = None) -> Backoff:
        return Backoff(retries, 1.0, 2.0, wait, 0.0, random=lambda: 1.0)

    def test_one_pass_then_the_backoff(self) -> None:
        """Every member in turn without pausing; after a full pass, Backoff's pause; then give up."""
        attempts = Members(self.cluster).attempts(self.backoff(retries=1))
        tried = [attempts.member]
        for _ in range(2):
            self.assertEqual(attempts.failed(failure(str(attempts.member)), 0.0), 0.0)
            tried.append(attempts.member)
        self.assertEqual(tried, [self.a, self.b, self.c])
        self.assertEqual(attempts.failed(failure("c:3"), 0.0), 1.0)  # all failed: retry 1 of 1
        self.assertEqual(attempts.member, self.a)
        for member in ("a:1", "b:2"):
            self.assertEqual(attempts.failed(failure(member), 1.0), 0.0)
        self.assertIsNone(attempts.failed(failure("c:3"), 1.0))
        error = attempts.error()
        self.assertEqual(error.address, "a:1|b:2|c:3")
        self.assertIn("no member of the cluster answered", str(error))
        for member in ("a:1", "b:2", "c:3"):
            self.assertIn(f"{member}: cannot connect: Connection refused", str(error))

    def test_no_wait_still_tries_every_member(self) -> None:
        """wait=0 never retries, but trying the next member is not retrying."""
        attempts = Members(self.cluster).attempts(self.backoff(retries=3, wait=0))
        self.assertEqual(attempts.failed(failure("a:1"), 0.0), 0.0)
        self.assertEqual(attempts.failed(failure("b:2"), 0.0), 0.0)
        self.assertIsNone(attempts.failed(failure("c:3"), 0.0))

    def test_sticky(self) -> None:
        """The member that answered last is tried first, then the others in the order given."""
        members = Members(self.cluster)
        members.answered(self.c)
        self.assertEqual(members.order(), [self.c, self.a, self.b])
        attempts = members.attempts(self.backoff())
        self.assertEqual(attempts.member, self.c)
        attempts.failed(failure("c:3"), 0.0)
        self.assertEqual(attempts.member, self.a)

    def test_not_retryable_is_not_failed_over(self) -> None:
        """A certificate or token file that cannot work ends it at once, as itself."""
        attempts = Members(self.cluster).attempts(self.backoff(retries=3))
        bad = failure("a:1", retryable=False)
        self.assertIsNone(attempts.failed(bad, 0.0))
        self.assertIs(attempts.error(), bad)

    def test_one_server(self) -> None:
        """A server that is not a cluster: its own failure, retried as Backoff says."""
        server = TCPAddress("a", 1)
        members = Members(server)
        self.assertFalse(members.is_cluster)
        attempts = members.attempts(self.backoff(retries=1))
        self.assertEqual(attempts.failed(failure("a:1"), 0.0), 1.0)
        self.assertEqual(attempts.member, server)
        last = failure("a:1")
        self.assertIsNone(attempts.failed(last, 1.0))
        self.assertIs(attempts.error(), last)


class SessionTimeoutTests(SynchronousTestCase):
    def test_confirmed_handshake_waits_for_an_answer(self) -> None:
        """A cluster member's connection is ready only once it has answered fencing on."""
        s = FakeSession()
        ready: list[Any] = []
        s.session.handshake(None, ready.append, ready.append, confirm=True)
        self.assertEqual(s.take_sent(), b"fencing on\n")
        self.assertEqual(ready, [])
        s.reply(b"FENCING ON")
        self.assertEqual(ready, [None])

    def test_confirmed_handshake_with_a_token(self) -> None:
        s = FakeSession()
        ready: list[Any] = []
        s.session.handshake(b"secret", ready.append, ready.append, confirm=True)
        s.reply(b"OK")
        self.assertEqual(ready, [])
        s.reply(b"INVALID_COMMAND")  # a server without fencing answers all the same
        self.assertEqual(ready, [None])

    def test_refused_token_is_not_a_connect_failure(self) -> None:
        s = FakeSession()
        outcome: list[Any] = []
        s.session.handshake(b"wrong", outcome.append, outcome.append, confirm=True)
        s.reply(b"INVALID_PARAMETER: auth failed")
        s.session.fail("the server closed the connection")
        self.assertEqual(len(outcome), 1)
        self.assertIsInstance(outcome[0], AuthFailed)

    def test_waiting_lock_answer_due(self) -> None:
        """A lock that waits up to 3 s is owed its answer 3 s + the margin after it was sent."""
        s = FakeSession()
        s.session.reply_margin = 2.0
        s.call("lock", s.session.lock, "k", 1, 3, 0)
        s.reply(b"STATUS 1 1 k")  # its fence: it waits
        self.assertEqual(s.session.next_deadline(), 1005.0)
        s.now += 4.9
        self.assertIsNone(s.session.expire_overdue())
        s.now += 0.1
        reason = s.session.expire_overdue()
        self.assertEqual(reason, "no answer to the lock on 'k' within 2 s after its wait")
        self.assertTrue(s.session.closed)
        self.assertIsInstance(s.results["lock"], ConnectionLost)

    def test_answered_or_abandoned_lock_is_not_due(self) -> None:
        s = FakeSession()
        s.session.reply_margin = 2.0
        s.call("lock", s.session.lock, "k", 1, 3, 0)
        s.reply(b"STATUS 1 1 k")
        s.reply(b"TIMEOUT 1 1 k")
        self.assertIsNone(s.session.next_deadline())
        s.call("lock", s.session.lock, "j", 1, 3, 0)
        s.session.give_up("j")
        s.reply(b"STATUS 1 1 j")  # its fence arrives after the caller gave up
        s.now += 60
        self.assertIsNone(s.session.expire_overdue())
        self.assertFalse(s.session.closed)
        self.assertIsNone(s.session.next_deadline())

    def test_waiting_for_ever_has_no_due_answer(self) -> None:
        s = FakeSession()
        s.session.reply_margin = 2.0
        s.call("lock", s.session.lock, "k", 1, -1, 0)
        s.reply(b"STATUS 1 1 k")
        self.assertIsNone(s.session.next_deadline())


# -- the blocking client ---------------------------------------------------


class BlockingFailoverTests(SynchronousTestCase):
    def client(self, servers: str, **options: Any) -> Client:
        client = Client(servers, environ={}, **dict(FAST, **options))
        self.addCleanup(client.close)
        return client

    def test_first_member_refuses(self) -> None:
        """A refused connection (a standby) moves on to the next member."""
        member = start_server(self)
        client = self.client(f"{closed_address()}|{member.address}")
        self.assertIsInstance(client.servers[0], ClusterAddress)
        with client.lock("report") as lock:
            self.assertEqual(lock.server, member.address)
            self.assertEqual(watch(self, member.address).status("report"), KeyStatus("report", 1, 0))

    def test_member_killed_while_a_lock_is_held(self) -> None:
        """The lock is lost (callback, owned() False); the next lock goes to the next member."""
        first, second = start_server(self), start_server(self)
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
        paused, serving = start_server(self), start_server(self)
        pause(self, paused)
        client = self.client(f"{paused.address}|{serving.address}")
        started = time.monotonic()
        lock = client.lock("report")
        self.assertLess(time.monotonic() - started, WITHIN)
        self.assertEqual(lock.server, serving.address)
        self.assertEqual(client.status("report"), KeyStatus("report", 1, 0))

    def test_leader_paused_while_a_lock_is_held(self) -> None:
        """A request the paused leader never answers fails the connection: the lock is lost, the next call fails over."""
        first, second = start_server(self), start_server(self)
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
        first, second = start_server(self), start_server(self)
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
        first, second = start_server(self), start_server(self)
        client = self.client(f"{first.address}|{second.address}")
        self.assertEqual(client.lock("a").server, first.address)
        first.kill()
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
        secured = start_server(self, extra_args=["--auth-token-file", token_file], auth_token=b"right")
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
        paused, first, second = start_server(self), start_server(self), start_server(self)
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
        paused, first, second = start_server(self), start_server(self), start_server(self)
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
        resume(paused)
        await client.close()
        self.assertEqual((await client.lock("other")).server, second.address)


# -- the command line ------------------------------------------------------


class CommandLineFailoverTests(SynchronousTestCase):
    def test_terminate_on_loss_options(self) -> None:
        """Unset, it is decided by the server (on for a cluster); either way may be asked for."""
        lock = ["lock", "report", "--", "true"]
        self.assertIsNone(parse_arguments(["-s", "a:1|b:2", *lock]).terminate_on_loss)
        self.assertFalse(
            parse_arguments(["-s", "a:1|b:2", "lock", "--no-terminate-on-loss", *lock[1:]]).terminate_on_loss
        )
        self.assertTrue(parse_arguments(["lock", "--terminate-on-loss", *lock[1:]]).terminate_on_loss)
        self.assertEqual(
            parse_arguments(["-s", "a:1|b:2", "-s", "c:3", *lock]).servers,
            [parse_address("a:1|b:2"), parse_address("c:3")],
        )

    def test_lock_lost_by_failover_stops_the_command(self) -> None:
        """jesync lock on a cluster: the member killed, COMMAND is stopped, one clear line, status 70."""
        member, other = start_server(self), start_server(self)
        directory = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, directory, True)
        started = directory / "started"
        env = dict(environment(), JESYNC_SERVERS=f"{closed_address()}|{member.address}|{other.address}")
        process = subprocess.Popen(
            [sys.executable, "-m", "jesync.cli", "--connect-timeout", "1", "--read-timeout", "1", "lock", "report"]
            + ["--", "sh", "-c", f"touch {started}; exec sleep 30"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(lambda: process.poll() is None and process.kill())
        deadline = time.monotonic() + WITHIN
        while not started.exists():
            self.assertIsNone(process.poll(), "jesync lock ended before its command started")
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.02)
        self.assertEqual(watch(self, member.address).status("report"), KeyStatus("report", 1, 0))
        member.kill()
        _, err = process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, EXIT_LOCK_LOST)
        lost = f"jesync: lost the lock on 'report': the connection to {member.address} was lost (.+); terminating sh"
        self.assertTrue(any(re.fullmatch(lost, line) for line in err.splitlines()), err)
        self.assertIn(f"exited with status {128 + signal.SIGTERM}", err)
        # The next jesync gets it from the member that answers now.
        status = subprocess.run(
            [sys.executable, "-m", "jesync.cli", "--connect-timeout", "1", "status", "report"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("report: 0 holding, 0 waiting", status.stdout)
