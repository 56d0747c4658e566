"""
What every line protocol of the lock server shares: reading lines, refusing
over-long ones, pausing a reader that does not read its replies, logging
connections, and giving everything back when a connection goes.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.logger import Logger
from twisted.protocols.basic import LineReceiver
from zope.interface import implementer

from jesync.interfaces import ILockService


def describe_peer(address: object) -> str:
    """A short, log-friendly name for a connection's remote end."""
    if isinstance(address, (IPv4Address, IPv6Address)):
        host = f"[{address.host}]" if isinstance(address, IPv6Address) else address.host
        return f"{host}:{address.port}"
    if isinstance(address, UNIXAddress):
        name = address.name.decode(errors="backslashreplace") if isinstance(address.name, bytes) else address.name
        return f"unix:{name or ''}"
    return str(address)


@implementer(IHalfCloseableProtocol)
class LockLineReceiver(LineReceiver):
    """
    A line protocol whose connection is an owner in a L{ILockService}.

    Subclasses implement C{lineReceived} (the line arrives without its
    terminator or a trailing carriage return) and C{lineTooLong}.  The
    factory must have C{service} and C{verbose} attributes.

    Lines are split in one pass over each chunk received (Twisted's
    C{LineReceiver} re-splits its whole buffer per line, which is quadratic
    for a client that pipelines many commands).  The connection registers
    itself as the producer of its own replies, so when more than the
    transport's buffer size (64 KiB) of replies is unsent, reading from that
    client stops until they drain: a client that never reads cannot make the
    server buffer without bound.  A client that shuts down its sending side
    is answered, then closed.
    """

    delimiter = b"\n"
    MAX_LENGTH = 8192

    log = Logger()
    service: ILockService
    peer = "?"

    def connectionMade(self) -> None:
        self.service = self.factory.service
        self.verbose = self.factory.verbose
        self.peer = describe_peer(self.transport.getPeer())
        self.transport.registerProducer(self, True)
        self.log.info("{peer} connected", peer=self.peer)

    def connectionLost(self, reason: object = None) -> None:
        self.service.release_all(self)
        self.log.info("{peer} disconnected", peer=self.peer)

    def readConnectionLost(self) -> None:
        """
        The client has sent all it will (it shut down its side, as C{nc -N}
        does): let the replies already written reach it, then close.
        """
        self.close()

    def writeConnectionLost(self) -> None:
        """Never asked for: the server closes both directions at once."""

    def dataReceived(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        start = 0
        transport = self.transport
        while not self.paused and not transport.disconnecting:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > self.MAX_LENGTH:
                self._buffer = b""
                self.lineTooLong()
                return
            self.lineReceived(line)
        rest = buffer[start:]
        # While paused, the rest may hold whole lines not yet read: it is only
        # one line's beginning once reading goes on (resumeProducing).
        if len(rest) > self.MAX_LENGTH + 1 and not self.paused and not transport.disconnecting:
            self._buffer = b""
            self.lineTooLong()
            return
        self._buffer = rest

    def lineTooLong(self) -> None:
        """A line longer than C{MAX_LENGTH} arrived: answer and close."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection, giving back its locks now rather than when the close completes."""
        self.service.release_all(self)
        self.transport.loseConnection()
