"""
The elock client's failover machine (jesync.client.elock_session): one test
per transition, and the inputs each state refuses.
"""

from __future__ import annotations

from automat import NoTransition
from twisted.trial.unittest import SynchronousTestCase

from jesync.client.elock_session import ELockSession


class FakeConnection:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Harness:
    def __init__(self) -> None:
        self.now = 100.0
        self.session = ELockSession(lambda: self.now)


class TransitionTests(SynchronousTestCase):
    def attached(self) -> tuple[Harness, FakeConnection]:
        h = Harness()
        connection = FakeConnection()
        h.now = 105.0
        h.session.start(connection, 2, "abc")
        return h, connection

    def resuming(self) -> tuple[Harness, FakeConnection]:
        h, connection = self.attached()
        h.session.broke()
        return h, connection

    def test_initial_unattached(self) -> None:
        session = Harness().session
        self.assertIsNone(session.id)
        self.assertIsNone(session.connection)
        self.assertEqual(session.member_index, 0)
        self.assertRaises(NoTransition, session.broke)
        self.assertRaises(NoTransition, session.resume, FakeConnection(), 0)
        self.assertRaises(NoTransition, session.give_up)

    def test_unattached_start_attached(self) -> None:
        h, connection = self.attached()
        self.assertEqual(h.session.id, "abc")
        self.assertIs(h.session.connection, connection)
        self.assertEqual(h.session.member_index, 2)
        self.assertEqual(h.session.heard_at, 105.0)
        self.assertEqual(connection.closed, 0)
        self.assertRaises(NoTransition, h.session.start, FakeConnection(), 0, "other")
        self.assertRaises(NoTransition, h.session.resume, FakeConnection(), 0)
        self.assertRaises(NoTransition, h.session.give_up)

    def test_attached_broke_resuming(self) -> None:
        h, connection = self.resuming()
        self.assertEqual(connection.closed, 1)
        self.assertIsNone(h.session.connection)
        self.assertEqual(h.session.id, "abc")  # kept: it is what the resume asks for
        self.assertEqual(h.session.member_index, 2)
        self.assertRaises(NoTransition, h.session.broke)
        self.assertRaises(NoTransition, h.session.start, FakeConnection(), 0, "other")

    def test_resuming_resume_attached(self) -> None:
        h, old = self.resuming()
        new = FakeConnection()
        h.now = 110.0
        h.session.resume(new, 0)
        self.assertIs(h.session.connection, new)
        self.assertEqual((h.session.id, h.session.member_index, h.session.heard_at), ("abc", 0, 110.0))
        self.assertEqual((old.closed, new.closed), (1, 0))
        h.session.broke()  # attached again: it can fail over again
        self.assertEqual(new.closed, 1)

    def test_resuming_give_up_unattached(self) -> None:
        h, _ = self.resuming()
        h.session.give_up()
        self.assertIsNone(h.session.id)
        self.assertIsNone(h.session.connection)
        self.assertRaises(NoTransition, h.session.broke)
        h.session.start(FakeConnection(), 1, "def")  # the next request starts a new one
        self.assertEqual(h.session.id, "def")

    def test_unattached_end_ended(self) -> None:
        session = Harness().session
        session.end()
        self.assertRaises(NoTransition, session.start, FakeConnection(), 0, "abc")
        session.end()  # ending again changes nothing

    def test_attached_end_ended(self) -> None:
        h, connection = self.attached()
        h.session.end()
        self.assertEqual(connection.closed, 1)
        self.assertIsNone(h.session.connection)
        h.session.end()
        self.assertEqual(connection.closed, 1)  # closed once
        self.assertRaises(NoTransition, h.session.broke)
        self.assertRaises(NoTransition, h.session.start, FakeConnection(), 0, "abc")

    def test_resuming_end_ended(self) -> None:
        h, connection = self.resuming()
        h.session.end()
        self.assertEqual(connection.closed, 1)
        self.assertRaises(NoTransition, h.session.resume, FakeConnection(), 0)
        self.assertRaises(NoTransition, h.session.give_up)

    def test_heard(self) -> None:
        h, _ = self.attached()
        h.now = 120.0
        h.session.heard()
        self.assertEqual(h.session.heard_at, 120.0)
