"""
A server's connections, whichever protocol they speak: the registry that
enforces max-connections and closes them all on shutdown, the policy every
connection is held to, and the factory base both protocols share.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Iterator, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Factory

from jesync.interfaces import ILockService


class Connection(Protocol):
    """What the registry needs of a connection (a L{LockLineReceiver})."""

    transport: object


class Connections:
    """
    The open connections of one server, across protocols.

    @param limit: the most connections open at once (None: no limit).
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._open: set[Connection] = set()
        self._closed: Deferred[None] | None = None
        self._clock: IReactorTime | None = None

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._open))

    def admit(self, connection: Connection) -> bool:
        """Count C{connection} in, unless that would pass the limit."""
        if self.limit is not None and len(self._open) >= self.limit:
            return False
        self._open.add(connection)
        return True

    def remove(self, connection: Connection) -> None:
        self._open.discard(connection)
        if not self._open and self._closed is not None:
            closed, self._closed = self._closed, None
            # Not at once: the last connection is still in its
            # connectionLost, and has not given everything back yet (an elock
            # session ends after its connection leaves the registry).
            self._clock.callLater(0, closed.callback, None)

    def close_all(self, clock: IReactorTime, grace: float) -> Deferred[None]:
        """
        Close every connection (which gives back everything it holds);
        abort the ones still open after C{grace} seconds, whose clients
        are not taking their last replies.  Fires when all are gone (on the
        reactor turn after the last one's connectionLost).
        """
        if not self._open:
            return succeed(None)
        self._clock = clock
        self._closed = closed = Deferred()
        for connection in self:
            # A connection is the producer of its own replies, and a transport
            # does not close while its producer is registered (TLS), nor once
            # a producer it had paused is resumed when the replies drain.
            connection.transport.unregisterProducer()
            connection.transport.loseConnection()

        def abort_stragglers() -> None:
            for connection in self:
                connection.transport.abortConnection()

        stragglers = clock.callLater(grace, abort_stragglers)

        def all_closed(result: None) -> None:
            if stragglers.active():
                stragglers.cancel()
            return result

        return closed.addBoth(all_closed)


@dataclass
class ConnectionPolicy:
    """
    What every connection of a server is held to, whatever protocol it speaks.

    @ivar max_key_length: the longest key accepted, in bytes.
    @ivar max_unsent: bytes of replies a client that stopped reading may fall
        behind by (counted from when it stopped) before it is disconnected.
    @ivar keepalive: seconds of silence before TCP keepalive probes start,
        and between probes (4 unanswered probes drop the connection); None
        leaves the system's keepalive settings alone.
    @ivar auth_token: if set, a connection must send C{auth <token>} first.
    @ivar connections: the registry, shared by every factory of the server.
    """

    max_key_length: int = 1024
    max_unsent: int = 1024 * 1024
    keepalive: float | None = 60.0
    auth_token: bytes | None = None
    connections: Connections = field(default_factory=Connections)


KEEPALIVE_PROBES = 4


def enable_keepalive(transport: object, idle: float | None) -> bool:
    """
    Turn TCP keepalive on for C{transport}'s socket (found through a TLS
    layer too), probing after C{idle} seconds of silence.  Returns False for
    a transport that is not TCP (a UNIX socket).
    """
    while transport is not None:
        get_handle = getattr(transport, "getHandle", None)
        handle = get_handle() if get_handle is not None else None
        if isinstance(handle, socket.socket):
            if handle.family not in (socket.AF_INET, socket.AF_INET6):
                return False
            handle.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if idle is not None and hasattr(socket, "TCP_KEEPIDLE"):
                seconds = max(1, int(idle))
                handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
                handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds)
                handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
            return True
        transport = getattr(transport, "transport", None)
    return False


class LockServerFactory(Factory):
    """
    Serves one protocol over a lock service (shared with any other
    protocol); listen on it with any stream endpoint.

    @param service: the lock table.
    @param verbose: log every command and reply at debug level.
    @param policy: limits, keepalive and authentication (shared by every
        factory of one server, so max-connections counts them all).
    """

    noisy = False

    def __init__(
        self, service: ILockService, verbose: bool = False, policy: ConnectionPolicy | None = None
    ) -> None:
        self.service = service
        self.verbose = verbose
        self.policy = policy if policy is not None else ConnectionPolicy()
