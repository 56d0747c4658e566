"""
How the jesync clients fail.

A wait that runs out of time raises L{jesync.errors.LockTimeout}, the same
exception the server's own L{jesync.LockService} uses; everything else a
client raises is a L{ClientError}.
"""

from __future__ import annotations

import socket
from typing import Optional, Sequence

from jesync.errors import LockTimeout, ProtectedMode

__all__ = [
    "AccessRefused",
    "AuthFailed",
    "ClientError",
    "ConnectFailed",
    "ConnectionLost",
    "KeyBusy",
    "LockLost",
    "LockManyTimeout",
    "LockTimeout",
    "ServerError",
    "WatchFellBehind",
]


class ClientError(Exception):
    """The base of every error a jesync client raises, except L{LockTimeout}."""


class ServerError(ClientError):
    """
    The server refused a request (C{INVALID_PARAMETER: ...} or
    C{INVALID_COMMAND}); C{message} is its reply, word for word.  The
    connection stays usable.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConnectionLost(ClientError):
    """
    The connection to a server dropped, or the server stopped answering.

    Every request outstanding on the connection fails with this, and every
    lock held through it is lost: the server releases a connection's locks
    when it closes, so by the time you see this another client may hold them.
    The next request reconnects (to a cluster: to whichever member answers
    now); it never brings the old locks back, so a failover loses them.
    C{address} is the server (for a connection to a cluster, the member).
    """

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address}: {reason}")
        self.address = address
        self.reason = reason


class ConnectFailed(ConnectionLost):
    """
    Connecting to a server failed or timed out (so nothing was held through
    it).  C{retryable} is false for a failure that trying again cannot mend
    (the server's TLS certificate or name did not check out, the token file
    cannot be read); the clients retry only the others, and fail over to
    another member of a cluster only on those.  Failing to reach any member
    of a cluster raises one naming each member and why.
    """

    def __init__(self, address: str, reason: str, retryable: bool = True) -> None:
        super().__init__(address, reason)
        self.retryable = retryable


class AccessRefused(ServerError):
    """
    The server refused this client the connection and closed it, saying why
    in C{message} (its last line, word for word): protected mode (the
    server has no auth token and this client is not on its host), or, as
    L{AuthFailed}, a refused or missing auth token.  C{address} is the
    server.  Connecting again would fail the same way, so it is not retried;
    what the message says must change first (on the server or here).
    """

    def __init__(self, address: str, message: str, hint: str = "the server refused the connection") -> None:
        super().__init__(message)
        self.address = address
        self.args = (f"{address}: {hint} ({message})",)


#: How a server in protected mode begins its refusal, after the protocol's
#: error word (JESync's C{INVALID_PARAMETER: }, elock's C{503 }): the start of
#: L{jesync.errors.ProtectedMode}'s message, up to its first colon (the rest,
#: how to let the client in, may change from one server version to the next).
PROTECTED_MODE = ProtectedMode.MESSAGE[: ProtectedMode.MESSAGE.index(":") + 1]


class AuthFailed(AccessRefused):
    """
    The server refused the connection's C{auth <token>}, or needs one and
    none was sent (set C{auth_token_file}, or C{JESYNC_AUTH_TOKEN_FILE}); it
    closes the connection.  C{message} is its reply, C{address} the server.
    Connecting again with the same token would fail the same way, so it is
    not retried.
    """

    def __init__(self, address: str, message: str, sent_token: bool) -> None:
        hint = (
            "the server refused the auth token"
            if sent_token
            else "the server needs an auth token: set JESYNC_AUTH_TOKEN_FILE (or auth_token_file)"
        )
        super().__init__(address, message, hint)


class KeyBusy(ClientError):
    """
    This client already holds the key, or already has a request for it
    outstanding.  A connection is one owner on the server and holds a key at
    most once, so a second request for the same key is refused locally.
    """

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key!r}: {why}")
        self.key = key


class LockManyTimeout(LockTimeout):
    """
    A C{lock_many} wait ran out before every key could be granted (so none
    was).  C{keys} are all its keys, in the order asked; C{key} is the first.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        super().__init__(keys[0])
        self.keys = list(keys)
        self.args = (f"timed out waiting for {_names(self.keys)}",)


class LockLost(ClientError):
    """
    A lock is no longer held although its handle was not released: its
    connection dropped, its failsafe expiry released it, or a renewal was
    refused.  Another client may hold it now.

    C{key} is its key; C{keys} all its keys (a C{lock_many} lock's keys are
    lost together, and C{key} is the first of them).
    """

    def __init__(self, key: str, reason: str, keys: Optional[Sequence[str]] = None) -> None:
        self.keys = [key] if keys is None else list(keys)
        super().__init__(f"lost the {'lock' if len(self.keys) == 1 else 'locks'} on {_names(self.keys)}: {reason}")
        self.key = key
        self.reason = reason


class WatchFellBehind(ClientError):
    """
    A watch's reader fell behind: C{max_events} events were waiting to be
    read when the server reported another change.  Rather than keep every
    event in memory for ever, the watch ended there: it stopped watching on
    the server, the events queued before this are still read first, and the
    changes after them are not reported.  Read faster (or give C{watch()} a
    larger C{max_events}), or watch again and ask C{holders()} for the
    state.  C{key} and C{prefix} are the watch's.
    """

    def __init__(self, key: str, prefix: bool, max_events: int) -> None:
        what = f"prefix {key!r}" if prefix else f"key {key!r}"
        super().__init__(
            f"the watch of {what} fell behind: {max_events} events were waiting to be read;"
            " it stopped watching (watch again, and ask holders() for the state)"
        )
        self.key = key
        self.prefix = prefix
        self.max_events = max_events


def _names(keys: Sequence[str]) -> str:
    return ", ".join(repr(key) for key in keys)


def describe(error: BaseException) -> str:
    """A short reason for a connection error: its C{strerror}, or its message."""
    if isinstance(error, (socket.timeout, TimeoutError)) and not getattr(error, "strerror", None):
        return "timed out"
    return getattr(error, "strerror", None) or str(error) or type(error).__name__
