"""
The metrics endpoint's connections, held to the rules every listener's
are: counted in a registry (a bound, and closed when the server stops),
refused when not local in protected mode, and, when a scrape needs the
token, aborted unless one request carries it within the auth timeout.
The metrics' HTTP is Twisted's own (no L{jesync.connections} grammar), so
L{CountedFactory} wraps its factory, and refuses in HTTP.

This module needs no optional extra: the metrics themselves
(L{jesync.metrics}) need prometheus_client.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet.interfaces import IDelayedCall, IProtocolFactory, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure

from jesync.connections.policy import Connections, is_local
from jesync.errors import ProtectedMode


def scraper_authorized(request: Any) -> None:
    """A metrics request carried the token: its connection may stay (see L{jesync.server.metrics_auth_timeout})."""
    connection = request.channel.transport
    if isinstance(connection, _CountedConnection):
        connection.authorized()


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

    def makeConnection(self, transport: Any) -> None:
        # No protocol of ours to answer in: HTTP's own refusals.
        if self.factory.protected and not is_local(transport.getPeer()):
            body = ProtectedMode.MESSAGE.encode() + b"\n"
            self._refuse(transport, b"403 Forbidden", body)
            return
        if not self.factory.connections.admit(self):
            self._refuse(transport, b"503 Service Unavailable", b"")
            return
        if self.factory.clock is not None and self.factory.auth_timeout is not None:
            self._deadline = self.factory.clock.callLater(self.factory.auth_timeout, self._not_authorized)
        super().makeConnection(transport)

    def authorized(self) -> None:
        """It completed a request with the token: no deadline any more."""
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

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

    def _refuse(self, transport: Any, status: bytes, body: bytes) -> None:
        transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, len(body), body)
        )
        transport.loseConnection()
        self.refused = True

    def close(self) -> None:
        self.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if getattr(self, "refused", False):
            return
        self.authorized()  # (cancels the deadline)
        self.factory.connections.remove(self)
        super().connectionLost(reason)


class CountedFactory(WrappingFactory):
    """
    Counts the connections of C{factory} in C{connections} (its limit, and
    closing them at shutdown); C{protected}: refuses clients that are not
    local, as every listener does in protected mode; C{auth_timeout}: aborts
    a connection not authorized (L{scraper_authorized}) within that many
    seconds of C{clock}.
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
    ) -> None:
        super().__init__(factory)
        self.connections = connections
        self.protected = protected
        self.auth_timeout = auth_timeout
        if auth_timeout is not None and clock is None:
            raise ValueError("an auth_timeout needs a clock")
        self.clock = clock

    def logPrefix(self) -> str:
        return self.wrappedFactory.logPrefix()

    def unregisterProtocol(self, protocol: Protocol) -> None:
        self.protocols.pop(protocol, None)
