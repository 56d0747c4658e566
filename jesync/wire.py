"""
What the server and its clients agree on about the line protocols' bytes:
how a line splits into fields, what a key and a number may be, and the
JESync reply lines.  No I/O and nothing from Twisted: the clients import this
module, never the server's.

The rules (docs/protocols/index.md says them to users):

 - A line is at most L{MAX_LINE} bytes, not counting its C{\\n} and one
   C{\\r} before it.
 - Fields are separated by runs of space, tab, vertical tab and form feed.
   A C{\\r} anywhere else in a line is not a separator: it stays inside its
   field, so a number with one is not a number and a key with one is refused
   (L{check_key_field}): a key must be echoed back on one reply line.
 - Keys are opaque bytes, kept in the lock table as text with any bytes that
   are not UTF-8 as surrogate escapes (L{decode_key}), so every byte string
   is a distinct key and is echoed back exactly as it was sent.
 - A number is an optional C{-} and 1 to L{MAX_DIGITS} decimal digits, within
   +-L{LARGEST_NUMBER} (JESync's clients use 32-bit integers).
 - A holder's value (arbitrary bytes, at most L{MAX_VALUE}) is one
   field, percent-encoded (L{encode_value}): the printable ASCII bytes
   C{!} to C{~} but C{%} stand for themselves, every other byte is C{%XX},
   two upper-case hex digits.  So any bytes fit one field of one line,
   and a value made of plain words reads as itself.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

MAX_LINE = 8192
LARGEST_NUMBER = 2**31 - 1
MAX_DIGITS = len(str(LARGEST_NUMBER))

# JESync's lock defaults, and what its numbers mean.
WAIT_FOREVER = -1
DEFAULT_EXPIRES = 120
NEVER_EXPIRES = 0

FIELD_SEPARATORS = b" \t\x0b\x0c"
_SEPARATOR_RUN = re.compile(rb"[ \t\x0b\x0c]+")
_NUMBER = re.compile(rb"-?([0-9]+)")

ListingOrder = Literal["key", "requests", "grants"]

#: The JESync listing command for each order.
LISTING_COMMANDS: dict[str, bytes] = {
    "key": b"status-by-key",
    "requests": b"status-by-requests",
    "grants": b"status-by-grants",
}


class KeyStatus(NamedTuple):
    """How many owners hold a key and how many wait for it."""

    key: str
    granted: int
    waiting: int


class BadRequest(Exception):
    """A request's arguments are wrong; the message says how (it is sent to the client)."""


#: The two modes of a request and a grant.
EXCLUSIVE = "exclusive"
SHARED = "shared"
#: The longest holder value, in bytes (decoded): the lock service's limit.
MAX_VALUE = 4096
VALUE_TOO_LONG = f"A value should be at most {MAX_VALUE} bytes"

#: The kinds of a watch's events: a holder granted, released, expired, lost
#: (its owner went away); a key entered or left the table (prefix watches).
GRANTED = "granted"
RELEASED = "released"
EXPIRED = "expired"
LOST = "lost"
APPEARED = "appeared"
DISAPPEARED = "disappeared"

# The bytes a value field carries as themselves: ! to ~ except %.
_PLAIN_VALUE_BYTES = frozenset(range(0x21, 0x7F)) - {ord("%")}
_VALUE_BYTE_FIELDS = [bytes([byte]) if byte in _PLAIN_VALUE_BYTES else b"%%%02X" % byte for byte in range(256)]
_NEEDS_ESCAPE = re.compile(rb"[^!-$&-~]")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")


def _unescape(match: re.Match[bytes]) -> bytes:
    return bytes([int(match.group(1), 16)])


def encode_value(value: bytes) -> bytes:
    """A holder's value as one field of a line: percent-encoded (see the module's rules)."""
    if _NEEDS_ESCAPE.search(value) is None:
        return value  # (plain words: the common case)
    fields = _VALUE_BYTE_FIELDS
    return b"".join([fields[byte] for byte in value])


def decode_value(field: bytes) -> bytes:
    """
    A percent-encoded value field as its bytes; L{BadRequest} for a field
    that is not percent-encoded (a C{%} without two hex digits, a byte that
    should have been escaped) or a value over L{MAX_VALUE}.  Lower-case
    hex digits are accepted (what is read is lenient; what is written is not).
    """
    escaped = b"%" in field
    if _NEEDS_ESCAPE.search(_ESCAPE.sub(b"", field) if escaped else field) is not None:
        raise BadRequest("value is not percent-encoded")
    value = _ESCAPE.sub(_unescape, field) if escaped else field
    if len(value) > MAX_VALUE:
        raise BadRequest(VALUE_TOO_LONG)
    return value


def decode_key(field: bytes) -> str:
    """A key's bytes on the wire as the key in the lock table."""
    return field.decode("utf-8", "surrogateescape")


def encode_key(key: str) -> bytes:
    """A key in the lock table as its bytes on the wire."""
    return key.encode("utf-8", "surrogateescape")


def split_fields(line: bytes) -> list[bytes]:
    """A line's fields: runs of L{FIELD_SEPARATORS} separate them, C{\\r} does not."""
    if b"\r" not in line:
        return line.split()  # the fast path: bytes.split() also splits on \r
    stripped = line.strip(FIELD_SEPARATORS)
    return _SEPARATOR_RUN.split(stripped) if stripped else []


def check_key_field(field: bytes, name: str = "key") -> bytes:
    """A key (or id) argument as sent, or L{BadRequest} if it holds a C{\\r}."""
    if b"\r" in field:
        raise BadRequest(f"a {name} cannot contain a carriage return")
    return field


# Whitespace (str.isspace's, which includes the line and paragraph
# separators) and control characters (Unicode's Cc).
_WHITESPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def key_problem(key: str, max_length: int) -> str | None:
    """
    Why C{key} is not a key of jesync's key space, or None: a key is a
    non-empty string without whitespace or control characters, of at most
    C{max_length} bytes in UTF-8 (what JESync's and elock's lines can carry
    too, so every protocol can name every key).
    """
    if not key:
        return "a key cannot be empty"
    if (len(key) if key.isascii() else len(key.encode("utf-8", "surrogatepass"))) > max_length:
        return f"max-key-length exceeded ({max_length})"
    # (isprintable() is True for most keys and rules out both at once;
    # it also refuses a few characters that are neither, hence the search)
    if not (key.isprintable() and " " not in key) and _WHITESPACE_OR_CONTROL.search(key):
        return f"a key cannot contain whitespace or control characters: {key!r}"
    return None


def parse_integer(field: bytes, name: str) -> int:
    """A number field (see the module's rules), or L{BadRequest} naming the field."""
    match = _NUMBER.fullmatch(field)
    if match is None:
        raise BadRequest(f"{name} is not an integer")
    if len(match.group(1)) > MAX_DIGITS:
        raise BadRequest(f"{name} is out of range")
    value = int(field)
    if abs(value) > LARGEST_NUMBER:
        raise BadRequest(f"{name} is out of range")
    return value


def only_argument(args: list[bytes], name: str) -> bytes:
    """The one argument of a command that takes exactly one."""
    if not args:
        raise BadRequest(f"missing {name}")
    if len(args) > 1:
        raise BadRequest("too many arguments")
    return args[0]


def no_arguments(args: list[bytes]) -> None:
    if args:
        raise BadRequest("too many arguments")


# -- JESync replies --------------------------------------------------------

#: The JESync reply words that name a key, and how many fields follow the
#: word (the fewest and the most).
KEYED_REPLIES: dict[str, tuple[int, int]] = {
    "GRANTED": (4, 5),  # a fencing token follows once a connection sends `fencing on`
    "TIMEOUT": (3, 3),
    "RELEASED": (3, 4),  # JESync 0.8.1 added the seconds that were left
    "NOT_RELEASED": (3, 3),
    "STATUS": (3, 3),
    "EXPIRED": (3, 4),  # JESync 0.8.1 only, unsolicited
}
ERROR_WORDS = frozenset({"INVALID_COMMAND", "INVALID_PARAMETER:", "INVALID_PARAMETER"})


def status_reply(word: bytes, granted: int, waiting: int, raw_key: bytes) -> bytes:
    """C{<word> <granted> <waiting> <key>}: TIMEOUT, RELEASED, NOT_RELEASED, STATUS."""
    return b"%s %d %d %s" % (word, granted, waiting, raw_key)


def granted_reply(granted: int, waiting: int, raw_key: bytes, seconds_left: int) -> bytes:
    return b"GRANTED %d %d %s %d" % (granted, waiting, raw_key, seconds_left)


#: The longest fencing token: a 64-bit unsigned integer.
MAX_TOKEN = 2**64 - 1


# -- Coordination names in the one key space ------------------------------
# (docs/coordination.md says them to users; jesync/groups.py keeps the
# server's rules over them, the clients name the same keys through these.)

#: What separates a group's key from a member's id in a member's key.
MEMBER_SEPARATOR = "/"
GROUP_PREFIX = "group:"
ELECTION_PREFIX = "election:"


def group_key(name: str) -> str:
    """The key that stands for group C{name} while it exists: C{group:<name>}."""
    return GROUP_PREFIX + name


def member_key(name: str, member: str) -> str:
    """The key a member of group C{name} holds while it is one: C{group:<name>/<member>}."""
    return group_key(name) + MEMBER_SEPARATOR + member


def election_key(name: str) -> str:
    """The key whose holder leads election C{name}: C{election:<name>}."""
    return ELECTION_PREFIX + name


__all__ = [
    "BadRequest",
    "ELECTION_PREFIX",
    "GROUP_PREFIX",
    "KeyStatus",
    "MEMBER_SEPARATOR",
    "ListingOrder",
    "check_key_field",
    "decode_key",
    "decode_value",
    "election_key",
    "encode_value",
    "group_key",
    "key_problem",
    "member_key",
    "encode_key",
    "parse_integer",
    "split_fields",
]
