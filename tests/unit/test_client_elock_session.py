"""
The elock client's session (jesync.client.elock_session): its failover
machine (one test per transition, and the inputs each state refuses), its
heartbeat's liveness, and its handles' bookkeeping (ELockHolds), all
without I/O.
"""

from __future__ import annotations

from typing import Optional

from automat import NoTransition
from twisted.trial.unittest import SynchronousTestCase

from jesync.client.elock_session import ELockHandle, ELockHolds, ELockSession, Lost
from jesync.client.errors import KeyBusy, LockLost


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

    def test_heartbeat_due_in(self) -> None:
        h = Harness()
        session = ELockSession(lambda: h.now, heartbeat=4.0)
        self.assertEqual(session.heartbeat_due_in(), 4.0)
        h.now = 103.0
        self.assertEqual(session.heartbeat_due_in(), 1.0)
        h.now = 104.5
        self.assertEqual(session.heartbeat_due_in(), -0.5)  # due: the client pings
        session.heard()
        self.assertEqual(session.heartbeat_due_in(), 4.0)  # an answer starts the quiet again


class FakeOwner:
    """The client side of a handle: records what the handle asks it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def unlock(self, key: str) -> bool:
        self.asked.append(("unlock", key))
        return True

    def owned(self, key: str) -> bool:
        self.asked.append(("owned", key))
        return True


class HoldsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reported: Lost = []
        self.holds = ELockHolds(self.reported.extend)
        self.owner = FakeOwner()

    def grant(self, key: str, token: Optional[int] = None) -> ELockHandle:
        self.holds.ask(key)
        handle = self.holds.granted(self.owner, key, token)
        self.holds.asked(key)
        return handle

    def test_granted_is_held(self) -> None:
        a = self.grant("a", 7)
        self.assertEqual((a.key, a.token, a.held, a.lost, a.released), ("a", 7, True, False, False))
        self.assertEqual(self.holds.held(), [a])
        self.assertEqual(self.holds.held_keys(), ["a"])

    def test_ask_refuses_a_held_key_and_one_being_asked_for(self) -> None:
        self.grant("a")
        self.assertRaises(KeyBusy, self.holds.ask, "a")
        self.holds.ask("b")
        self.assertRaises(KeyBusy, self.holds.ask, "b")
        self.holds.asked("b")  # not granted: it can be asked for again
        self.holds.ask("b")

    def test_released(self) -> None:
        a = self.grant("a")
        self.holds.released("a")
        self.assertTrue(a.released)
        self.assertEqual(self.holds.held(), [])
        self.holds.ask("a")  # free to be locked again
        self.holds.released("never")  # nothing to release: nothing happens
        self.assertEqual(self.reported, [])

    def test_release_all(self) -> None:
        a, b = self.grant("a"), self.grant("b")
        self.holds.release_all()
        self.assertEqual((a.released, b.released, self.holds.held()), (True, True, []))
        self.assertEqual(self.reported, [])

    def test_owned_not_held_is_lost_and_reported_with_its_callbacks(self) -> None:
        a = self.grant("a")
        calls: list[LockLost] = []
        a.on_lost(calls.append)
        self.holds.owned("a", False, None)
        self.assertTrue(a.lost)
        assert a.lost_reason is not None
        self.assertEqual(a.lost_reason.key, "a")
        self.assertIn("the server says the session does not hold it", str(a.lost_reason))
        self.assertEqual(self.reported, [(a, [calls.append])])
        self.assertEqual(calls, [])  # the reporter calls them, not the bookkeeping
        self.assertFalse(self.holds.released_or_lost("a"))  # it left: no handle for the key
        self.assertEqual(self.holds.held(), [])

    def test_owned_held_takes_the_token(self) -> None:
        a = self.grant("a", 1)
        self.holds.owned("a", True, None)
        self.assertEqual(a.token, 1)  # no token said: kept
        self.holds.owned("a", True, 5)
        self.assertEqual((a.token, a.held, self.reported), (5, True, []))

    def test_keep_only(self) -> None:
        a, b, c, d = self.grant("a", 1), self.grant("b", 2), self.grant("c", 3), self.grant("d", 4)
        self.holds.keep_only({"a": 10, "b": None}, "gone", spare=["c"])
        self.assertEqual((a.token, b.token), (10, 2))
        self.assertEqual((a.held, b.held, c.held, d.lost), (True, True, True, True))
        self.assertEqual(self.reported, [(d, [])])
        assert d.lost_reason is not None
        self.assertEqual(d.lost_reason.reason, "gone")
        self.assertEqual(self.holds.held_keys(), ["a", "b", "c"])

    def test_lose_all(self) -> None:
        a, b = self.grant("a"), self.grant("b")
        self.holds.lose_all("the grace period ran out")
        self.assertEqual((a.lost, b.lost, self.holds.held()), (True, True, []))
        self.assertEqual([handle for handle, _ in self.reported], [a, b])

    def test_nothing_lost_reports_nothing(self) -> None:
        self.holds.lose_all("no handles")
        self.holds.keep_only({}, "no handles")
        self.assertEqual(self.reported, [])

    def test_a_lost_or_released_handle_is_lost_or_released_once(self) -> None:
        a = self.grant("a")
        a.on_lost(lambda error: None)
        self.holds.lose_all("first")
        self.assertEqual(a._set_lost("again"), [])  # its callbacks are handed over once
        a._set_released()
        self.assertTrue(a.lost)

    def test_handle_asks_its_owner_while_held(self) -> None:
        a = self.grant("a")
        self.assertTrue(a.owned())
        self.assertTrue(a.release())
        self.holds.released("a")
        self.assertFalse(a.release())  # released: nothing asked
        self.assertFalse(a.owned())
        self.assertEqual(self.owner.asked, [("owned", "a"), ("unlock", "a")])

    def test_on_lost_after_the_loss_calls_at_once(self) -> None:
        a = self.grant("a")
        self.holds.lose_all("gone")
        calls: list[LockLost] = []
        a.on_lost(calls.append)
        self.assertEqual(calls, [a.lost_reason])

    def test_released_or_lost(self) -> None:
        self.grant("a")
        self.assertFalse(self.holds.released_or_lost("a"))
        self.assertFalse(self.holds.released_or_lost("never"))


class SessionHoldsTests(SynchronousTestCase):
    def test_the_session_reports_its_lost_handles_through_its_reporter(self) -> None:
        reported: Lost = []
        session = ELockSession(report_lost=reported.extend)
        handle = session.holds.granted(FakeOwner(), "a", None)
        session.holds.lose_all("gone")
        self.assertEqual(reported, [(handle, [])])

    def test_by_default_callbacks_are_called_at_once(self) -> None:
        session = ELockSession()
        handle = session.holds.granted(FakeOwner(), "a", None)
        calls: list[LockLost] = []
        handle.on_lost(calls.append)
        handle.on_lost(lambda error: 1 / 0)  # a failing callback is logged, the others still called
        handle.on_lost(calls.append)
        with self.assertLogs("jesync.client.elock", "ERROR") as logged:
            session.holds.lose_all("gone")
        self.assertEqual(calls, [handle.lost_reason, handle.lost_reason])
        self.assertEqual([record.getMessage() for record in logged.records], ["a lost-lock callback failed"])
