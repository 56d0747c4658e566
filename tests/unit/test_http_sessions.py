"""
HTTP sessions (L{jesync.sessions.SessionTable.open}): elock's sessions,
started detached with their TTL as grace period, kept alive by
L{jesync.sessions.Session.keep_alive}, counted and refused by
C{--max-sessions} like every detached session; on a L{Clock}, owning locks
in a real L{LockService}.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import LimitReached
from jesync.service import LockService
from jesync.sessions import SessionTable


class Connection:
    """Stands for an elock connection: sessions only keep it and read its peer."""

    peer = "127.0.0.1:40009"


class OpenTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.table = SessionTable(self.clock, self.service, limit=2, max_grace_ms=60_000)

    def test_started_detached_with_its_ttl(self) -> None:
        """Detached, its TTL running, its peer the client's address marked HTTP; its locks released when it runs out."""
        session = self.table.open(5_000, "127.0.0.1:40001")
        self.assertEqual((session.peer, session.last_peer), ("127.0.0.1:40001 (http)",) * 2)
        self.assertEqual((session.connection, session.grace_ms, session.seconds_left()), (None, 5_000, 5.0))
        self.assertEqual(self.table.detached_count(), 1)
        self.successResultOf(self.service.acquire("k", session, 1, 0, 0))
        self.clock.advance(4.999)
        self.assertEqual(self.service.status("k").granted, 1)
        self.clock.advance(0.001)
        self.assertEqual((self.service.status("k").granted, self.table.find(session.id)), (0, None))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_ttl_cut_to_max_grace(self) -> None:
        self.assertEqual(self.table.open(600_000, "127.0.0.1:1").grace_ms, 60_000)

    def test_counted_and_refused_by_max_sessions(self) -> None:
        """Counted as detached sessions; past the limit, LimitReached("max-sessions") and nothing opened."""
        self.table.open(1_000, "a")
        self.table.open(1_000, "b")
        with self.assertRaises(LimitReached) as refused:
            self.table.open(1_000, "c")
        self.assertEqual((refused.exception.limit, refused.exception.value), ("max-sessions", 2))
        self.assertEqual(len(self.table), 2)

    def test_keep_alive_restarts_the_ttl(self) -> None:
        """keep_alive: its TTL starts again (and says it); the session lives on."""
        session = self.table.open(2_000, "a")
        self.clock.advance(1.5)
        self.assertEqual(session.keep_alive(), 2_000)
        self.assertEqual(session.seconds_left(), 2.0)
        self.clock.advance(1.9)
        self.assertTrue(session.live)
        self.clock.advance(0.1)
        self.assertFalse(session.live)
        self.assertEqual(len(self.clock.getDelayedCalls()), 0)

    def test_elock_attaches_and_detaches_even_holding_nothing(self) -> None:
        """
        An elock connection takes it (conn_id): attached, no TTL running,
        keep_alive changes nothing; when the connection goes it is detached
        again with its TTL, even holding nothing (an HTTP session ends when
        its client says so or its TTL runs out).
        """
        session = self.table.open(3_000, "127.0.0.1:1")
        connection = Connection()
        self.assertIs(self.table.take(connection, session.id), session)
        self.assertEqual((session.peer, session.seconds_left(), self.table.detached_count()), (Connection.peer, None, 0))
        self.assertEqual(session.keep_alive(), 3_000)
        self.assertIsNone(session.seconds_left())
        session.disconnected()
        self.assertTrue(session.live)
        self.assertEqual((session.peer, session.seconds_left()), ("127.0.0.1:1 (http)", 3.0))

    def test_elock_sessions_unchanged(self) -> None:
        """An elock session still shows as "detached-session" while detached, and ends if it goes holding nothing."""
        session = self.table.start(Connection())
        self.successResultOf(self.service.acquire("k", session, 1, 0, 0))
        session.disconnected()
        self.assertEqual(session.peer, "detached-session")
        other = self.table.start(Connection())
        other.disconnected()
        self.assertFalse(other.live)

    def test_keep_alive_after_the_end(self) -> None:
        session = self.table.open(1_000, "a")
        session.end()
        self.assertEqual(session.keep_alive(), 1_000)
        self.assertFalse(session.live)
