"""
elock sessions (L{jesync.sessions}): the automat lifecycle of one L{Session}
and the L{SessionTable} of a listener family, on a L{Clock}, owning locks in a
real L{LockService} so that "its locks are released" is checked where it
matters.

    attached --connection_lost--> detached --grace period over--> ended
        ^                             |
        +-----------resume------------+
    attached --end (quit, or gone holding nothing)--> ended

and the two bounds on what a session keeps once its client has gone: its
grace period (at most C{max_grace_ms}), and nothing at all if it holds
nothing (L{Session.disconnected}).
"""

from __future__ import annotations

import string

from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.service import LockService
from jesync.errors import LimitReached
from jesync.sessions import DEFAULT_GRACE_MS, DEFAULT_MAX_GRACE_MS, Session, SessionTable, new_session_id

URL_SAFE = set(string.ascii_letters + string.digits + "-_")


class Connection:
    """Stands for a client connection: sessions only keep and compare it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peer = f"127.0.0.1:{name}"

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


# The largest set_timeout elock takes: 24.8 days.
LARGEST_TIMEOUT = 2**31 - 1


class GraceBoundTests(SessionTestCase):
    def test_the_bound_is_five_minutes_by_default(self) -> None:
        self.assertEqual(DEFAULT_MAX_GRACE_MS, 300_000)
        self.assertEqual(self.table.max_grace_ms, DEFAULT_MAX_GRACE_MS)

    def test_a_longer_grace_is_cut_to_the_bound(self) -> None:
        session = self.table.start(Connection("a"))
        self.assertEqual(session.set_grace(LARGEST_TIMEOUT), 300_000)
        self.assertEqual(session.grace_ms, 300_000)
        self.lock("k", session)
        session.connection_lost()
        self.assertEqual(self.timers(), [300.0])
        self.clock.advance(299.999)
        self.assertEqual(self.holders("k"), 1)
        self.clock.advance(0.001)
        self.assertEqual(self.holders("k"), 0)
        self.assertEqual(len(self.table), 0)

    def test_a_grace_within_the_bound_is_kept(self) -> None:
        session = self.table.start(Connection("a"))
        self.assertEqual(session.set_grace(300_000), 300_000)
        self.assertEqual(session.set_grace(0), 0)
        self.assertEqual(session.set_grace(1234), 1234)

    def test_the_default_grace_is_cut_by_a_smaller_bound(self) -> None:
        table = SessionTable(self.clock, self.service, max_grace_ms=10_000)
        self.assertEqual(table.start(Connection("a")).grace_ms, 10_000)

    def test_no_bound(self) -> None:
        table = SessionTable(self.clock, self.service, max_grace_ms=None)
        session = table.start(Connection("a"))
        self.assertEqual(session.grace_ms, DEFAULT_GRACE_MS)
        self.assertEqual(session.set_grace(LARGEST_TIMEOUT), LARGEST_TIMEOUT)

    def test_a_restored_session_gets_at_most_the_bound(self) -> None:
        # (a previous leader's record, written under a larger bound)
        session = self.table.restore("old", LARGEST_TIMEOUT)
        self.assertEqual(session.grace_ms, 300_000)
        self.assertEqual(self.timers(), [300.0])
        self.assertEqual(session.last_peer, "restored")
        self.clock.advance(300)
        self.assertEqual(len(self.table), 0)


class IdleSessionTests(SessionTestCase):
    def test_a_session_holding_nothing_ends_when_its_connection_goes(self) -> None:
        ended = []
        self.table.on_end = ended.append
        session = self.table.start(Connection("a"), "idle")
        session.set_grace(LARGEST_TIMEOUT)
        session.disconnected()
        self.assertFalse(session.live)
        self.assertEqual((len(self.table), self.table.detached_count()), (0, 0))
        self.assertEqual(self.timers(), [])
        self.assertEqual(ended, [session])
        # Its id names a new session, as on elock.
        fresh = self.table.take(Connection("b"), "idle")
        self.assertIsNot(fresh, session)
        self.assertEqual(fresh.grace_ms, DEFAULT_GRACE_MS)

    def test_a_session_holding_a_lock_detaches(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        session.disconnected()
        self.assertTrue(session.live)
        self.assertEqual(self.table.detached_count(), 1)
        self.assertEqual(self.timers(), [30.0])
        self.assertEqual(self.holders("k"), 1)

    def test_a_session_that_gave_its_locks_back_ends(self) -> None:
        session = self.table.start(Connection("a"))
        self.lock("k", session)
        self.service.release_all(session)
        session.disconnected()
        self.assertFalse(session.live)
        self.assertEqual(len(self.table), 0)

    def test_idle_sessions_do_not_fill_the_cap(self) -> None:
        table = SessionTable(self.clock, self.service, limit=50)
        for n in range(50):
            session = table.start(Connection(str(n)))
            session.set_grace(LARGEST_TIMEOUT)
            session.disconnected()
        self.assertEqual((len(table), table.detached_count()), (0, 0))
        newcomer = table.start(Connection("new"))
        self.lock("k", newcomer)
        self.assertEqual(self.holders("k"), 1)

    def test_sessions_holding_locks_fill_the_cap_for_the_bounded_grace_only(self) -> None:
        table = SessionTable(self.clock, self.service, limit=50)
        for n in range(50):
            session = table.start(Connection(str(n)))
            session.set_grace(LARGEST_TIMEOUT)
            self.lock(f"k{n}", session)
            session.disconnected()
        self.assertEqual(table.detached_count(), 50)
        self.assertRaises(LimitReached, table.start, Connection("refused"))
        self.clock.advance(300)
        self.assertEqual(table.detached_count(), 0)
        self.assertEqual(self.service.listing(), [])
        table.start(Connection("served"))


class ListingTests(SessionTestCase):
    def test_sessions_in_the_order_they_started(self) -> None:
        first = self.table.start(Connection("a"))
        second = self.table.start(Connection("b"))
        self.lock("k", second)
        second.connection_lost()
        ended = self.table.start(Connection("c"))
        ended.end()
        self.assertEqual(self.table.sessions(), [first, second])

    def test_last_peer_and_time_left(self) -> None:
        session = self.table.start(Connection("a"))
        self.assertEqual(session.last_peer, "127.0.0.1:a")
        self.assertIsNone(session.seconds_left())
        self.lock("k", session)
        session.connection_lost()
        self.assertEqual(session.last_peer, "127.0.0.1:a")
        self.assertEqual(session.seconds_left(), 30.0)
        self.clock.advance(12.5)
        self.assertEqual(session.seconds_left(), 17.5)
        self.assertIs(self.table.take(Connection("b"), session.id), session)
        self.assertEqual(session.last_peer, "127.0.0.1:b")
        self.assertIsNone(session.seconds_left())
        session.end()
        self.assertIsNone(session.seconds_left())
