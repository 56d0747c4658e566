"""
The operator's listener: the JESync protocol plus two commands that undo
what a hung client holds, served by L{AdminFactory} on the endpoints of
C{--admin-port} (a UNIX socket, say, only the operator can open).

 - C{force-release <key>}: every holder of C{key} loses it, whoever it is
   (JESync or memcached connection, elock session, dlock connection or timed
   lock), and its waiters are served as on any release.  C{FORCE-RELEASED
   <n> <key>}, C{n} the grants released.
 - C{end-session <id>}: the elock session C{id}, in its grace period after
   its connection went away, ends now, releasing its locks.
   C{SESSION-ENDED <id>}, or C{INVALID_PARAMETER: no detached session <id>}.

Everything else is the JESync protocol, authentication included: with
C{--auth-token-file}, an admin connection sends C{auth <token>} first like
any other.  Each use is logged.
"""

from __future__ import annotations

from typing import List, Optional

from jesync.connections.policy import ConnectionPolicy
from jesync.interfaces import ILockService
from jesync.protocols.jesync import JESyncFactory, JESyncProtocol
from jesync.sessions import SessionTable
from jesync.wire import BadRequest, only_argument


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

    def do_end_session(self, args: List[bytes]) -> None:
        session_id = only_argument(args, "session id")
        factory = self.connection.factory
        assert isinstance(factory, AdminFactory)
        sessions = factory.sessions
        if sessions is None or not sessions.end_one_detached(session_id.decode("ascii", "replace")):
            raise BadRequest(f"no detached session {session_id.decode('ascii', 'replace')}")
        self.log.info("{peer} ended session {id}", peer=self.connection.peer, id=session_id.decode("ascii", "replace"))
        self.reply(b"SESSION-ENDED " + session_id)


AdminProtocol.commands = {
    **JESyncProtocol.commands,
    b"force-release": AdminProtocol.do_force_release,
    b"end-session": AdminProtocol.do_end_session,
}


class AdminFactory(JESyncFactory):
    """
    Serves L{AdminProtocol}.

    @param sessions: the elock listener's sessions, for C{end-session}
        (None: the server serves no elock).
    """

    grammar = AdminProtocol

    def __init__(
        self,
        service: ILockService,
        verbose: bool = False,
        policy: Optional[ConnectionPolicy] = None,
        sessions: Optional[SessionTable] = None,
    ) -> None:
        super().__init__(service, verbose, policy)
        self.sessions = sessions
