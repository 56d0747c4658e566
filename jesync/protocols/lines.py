"""
What every line protocol of the lock server shares: reading lines, refusing
over-long ones, pausing a reader that does not read its replies, logging
connections, and giving everything back when a connection goes.
"""

from __future__ import annotations

import hmac
import re
from typing import Callable, ClassVar

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.logger import Logger
from twisted.protocols.basic import LineReceiver
from zope.interface import implementer

from jesync.errors import LimitReached
from jesync.interfaces import ILockService
from jesync.keys import decode_key
from jesync.protocols.connections import ConnectionPolicy, enable_keepalive

# JESync's clients are written with 32-bit integers in mind.
LARGEST_NUMBER = 2**31 - 1
_INTEGER = re.compile(rb"-?[0-9]+")


class BadRequest(Exception):
    """A command's arguments are wrong; the message says how."""


def parse_integer(field: bytes, name: str) -> int:
    """A decimal integer within +-LARGEST_NUMBER, or BadRequest naming the field."""
    if _INTEGER.fullmatch(field) is None:
        raise BadRequest(f"{name} is not an integer")
    if len(field) > 11 or abs(value := int(field)) > LARGEST_NUMBER:
        raise BadRequest(f"{name} is out of range")
    return value


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

    A line is split into whitespace-separated fields; the first names a
    command in C{commands}, which is called with the rest and raises
    L{BadRequest} for bad arguments.  Subclasses say how to answer an unknown
    command, a bad request and an over-long line.  The factory must have
    C{service} and C{verbose} attributes.

    Lines are split in one pass over each chunk received (Twisted's
    C{LineReceiver} re-splits its whole buffer per line, which is quadratic
    for a client that pipelines many commands).  The connection registers
    itself as the producer of its own replies, so when more than the
    transport's buffer size (64 KiB) of replies is unsent, reading from that
    client stops until they drain: a client that never reads cannot make the
    server buffer without bound, and one that falls more than the policy's
    C{max_unsent} bytes behind after that is disconnected.  A client that
    shuts down its sending side is answered, then closed.

    The factory's L{ConnectionPolicy} also limits connections and key
    lengths, turns TCP keepalive on, and may require C{auth <token>} before
    anything else.
    """

    delimiter = b"\n"
    MAX_LENGTH = 8192
    # What ends a reply line.
    terminator = b"\n"
    commands: ClassVar[dict[bytes, Callable[..., None]]] = {}
    # Bytes read ahead of a held line before reading from the socket pauses.
    HOLD_BUFFER = 65536

    holding = False
    input_ended = False
    gone = False
    refused = False
    authenticated = True
    # Reply bytes written since the client stopped reading (while paused).
    behind = 0

    log = Logger()
    service: ILockService
    policy: ConnectionPolicy
    peer = "?"

    def connectionMade(self) -> None:
        self.service = self.factory.service
        self.verbose = self.factory.verbose
        self.policy = policy = self.factory.policy
        self.peer = describe_peer(self.transport.getPeer())
        if not policy.connections.admit(self):
            self.refused = True
            self.log.info("{peer} refused: max-connections", peer=self.peer)
            self.limit_reached(str(LimitReached("max-connections", policy.connections.limit)))
            self.transport.loseConnection()
            return
        self.authenticated = policy.auth_token is None
        enable_keepalive(self.transport, policy.keepalive)
        self.transport.registerProducer(self, True)
        self.log.info("{peer} connected", peer=self.peer)

    def connectionLost(self, reason: object = None) -> None:
        self.gone = True
        if self.refused:
            return
        self.policy.connections.remove(self)
        self.service.release_all(self)
        self.log.info("{peer} disconnected", peer=self.peer)

    def readConnectionLost(self) -> None:
        """
        The client has sent all it will (it shut down its side, as C{nc -N}
        does): answer what it sent (once any held request is answered), then
        close.
        """
        self.input_ended = True
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.input_ended and not self.holding and not self.gone:
            # Answer the lines still buffered (a hold may just have ended),
            # unless one of them has to wait again.
            self.dataReceived(b"")
            if not self.holding and not self.transport.disconnecting:
                self.close()

    def writeConnectionLost(self) -> None:
        """Never asked for: the server closes both directions at once."""

    def dataReceived(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        start = 0
        transport = self.transport
        while not self.paused and not self.holding and not transport.disconnecting:
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
        self._buffer = rest
        if self.paused or self.holding:
            # The rest may hold whole lines not read yet: it is only one
            # line's beginning once reading goes on.
            if self.holding and len(rest) > self.HOLD_BUFFER:
                transport.pauseProducing()
        elif len(rest) > self.MAX_LENGTH + 1 and not transport.disconnecting:
            self._buffer = b""
            self.lineTooLong()

    def lineReceived(self, line: bytes) -> None:
        fields = line.split()
        word = fields[0] if fields else b""
        if self.verbose:
            # Never log a token: not in an auth line, nor in anything a client
            # sends before it has authenticated (a mistyped auth command).
            said = line if self.authenticated and word.lower() != b"auth" else b"(not logged before auth)"
            self.log.debug("{peer} sent {line!r}", peer=self.peer, line=said)
        if word == b"auth":
            self._authenticate(fields[1:])
            return
        if not self.authenticated:
            self._refuse_unauthenticated()
            return
        command = self.commands.get(word)
        if command is None:
            self.unknown_command(word)
            return
        try:
            command(self, fields[1:])
        except BadRequest as error:
            self.bad_request(str(error))
        except LimitReached as error:
            self.limit_reached(str(error))

    def _authenticate(self, args: list[bytes]) -> None:
        """C{auth <token>}: compared in constant time; a wrong one closes the connection."""
        token = self.policy.auth_token
        if token is None or (len(args) == 1 and hmac.compare_digest(args[0], token)):
            self.authenticated = True
            self.auth_accepted()
        else:
            self._refuse_unauthenticated()

    def _refuse_unauthenticated(self) -> None:
        self.log.info("{peer} failed to authenticate", peer=self.peer)
        self.auth_refused()
        self.close()

    def key(self, field: bytes) -> str:
        """A key argument, within the policy's max-key-length."""
        if len(field) > self.policy.max_key_length:
            raise LimitReached("max-key-length", self.policy.max_key_length)
        return decode_key(field)

    def reply(self, line: bytes) -> None:
        """Send one line (without its terminator)."""
        if self.verbose:
            self.log.debug("{peer} answered {line!r}", peer=self.peer, line=line)
        self._write(line + self.terminator)

    def reply_lines(self, lines: list[bytes]) -> None:
        """Send several lines in one write."""
        if self.verbose:
            for line in lines:
                self.log.debug("{peer} answered {line!r}", peer=self.peer, line=line)
        terminator = self.terminator
        self._write(b"".join(line + terminator for line in lines))

    def _write(self, data: bytes) -> None:
        # Only what is written once the client has stopped reading counts (not
        # the write that finds it has, however big: a listing may be).
        paused = self.paused
        self.transport.write(data)
        if paused:
            self.behind += len(data)
            if self.behind > self.policy.max_unsent and not self.gone:
                self.log.info(
                    "{peer} dropped: not reading its replies ({behind} bytes behind)",
                    peer=self.peer,
                    behind=self.behind,
                )
                self.service.release_all(self)
                self.transport.abortConnection()

    def pauseProducing(self) -> None:
        """The client is not taking its replies: stop reading its requests."""
        # A transport calls this on every write while its buffer is full:
        # count from the first.
        if not self.paused:
            self.behind = 0
        super().pauseProducing()

    def resumeProducing(self) -> None:
        self.behind = 0
        super().resumeProducing()

    @staticmethod
    def only_argument(args: list[bytes], name: str) -> bytes:
        """The one argument of a command that takes exactly one."""
        if not args:
            raise BadRequest(f"missing {name}")
        if len(args) > 1:
            raise BadRequest("too many arguments")
        return args[0]

    @staticmethod
    def no_arguments(args: list[bytes]) -> None:
        if args:
            raise BadRequest("too many arguments")

    # -- how each protocol says it --------------------------------------

    def unknown_command(self, word: bytes) -> None:
        raise NotImplementedError

    def bad_request(self, message: str) -> None:
        raise NotImplementedError

    def limit_reached(self, message: str) -> None:
        """A request (or the connection itself) would pass a limit."""
        raise NotImplementedError

    def auth_accepted(self) -> None:
        raise NotImplementedError

    def auth_refused(self) -> None:
        """Before the connection is closed for a missing or wrong token."""
        raise NotImplementedError

    def hold(self) -> None:
        """
        Read no further lines until L{unhold}: for protocols whose clients
        expect one reply at a time, in order, while a request waits.
        """
        self.holding = True

    def unhold(self) -> None:
        """Go on with the lines that arrived while holding (on the next reactor turn)."""
        self.holding = False
        if not self.paused and not self.gone and not self.transport.disconnecting:
            self.transport.resumeProducing()
            # Not at once: this may run inside another connection's command.
            self.service.clock.callLater(0, self._read_held_lines)

    def _read_held_lines(self) -> None:
        if not self.gone:
            self.dataReceived(b"")
            self._close_if_done()

    def lineTooLong(self) -> None:
        """A line longer than C{MAX_LENGTH} arrived: answer and close."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection, giving back its locks now rather than when the close completes."""
        self.service.release_all(self)
        if not self.transport.disconnecting:
            # A transport does not close while a producer is registered (TLS
            # never starts its shutdown, TCP waits again if it had paused this
            # one).
            self.transport.unregisterProducer()
            self.transport.loseConnection()
