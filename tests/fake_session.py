"""
The clients' sans-I/O core on a fake clock (L{FakeSession}): for the unit
tests of the handles and of the failover rules.
"""

from __future__ import annotations

from typing import Any, Callable

from jesync.client import LockLost
from jesync.client.handle import LockState
from jesync.client.session import Session
from jesync.client.wire import Reply


class FakeSession:
    """A L{Session} on a fake clock, its sent bytes recorded and its replies scripted."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sent = b""
        self.session = Session("memory", self._send, self._make_lock, lambda: self.now)
        self.results: dict[str, Any] = {}
        self.lost: list[LockLost] = []

    def _send(self, data: bytes) -> None:
        self.sent += data

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> LockState:
        lock = LockState(reply, "memory", max_concurrent, expires, lambda: self.now)
        lock.add_lost_callback(self.lost.append)
        return lock

    def call(self, name: str, operation: Callable[..., None], *args: Any) -> None:
        def settle(value: Any) -> None:
            self.results[name] = value

        operation(*args, settle, settle)

    def reply(self, *lines: bytes) -> None:
        for line in lines:
            self.session.line_received(line)

    def take_sent(self) -> bytes:
        sent, self.sent = self.sent, b""
        return sent

    def tick(self, seconds: float) -> None:
        """Let time pass, as a client's timer would: lose the overdue locks and tell their callbacks."""
        self.now += seconds
        self.session.expire_overdue()
        for lock in self.session.take_lost():
            lock._notify_lost()
