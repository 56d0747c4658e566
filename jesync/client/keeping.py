"""
What a kept membership and a kept candidacy share (L{jesync.client.group}'s
C{keep_joined}, L{jesync.client.election}'s C{keep_campaigning}): they run
until L{Kept.stop} or until their client closes (the client keeps them and
halts them first, so that nothing joins or campaigns again behind a closed
client), and they tell the application through callbacks, one at a time,
a callback's failure logged and never theirs.  The blocking ones run in a
thread of their own (L{KeptInThread}).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional, TypeVar

from jesync.client.errors import ClientError

T = TypeVar("T")
log = logging.getLogger("jesync.client")


class Kept:
    """
    The base: C{client} is the client that keeps it (a subclass says where
    it is); C{stopped} is set by a stop or a halt.
    """

    stopped: bool

    @property
    def client(self) -> Any:
        raise NotImplementedError

    def _kept(self) -> None:
        """Be stopped by the client's close() (L{_halt})."""
        self.client._kept.add(self)

    def _halt(self) -> None:
        """
        Stop at once, without a word to the server (its client is closing:
        the server ends what it held with the connection); no callback is
        called after it.
        """
        self.stopped = True

    def _tell(self, callback: Callable[[Any], object], argument: Any) -> None:
        try:
            callback(argument)
        except Exception:
            log.exception("a callback of %r failed", self)


class KeptInThread(Kept):
    """
    A L{Kept} that runs C{_run} in a background thread of its own, woken
    (C{_wake}) by a stop, a halt or its own events, and holding C{_turn}
    while a turn is decided and told, so that a stop is never in between;
    a step that fails is retried every C{retry} seconds (L{_attempt}).
    """

    retry: float
    # (the subclass's: its loop, and how a failed step is told)
    _run: Callable[[], None]
    _failed: Callable[[Exception], None]

    def _start_thread(self, name: str) -> None:
        self._wake = threading.Event()
        self._turn = threading.RLock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._kept()
        self._thread.start()

    def _attempt(self, step: Callable[[], T]) -> Optional[T]:
        """
        C{step()}; or, if it fails with a L{ClientError}, None once the
        failure is told (C{_failed}: logged) and C{retry} seconds have
        passed or the wait is woken (not stopped meanwhile).
        """
        try:
            return step()
        except ClientError as error:
            if not self.stopped:
                self._failed(error)
                self._wake.wait(self.retry)
                self._wake.clear()
            return None

    def _halt(self) -> None:
        super()._halt()
        self._wake.set()
