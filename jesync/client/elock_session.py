"""
The elock client's session, and its failover as a declared state machine.

An elock session (L{jesync.client.elock}) has an id the server gave it, and
at most one connection at a time.  What happens to it is a small machine,
whose states say whether there is a session and whether it has a connection:

    unattached --start--> attached      a new session, through a member that answered
    attached   --broke--> resuming      its connection failed: it is closed and forgotten
    resuming   --resume-> attached      a member took the session back within the grace period
    resuming   --give_up-> unattached   none did: the id is forgotten (the next request starts anew)
    any        --end----> ended         the client quits or stops: the connection is closed

Any other input in a state is a bug, and raises (automat's NoTransition),
so the bookkeeping of the id, the member and the connection can only change
along these arrows.  The machine does no I/O of its own beyond closing a
connection: the client connects, asks and decides, in its I/O thread, and
tells the machine what happened.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol

from automat import MethodicalMachine


class Closable(Protocol):
    """A session's connection, as far as the machine cares."""

    def close(self) -> None: ...


class ELockSession:
    """
    One elock session's state: its C{id} (None while unattached), the
    C{connection} it is attached through (None unless attached), the
    C{member_index} of the member that last answered, and when it last heard
    from it (C{heard_at}, for the heartbeat).
    """

    _machine = MethodicalMachine()

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.id: Optional[str] = None
        self.connection: Optional[Any] = None
        self.member_index = 0
        self.heard_at = clock()

    def heard(self) -> None:
        """The server answered: the heartbeat's quiet starts again."""
        self.heard_at = self._clock()

    # -- states ---------------------------------------------------------------

    @_machine.state(initial=True)
    def unattached(self) -> None:
        "No session: none started yet, or the last one was given up."

    @_machine.state()
    def attached(self) -> None:
        "A session with a connection."

    @_machine.state()
    def resuming(self) -> None:
        "A session whose connection failed, being taken back through a member."

    @_machine.state()
    def ended(self) -> None:
        "The client quit or stopped."

    # -- inputs ---------------------------------------------------------------

    @_machine.input()
    def start(self, connection: Closable, member_index: int, session_id: str) -> None:
        "A new session started through the member at C{member_index}."

    @_machine.input()
    def broke(self) -> None:
        "The connection failed."

    @_machine.input()
    def resume(self, connection: Closable, member_index: int) -> None:
        "The member at C{member_index} took the session back."

    @_machine.input()
    def give_up(self) -> None:
        "No member took the session back within its grace period."

    @_machine.input()
    def end(self) -> None:
        "The client quits or stops."

    # -- outputs --------------------------------------------------------------

    @_machine.output()
    def _adopt(self, connection: Closable, member_index: int, session_id: str) -> None:
        self.id = session_id
        self._use(connection, member_index)

    @_machine.output()
    def _reattach(self, connection: Closable, member_index: int) -> None:
        self._use(connection, member_index)

    @_machine.output()
    def _drop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()

    @_machine.output()
    def _forget(self) -> None:
        self.id = None

    def _use(self, connection: Closable, member_index: int) -> None:
        self.connection = connection
        self.member_index = member_index
        self.heard()

    unattached.upon(start, enter=attached, outputs=[_adopt])
    unattached.upon(end, enter=ended, outputs=[])
    attached.upon(broke, enter=resuming, outputs=[_drop])
    attached.upon(end, enter=ended, outputs=[_drop])
    resuming.upon(resume, enter=attached, outputs=[_reattach])
    resuming.upon(give_up, enter=unattached, outputs=[_forget])
    resuming.upon(end, enter=ended, outputs=[])
    ended.upon(end, enter=ended, outputs=[])
