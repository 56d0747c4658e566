"""
The journal's chain of transactions (L{jesync.cluster.journal.Journal}) on
a fake clock and a fake etcd that applies and answers each transaction
when the test says: several in flight at once, each applied only right
after its predecessor (the commit key's value), one that reaches etcd
before its predecessor sent again, late copies and duplicates harmless,
every refusal ending the term, and replies released only in batch order.
tests/etcd/test_cluster_journal.py runs the journal against a real etcd.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.cluster.etcd import Compare, EtcdUnavailable, TxnResult
from jesync.cluster.journal import MAX_IN_FLIGHT, MAX_OPS, Deposed, Journal, Layout
from jesync.cluster.txn_channel import ChannelError
from jesync.service import LockService
from jesync.sessions import SessionTable
from tests.fake_etcd import FakeEtcd


class ChainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.etcd = FakeEtcd()
        self.layout = Layout("c")
        self.election = self.etcd.put(self.layout.leader, b"this member")
        self.locks = LockService(self.clock)
        self.sessions = SessionTable(self.clock, self.locks)
        self.failures: List[str] = []
        self.commits: List[int] = []
        self.journal = self.make_journal()
        self.addCleanup(self.journal.stop)

    def make_journal(self, **extra: Any) -> Journal:
        journal = Journal(
            self.etcd,  # type: ignore[arg-type]
            self.layout,
            self.election,
            self.locks,
            self.clock,
            on_failure=self.failures.append,
            on_commit=lambda count, seconds: self.commits.append(count),
            **extra,
        )
        self.locks.observer = journal
        return journal

    def turn(self, key: str) -> Tuple[Deferred[None], Any]:
        """A lock in a reactor turn of its own: the reply's wait (each turn is a batch: its transaction is sent)."""
        session = self.sessions.start(object())
        self.addCleanup(session.end)
        self.locks.request(key, session, 1, 0, 0)
        waiting = self.journal.durable()
        assert waiting is not None
        replies: List[object] = []
        waiting.addBoth(replies.append)
        self.clock.advance(0)
        return waiting, replies

    def state(self, key: str) -> List[bytes]:
        """The session ids of the held records of C{key} in etcd."""
        return [kv.key for kv in self.etcd.kvs.values() if kv.key.startswith(self.layout.held) and kv.key.endswith(key.encode())]

    def test_several_transactions_are_in_flight_at_once_and_replies_follow_in_order(self) -> None:
        turns = [self.turn(f"k{n}") for n in range(3)]
        self.assertEqual(len(self.etcd.sent), 3)  # none waited for the one before
        first, second, third = self.etcd.sent
        # Each is guarded by the election key and chained to the one before it.
        self.assertEqual(first.compare[1], Compare(self.layout.commit, "MOD", 0))
        self.assertEqual(second.compare[1], Compare(self.layout.commit, "VALUE", first.tag))
        self.assertEqual(third.compare[1], Compare(self.layout.commit, "VALUE", second.tag))
        for request in self.etcd.sent:
            self.assertEqual(request.compare[0], Compare(self.layout.leader, "CREATE", self.election))
        first.commit()
        self.assertEqual([len(replies) for _, replies in turns], [1, 0, 0])
        second.commit()
        third.commit()
        self.assertEqual([replies for _, replies in turns], [[None]] * 3)
        self.assertEqual(self.etcd.kvs[self.layout.commit].value, third.tag)
        self.assertEqual((self.journal.transactions, self.journal.resent, self.failures), (3, 0, []))
        self.assertEqual(self.commits, [2, 2, 2])  # (a session's record and its key, each)

    def test_an_answer_out_of_order_releases_every_batch_before_it_in_order(self) -> None:
        turns = [self.turn(f"k{n}") for n in range(3)]
        order: List[int] = []
        for index, (waiting, _) in enumerate(turns):
            waiting.addCallback(lambda _, index=index: order.append(index))
        first, second, third = self.etcd.sent
        for request in (first, second, third):
            request.apply()  # in etcd, in order
        third.reply()  # ...but the last answer arrives first: all three are in etcd
        self.assertEqual(order, [0, 1, 2])
        first.reply()
        second.reply()  # (late answers change nothing)
        self.assertEqual(order, [0, 1, 2])
        self.assertEqual((self.failures, len(self.etcd.sent)), ([], 3))

    def test_a_transaction_that_reaches_etcd_before_its_predecessor_is_sent_again_after_it(self) -> None:
        (_, one), (_, two) = self.turn("a"), self.turn("b")
        first, second = self.etcd.sent
        second.commit()  # first in etcd: the commit key is not yet the first's tag
        self.assertFalse(second.result.succeeded)
        self.assertEqual((one, two, self.failures, len(self.etcd.sent)), ([], [], [], 2))
        self.assertEqual(self.state("b"), [])
        first.commit()
        self.assertEqual((one, two), ([None], []))
        again = self.etcd.sent[2]  # sent again once the first is in etcd
        self.assertEqual((again.compare, again.success), (second.compare, second.success))
        again.commit()
        self.assertEqual(two, [None])
        self.assertEqual((self.journal.transactions, self.journal.resent, self.failures), (2, 1, []))
        self.assertEqual(self.etcd.kvs[self.layout.commit].value, second.tag)

    def test_an_early_answer_after_its_predecessors_is_sent_again_at_once(self) -> None:
        (_, one), (_, two) = self.turn("a"), self.turn("b")
        first, second = self.etcd.sent
        second.apply()  # early in etcd...
        first.commit()
        self.assertEqual((one, two), ([None], []))
        self.assertEqual(len(self.etcd.sent), 2)
        second.reply()  # ...its answer comes after the first's
        self.etcd.sent[2].commit()
        self.assertEqual((two, self.failures), ([None], []))

    def test_an_early_answer_of_one_already_known_applied_is_not_sent_again(self) -> None:
        (_, one), (_, two) = self.turn("a"), self.turn("b")
        first, second = self.etcd.sent
        early = self.etcd.evaluate(second.compare, second.success, second.failure)  # a copy, early
        first.apply()
        second.commit()
        self.assertEqual((one, two), ([None], [None]))
        first.reply()
        second.answer = Deferred()  # (the early copy's answer, as the client could give it)
        second.answer.callback(early)
        self.assertEqual((len(self.etcd.sent), self.failures), (2, []))

    def test_an_answer_saying_it_was_applied_already_counts_as_applied(self) -> None:
        """A copy of the transaction applied first (the client retried it): its own tag, or a later one, is in the commit key."""
        (_, one), (_, two) = self.turn("a"), self.turn("b")
        first, second = self.etcd.sent
        first.apply()  # copies that landed
        second.apply()
        first.commit()  # the first's retry: refused, the commit key at a later tag than its own
        self.assertFalse(first.result.succeeded)
        self.assertEqual((one, two, self.failures), ([None], [], []))
        second.commit()  # the second's retry: refused, the commit key at its own tag
        self.assertFalse(second.result.succeeded)
        self.assertEqual((two, self.failures, len(self.etcd.sent)), ([None], [], 2))

    def test_a_late_copy_of_an_older_transaction_cannot_land(self) -> None:
        self.turn("a")
        self.turn("b")
        first, second = self.etcd.sent
        first.commit()
        second.commit()
        self.locks.release("a", next(iter(self.sessions.sessions())))
        self.clock.advance(0)
        self.etcd.sent[2].commit()
        state = dict(self.etcd.kvs)
        self.assertFalse(first.apply().succeeded)  # its guard: the commit key as it was before it
        self.assertFalse(second.apply().succeeded)
        self.assertEqual(self.etcd.kvs, state)

    def test_a_write_refused_as_deposed_ends_the_term_and_fails_every_waiting_reply(self) -> None:
        (_, one), (_, two) = self.turn("a"), self.turn("b")
        self.etcd.put(self.layout.leader + b"x", b"")  # (unrelated)
        del self.etcd.kvs[self.layout.leader]
        self.etcd.put(self.layout.leader, b"another member")  # a new election key
        first, second = self.etcd.sent
        second.commit()
        self.assertEqual(len(self.failures), 1)
        self.assertIn("election key", self.failures[0])
        first.commit()  # (refused too; and too late to matter)
        self.assertEqual((one, two), ([], []))
        self.clock.advance(0)
        for replies in (one, two):
            self.assertIsInstance(replies[0], Failure)
            replies[0].trap(Deposed)
        self.assertEqual(len(self.etcd.sent), 2)  # nothing more sent
        self.failureResultOf(self.journal.durable(), Deposed)

    def test_a_commit_key_written_by_anyone_else_ends_the_term(self) -> None:
        for value in (b"someone else", b"%d:1" % self.election, b"%d:x:0" % self.election, b"%d:1:0" % (self.election + 1)):
            with self.subTest(value=value):
                self.setUp()
                self.turn("a")
                self.etcd.put(self.layout.commit, value)
                self.etcd.sent[0].commit()
                self.assertEqual(len(self.failures), 1)
                self.assertIn("someone else", self.failures[0])

    def test_a_commit_key_deleted_ends_the_term(self) -> None:
        self.turn("a")
        self.turn("b")
        first, second = self.etcd.sent
        first.commit()
        del self.etcd.kvs[self.layout.commit]
        second.commit()  # as if early (sent before the first was known to be in etcd): sent again
        self.assertEqual(self.failures, [])
        self.etcd.sent[2].commit()  # sent after it: the commit key went back
        self.assertEqual(len(self.failures), 1)
        self.assertIn("someone else", self.failures[0])
        self.assertEqual(len(self.etcd.sent), 3)

    def test_a_commit_key_moved_back_under_one_sent_again_ends_the_term(self) -> None:
        """One sent again (after its predecessor is known in etcd) cannot come back early: anyone else wrote."""
        self.turn("a")
        self.turn("b")
        first, second = self.etcd.sent
        second.commit()
        first.apply()
        saved = self.etcd.kvs.pop(self.layout.commit)
        first.reply()
        self.etcd.sent[2].commit()
        self.assertEqual(len(self.failures), 1)
        self.assertIn("someone else", self.failures[0])
        self.assertEqual((len(self.etcd.sent), saved.value), (3, first.tag))

    def test_a_term_that_found_a_commit_key_chains_from_its_revision(self) -> None:
        previous = self.etcd.put(self.layout.commit, b"1:9:0")  # the last term's tag
        self.journal.stop()
        self.journal = self.make_journal(commit_revision=previous)
        self.turn("a")
        self.turn("b")
        first, second = self.etcd.sent
        self.assertEqual(first.compare[1], Compare(self.layout.commit, "MOD", previous))
        second.commit()  # early: the commit key is still the last term's
        self.assertEqual(self.failures, [])
        first.commit()
        self.etcd.sent[2].commit()
        self.assertEqual((self.failures, self.etcd.kvs[self.layout.commit].value), ([], second.tag))

    def test_a_lost_write_ends_the_term(self) -> None:
        (_, one) = self.turn("a")
        self.etcd.sent[0].answer.errback(Failure(EtcdUnavailable("no etcd endpoint answered txn within 2 s")))
        self.assertEqual(self.failures, ["a durable write failed: no etcd endpoint answered txn within 2 s"])
        self.clock.advance(0)
        one[0].trap(Deposed)

    def test_a_lost_answer_of_a_write_known_in_etcd_does_not_end_the_term(self) -> None:
        """Its answer lost, its retries failing; a later one in the chain applied says it is in etcd."""
        (_, one), (_, two) = self.turn("a"), self.turn("b")
        first, second = self.etcd.sent
        first.apply()
        second.commit()
        self.assertEqual((one, two), ([None], [None]))
        first.answer.errback(Failure(EtcdUnavailable("no etcd endpoint answered txn within 2.25 s")))
        self.assertEqual(self.failures, [])
        (_, three) = self.turn("c")
        self.etcd.sent[-1].commit()
        self.assertEqual((three, self.failures), ([None], []))

    def test_the_place_in_flight_of_a_write_known_in_etcd_is_freed_when_its_answer_is_lost(self) -> None:
        turns = [self.turn(f"k{n}") for n in range(MAX_IN_FLIGHT)]
        self.etcd.sent[0].apply()  # its answer is still awaited (then lost)
        self.etcd.sent[1].commit()
        turns += [self.turn("x"), self.turn("y")]
        self.assertEqual(len(self.etcd.sent), MAX_IN_FLIGHT + 1)  # "y" waits: eight are in flight
        self.etcd.sent[0].answer.errback(Failure(EtcdUnavailable("no etcd endpoint answered txn within 2.25 s")))
        self.assertEqual(len(self.etcd.sent), MAX_IN_FLIGHT + 2)
        for request in self.etcd.sent[2:]:
            request.commit()
        self.assertEqual([replies for _, replies in turns], [[None]] * len(turns))
        self.assertEqual(self.failures, [])

    def test_at_most_max_in_flight_and_what_waits_is_one_batch(self) -> None:
        turns = [self.turn(f"k{n}") for n in range(MAX_IN_FLIGHT + 5)]
        self.assertEqual(len(self.etcd.sent), MAX_IN_FLIGHT)
        self.etcd.sent[0].commit()
        self.assertEqual(len(self.etcd.sent), MAX_IN_FLIGHT + 1)
        last = self.etcd.sent[-1]
        self.assertEqual(len(last.success), 5 * 2 + 1)  # the five turns that waited, in one batch
        for request in self.etcd.sent[1:]:
            request.commit()
        self.assertEqual([replies for _, replies in turns], [[None]] * len(turns))
        self.assertEqual(self.failures, [])

    def test_transactions_sent_again_are_at_most_max_in_flight_too(self) -> None:
        for n in range(5 * MAX_OPS):  # two operations each: ten transactions
            self.locks.request(f"k{n}", self.sessions.start(object()), 1, 0, 0)
        waiting = self.journal.durable()
        self.clock.advance(0)
        self.assertEqual(len(self.etcd.sent), MAX_IN_FLIGHT)
        for request in self.etcd.sent[1:]:  # every one but the first reaches etcd before it
            request.commit()
        for request in self.etcd.sent[MAX_IN_FLIGHT:]:  # (the last two, sent as places came free)
            request.commit()
        self.assertEqual(len(self.etcd.sent), 10)
        self.etcd.sent[0].commit()
        # Nine came back early: eight go again, the ninth once a place is free.
        self.assertEqual(len(self.etcd.sent), 10 + MAX_IN_FLIGHT)
        self.etcd.sent[10].commit()
        self.assertEqual(len(self.etcd.sent), 10 + MAX_IN_FLIGHT + 1)
        self.assertEqual(self.etcd.sent[-1].success, self.etcd.sent[9].success)
        for request in self.etcd.sent[11:]:
            request.commit()
        self.successResultOf(waiting)
        self.assertEqual((self.journal.transactions, self.journal.resent, self.failures), (10, 9, []))

    def test_a_batch_of_several_transactions_is_released_once_all_are_in_etcd(self) -> None:
        for n in range(MAX_OPS + 1):  # two operations each: three transactions
            self.locks.request(f"k{n}", self.sessions.start(object()), 1, 0, 0)
        waiting = self.journal.durable()
        self.clock.advance(0)
        (_, later) = self.turn("later")
        self.assertEqual(len(self.etcd.sent), 4)
        self.etcd.sent[0].commit()
        self.etcd.sent[1].commit()
        self.assertNoResult(waiting)
        self.etcd.sent[2].commit()
        self.successResultOf(waiting)
        self.assertEqual((later, self.commits), ([], [2 * MAX_OPS + 2]))
        self.etcd.sent[3].commit()
        self.assertEqual(later, [None])

    def test_answers_after_the_term_ended_are_ignored(self) -> None:
        (_, one) = self.turn("a")
        self.journal.stop()
        self.etcd.sent[0].commit()
        self.assertEqual(len(one), 1)
        one[0].trap(Deposed)
        self.assertEqual(self.journal.committed_mark, 0)


class StandInChannel:
    """A lean path that fails every request with C{error} (by default: unanswered)."""

    def __init__(self, error: Optional[Exception] = None) -> None:
        self.sent = 0
        self.closed = False
        self.error = error

    def txn(self, compare, success, failure=()) -> Deferred[TxnResult]:
        self.sent += 1
        answer: Deferred[TxnResult] = Deferred()
        answer.errback(Failure(self.error or ChannelError("no answer within 0.5 s")))
        return answer

    def close(self) -> None:
        self.closed = True


class ChannelFallbackTests(SynchronousTestCase):
    def test_a_transaction_the_channel_got_no_answer_for_goes_through_the_client(self) -> None:
        self.check_fallback(StandInChannel())

    def test_an_etcd_unavailable_answer_on_the_channel_goes_through_the_client(self) -> None:
        # etcd without a leader for a moment (an election): waited out by the client, the term goes on.
        self.check_fallback(StandInChannel(EtcdUnavailable("etcdserver: no leader", 14)))

    def check_fallback(self, channel: StandInChannel) -> None:
        clock = Clock()
        etcd = FakeEtcd()
        layout = Layout("c")
        election = etcd.put(layout.leader, b"me")
        locks = LockService(clock)
        failures: List[str] = []
        journal = Journal(etcd, layout, election, locks, clock, failures.append, channel=channel)  # type: ignore[arg-type]
        locks.observer = journal
        sessions = SessionTable(clock, locks)
        session = sessions.start(object())
        locks.request("a", session, 1, 0, 0)
        waiting = journal.durable()
        clock.advance(0)
        self.assertEqual((channel.sent, len(etcd.sent)), (1, 1))
        etcd.sent[0].commit()
        self.successResultOf(waiting)
        self.assertEqual(failures, [])
        journal.stop()
        self.assertTrue(channel.closed)
        session.end()
