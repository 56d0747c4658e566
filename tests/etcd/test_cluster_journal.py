"""
The durable-state journal (L{jesync.cluster.journal}) against a real etcd:
group commits within etcd's limits, replies released only once their
state is in etcd, records read back as the next leader reads them, and a
deposed leader's writes refused.
"""

from __future__ import annotations

from typing import List, Tuple

from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from jesync.cluster.etcd import Delete, EtcdClient, Put
from jesync.cluster.journal import MAX_OPS, Deposed, Journal, JournalMark, Layout
from jesync.service import LockService
from jesync.sessions import SessionTable, TimedGrants
from tests.etcd_server import shared_etcd


class JournalTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.etcd = EtcdClient(reactor, [shared_etcd().endpoint], 2.0)
        self.addCleanup(self.etcd.close)
        self.layout = Layout(self.id())
        # This test's member leads: it owns the election key.
        self.revision = yield self.etcd.put(self.layout.leader, b"this test")
        self.locks = LockService(reactor)
        self.sessions = SessionTable(reactor, self.locks)
        self.failures: List[str] = []
        self.commits: List[Tuple[int, float]] = []
        self.journal = Journal(
            self.etcd,
            self.layout,
            self.revision,
            self.locks,
            reactor,
            on_failure=self.failures.append,
            on_commit=lambda count, seconds: self.commits.append((count, seconds)),
        )
        self.locks.observer = self.journal
        self.sessions.on_end = self.journal.session_ended  # (as build_lock_server wires it)
        self.addCleanup(self.journal.stop)
        self.owners: List[object] = []
        self.addCleanup(self.release_everything)

    def release_everything(self) -> None:
        """Nothing left on the reactor: every grant (and its expiry timer) given back."""
        self.journal.stop()
        for owner in self.owners:
            self.locks.release_all(owner)

    def owner(self, owner: object = None) -> object:
        owner = object() if owner is None else owner
        self.owners.append(owner)
        return owner

    @inlineCallbacks
    def read_back(self):
        _, kvs = yield self.etcd.get(self.layout.state, prefix=True)
        return self.layout.load(kvs)

    def test_nothing_changed_nothing_to_wait_for(self):
        self.assertIsNone(self.journal.durable())
        self.locks.request("jesync-style", self.owner(), 1, 0, 10)  # an owner that is not durable
        self.assertIsNone(self.journal.durable())

    @inlineCallbacks
    def test_one_turn_of_changes_is_one_group_commit_within_etcd_limits(self):
        count = MAX_OPS * 2 + 44
        for index in range(count):
            session = self.sessions.start(object())
            session.grace_ms = 5000
            self.locks.request(f"k{index}", session, 1, 0, 0)
        waiting = self.journal.durable()
        self.assertIsInstance(waiting, Deferred)
        self.assertFalse(waiting.called)
        yield waiting
        # Each session: its grace period and its key; in transactions of
        # 127 operations and the commit key's.
        self.assertEqual([operations for operations, _ in self.commits], [2 * count])
        self.assertEqual(self.journal.transactions, -(-2 * count // MAX_OPS))
        self.assertIsNone(self.journal.durable())
        state = yield self.read_back()
        self.assertEqual(len(state.sessions), count)
        self.assertEqual({record.grace_ms for record in state.sessions}, {5000})
        keys = sorted(key for record in state.sessions for key in record.keys)
        self.assertEqual(keys, sorted(f"k{index}" for index in range(count)))

    @inlineCallbacks
    def test_records_follow_the_lock_table(self):
        session = self.sessions.start(object())
        first = self.locks.request("a", session, 1, 0, 0)
        self.locks.request("b", session, 1, 0, 0)
        timed = self.owner(TimedGrants("peer"))
        held = self.locks.request("t", timed, 1, 0, 60)
        yield self.journal.durable()
        state = yield self.read_back()
        [record] = state.sessions
        self.assertEqual((record.session_id, record.keys), (session.id, {"a": first.token, "b": record.keys["b"]}))
        [timed_record] = state.timed
        self.assertEqual((timed_record.key, timed_record.token), ("t", held.token))
        self.assertLess(abs(timed_record.release_us / 1e6 - held.expires_at), 1e-5)

        self.locks.release("a", session)
        self.locks.release("t", timed)
        yield self.journal.durable()
        state = yield self.read_back()
        self.assertEqual(list(state.sessions[0].keys), ["b"])
        self.assertEqual(state.timed, [])

        self.locks.release("b", session)  # holding nothing, the session keeps its record
        yield self.journal.durable()
        state = yield self.read_back()
        self.assertEqual([(record.session_id, record.keys) for record in state.sessions], [(session.id, {})])

        session.end()  # the client quit: its record goes
        yield self.journal.durable()
        _, left = yield self.etcd.get(self.layout.state, prefix=True)
        self.assertEqual([kv.key for kv in left], [self.layout.commit])
        # A session that never held a key never had a record, and costs nothing when it ends.
        before = self.journal.operations
        self.sessions.start(object()).end()
        self.assertIsNone(self.journal.durable())
        self.assertEqual(self.journal.operations, before)

    @inlineCallbacks
    def test_the_mark_is_written_with_the_next_commit(self):
        self.journal.mark_reached(10)
        self.journal.mark_reached(7)  # never lowered
        yield self.journal.durable()
        state = yield self.read_back()
        self.assertEqual(state.mark, 10)

    @inlineCallbacks
    def test_a_deposed_leaders_write_is_refused_and_its_replies_never_sent(self):
        # Another member's key replaces this one's: the revision guard fails.
        yield self.etcd.txn([], [Delete(self.layout.leader)])
        yield self.etcd.txn([], [Put(self.layout.leader, b"another member")])
        session = self.sessions.start(object())
        self.locks.request("a", session, 1, 0, 0)
        waiting = self.journal.durable()
        with self.assertRaises(Deposed):
            yield waiting
        self.assertEqual(len(self.failures), 1)
        self.assertIn("election key", self.failures[0])
        state = yield self.read_back()
        self.assertEqual(state.sessions, [])
        # Nothing more is written, and every later wait fails at once.
        later = self.journal.durable()
        self.assertTrue(later.called)
        with self.assertRaises(Deposed):
            yield later

    @inlineCallbacks
    def test_a_session_with_many_keys_writes_one_small_record_per_lock(self):
        session = self.sessions.start(object())
        for index in range(200):
            self.locks.request(f"key-{index:04d}-" + "x" * 900, session, 1, 0, 0)
        yield self.journal.durable()
        before = self.journal.operations
        self.locks.request("one-more", session, 1, 0, 0)
        yield self.journal.durable()
        self.assertEqual(self.journal.operations - before, 1)
        self.locks.release("one-more", session)
        yield self.journal.durable()
        self.assertEqual(self.journal.operations - before, 2)
        state = yield self.read_back()
        [record] = state.sessions
        self.assertEqual(len(record.keys), 200)

    @inlineCallbacks
    def test_a_write_from_elsewhere_between_two_commits_ends_the_term(self):
        """
        Each transaction applies only right after the one before it (the
        commit key's revision): a late copy of an older one, or any other
        writer, is refused, and this leader steps down rather than guess.
        """
        session = self.sessions.start(object())
        self.locks.request("a", session, 1, 0, 0)
        yield self.journal.durable()
        yield self.etcd.put(self.layout.commit, b"someone else")
        self.locks.request("b", session, 1, 0, 0)
        with self.assertRaises(Deposed):
            yield self.journal.durable()
        self.assertEqual(len(self.failures), 1)
        self.assertIn("someone else", self.failures[0])
        state = yield self.read_back()
        self.assertEqual(list(state.sessions[0].keys), ["a"])

    @inlineCallbacks
    def test_batches_cut_turn_after_turn_commit_in_order_over_the_lean_path(self):
        """
        A batch each reactor turn, without waiting for the one before
        (jesync.cluster.txn_channel, pipelined): every reply released in
        order, every record in etcd, the commit key at the last tag.
        """
        self.assertIsNotNone(self.journal.channel)
        order: List[int] = []
        waits = []
        for index in range(20):
            self.locks.request(f"k{index}", self.sessions.start(object()), 1, 0, 0)
            waiting = self.journal.durable()
            waiting.addCallback(lambda _, index=index: order.append(index))
            waits.append(waiting)
            yield deferLater(reactor, 0, lambda: None)  # (the next turn: this one's batch is cut)
        yield gatherResults(waits)
        self.assertEqual(order, list(range(20)))
        # (Turns while MAX_IN_FLIGHT were awaiting etcd shared a batch; none reached etcd out of order.)
        self.assertEqual((self.journal.resent, self.failures), (0, []))
        state = yield self.read_back()
        self.assertEqual(sorted(k for r in state.sessions for k in r.keys), sorted(f"k{i}" for i in range(20)))
        _, [commit] = yield self.etcd.get(self.layout.commit)
        self.assertEqual(commit.value, b"%d:%d:0" % (self.revision, self.journal.transactions))

    @inlineCallbacks
    def test_transactions_whose_lean_connection_drops_go_through_the_client_in_order(self):
        """
        The lean path's connection drops with six transactions written and
        unanswered: each goes again through the etcd client (over
        connections of its own, in any order), and still every reply is
        released in order and nothing ends the term.
        """
        self.locks.request("first", self.sessions.start(object()), 1, 0, 0)
        yield self.journal.durable()  # (the lean path's connection is open)
        connection = self.journal.channel._connection
        order: List[int] = []
        waits = []
        for index in range(6):
            self.locks.request(f"k{index}", self.sessions.start(object()), 1, 0, 0)
            waiting = self.journal.durable()
            waiting.addCallback(lambda _, index=index: order.append(index))
            waits.append(waiting)
            self.journal._flush()  # (this turn's batch, cut now: none is answered before the drop)
        self.assertEqual(len(connection.waiting), 6)
        connection.transport.abortConnection()
        yield gatherResults(waits)
        self.assertEqual((order, self.failures), (list(range(6)), []))
        state = yield self.read_back()
        keys = sorted(k for r in state.sessions for k in r.keys)
        self.assertEqual(keys, ["first"] + [f"k{i}" for i in range(6)])

    def test_session_ids_of_any_bytes_round_trip(self):
        from jesync.cluster.etcd import KeyValue

        odd = "a/b c\udcff"
        raw_session = self.layout.session(odd)
        raw_key = self.layout.held_key(odd, "k/ey")
        state = self.layout.load(
            [KeyValue(raw_session, b'{"grace_ms": 7}', 1, 1, 0), KeyValue(raw_key, b"42", 1, 1, 0)]
        )
        self.assertEqual([(r.session_id, r.grace_ms, r.keys) for r in state.sessions], [(odd, 7, {"k/ey": 42})])

    @inlineCallbacks
    def test_the_fencing_mark_is_durable_once_committed_and_a_token_past_it_ends_the_term(self):
        mark = JournalMark(self.journal)
        self.assertEqual(mark.durable, 0)
        written = mark.write(5 * 10**15)
        self.assertIsInstance(written, Deferred)
        self.assertEqual(mark.durable, 0)
        yield written
        self.assertEqual(mark.durable, 5 * 10**15)
        self.assertEqual((yield self.read_back()).mark, 5 * 10**15)
        # A lower mark asked for later never lowers it.
        self.assertIsNone(mark.write(4 * 10**15))
        self.assertEqual(mark.durable, 5 * 10**15)
        self.assertEqual((yield self.read_back()).mark, 5 * 10**15)
        mark.passed(5 * 10**15 + 1)
        self.assertEqual(len(self.failures), 1)
        self.assertIn("fencing token 5000000000000001 would pass the mark in etcd", self.failures[0])
        yield self.assertFailure(mark.write(6 * 10**15), Deposed)
