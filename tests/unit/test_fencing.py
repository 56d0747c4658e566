"""
Fencing tokens: strictly increasing per key, across keys, and across restarts
(L{jesync.service}'s rule and L{jesync.fencing}'s high-water mark), on a
L{Clock}, with the mark in a real file.  Real servers stopped and started
again are in L{tests.tcp.test_fencing_restarts}.
"""

from __future__ import annotations

import errno
import os

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, formatEvent
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from zope.interface import implementer
from zope.interface.verify import verifyObject

from jesync.fencing import AHEAD, EVERY, MARK_FILE, RENEW_BELOW, ROOM, IDurableMark, TokenMark, TokenMarkService
from jesync.interfaces import ITokenMark
from jesync.server import ServerSettings, build_server
from jesync.service import LockService
from tests.support import parse, short_temp_dir


class ServiceTokenTests(SynchronousTestCase):
    def test_from_the_clock_in_microseconds(self) -> None:
        clock = Clock()
        clock.advance(1700000000.25)
        service = LockService(clock)
        grant = service.request("k", "a")
        self.assertEqual(grant.token, 1700000000250000)
        # several grants within one microsecond: one more each
        self.assertEqual([service.request(key, "a").token for key in "xyz"], [grant.token + n for n in (1, 2, 3)])
        clock.advance(1)
        self.assertEqual(service.request("later", "a").token, 1700000001250000)

    def test_above_first_token_even_if_the_clock_went_back(self) -> None:
        service = LockService(Clock(), first_token=10**15)
        self.assertEqual(service.request("k", "a").token, 10**15 + 1)
        self.assertEqual(service.last_token, 10**15 + 1)

    def test_renewal_keeps_release_does_not(self) -> None:
        clock = Clock()
        service = LockService(clock)
        grant = service.request("k", "a", expires=5)
        self.assertIs(service.request("k", "a", expires=50), grant)
        self.assertEqual(grant.token, 1)
        (many,) = service.request_many(["k"], "a")
        self.assertIs(many, grant)
        grant.release()
        self.assertEqual(service.request("k", "a").token, 2)

    def test_semaphore_holders_and_multi_key_grants_each_get_their_own(self) -> None:
        service = LockService(Clock())
        first = service.request("s", "a", max_concurrent=3)
        second = service.request("s", "b", max_concurrent=3)
        grants = service.request_many(["m", "n", "m"], "c")
        self.assertEqual([g.token for g in (first, second, *grants)], [1, 2, 3, 4])
        self.assertEqual([g.key for g in grants], ["m", "n"])


class TokenMarkTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = short_temp_dir(self)
        self.mark = TokenMark(self.directory)

    def test_absent_is_zero(self) -> None:
        self.assertEqual(self.mark.read(), 0)

    def test_interfaces(self) -> None:
        """The file is a durable mark, and the service keeping it is the lock service's token mark."""
        self.assertTrue(verifyObject(IDurableMark, self.mark))
        self.assertTrue(verifyObject(ITokenMark, TokenMarkService(self.mark, LockService(Clock()), Clock())))

    def test_written_and_read(self) -> None:
        self.mark.write(12345678901234567)
        self.assertEqual(self.mark.read(), 12345678901234567)
        self.assertEqual(os.listdir(self.directory), [MARK_FILE])

    def test_not_a_mark(self) -> None:
        with open(os.path.join(self.directory, MARK_FILE), "w") as file:
            file.write("garbage\n")
        self.assertRaises(ValueError, self.mark.read)
        self.assertRaises(usage.UsageError, parse, "--state-dir", self.directory)

    def test_state_dir_must_be_a_writable_directory(self) -> None:
        self.assertRaises(usage.UsageError, parse, "--state-dir", os.path.join(self.directory, "absent"))
        self.assertEqual(parse("--state-dir", self.directory)["state-dir"], self.directory)

    def test_reserved_ahead_of_the_clock_and_renewed_every_few_seconds(self) -> None:
        clock = Clock()
        clock.advance(1000)
        service = LockService(clock, first_token=self.mark.read())
        keeper = TokenMarkService(self.mark, service, clock)
        keeper.startService()
        self.assertEqual(self.mark.read(), 1000 * 10**6 + AHEAD)
        marks = []
        for _ in range(int(60 / EVERY)):
            clock.advance(EVERY)
            now = int(clock.seconds() * 1e6)
            mark = self.mark.read()
            # never more than AHEAD ahead, never less than RENEW_BELOW less a check
            self.assertLessEqual(mark, now + AHEAD)
            self.assertGreaterEqual(mark, now + RENEW_BELOW - EVERY * 1e6)
            self.assertEqual(service.token_check, mark - ROOM // 2)
            marks.append(mark)
            token = service.request(f"k{now}", "a", expires=0).token
            self.assertEqual(token, now)
        written = len(set(marks))
        # written at the start, then every AHEAD - RENEW_BELOW seconds plus
        # a check (4 s), not at every check
        self.assertEqual(written, 1 + 60 * 10**6 // (AHEAD - RENEW_BELOW + int(EVERY * 1e6)))
        keeper.stopService()
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_restarts_do_not_add_up(self) -> None:
        """Twenty restarts in quick succession: each first token above every earlier one, within AHEAD of the clock."""
        clock = Clock()
        clock.advance(1000)
        tokens: list = []
        for _ in range(20):
            mark = TokenMark(self.directory)
            service = LockService(clock, first_token=mark.read())
            keeper = TokenMarkService(mark, service, clock)
            keeper.startService()
            clock.advance(0.001)
            token = service.request("k", "a").token
            self.assertGreater(token, max(tokens, default=0))
            self.assertLessEqual(token - clock.seconds() * 1e6, AHEAD)
            tokens.append(token)
            service.request("burst", "a", max_concurrent=1000)
            clock.advance(0.2)
            keeper.stopService()
            self.assertGreaterEqual(mark.read(), service.last_token)
        # The mark only ever held AHEAD of the clock that wrote it.
        self.assertLessEqual(TokenMark(self.directory).read(), clock.seconds() * 1e6 + AHEAD)

    def test_a_burst_of_grants_renews_the_mark_before_passing_it(self) -> None:
        """Tokens faster than the clock (it stands still here): the file is written again before any passes it."""
        clock = Clock()
        clock.advance(1000)
        service = LockService(clock, first_token=self.mark.read())
        keeper = TokenMarkService(self.mark, service, clock)
        keeper.startService()
        service.last_token = self.mark.read() - ROOM // 2 - 3
        for number in range(ROOM + 10):
            token = service.request(f"k{number}", "a").token
            self.assertLessEqual(token, keeper.durable)
            if number % 1000 == 0:
                self.assertEqual(keeper.durable, self.mark.read())
        self.assertEqual(token, 1000 * 10**6 + AHEAD - ROOM // 2 - 3 + ROOM + 10)
        self.assertEqual(keeper.durable, self.mark.read())
        self.assertGreaterEqual(self.mark.read(), token + ROOM // 2)
        self.assertEqual(keeper.passed, 0)
        keeper.stopService()

    def test_a_clock_stepped_past_the_mark_is_not_followed_until_it_is_renewed(self) -> None:
        clock = Clock()
        clock.advance(1000)
        mark = DelayedMark(1000 * 10**6)
        service = LockService(clock, first_token=mark.durable)
        keeper = TokenMarkService(mark, service, clock)
        keeper.startService()
        mark.commit()
        ceiling = mark.durable
        self.assertEqual(ceiling, 1000 * 10**6 + AHEAD)
        first = service.request("a", "a").token
        # The clock steps an hour forward; the renewal is not durable yet.
        clock.advance(3600)
        self.assertEqual(len(mark.pending), 1)
        tokens = [service.request(f"k{n}", "a").token for n in range(5)]
        self.assertEqual(tokens, [first + n for n in range(1, 6)])
        self.assertTrue(all(token <= ceiling for token in tokens))
        # Once it is, tokens follow the clock again.
        mark.commit()
        self.assertEqual(mark.durable, int(clock.seconds() * 1e6) + AHEAD)
        self.assertEqual(service.request("later", "a").token, int(clock.seconds() * 1e6))
        self.assertEqual(mark.passed_tokens, [])
        keeper.stopService()

    def test_tokens_that_use_up_the_room_before_the_renewal_lands_are_reported(self) -> None:
        """The cluster's mark steps the leader down then (L{JournalMark.passed}); the keeper reports it."""
        clock = Clock()
        clock.advance(1000)
        mark = DelayedMark(1000 * 10**6)
        service = LockService(clock, first_token=mark.durable)
        keeper = TokenMarkService(mark, service, clock)
        keeper.startService()
        mark.commit()
        service.last_token = mark.durable - ROOM // 2
        tokens = [service.request(f"k{n}", "a").token for n in range(ROOM // 2)]
        # a renewal was asked for at once, once and only once
        self.assertEqual(len(mark.pending), 1)
        self.assertEqual(mark.pending[0][0], mark.durable - ROOM // 2 + 1 + ROOM)
        self.assertEqual(tokens[-1], mark.durable)
        self.assertEqual(mark.passed_tokens, [])
        self.assertEqual(keeper.passed, 0)
        over = service.request("over", "a").token
        self.assertEqual(mark.passed_tokens, [over])
        self.assertEqual(over, mark.durable + 1)
        self.assertEqual(keeper.passed, 1)
        keeper.stopService()

    def test_a_mark_that_cannot_be_written_leaves_tokens_following_the_clock_and_grants_writing_nothing(self) -> None:
        """
        A full disk: logged once; no grant tries the write again (only the
        periodic check does, once per check), and tokens follow the clock
        (above the mark read at start); once a write succeeds the mark is
        above every token given and checked again.
        """
        clock = Clock()
        clock.advance(1000)
        self.mark.write(1000 * 10**6 + 5 * 10**6)
        mark = FailingMark(self.directory)
        service = LockService(clock, first_token=mark.read())
        keeper = TokenMarkService(mark, service, clock)
        logged: list = []
        keeper.log = Logger(observer=logged.append)  # type: ignore[misc]
        keeper.startService()
        self.addCleanup(keeper.stopService)
        self.assertEqual(mark.attempts, 1)
        self.assertTrue(keeper.failing)
        tokens = []
        for second in range(1, 31):
            clock.advance(1)
            now = int(clock.seconds() * 1e6)
            for number in range(3):
                tokens.append(service.request(f"k{second}-{number}", "a").token)
            if now > 1005 * 10**6:
                # past the mark on disk, the clock's, one more each within a microsecond
                self.assertEqual(tokens[-3:], [now, now + 1, now + 2])
        # (above the mark read at start, one more each, until the clock passes it)
        self.assertEqual(tokens[:3], [1005 * 10**6 + 1, 1005 * 10**6 + 2, 1005 * 10**6 + 3])
        self.assertEqual(tokens, sorted(set(tokens)))
        self.assertEqual(mark.attempts, 1 + 30)  # the start, then one per check
        self.assertEqual(keeper.passed, 0)
        self.assertEqual(mark.read(), 1005 * 10**6)
        errors = [event for event in logged if event["log_level"] == LogLevel.error]
        self.assertEqual(len(errors), 1)
        self.assertIn("No space left on device", formatEvent(errors[0]))
        self.assertIn("follow the clock", formatEvent(errors[0]))
        # The disk has room again: the next check writes the mark, above every token given.
        mark.broken = False
        clock.advance(EVERY)
        self.assertFalse(keeper.failing)
        self.assertEqual(mark.read(), int(clock.seconds() * 1e6) + AHEAD)
        self.assertGreater(mark.read(), max(tokens))
        self.assertEqual(service.token_check, mark.read() - ROOM // 2)
        self.assertEqual(service.request("again", "a").token, int(clock.seconds() * 1e6))
        self.assertEqual(mark.attempts, 1 + 30 + 1)
        self.assertIn("wrote", formatEvent(logged[-1]))

    def test_a_mark_that_fails_on_a_grant_is_tried_again_only_by_the_check(self) -> None:
        """The write a grant needs fails: that grant's token follows the clock, and the next grants write nothing."""
        clock = Clock()
        clock.advance(1000)
        mark = FailingMark(self.directory)
        mark.broken = False
        service = LockService(clock, first_token=mark.read())
        keeper = TokenMarkService(mark, service, clock)
        keeper.log = Logger(observer=lambda event: None)  # type: ignore[misc]
        keeper.startService()
        self.addCleanup(keeper.stopService)
        self.assertEqual(mark.attempts, 1)
        mark.broken = True
        # The clock steps past the mark: the grant's renewal fails.
        clock.rightNow += 3600
        now = int(clock.seconds() * 1e6)
        self.assertEqual([service.request(f"k{n}", "a").token for n in range(100)], [now + n for n in range(100)])
        self.assertEqual(mark.attempts, 2)
        self.assertEqual(keeper.passed, 0)

    def test_build_server_starts_above_the_mark(self) -> None:
        self.mark.write(4 * 10**18)
        clock = Clock()
        server = build_server(clock, ServerSettings(ports=[], state_dir=self.directory))
        server.startService()
        # (the clock is far behind this mark: tokens run ahead of it by one each)
        self.assertEqual(self.mark.read(), 4 * 10**18 + ROOM)
        self.assertEqual(server.locks.request("k", "a").token, 4 * 10**18 + 1)
        server.stopService()
        self.assertEqual(self.mark.read(), 4 * 10**18 + ROOM)
        # Stopped, its tokens still stay below the mark (connections are
        # still being closed then, and hand locks on).
        server.locks.last_token = 4 * 10**18 + ROOM - 1
        self.assertEqual(server.locks.request("j", "a").token, 4 * 10**18 + ROOM)
        self.assertGreater(self.mark.read(), 4 * 10**18 + ROOM)


class FailingMark(TokenMark):
    """A mark file whose write fails as on a full disk, while C{broken}; counts the attempts."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.broken = True
        self.attempts = 0

    def write(self, mark: int) -> None:
        self.attempts += 1
        if self.broken:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().write(mark)


@implementer(IDurableMark)
class DelayedMark:
    """A mark that is durable only when the test says (as in etcd)."""

    path = "the test's mark"

    def __init__(self, durable: int) -> None:
        self.durable = durable
        self.pending: list = []
        self.passed_tokens: list = []

    def write(self, mark: int) -> Deferred:
        written: Deferred = Deferred()
        self.pending.append((mark, written))
        return written

    def commit(self) -> None:
        pending, self.pending = self.pending, []
        for mark, written in pending:
            self.durable = max(self.durable, mark)
            written.callback(None)

    def passed(self, token: int) -> None:
        self.passed_tokens.append(token)
