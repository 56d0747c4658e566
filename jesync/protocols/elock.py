"""
The elock wire protocol: mutexes owned by sessions that survive a reconnect.
Its grammar, served by L{ELockFactory}.

Every reply is C{<status> <text>\\r\\n}.  A connection's locks belong to its
session (L{jesync.sessions}), which it gets with its first command that needs
one, or takes over by id with C{conn_id <id>}.  elock's clients send one
request at a time, so the grammar is ordered: a C{lock} that waits holds
back the replies to any commands pipelined behind it.

Locks are mutexes in the shared L{ILockService} (C{max_concurrent} 1, no
expiry), so they exclude JESync clients asking for the same key, and the
reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from jesync.connections.connection import LockServerFactory
from jesync.connections.grammar import CommandGrammar
from jesync.connections.policy import ConnectionPolicy
from jesync.errors import AlreadyWaiting, LockTimeout
from jesync.interfaces import IGrant, ILockService
from jesync.sessions import DEFAULT_MAX_GRACE_MS, DEFAULT_MAX_SESSIONS, Session, SessionTable
from jesync.wire import RELEASED, BadRequest, check_key_field, no_arguments, only_argument, parse_integer

if TYPE_CHECKING:
    from jesync.protocols.dlock import DlockFactory

# A client-chosen session id may be at most this long.
MAX_SESSION_ID = 256

# Bytes elock prints as themselves inside a quoted string (Erlang's ~p, in
# its latin1 mode), and the ones it prints as escapes.
_PRINTABLE = frozenset(range(32, 127)) | frozenset(range(160, 256))
_ESCAPES = {8: b"\\b", 9: b"\\t", 11: b"\\v", 12: b"\\f", 13: b"\\r", 27: b"\\e", 34: b'\\"', 92: b"\\\\"}


def quote_word(word: bytes) -> bytes:
    """
    A command word as elock's C{400 Unknown command: ~p} shows it: a quoted
    string with C{"} and C{\\} escaped (and C{\\t}, C{\\r}, ...), or, if it
    holds a byte that is neither printable nor one of those, a list of its
    byte values (C{[97,1,98]}).
    """
    if all(byte in _PRINTABLE or byte in _ESCAPES for byte in word):
        return b'"' + b"".join(_ESCAPES.get(byte) or bytes((byte,)) for byte in word) + b'"'
    return b"[" + b",".join(b"%d" % byte for byte in word) + b"]"


class ELockProtocol(CommandGrammar):
    """The elock grammar: one connection, speaking for its session."""

    terminator = b"\r\n"
    ordered = True
    # Sessions outlive a failover: in cluster mode a reply is sent once the
    # session's keys are in etcd (L{jesync.cluster.journal}).
    durable_replies = True
    session: Optional[Session] = None
    _quitting = False
    # Whether "200 Acquired" carries the grant's fencing token (`fencing on`).
    fencing = False

    def unknown_command(self, word: bytes) -> bytes:
        return b"400 Unknown command: " + quote_word(word)

    def bad_request(self, message: str) -> bytes:
        return b"400 " + message.encode()

    def limit_reached(self, message: str) -> bytes:
        return b"503 " + message.encode()

    def auth_accepted(self) -> bytes:
        return b"200 OK"

    def auth_refused(self) -> bytes:
        return b"403 auth failed\r\n"

    def _session(self) -> Session:
        """This connection's session, started now if it has none yet."""
        if self.session is None:
            self.session = self.connection.factory.sessions.start(self.connection)
        return self.session

    # -- the connection's lifecycle ------------------------------------------

    def holds_nothing(self) -> bool:
        return self.session is None or not self.service.owned(self.session)

    def closing(self) -> None:
        """
        The session detaches (its waits are already cancelled; its locks
        stay for its grace period), or ends: after C{quit}, when it holds
        nothing (L{Session.disconnected}), or when the server no longer
        listens (nobody could resume it).
        """
        session = self.session
        if session is None or session.connection is not self.connection:
            return
        if self._quitting or self.connection.factory.stopped:
            session.end()
        else:
            session.disconnected()

    # -- commands ---------------------------------------------------------

    def do_lock(self, args: List[bytes]) -> None:
        if not args:
            raise BadRequest("missing key")
        if len(args) > 2:
            raise BadRequest("too many arguments")
        key = self.key(args[0])
        wait = parse_integer(args[1], "wait") if len(args) > 1 else 0
        if wait < 0:
            raise BadRequest("wait must not be negative")
        if not self.connection.may_wait:
            wait = 0
        result = self.service.request(key, self._session(), 1, wait, 0)
        if isinstance(result, Deferred):
            result.addCallbacks(self._acquired, self._unavailable)
            self.connection.await_reply(result)
        else:
            self._acquired(result)

    def _acquired(self, grant: IGrant) -> None:
        self.reply(b"200 Acquired %d" % grant.token if self.fencing else b"200 Acquired")

    def _unavailable(self, failure: Failure) -> None:
        # CancelledError: the client sent FIN while it waited (once the
        # connection is closing, nothing is sent).
        if failure.check(LockTimeout, AlreadyWaiting, CancelledError):
            self.reply(b"409 Unavailable")
        else:
            self.log.failure("lock request failed", failure)

    def do_unlock(self, args: List[bytes]) -> None:
        key = self.key(only_argument(args, "key"))
        if self.session is not None and self.service.release(key, self.session):
            self.reply(b"200 Unlocked")
        elif self.service.status(key).granted:
            self.reply(b"403 not_yours")
        else:
            self.reply(b"403 not_locked")

    def do_owned(self, args: List[bytes]) -> None:
        """
        An extension: C{owned <key>}: whether this session holds the key, so a
        client that resumed its session (after a failover) can tell the locks
        it kept from those it lost.  Starts no session.
        """
        key = self.key(only_argument(args, "key"))
        grant = None if self.session is None else self.service.grant_of(key, self.session)
        if grant is None:
            self.reply(b"404 not_owned")
        else:
            self.reply(b"200 owned %d" % grant.token if self.fencing else b"200 owned")

    def do_unlock_all(self, args: List[bytes]) -> None:
        no_arguments(args)
        if self.session is not None:
            self.service.release_all(self.session, RELEASED)  # (the session stays: not lost)
        self.reply(b"200 OK")

    def do_fencing(self, args: List[bytes]) -> None:
        """An extension: C{fencing on|off}: whether C{200 Acquired} carries the grant's fencing token."""
        self.fencing = self.switch(args, "fencing")
        self.reply(b"200 fencing on" if self.fencing else b"200 fencing off")

    def do_conn_id(self, args: List[bytes]) -> None:
        if not args:
            # An id a client chose may be any bytes: echo them as sent.
            self.reply(b"200 " + self._session().id.encode("utf-8", "surrogateescape"))
            return
        wanted = check_key_field(only_argument(args, "conn id"), "conn id")
        if len(wanted) > MAX_SESSION_ID:
            raise BadRequest(f"conn id longer than {MAX_SESSION_ID} bytes")
        session = None
        if self.session is None:
            session = self.connection.factory.sessions.take(
                self.connection, wanted.decode("utf-8", "surrogateescape")
            )
        if session is None:
            self.reply(b"403 cannot set conn id")
        else:
            self.session = session
            self.reply(b"200 conn id set")

    def do_set_timeout(self, args: List[bytes]) -> None:
        """
        The session's grace period, in milliseconds: at most the server's
        C{--max-session-grace}.  A longer one is cut to it, and then the
        reply says the value in force (C{200 timeout set to <ms>}), still a
        C{200}: elock's clients check the status, and one that asked for
        more keeps working, with the server's bound.
        """
        milliseconds = parse_integer(only_argument(args, "timeout"), "timeout")
        if milliseconds < 0:
            raise BadRequest("timeout must not be negative")
        session = self._session()
        in_force = session.set_grace(milliseconds)
        changes = self.owner_changes()
        if changes is not None and self.service.owned(session):
            changes.session_changed(session)
        self.reply(b"200 timeout set" if in_force == milliseconds else b"200 timeout set to %d" % in_force)

    def do_stats(self, args: List[bytes]) -> None:
        no_arguments(args)
        factory = self.connection.factory
        lines = [
            b"200 STATS",
            b"STAT clients %d" % factory.clients,
            b"STAT locks %d" % self.service.totals().granted,
            b"STAT monitoring %d" % factory.sessions.detached_count(),
        ]
        dlock = factory.dlock
        if dlock is not None:
            lines.append(b"STAT dlock_clients %d" % dlock.clients)
            lines.extend(
                b"STAT dlock_requests_%s %d" % (kind.encode(), count) for kind, count in dlock.request_counts()
            )
            lines.append(b"STAT dlock_timeouts %d" % dlock.timeouts)
        lines.append(b"END")
        self.reply_lines(lines)

    def do_quit(self, args: List[bytes]) -> None:
        no_arguments(args)
        self._quitting = True
        self.connection.close(b"200 Hey, it was nice seeing you.\r\n")


ELockProtocol.commands = {
    b"lock": ELockProtocol.do_lock,
    b"unlock": ELockProtocol.do_unlock,
    b"unlock_all": ELockProtocol.do_unlock_all,
    b"owned": ELockProtocol.do_owned,
    b"conn_id": ELockProtocol.do_conn_id,
    b"fencing": ELockProtocol.do_fencing,
    b"set_timeout": ELockProtocol.do_set_timeout,
    b"stats": ELockProtocol.do_stats,
    b"quit": ELockProtocol.do_quit,
}


class ELockFactory(LockServerFactory):
    """
    Serves the elock protocol over a lock service; listen on it with any
    stream endpoint.  See L{LockServerFactory} for the parameters;
    C{max_sessions} bounds the sessions in their grace period, and
    C{max_grace_ms} the grace period a session may ask for (None: no
    bound).
    """

    grammar = ELockProtocol
    stopped = False
    # The server's dlock listener, whose counts `stats` shows too (None: none).
    dlock: Optional[DlockFactory] = None

    def __init__(
        self,
        service: ILockService,
        verbose: bool = False,
        policy: Optional[ConnectionPolicy] = None,
        max_sessions: Optional[int] = DEFAULT_MAX_SESSIONS,
        max_grace_ms: Optional[int] = DEFAULT_MAX_GRACE_MS,
    ) -> None:
        super().__init__(service, verbose, policy)
        self.sessions = SessionTable(service.clock, service, max_sessions, max_grace_ms)

    def startFactory(self) -> None:
        self.stopped = False

    def stopFactory(self) -> None:
        """No listener is left: nobody can resume a detached session any more."""
        self.stopped = True
        self.sessions.end_detached()
