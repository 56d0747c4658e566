"""
Failing over between the members of a cluster (C{a:1|b:2|c:3}), the rule
alone: the order members are tried in and when to pause
(L{jesync.client.cluster}), a session's answer deadlines on a fake clock
(L{jesync.client.session}), and the command line's --terminate-on-loss
options.  The clients against real servers standing in for the members are
in tests/tcp/test_client_failover.py.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.trial.unittest import SynchronousTestCase

from jesync.cli import parse_arguments
from jesync.client import AuthFailed, ConnectionLost, parse_address
from jesync.client.address import TCPAddress
from jesync.client.cluster import Members
from jesync.client.config import Backoff
from jesync.client.errors import ConnectFailed as Failed
from tests.fake_session import FakeSession


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
