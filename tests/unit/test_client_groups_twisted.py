"""
The Twisted client's groups (L{jesync.client.txclient.TwistedGroup})
against the real server in memory (L{jesync.testing.MemoryServer}): the
blocking group's operations as Deferreds, with the same errors; a member
ends when its connection closes and when its lease lapses unrenewed (time
moves only when the test says); a group watch tells joins and leaves in
order.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    GroupAlreadyExists,
    GroupNotCreated,
    GroupNotEmpty,
    MemberAlreadyExists,
    MemberNotJoined,
    TwistedClient,
    TwistedGroup,
)
from jesync.client.group import member_of
from jesync.client.wire import HOLDER_EVENTS, WatchEvent
from jesync.testing import MemoryServer


class TwistedGroupTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = MemoryServer()

    def client(self) -> TwistedClient:
        client = self.server.client()
        self.addCleanup(lambda: (client.close(), self.server.flush()))
        return client

    def result(self, deferred: defer.Deferred[Any]) -> Any:
        self.server.flush()
        return self.successResultOf(deferred)

    def refused(self, deferred: defer.Deferred[Any], error: type[Exception]) -> None:
        self.server.flush()
        self.failureResultOf(deferred, error)

    def test_create_join_members_leave_delete(self) -> None:
        one, two = self.client(), self.client()
        workers = one.group("workers")
        self.assertIsInstance(workers, TwistedGroup)
        self.refused(workers.members(), GroupNotCreated)
        self.refused(workers.join("w1"), GroupNotCreated)
        self.assertIsNone(self.result(workers.create()))
        self.refused(workers.create(), GroupAlreadyExists)
        self.assertEqual(self.result(one.groups()), ["workers"])
        self.assertEqual(self.result(workers.join("w1", b"role=web", lease=10)), 10)
        self.assertEqual(self.result(two.group("workers").join("w2")), 0)
        self.refused(two.group("workers").join("w1"), MemberAlreadyExists)
        members = self.result(workers.members())
        self.assertEqual([(m.member, m.capabilities) for m in members], [("w1", b"role=web"), ("w2", None)])
        self.refused(workers.delete(), GroupNotEmpty)
        self.refused(workers.leave("w2"), MemberNotJoined)  # two's, not one's
        self.refused(workers.update("w2", b"x"), MemberNotJoined)
        self.result(workers.update("w1", "role=db"))
        self.assertEqual(self.result(workers.members())[0].capabilities, b"role=db")
        self.assertTrue(self.result(workers.heartbeat("w1", 10)))
        self.assertFalse(self.result(workers.heartbeat("w2", 10)))
        self.result(workers.leave("w1"))
        two.close()  # w2 ends with its connection
        self.server.flush()
        self.assertEqual(self.result(workers.members()), [])
        self.result(workers.delete())
        self.assertEqual(self.result(one.groups()), [])

    def test_lease_lapses_and_watch_tells_in_order(self) -> None:
        """Joins and leaves reach the watch in order; a member not heartbeating is gone when its lease runs out."""
        one, two = self.client(), self.client()
        group = one.group("g")
        self.result(group.create())
        seen: list[WatchEvent] = []
        self.result(group.watch(seen.append))
        self.result(two.group("g").join("m1", b"caps", lease=2))
        self.result(group.join("m2"))
        self.server.advance(3)
        self.result(group.leave("m2"))
        self.assertEqual(
            [(event.kind, member_of("g", event.key), event.value) for event in seen if event.kind in HOLDER_EVENTS],
            [("granted", "m1", b"caps"), ("granted", "m2", None), ("expired", "m1", None), ("released", "m2", None)],
        )
        self.assertFalse(self.result(two.group("g").heartbeat("m1", 2)))

    def test_bad_names_are_refused_before_sending(self) -> None:
        client = self.client()
        self.assertRaises(ValueError, client.group, "a/b")
        self.assertRaises(ValueError, client.group("g").join, "m m")
