"""
Handles that tell the truth: a lock whose failsafe ran out is lost at that
moment (counted from when it was requested), C{owned()} asks the server, and
C{holders()} says who holds a key: here, the sans-I/O core with a fake
clock.  Every client says the same against a real server in the client
contract (L{tests.tcp.test_client_contract}: C{test_lost_by_itself},
C{test_owned}, C{test_holders}), and the Twisted client against the real
server in memory (L{tests.unit.test_client_twisted}).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import Holder
from jesync.client.wire import parse_reply
from tests.fake_session import FakeSession

WITHIN = 5.0


class DeadlineCoreTests(SynchronousTestCase):
    def test_counted_from_the_request(self) -> None:
        """The deadline is counted from when the lock was asked for, not from when its grant arrived."""
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 0, 10)
        s.now += 0.5  # the round trip
        s.reply(b"GRANTED 1 0 k 10 7", b"STATUS 1 0 k")
        lock = s.results["lock"]
        self.assertEqual(lock.deadline, 1010.0)
        self.assertEqual(s.session.next_deadline(), 1010.0)
        s.tick(9.4)
        self.assertTrue(lock.held)
        self.assertEqual(s.lost, [])
        s.take_sent()
        s.tick(0.1)
        self.assertTrue(lock.lost)
        self.assertIn("expired", lock.lost_reason.reason)
        self.assertEqual(s.lost, [lock.lost_reason])
        self.assertEqual(s.take_sent(), b"release k\n")  # so the server agrees at once
        self.assertIsNone(s.session.next_deadline())

    def test_waiting_lock_counts_one_round_trip(self) -> None:
        """A lock that waited: its grant is taken to have been made one round trip before its answer arrived."""
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 60, 10)
        s.now += 0.25
        s.reply(b"STATUS 1 1 k")  # the fence: it waits
        s.now += 30
        s.reply(b"GRANTED 1 0 k 10 7")
        self.assertEqual(s.results["lock"].deadline, 1030.25 - 0.25 + 10)

    def test_renewal_moves_the_deadline(self) -> None:
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 0, 3)
        s.reply(b"GRANTED 1 0 k 3 7", b"STATUS 1 0 k")
        lock = s.results["lock"]
        s.tick(2)
        s.call("renew", s.session.renew, lock)
        s.now += 0.2
        s.reply(b"GRANTED 1 0 k 3 7", b"STATUS 1 0 k")
        self.assertEqual(lock.deadline, 1005.0)
        s.tick(2.7)
        self.assertTrue(lock.held)
        s.tick(0.3)
        self.assertTrue(lock.lost)

    def test_never_expires(self) -> None:
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 0, 0)
        s.reply(b"GRANTED 1 0 k 0 7", b"STATUS 1 0 k")
        self.assertIsNone(s.results["lock"].deadline)
        self.assertIsNone(s.session.next_deadline())
        s.tick(10**6)
        self.assertTrue(s.results["lock"].held)

    def test_release_after_expiry(self) -> None:
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 0, 1)
        s.reply(b"GRANTED 1 0 k 1 7", b"STATUS 1 0 k")
        s.tick(1)
        s.call("release", s.session.release, s.results["lock"])
        self.assertIs(s.results["release"], False)

    def test_owned(self) -> None:
        """owned: each key asked; OWNED keeps it held (and never moves the deadline later), NOT_OWNED loses it."""
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 0, 60)
        s.reply(b"GRANTED 1 0 k 60 7", b"STATUS 1 0 k")
        lock = s.results["lock"]
        s.take_sent()
        s.call("owned", s.session.owned, lock)
        self.assertEqual(s.take_sent(), b"owned k\n")
        s.reply(b"OWNED 30000 k")
        self.assertIs(s.results["owned"], True)
        self.assertEqual(lock.deadline, 1030.0)
        s.call("owned", s.session.owned, lock)
        s.reply(b"NOT_OWNED k")
        self.assertIs(s.results["owned"], False)
        self.assertTrue(lock.lost)
        self.assertEqual(s.session.take_lost(), [lock])
        s.take_sent()
        s.call("owned", s.session.owned, lock)  # not asked again
        self.assertEqual(s.take_sent(), b"")
        self.assertIs(s.results["owned"], False)

    def test_owned_without_expiry(self) -> None:
        s = FakeSession()
        s.call("lock", s.session.lock_many, ("a", "b"), 0, 0)
        s.reply(b"GRANTED-MANY 2 0 a b 1 2", b"STATUS 1 0 a")
        s.take_sent()
        s.call("owned", s.session.owned, s.results["lock"])
        self.assertEqual(s.take_sent(), b"owned a\nowned b\n")
        s.reply(b"OWNED -1 a", b"OWNED -1 b")
        self.assertIs(s.results["owned"], True)
        self.assertIsNone(s.results["lock"].deadline)

    def test_holders(self) -> None:
        s = FakeSession()
        s.call("holders", s.session.holders, "k")
        self.assertEqual(s.take_sent(), b"holders k\n")
        s.reply(b"HOLDER k 127.0.0.1:5000 12 48 7", b"HOLDER k unix:/tmp/a b 0 0 8", b"END")
        self.assertEqual(
            s.results["holders"],
            [Holder("k", "127.0.0.1:5000", 12, 48, 7), Holder("k", "unix:/tmp/a b", 0, 0, 8)],
        )
        s.call("none", s.session.holders, "k")
        s.reply(b"END")
        self.assertEqual(s.results["none"], [])

    def test_parse(self) -> None:
        self.assertEqual(parse_reply(b"OWNED 1500 k").ms_left, 1500)
        self.assertEqual(parse_reply(b"NOT_OWNED k").keys, ("k",))
        self.assertEqual(parse_reply(b"HOLDER k detached-session 3 0 9").holder, Holder("k", "detached-session", 3, 0, 9))
