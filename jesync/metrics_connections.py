"""
The connections of Twisted's own HTTP (the metrics endpoint's, and the
HTTP API's: no L{jesync.connections} grammar), held to the rules every
listener's are: counted in a registry (a bound, and closed when the server
stops), refused when not local in protected mode, and, when a request needs
the token, closed unless one request carries it within the auth timeout.
L{CountedFactory} wraps their factory, and refuses in HTTP (each listener
says with what body: the metrics in plain text, the API in JSON).  Given
the connection policy whose token its requests carry, a connection is also
one L{jesync.connections.policy.ConnectionPolicy.close_rotated_out} closes
when the token it was authorized with is rotated out.

This module needs no optional extra: the metrics themselves
(L{jesync.metrics}) need prometheus_client.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from twisted.internet.interfaces import IDelayedCall, IProtocolFactory, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure

from jesync.connections.policy import ConnectionPolicy, Connections, is_local
from jesync.errors import ProtectedMode


class Refusal(NamedTuple):
    """An HTTP response a connection is refused with at connect: its status line's, its type, its body."""

    status: bytes
    content_type: bytes
    body: bytes


# The metrics endpoint's refusals (plain text).
PROTECTED_REFUSAL = Refusal(b"403 Forbidden", b"text/plain", ProtectedMode.MESSAGE.encode() + b"\n")
FULL_REFUSAL = Refusal(b"503 Service Unavailable", b"text/plain", b"")


def refusal_response(refusal: Refusal) -> bytes:
    """A whole HTTP/1.1 response of C{refusal}, which closes its connection."""
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        refusal.status,
        refusal.content_type,
        len(refusal.body),
        refusal.body,
    )


def scraper_authorized(request: Any, generation: int = 0) -> None:
    """
    A request carried the token (of that C{generation}): its connection
    may stay (see L{jesync.server.metrics_auth_timeout}).
    """
    connection = request.channel.transport
    if isinstance(connection, _CountedConnection):
        connection.authorized(generation)


# Seconds a metrics connection closed at its auth deadline may take to close
# cleanly before it is aborted.
NOT_AUTHORIZED_CLOSE = 1.0


class _CountedConnection(ProtocolWrapper):
    """
    A connection of another kind (the metrics' HTTP), counted in a registry
    of its own; with the factory's C{auth_timeout}, closed unless it is
    L{authorized} in time.
    """

    _deadline: Optional[IDelayedCall] = None
    #: Whether a request of it carried an accepted token, and that token's generation.
    authenticated = False
    auth_generation = 0

    @property
    def policy(self) -> Optional[ConnectionPolicy]:
        """The policy whose token its requests carry (None: the factory was given none)."""
        policy: Optional[ConnectionPolicy] = self.factory.policy
        return policy

    def makeConnection(self, transport: Any) -> None:
        # No protocol of ours to answer in: HTTP's own refusals.
        if self.factory.protected and not is_local(transport.getPeer()):
            self._refuse(transport, self.factory.protected_refusal)
            return
        if not self.factory.connections.admit(self):
            self._refuse(transport, self.factory.full_refusal)
            return
        if self.factory.clock is not None and self.factory.auth_timeout is not None:
            self._deadline = self.factory.clock.callLater(self.factory.auth_timeout, self._not_authorized)
        super().makeConnection(transport)

    def authorized(self, generation: int = 0) -> None:
        """It completed a request with the token (of C{generation}): no deadline any more."""
        self.authenticated = True
        self.auth_generation = generation
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def token_rotated_out(self) -> None:
        """The token it was authorized with is no longer accepted: closed, as at the auth deadline."""
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None
        self._not_authorized()

    def _not_authorized(self) -> None:
        """
        Closed: gracefully (a FIN after what was written, so that a health
        check's keep-alive connection between its requests is not reset),
        and aborted if still open L{NOT_AUTHORIZED_CLOSE} seconds later (a
        client that does not read, or a response still being sent).
        """
        transport: Any = self.transport  # (TCP's, UNIX's or TLS's: each can abort)
        transport.loseConnection()
        self._deadline = self.factory.clock.callLater(NOT_AUTHORIZED_CLOSE, transport.abortConnection)

    def _refuse(self, transport: Any, refusal: Refusal) -> None:
        transport.write(refusal_response(refusal))
        transport.loseConnection()
        self.refused = True

    def close(self) -> None:
        self.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if getattr(self, "refused", False):
            return
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None
        self.factory.connections.remove(self)
        super().connectionLost(reason)


class CountedFactory(WrappingFactory):
    """
    Counts the connections of C{factory} in C{connections} (its limit, and
    closing them at shutdown); C{protected}: refuses clients that are not
    local, as every listener does in protected mode (with
    C{protected_refusal}; over the registry's limit: C{full_refusal});
    C{auth_timeout}: closes a connection not authorized
    (L{scraper_authorized}) within that many seconds of C{clock}; C{policy}:
    the connection policy whose token its requests carry (its connections
    are closed when the token they were authorized with is rotated out).
    """

    protocol = _CountedConnection
    noisy = False

    def __init__(
        self,
        factory: IProtocolFactory,
        connections: Connections,
        protected: bool = False,
        auth_timeout: Optional[float] = None,
        clock: Optional[IReactorTime] = None,
        policy: Optional[ConnectionPolicy] = None,
        protected_refusal: Refusal = PROTECTED_REFUSAL,
        full_refusal: Refusal = FULL_REFUSAL,
    ) -> None:
        super().__init__(factory)
        self.connections = connections
        self.protected = protected
        self.policy = policy
        self.protected_refusal = protected_refusal
        self.full_refusal = full_refusal
        self.auth_timeout = auth_timeout
        if auth_timeout is not None and clock is None:
            raise ValueError("an auth_timeout needs a clock")
        self.clock = clock

    def logPrefix(self) -> str:
        return self.wrappedFactory.logPrefix()

    def unregisterProtocol(self, protocol: Protocol) -> None:
        self.protocols.pop(protocol, None)
