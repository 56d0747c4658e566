"""
What every connection of a server is held to, whichever protocol it speaks:
the registry that enforces max-connections and closes them all on shutdown,
the policy (limits, timeouts, keepalive, authentication), TCP keepalive, and
how a peer is named in the log.

A token rotated out stops being a credential everywhere at the end of its
grace period: a connection that authenticated with it (and not since with
the new one) is closed then (L{ConnectionPolicy.close_rotated_out}), as a
new connection that offers it is refused.  Otherwise a client that stole the
old token, or a process that should have been cut off with it, would keep
its connections, and what they hold, for as long as it likes.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Protocol, cast

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import Interface

from jesync.connections.listings import ListingBudget

if TYPE_CHECKING:
    from twisted.internet.interfaces import IConsumer, IPushProducer, ITCPTransport

    from zope.interface import Attribute

    class IStreamTransport(ITCPTransport, IConsumer, IPushProducer):
        """
        For type checking only: what a connection uses of its transport.
        TCP's, UNIX's and TLS's transports all have it, though none declares
        all of these interfaces (Twisted types C{Protocol.transport} as an
        optional L{ITransport}, which has neither C{abortConnection} nor the
        producer methods).
        """

        disconnecting = Attribute("Whether the transport is closing.")


class IDurability(Interface):
    """
    What the connection layer needs of the state that must outlive the
    server (cluster mode: the journal, L{jesync.cluster.journal}): when
    everything changed so far is durable.  Declared here, so that this
    layer names no cluster module.
    """

    def durable() -> Optional[Deferred[None]]:
        """
        None if everything changed so far is durable; otherwise a Deferred
        that fires once it is, or fails if it never will be.  Each caller
        gets a Deferred of its own, which it may cancel.
        """


class Connection(Protocol):
    """What the registry needs of a connection."""

    transport: IStreamTransport

    def close(self) -> None:
        """Close as the server stops: give back what it holds, flush what it owes, then close."""


class AuthenticatedConnection(Connection, Protocol):
    """What L{ConnectionPolicy.close_rotated_out} needs of a connection."""

    policy: ConnectionPolicy
    authenticated: bool
    auth_generation: int

    def token_rotated_out(self) -> None:
        """Close: the token this connection authenticated with is no longer accepted."""


class Connections:
    """
    The open connections of one server, across protocols.

    @param limit: the most connections open at once (None: no limit).
    """

    def __init__(self, limit: Optional[int] = None) -> None:
        self.limit = limit
        self._open: dict[Connection, None] = {}
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
        self._open[connection] = None
        return True

    def remove(self, connection: Connection) -> None:
        self._open.pop(connection, None)
        if not self._open and self._closed is not None:
            closed, self._closed = self._closed, None
            # Not at once: the last connection is still in its
            # connectionLost, and has not given everything back yet (an elock
            # session ends after its connection leaves the registry).
            assert self._clock is not None  # set with _closed, by close_all
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
        closed: Deferred[None] = Deferred()
        self._closed = closed
        for connection in self:
            connection.close()

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
        behind by before it is disconnected (L{jesync.connections.connection}
        says how they are counted).
    @ivar keepalive: seconds of silence before TCP keepalive probes start,
        and between probes (4 unanswered probes drop the connection); None
        leaves the system's keepalive settings alone.
    @ivar auth_token: if set, a connection must send C{auth <token>} first.
    @ivar previous_token: the token L{rotate} replaced, still accepted until
        C{previous_until} (clock time), so that clients can be moved to the
        new one without a restart.
    @ivar generation: how many times the token was rotated (the token a
        connection authenticated with is known by its generation).
    @ivar auth_timeout: seconds a connection may take to authenticate (when
        a token is set); None: no limit.
    @ivar idle_timeout: seconds after which a connection that has sent
        nothing, and holds and waits for nothing, is closed (a grammar may
        close it even if it holds or waits: dlock's); None: never.
    @ivar close_grace: seconds a closing connection may take to send its
        last replies before it is dropped.
    @ivar protected: protected mode: refuse every client that is neither on
        loopback nor on a UNIX socket (a server without an auth token does,
        unless told C{--protected-mode off}).
    @ivar connections: the registry, shared by every factory of the server.
    @ivar serving: cluster mode: whether this member may still answer (its
        leadership is certain); once false, nothing more is sent on any
        connection (see L{jesync.cluster.member}).  None: always.
    @ivar durability: cluster mode: the durable state (an L{IDurability}:
        the cluster's journal), which replies that depend on it wait for
        (L{jesync.connections.connection.LockConnection.write_durable}).
    @ivar listings: what the large replies being sent hold, server-wide, and
        the snapshots they share (C{--max-listing-memory};
        L{jesync.connections.listings}).
    """

    max_key_length: int = 1024
    max_unsent: int = 4 * 1024 * 1024
    keepalive: Optional[float] = 60.0
    auth_token: Optional[bytes] = None
    previous_token: Optional[bytes] = None
    previous_until: float = 0.0
    generation: int = 0
    auth_timeout: Optional[float] = 10.0
    idle_timeout: Optional[float] = None
    close_grace: float = 5.0
    protected: bool = False
    connections: Connections = field(default_factory=Connections)
    serving: Optional[Callable[[], bool]] = None
    durability: Optional[IDurability] = None
    listings: ListingBudget = field(default_factory=ListingBudget)

    def accepts(self, token: Optional[bytes], now: float) -> bool:
        """
        Whether C{token} authenticates a client at clock time C{now}: the
        token, or the previous one during its grace period (compared in
        constant time); anything when the server has no token.
        """
        return self.generation_of(token, now) is not None

    def generation_of(self, token: Optional[bytes], now: float) -> Optional[int]:
        """
        The generation of the server's token that C{token} is at clock time
        C{now}: L{generation} for the token, one less for the previous one
        during its grace period (both compared in constant time, whichever
        matches); None if neither.  Without a token: L{generation}.
        """
        if self.auth_token is None:
            return self.generation
        if token is None:
            return None
        current = hmac.compare_digest(token, self.auth_token)
        previous = self.previous_token is not None and now < self.previous_until
        if previous and hmac.compare_digest(token, self.previous_token or b""):
            return self.generation - 1
        return self.generation if current else None

    def still_accepted(self, generation: int, now: float) -> bool:
        """Whether the token of C{generation} is accepted at clock time C{now}."""
        return generation == self.generation or (generation == self.generation - 1 and now < self.previous_until)

    def rotate(self, token: bytes, now: float, grace: float) -> bool:
        """
        Take C{token} as the server's token (the token file was read again);
        the one it replaces is still accepted for C{grace} seconds (then
        L{close_rotated_out} is due).  False (nothing changes) if it is the
        same token.
        """
        if self.auth_token is None or hmac.compare_digest(token, self.auth_token):
            return False
        self.previous_token, self.previous_until = self.auth_token, now + grace
        self.auth_token = token
        self.generation += 1
        return True

    def copy_to(self, policy: ConnectionPolicy) -> None:
        """Give C{policy} this one's tokens: the current, the previous and its grace, the generation."""
        policy.auth_token, policy.previous_token = self.auth_token, self.previous_token
        policy.previous_until, policy.generation = self.previous_until, self.generation

    def close_rotated_out(self, now: float) -> int:
        """
        Close every connection of this policy that authenticated with a
        token no longer accepted at clock time C{now} (and not since with
        one that is): the end of a rotation's grace period.  Returns how
        many.
        """
        closing = []
        for connection in self.connections:
            if getattr(connection, "policy", None) is not self:
                continue  # (another policy's: the admin listener's, or not a lock connection)
            authenticated = cast(AuthenticatedConnection, connection)
            if authenticated.authenticated and not self.still_accepted(authenticated.auth_generation, now):
                closing.append(authenticated)
        for authenticated in closing:
            authenticated.token_rotated_out()
        return len(closing)


def read_token_file(path: str) -> bytes:
    """
    The token in the file C{path}: its first line, without surrounding
    whitespace.

    @raise OSError: the file cannot be read.
    @raise ValueError: it does not hold one token without spaces (the
        message never shows the file's contents).
    """
    with open(path, "rb") as file:
        token = file.readline().strip()
    if not token or len(token.split()) != 1:
        raise ValueError(f"{path} must hold one token, without spaces")
    return token


KEEPALIVE_PROBES = 4


def tune_tcp(transport: object, idle: Optional[float]) -> bool:
    """
    Set up C{transport}'s socket (found through a TLS layer too): no Nagle
    delay (TCP_NODELAY: a reply written on its own, such as a wait granted
    or a reply that waited for etcd, goes out at once rather than after the
    client's delayed ACK of the one before, up to 40 ms later), and TCP
    keepalive probing after C{idle} seconds of silence.  Returns False for a
    transport that is not TCP (a UNIX socket).
    """
    handle = socket_of(transport)
    if handle is None or handle.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    handle.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if idle is not None and hasattr(socket, "TCP_KEEPIDLE"):
        seconds = max(1, int(idle))
        handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
        handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds)
        handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    return True


def socket_of(transport: object) -> Optional[socket.socket]:
    """The socket under C{transport} (found through a TLS layer too), or None (not a socket transport)."""
    while transport is not None:
        get_handle = getattr(transport, "getHandle", None)
        handle = get_handle() if get_handle is not None else None
        if isinstance(handle, socket.socket):
            return handle
        transport = getattr(transport, "transport", None)
    return None


def is_local(address: object) -> bool:
    """Whether a peer is on this machine: a UNIX socket, or a loopback address (IPv4, IPv6, or IPv4 in IPv6)."""
    if isinstance(address, UNIXAddress):
        return True
    if not isinstance(address, (IPv4Address, IPv6Address)):
        return False
    try:
        ip = ipaddress.ip_address(address.host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def describe_peer(address: object) -> str:
    """A short, log-friendly name for a connection's remote end."""
    if isinstance(address, (IPv4Address, IPv6Address)):
        host = f"[{address.host}]" if isinstance(address, IPv6Address) else address.host
        return f"{host}:{address.port}"
    if isinstance(address, UNIXAddress):
        name = address.name.decode(errors="backslashreplace") if isinstance(address.name, bytes) else address.name
        return f"unix:{name or ''}"
    return str(address)
