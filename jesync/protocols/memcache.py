"""
The memcached protocols, text and binary on one port, with yrmcds's
server-side object locks: the grammar, served by L{MemcacheFactory} over an
L{jesync.store.ObjectStore}.

Each request is told apart by its first byte (0x80: binary), as memcached
does (L{jesync.connections.framing.MemcachedFraming}).  Text commands are a
table of small handlers (C{text_commands}), binary ones a table by opcode
(C{binary_commands}) whose entries also give the request's shape (extras
lengths, key, value) and whether it is a quiet variant.  Nothing waits: every
request is answered at once, in order.

The objects and the lock rule are the store's (L{jesync.store}): this
connection is the owner of the locks it takes with C{lock}, C{LaG} ...; a
JESync, elock or dlock holder of a key locks the object of that key too.

With an auth token, a connection authenticates as memcached's do: binary
SASL PLAIN (any user name, the token as password), or text, with a first
C{set} whose data is C{<user> <token>}.  Anything else first is refused.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from functools import partial
from typing import Callable, ClassVar, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from jesync.connections.connection import LockConnection, LockServerFactory
from jesync.connections.framing import MemcachedFraming
from jesync.connections.grammar import PIECE, Grammar, in_pieces
from jesync.connections.listings import REFERENCE_BYTES
from jesync.connections.policy import ConnectionPolicy
from jesync.errors import LimitReached
from jesync.store import (
    MAX_KEY_LENGTH,
    Item,
    NonNumeric,
    ObjectStore,
    Outcome,
    OutOfMemory,
    TooLarge,
)
from jesync.wire import LOST

#: What C{version} answers.
VERSION = b"1.6.0-jesync"

# -- the binary protocol's words ------------------------------------------------------

RESPONSE_MAGIC = 0x81  # (a request's, 0x80, is told apart by the framing)
#: magic, opcode, key length, extras length, data type, vbucket (request) or
#: status (response), body length, opaque, CAS.
HEADER = struct.Struct(">BBHBBHIIQ")

SUCCESS = 0x0000
KEY_NOT_FOUND = 0x0001
KEY_EXISTS = 0x0002
VALUE_TOO_LARGE = 0x0003
INVALID_ARGUMENTS = 0x0004
ITEM_NOT_STORED = 0x0005
NON_NUMERIC = 0x0006
LOCKED = 0x0010
NOT_LOCKED = 0x0011
AUTH_ERROR = 0x0020
UNKNOWN_COMMAND = 0x0081
OUT_OF_MEMORY = 0x0082
TEMPORARY_FAILURE = 0x0086

#: The body of an error response, as memcached words them.
STATUS_TEXT = {
    KEY_NOT_FOUND: b"Not found",
    KEY_EXISTS: b"Data exists for key.",
    VALUE_TOO_LARGE: b"Too large.",
    INVALID_ARGUMENTS: b"Invalid arguments",
    ITEM_NOT_STORED: b"Not stored.",
    NON_NUMERIC: b"Non-numeric server-side value for incr or decr",
    LOCKED: b"Locked",
    NOT_LOCKED: b"Not locked",
    AUTH_ERROR: b"Auth failure.",
    UNKNOWN_COMMAND: b"Unknown command",
    OUT_OF_MEMORY: b"Out of memory",
}

#: A store outcome as a binary status.
OUTCOME_STATUS = {
    Outcome.STORED: SUCCESS,
    Outcome.DELETED: SUCCESS,
    Outcome.TOUCHED: SUCCESS,
    Outcome.OK: SUCCESS,
    Outcome.NOT_FOUND: KEY_NOT_FOUND,
    Outcome.EXISTS: KEY_EXISTS,
    Outcome.NOT_STORED: ITEM_NOT_STORED,
    Outcome.LOCKED: LOCKED,
    Outcome.NOT_LOCKED: NOT_LOCKED,
}

# -- the text protocol's words -----------------------------------------------------------

CRLF = b"\r\n"
BAD_FORMAT = b"CLIENT_ERROR bad command line format"
BAD_CHUNK = b"CLIENT_ERROR bad data chunk"
TOO_LARGE = b"SERVER_ERROR object too large for cache"
NO_MEMORY = b"SERVER_ERROR out of memory storing object"
NOT_NUMERIC = b"CLIENT_ERROR cannot increment or decrement non-numeric value"
BAD_DELTA = b"CLIENT_ERROR invalid numeric delta argument"
BAD_EXPTIME = b"CLIENT_ERROR invalid exptime argument"
BAD_DELETE = b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
NOT_UNLOCKED = b"CLIENT_ERROR object is not locked or not found"
UNAUTHENTICATED = b"CLIENT_ERROR unauthenticated"
AUTH_FAILED = b"CLIENT_ERROR authentication failure"
BAD_AUTH_FORMAT = b"CLIENT_ERROR bad authentication token format"

STORAGE_MODES = ("set", "add", "replace", "append", "prepend", "cas")
#: The text commands that take a last C{noreply} (memcached 1.6's): one that
#: ends with it is silent, its errors included, once its number of arguments
#: is right (too few or too many is still C{ERROR}).  memcached decides it
#: from the last field alone, before parsing the others, so a
#: C{verbosity noreply} or a C{touch <key> noreply} (whose C{noreply} stands
#: where a number should) is silent too; C{delete noreply} deletes the key
#: C{noreply}.  A pipelining client that sent C{noreply} reads nothing for it.
NOREPLY_COMMANDS = frozenset(
    [b"set", b"add", b"replace", b"append", b"prepend", b"cas", b"incr", b"decr", b"delete", b"touch"]
    + [b"flush_all", b"verbosity"]
)
LARGEST_FLAGS = 2**32 - 1
#: The longest text authentication data (C{<user> <token>}).
MAX_AUTH_DATA = 4096
#: A text C{get} whose values pass this many bytes is streamed.
STREAM_ABOVE = 65536
LARGEST_U64 = 2**64 - 1
#: A binary Increment's "do not create a missing counter" expiration.
NO_INITIAL = 0xFFFFFFFF


class BadCommand(Exception):
    """A text command whose arguments memcached would not parse: C{CLIENT_ERROR <message>}."""

    def __init__(self, message: bytes = BAD_FORMAT) -> None:
        super().__init__(message)
        self.message = message


class WrongArity(Exception):
    """A text command with too few or too many arguments: memcached answers C{ERROR}."""


def _number(field: bytes, largest: int, smallest: int = 0, error: bytes = BAD_FORMAT) -> int:
    """A decimal field within [smallest, largest], or L{BadCommand} with C{error}."""
    text = field[1:] if field[:1] == b"-" and smallest < 0 else field
    if not text.isdigit() or len(text) > 20:
        raise BadCommand(error)
    value = int(field)
    if not smallest <= value <= largest:
        raise BadCommand(error)
    return value


def _exptime(field: bytes, error: bytes = BAD_EXPTIME) -> int:
    """An expiration time field (a signed 64-bit number)."""
    return _number(field, 2**63 - 1, -(2**63), error)


class BinaryRequest(NamedTuple):
    opcode: int
    key: bytes
    extras: bytes
    value: bytes
    opaque: int
    cas: int


class _Storing(NamedTuple):
    """A text storage command waiting for its data block."""

    mode: str
    key: bytes
    flags: int
    exptime: int
    cas: int
    noreply: bool


class _Shape(NamedTuple):
    """What a binary request must carry: its extras' lengths (None: any), a key or not (None: either), a value or not."""

    extras: Optional[Tuple[int, ...]]
    key: Optional[bool]
    value: bool


class MemcacheProtocol(Grammar):
    """The memcached grammar: text and binary requests, the store's commands, yrmcds's locks."""

    framing = MemcachedFraming
    text_commands: ClassVar[Dict[bytes, Callable[[MemcacheProtocol, List[bytes]], None]]] = {}
    #: opcode -> (name, handler, quiet, shape)
    binary_commands: ClassVar[Dict[int, Tuple[str, Callable[..., None], bool, _Shape]]] = {}

    def __init__(self, connection: LockConnection) -> None:
        super().__init__(connection)
        factory = connection.factory
        assert isinstance(factory, MemcacheFactory)
        self.factory = factory
        self.store = factory.store
        self.max_frame = factory.store.max_item + 1024
        self._storing: Optional[_Storing] = None
        # The last binary request (None: the last was text), for the replies
        # the connection layer asks for.
        self._binary: Optional[BinaryRequest] = None
        # The last reply to a client refused before (or after: its token
        # rotated out) authenticating, as it goes on the wire.
        self._refused = UNAUTHENTICATED + CRLF
        # Whether the text command being served asked for no reply.
        self._silent = False

    @property
    def _framing(self) -> MemcachedFraming:
        framing = self.connection.framing
        assert isinstance(framing, MemcachedFraming)
        return framing

    def frame_received(self, frame: bytes) -> None:
        if self._storing is not None:
            self._data_received(frame)
        elif frame[:1] == b"\x80":
            self._binary_received(frame)
        else:
            self._binary = None
            self._text_received(frame)

    # == text ==================================================================

    def _text_received(self, line: bytes) -> None:
        # (fields are separated by spaces only, as memcached's: a key may hold a tab)
        fields = [field for field in line.split(b" ") if field]
        word = fields[0] if fields else b""
        connection = self.connection
        if connection.verbose:
            self.log.debug(
                "{peer} sent {line!r}", peer=connection.peer, line=line if connection.authenticated else word
            )
        if not connection.authenticated and word != b"set":
            self._silent = False
            self._refuse(UNAUTHENTICATED)
            return
        handler = self.text_commands.get(word)
        self._silent = (
            word in NOREPLY_COMMANDS
            and fields[-1] == b"noreply"
            and len(fields) > (2 if word == b"delete" else 1)  # ("delete noreply": the key)
        )
        if handler is None:
            self._say(b"ERROR")
            return
        try:
            handler(self, fields[1:])
        except WrongArity:
            self._silent = False
            self._say_error(b"ERROR")
        except BadCommand as error:
            self._say_error(error.message)
        except LimitReached as error:
            self._say_error(b"SERVER_ERROR " + str(error).encode())

    def _say(self, line: bytes) -> None:
        """Send one text reply line, unless the command asked for no reply."""
        if not self._silent:
            if self.connection.verbose:
                self.log.debug("{peer} answered {line!r}", peer=self.connection.peer, line=line)
            self.connection.write(line + CRLF)

    def _say_error(self, line: bytes) -> None:
        """
        An error reply; before authentication, the last one: every request
        of an unauthenticated client but a right authentication closes the
        connection, malformed ones included (unless C{noreply}, it is told
        why).
        """
        if self.connection.authenticated:
            self._say(line)
        else:
            self._refuse(line)

    def _refuse(self, line: bytes) -> None:
        """Refuse an unauthenticated client: C{line} (unless the command asked for no reply), then close."""
        self._refused = b"" if self._silent else line + CRLF
        self.connection.refuse_unauthenticated()

    def _key(self, field: bytes) -> bytes:
        if len(field) > MAX_KEY_LENGTH:
            raise BadCommand()
        return field

    @staticmethod
    def _arity(args: List[bytes], count: int) -> None:
        """
        Check that there are C{count} arguments, or one more (C{noreply}, or
        anything else, which is ignored, as memcached does).
        """
        if not count <= len(args) <= count + 1:
            raise WrongArity()

    # -- reads ---------------------------------------------------------------------------------

    def _text_get(self, args: List[bytes], with_cas: bool = False, exptime: Optional[int] = None) -> None:
        for field in args:
            self._key(field)
        self.factory.commands["get"] += len(args)
        found = []
        size = 0
        for key in args:
            item = self.store.get(key) if exptime is None else self.store.touch(key, exptime)
            if item is not None:
                found.append((key, item.flags, item.value, item.cas))
                size += len(item.value)
        pieces = _values(found, with_cas)
        if size <= STREAM_ABOVE:
            self.connection.write(b"".join(pieces))
        else:
            # (many keys, or large values: sent as the client takes them,
            # never built whole in memory; the values are the items' own)
            self.connection.write_stream(pieces)

    def do_get(self, args: List[bytes]) -> None:
        if not args:
            raise WrongArity()
        self._text_get(args)

    def do_gets(self, args: List[bytes]) -> None:
        if not args:
            raise WrongArity()
        self._text_get(args, with_cas=True)

    def do_gat(self, args: List[bytes]) -> None:
        if not args:
            raise WrongArity()
        self.factory.commands["touch"] += len(args) - 1
        self._text_get(args[1:], exptime=_exptime(args[0]))

    def do_gats(self, args: List[bytes]) -> None:
        if not args:
            raise WrongArity()
        self.factory.commands["touch"] += len(args) - 1
        self._text_get(args[1:], with_cas=True, exptime=_exptime(args[0]))

    # -- storage -------------------------------------------------------------------------------

    def _text_storage(self, args: List[bytes], mode: str) -> None:
        """C{set}, C{add}, C{replace}, C{append}, C{prepend} or C{cas} (C{mode}): read its data next."""
        count = 5 if mode == "cas" else 4
        self._arity(args, count)
        key = self._key(args[0])
        flags = _number(args[1], LARGEST_FLAGS)
        exptime = _exptime(args[2], BAD_FORMAT)
        size = _number(args[3], 2**31 - 1)
        cas = _number(args[4], LARGEST_U64) if mode == "cas" else 0
        if not self.connection.authenticated and size > MAX_AUTH_DATA:
            self._refuse(BAD_AUTH_FORMAT)
            return
        if size > self.store.max_item:
            self._say_error(TOO_LARGE)
            if self.connection.authenticated:
                self._framing.skip(size + 2)
            return
        self._storing = _Storing(mode, key, flags, exptime, cas, self._silent)
        self._framing.read_block(size + 2)

    def _data_received(self, block: bytes) -> None:
        storing = self._storing
        assert storing is not None
        self._storing = None
        self._silent = storing.noreply
        if block[-2:] != CRLF:
            self._say_error(BAD_CHUNK)
            return
        value = block[:-2]
        connection = self.connection
        if not connection.authenticated:
            # memcached's text authentication: the data is "<user> <token>";
            # answered as any storage command (so not at all with noreply).
            user, space, token = value.partition(b" ")
            self._refused = b"" if self._silent else (AUTH_FAILED if space else BAD_AUTH_FORMAT) + CRLF
            if connection.authenticate(token if space else None):
                self._refused = UNAUTHENTICATED + CRLF
                self._say(b"STORED")
            return
        self.factory.commands["set"] += 1
        try:
            outcome, _ = self.store.store(
                storing.mode, storing.key, value, storing.flags, storing.exptime, connection, storing.cas
            )
        except TooLarge:
            self._say(TOO_LARGE)
        except OutOfMemory:
            self._say(NO_MEMORY)
        else:
            self._say(outcome.value)

    # -- other writes ---------------------------------------------------------------------------

    def _text_delta(self, args: List[bytes], decrement: bool) -> None:
        self._arity(args, 2)
        key = self._key(args[0])
        delta = _number(args[1], LARGEST_U64, error=BAD_DELTA)
        try:
            outcome, item = self.store.add_delta(key, delta, self.connection, decrement)
        except NonNumeric:
            self._say(NOT_NUMERIC)
            return
        self._say(outcome.value if item is None else item.value)

    def do_delete(self, args: List[bytes]) -> None:
        # delete <key> [0] [noreply]: memcached still takes a zero "time".
        if not 1 <= len(args) <= 3:
            raise WrongArity()
        if len(args) > 1:
            # (<key> 0, <key> noreply, <key> 0 noreply; the key is checked after)
            zero = args[1] == b"0"
            valid = (zero or self._silent) if len(args) == 2 else (zero and self._silent)
            if not valid:
                raise BadCommand(BAD_DELETE)
        self._say(self.store.delete(self._key(args[0]), self.connection).value)

    def do_touch(self, args: List[bytes]) -> None:
        self._arity(args, 2)
        key = self._key(args[0])
        exptime = _exptime(args[1])
        self.factory.commands["touch"] += 1
        found = self.store.touch(key, exptime) is not None
        self._say(Outcome.TOUCHED.value if found else Outcome.NOT_FOUND.value)

    def do_flush_all(self, args: List[bytes]) -> None:
        # flush_all [delay] [noreply]: a delay in the past flushes now.
        if len(args) > 2:
            raise WrongArity()
        delayed = len(args) > (1 if self._silent else 0)
        self._flush(max(_exptime(args[0]), 0) if delayed else 0)
        self._say(b"OK")

    # -- the rest ------------------------------------------------------------------------------------

    def do_version(self, args: List[bytes]) -> None:
        self._say(b"VERSION " + VERSION)

    def do_verbosity(self, args: List[bytes]) -> None:
        # (accepted, and changes nothing: the server's log level is its own)
        self._arity(args, 1)
        _number(args[0], LARGEST_FLAGS)
        self._say(b"OK")

    def do_stats(self, args: List[bytes]) -> None:
        if args and args != [b"settings"]:
            raise WrongArity()
        rows = self.factory.settings() if args else self.factory.stats()
        self.connection.write(
            b"".join(b"STAT %s %s\r\n" % (name.encode(), str(value).encode()) for name, value in rows) + b"END\r\n"
        )

    def do_quit(self, args: List[bytes]) -> None:
        self.connection.close()

    # -- yrmcds's locks --------------------------------------------------------------------------------

    def do_lock(self, args: List[bytes]) -> None:
        if len(args) != 1:
            raise WrongArity()
        self._say(self.store.lock(self._key(args[0]), self.connection).value)

    def do_unlock(self, args: List[bytes]) -> None:
        if len(args) != 1:
            raise WrongArity()
        outcome = self.store.unlock(self._key(args[0]), self.connection)
        self._say(b"OK" if outcome is Outcome.OK else NOT_UNLOCKED)

    def do_unlock_all(self, args: List[bytes]) -> None:
        # (arguments are ignored, as yrmcds does)
        self.store.unlock_all(self.connection)
        self._say(b"OK")

    # -- yrmcds's listing --------------------------------------------------------------------------

    def do_keys(self, args: List[bytes]) -> None:
        # keys [prefix]: what follows the prefix is ignored, as yrmcds does.
        self._keys(args[0] if args else b"", _text_keys, len(b"VALUE \r\n"))

    # == binary ==================================================================

    def _binary_received(self, frame: bytes) -> None:
        magic, opcode, key_length, extras_length, _, _, body_length, opaque, cas = HEADER.unpack_from(frame)
        whole = len(frame) > HEADER.size or not body_length  # (too long: the framing skips its body)
        if whole and key_length + extras_length <= body_length:
            key_start = HEADER.size + extras_length
            key_end = key_start + key_length
            request = BinaryRequest(
                opcode, frame[key_start:key_end], frame[HEADER.size : key_start], frame[key_end:], opaque, cas
            )
        else:
            request = BinaryRequest(opcode, b"", b"", b"", opaque, cas)
        self._binary = request
        if not whole:
            self._respond_error(request, VALUE_TOO_LARGE)
            return
        if key_length + extras_length > body_length:
            self._respond_error(request, INVALID_ARGUMENTS)
            return
        command = self.binary_commands.get(opcode)
        connection = self.connection
        if connection.verbose:
            self.log.debug(
                "{peer} sent {name} key={key!r} ({size} bytes of value)",
                peer=connection.peer,
                name=command[0] if command is not None else hex(opcode),
                key=request.key,
                size=len(request.value),
            )
        if not connection.authenticated and opcode not in (SASL_LIST_MECHS, SASL_AUTH):
            self._respond_error(request, AUTH_ERROR)
            return
        if command is None:
            self._respond(request, UNKNOWN_COMMAND)
            return
        _, handler, quiet, shape = command
        if (
            (shape.extras is not None and len(request.extras) not in shape.extras)
            or (shape.key is not None and bool(request.key) != shape.key)
            or (request.value and not shape.value)
            or len(request.key) > MAX_KEY_LENGTH
        ):
            self._respond_error(request, INVALID_ARGUMENTS)
            return
        try:
            handler(self, request, quiet)
        except LimitReached as error:
            self._respond(request, TEMPORARY_FAILURE, value=str(error).encode())
        except TooLarge:
            self._respond(request, VALUE_TOO_LARGE)
        except OutOfMemory:
            self._respond(request, OUT_OF_MEMORY)
        except NonNumeric:
            self._respond(request, NON_NUMERIC)

    def _packet(
        self,
        request: BinaryRequest,
        status: int = SUCCESS,
        extras: bytes = b"",
        key: bytes = b"",
        value: Optional[bytes] = None,
        cas: int = 0,
    ) -> bytes:
        if value is None:
            value = STATUS_TEXT.get(status, b"")
        return (
            HEADER.pack(
                RESPONSE_MAGIC,
                request.opcode,
                len(key),
                len(extras),
                0,
                status,
                len(extras) + len(key) + len(value),
                request.opaque,
                cas,
            )
            + extras
            + key
            + value
        )

    def _respond(self, request: BinaryRequest, status: int = SUCCESS, **fields: object) -> None:
        if self.connection.verbose:
            self.log.debug("{peer} answered status {status:#06x}", peer=self.connection.peer, status=status)
        self.connection.write(self._packet(request, status, **fields))  # type: ignore[arg-type]

    def _respond_error(self, request: BinaryRequest, status: int) -> None:
        """An error response; before authentication, the last one (as L{_say_error})."""
        if self.connection.authenticated:
            self._respond(request, status)
        else:
            self._refused = self._packet(request, status)
            self.connection.refuse_unauthenticated()

    def _outcome(self, request: BinaryRequest, quiet: bool, outcome: Outcome, cas: int = 0) -> None:
        """Answer with a store outcome (a quiet request: only when it failed)."""
        status = OUTCOME_STATUS[outcome]
        if not (quiet and status == SUCCESS):
            self._respond(request, status, cas=cas)

    def _item(self, request: BinaryRequest, item: Item, with_key: bool) -> None:
        self._respond(
            request,
            extras=struct.pack(">I", item.flags),
            key=request.key if with_key else b"",
            value=item.value,
            cas=item.cas,
        )

    # -- reads -----------------------------------------------------------------------

    def _bin_get(self, request: BinaryRequest, quiet: bool) -> None:
        with_key = request.opcode in (GETK, GETKQ, GATK, GATKQ)
        if request.extras:
            self.factory.commands["touch"] += 1
            item = self.store.touch(request.key, _signed(request.extras))
        else:
            self.factory.commands["get"] += 1
            item = self.store.get(request.key)
        if item is not None:
            self._item(request, item, with_key)
        elif not quiet:
            if with_key:
                self._respond(request, KEY_NOT_FOUND, key=request.key, value=b"")
            else:
                self._respond(request, KEY_NOT_FOUND)

    def _bin_touch(self, request: BinaryRequest, quiet: bool) -> None:
        self.factory.commands["touch"] += 1
        item = self.store.touch(request.key, _signed(request.extras))
        if item is None:
            self._respond(request, KEY_NOT_FOUND)
        else:
            self._respond(request, extras=struct.pack(">I", item.flags), cas=item.cas)

    # -- writes --------------------------------------------------------------------------

    def _bin_store(self, request: BinaryRequest, quiet: bool) -> None:
        """Set, Add, Replace, Append, Prepend and their quiet variants; and RaU(Q), a replace that unlocks."""
        flags, exptime = struct.unpack(">II", request.extras) if request.extras else (0, 0)
        self.factory.commands["set"] += 1
        if request.opcode in (RAU, RAUQ):
            mode = "replace"
            outcome, item = self.store.replace_and_unlock(
                request.key, request.value, flags, _signed_int(exptime), self.connection, request.cas
            )
        else:
            mode = BINARY_STORE_MODES[request.opcode]
            outcome, item = self.store.store(
                mode, request.key, request.value, flags, _signed_int(exptime), self.connection, request.cas
            )
        if outcome is Outcome.NOT_STORED and mode == "add":
            outcome = Outcome.EXISTS  # (memcached's binary add: "Data exists for key.")
        elif outcome is Outcome.NOT_STORED and mode == "replace":
            outcome = Outcome.NOT_FOUND
        self._outcome(request, quiet, outcome, item.cas if item is not None else 0)

    def _bin_delete(self, request: BinaryRequest, quiet: bool) -> None:
        self._outcome(request, quiet, self.store.delete(request.key, self.connection, request.cas))

    def _bin_delta(self, request: BinaryRequest, quiet: bool) -> None:
        delta, initial, exptime = struct.unpack(">QQI", request.extras)
        outcome, item = self.store.add_delta(
            request.key,
            delta,
            self.connection,
            decrement=request.opcode in (DECREMENT, DECREMENTQ),
            initial=None if exptime == NO_INITIAL else initial,
            exptime=_signed_int(exptime),
            cas=request.cas,
        )
        if item is None:
            self._outcome(request, quiet, outcome)
        elif not quiet:
            self._respond(request, value=struct.pack(">Q", int(item.value)), cas=item.cas)

    def _bin_flush(self, request: BinaryRequest, quiet: bool) -> None:
        self._flush(struct.unpack(">I", request.extras)[0] if request.extras else 0)
        if not quiet:
            self._respond(request)

    # -- the rest ---------------------------------------------------------------------------

    def _bin_quit(self, request: BinaryRequest, quiet: bool) -> None:
        self.connection.close(b"" if quiet else self._packet(request))

    def _bin_noop(self, request: BinaryRequest, quiet: bool) -> None:
        self._respond(request)

    def _bin_version(self, request: BinaryRequest, quiet: bool) -> None:
        self._respond(request, value=VERSION)

    def _bin_verbosity(self, request: BinaryRequest, quiet: bool) -> None:
        self._respond(request)

    def _bin_stat(self, request: BinaryRequest, quiet: bool) -> None:
        if request.key and request.key != b"settings":
            self._respond(request, KEY_NOT_FOUND)
            return
        rows = self.factory.settings() if request.key else self.factory.stats()
        packets = [self._packet(request, key=name.encode(), value=str(value).encode()) for name, value in rows]
        packets.append(self._packet(request, value=b""))
        self.connection.write(b"".join(packets))

    def _bin_sasl_mechanisms(self, request: BinaryRequest, quiet: bool) -> None:
        self._respond(request, value=b"PLAIN")

    def _bin_sasl_auth(self, request: BinaryRequest, quiet: bool) -> None:
        # PLAIN: "<authzid>\0<user>\0<password>"; the password is the token.
        parts = request.value.split(b"\0")
        token = parts[2] if request.key == b"PLAIN" and len(parts) == 3 else None
        self._refused = self._packet(request, AUTH_ERROR)
        if self.connection.authenticate(token):
            self._respond(request, value=b"Authenticated")

    # -- yrmcds's locks -----------------------------------------------------------------------

    def _bin_lock(self, request: BinaryRequest, quiet: bool) -> None:
        self._outcome(request, quiet, self.store.lock(request.key, self.connection))

    def _bin_unlock(self, request: BinaryRequest, quiet: bool) -> None:
        self._outcome(request, quiet, self.store.unlock(request.key, self.connection))

    def _bin_unlock_all(self, request: BinaryRequest, quiet: bool) -> None:
        self.store.unlock_all(self.connection)
        if not quiet:
            self._respond(request)

    def _bin_lock_and_get(self, request: BinaryRequest, quiet: bool) -> None:
        with_key = request.opcode in (LAGK, LAGKQ)
        outcome = self.store.lock(request.key, self.connection)
        if outcome is Outcome.OK:
            self.factory.commands["get"] += 1
            item = (
                self.store.touch(request.key, _signed(request.extras))
                if request.extras
                else self.store.get(request.key)
            )
            assert item is not None
            self._item(request, item, with_key)
        elif outcome is Outcome.NOT_FOUND and request.opcode == LAGKQ:
            pass  # (the reference sends nothing: a GetKQ's miss)
        else:
            self._outcome(request, False, outcome)

    # -- yrmcds's listing -------------------------------------------------------------------

    def _bin_keys(self, request: BinaryRequest, quiet: bool) -> None:
        self._keys(request.key, partial(self._binary_keys, request), HEADER.size)

    def _binary_keys(self, request: BinaryRequest, keys: Sequence[bytes]) -> Iterator[bytes]:
        """A binary Keys reply: one response per key (the key only), then one with neither key nor value."""
        for key in keys:
            yield self._packet(request, key=key, value=b"")
        yield self._packet(request, value=b"")

    # == shared ==================================================================

    def _keys(self, prefix: bytes, reply: Callable[[Sequence[bytes]], Iterator[bytes]], per_key: int) -> None:
        """
        A C{Keys} reply: the store's keys that start with C{prefix}, sent as
        C{reply} words them (C{per_key} bytes a key besides the key, and as
        many for its end).  What the snapshot holds (a reference per key:
        the keys are the store's own) is charged to the server's listing
        budget (L{jesync.connections.listings}) until it has gone out,
        checked before the store is walked, by the most it could list: every
        object.  A store too small for that to fill a piece of a stream is
        walked first; a reply smaller than a piece is written at once,
        charged nothing.

        @raise LimitReached: past C{--max-listing-memory}.
        """
        listings = self.connection.policy.listings
        most = len(self.store) * REFERENCE_BYTES
        held = listings.charge(most) if most >= PIECE else None
        keys = self.store.keys(prefix)
        self._log_listing(len(keys))
        count = len(keys)
        if (count + 1) * per_key < PIECE and sum(map(len, keys)) + (count + 1) * per_key < PIECE:
            if held is not None:
                held.release()
            self.connection.write(b"".join(reply(keys)))
            return
        if held is None:
            held = listings.charge(count * REFERENCE_BYTES)
        else:
            held.release_part(held.size - count * REFERENCE_BYTES)
        self.connection.write_stream(in_pieces(reply(keys)), held)

    def _log_listing(self, count: int) -> None:
        if self.connection.verbose:
            self.log.debug("{peer} answered {count} keys", peer=self.connection.peer, count=count)

    def _flush(self, delay: int) -> None:
        self.factory.commands["flush"] += 1
        self.store.flush_later(delay)

    # -- what the connection layer says through us ---------------------------------

    def refusal(self, error: LimitReached) -> bytes:
        request = self._binary
        if request is None and self._storing is None:
            # Cut short in a frame of its first binary request (the auth
            # deadline): a binary client is answered in binary, with that
            # request's opcode and opaque, or not at all before its header.
            head = self._framing.unfinished(HEADER.size)
            if head[:1] == b"\x80":
                if len(head) < HEADER.size:
                    return b""
                _, opcode, _, _, _, _, _, opaque, _ = HEADER.unpack(head)
                request = BinaryRequest(opcode, b"", b"", b"", opaque, 0)
        if request is not None:
            return self._packet(request, TEMPORARY_FAILURE, value=str(error).encode())
        return b"SERVER_ERROR " + str(error).encode() + CRLF

    def auth_refused(self) -> bytes:
        return self._refused

    def frame_too_long(self) -> bytes:
        return b"CLIENT_ERROR line too long" + CRLF

    def closing(self) -> None:
        # (a disconnect releases every lock of the connection: they are lost)
        self.store.unlock_all(self.connection, LOST)


def _values(found: List[Tuple[bytes, int, bytes, int]], with_cas: bool) -> Iterator[bytes]:
    """A text C{get}'s reply, in pieces: each object's line and data, then C{END}."""
    for key, flags, value, cas in found:
        if with_cas:
            yield b"VALUE %s %d %d %d\r\n" % (key, flags, len(value), cas)
        else:
            yield b"VALUE %s %d %d\r\n" % (key, flags, len(value))
        yield value
        yield CRLF
    yield b"END\r\n"


def _text_keys(keys: Sequence[bytes]) -> Iterator[bytes]:
    """A text C{keys} reply: C{VALUE <key>} per key, then C{END}."""
    for key in keys:
        yield b"VALUE %s\r\n" % key
    yield b"END\r\n"


def _signed_int(value: int) -> int:
    """A binary 32-bit expiration time, as memcached reads it (signed)."""
    return value - 2**32 if value >= 2**31 else value


def _signed(extras: bytes) -> int:
    return _signed_int(struct.unpack(">I", extras[:4])[0])


# -- the binary command table ---------------------------------------------------------------

GET, SET, ADD, REPLACE, DELETE, INCREMENT, DECREMENT, QUIT, FLUSH = range(9)
GETQ, NOOP, VERSION_OP, GETK, GETKQ, APPEND, PREPEND, STAT = range(9, 17)
SETQ, ADDQ, REPLACEQ, DELETEQ, INCREMENTQ, DECREMENTQ, QUITQ, FLUSHQ, APPENDQ, PREPENDQ = range(17, 27)
VERBOSITY, TOUCH, GAT, GATQ = range(27, 31)
SASL_LIST_MECHS, SASL_AUTH, SASL_STEP, GATK, GATKQ = range(32, 37)
LOCK, LOCKQ, UNLOCK, UNLOCKQ, UNLOCK_ALL, UNLOCK_ALLQ, LAG, LAGQ, LAGK, LAGKQ, RAU, RAUQ = range(0x40, 0x4C)
KEYS = 0x50

BINARY_STORE_MODES = {
    SET: "set",
    SETQ: "set",
    ADD: "add",
    ADDQ: "add",
    REPLACE: "replace",
    REPLACEQ: "replace",
    APPEND: "append",
    APPENDQ: "append",
    PREPEND: "prepend",
    PREPENDQ: "prepend",
}

_KEY_ONLY = _Shape((0,), True, False)
_NOTHING = _Shape((0,), False, False)


def _binary_table() -> Dict[int, Tuple[str, Callable[..., None], bool, _Shape]]:
    P = MemcacheProtocol
    entries: Iterable[Tuple[str, Tuple[int, ...], Callable[..., None], _Shape]] = [
        ("get", (GET, GETQ, GETK, GETKQ), P._bin_get, _KEY_ONLY),
        ("gat", (GAT, GATQ, GATK, GATKQ), P._bin_get, _Shape((4,), True, False)),
        ("touch", (TOUCH,), P._bin_touch, _Shape((4,), True, False)),
        ("set", (SET, SETQ, ADD, ADDQ, REPLACE, REPLACEQ), P._bin_store, _Shape((8,), True, True)),
        ("append", (APPEND, APPENDQ, PREPEND, PREPENDQ), P._bin_store, _Shape((0,), True, True)),
        ("delete", (DELETE, DELETEQ), P._bin_delete, _KEY_ONLY),
        ("incr", (INCREMENT, INCREMENTQ, DECREMENT, DECREMENTQ), P._bin_delta, _Shape((20,), True, False)),
        ("quit", (QUIT, QUITQ), P._bin_quit, _NOTHING),
        ("flush", (FLUSH, FLUSHQ), P._bin_flush, _Shape((0, 4), False, False)),
        ("noop", (NOOP,), P._bin_noop, _NOTHING),
        ("version", (VERSION_OP,), P._bin_version, _NOTHING),
        ("verbosity", (VERBOSITY,), P._bin_verbosity, _Shape((4,), False, False)),
        ("stat", (STAT,), P._bin_stat, _Shape((0,), None, False)),
        ("sasl-list-mechs", (SASL_LIST_MECHS,), P._bin_sasl_mechanisms, _NOTHING),
        ("sasl-auth", (SASL_AUTH,), P._bin_sasl_auth, _Shape((0,), True, True)),
        ("lock", (LOCK, LOCKQ), P._bin_lock, _KEY_ONLY),
        ("unlock", (UNLOCK, UNLOCKQ), P._bin_unlock, _KEY_ONLY),
        # (what comes with an UnlockAll is ignored, as yrmcds does)
        ("unlock-all", (UNLOCK_ALL, UNLOCK_ALLQ), P._bin_unlock_all, _Shape(None, None, True)),
        ("lag", (LAG, LAGQ, LAGK, LAGKQ), P._bin_lock_and_get, _Shape((0, 4), True, False)),
        ("rau", (RAU, RAUQ), P._bin_store, _Shape((8,), True, True)),
        ("keys", (KEYS,), P._bin_keys, _Shape((0,), None, False)),
    ]
    quiet = {
        GETQ,
        GETKQ,
        GATQ,
        GATKQ,
        SETQ,
        ADDQ,
        REPLACEQ,
        DELETEQ,
        INCREMENTQ,
        DECREMENTQ,
        QUITQ,
        FLUSHQ,
        APPENDQ,
        PREPENDQ,
        LOCKQ,
        UNLOCKQ,
        UNLOCK_ALLQ,
        LAGQ,
        LAGKQ,
        RAUQ,
    }
    return {
        opcode: (name, handler, opcode in quiet, shape)
        for name, opcodes, handler, shape in entries
        for opcode in opcodes
    }


MemcacheProtocol.text_commands = {
    name[3:].encode(): handler for name, handler in vars(MemcacheProtocol).items() if name.startswith("do_")
}
MemcacheProtocol.text_commands.update(
    {mode.encode(): partial(MemcacheProtocol._text_storage, mode=mode) for mode in STORAGE_MODES}
)
MemcacheProtocol.text_commands.update(
    {
        b"incr": partial(MemcacheProtocol._text_delta, decrement=False),
        b"decr": partial(MemcacheProtocol._text_delta, decrement=True),
    }
)
MemcacheProtocol.binary_commands = _binary_table()


class MemcacheFactory(LockServerFactory):
    """
    Serves the memcached protocols over an object store whose locks are the
    lock service's; listen on it with any stream endpoint.

    @param store: the objects (its C{service} is the lock table shared with
        the other protocols).
    @ivar commands: commands served, by kind (C{get}, C{set}, C{touch},
        C{flush}), for C{stats}.
    """

    grammar = MemcacheProtocol

    def __init__(self, store: ObjectStore, verbose: bool = False, policy: Optional[ConnectionPolicy] = None) -> None:
        super().__init__(store.service, verbose, policy)
        self.store = store
        self.started = store.clock.seconds()
        self.connections_served = 0
        self.commands: Counter[str] = Counter()

    def buildProtocol(self, addr: object) -> LockConnection:
        self.connections_served += 1
        return super().buildProtocol(addr)

    def stats(self) -> List[Tuple[str, object]]:
        """What C{stats} answers, memcached's names first."""
        store = self.store
        now = store.clock.seconds()
        commands = self.commands
        return [
            ("pid", os.getpid()),
            ("uptime", int(now - self.started)),
            ("time", int(now)),
            ("version", VERSION.decode()),
            ("curr_connections", self.clients),
            ("total_connections", self.connections_served),
            ("cmd_get", commands["get"]),
            ("cmd_set", commands["set"]),
            ("cmd_flush", commands["flush"]),
            ("cmd_touch", commands["touch"]),
            ("get_hits", store.hits),
            ("get_misses", store.misses),
            ("curr_items", len(store)),
            ("total_items", store.total_items),
            ("bytes", store.bytes),
            ("limit_maxbytes", store.memory),
            ("evictions", store.evictions),
            ("expired", store.expired),
            ("locked_items", store.locked_items()),
        ]

    def settings(self) -> List[Tuple[str, object]]:
        """What C{stats settings} answers."""
        return [
            ("maxbytes", self.store.memory),
            ("maxconns", self.policy.connections.limit or 0),
            ("item_size_max", self.store.max_item),
            ("evictions", "on"),
            ("auth_enabled_sasl", "yes" if self.policy.auth_token is not None else "no"),
        ]


__all__ = ["MemcacheFactory", "MemcacheProtocol"]
