"""
The JESync wire protocol (JESync 0.8.1, with the changes PROTOCOL.md lists).

One command per line; every reply is one line (listings: several, then END)
and names its key.  A C{lock} that has to wait does not hold up the
connection: later commands are answered meanwhile, and the C{lock} is answered
when it is granted or times out.
"""

from __future__ import annotations

import re
from typing import Callable

from twisted.internet.defer import CancelledError
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from jesync.errors import AlreadyWaiting, LockTimeout
from jesync.interfaces import ILockService, KeyStatus
from jesync.keys import decode_key, encode_key
from jesync.protocols.lines import LockLineReceiver
from jesync.service import DEFAULT_EXPIRES, WAIT_FOREVER, Grant

# JESync's clients are written with 32-bit integers in mind.
LARGEST_NUMBER = 2**31 - 1
_INTEGER = re.compile(rb"-?[0-9]{1,10}")


class BadRequest(Exception):
    """A command's arguments are wrong; the message says how."""


def parse_integer(field: bytes, name: str) -> int:
    if _INTEGER.fullmatch(field) is None:
        raise BadRequest(f"{name} is not an integer")
    value = int(field)
    if abs(value) > LARGEST_NUMBER:
        raise BadRequest(f"{name} is out of range")
    return value


class JESyncProtocol(LockLineReceiver):
    """One JESync client connection; it is the owner of the locks it takes."""

    def lineReceived(self, line: bytes) -> None:
        if self.verbose:
            self.log.debug("{peer} sent {line!r}", peer=self.peer, line=line)
        fields = line.split()
        command = _COMMANDS.get(fields[0]) if fields else None
        if command is None:
            self._reply(b"INVALID_COMMAND")
            return
        try:
            command(self, fields[1:])
        except BadRequest as error:
            self._reply(b"INVALID_PARAMETER: " + str(error).encode())

    def lineTooLong(self) -> None:
        self._reply(b"INVALID_PARAMETER: line too long")
        self.close()

    def _reply(self, line: bytes) -> None:
        if self.verbose:
            self.log.debug("{peer} answered {line!r}", peer=self.peer, line=line)
        self.transport.write(line + b"\n")

    def _reply_status(self, word: bytes, status: KeyStatus, raw_key: bytes) -> None:
        self._reply(b"%s %d %d %s" % (word, status.granted, status.waiting, raw_key))

    # -- commands ---------------------------------------------------------

    def do_lock(self, args: list[bytes]) -> None:
        if not args:
            raise BadRequest("missing key")
        if len(args) > 4:
            raise BadRequest("too many arguments")
        raw_key = args[0]
        max_concurrent = parse_integer(args[1], "max_concurrent") if len(args) > 1 else 1
        timeout = parse_integer(args[2], "timeout") if len(args) > 2 else WAIT_FOREVER
        expires = parse_integer(args[3], "expires") if len(args) > 3 else DEFAULT_EXPIRES
        try:
            result = self.service.acquire(decode_key(raw_key), self, max_concurrent, timeout, expires)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        result.addCallbacks(self._granted, self._not_granted, (raw_key,), None, (raw_key,))

    def _granted(self, grant: Grant, raw_key: bytes) -> None:
        status = self.service.status(grant.key)
        seconds_left = grant.seconds_left
        self._reply(
            b"GRANTED %d %d %s %d"
            % (status.granted, status.waiting, raw_key, 0 if seconds_left is None else round(seconds_left))
        )

    def _not_granted(self, failure: Failure, raw_key: bytes) -> None:
        if failure.check(LockTimeout):
            self._reply_status(b"TIMEOUT", self.service.status(decode_key(raw_key)), raw_key)
        elif not failure.check(AlreadyWaiting, CancelledError):
            # AlreadyWaiting: the first request will be answered.
            # CancelledError: this connection has gone away.
            self.log.failure("lock request failed", failure)

    def do_release(self, args: list[bytes]) -> None:
        raw_key = self._only_key(args)
        key = decode_key(raw_key)
        word = b"RELEASED" if self.service.release(key, self) else b"NOT_RELEASED"
        self._reply_status(word, self.service.status(key), raw_key)

    def do_status(self, args: list[bytes]) -> None:
        raw_key = self._only_key(args)
        self._reply_status(b"STATUS", self.service.status(decode_key(raw_key)), raw_key)

    def _only_key(self, args: list[bytes]) -> bytes:
        if not args:
            raise BadRequest("missing key")
        if len(args) > 1:
            raise BadRequest("too many arguments")
        return args[0]

    def _listing(self, order: str, args: list[bytes]) -> None:
        if args:
            raise BadRequest("too many arguments")
        lines = [
            b"STATUS %d %d %s\n" % (row.granted, row.waiting, encode_key(row.key))
            for row in self.service.listing(order)
        ]
        lines.append(b"END\n")
        if self.verbose:
            for line in lines:
                self.log.debug("{peer} answered {line!r}", peer=self.peer, line=line[:-1])
        self.transport.write(b"".join(lines))

    def do_status_by_key(self, args: list[bytes]) -> None:
        self._listing("key", args)

    def do_status_by_requests(self, args: list[bytes]) -> None:
        self._listing("requests", args)

    def do_status_by_grants(self, args: list[bytes]) -> None:
        self._listing("grants", args)

    def do_quit(self, args: list[bytes]) -> None:
        if args:
            raise BadRequest("too many arguments")
        self.close()


_COMMANDS: dict[bytes, Callable[[JESyncProtocol, list[bytes]], None]] = {
    b"lock": JESyncProtocol.do_lock,
    b"release": JESyncProtocol.do_release,
    b"status": JESyncProtocol.do_status,
    b"status-by-key": JESyncProtocol.do_status_by_key,
    b"status-by-requests": JESyncProtocol.do_status_by_requests,
    b"status-by-grants": JESyncProtocol.do_status_by_grants,
    b"quit": JESyncProtocol.do_quit,
}


class JESyncFactory(Factory):
    """
    Serves the JESync protocol over a lock service; listen on it with any
    stream endpoint.

    @param service: the lock table, shared with any other protocol.
    @param verbose: log every command and reply at debug level.
    """

    protocol = JESyncProtocol
    noisy = False

    def __init__(self, service: ILockService, verbose: bool = False) -> None:
        self.service = service
        self.verbose = verbose
