"""
Elections (L{jesync.client.election}) through the Twisted client against
the real server in memory (L{jesync.testing.MemoryServer}): hand-over on
resign and on disconnect, at once and in the candidates' arrival order;
observers told every change in order; a leader told it lost the
leadership; each leader's fencing token larger than the one before.  Time
moves only when a test says, so "at once" means with no time passing.
The blocking and asyncio elections over real TCP are in
L{tests.tcp.test_client_election}.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from jesync.client import ConnectionLost, Leader, Leadership, LockLost, TwistedClient, TwistedElection
from jesync.client.election import LeaderTracker, election_key_for
from jesync.client.wire import Holder, WatchEvent
from jesync.testing import MemoryServer
from tests.support import grant_and_release_before_answering, strictly_increasing


def values(leaders: list[Optional[Leader]]) -> list[Optional[bytes]]:
    return [None if leader is None else leader.value for leader in leaders]


class ElectionTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = MemoryServer()

    def client(self) -> TwistedClient:
        client = self.server.client()
        self.addCleanup(lambda: (client.close(), self.server.flush()))
        return client

    def election(self, name: str = "db") -> TwistedElection:
        return TwistedElection(self.client(), name)

    def result(self, deferred: defer.Deferred[Any]) -> Any:
        self.server.flush()
        return self.successResultOf(deferred)

    def campaigns(self, *values: str, name: str = "db") -> list[defer.Deferred[Leadership[Any]]]:
        """One candidate per value, each on its own connection, campaigning in this order."""
        started = []
        for value in values:
            started.append(self.election(name).campaign(value))
            self.server.flush()  # (so they arrive in this order)
        return started

    def observe(self, name: str = "db") -> list[Optional[Leader]]:
        told: list[Optional[Leader]] = []
        self.result(self.election(name).observe(told.append))
        return told


class HandOverTests(ElectionTestCase):
    def test_resign_hands_over_at_once_in_arrival_order(self) -> None:
        """
        The first candidate leads; the others wait.  Each resignation makes
        the next candidate, in the order they campaigned, the leader, with
        no time passing.
        """
        first, second, third = self.campaigns("a", "b", "c")
        leader = self.result(first)
        self.assertNoResult(second)
        self.assertNoResult(third)
        self.assertTrue(self.result(leader.resign()))
        next_leader = self.successResultOf(second)
        self.assertNoResult(third)
        self.assertEqual(next_leader.value, b"b")
        self.assertTrue(self.result(next_leader.resign()))
        self.assertEqual(self.successResultOf(third).value, b"c")
        self.assertTrue(leader.released)
        self.assertFalse(leader.lost)

    def test_disconnect_hands_over_and_the_leader_is_told(self) -> None:
        """
        The leader's connection closes: the next candidate leads at once,
        and the old leader's lost callbacks get a L{LockLost}.
        """
        leader_client = self.client()
        leading = TwistedElection(leader_client, "db").campaign("a")
        self.server.flush()
        [waiting] = self.campaigns("b")
        leader = self.result(leading)
        lost: list[LockLost] = []
        leader.add_lost_callback(lost.append)
        leader_client.close()
        self.server.flush()
        self.assertEqual(self.successResultOf(waiting).value, b"b")
        self.assertTrue(leader.lost)
        [error] = lost
        self.assertIsInstance(error, LockLost)
        self.assertIs(error, leader.lost_reason)
        self.assertEqual(error.key, "election:db")

    def test_server_gone_every_leader_told(self) -> None:
        """A dropped connection (the server crashed) loses the leadership: told, never silence."""
        leader = self.result(self.election().campaign("a"))
        lost: list[LockLost] = []
        leader.add_lost_callback(lost.append)
        self.server.drop_connections()
        self.assertTrue(leader.lost)
        self.assertEqual(len(lost), 1)
        later: list[LockLost] = []
        leader.add_lost_callback(later.append)  # added after: told at once
        self.assertEqual(later, lost)

    def test_expired_leadership_is_told_and_handed_over(self) -> None:
        """
        A leader whose renewals do not get through (nothing moves between
        it and the server) loses its grant to the failsafe: the next
        candidate leads, and the old leader is told once it hears again.
        """
        leading = self.election().campaign("a", expires=3)
        self.server.flush()
        [waiting] = self.campaigns("b")
        leader = self.result(leading)
        lost: list[LockLost] = []
        leader.add_lost_callback(lost.append)
        self.server.reactor.advance(3.5)  # (no flush: the renewal sent at 1 s is not delivered)
        self.assertTrue(leader.lost)  # its own deadline passed: told without waiting for the server
        self.assertEqual(len(lost), 1)
        self.server.flush()
        self.assertEqual(self.successResultOf(waiting).value, b"b")

    def test_fencing_token_grows_with_each_leader(self) -> None:
        """Each leader's token is larger than every earlier leader's."""
        candidates = self.campaigns("a", "b", "c")
        tokens = []
        for candidate in candidates:
            leader = self.result(candidate)
            tokens.append(leader.token)
            self.result(leader.resign())
        self.assertTrue(strictly_increasing(tokens), tokens)

    def test_leadership_renews_itself(self) -> None:
        """A leader stays leader past its failsafe expiry: it renews itself."""
        leader = self.result(self.election().campaign("a", expires=3))
        self.server.advance(1)
        self.server.advance(1.5)
        self.server.advance(1.5)
        self.server.advance(1.5)
        self.assertTrue(leader.held)
        self.assertEqual(self.result(self.election().leader()).token, leader.token)


class LeaderTests(ElectionTestCase):
    def test_leader(self) -> None:
        """C{leader()}: None while nobody leads; then the leader's peer, value and token."""
        election = self.election()
        self.assertIsNone(self.result(election.leader()))
        leadership = self.result(self.election().campaign(b"host-1:8080"))
        leader = self.result(election.leader())
        self.assertEqual((leader.value, leader.token), (b"host-1:8080", leadership.token))
        self.assertEqual(leader.peer, self.server.service.holders("election:db")[0].owner.peer)

    def test_a_name_that_cannot_be_a_key(self) -> None:
        with self.assertRaises(ValueError):
            TwistedElection(self.server.client(), "two words")
        with self.assertRaises(ValueError):
            election_key_for("")


class ObserveTests(ElectionTestCase):
    def test_observers_told_every_change_in_order(self) -> None:
        """
        Two observers, one started before anyone leads and one while "a"
        leads: each is told the leader at its start, then each change in
        order (a resignation: no leader, then the next).
        """
        early = self.observe()
        first, second = self.campaigns("a", "b")
        a = self.result(first)
        late = self.observe()
        self.result(a.resign())
        b = self.result(second)
        self.result(b.resign())
        values = [None if leader is None else leader.value for leader in early]
        self.assertEqual(values, [None, b"a", None, b"b", None])
        self.assertEqual([None if leader is None else leader.value for leader in late], [b"a", None, b"b", None])
        self.assertEqual([leader.token for leader in early if leader], [a.token, b.token])

    def test_other_elections_are_not_told(self) -> None:
        told = self.observe("db")
        self.result(self.election("cache").campaign("x"))
        self.assertEqual(told, [None])

    def test_no_leader_start_with_a_grant_and_release_before_the_answer(self) -> None:
        """
        A grant and its release (by hand) reach the watch before the
        C{holders} answer, which counts them (nobody holds then): the
        observer is told no leader, once, and nothing of the pair; a later
        campaign is told.
        """
        grant_and_release_before_answering(self.server.service, "election:db")
        told = self.observe()
        self.assertEqual(told, [None])
        leadership = self.result(self.election().campaign("a"))
        self.assertEqual([(leader.value, leader.token) for leader in told[1:] if leader], [(b"a", leadership.token)])
        self.assertEqual(len(told), 2)

    def test_observer_told_its_connection_dropped(self) -> None:
        """
        The connection drops: C{on_lost} gets the L{ConnectionLost}, as
        the other clients' observations end with it; no change is told.
        """
        told: list[Optional[Leader]] = []
        lost: list[Exception] = []
        watch = self.result(self.election().observe(told.append, on_lost=lost.append))
        self.server.drop_connections()
        [error] = lost
        self.assertIsInstance(error, ConnectionLost)
        self.assertIs(error, watch.lost_reason)
        self.assertEqual(told, [None])

    def test_a_dropped_connection_without_on_lost_is_logged(self) -> None:
        """Never silence: without C{on_lost}, the loss is logged as a warning."""
        self.observe()
        with self.assertLogs("jesync.client", "WARNING") as logged:
            self.server.drop_connections()
        [record] = logged.records
        self.assertIn("observing the election 'db'", record.getMessage())

    def test_a_stopped_observer_is_not_told(self) -> None:
        lost: list[Exception] = []
        watch = self.result(self.election().observe(lambda leader: None, on_lost=lost.append))
        self.assertTrue(self.result(watch.stop()))
        self.server.drop_connections()
        self.assertEqual(lost, [])

    def test_held_shared_by_hand_the_leader_is_the_first_holder(self) -> None:
        """
        C{election:db} held shared by two, by hand: C{leader()} and the
        observers agree that the first holder, in grant order, leads; the
        second grant is not a new leader; the first's release makes the
        second the leader.
        """
        election = self.election()
        early = self.observe()
        first = self.result(self.client().lock("election:db", shared=True, value="one"))
        second = self.result(self.client().lock("election:db", shared=True, value="two"))
        late = self.observe()
        leader = self.result(election.leader())
        self.assertEqual((leader.value, leader.token), (b"one", first.token))
        self.assertEqual(values(early), [None, b"one"])
        self.assertEqual(late, [leader])
        self.assertTrue(self.result(first.release()))
        leader = self.result(election.leader())
        self.assertEqual((leader.value, leader.token), (b"two", second.token))
        self.assertEqual(early[-1], leader)
        self.assertEqual(late[-1], leader)
        self.assertTrue(self.result(second.release()))
        self.assertEqual(values(early), [None, b"one", b"two", None])
        self.assertEqual(values(late), [b"one", b"two", None])

class TrackerTests(SynchronousTestCase):
    """The consistent start: events that crossed the holders answer are not told twice."""

    def test_events_from_before_the_answer(self) -> None:
        """
        The events before the answer (C{skip} of them, or any before
        C{start}) change nothing; those after it do.
        """
        tracker = LeaderTracker()
        old_grant = WatchEvent("granted", "election:e", "10.0.0.2:5000", 6, "exclusive", b"a")
        old_release = WatchEvent("released", "election:e", "10.0.0.2:5000", 6)
        self.assertFalse(tracker.told(old_grant))  # not started: from before the answer
        holder = Holder("election:e", "10.0.0.1:5000", 0, 0, 7, value=b"b")
        self.assertEqual(tracker.start([holder], skip=2), Leader("10.0.0.1:5000", b"b", 7))
        self.assertFalse(tracker.told(old_release))
        self.assertFalse(tracker.told(WatchEvent("granted", "election:e", "10.0.0.1:5000", 7, "exclusive", b"b")))
        self.assertEqual(tracker.leader, Leader("10.0.0.1:5000", b"b", 7))
        self.assertTrue(tracker.told(WatchEvent("expired", "election:e", "10.0.0.1:5000", 7)))
        self.assertIsNone(tracker.leader)
        self.assertTrue(tracker.told(WatchEvent("granted", "election:e", "10.0.0.3:5000", 8, "exclusive", None)))
        self.assertEqual(tracker.leader, Leader("10.0.0.3:5000", None, 8))

    def test_a_second_holder_is_not_a_new_leader(self) -> None:
        tracker = LeaderTracker()
        self.assertIsNone(tracker.start([]))
        self.assertTrue(tracker.told(WatchEvent("granted", "election:e", "10.0.0.1:5000", 1, "shared", b"a")))
        self.assertFalse(tracker.told(WatchEvent("granted", "election:e", "10.0.0.2:5000", 2, "shared", b"b")))
        self.assertFalse(tracker.told(WatchEvent("released", "election:e", "10.0.0.3:5000", 3)))  # not a holder
        self.assertTrue(tracker.told(WatchEvent("lost", "election:e", "10.0.0.1:5000", 1)))
        self.assertEqual(tracker.leader, Leader("10.0.0.2:5000", b"b", 2))
