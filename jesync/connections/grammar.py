"""
What a wire protocol writes to be served: a grammar.

A grammar (one per connection) parses each frame its framing cuts, calls the
lock service, and formats the reply, which it hands to its connection
(L{jesync.connections.connection.LockConnection}, which knows a grammar only
as the L{jesync.connections.connection.ConnectionGrammar} it declares).  It says how its protocol
words the replies the connection layer sends on its behalf (a limit, a bad
token, an over-long frame), and what giving back the connection's locks
means for it.  It never touches the transport, and decides nothing about
authentication, limits, half-close or output: the connection does.

L{CommandGrammar} is the base of the line protocols (JESync, elock): a line
is a command word and arguments (L{jesync.wire.split_fields}), looked up in a
command table of small handlers, as in C{twisted.protocols.memcache}.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Dict, Iterable, Iterator, List, Optional

from twisted.logger import Logger

from jesync.connections.connection import LockConnection
from jesync.connections.framing import Framing, LineFraming
from jesync.connections.listings import Held, lines_bytes
from jesync.errors import LimitReached
from jesync.interfaces import IOwnerChanges
from jesync.wire import MAX_LINE, BadRequest, check_key_field, decode_key, only_argument, split_fields

# The size of one piece of a streamed reply (lines are joined until a piece
# passes it).  A reply smaller than one piece is not worth streaming: it is
# written at once, and holds nothing of the listing budget.
PIECE = 16384


def in_pieces(chunks: Iterable[bytes], terminator: bytes = b"") -> Iterator[bytes]:
    """
    A streamed reply's chunks (lines, packets), each followed by
    C{terminator}, joined into pieces of about L{PIECE} bytes, made only as
    they are sent.
    """
    extra = len(terminator)
    piece: List[bytes] = []
    size = 0
    for chunk in chunks:
        piece.append(chunk)
        size += len(chunk) + extra
        if size >= PIECE:
            if extra:
                piece.append(b"")
            yield terminator.join(piece)
            piece = []
            size = 0
    if piece:
        if extra:
            piece.append(b"")
        yield terminator.join(piece)


class Grammar:
    """
    The base of a wire protocol's grammar.

    @cvar framing: how frames are cut: a class taking (deliver, too_long,
        max_frame), such as L{LineFraming}.
    @cvar max_frame: the longest frame accepted.
    @cvar ordered: whether replies go out in request order (while a reply is
        owed, later requests wait), or a wait is answered whenever it ends.
    @cvar idle_while_busy: whether the idle timeout closes a quiet
        connection that holds or waits for locks too (dlock: only its pings
        keep a connection alive), not only one that holds nothing.
    @ivar idle_timeout: the idle timeout of its connection: the policy's,
        unless the protocol has its own (dlock's C{--dlock-idle-timeout}).
    """

    framing: ClassVar[type[Framing]] = LineFraming
    max_frame: int = MAX_LINE
    ordered: ClassVar[bool] = False
    idle_while_busy: ClassVar[bool] = False
    log = Logger()

    def __init__(self, connection: LockConnection) -> None:
        self.connection = connection
        self.service = connection.service
        self.idle_timeout: Optional[float] = connection.policy.idle_timeout

    def frame_received(self, frame: bytes) -> None:
        """One request: parse it, carry it out, reply."""
        raise NotImplementedError

    # -- how the protocol says what the connection layer decides -------------

    def refusal(self, error: LimitReached) -> bytes:
        """The reply to a request (or a connection) over a limit, terminated."""
        raise NotImplementedError

    def auth_refused(self) -> bytes:
        """The last reply to a connection that did not authenticate."""
        raise NotImplementedError

    def frame_too_long(self) -> bytes:
        """The last reply to a connection that sent a frame over C{max_frame}."""
        raise NotImplementedError

    # -- the connection's lifecycle ------------------------------------------

    def holds_nothing(self) -> bool:
        """Whether the connection holds no lock (for the idle timeout)."""
        return not self.service.owned(self.connection)

    def closing(self) -> None:
        """
        The connection is closing (its waits are already cancelled): give
        back what it holds.
        """
        self.service.release_all(self.connection)

    # -- owners that outlive the connection ----------------------------------

    def owner_changes(self) -> Optional[IOwnerChanges]:
        """
        Who is told of changes to the owners that outlive a connection
        (a session's grace period, a timed grant): the lock service's
        observer, if it records them (cluster mode: the journal); None
        otherwise.
        """
        return IOwnerChanges(self.service.observer, None)


class CommandGrammar(Grammar):
    """
    A line protocol: C{<command> <arguments...>}, one per line.

    C{commands} maps a command word to a handler, called with the arguments;
    it raises L{BadRequest} or L{LimitReached} for a request that changes
    nothing, and replies with L{reply} otherwise.  C{auth <token>} is served
    here for every line protocol.
    """

    terminator: ClassVar[bytes] = b"\n"
    #: Whether replies wait for durable state (cluster mode): a grammar
    #: whose locks outlive its connections (elock's sessions).
    durable_replies: ClassVar[bool] = False
    commands: ClassVar[Dict[bytes, Callable[..., None]]] = {}

    def frame_received(self, line: bytes) -> None:
        fields = split_fields(line)
        word = fields[0] if fields else b""
        connection = self.connection
        if connection.verbose:
            # Never log a token: not in an auth line, nor in anything a client
            # sends before it has authenticated (a mistyped auth command).
            said = line if connection.authenticated and word != b"auth" else b"(not logged before auth)"
            self.log.debug("{peer} sent {line!r}", peer=connection.peer, line=said)
        if word == b"auth":
            if connection.authenticate(fields[1] if len(fields) == 2 else None):
                self.reply(self.auth_accepted())
            return
        if not connection.authenticated:
            connection.refuse_unauthenticated()
            return
        handler = self.commands.get(word)
        if handler is None:
            self.reply(self.unknown_command(word))
            return
        try:
            handler(self, fields[1:])
        except BadRequest as error:
            self.reply(self.bad_request(str(error)))
        except LimitReached as error:
            self.reply(self.limit_reached(str(error)))

    def key(self, field: bytes) -> str:
        """A key argument, within the policy's max-key-length."""
        limit = self.connection.policy.max_key_length
        if len(field) > limit:
            raise LimitReached("max-key-length", limit)
        return decode_key(check_key_field(field))

    def switch(self, args: List[bytes], name: str) -> bool:
        """The one argument of a C{<name> on|off} command, as a bool."""
        setting = only_argument(args, "on or off")
        if setting not in (b"on", b"off"):
            raise BadRequest(f"{name} is on or off")
        return setting == b"on"

    def reply(self, line: bytes) -> None:
        """Send one line (without its terminator): once durable (L{durable_replies}), or at once."""
        connection = self.connection
        if connection.verbose:
            self.log.debug("{peer} answered {line!r}", peer=connection.peer, line=line)
        if self.durable_replies:
            connection.write_durable(line + self.terminator)
        else:
            connection.write(line + self.terminator)

    def reply_lines(self, lines: List[bytes]) -> None:
        """Send several lines at once."""
        connection = self.connection
        if connection.verbose:
            for line in lines:
                self.log.debug("{peer} answered {line!r}", peer=connection.peer, line=line)
        terminator = self.terminator
        connection.write(b"".join(line + terminator for line in lines))

    def reply_stream(self, lines: Iterable[bytes], held: Optional[Held] = None) -> None:
        """
        Send many lines (a listing), in pieces, as the client takes them;
        C{held} (what the lines are made from: a snapshot, bytes charged to
        the server's listing budget) is released once they have gone out.
        """
        if self.connection.verbose:
            lines = self._logged(lines)
        self.connection.write_stream(in_pieces(lines, self.terminator), held)

    def reply_listing(self, lines: List[bytes]) -> None:
        """
        Send lines made already (C{holders}, C{sessions}): at once if they
        are less than a piece (L{PIECE}), charged nothing; otherwise
        streamed, charged to the server's listing budget until they have
        gone out (L{jesync.connections.listings}).

        @raise LimitReached: a stream past C{--max-listing-memory}.
        """
        extra = len(self.terminator)
        if sum(len(line) + extra for line in lines) < PIECE:
            self.reply_lines(lines)
        else:
            self.reply_stream(lines, self.connection.policy.listings.charge(lines_bytes(lines)))

    def _logged(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        connection = self.connection
        for line in lines:
            self.log.debug("{peer} answered {line!r}", peer=connection.peer, line=line)
            yield line

    # -- the protocol's words ------------------------------------------------

    def unknown_command(self, word: bytes) -> bytes:
        raise NotImplementedError

    def bad_request(self, message: str) -> bytes:
        raise NotImplementedError

    def limit_reached(self, message: str) -> bytes:
        raise NotImplementedError

    def auth_accepted(self) -> bytes:
        raise NotImplementedError

    def refusal(self, error: LimitReached) -> bytes:
        return self.limit_reached(str(error)) + self.terminator

    def frame_too_long(self) -> bytes:
        return self.bad_request("line too long") + self.terminator
