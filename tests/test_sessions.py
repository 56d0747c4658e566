"""
elock sessions (L{jesync.sessions}): the automat lifecycle of one L{Session}
and the L{SessionTable} of a listener family, on a L{Clock}, owning locks in a
real L{LockService} so that "its locks are released" is checked where it
matters.

    attached --connection_lost--> detached --grace period over--> ended
        ^                             |
        +-----------resume------------+
    attached --end (quit)--> ended
"""

from __future__ import annotations

import string

from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.service import LockService
from jesync.sessions import DEFAULT_GRACE_MS, Session, SessionTable, new_session_id

URL_SAFE = set(string.ascii_letters + string.digits + "-_")


class Connection:
    """Stands for a client connection: sessions only keep and compare it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<Connection {self.name}>"


class SessionTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.table = SessionTable(self.clock, self.service)

    def tearDown(self) -> None:
        self.assertEqual(self.flushLoggedErrors(), [])

    def lock(self, key: str, owner) -> None:
        """C{owner} takes C{key} as elock does: a mutex that never expires."""
        granted = self.successResultOf(self.service.acquire(key, owner, 1, 0, 0))
        self.assertIsNone(granted.expires_at)

    def holders(self, key: str) -> int:
        return self.service.status(key).granted

    def timers(self) -> list[float]:
        """When the clock's pending calls are due."""
        return sorted(call.getTime() for call in self.clock.getDelayedCalls())


class IdTests(SessionTestCase):
    def test_ids_are_random_and_distinct(self) -> None:
        ids = [new_session_id() for _ in range(200)]
        self.assertEqual(len(set(ids)), 200)
        for session_id in ids:
            self.assertGreaterEqual(len(session_id), 20, session_id)
            self.assertFalse(session_id.isdigit(), session_id)
            self.assertLessEqual(set(session_id), URL_SAFE, session_id)

    def test_started_sessions_get_distinct_random_ids(self) -> None:
        first = self.table.start(Connection("a"))
        second = self.table.start(Connection("b"))
        self.assertNotEqual(first.id, second.id)
        for session in (first, second):
            self.assertGreaterEqual(len(session.id), 20, session.id)
            self.assertFalse(session.id.isdigit(), session.id)
        self.assertEqual(len(self.table), 2)

    def test_start_under_a_given_id(self) -> None:
        connection = Connection("a")
        session = self.table.start(connection, "chosen")
        self.assertEqual(session.id, "chosen")
        self.assertIs(session.connection, connection)
        self.assertEqual(repr(session), "<Session chosen>")


class LifecycleTests(SessionTestCase):
    def test_new_session_is_attached(self) -> None:
        connection = Connection("a")
        session = self.table.start(connection)
        self.assertIs(session.connection, connection)
        self.assertEqual(session.grace_ms, DEFAULT_GRACE_MS)
        self.assertEqual(DEFAULT_GRACE_MS, 30_000)
        self.assertEqual(self.table.detached_count(), 0)
        self.assertEqual(self.timers(), [])

    def test_connection_lost_detaches_and_keeps_locks(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        session.connection_lost()
        self.assertIsNone(session.connection)
        self.assertEqual(self.table.detached_count(), 1)
        self.assertEqual(len(self.table), 1)
        self.assertEqual(self.timers(), [30.0])
        self.assertEqual(self.holders("k"), 1)

    def test_grace_period_over_ends_session(self) -> None:
        session = self.table.start(Connection("a"), "s1")
        self.lock("k", session)
        self.lock("j", session)
        session.connection_lost()
        self.clock.advance(29.999)
        self.assertEqual((self.holders("k"), self.holders("j")), (1, 1))
        self.assertEqual(self.table.detached_count(), 1)
        self.clock.advance(0.001)
        self.assertEqual(self.service.listing(), [])
        self.assertEqual(len(self.table), 0)
        self.assertEqual(self.table.detached_count(), 0)
        self.assertEqual(self.timers(), [])
        # Gone from the table: its id now names a new, empty session.
        connection = Connection("b")
        fresh = self.table.take(connection, "s1")
        self.assertIsNot(fresh, session)
        self.assertIs(fresh.connection, connection)

    def test_grace_period_is_the_sessions_own(self) -> None:
        session = self.table.start(Connection("a"))
        session.grace_ms = 200
        self.lock("k", session)
        session.connection_lost()
        self.assertEqual(self.timers(), [0.2])
        self.clock.advance(0.199)
        self.assertEqual(self.holders("k"), 1)
        self.clock.advance(0.001)
        self.assertEqual(self.holders("k"), 0)
        self.assertEqual(len(self.table), 0)

    def test_zero_grace_releases_without_time_passing(self) -> None:
        session = self.table.start(Connection("a"))
        session.grace_ms = 0
        self.lock("k", session)
        session.connection_lost()
        self.clock.advance(0)
        self.assertEqual(self.clock.seconds(), 0)
        self.assertEqual(self.holders("k"), 0)
        self.assertEqual(len(self.table), 0)

    def test_grace_over_hands_locks_to_waiters(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        waiting = self.service.acquire("k", "other", 1, -1, 0)
        self.assertNoResult(waiting)
        session.connection_lost()
        self.clock.advance(30)
        grant = self.successResultOf(waiting)
        self.assertEqual((grant.key, grant.owner), ("k", "other"))

    def test_resume_within_grace(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        session.connection_lost()
        self.clock.advance(29)
        connection = Connection("b")
        self.assertIs(session.resume(connection), True)
        self.assertIs(session.connection, connection)
        self.assertEqual(self.table.detached_count(), 0)
        # the grace timer was cancelled: the locks outlive it
        self.assertEqual(self.timers(), [])
        self.clock.advance(3600)
        self.assertEqual(self.holders("k"), 1)
        self.assertEqual(len(self.table), 1)

    def test_detach_again_after_resume_starts_a_fresh_grace_period(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        session.connection_lost()
        self.clock.advance(20)
        self.assertTrue(session.resume(Connection("b")))
        session.connection_lost()
        self.assertEqual(self.timers(), [50.0])
        self.clock.advance(29.9)
        self.assertEqual(self.holders("k"), 1)
        self.clock.advance(0.1)
        self.assertEqual(self.holders("k"), 0)

    def test_resume_refused_while_attached(self) -> None:
        connection = Connection("a")
        session = self.table.start(connection)
        self.lock("k", session)
        self.assertIs(session.resume(Connection("b")), False)
        self.assertIs(session.connection, connection)
        self.assertEqual(self.holders("k"), 1)
        self.assertEqual(self.timers(), [])

    def test_end_releases_at_once(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        waiting = self.service.acquire("k", "other", 1, -1, 0)
        session.end()
        self.assertEqual(self.successResultOf(waiting).owner, "other")
        self.assertIsNone(session.connection)
        self.assertEqual(len(self.table), 0)
        self.assertEqual(self.table.detached_count(), 0)
        self.assertEqual(self.timers(), [])

    def test_end_cancels_the_sessions_waits(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", "other")
        waiting = self.service.acquire("k", session, 1, 10, 0)
        session.end()
        self.failureResultOf(waiting, CancelledError)
        self.assertEqual(self.service.status("k").waiting, 0)

    def test_resume_refused_once_ended(self) -> None:
        session = self.table.start(Connection("a"))
        session.end()
        self.assertIs(session.resume(Connection("b")), False)
        self.assertIsNone(session.connection)

    def test_resume_refused_after_grace_over(self) -> None:
        session = self.table.start(Connection("a"))
        session.connection_lost()
        self.clock.advance(30)
        self.assertIs(session.resume(Connection("b")), False)
        self.assertIsNone(session.connection)

    def test_table_forgets_an_ended_session(self) -> None:
        session = self.table.start(Connection("a"))
        session.grace_ms = 1000
        session.connection_lost()
        self.assertEqual((len(self.table), self.table.detached_count()), (1, 1))
        self.clock.advance(1)
        self.assertEqual((len(self.table), self.table.detached_count()), (0, 0))

    def test_release_is_per_session(self) -> None:
        first = self.table.start(Connection("a"))
        second = self.table.start(Connection("b"))
        self.lock("k", first)
        self.lock("j", second)
        first.connection_lost()
        second.connection_lost()
        self.assertEqual(self.table.detached_count(), 2)
        self.assertTrue(second.resume(Connection("c")))
        self.clock.advance(30)
        self.assertEqual((self.holders("k"), self.holders("j")), (0, 1))
        self.assertEqual(len(self.table), 1)


class TableTests(SessionTestCase):
    def test_end_detached_releases_sessions_in_their_grace_period(self) -> None:
        """Stopping: detached sessions end now (locks released, no timer left); attached ones stay."""
        detached = self.table.start(Connection("a"))
        attached = self.table.start(Connection("b"))
        self.lock("gone", detached)
        self.lock("here", attached)
        detached.connection_lost()
        self.assertEqual(len(self.timers()), 1)

        self.table.end_detached()

        self.assertEqual(self.holders("gone"), 0)
        self.assertEqual(self.holders("here"), 1)
        self.assertEqual(self.timers(), [])
        self.assertEqual(len(self.table), 1)
        self.assertIsNone(self.table.take(Connection("c"), attached.id))

    def test_take_unknown_id_starts_a_session_under_it(self) -> None:
        connection = Connection("a")
        session = self.table.take(connection, "mine")
        self.assertIsInstance(session, Session)
        self.assertEqual(session.id, "mine")
        self.assertIs(session.connection, connection)
        self.assertEqual(len(self.table), 1)
        # and it is the one the table knows under that id
        self.assertIsNone(self.table.take(Connection("b"), "mine"))

    def test_take_detached_resumes_it(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        session.connection_lost()
        connection = Connection("b")
        self.assertIs(self.table.take(connection, session.id), session)
        self.assertIs(session.connection, connection)
        self.assertEqual(self.timers(), [])
        self.assertEqual(self.table.detached_count(), 0)
        self.assertEqual(len(self.table), 1)
        self.assertEqual(self.holders("k"), 1)

    def test_take_attached_is_refused(self) -> None:
        connection = Connection("a")
        session = self.table.start(connection)
        self.assertIsNone(self.table.take(Connection("b"), session.id))
        self.assertIs(session.connection, connection)
        self.assertEqual(len(self.table), 1)

    def test_take_only_once(self) -> None:
        session = self.table.start(Connection("a"))
        session.connection_lost()
        self.assertIs(self.table.take(Connection("b"), session.id), session)
        self.assertIsNone(self.table.take(Connection("c"), session.id))

    def test_detached_count(self) -> None:
        sessions = [self.table.start(Connection(str(n))) for n in range(4)]
        self.assertEqual(self.table.detached_count(), 0)
        sessions[0].grace_ms = 1000
        sessions[0].connection_lost()
        sessions[1].connection_lost()
        self.assertEqual(self.table.detached_count(), 2)
        sessions[2].end()
        self.assertEqual(self.table.detached_count(), 2)
        self.assertEqual(len(self.table), 3)
        self.clock.advance(1)
        self.assertEqual(self.table.detached_count(), 1)
        self.table.take(Connection("again"), sessions[1].id)
        self.assertEqual(self.table.detached_count(), 0)
        self.assertEqual(len(self.table), 2)
