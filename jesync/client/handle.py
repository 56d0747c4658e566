"""
What every client's lock handle knows: its key (or keys), its fencing
tokens, whether it is still held, when its grant expires, and who to tell if
it is lost.  Each client adds the operations (C{release}, C{renew}) in its
own style: blocking, Twisted or asyncio.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from jesync.client.errors import LockLost
from jesync.client.wire import EXCLUSIVE, SHARED, Reply

log = logging.getLogger("jesync.client")

LostCallback = Callable[[LockLost], object]

# A renewal is sent when a third of the grant's lifetime has passed, so two
# more renewals can fail or be late before the failsafe would release it.
RENEWALS_PER_EXPIRY = 3


class LockState:
    """
    A lock granted through one connection: by C{lock()} on one key, or by
    C{lock_many()} on several (all granted together, and released, renewed
    and lost together).

    It is C{held} until C{release()} (then C{released}) or until it is lost
    (then C{lost}, with C{lost_reason} saying why): its connection dropped, a
    renewal was refused, or it had expired when it was released.  A lost lock
    stays lost; reconnecting does not bring it back.

    @ivar keys: its keys, in the order asked (one for C{lock()}).
    @ivar key: its key (a C{lock_many()} lock's first key).
    @ivar tokens: each key's fencing token, or None for a key whose grant
        came without one (from a server without fencing tokens).  The server
        gives every grant of a key a larger token than the grants before it;
        a renewal keeps the token.
    @ivar many: whether it was granted by C{lock_many()} (so it is renewed
        the same way).
    @ivar mode: C{"exclusive"} or C{"shared"} (C{lock(..., shared=True)}):
        a shared lock is held together with the key's other shared holders,
        and with no exclusive one.
    @ivar value: the value set with the grant (bytes; a str given is
        its UTF-8), which the key's C{holders()} and watchers see; None
        if none.
    """

    mode: str = EXCLUSIVE
    value: Optional[bytes] = None

    def __init__(
        self,
        reply: Reply,
        server: str,
        max_concurrent: int,
        expires: int,
        clock: Callable[[], float],
    ) -> None:
        """Build it from its C{GRANTED} or C{GRANTED-MANY} reply."""
        self.keys: tuple[str, ...] = reply.keys
        self.key = reply.keys[0]
        self.tokens: dict[str, Optional[int]] = dict(zip(reply.keys, reply.tokens or (None,) * len(reply.keys)))
        self.many = reply.word == "GRANTED-MANY"
        #: the server it is held on, as C{host:port} or C{unix:/path}
        self.server = server
        self.max_concurrent = max_concurrent
        #: the failsafe asked for, whole seconds; 0 if it never expires
        self.expires = expires
        self.lost_reason: Optional[LockLost] = None
        self._clock = clock
        self._state = "held"
        self._lost_callbacks: list[LostCallback] = []
        self._expires_at: Optional[float] = None
        self._granted(reply.seconds_left)

    def __repr__(self) -> str:
        keys = " ".join(repr(key) for key in self.keys)
        return f"<{type(self).__name__} {keys} on {self.server} {self._state}>"

    @property
    def token(self) -> Optional[int]:
        """
        The grant's fencing token: pass it along with every write the lock
        protects, so that the resource can refuse a write carrying a smaller
        token than one it has seen (from a holder that lost the lock without
        knowing).  None if the server gave none (a server without fencing
        tokens).  A lock on several keys has one per key, in C{tokens}:
        asking it for C{token} raises TypeError.
        """
        if len(self.keys) != 1:
            raise TypeError(f"a lock on {len(self.keys)} keys has a fencing token per key: see its tokens")
        return self.tokens[self.key]

    @property
    def shared(self) -> bool:
        """Whether it is held shared (a reader's lock), not exclusive."""
        return self.mode == SHARED

    @property
    def held(self) -> bool:
        return self._state == "held"

    @property
    def released(self) -> bool:
        return self._state == "released"

    @property
    def lost(self) -> bool:
        return self._state == "lost"

    @property
    def seconds_left(self) -> Optional[float]:
        """
        Seconds until the server's failsafe releases the grant (its
        C{deadline}); None if it never expires.
        """
        if self._expires_at is None:
            return None
        return max(0.0, self._expires_at - self._clock())

    @property
    def deadline(self) -> Optional[float]:
        """
        When (on the clock the handle was given: C{time.monotonic}, the
        asyncio loop's or the reactor's) the failsafe expiry runs out unless
        the lock is renewed first; None if it never expires.  It is counted
        from when the lock (or its last renewal) was requested, not from when
        the answer arrived, so the client errs on the early side: once it
        passes, the handle is lost (its lost callbacks are called) even if
        the server, whose count started a little later, still holds it for a
        moment.  For a lock that had to wait, the grant is taken to have been
        made one round trip before its answer arrived.
        """
        return self._expires_at

    @property
    def renew_interval(self) -> Optional[float]:
        """How often automatic renewal renews, in seconds (None: never needed)."""
        return self.expires / RENEWALS_PER_EXPIRY if self.expires else None

    def add_lost_callback(self, callback: LostCallback) -> None:
        """
        Call C{callback(LockLost)} when the lock is lost (at once if it already
        is); never if it is released first.  The blocking client calls it from
        a background thread.
        """
        if self._state == "lost":
            self._call(callback)
        elif self._state == "held":
            self._lost_callbacks.append(callback)

    # -- for the clients -------------------------------------------------

    def _granted(self, seconds_left: Optional[int], age: float = 0.0) -> None:
        """
        A GRANTED reply (the grant or a renewal) arrived; the grant was made
        at most C{age} seconds ago (when the request was sent).
        """
        if not seconds_left:
            self._expires_at = None
            return
        lifetime = min(seconds_left, self.expires) if self.expires else seconds_left
        self._expires_at = self._clock() - age + lifetime

    def _server_says_left(self, ms_left: int, age: float) -> None:
        """C{owned} answered C{OWNED ms_left} (asked C{age} seconds ago): never a later deadline than the server's."""
        if ms_left >= 0:
            deadline = self._clock() - age + ms_left / 1000
            if self._expires_at is None or deadline < self._expires_at:
                self._expires_at = deadline

    def _overdue(self) -> bool:
        """Held, with its deadline passed."""
        return self._state == "held" and self._expires_at is not None and self._clock() >= self._expires_at

    def _mark_released(self) -> bool:
        """Held -> released; False if it was not held."""
        if self._state != "held":
            return False
        self._state = "released"
        self._lost_callbacks.clear()
        self._stop_renewing()
        return True

    def _release_failed(self, reason: str) -> None:
        """
        The release found the lock already gone (C{NOT_RELEASED}: it had
        expired) or could not be confirmed (the connection dropped): it was
        lost before it was released.  Its lost callbacks are not called.
        """
        self._state = "lost"
        self.lost_reason = self._lost(reason)

    def _lose(self, reason: str) -> bool:
        """Held -> lost; False if it was not held.  Call L{_notify_lost} afterwards."""
        if self._state != "held":
            return False
        self._state = "lost"
        self.lost_reason = self._lost(reason)
        self._stop_renewing()
        return True

    def _stop_renewing(self) -> None:
        """Stop automatic renewal, if any (each client renews in its own way)."""

    def _notify_lost(self) -> None:
        callbacks, self._lost_callbacks = self._lost_callbacks, []
        for callback in callbacks:
            self._call(callback)

    def _call(self, callback: LostCallback) -> None:
        assert self.lost_reason is not None
        try:
            callback(self.lost_reason)
        except Exception:
            log.exception("a lost-lock callback of %r failed", self)

    def _error_leaving(self, released: bool, body_raised: bool) -> Optional[LockLost]:
        """
        What a C{with} block's exit raises: a L{LockLost} if the lock turned
        out to have been lost while the block ran, unless the block is already
        raising an exception of its own.
        """
        if released or body_raised:
            return None
        return self.lost_reason or self._lost("it was not held when released")

    def _lost(self, reason: str) -> LockLost:
        """The L{LockLost} for this lock."""
        return LockLost(self.key, reason, self.keys)
