"""
The JESync wire protocol (JESync 0.8.1, with the changes PROTOCOL.md lists).

One command per line; every reply is one line (listings: several, then END)
and names its key.  A C{lock} that has to wait does not hold up the
connection: later commands are answered meanwhile, and the C{lock} is answered
when it is granted or times out.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure

from jesync.errors import AlreadyWaiting, LockTimeout
from jesync.interfaces import KeyStatus
from jesync.keys import encode_key
from jesync.protocols.connections import LockServerFactory
from jesync.protocols.lines import BadRequest, LockLineReceiver, parse_integer
from jesync.service import DEFAULT_EXPIRES, WAIT_FOREVER, Grant

def whole_seconds_left(grant: Grant) -> int:
    """Seconds until C{grant} expires, to the nearest second; 0 if it never does."""
    seconds_left = grant.seconds_left
    return 0 if seconds_left is None else round(seconds_left)


def describe_owner(owner: object) -> bytes:
    """One field naming a holder: a connection's peer address, or what an embedder's owner calls itself."""
    name = getattr(owner, "peer", None) or repr(owner)
    return "_".join(name.split()).encode("utf-8", "backslashreplace")


class JESyncProtocol(LockLineReceiver):
    """One JESync client connection; it is the owner of the locks it takes."""

    def unknown_command(self, word: bytes) -> None:
        self.reply(b"INVALID_COMMAND")

    def bad_request(self, message: str) -> None:
        self.reply(b"INVALID_PARAMETER: " + message.encode())

    limit_reached = bad_request

    def auth_accepted(self) -> None:
        self.reply(b"OK")

    def auth_refused(self) -> None:
        self.bad_request("auth failed")

    def lineTooLong(self) -> None:
        self.bad_request("line too long")
        self.close()

    def _reply_status(self, word: bytes, status: KeyStatus, raw_key: bytes) -> None:
        self.reply(b"%s %d %d %s" % (word, status.granted, status.waiting, raw_key))

    # -- commands ---------------------------------------------------------

    def do_lock(self, args: list[bytes]) -> None:
        if not args:
            raise BadRequest("missing key")
        if len(args) > 4:
            raise BadRequest("too many arguments")
        raw_key = args[0]
        key = self.key(raw_key)
        max_concurrent = parse_integer(args[1], "max_concurrent") if len(args) > 1 else 1
        timeout = parse_integer(args[2], "timeout") if len(args) > 2 else WAIT_FOREVER
        expires = parse_integer(args[3], "expires") if len(args) > 3 else DEFAULT_EXPIRES
        try:
            result = self.service.acquire(key, self, max_concurrent, timeout, expires)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        result.addCallbacks(self._granted, self._not_granted, (raw_key,), None, (raw_key,))

    def _granted(self, grant: Grant, raw_key: bytes) -> None:
        status = self.service.status(grant.key)
        self.reply(b"GRANTED %d %d %s %d" % (status.granted, status.waiting, raw_key, whole_seconds_left(grant)))

    def _not_granted(self, failure: Failure, raw_key: bytes) -> None:
        if failure.check(LockTimeout):
            self._reply_status(b"TIMEOUT", self.service.status(failure.value.key), raw_key)
        elif not failure.check(AlreadyWaiting, CancelledError):
            # AlreadyWaiting: the first request will be answered.
            # CancelledError: this connection has gone away.
            self.log.failure("lock request failed", failure)

    def do_release(self, args: list[bytes]) -> None:
        raw_key = self.only_argument(args, "key")
        key = self.key(raw_key)
        word = b"RELEASED" if self.service.release(key, self) else b"NOT_RELEASED"
        self._reply_status(word, self.service.status(key), raw_key)

    def do_status(self, args: list[bytes]) -> None:
        raw_key = self.only_argument(args, "key")
        self._reply_status(b"STATUS", self.service.status(self.key(raw_key)), raw_key)

    def do_holders(self, args: list[bytes]) -> None:
        """An extension: who holds a key, for how long so far, and for how long yet."""
        raw_key = self.only_argument(args, "key")
        now = self.service.clock.seconds()
        lines = [
            b"HOLDER %s %s %d %d"
            % (raw_key, describe_owner(grant.owner), int(now - grant.granted_at), whole_seconds_left(grant))
            for grant in self.service.holders(self.key(raw_key))
        ]
        lines.append(b"END")
        self.reply_lines(lines)

    def _listing(self, order: str, args: list[bytes]) -> None:
        self.no_arguments(args)
        lines = [
            b"STATUS %d %d %s" % (row.granted, row.waiting, encode_key(row.key))
            for row in self.service.listing(order)
        ]
        lines.append(b"END")
        self.reply_lines(lines)

    def do_status_by_key(self, args: list[bytes]) -> None:
        self._listing("key", args)

    def do_status_by_requests(self, args: list[bytes]) -> None:
        self._listing("requests", args)

    def do_status_by_grants(self, args: list[bytes]) -> None:
        self._listing("grants", args)

    def do_quit(self, args: list[bytes]) -> None:
        self.no_arguments(args)
        self.close()


JESyncProtocol.commands = {
    b"lock": JESyncProtocol.do_lock,
    b"release": JESyncProtocol.do_release,
    b"status": JESyncProtocol.do_status,
    b"holders": JESyncProtocol.do_holders,
    b"status-by-key": JESyncProtocol.do_status_by_key,
    b"status-by-requests": JESyncProtocol.do_status_by_requests,
    b"status-by-grants": JESyncProtocol.do_status_by_grants,
    b"quit": JESyncProtocol.do_quit,
}


class JESyncFactory(LockServerFactory):
    """
    Serves the JESync protocol over a lock service; listen on it with any
    stream endpoint.  See L{LockServerFactory} for the parameters.
    """

    protocol = JESyncProtocol
