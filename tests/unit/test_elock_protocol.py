"""
The elock protocol, over L{StringTransport}s and a L{Clock}: an
L{ELockFactory} and a L{JESyncFactory} over one L{LockService}, every request
and reply byte for byte.

A lock that waits holds back the replies to the lines behind it; once it is
answered, they are read on the next reactor turn (C{clock.advance(0)}).
"""

from __future__ import annotations

from twisted.internet.error import ConnectionLost
from twisted.logger import LogLevel, Logger, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.connection import HOLD_BUFFER
from jesync.interfaces import KeyStatus
from jesync.protocols.elock import MAX_SESSION_ID, ELockProtocol
from tests.support import BYE, UnitServer, stats


class ELockTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitServer()
        self.clock = self.server.clock
        self.service = self.server.service
        self.factory = self.server.elock_factory
        self.sessions = self.factory.sessions

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    def elock(self):
        return self.server.connect_elock()

    def jesync(self):
        return self.server.connect()

    def session_id(self, client) -> bytes:
        reply = client.ask(b"conn_id\r\n")
        self.assertTrue(reply.startswith(b"200 ") and reply.endswith(b"\r\n"), reply)
        return reply[4:-2]

    def turn(self) -> None:
        """One reactor turn: held-back lines are read now."""
        self.clock.advance(0)


class LockTests(ELockTestCase):
    def test_free_then_held_by_this_session_then_unavailable(self) -> None:
        first, second = self.elock(), self.elock()
        self.assertEqual(first.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(first.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(first.ask(b"lock k 5\r\n"), b"200 Acquired\r\n")
        self.assertEqual(second.ask(b"lock k\r\n"), b"409 Unavailable\r\n")
        self.assertEqual(second.ask(b"lock k 0\r\n"), b"409 Unavailable\r\n")
        self.assertEqual(self.service.status("k").granted, 1)
        self.assertEqual(self.service.status("k").waiting, 0)

    def test_wait_granted_on_unlock(self) -> None:
        holder, waiter = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        self.assertEqual(waiter.ask(b"lock k 5\r\n"), b"")
        self.assertEqual(self.service.status("k").waiting, 1)
        self.clock.advance(4.9)
        self.assertEqual(waiter.take(), b"")
        self.assertEqual(holder.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(waiter.take(), b"200 Acquired\r\n")
        self.assertEqual(holder.ask(b"lock k\r\n"), b"409 Unavailable\r\n")

    def test_wait_times_out(self) -> None:
        holder, waiter = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        self.assertEqual(waiter.ask(b"lock k 5\r\n"), b"")
        self.clock.advance(4.99)
        self.assertEqual(waiter.take(), b"")
        self.clock.advance(0.02)
        self.assertEqual(waiter.take(), b"409 Unavailable\r\n")
        self.assertEqual(self.service.status("k").waiting, 0)
        # the connection reads on, and a later release grants nothing to it
        self.turn()
        self.assertEqual(holder.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(waiter.ask(b"lock k\r\n"), b"200 Acquired\r\n")

    def test_fifo(self) -> None:
        holder, *waiters = [self.elock() for _ in range(4)]
        holder.ask(b"lock k\r\n")
        for waiter in waiters:
            self.assertEqual(waiter.ask(b"lock k 10\r\n"), b"")
        holder.ask(b"unlock k\r\n")
        self.assertEqual([w.take() for w in waiters], [b"200 Acquired\r\n", b"", b""])
        self.turn()
        waiters[0].ask(b"unlock k\r\n")
        self.assertEqual([w.take() for w in waiters], [b"", b"200 Acquired\r\n", b""])
        self.turn()
        waiters[1].ask(b"unlock_all\r\n")
        self.assertEqual([w.take() for w in waiters], [b"", b"", b"200 Acquired\r\n"])

    def test_locks_never_expire(self) -> None:
        holder, other = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        self.clock.advance(10**7)
        self.assertEqual(other.ask(b"lock k\r\n"), b"409 Unavailable\r\n")
        self.assertEqual(self.service.status("k").granted, 1)

    def test_keys_are_opaque_bytes(self) -> None:
        client, jesync = self.elock(), self.jesync()
        self.assertEqual(client.ask(b"lock \xff\xfe\r\n"), b"200 Acquired\r\n")
        self.assertEqual(client.ask(b"lock l\xc3\xb6ck\r\n"), b"200 Acquired\r\n")
        self.assertEqual(
            jesync.ask(b"status-by-key\n"), b"STATUS 1 0 l\xc3\xb6ck\nSTATUS 1 0 \xff\xfe\nEND\n"
        )
        self.assertEqual(client.ask(b"unlock \xff\xfe\r\n"), b"200 Unlocked\r\n")


class CrossProtocolTests(ELockTestCase):
    def test_elock_lock_excludes_jesync(self) -> None:
        client, jesync, waiter = self.elock(), self.jesync(), self.jesync()
        self.assertEqual(client.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(jesync.ask(b"lock k 1 0\n"), b"TIMEOUT 1 0 k\n")
        # whatever max_concurrent the JESync client allows, the elock holder admits no one
        self.assertEqual(waiter.ask(b"lock k 5\nstatus k\n"), b"STATUS 1 1 k\n")
        self.clock.advance(1000)
        self.assertEqual(waiter.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(client.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")

    def test_jesync_lock_excludes_elock(self) -> None:
        jesync, client = self.jesync(), self.elock()
        self.assertEqual(jesync.ask(b"lock k 3\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(client.ask(b"lock k\r\n"), b"409 Unavailable\r\n")
        self.assertEqual(client.ask(b"unlock k\r\n"), b"403 not_yours\r\n")
        self.assertEqual(client.ask(b"lock k 5\r\n"), b"")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(jesync.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(client.take(), b"200 Acquired\r\n")

    def test_jesync_expiry_hands_the_key_to_elock(self) -> None:
        jesync, client = self.jesync(), self.elock()
        jesync.ask(b"lock k 1 -1 2\n")
        self.assertEqual(client.ask(b"lock k 5\r\n"), b"")
        self.clock.advance(2.01)
        self.assertEqual(client.take(), b"200 Acquired\r\n")
        self.assertEqual(jesync.take(), b"")


class UnlockTests(ELockTestCase):
    def test_unlock_replies(self) -> None:
        holder, other = self.elock(), self.elock()
        self.assertEqual(other.ask(b"lock x\r\n"), b"200 Acquired\r\n")  # other has a session
        self.assertEqual(holder.ask(b"unlock k\r\n"), b"403 not_locked\r\n")
        holder.ask(b"lock k\r\n")
        self.assertEqual(other.ask(b"unlock k\r\n"), b"403 not_yours\r\n")
        self.assertEqual(holder.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(holder.ask(b"unlock k\r\n"), b"403 not_locked\r\n")
        self.assertEqual(self.service.listing()[0].key, "x")

    def test_unlock_without_session(self) -> None:
        holder, client = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        self.assertEqual(client.ask(b"unlock k\r\nunlock j\r\n"), b"403 not_yours\r\n403 not_locked\r\n")
        self.assertIsNone(client.protocol.grammar.session)

    def test_unlock_all(self) -> None:
        client, other, waiter = self.elock(), self.elock(), self.jesync()
        client.ask(b"lock a\r\nlock b\r\nlock c\r\n")
        other.ask(b"lock d\r\n")
        waiter.ask(b"lock b\n")
        self.assertEqual(client.ask(b"unlock_all\r\n"), b"200 OK\r\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 b 120\n")
        self.assertEqual([row.key for row in self.service.listing()], ["b", "d"])
        self.assertEqual(client.ask(b"unlock_all\r\n"), b"200 OK\r\n")
        self.assertEqual(client.ask(b"lock a\r\n"), b"200 Acquired\r\n")

    def test_unlock_all_without_session(self) -> None:
        holder, client = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        self.assertEqual(client.ask(b"unlock_all\r\n"), b"200 OK\r\n")
        self.assertIsNone(client.protocol.grammar.session)
        self.assertEqual(self.service.status("k").granted, 1)


class ConnIdTests(ELockTestCase):
    def test_conn_id_is_random_and_per_session(self) -> None:
        first, second = self.elock(), self.elock()
        first_id = self.session_id(first)
        second_id = self.session_id(second)
        self.assertNotEqual(first_id, second_id)
        for session_id in (first_id, second_id):
            self.assertGreaterEqual(len(session_id), 20, session_id)
            self.assertFalse(session_id.isdigit(), session_id)
        self.assertEqual(self.session_id(first), first_id)
        self.assertEqual(len(self.sessions), 2)

    def test_lock_starts_the_session_conn_id_names(self) -> None:
        client = self.elock()
        client.ask(b"lock k\r\n")
        session = client.protocol.grammar.session
        self.assertEqual(self.session_id(client), session.id.encode())
        self.assertEqual(self.service.listing()[0].key, "k")
        self.assertEqual(len(self.sessions), 1)

    def test_set_unknown_id_starts_a_session_under_it(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"conn_id my-session\r\n"), b"200 conn id set\r\n")
        self.assertEqual(client.ask(b"conn_id\r\n"), b"200 my-session\r\n")
        self.assertEqual(client.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(client.protocol.grammar.session.id, "my-session")

    def test_commands_that_do_not_start_a_session(self) -> None:
        client = self.elock()
        client.ask(b"unlock k\r\nunlock_all\r\nstats\r\nbogus\r\nlock\r\nset_timeout x\r\n")
        self.assertIsNone(client.protocol.grammar.session)
        self.assertEqual(len(self.sessions), 0)
        self.assertEqual(client.ask(b"conn_id chosen\r\n"), b"200 conn id set\r\n")

    def test_refused_once_the_connection_has_a_session(self) -> None:
        for first in [b"lock k\r\n", b"conn_id\r\n", b"set_timeout 100\r\n", b"conn_id mine\r\n", b"lock k 0\r\n"]:
            client = self.elock()
            client.ask(first)
            session = client.protocol.grammar.session
            self.assertIsNotNone(session, first)
            self.assertEqual(client.ask(b"conn_id other\r\n"), b"403 cannot set conn id\r\n", first)
            self.assertEqual(client.ask(b"conn_id %s\r\n" % session.id.encode()), b"403 cannot set conn id\r\n")
            self.assertIs(client.protocol.grammar.session, session)
            client.ask(b"unlock_all\r\n")
        self.assertEqual(self.sessions.detached_count(), 0)
        # no refused request started a session under "other"
        self.assertEqual(self.elock().ask(b"conn_id other\r\n"), b"200 conn id set\r\n")

    def test_refused_for_a_session_attached_elsewhere(self) -> None:
        owner, thief = self.elock(), self.elock()
        owner.ask(b"lock k\r\n")
        session_id = self.session_id(owner)
        self.assertEqual(thief.ask(b"conn_id %s\r\n" % session_id), b"403 cannot set conn id\r\n")
        self.assertIsNone(thief.protocol.grammar.session)
        self.assertEqual(thief.ask(b"unlock k\r\n"), b"403 not_yours\r\n")
        self.assertEqual(owner.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")

    def test_resume_after_drop(self) -> None:
        old, jesync = self.elock(), self.jesync()
        old.ask(b"lock k\r\nlock j\r\n")
        session_id = self.session_id(old)
        jesync.ask(b"lock k\n")
        old.lose(ConnectionLost)
        self.clock.advance(29)
        new = self.elock()
        self.assertEqual(new.ask(b"stats\r\n"), stats(1, 2, 1))
        self.assertEqual(new.ask(b"conn_id %s\r\n" % session_id), b"200 conn id set\r\n")
        self.assertEqual(new.ask(b"stats\r\n"), stats(1, 2, 0))
        self.assertEqual(new.ask(b"conn_id\r\n"), b"200 %s\r\n" % session_id)
        # the grace timer is gone with the resume
        self.clock.advance(60)
        self.assertEqual(new.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(new.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(new.ask(b"unlock j\r\n"), b"200 Unlocked\r\n")

    def test_resumed_session_can_be_resumed_again(self) -> None:
        first = self.elock()
        first.ask(b"lock k\r\n")
        session_id = self.session_id(first)
        first.lose()
        second = self.elock()
        second.ask(b"conn_id %s\r\n" % session_id)
        third = self.elock()
        self.assertEqual(third.ask(b"conn_id %s\r\n" % session_id), b"403 cannot set conn id\r\n")
        second.lose()
        self.assertEqual(third.ask(b"conn_id %s\r\n" % session_id), b"200 conn id set\r\n")
        self.assertEqual(third.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")

    def test_id_of_an_ended_session_names_a_new_one(self) -> None:
        old, jesync = self.elock(), self.jesync()
        old.ask(b"lock k\r\n")
        session_id = self.session_id(old)
        old.lose()
        self.clock.advance(30)
        jesync.ask(b"lock k\n")
        new = self.elock()
        self.assertEqual(new.ask(b"conn_id %s\r\n" % session_id), b"200 conn id set\r\n")
        self.assertEqual(new.ask(b"unlock k\r\n"), b"403 not_yours\r\n")

    def test_longest_id(self) -> None:
        client = self.elock()
        longest = b"i" * MAX_SESSION_ID
        self.assertEqual(
            client.ask(b"conn_id %si\r\nconn_id %s\r\nconn_id\r\n" % (longest, longest)),
            b"400 conn id longer than 256 bytes\r\n200 conn id set\r\n200 %s\r\n" % longest,
        )

    def test_id_that_is_not_utf8_is_echoed_as_sent(self) -> None:
        client = self.elock()
        self.assertEqual(
            client.ask(b"conn_id \xff\xc3(\r\nconn_id\r\nlock k\r\n"),
            b"200 conn id set\r\n200 \xff\xc3(\r\n200 Acquired\r\n",
        )
        client.lose()
        new = self.elock()
        self.assertEqual(new.ask(b"conn_id \xff\xc3(\r\nunlock k\r\n"), b"200 conn id set\r\n200 Unlocked\r\n")


class TimeoutTests(ELockTestCase):
    def drop_holder(self, timeout: bytes | None):
        """An elock session holding k drops; a JESync client waits for k."""
        holder, jesync = self.elock(), self.jesync()
        if timeout is not None:
            self.assertEqual(holder.ask(b"set_timeout %s\r\n" % timeout), b"200 timeout set\r\n")
        holder.ask(b"lock k\r\n")
        jesync.ask(b"lock k\n")
        holder.lose(ConnectionLost)
        return jesync

    def test_default_grace_period(self) -> None:
        jesync = self.drop_holder(None)
        self.clock.advance(29.999)
        self.assertEqual(jesync.take(), b"")
        self.assertEqual(self.sessions.detached_count(), 1)
        self.clock.advance(0.001)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(self.sessions.detached_count(), 0)
        self.assertEqual(len(self.sessions), 0)

    def test_set_timeout(self) -> None:
        jesync = self.drop_holder(b"200")
        monitor = self.elock()
        self.clock.advance(0.199)
        self.assertEqual(monitor.ask(b"stats\r\n"), stats(1, 1, 1))
        self.assertEqual(jesync.take(), b"")
        self.clock.advance(0.001)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(monitor.ask(b"stats\r\n"), stats(1, 1, 0))

    def test_zero_releases_on_drop(self) -> None:
        jesync = self.drop_holder(b"0")
        self.turn()
        self.assertEqual(self.clock.seconds(), 0)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")

    def test_set_timeout_starts_a_session(self) -> None:
        client = self.elock()
        self.assertEqual(
            client.ask(b"set_timeout 100\r\nconn_id x\r\n"), b"200 timeout set\r\n403 cannot set conn id\r\n"
        )

    def test_timeout_survives_resume(self) -> None:
        first, jesync = self.elock(), self.jesync()
        first.ask(b"set_timeout 1000\r\nlock k\r\n")
        session_id = self.session_id(first)
        first.lose()
        second = self.elock()
        second.ask(b"conn_id %s\r\n" % session_id)
        jesync.ask(b"lock k\n")
        second.lose()
        self.clock.advance(0.999)
        self.assertEqual(jesync.take(), b"")
        self.clock.advance(0.001)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")

    def test_last_set_timeout_wins(self) -> None:
        jesync = self.jesync()
        client = self.elock()
        client.ask(b"set_timeout 100000\r\nlock k\r\nset_timeout 10\r\n")
        jesync.ask(b"lock k\n")
        client.lose()
        self.clock.advance(0.01)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")


class GraceBoundTests(ELockTestCase):
    """C{set_timeout} past C{--max-session-grace} (300 s by default) is cut to it, and says so."""

    def test_a_longer_timeout_is_cut_and_the_reply_says_the_value_in_force(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"set_timeout 2147483647\r\n"), b"200 timeout set to 300000\r\n")
        self.assertEqual(client.ask(b"set_timeout 300001\r\n"), b"200 timeout set to 300000\r\n")
        # within the bound: elock's own reply
        self.assertEqual(client.ask(b"set_timeout 300000\r\n"), b"200 timeout set\r\n")

    def test_the_cut_grace_is_the_one_waited(self) -> None:
        holder, jesync = self.elock(), self.jesync()
        holder.ask(b"set_timeout 2147483647\r\nlock k\r\n")
        jesync.ask(b"lock k\n")
        holder.lose(ConnectionLost)
        self.clock.advance(299.999)
        self.assertEqual(jesync.take(), b"")
        self.clock.advance(0.001)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(len(self.sessions), 0)

    def test_the_bound_is_the_factorys(self) -> None:
        self.sessions.max_grace_ms = 5000
        client = self.elock()
        self.assertEqual(client.ask(b"set_timeout 5001\r\n"), b"200 timeout set to 5000\r\n")
        self.sessions.max_grace_ms = None
        self.assertEqual(client.ask(b"set_timeout 2147483647\r\n"), b"200 timeout set\r\n")


class IdleSessionTests(ELockTestCase):
    """A session that holds nothing and waits for nothing ends when its connection goes."""

    def test_idle_sessions_do_not_fill_max_sessions(self) -> None:
        self.sessions.limit = 50
        for _ in range(50):
            client = self.elock()
            self.assertEqual(client.ask(b"set_timeout 2147483647\r\n"), b"200 timeout set to 300000\r\n")
            client.lose(ConnectionLost)
        self.assertEqual((len(self.sessions), self.sessions.detached_count()), (0, 0))
        self.assertEqual(self.elock().ask(b"lock k\r\n"), b"200 Acquired\r\n")

    def test_a_session_whose_wait_is_cancelled_by_the_drop_ends(self) -> None:
        holder, waiter = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        waiter.send(b"lock k 60\r\n")
        self.assertEqual(self.service.status("k").waiting, 1)
        waiter.lose(ConnectionLost)
        self.assertEqual(self.service.status("k").waiting, 0)
        self.assertEqual(len(self.sessions), 1)  # the holder's only
        self.assertEqual(self.sessions.detached_count(), 0)

    def test_reconnecting_to_an_idle_session_starts_it_again(self) -> None:
        first = self.elock()
        self.assertEqual(
            first.ask(b"conn_id mine\r\nset_timeout 1000\r\n"), b"200 conn id set\r\n200 timeout set\r\n"
        )
        first.lose(ConnectionLost)
        second = self.elock()
        # elock's answer to a client coming back to a session with no locks
        self.assertEqual(second.ask(b"conn_id mine\r\nconn_id\r\n"), b"200 conn id set\r\n200 mine\r\n")
        self.assertEqual(second.ask(b"unlock k\r\n"), b"403 not_locked\r\n")


class StatsTests(ELockTestCase):
    def test_stats(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"stats\r\n"), stats(1, 0, 0))
        self.assertIsNone(client.protocol.grammar.session)
        other, jesync = self.elock(), self.jesync()
        other.ask(b"lock a\r\nlock b\r\n")
        jesync.ask(b"lock c 2\n")
        self.jesync().ask(b"lock c 2\n")
        jesync.ask(b"lock a\n")  # waiting: not a grant
        self.assertEqual(client.ask(b"stats\r\n"), stats(2, 4, 0))
        other.lose()
        self.assertEqual(client.ask(b"stats\r\n"), stats(1, 4, 1))
        self.clock.advance(30)
        self.assertEqual(client.ask(b"stats\r\n"), stats(1, 3, 0))

    def test_quit_is_not_monitored(self) -> None:
        client, other = self.elock(), self.elock()
        other.ask(b"lock a\r\n")
        self.assertEqual(other.ask(b"quit\r\n"), BYE)
        other.lose()
        self.assertEqual(client.ask(b"stats\r\n"), stats(1, 0, 0))


class RefusedConnectionTests(ELockTestCase):
    def test_refused_connection_is_not_a_client(self) -> None:
        """A connection over max-connections never counts in STAT clients."""
        self.server.policy.connections.limit = 1
        client = self.elock()
        refused = self.elock()
        self.assertEqual(refused.take(), b"503 max-connections exceeded (1)\r\n")
        self.assertTrue(refused.closing)
        self.assertEqual(client.ask(b"stats\r\n"), stats(1, 0, 0))
        refused.lose()
        self.assertEqual(client.ask(b"stats\r\n"), stats(1, 0, 0))


class QuitTests(ELockTestCase):
    def test_quit_releases_at_once_and_closes(self) -> None:
        client, waiter = self.elock(), self.jesync()
        client.ask(b"lock a\r\nlock b\r\n")
        session_id = self.session_id(client)
        waiter.ask(b"lock a\n")
        self.assertEqual(client.ask(b"quit\r\nlock c\r\nstats\r\n"), BYE)
        self.assertTrue(client.closing)
        self.assertEqual(waiter.take(), b"GRANTED 1 0 a 120\n")
        self.assertEqual([row.key for row in self.service.listing()], ["a"])
        self.assertEqual(len(self.sessions), 0)
        client.lose()
        # no grace timer: the only pending call is the JESync grant's expiry
        self.assertEqual([call.getTime() for call in self.clock.getDelayedCalls()], [120.0])
        # the session is over: its id names a new one, holding nothing
        new = self.elock()
        self.assertEqual(new.ask(b"conn_id %s\r\nunlock b\r\n" % session_id), b"200 conn id set\r\n403 not_locked\r\n")

    def test_quit_without_session(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"quit\n"), BYE)
        self.assertTrue(client.closing)
        client.lose()
        self.assertEqual(len(self.sessions), 0)

    def test_quit_with_arguments(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"quit now\r\n"), b"400 too many arguments\r\n")
        self.assertFalse(client.closing)


class UnknownCommandTests(ELockTestCase):
    def test_unknown_commands(self) -> None:
        client = self.elock()
        lines = [
            (b"bogus", b"bogus"),
            (b"", b""),
            (b"\r", b"\\r"),  # a \r inside a line is no separator
            (b"   \t ", b""),
            (b"LOCK k", b"LOCK"),
            (b"Lock k", b"Lock"),
            (b"lockk", b"lockk"),
            (b"unlock-all", b"unlock-all"),
            (b"release k", b"release"),
            (b"status k", b"status"),
            (b"echo hello", b"echo"),
            (b'say"hi"', b'say\\"hi\\"'),
            (b"back\\slash", b"back\\\\slash"),
            (b"l\xc3\xb6ck k", b"l\xc3\xb6ck"),  # printable in latin1: as sent
            (b"esc\x1b", b"esc\\e"),
        ]
        # As elock's Erlang ~p prints them: a word with a byte that is not
        # printable is a list of byte values.
        unprintable = [
            (b"\x00", b"[0]"),
            (b"\x00lock k", b"[0,108,111,99,107]"),
            (b"\xff\xfe\x80 k", b"[255,254,128]"),
        ]
        sent = b"".join(line + b"\r\n" for line, word in lines + unprintable) + b"lock k\r\n"
        expected = b"".join(b'400 Unknown command: "%s"\r\n' % word for line, word in lines)
        expected += b"".join(b"400 Unknown command: %s\r\n" % word for line, word in unprintable)
        self.assertEqual(client.ask(sent), expected + b"200 Acquired\r\n")
        self.assertFalse(client.closing)

# Bad arguments and the 400 reply each gets.
BAD_REQUESTS = [
    (b"lock", b"missing key"),
    (b"lock  \t ", b"missing key"),
    (b"lock k x", b"wait is not an integer"),
    (b"lock k 1.5", b"wait is not an integer"),
    (b"lock k +1", b"wait is not an integer"),
    (b"lock k 0x1", b"wait is not an integer"),
    (b"lock k 5s", b"wait is not an integer"),
    (b"lock k \xff", b"wait is not an integer"),
    (b"lock k -1", b"wait must not be negative"),
    (b"lock k 9999999999", b"wait is out of range"),
    (b"lock k 2147483648", b"wait is out of range"),
    (b"lock k 1 2", b"too many arguments"),
    (b"unlock", b"missing key"),
    (b"unlock a b", b"too many arguments"),
    (b"unlock_all x", b"too many arguments"),
    (b"conn_id a b", b"too many arguments"),
    (b"set_timeout", b"missing timeout"),
    (b"set_timeout x", b"timeout is not an integer"),
    (b"set_timeout 1.0", b"timeout is not an integer"),
    (b"set_timeout -1", b"timeout must not be negative"),
    (b"set_timeout -2147483648", b"timeout is out of range"),
    (b"set_timeout 1 2", b"too many arguments"),
    (b"stats x", b"too many arguments"),
    (b"quit x", b"too many arguments"),
]


class BadRequestTests(ELockTestCase):
    def test_bad_requests(self) -> None:
        for line, message in BAD_REQUESTS:
            client = self.elock()
            self.assertEqual(client.ask(line + b"\r\n"), b"400 " + message + b"\r\n", line)
            # nothing changed: no session, no lock
            self.assertIsNone(client.protocol.grammar.session, line)
            self.assertEqual(self.service.listing(), [], line)
            # and the connection stays usable
            self.assertEqual(client.ask(b"unlock_all\r\nlock k\r\n"), b"200 OK\r\n200 Acquired\r\n", line)
            self.assertFalse(client.closing, line)
            client.lose()
            self.clock.advance(30)

    def test_bad_set_timeout_keeps_the_old_one(self) -> None:
        client, jesync = self.elock(), self.jesync()
        client.ask(b"set_timeout 100\r\nlock k\r\n")
        self.assertEqual(client.ask(b"set_timeout -5\r\n"), b"400 timeout must not be negative\r\n")
        jesync.ask(b"lock k\n")
        client.lose()
        self.clock.advance(0.1)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")


class HoldTests(ELockTestCase):
    """A waiting lock holds back the replies to the lines pipelined behind it."""

    def test_half_close_while_a_lock_waits(self) -> None:
        """A client that sends its lines and shuts down its side still gets every reply, then the close."""
        holder, client = self.jesync(), self.elock()
        holder.ask(b"lock k\n")
        client.send(b"lock k 5\r\nunlock k\r\nlock k 5\r\nlock free 5\r\n")
        client.protocol.readConnectionLost()
        # The FIN ends the wait at once: nothing is granted to a peer that may be gone.
        self.assertEqual(client.take(), b"409 Unavailable\r\n")
        self.assertFalse(client.closing)
        self.turn()
        # The lines behind it are answered; one that would wait is not granted at once.
        self.assertEqual(client.take(), b"403 not_yours\r\n409 Unavailable\r\n200 Acquired\r\n")
        self.assertTrue(client.closing)
        self.assertEqual(self.service.status("k"), KeyStatus("k", 1, 0))

    def test_half_close_just_after_a_held_lock_is_granted(self) -> None:
        """The lines buffered behind it are answered before the close (found by the fuzzer)."""
        holder, client = self.jesync(), self.elock()
        holder.ask(b"lock k\n")
        client.send(b"lock k 1\r\nunlock_all\r\n")
        holder.protocol.readConnectionLost()  # releases k: the elock lock is granted
        client.protocol.readConnectionLost()
        self.turn()
        self.assertEqual(client.take(), b"200 Acquired\r\n200 OK\r\n")
        self.assertTrue(client.closing)

    def test_stopping_the_factory_ends_detached_sessions(self) -> None:
        client = self.elock()
        client.ask(b"lock k\r\n")
        client.lose()
        self.assertEqual(self.service.status("k").granted, 1)
        self.factory.doStart()
        self.factory.doStop()
        self.assertEqual(self.service.status("k").granted, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_replies_held_until_granted(self) -> None:
        holder, client = self.jesync(), self.elock()
        holder.ask(b"lock k\n")
        self.assertEqual(client.ask(b"lock k 5\r\nstats\r\nlock j\r\n"), b"")
        self.clock.advance(4)
        self.assertEqual(client.take(), b"")
        self.assertEqual(self.service.status("j").granted, 0)
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(client.take(), b"200 Acquired\r\n")
        self.turn()
        self.assertEqual(client.take(), stats(1, 1, 0) + b"200 Acquired\r\n")

    def test_replies_held_until_timed_out(self) -> None:
        holder, client = self.jesync(), self.elock()
        holder.ask(b"lock k\n")
        self.assertEqual(client.ask(b"lock k 5\r\nconn_id\r\nunlock k\r\n"), b"")
        self.clock.advance(5.01)
        self.turn()
        session_id = client.protocol.grammar.session.id.encode()
        self.assertEqual(client.take(), b"409 Unavailable\r\n200 %s\r\n403 not_yours\r\n" % session_id)

    def test_lines_arriving_while_held(self) -> None:
        holder, client = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        client.ask(b"lock k 5\r\n")
        self.assertEqual(client.ask(b"lock j\r\nunl"), b"")
        self.assertEqual(client.ask(b"ock j\r\nquit\r\n"), b"")
        self.assertFalse(client.closing)
        holder.ask(b"quit\r\n")
        self.assertEqual(client.take(), b"200 Acquired\r\n")
        self.turn()
        self.assertEqual(client.take(), b"200 Acquired\r\n200 Unlocked\r\n" + BYE)
        self.assertTrue(client.closing)

    def test_chain_of_waits(self) -> None:
        holder, client = self.elock(), self.elock()
        holder.ask(b"lock a\r\nlock b\r\n")
        self.assertEqual(client.ask(b"lock a 5\r\nlock b 5\r\nstats\r\n"), b"")
        holder.ask(b"unlock a\r\n")
        self.assertEqual(client.take(), b"200 Acquired\r\n")
        self.turn()
        self.assertEqual(client.take(), b"")
        holder.ask(b"unlock b\r\n")
        self.assertEqual(client.take(), b"200 Acquired\r\n")
        self.turn()
        self.assertEqual(client.take(), stats(2, 2, 0))

    def test_read_ahead_is_bounded_while_held(self) -> None:
        holder, client = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        client.ask(b"lock k 5\r\n")
        self.assertEqual(client.transport.producerState, "producing")
        chunk = b"conn_id\r\n" * 1000
        sent = 0
        while client.transport.producerState == "producing":
            self.assertEqual(client.ask(chunk), b"")
            sent += 1
            self.assertLessEqual(sent * len(chunk), 2 * HOLD_BUFFER)
        self.assertGreater(sent * len(chunk), HOLD_BUFFER)
        holder.ask(b"unlock k\r\n")
        self.assertEqual(client.transport.producerState, "producing")
        self.turn()
        session_id = client.protocol.grammar.session.id.encode()
        self.assertEqual(client.take(), b"200 Acquired\r\n" + b"200 %s\r\n" % session_id * 1000 * sent)

    def test_drop_while_waiting_cancels_the_wait(self) -> None:
        holder, client = self.jesync(), self.elock()
        holder.ask(b"lock k\n")
        client.ask(b"lock j\r\n")
        session_id = self.session_id(client)
        self.assertEqual(client.ask(b"lock k 5\r\nstats\r\n"), b"")
        self.assertEqual(holder.ask(b"status k\n"), b"STATUS 1 1 k\n")
        client.lose(ConnectionLost)
        self.assertEqual(holder.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(self.sessions.detached_count(), 1)
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 0 0 k\n")
        self.turn()
        self.assertEqual(client.take(), b"")
        self.assertEqual(self.clock.getDelayedCalls()[0].getTime(), 30)
        # the session kept what it held
        new = self.elock()
        self.assertEqual(
            new.ask(b"conn_id %s\r\nunlock j\r\nunlock k\r\n" % session_id),
            b"200 conn id set\r\n200 Unlocked\r\n403 not_locked\r\n",
        )


class LoggingTests(ELockTestCase):
    def test_verbose_logs_commands_and_replies(self) -> None:
        events: list[dict] = []
        self.patch(ELockProtocol, "log", Logger(observer=events.append))
        client = UnitServer(verbose=True).connect_elock()
        client.ask(b"lock k\r\nstats\r\n")
        client.lose()
        self.assertEqual(
            [(event["log_level"], formatEvent(event)) for event in events],
            [
                (LogLevel.info, "127.0.0.1:40001 connected"),
                (LogLevel.debug, "127.0.0.1:40001 sent b'lock k'"),
                (LogLevel.debug, "127.0.0.1:40001 answered b'200 Acquired'"),
                (LogLevel.debug, "127.0.0.1:40001 sent b'stats'"),
                (LogLevel.debug, "127.0.0.1:40001 answered b'200 STATS'"),
                (LogLevel.debug, "127.0.0.1:40001 answered b'STAT clients 1'"),
                (LogLevel.debug, "127.0.0.1:40001 answered b'STAT locks 1'"),
                (LogLevel.debug, "127.0.0.1:40001 answered b'STAT monitoring 0'"),
                (LogLevel.debug, "127.0.0.1:40001 answered b'END'"),
                (LogLevel.info, "127.0.0.1:40001 disconnected"),
            ],
        )


class FencingTests(ELockTestCase):
    """C{fencing on}: C{200 Acquired} carries the grant's fencing token."""

    def test_off_by_default_then_on(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"lock a\r\n"), b"200 Acquired\r\n")
        self.assertEqual(client.ask(b"fencing on\r\n"), b"200 fencing on\r\n")
        a_token = self.service.holders("a")[0].token
        self.assertEqual(client.ask(b"lock a\r\n"), b"200 Acquired %d\r\n" % a_token)
        self.assertEqual(client.ask(b"lock b\r\n"), b"200 Acquired %d\r\n" % (a_token + 1))
        self.assertEqual(client.ask(b"fencing off\r\nlock c\r\n"), b"200 fencing off\r\n200 Acquired\r\n")
        self.assertEqual(client.ask(b"fencing maybe\r\n"), b"400 fencing is on or off\r\n")

    def test_waited_for_grant(self) -> None:
        holder, waiter = self.elock(), self.elock()
        holder.ask(b"lock k\r\n")
        self.assertEqual(waiter.ask(b"fencing on\r\nlock k 5000\r\n"), b"200 fencing on\r\n")
        holder.ask(b"unlock k\r\n")
        self.turn()
        self.assertEqual(waiter.take(), b"200 Acquired %d\r\n" % self.service.holders("k")[0].token)


class OwnedTests(ELockTestCase):
    """C{owned <key>} (an extension): whether this session holds the key."""

    def test_held_then_unlocked(self) -> None:
        client = self.elock()
        client.ask(b"lock k\r\n")
        self.assertEqual(client.ask(b"owned k\r\n"), b"200 owned\r\n")
        client.ask(b"unlock k\r\n")
        self.assertEqual(client.ask(b"owned k\r\n"), b"404 not_owned\r\n")

    def test_held_by_another_session_or_a_jesync_client(self) -> None:
        client, other, jesync = self.elock(), self.elock(), self.jesync()
        other.ask(b"lock k\r\n")
        jesync.ask(b"lock j\n")
        client.ask(b"lock mine\r\n")
        self.assertEqual(client.ask(b"owned k\r\nowned j\r\nowned free\r\n"), b"404 not_owned\r\n" * 3)

    def test_with_fencing_carries_the_token(self) -> None:
        client = self.elock()
        client.ask(b"fencing on\r\n")
        acquired = client.ask(b"lock k\r\n")
        token = self.service.holders("k")[0].token
        self.assertEqual(acquired, b"200 Acquired %d\r\n" % token)
        self.assertEqual(client.ask(b"owned k\r\n"), b"200 owned %d\r\n" % token)

    def test_starts_no_session(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"owned k\r\n"), b"404 not_owned\r\n")
        self.assertIsNone(client.protocol.grammar.session)

    def test_after_resume(self) -> None:
        """What a resuming client asks: the resumed session's locks are owned, a new session's are not."""
        old = self.elock()
        old.ask(b"lock k\r\n")
        session_id = self.session_id(old)
        old.lose(ConnectionLost)
        resumed = self.elock()
        self.assertEqual(resumed.ask(b"conn_id %s\r\nowned k\r\n" % session_id), b"200 conn id set\r\n200 owned\r\n")
        resumed.lose(ConnectionLost)
        self.clock.advance(31)
        too_late = self.elock()
        self.assertEqual(
            too_late.ask(b"conn_id %s\r\nowned k\r\n" % session_id), b"200 conn id set\r\n404 not_owned\r\n"
        )

    def test_bad_arguments(self) -> None:
        client = self.elock()
        self.assertEqual(client.ask(b"owned\r\n"), b"400 missing key\r\n")
        self.assertEqual(client.ask(b"owned a b\r\n"), b"400 too many arguments\r\n")
        self.assertFalse(client.closing)
