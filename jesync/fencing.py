"""
Fencing tokens that keep increasing across restarts and takeovers, even if
the clock does not, and that stay near the clock however many there are.

The lock service gives every grant a token above every token before it,
starting from the clock (in microseconds), so a restarted server's tokens
are larger than its earlier ones as long as the clock has moved on.  A clock
set back (by hand, or a virtual machine restored from a snapshot) would break
that.  So with a state directory (a file), and in cluster mode (in etcd),
the server keeps a durable high-water mark, and its lock service never gives
a token above the mark that is durable at that moment: a restarted server,
or a new leader, starts above the mark, so its tokens are above every token
given before, even after a crash.

The mark is a I{reservation}, C{max(clock + AHEAD, last token + ROOM)}
(10 s; 100,000 tokens), renewed when the clock comes within C{RENEW_BELOW}
(7 s) of it (checked every second: a write every 4 s) or the tokens
within C{ROOM / 2} of it (checked by the grant that passes that point).  It
is never counted from the mark it replaces, so restarts and takeovers do not
add up: the mark, and so every token and a successor's first token, is at
most C{AHEAD} ahead of the clock of the server that wrote it.  Only tokens
that themselves run ahead of the clock make C{last + ROOM} the larger: a
server whose clock is behind its predecessor's or was set back, or grants
faster than one a microsecond; and a takeover within C{ROOM} (0.1 s) of the
predecessor's last renewal, which can add up to that much.

If a grant's token would pass the durable mark, the mark is renewed at
once.  With a state directory that write is synchronous (write, fsync,
rename, fsync of the directory), so no token ever passes the mark on disk.
If the file cannot be written (a full disk, say), that is logged once as an
error and the tokens are no longer checked against the mark: they follow the
clock, above the mark read at start, as they would without a state
directory, and no grant writes the file; the periodic check alone tries
again (once a second), and once a write succeeds (logged) the mark is above
every token given and checked again.  Not stopping grants for a full disk
is the choice here: the mark only guards against a clock set back.

In cluster mode the write is not durable until etcd commits it: until then,
tokens stop following the clock (each is the last one plus one, from the
room left below the mark).  If that room runs out too (the renewal, due with 6-7 s to
spare, has still not committed, and the tokens used up what was left under
the mark), the leader steps down instead of giving the next token (its
reply is never sent), and its successor starts above every token it gave.
"""

from __future__ import annotations

import os
from typing import Optional

from twisted.application import service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import Attribute, Interface, implementer

from jesync.interfaces import ITokenMark
from jesync.service import NO_TOKEN_CHECK, LockService

#: The file in the state directory.
MARK_FILE = "fencing-token-mark"
#: How far ahead of the clock the mark is reserved, in microseconds: the
#: most tokens run ahead of the clock of the server that reserved it.
AHEAD = 10_000_000
#: The mark is renewed once the clock is this close to it, in microseconds.
RENEW_BELOW = 7_000_000
#: The least room a renewal leaves above the last token (tokens, or
#: microseconds); renewed once less than half of it is left.
ROOM = 100_000
#: How often the clock is checked against the mark, in seconds.
EVERY = 1.0


def reservation(now: int, last: int) -> int:
    """The mark to write at C{now} (microseconds) after token C{last}: C{AHEAD} ahead of the clock, C{ROOM} above it."""
    return max(now + AHEAD, last + ROOM)


class IDurableMark(Interface):
    """
    Where a mark is kept durably: a file (L{TokenMark}) or, in cluster mode,
    etcd (L{jesync.cluster.journal.JournalMark}).
    """

    path = Attribute("Where the mark is kept, for the log.")
    durable = Attribute("The largest mark known durable.")

    def write(mark: int) -> Optional[Deferred[None]]:
        """Write C{mark}: None once it is durable, or a Deferred that fires when it is (OSError if it cannot be)."""

    def passed(token: int) -> None:
        """A token above the durable mark is being given."""


@implementer(IDurableMark)
class TokenMark:
    """The high-water mark in C{directory}: read once, then written atomically (write, fsync, rename, fsync)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, MARK_FILE)
        #: The mark last read or written: durable.
        self.durable = 0

    def read(self) -> int:
        """The mark, or 0 if there is none yet; ValueError for a file that is not one."""
        try:
            with open(self.path, "rb") as file:
                text = file.read().strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit():
            raise ValueError(f"{self.path} does not hold a fencing token mark: {text[:40]!r}")
        self.durable = int(text)
        return self.durable

    def write(self, mark: int) -> None:
        """
        Write C{mark}; it is durable when this returns (OSError if it could
        not be written): the file and then its directory are synced, so
        that a power loss right after cannot bring the old mark back.
        """
        temporary = self.path + ".new"
        with open(temporary, "wb") as file:
            file.write(b"%d\n" % mark)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        directory = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.durable = mark

    def passed(self, token: int) -> None:
        """A token above the durable mark is being given (the file could not be written): nothing more to do."""


@implementer(ITokenMark)
class TokenMarkService(service.Service):
    """
    Keeps C{mark} (an L{IDurableMark}: a L{TokenMark}, or a cluster's
    L{jesync.cluster.journal.JournalMark}) reserved ahead of C{locks}'
    tokens while the server runs (a child of L{jesync.server.LockServer}),
    and C{locks}' tokens at or below the durable mark: the lock service
    calls L{reached} for a token above its C{token_check}.
    """

    log = Logger()

    def __init__(
        self, mark: IDurableMark, locks: LockService, clock: IReactorTime, every: Optional[float] = None
    ) -> None:
        self.mark = mark
        self.every = EVERY if every is None else every
        self.locks = locks
        self.clock = clock
        self._loop: Optional[LoopingCall] = None
        #: The largest mark known durable; the largest one asked for.
        self.durable = 0
        self.requested = 0
        #: How many tokens were given above the durable mark.
        self.passed = 0
        #: Whether the last write failed (OSError): the lock service's
        #: tokens are then not checked against the mark.
        self.failing = False

    def _now(self) -> int:
        return int(self.clock.seconds() * 1e6)

    def _renew(self, token: Optional[int] = None) -> None:
        """Reserve the mark ahead again if the clock or the tokens (C{token}, the one being given) have come near it."""
        now, last = self._now(), self.locks.last_token if token is None else token
        if self.requested - now >= RENEW_BELOW and self.requested - last >= ROOM // 2:
            return
        mark = max(reservation(now, last), self.requested)
        try:
            written = self.mark.write(mark)
        except OSError as error:
            if not self.failing:
                self.failing = True
                self.log.error(
                    "cannot write {path} ({error}): fencing tokens follow the clock, unchecked against the mark,"
                    " until it can be written again (tried every {every} s)",
                    path=self.mark.path,
                    error=error,
                    every=self.every,
                )
            # No grant tries again (a write on the reactor thread each): the
            # periodic check does.
            self.locks.token_check = NO_TOKEN_CHECK
            return
        if self.failing:
            self.failing = False
            self.log.info("wrote {path} again: fencing tokens are checked against it again", path=self.mark.path)
        self.requested = max(self.requested, mark)
        if written is None:
            self._durable(mark)
        else:
            # (A failed write ends the cluster term: nothing more to do here.)
            written.addCallbacks(lambda _: self._durable(mark), lambda _: None)

    def _durable(self, mark: int) -> None:
        if mark > self.durable:
            self.durable = mark
            self._arm()

    def _arm(self) -> None:
        """Have the lock service call L{reached} for a token past the durable mark, or near the reserved one."""
        if not self.failing:
            self.locks.token_check = min(self.durable, self.requested - ROOM // 2)

    def reached(self, token: int) -> int:
        """
        The lock service's next token, C{token}, passed its C{token_check}:
        the token to give instead (never above the durable mark while there
        is room below it), after renewing the mark if it is due.
        """
        self._renew(token)
        if self.failing:
            # The mark cannot be written: tokens follow the clock (logged).
            return token
        last = self.locks.last_token
        if token > self.durable and last + 1 <= self.durable:
            # Tokens stop following the clock past the durable mark, while
            # there is room below it (the renewal is not durable yet).
            token = last + 1
        if token > self.durable:
            if not self.passed:
                self.log.error(
                    "fencing tokens passed the durable mark in {path} ({token} > {mark})",
                    path=self.mark.path,
                    token=token,
                    mark=self.durable,
                )
            self.passed += 1
            self.mark.passed(token)
        self._arm()
        return token

    def startService(self) -> None:
        super().startService()
        self.durable = self.requested = self.mark.durable
        self.locks.token_mark = self
        self._arm()
        self._renew()
        loop = self._loop = LoopingCall(self._renew)
        loop.clock = self.clock
        loop.start(self.every, now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        # The lock service still checks its tokens against the mark: the
        # server is still closing its connections, and hands locks on (with
        # new tokens) while it does.
        self._renew()
