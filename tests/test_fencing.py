"""
Fencing tokens: strictly increasing per key, across keys, and across restarts
(L{jesync.service}'s rule and L{jesync.fencing}'s high-water mark), on a
L{Clock} and through real C{twistd jesync} processes restarted.
"""

from __future__ import annotations

import os
import time

from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from jesync.fencing import AHEAD, EVERY, MARK_FILE, TokenMark, TokenMarkService
from jesync.server import ServerSettings, build_server
from jesync.service import LockService
from tests.test_operations_twistd import LOCAL, TwistdTestCase
from tests.test_twistd import parse, short_temp_dir


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

    def test_kept_ahead_while_running_and_at_the_stop(self) -> None:
        clock = Clock()
        clock.advance(1000)
        service = LockService(clock)
        keeper = TokenMarkService(self.mark, service, clock)
        keeper.startService()
        self.assertEqual(self.mark.read(), 1000 * 10**6 + AHEAD)
        # Tokens running ahead of the clock (many grants) push the mark on.
        service.last_token = 1000 * 10**6 + AHEAD // 2 + 1
        clock.advance(EVERY)
        self.assertEqual(self.mark.read(), service.last_token + AHEAD)
        # The clock alone does too, before it could catch up with the mark.
        for _ in range(int(AHEAD / 1e6 / EVERY)):
            clock.advance(EVERY)
            self.assertGreater(self.mark.read(), clock.seconds() * 1e6 + AHEAD // 2 - EVERY * 1e6)
        service.request("k", "a", expires=0)
        written = self.mark.read()
        keeper.stopService()
        # still ahead at the stop (connections are still being closed then)
        self.assertGreaterEqual(self.mark.read(), written)
        self.assertGreater(self.mark.read(), service.last_token + AHEAD // 2)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_build_server_starts_above_the_mark(self) -> None:
        self.mark.write(4 * 10**18)
        clock = Clock()
        server = build_server(clock, ServerSettings(ports=[], state_dir=self.directory))
        self.assertEqual(server.locks.request("k", "a").token, 4 * 10**18 + 1)
        server.startService()
        self.assertEqual(self.mark.read(), 4 * 10**18 + 1 + AHEAD)
        server.stopService()
        self.assertEqual(self.mark.read(), 4 * 10**18 + 1 + AHEAD)


class RestartTests(TwistdTestCase):
    """Tokens keep increasing when C{twistd jesync} is stopped and started again."""

    @inlineCallbacks
    def granted_token(self, *args: str) -> int:
        process = self.run_server("--port", LOCAL, *args)
        client = yield self.connect((yield self.port(process, b"JESyncFactory")))
        reply = yield client.ask(b"fencing on\nlock k\n", 2)
        token = int(reply.split()[-1])
        yield self.terminate(process)
        return token

    @inlineCallbacks
    def test_without_state(self):
        first = yield self.granted_token()
        second = yield self.granted_token()
        self.assertGreater(second, first)
        self.assertLess(abs(first - time.time() * 1e6), 60e6)

    @inlineCallbacks
    def test_with_state_the_mark_wins_over_the_clock(self):
        directory = short_temp_dir(self)
        # As if an earlier run had given tokens a day ahead of this clock.
        ahead = int(time.time() * 1e6) + 86400 * 10**6
        TokenMark(directory).write(ahead)
        first = yield self.granted_token("--state-dir", directory)
        self.assertEqual(first, ahead + 1)
        self.assertGreater(TokenMark(directory).read(), first + AHEAD // 2)
        second = yield self.granted_token("--state-dir", directory)
        self.assertGreaterEqual(second, first + AHEAD)
