"""
Fencing tokens that keep increasing across restarts, even if the clock does not.

The lock service gives every grant a token above every token before it,
starting from the clock (in microseconds), so a restarted server's tokens
are larger than its earlier ones as long as the clock has moved on.  A clock
set back (by hand, or a virtual machine restored from a snapshot) would break
that.  With a state directory, the server keeps a high-water mark there: a
number above every token given so far, a minute ahead of the clock (written
at the start, and again whenever the tokens or the clock come within half a
minute of it, checked every 5 seconds and at the stop); a restarted service
starts above it, so its tokens may run ahead of the clock by up to a minute
until the clock catches up.  A crash loses nothing as long as the
tokens did not run more than half a minute ahead of the clock within 5
seconds (30 million grants in 5 seconds).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from twisted.application import service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from jesync.interfaces import ILockService

#: The file in the state directory.
MARK_FILE = "fencing-token-mark"
#: How far ahead of the clock the mark is written, in microseconds.
AHEAD = 60_000_000
#: How often it is written, in seconds.
EVERY = 5.0


class TokenMark:
    """The high-water mark in C{directory}: read once, then written atomically (write, fsync, rename)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, MARK_FILE)

    def read(self) -> int:
        """The mark, or 0 if there is none yet; ValueError for a file that is not one."""
        try:
            with open(self.path, "rb") as file:
                text = file.read().strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit():
            raise ValueError(f"{self.path} does not hold a fencing token mark: {text[:40]!r}")
        return int(text)

    def write(self, mark: int) -> None:
        temporary = self.path + ".new"
        with open(temporary, "wb") as file:
            file.write(b"%d\n" % mark)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)


class TokenMarkService(service.Service):
    """
    Keeps C{mark} (a L{TokenMark}, or a cluster's L{jesync.cluster.journal.JournalMark})
    ahead of C{locks}' tokens while the server runs (a child of
    L{jesync.server.LockServer}), checking every C{every} seconds.
    """

    log = Logger()

    def __init__(self, mark: Any, locks: ILockService, clock: IReactorTime, every: Optional[float] = None) -> None:
        self.mark = mark
        self.every = EVERY if every is None else every
        self.locks = locks
        self.clock = clock
        self._loop: Optional[LoopingCall] = None
        self.written = 0

    def _ahead(self) -> int:
        return max(self.locks.last_token, int(self.clock.seconds() * 1e6)) + AHEAD

    def _write(self, mark: int) -> None:
        try:
            self.mark.write(mark)
        except OSError as error:
            self.log.error("cannot write {path}: {error}", path=self.mark.path, error=error)
        else:
            self.written = mark

    def _keep_ahead(self) -> None:
        """Write the mark again once tokens or the clock have come within half of AHEAD of it."""
        ahead = self._ahead()
        if ahead - self.written > AHEAD // 2:
            self._write(ahead)

    def startService(self) -> None:
        super().startService()
        self._write(self._ahead())
        loop = self._loop = LoopingCall(self._keep_ahead)
        loop.clock = self.clock
        loop.start(self.every, now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        # The mark stays ahead: the server is still closing its connections,
        # and hands locks on (with new tokens) while it does.
        self._keep_ahead()
