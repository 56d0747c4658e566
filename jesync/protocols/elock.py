"""
The elock wire protocol: mutexes owned by sessions that survive a reconnect.

Every reply is C{<status> <text>\\r\\n}.  A connection's locks belong to its
session (L{jesync.sessions}), which it gets with its first command that needs
one, or takes over by id with C{conn_id <id>}.  elock's clients send one
request at a time, so a C{lock} that waits holds back the replies to any
commands pipelined behind it: every reply comes in request order.

Locks are mutexes in the shared L{ILockService} (C{max_concurrent} 1, no
expiry), so they exclude JESync clients asking for the same key, and the
reverse.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from jesync.errors import AlreadyWaiting, LockTimeout
from jesync.interfaces import ILockService
from jesync.protocols.connections import ConnectionPolicy, LockServerFactory
from jesync.protocols.lines import BadRequest, LockLineReceiver, parse_integer
from jesync.service import Grant
from jesync.sessions import Session, SessionTable

# A client-chosen session id may be at most this long.
MAX_SESSION_ID = 256


class ELockProtocol(LockLineReceiver):
    """One elock client connection, speaking for its session."""

    terminator = b"\r\n"
    session: Session | None = None
    _waiting: Deferred[Grant] | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        if not self.refused:
            self.factory.clients += 1

    def connectionLost(self, reason: object = None) -> None:
        super().connectionLost(reason)
        if self.refused:
            return
        self.factory.clients -= 1
        if self._waiting is not None:
            self._waiting.cancel()
        if self.session is not None and self.session.connection is self:
            if self.factory.stopped:
                # Nobody could resume it: the server no longer listens.
                self.session.end()
            else:
                self.session.connection_lost()

    def unknown_command(self, word: bytes) -> None:
        self.reply(b'400 Unknown command: "%s"' % word)

    def bad_request(self, message: str) -> None:
        self.reply(b"400 " + message.encode())

    def limit_reached(self, message: str) -> None:
        self.reply(b"503 " + message.encode())

    def auth_accepted(self) -> None:
        self.reply(b"200 OK")

    def auth_refused(self) -> None:
        self.reply(b"403 auth failed")

    def lineTooLong(self) -> None:
        self.bad_request("line too long")
        self.close()

    def _session(self) -> Session:
        """This connection's session, started now if it has none yet."""
        if self.session is None:
            self.session = self.factory.sessions.start(self)
        return self.session

    # -- commands ---------------------------------------------------------

    def do_lock(self, args: list[bytes]) -> None:
        if not args:
            raise BadRequest("missing key")
        if len(args) > 2:
            raise BadRequest("too many arguments")
        wait = parse_integer(args[1], "wait") if len(args) > 1 else 0
        if wait < 0:
            raise BadRequest("wait must not be negative")
        result = self.service.acquire(self.key(args[0]), self._session(), 1, wait, 0)
        if result.called:
            result.addCallbacks(self._acquired, self._unavailable)
            return
        self._waiting = result
        self.hold()
        result.addCallbacks(self._acquired, self._unavailable)
        result.addBoth(self._done_waiting)

    def _acquired(self, grant: Grant) -> None:
        self.reply(b"200 Acquired")

    def _unavailable(self, failure: Failure) -> None:
        if failure.check(LockTimeout, AlreadyWaiting):
            self.reply(b"409 Unavailable")
        elif not failure.check(CancelledError):  # CancelledError: the connection is gone
            self.log.failure("lock request failed", failure)

    def _done_waiting(self, result: object) -> None:
        self._waiting = None
        self.unhold()

    def do_unlock(self, args: list[bytes]) -> None:
        key = self.key(self.only_argument(args, "key"))
        if self.session is not None and self.service.release(key, self.session):
            self.reply(b"200 Unlocked")
        elif self.service.status(key).granted:
            self.reply(b"403 not_yours")
        else:
            self.reply(b"403 not_locked")

    def do_unlock_all(self, args: list[bytes]) -> None:
        self.no_arguments(args)
        if self.session is not None:
            self.service.release_all(self.session)
        self.reply(b"200 OK")

    def do_conn_id(self, args: list[bytes]) -> None:
        if not args:
            # An id a client chose may be any bytes: echo them as sent.
            self.reply(b"200 " + self._session().id.encode("utf-8", "surrogateescape"))
            return
        wanted = self.only_argument(args, "conn id")
        if len(wanted) > MAX_SESSION_ID:
            raise BadRequest(f"conn id longer than {MAX_SESSION_ID} bytes")
        session = None
        if self.session is None:
            session = self.factory.sessions.take(self, wanted.decode("utf-8", "surrogateescape"))
        if session is None:
            self.reply(b"403 cannot set conn id")
        else:
            self.session = session
            self.reply(b"200 conn id set")

    def do_set_timeout(self, args: list[bytes]) -> None:
        milliseconds = parse_integer(self.only_argument(args, "timeout"), "timeout")
        if milliseconds < 0:
            raise BadRequest("timeout must not be negative")
        self._session().grace_ms = milliseconds
        self.reply(b"200 timeout set")

    def do_stats(self, args: list[bytes]) -> None:
        self.no_arguments(args)
        self.reply_lines(
            [
                b"200 STATS",
                b"STAT clients %d" % self.factory.clients,
                b"STAT locks %d" % self.service.totals().granted,
                b"STAT monitoring %d" % self.factory.sessions.detached_count(),
                b"END",
            ]
        )

    def do_quit(self, args: list[bytes]) -> None:
        self.no_arguments(args)
        self.reply(b"200 Hey, it was nice seeing you.")
        if self.session is not None:
            self.session.end()
        self.close()


ELockProtocol.commands = {
    b"lock": ELockProtocol.do_lock,
    b"unlock": ELockProtocol.do_unlock,
    b"unlock_all": ELockProtocol.do_unlock_all,
    b"conn_id": ELockProtocol.do_conn_id,
    b"set_timeout": ELockProtocol.do_set_timeout,
    b"stats": ELockProtocol.do_stats,
    b"quit": ELockProtocol.do_quit,
}


class ELockFactory(LockServerFactory):
    """
    Serves the elock protocol over a lock service; listen on it with any
    stream endpoint.  See L{LockServerFactory} for the parameters.
    """

    protocol = ELockProtocol

    def __init__(
        self, service: ILockService, verbose: bool = False, policy: ConnectionPolicy | None = None
    ) -> None:
        super().__init__(service, verbose, policy)
        self.sessions = SessionTable(service.clock, service)
        self.clients = 0

    stopped = False

    def startFactory(self) -> None:
        self.stopped = False

    def stopFactory(self) -> None:
        """No listener is left: nobody can resume a detached session any more."""
        self.stopped = True
        self.sessions.end_detached()
