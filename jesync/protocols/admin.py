"""
The operator's listener: the JESync protocol plus two commands that undo
what a hung client holds, and the listing that finds it, served by
L{AdminFactory} on the endpoints of C{--admin-port} (a UNIX socket, say,
only the operator can open).

 - C{force-release <key>}: every holder of C{key} loses it, whoever it is
   (JESync or memcached connection, elock session, dlock connection or timed
   lock), and its waiters are served as on any release.  C{FORCE-RELEASED
   <n> <key>}, C{n} the grants released.
 - C{end-session <id>}: the elock session C{id}, in its grace period after
   its connection went away, ends now, releasing its locks.
   C{SESSION-ENDED <id>}, or C{INVALID_PARAMETER: no detached session <id>}.
 - C{sessions}: every elock session, a line each, then C{END}:
   C{SESSION <id> <peer> <keys> attached <grace-ms>} (its grace period, in
   force once its connection goes) or C{SESSION <id> <peer> <keys> detached
   <ms-left>}, C{peer} the address of the connection it had last, C{keys}
   the keys it holds or waits for.  The id is the bytes its client chose (or
   the server gave), as they were sent: C{end-session} takes them back
   exactly, whatever bytes they are (elock's ids are any bytes but
   whitespace).  A session's id is what takes it over (C{conn_id <id>}), so
   only this listener shows it.  Past one piece of a stream, streamed and
   charged to the server's C{--max-listing-memory} like any listing
   (L{jesync.connections.listings}); there are at most C{--max-sessions}
   detached sessions and one attached per connection.

Everything else is the JESync protocol, authentication included: with
C{--auth-token-file}, an admin connection sends C{auth <token>} first like
any other.  Each use is logged.
"""

from __future__ import annotations

from typing import List, Optional

from jesync.connections.policy import ConnectionPolicy
from jesync.groups import GroupTable
from jesync.interfaces import ILockService
from jesync.protocols.jesync import JESyncFactory, JESyncProtocol, name_field
from jesync.sessions import Session, SessionTable
from jesync.wire import BadRequest, decode_key, encode_key, no_arguments, only_argument


class AdminProtocol(JESyncProtocol):
    """The JESync grammar with the operator's commands."""

    def do_force_release(self, args: List[bytes]) -> None:
        raw_key = only_argument(args, "key")
        key = self.key(raw_key)
        released = sum(1 for grant in self.service.holders(key) if grant.release())
        self.log.info(
            "{peer} force-released {key!r}: {released} grants", peer=self.connection.peer, key=key, released=released
        )
        self.reply(b"FORCE-RELEASED %d %s" % (released, raw_key))

    def _sessions(self) -> Optional[SessionTable]:
        factory = self.connection.factory
        assert isinstance(factory, AdminFactory)
        return factory.sessions

    def do_end_session(self, args: List[bytes]) -> None:
        raw_id = only_argument(args, "session id")
        # As elock keeps it: the bytes sent, as UTF-8 with surrogate escapes.
        session_id = decode_key(raw_id)
        sessions = self._sessions()
        shown = raw_id.decode("utf-8", "backslashreplace")
        if sessions is None or not sessions.end_one_detached(session_id):
            raise BadRequest(f"no detached session {shown}")
        self.log.info("{peer} ended session {id}", peer=self.connection.peer, id=shown)
        self.reply(b"SESSION-ENDED " + raw_id)

    def do_sessions(self, args: List[bytes]) -> None:
        no_arguments(args)
        sessions = self._sessions()
        lines = [] if sessions is None else [self._session_line(session) for session in sessions.sessions()]
        lines.append(b"END")
        self.reply_listing(lines)

    def _session_line(self, session: Session) -> bytes:
        seconds_left = session.seconds_left()
        if seconds_left is None:
            state = b"attached %d" % session.grace_ms
        else:
            state = b"detached %d" % round(seconds_left * 1000)
        return b"SESSION %s %s %d %s" % (
            encode_key(session.id),
            name_field(session.last_peer),
            self.service.owned(session),
            state,
        )


AdminProtocol.commands = {
    **JESyncProtocol.commands,
    b"force-release": AdminProtocol.do_force_release,
    b"end-session": AdminProtocol.do_end_session,
    b"sessions": AdminProtocol.do_sessions,
}


class AdminFactory(JESyncFactory):
    """
    Serves L{AdminProtocol}.

    @param sessions: the elock listener's sessions, for C{end-session}
        (None: the server serves no elock).
    @param groups: the server's groups (as L{JESyncFactory}'s).
    """

    grammar = AdminProtocol

    def __init__(
        self,
        service: ILockService,
        verbose: bool = False,
        policy: Optional[ConnectionPolicy] = None,
        sessions: Optional[SessionTable] = None,
        groups: Optional[GroupTable] = None,
    ) -> None:
        super().__init__(service, verbose, policy, groups)
        self.sessions = sessions
