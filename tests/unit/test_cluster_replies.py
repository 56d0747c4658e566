"""
The connection layer in cluster mode, on a fake clock and fake transports:
replies that depend on durable state wait for it (in request order, a FIN
answered, a failed write answered with nothing), and once the leadership
is not certain nothing more is sent on any connection.  The journal here
stands in for L{jesync.cluster.journal.Journal}'s contract (C{durable()}:
None, or a Deferred that fires once the state is in etcd, or fails);
tests/etcd/test_cluster_journal.py tests the real one against etcd.
"""

from __future__ import annotations

from typing import Any, List, Optional, Set

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from jesync.cluster.journal import Deposed
from jesync.connections.policy import IDurability
from jesync.interfaces import ILockObserver, IOwnerChanges
from jesync.protocols.dlock import DlockFactory
from jesync.sessions import TimedGrants
from tests.dlock_messages import lock as dlock_lock, parse_responses, status_name
from tests.support import UnitServer


@implementer(ILockObserver, IOwnerChanges, IDurability)
class StandInJournal:
    """Holds every reply while C{holding}; records what it was told changed."""

    def __init__(self) -> None:
        self.holding = False
        self.waits: List[Deferred[None]] = []
        self.timed: Set[str] = set()

    def durable(self) -> Optional[Deferred[None]]:
        if not self.holding:
            return None
        waiting: Deferred[None] = Deferred()
        self.waits.append(waiting)
        return waiting

    def commit(self) -> None:
        self.holding = False
        waits, self.waits = self.waits, []
        for waiting in waits:
            if not waiting.called:
                waiting.callback(None)

    def fail(self) -> None:
        waits, self.waits = self.waits, []
        for waiting in waits:
            waiting.errback(Failure(Deposed("refused")))

    def timed_changed(self, key: str) -> None:
        self.timed.add(key)

    def session_changed(self, session: object) -> None:
        pass

    # (the lock service's observer, as the journal is: grant events are not recorded here)
    def granted(self, grant: object, waited: float) -> None:
        pass

    def timed_out(self, key: str) -> None:
        pass

    def released(self, grant: object) -> None:
        pass

    def expired(self, grant: object) -> None:
        pass


class DurableReplyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitServer()
        self.journal = StandInJournal()
        # (wired as build_lock_server wires a term's journal)
        self.server.policy.durability = self.journal
        self.server.service.observer = self.journal

    def test_an_elock_reply_waits_for_its_commit_and_later_requests_wait_behind_it(self) -> None:
        client = self.server.connect_elock()
        self.journal.holding = True
        self.assertEqual(client.ask(b"lock a\r\nlock b\r\n"), b"")
        self.assertEqual(len(self.journal.waits), 1)  # the second request is not read yet
        self.journal.commit()
        self.server.clock.advance(0)  # (held requests are read again on the next turn)
        self.assertEqual(client.take(), b"200 Acquired\r\n200 Acquired\r\n")

    def test_a_fin_still_gets_the_reply_owed(self) -> None:
        client = self.server.connect_elock()
        self.journal.holding = True
        client.send(b"lock a\r\n")
        client.protocol.readConnectionLost()
        self.assertFalse(client.closing)
        self.journal.commit()
        self.assertEqual(client.take(), b"200 Acquired\r\n")
        self.server.clock.advance(0)
        self.assertTrue(client.closing)

    def test_a_refused_write_sends_nothing(self) -> None:
        client = self.server.connect_elock()
        self.journal.holding = True
        client.send(b"lock a\r\n")
        self.journal.fail()
        self.assertEqual(client.take(), b"")

    def test_jesync_replies_never_wait(self) -> None:
        client = self.server.connect()
        self.journal.holding = True
        self.assertEqual(client.ask(b"lock a\n"), b"GRANTED 1 0 a 120\n")
        self.assertEqual(self.journal.waits, [])

    def test_a_dlock_timed_grant_is_journalled_before_its_reply(self) -> None:
        factory = DlockFactory(self.server.service, policy=self.server.policy)
        client = self.server._connect(factory, None, None)
        self.journal.holding = True
        client.send(self.frame(dlock_lock(["t"], release_micro=5_000_000)))
        self.assertEqual(client.take(), b"")
        self.assertEqual(self.journal.timed, {"t"})
        [grant] = self.server.service.holders("t")
        self.assertIsInstance(grant.owner, TimedGrants)
        self.journal.commit()
        [response] = parse_responses(client.take())
        self.assertEqual(status_name(response), "Ok")

    @staticmethod
    def frame(request) -> bytes:
        body = request.SerializeToString()
        return len(body).to_bytes(4, "big") + body


class CertaintyTests(SynchronousTestCase):
    """C{policy.serving}: once it says no, nothing is sent, on any connection."""

    def setUp(self) -> None:
        self.server = UnitServer()
        self.serving = True
        self.server.policy.serving = lambda: self.serving

    def test_nothing_is_sent_once_leadership_is_uncertain(self) -> None:
        holder = self.server.connect()
        waiter = self.server.connect()
        self.assertEqual(holder.ask(b"lock a\n"), b"GRANTED 1 0 a 120\n")
        self.assertEqual(waiter.ask(b"lock a\n"), b"")
        self.serving = False
        # The grant happens in the lock table, but nobody is told of it.
        self.assertEqual(holder.ask(b"release a\n"), b"")
        self.assertEqual(waiter.take(), b"")
        self.assertEqual(self.server.service.status("a").granted, 1)
        # Nor of anything else, not even a last word before a close.
        self.assertEqual(waiter.ask(b"bogus\n"), b"")
        waiter.protocol.close(b"bye\n")
        self.assertEqual(waiter.take(), b"")

    def test_an_elock_reply_waiting_for_its_commit_is_not_sent_if_certainty_ends_meanwhile(self) -> None:
        journal = StandInJournal()
        self.server.policy.durability = journal
        self.server.service.observer = journal
        client = self.server.connect_elock()
        journal.holding = True
        client.send(b"lock a\r\n")
        self.serving = False
        journal.commit()
        self.assertEqual(client.take(), b"")

    def test_a_grant_whose_token_would_pass_the_durable_mark_is_not_told(self) -> None:
        """
        The mark in etcd was not renewed in time and the tokens used up the
        room below it: the grant happens, its token above the mark, but the
        leader steps down (L{JournalMark.passed}, then the member's
        C{_journal_failed}: no reply from then on) before telling anyone.
        """
        from jesync.fencing import TokenMarkService

        clock = self.server.clock
        clock.advance(1000)
        mark = StandInMark(int(clock.seconds() * 1e6) + 10)

        def passed(token: int) -> None:
            mark.passed_tokens.append(token)
            self.serving = False

        mark.passed = passed  # type: ignore[method-assign]
        keeper = TokenMarkService(mark, self.server.service, clock)
        keeper.startService()
        self.addCleanup(keeper.stopService)
        self.server.service.last_token = mark.durable - 1
        client = self.server.connect()
        self.assertEqual(client.ask(b"fencing on\nlock a\n"), b"FENCING ON\nGRANTED 1 0 a 120 %d\n" % mark.durable)
        self.assertEqual(client.ask(b"lock b\n"), b"")
        self.assertEqual(mark.passed_tokens, [mark.durable + 1])
        self.assertEqual(self.server.service.status("b").granted, 1)


class StandInMark:
    """A fencing-token mark that is never made durable (etcd does not answer)."""

    path = "etcd (a stand-in)"

    def __init__(self, durable: int) -> None:
        self.durable = durable
        self.passed_tokens: List[int] = []

    def write(self, mark: int) -> Deferred[None]:
        return Deferred()

    def passed(self, token: int) -> None:
        self.passed_tokens.append(token)


class TermTests(SynchronousTestCase):
    """L{jesync.cluster.member.Term}: certain until the TTL minus a margin after the keep-alive was sent."""

    def test_timing(self) -> None:
        from jesync.cluster.member import Timing

        self.assertEqual((Timing(2).margin, Timing(2).certainty, Timing(2).poll), (0.5, 1.5, 0.5))
        self.assertEqual((Timing(5).margin, Timing(5).certainty, Timing(5).keepalive), (1.0, 4.0, 5 / 3))
        self.assertEqual(Timing(60).margin, 1.0)

    def test_certain_until_the_deadline_then_never_again(self) -> None:
        from jesync.cluster.member import Term

        now = [100.0]
        lapsed: List[bool] = []
        term = Term(lease=1, ttl=2, revision=7, valid_until=101.5, monotonic=lambda: now[0])
        term.on_lapse = lambda: lapsed.append(True)
        self.assertTrue(term.certain())
        now[0] = 101.49
        self.assertTrue(term.certain())
        now[0] = 101.5
        self.assertFalse(term.certain())
        self.assertEqual(lapsed, [True])
        # A keep-alive answered late cannot bring it back.
        term.valid_until = 103.0
        self.assertFalse(term.certain())
        self.assertEqual(lapsed, [True])


class StandInEtcd:
    """An etcd that commits every transaction at once."""

    def __init__(self) -> None:
        self.transactions: List[list] = []

    def txn(self, compare, success, failure=()) -> Deferred:
        from jesync.cluster.etcd import TxnResult

        self.transactions.append(list(success))
        return succeed(TxnResult(True, len(self.transactions), []))


class TakeoverTokenTests(SynchronousTestCase):
    """A new leader's first tokens, on a fake clock and a stand-in etcd."""

    def test_restoring_more_grants_than_the_room_above_the_mark_does_not_pass_it(self) -> None:
        """
        The predecessor renewed its mark 10 ms before the takeover, and its
        sessions held 120,000 keys (more than the ROOM a reservation leaves
        above the last token): restoring them leaves the last token at the
        old mark, the new term's mark is reserved from it, and the first
        grant neither passes it nor ends the term.
        """
        from jesync.cluster.journal import DurableState, SessionRecord
        from jesync.cluster.member import ClusterMember, Term, abandon
        from jesync.fencing import AHEAD, ROOM
        from jesync.server import ServerSettings, build_lock_server

        clock = Clock()
        clock.advance(1_700_000_000)
        now = int(clock.seconds() * 1e6)
        etcd: Any = StandInEtcd()
        member = ClusterMember(clock, ServerSettings(ports=[]), etcd, "c", 5, build_lock_server, lambda: 0.0, "m")
        term = member.term = Term(lease=1, ttl=5, revision=7, valid_until=100.0, monotonic=lambda: 0.0)
        listened: List[Term] = []
        member._listen = listened.append  # type: ignore[method-assign]
        old_mark = now + AHEAD - 10_000
        sessions = [
            SessionRecord(f"s{s}", 60_000, {f"k{s}-{n}": old_mark - 200_000 + s * 8_000 + n for n in range(8_000)})
            for s in range(15)
        ]
        member._start_serving(term, DurableState(mark=old_mark, sessions=sessions))
        clock.advance(0)  # (the journal commits on the next turn)
        self.assertEqual(listened, [term])
        server, journal = term.server, term.journal
        self.addCleanup(abandon, server)
        locks = server.locks
        [session] = [session for session in server.factories["elock"].sessions.sessions() if session.id == "s3"]
        self.assertEqual(locks.grant_of("k3-5", session).token, old_mark - 200_000 + 24_005)  # each keeps its own
        self.assertEqual(locks.last_token, old_mark)
        self.assertEqual(journal.committed_mark, old_mark + ROOM)
        server.startService()
        self.addCleanup(server.stopService)
        self.assertEqual(locks.request("new", "client").token, old_mark + 1)
        self.assertIsNone(journal.failed)


class HeldEtcd:
    """An etcd that never answers: every commit stays in flight."""

    def txn(self, compare, success, failure=()) -> Deferred:
        return Deferred()


class JournalFailureTests(SynchronousTestCase):
    def test_a_token_past_the_mark_fails_the_waiting_replies_only_after_the_grant(self) -> None:
        """
        A multi-key grant whose second token would pass the committed mark
        ends the term (L{JournalMark.passed}, within the grant); a reply
        waiting for a commit fails on the next reactor turn, not within the
        grant (its failure may close a connection, releasing locks), and
        none is released as durable meanwhile.
        """
        from jesync.cluster.journal import Journal, JournalMark, Layout
        from jesync.fencing import TokenMarkService
        from jesync.service import LockService

        clock = Clock()
        clock.advance(1000)
        locks = LockService(clock)
        failures: List[str] = []
        etcd: Any = HeldEtcd()
        journal = Journal(etcd, Layout("c"), 7, locks, clock, on_failure=failures.append)
        locks.observer = journal
        journal.committed_mark = int(clock.seconds() * 1e6) + 10  # (its renewal never commits)
        keeper = TokenMarkService(JournalMark(journal), locks, clock)
        keeper.startService()
        self.addCleanup(keeper.stopService)
        clock.advance(0)  # (the renewal is in flight)
        closing = object()
        locks.request("held", closing)
        events: List[str] = []

        def closed(reason: Failure) -> None:
            reason.trap(Deposed)
            events.append("failed")
            locks.release_all(closing)  # as a connection closing on it does

        waiting = journal.durable()
        assert waiting is not None
        waiting.addCallbacks(lambda _: events.append("sent"), closed)
        locks.last_token = journal.committed_mark - 1
        grants = locks.request_many(["a", "b", "c"], "other")
        self.assertEqual([grant.token for grant in grants], [journal.committed_mark + n for n in range(3)])
        self.assertEqual(len(failures), 1)
        self.assertIn("would pass the mark in etcd", failures[0])
        self.assertEqual(events, [])
        self.assertEqual(locks.status("held").granted, 1)
        self.failureResultOf(journal.durable(), Deposed)  # (a reply asking now is refused at once)
        clock.advance(0)
        self.assertEqual(events, ["failed"])
        self.assertEqual(locks.status("held").granted, 0)
        self.assertEqual([locks.status(key).granted for key in "abc"], [1, 1, 1])
