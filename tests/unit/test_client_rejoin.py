"""
Campaigning again after a lost leadership (L{jesync.client.election.Candidacy})
and joining again after a lost membership (L{jesync.client.group.Membership})
through the Twisted client against the real server in memory
(L{jesync.testing.MemoryServer}), whose connections a test drops as a
crashed server or a failover would: the candidate (the member) is told it
lost the leadership (the membership) before it is told it leads (is a
member) again, never silence; a queued candidate queues again; C{stop}
resigns and withdraws (leaves); the application's own resignation ends the
candidacy; a lapsed lease is a loss too.  Time moves only when a test says.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import LockLost, MembershipLost, TwistedClient, TwistedElection
from jesync.client.txclient import TwistedCandidacy, TwistedMembership
from jesync.testing import MemoryServer


class CandidacyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = MemoryServer()

    def client(self) -> TwistedClient:
        client = self.server.client()
        self.addCleanup(lambda: (client.close(), self.server.flush()))
        return client

    def candidate(self, value: str, told: list[Any], name: str = "db") -> TwistedCandidacy:
        """A candidacy on its own connection that records in C{told} each turn, as C{(what, value, token)}."""

        def elected(leadership: Any) -> None:
            told.append(("elected", leadership.value, leadership.token))

        def lost(error: LockLost) -> None:
            told.append(("lost", error.key, None))

        candidacy = TwistedElection(self.client(), name).keep_campaigning(value, elected, lost)
        self.server.flush()
        return candidacy

    def leader(self) -> Any:
        deferred = TwistedElection(self.client(), "db").leader()
        self.server.flush()
        return self.successResultOf(deferred)

    def test_lost_is_told_then_leads_again(self) -> None:
        """A dropped connection: the loss is told, then the candidate queues again on a new connection and leads."""
        told: list[Any] = []
        candidacy = self.candidate("a", told)
        [(_, _, first_token)] = told
        self.server.drop_connections()
        self.server.flush()
        self.assertEqual([what for what, _, _ in told], ["elected", "lost", "elected"])
        self.assertEqual(told[1][1], "election:db")
        self.assertGreater(told[2][2], first_token)  # a new leadership, with a newer fencing token
        self.assertIs(candidacy.leadership.held, True)
        self.assertEqual(candidacy.elections, 2)
        self.assertEqual(self.leader().value, b"a")

    def test_a_waiting_candidate_queues_again(self) -> None:
        """Both candidates lose their connections: each queues again, and exactly one leads."""
        told_a: list[Any] = []
        told_b: list[Any] = []
        first = self.candidate("a", told_a)
        self.candidate("b", told_b)
        self.server.drop_connections()
        self.server.advance(1)  # (b's campaign failed with its connection: tried again after retry=1 s)
        self.assertEqual([what for what, _, _ in told_a], ["elected", "lost", "elected"])
        self.assertEqual(told_b, [])  # it waited, and waits again: nothing lost, nothing won
        self.assertEqual(self.leader().value, b"a")
        status = self.client().status("election:db")
        self.server.flush()
        self.assertEqual(self.successResultOf(status).waiting, 1)
        first.stop()
        self.server.flush()
        self.assertEqual([what for what, value, _ in told_b], ["elected"])

    def test_stop_resigns_and_the_next_leads(self) -> None:
        told_a: list[Any] = []
        told_b: list[Any] = []
        first = self.candidate("a", told_a)
        second = self.candidate("b", told_b)
        stopped = first.stop()
        self.server.flush()
        self.assertTrue(self.successResultOf(stopped))
        self.assertEqual([what for what, _, _ in told_b], ["elected"])
        stopped = second.stop()
        self.server.flush()
        self.assertTrue(self.successResultOf(stopped))
        self.assertIsNone(self.leader())
        self.assertEqual([what for what, _, _ in told_a], ["elected"])  # no loss told for a stop

    def test_stop_while_queued_withdraws(self) -> None:
        told_a: list[Any] = []
        told_b: list[Any] = []
        first = self.candidate("a", told_a)
        second = self.candidate("b", told_b)
        self.assertFalse(self.successResultOf(second.stop()))  # it did not lead
        stopped = first.stop()
        self.server.flush()
        self.assertTrue(self.successResultOf(stopped))
        self.assertEqual(told_b, [])  # its queued campaign was withdrawn, never told
        self.assertIsNone(self.leader())

    def test_resigning_by_hand_ends_the_candidacy(self) -> None:
        told: list[Any] = []
        candidacy = self.candidate("a", told)
        resigned = candidacy.leadership.resign()
        self.server.flush()
        self.assertTrue(self.successResultOf(resigned))
        self.assertTrue(candidacy.stopped)
        self.server.drop_connections()
        self.server.flush()
        self.assertEqual([what for what, _, _ in told], ["elected"])
        self.assertIsNone(self.leader())


class MembershipTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = MemoryServer()
        self.client = self.server.client()
        self.addCleanup(lambda: (self.client.close(), self.server.flush()))
        self.told: list[Any] = []

    def keep(self, lease: float = 0) -> TwistedMembership:
        membership = self.client.group("g").keep_joined(
            "m1",
            b"caps",
            lease=lease,
            on_joined=lambda kept: self.told.append(("joined", kept.joins)),
            on_lost=lambda error: self.told.append(("lost", str(error))),
        )
        self.server.flush()
        return membership

    def members(self) -> list[Any]:
        observer = self.server.client()
        self.addCleanup(observer.close)
        listed = observer.group("g").members()
        self.server.flush()
        return [(m.member, m.capabilities) for m in self.successResultOf(listed)]

    def test_dropped_connection_told_then_joined_again(self) -> None:
        """The group is created if needed; a dropped connection is told as lost, then the member joins again."""
        membership = self.keep()
        self.assertEqual(self.told, [("joined", 1)])
        self.assertEqual(self.members(), [("m1", b"caps")])
        self.server.drop_connections()
        self.server.flush()
        self.assertEqual([what for what, _ in self.told], ["joined", "lost", "joined"])
        self.assertIn("connection dropped", self.told[1][1])
        self.assertTrue(membership.joined)
        self.assertEqual(self.members(), [("m1", b"caps")])

    def test_lapsed_lease_told_then_joined_again(self) -> None:
        """A member whose heartbeats do not get through loses its lease: told, then it joins again."""
        membership = self.keep(lease=3)
        self.server.advance(10)  # heartbeats every second: still a member
        self.assertEqual(self.told, [("joined", 1)])
        self.server.reactor.advance(4)  # (no flush: the heartbeats are not delivered, the lease lapses)
        self.server.flush()
        self.assertEqual([what for what, _ in self.told], ["joined", "lost", "joined"])
        self.assertIn("lease lapsed", self.told[1][1])
        self.assertTrue(membership.joined)
        self.assertEqual(self.members(), [("m1", b"caps")])

    def test_update_and_while_lost_raises(self) -> None:
        """C{update} sets the capabilities; while not a member it fails with L{MembershipLost}."""
        membership = self.keep()
        updated = membership.update(b"v2")
        self.server.flush()
        self.successResultOf(updated)
        self.assertEqual(self.members(), [("m1", b"v2")])
        self.server.stop()  # gone for good: the re-join keeps failing
        self.assertEqual([what for what, _ in self.told], ["joined", "lost"])
        self.assertFalse(membership.joined)
        self.failureResultOf(membership.update(b"v3"), MembershipLost)
        self.assertEqual(membership.capabilities, b"v3")  # kept for the re-join
        self.successResultOf(membership.stop())

    def test_stop_leaves(self) -> None:
        membership = self.keep()
        stopped = membership.stop()
        self.server.flush()
        self.assertTrue(self.successResultOf(stopped))
        self.assertEqual(self.members(), [])
        self.server.drop_connections()
        self.server.flush()
        self.assertEqual(self.told, [("joined", 1)])  # nothing told, nothing re-joined after a stop

    def test_bad_arguments_refused_at_once(self) -> None:
        """What could never be sent raises ValueError at once, not retried for ever."""
        self.assertRaises(ValueError, self.client.group("g").keep_joined, "m m")
        self.assertRaises(ValueError, self.client.group("g").keep_joined, "m", b"x" * 5000)
        self.assertRaises(ValueError, TwistedElection(self.client, "db").keep_campaigning, b"x" * 5000, print)
        self.assertEqual(self.server.connections, 0)


class CloseAndStopTests(SynchronousTestCase):
    """The Twisted client's close() stops what it keeps; a stop() while a join is on its way leaves."""

    def setUp(self) -> None:
        self.server = MemoryServer()
        self.told: list[str] = []

    def observed(self) -> tuple[Any, list[str]]:
        observer = self.server.client()
        self.addCleanup(observer.close)
        leader = TwistedElection(observer, "db").leader()
        members = observer.group("g").members()
        self.server.flush()
        return self.successResultOf(leader), [m.member for m in self.successResultOf(members)]

    def test_close_stops_campaigning_and_joining(self) -> None:
        client = self.server.client()
        candidacy = TwistedElection(client, "db").keep_campaigning(
            "a", lambda _: self.told.append("elected"), lambda _: self.told.append("lost")
        )
        membership = client.group("g").keep_joined(
            "m1", on_joined=lambda _: self.told.append("joined"), on_lost=lambda _: self.told.append("mlost")
        )
        self.server.flush()
        self.assertEqual(sorted(self.told), ["elected", "joined"])
        closed = client.close()
        self.server.advance(10)  # (any retry would have run)
        self.successResultOf(closed)
        self.assertEqual(sorted(self.told), ["elected", "joined"])  # neither lost nor won again
        self.assertTrue(candidacy.stopped and membership.stopped)
        self.assertEqual(self.observed(), (None, []))
        self.assertEqual(self.server.connections, 1)  # (the observer's only)

    def test_stop_while_the_join_is_on_its_way_leaves(self) -> None:
        client = self.server.client()
        self.addCleanup(client.close)
        group = client.group("g")
        stopping: list[Any] = []
        sent_join = group.join

        def join_then_stop(*arguments: Any) -> Any:
            joining = sent_join(*arguments)
            # stopped once its line is on its way, before the server reads it
            self.server.reactor.callLater(0, lambda: stopping.append(membership.stop()))
            return joining

        group.join = join_then_stop  # type: ignore[method-assign]
        membership = group.keep_joined("m1", on_joined=lambda _: self.told.append("joined"))
        self.server.flush()
        self.assertFalse(self.successResultOf(stopping[0]))
        self.assertEqual(self.told, [])
        self.assertEqual(self.observed(), (None, []))
