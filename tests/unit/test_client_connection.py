"""
The clients' shared connection core (jesync.client.connection), without I/O:
its silence and deadline clocks, with a schedule (the event-loop clients) on a
fake clock and without one (the blocking client's reader).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.client.connection import ConnectionCore
from jesync.client.errors import ConnectionLost, LockLost
from jesync.client.handle import LockState
from jesync.client.wire import Reply, UnexpectedReply


class Harness:
    """A core on a twisted Clock; C{scheduled}: with the clock's timers (else none)."""

    def __init__(self, read_timeout: Optional[float] = 10.0, scheduled: bool = True) -> None:
        self.clock = Clock()
        self.sent = b""
        self.failed: list[str] = []
        self.lost: list[LockLost] = []
        self.results: dict[str, Any] = {}
        self.core = ConnectionCore(
            "memory",
            self._send,
            self._make_lock,
            self.clock.seconds,
            read_timeout,
            self._schedule if scheduled else None,
            self._fail,
        )

    def _send(self, data: bytes) -> None:
        self.sent += data

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> LockState:
        lock = LockState(reply, "memory", max_concurrent, expires, self.clock.seconds)
        lock.add_lost_callback(self.lost.append)
        return lock

    def _schedule(self, delay: float, function: Callable[[], None]) -> Callable[[], None]:
        call = self.clock.callLater(delay, function)
        return lambda: call.cancel() if call.active() else None

    def _fail(self, reason: str) -> None:
        self.failed.append(reason)
        self.core.fail(reason)
        self.core.tell_lost()

    def call(self, name: str, operation: Callable[..., None], *args: Any) -> None:
        def settle(value: Any) -> None:
            self.results[name] = value

        self.core.start(operation, *args, settle, settle)


class ScheduledTests(SynchronousTestCase):
    def test_silence_ends_the_connection(self) -> None:
        h = Harness(read_timeout=10.0)
        h.call("status", h.core.session.status, "k")
        h.clock.advance(9.9)
        self.assertEqual(h.failed, [])
        h.clock.advance(0.1)
        self.assertEqual(h.failed, ["no reply within 10 s"])
        self.assertIsInstance(h.results["status"], ConnectionLost)
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_data_restarts_the_silence(self) -> None:
        h = Harness(read_timeout=10.0)
        h.call("first", h.core.session.status, "a")
        h.call("second", h.core.session.status, "b")
        h.clock.advance(6)
        h.core.received(b"STATUS 0 0 a\r\n")
        h.clock.advance(6)
        self.assertEqual(h.failed, [])  # 12 s since the request, 6 since the last data
        h.core.received(b"STATUS 1 0 b\r\n")
        self.assertEqual(h.results["second"], ("b", 1, 0))
        h.clock.advance(60)
        self.assertEqual(h.failed, [])  # nothing owed: no silence counted
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_without_read_timeout_no_silence(self) -> None:
        h = Harness(read_timeout=None)
        h.call("status", h.core.session.status, "k")
        self.assertEqual(h.clock.getDelayedCalls(), [])
        self.assertFalse(h.core.silent())

    def test_a_held_lock_expires_on_time(self) -> None:
        h = Harness()
        h.call("lock", h.core.session.lock, "k", 1, -1, 5)
        h.core.received(b"GRANTED 1 0 k 5 7\r\n")
        lock = h.results["lock"]
        self.assertTrue(lock.held)
        h.clock.advance(4.9)
        self.assertEqual(h.lost, [])
        h.clock.advance(0.1)
        self.assertEqual(len(h.lost), 1)
        self.assertIn("failsafe expiry", str(h.lost[0]))
        self.assertEqual(h.sent.splitlines()[-1], b"release k")  # the server is told, too
        self.assertEqual(h.failed, [])

    def test_unexpected_reply_raises(self) -> None:
        h = Harness()
        self.assertRaises(UnexpectedReply, h.core.received, b"GRANTED 1 0 k 5 7\r\n")

    def test_fail_stops_the_clocks_and_loses_locks(self) -> None:
        h = Harness()
        h.call("lock", h.core.session.lock, "k", 1, -1, 5)
        h.core.received(b"GRANTED 1 0 k 5 7\r\n")
        h.call("status", h.core.session.status, "k")
        self.assertEqual(len(h.clock.getDelayedCalls()), 2)
        h.core.fail("gone")
        h.core.tell_lost()
        self.assertEqual(h.clock.getDelayedCalls(), [])
        self.assertTrue(h.core.closed)
        self.assertEqual(len(h.lost), 1)
        self.assertIn("gone", str(h.lost[0]))


class UnscheduledTests(SynchronousTestCase):
    """The blocking client's reader asks instead of being called."""

    def test_silent(self) -> None:
        h = Harness(read_timeout=2.0, scheduled=False)
        h.call("status", h.core.session.status, "k")
        self.assertEqual(h.clock.getDelayedCalls(), [])
        h.clock.advance(1.9)
        self.assertFalse(h.core.silent())
        h.clock.advance(0.1)
        self.assertTrue(h.core.silent())
        self.assertEqual(h.core.silence_reason, "no reply within 2 s")
        h.core.feed(b"STATUS 0 0 k\r\n")
        self.assertFalse(h.core.silent())

    def test_wake_in(self) -> None:
        h = Harness(scheduled=False)
        self.assertEqual(h.core.wake_in(1.0), 1.0)
        self.assertIsNone(h.core.wake_in(None))
        h.call("lock", h.core.session.lock, "k", 1, -1, 3)
        h.core.feed(b"GRANTED 1 0 k 3 7\r\n")
        h.clock.advance(2.5)
        self.assertEqual(h.core.wake_in(1.0), 0.5)
        self.assertEqual(h.core.wake_in(None), 0.5)
        h.clock.advance(1)
        self.assertEqual(h.core.wake_in(1.0), 0.0)
        self.assertIsNone(h.core.expire_overdue())
        self.assertEqual([lock.key for lock in h.core.take_lost()], ["k"])
