"""
The JESync protocol from the client's side: checking arguments, formatting
requests, splitting and parsing reply lines.  Shared by every client; which
reply answers which request is L{jesync.client.pipeline}'s business.

The coordination extensions (docs/protocols/jesync.md) read thus:

 - A holder's value is one field, percent-encoded (L{jesync.wire.encode_value}).
   A value is bytes, or a str sent as its UTF-8; an empty one is no value
   (the server keeps none).  One over the limit (L{MAX_VALUE}, 4096)
   or whose request line, the value encoded, would be longer than a server
   reads (L{MAX_LINE}: a binary value may triple) is refused here, with
   ValueError, before anything is sent.
 - C{HOLDER} and C{STATUS} lines of shared or valued holders carry extra
   trailing fields; an exclusive holder without a value has today's line.
 - C{EVENT ...} lines are unsolicited (only to a connection that watches):
   L{parse_reply} makes them a L{Reply} whose C{event} is the L{WatchEvent},
   and they answer no request.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple, Optional

from jesync.wire import (
    APPEARED,
    DISAPPEARED,
    ERROR_WORDS,
    EXCLUSIVE,
    EXPIRED,
    GRANTED,
    KEYED_REPLIES,
    LARGEST_NUMBER,
    LISTING_COMMANDS,
    LOST,
    MAX_DIGITS,
    MAX_LINE,
    MAX_TOKEN,
    MAX_VALUE,
    NEVER_EXPIRES,
    RELEASED,
    SHARED,
    WAIT_FOREVER,
    BadRequest,
    KeyStatus,
    ListingOrder,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

# The two modes of a grant (jesync.wire's), as the wire names them.
_MODE_WORDS = {b"exclusive": EXCLUSIVE, b"shared": SHARED}

# The longest request is "lock KEY N N N" with three numbers of a sign and MAX_DIGITS digits.
MAX_KEY_BYTES = MAX_LINE - len("lock ") - 3 * len(" -") - 3 * MAX_DIGITS
# The longest reply is a GRANTED-MANY naming the keys of a lock-many (which fit
# in one request line, so there are at most MAX_LINE // 2 of them), each with
# its fencing token; anything longer is not JESync.
MAX_REPLY_LINE = 2 * MAX_LINE + (MAX_LINE // 2) * len(" %d" % MAX_TOKEN)

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


class UnexpectedReply(Exception):
    """The server sent a line that is not JESync, or that answers nothing asked."""


# -- arguments -------------------------------------------------------------


def check_key(key: str) -> bytes:
    """
    A key's bytes on the wire (L{jesync.wire.encode_key}), checked: raise
    ValueError for a key the protocol cannot carry (empty, containing
    whitespace, or too long).
    """
    if not isinstance(key, str):
        raise TypeError(f"a key is a str, not {type(key).__name__}")
    raw = encode_key(key)
    if not raw:
        raise ValueError("a key cannot be empty")
    if _WHITESPACE.intersection(raw):
        raise ValueError(f"a key cannot contain whitespace: {key!r}")
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"a key is at most {MAX_KEY_BYTES} bytes")
    return raw


def whole_seconds(seconds: float, name: str) -> int:
    """
    JESync counts whole seconds: round a duration up (0.2 s waits up to 1 s,
    never less than asked for), and check it fits the protocol.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
        raise TypeError(f"{name} must be a number of seconds, not {seconds!r}")
    if seconds < 0:
        raise ValueError(f"{name} cannot be negative")
    whole = math.ceil(seconds)
    if whole > LARGEST_NUMBER:
        raise ValueError(f"{name} is at most {LARGEST_NUMBER} seconds")
    return whole


def wire_timeout(wait: float | None) -> int:
    """The protocol's C{timeout} for a wait: None waits for ever (-1), 0 does not wait."""
    return WAIT_FOREVER if wait is None else whole_seconds(wait, "wait")


def wire_expires(expires: float | None) -> int:
    """The protocol's C{expires}: None (or 0) never expires (0)."""
    return NEVER_EXPIRES if expires is None else whole_seconds(expires, "expires")


def lock_arguments(max_concurrent: int, wait: float | None, expires: float | None) -> tuple[int, int, int]:
    """A C{lock()} call's arguments as the protocol's C{max_concurrent}, C{timeout} and C{expires}."""
    return check_max_concurrent(max_concurrent), wire_timeout(wait), wire_expires(expires)


def lock_many_arguments(
    keys: Iterable[str], wait: float | None, expires: float | None, shared: bool = False
) -> tuple[tuple[str, ...], int, int]:
    """
    A C{lock_many()} call's arguments as the distinct keys in the order given
    (as the server counts them: a key given twice counts once), the
    protocol's C{timeout} and C{expires}; raise ValueError for no keys, or
    for more than one C{lock-many} (C{lock-many-shared}) line can carry.
    """
    distinct = distinct_keys(keys)
    timeout, expires_ = wire_timeout(wait), wire_expires(expires)
    lock_many_request(distinct, timeout, expires_, shared)  # checks that the line fits
    return distinct, timeout, expires_


def check_shared(shared: bool, max_concurrent: int = 1) -> bool:
    """C{shared}, checked: a bool, and a shared lock has no C{max_concurrent} (ValueError)."""
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be True or False, not {shared!r}")
    if shared and max_concurrent != 1:
        raise ValueError("a shared lock takes no max_concurrent: any number of shared holders share it")
    return shared


def check_value(value: bytes | str | None) -> Optional[bytes]:
    """
    A holder's value as bytes (a str as its UTF-8), or None for no value
    (None or empty); TypeError for anything else, ValueError for one over
    L{MAX_VALUE}.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    elif not isinstance(value, bytes):
        raise TypeError(f"a value is bytes or str, not {type(value).__name__}")
    if len(value) > MAX_VALUE:
        # (the client's own words, not the server's VALUE_TOO_LONG: `jesync lock --value` prints them)
        raise ValueError(f"a value is at most {MAX_VALUE} bytes")
    return value or None


def lock_value(key: str, value: bytes | str | None, shared: bool) -> Optional[bytes]:
    """
    A C{lock()} call's value (L{check_value}), checked to fit its request
    line with the longest numbers: raise ValueError if it does not.
    """
    checked = check_value(value)
    if checked is not None:
        if shared:
            lock_shared_request(key, -LARGEST_NUMBER, -LARGEST_NUMBER, checked)
        else:
            lock_request(key, LARGEST_NUMBER, -LARGEST_NUMBER, -LARGEST_NUMBER, checked)
    return checked


def distinct_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """The keys of a multi-key lock, each once, in the order given; each checked (L{check_key})."""
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list (or any iterable) of keys, not one key")
    distinct = tuple(dict.fromkeys(keys))
    if not distinct:
        raise ValueError("lock_many needs at least one key")
    for key in distinct:
        check_key(key)
    return distinct


def check_max_concurrent(max_concurrent: int) -> int:
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
        raise TypeError(f"max_concurrent must be an int, not {max_concurrent!r}")
    if not 1 <= max_concurrent <= LARGEST_NUMBER:
        raise ValueError(f"max_concurrent must be from 1 to {LARGEST_NUMBER}")
    return max_concurrent


# -- requests --------------------------------------------------------------


def lock_request(key: str, max_concurrent: int, timeout: int, expires: int, value: Optional[bytes] = None) -> bytes:
    """C{lock <key> <max_concurrent> <timeout> <expires>[ <value>]}; ValueError if the line is too long."""
    line = b"lock %s %d %d %d" % (check_key(key), max_concurrent, timeout, expires)
    return _with_value(line, value)


def lock_shared_request(key: str, timeout: int, expires: int, value: Optional[bytes] = None) -> bytes:
    """C{lock-shared <key> <timeout> <expires>[ <value>]}; ValueError if the line is too long."""
    return _with_value(b"lock-shared %s %d %d" % (check_key(key), timeout, expires), value)


def _with_value(line: bytes, value: Optional[bytes]) -> bytes:
    if value:
        line += b" " + encode_value(value)
        if len(line) > MAX_LINE:
            raise ValueError(
                f"the value is too long: the request line, with the value percent-encoded, "
                f"would be longer than {MAX_LINE} bytes"
            )
    return line + b"\n"


def lock_many_request(keys: tuple[str, ...], timeout: int, expires: int, shared: bool = False) -> bytes:
    """
    C{lock-many <timeout> <expires> <key>...} (C{lock-many-shared} if
    C{shared}); ValueError if the line is longer than a server reads.
    """
    command = b"lock-many-shared" if shared else b"lock-many"
    line = b"%s %d %d %s" % (command, timeout, expires, b" ".join(check_key(key) for key in keys))
    if len(line) > MAX_LINE:
        raise ValueError(f"too many keys, or keys too long, for one lock-many request ({MAX_LINE} bytes at most)")
    return line + b"\n"


def watch_arguments(key: Optional[str], prefix: Optional[str]) -> tuple[str, bool]:
    """
    A C{watch()} call's arguments, checked: what it watches, and whether
    that is a prefix.  Exactly one of a key and a prefix (which may be
    C{""}: every key) is given.
    """
    if (key is None) == (prefix is None):
        raise TypeError("watch takes a key, or a prefix= (\"\" for every key), not both")
    if prefix is None:
        assert key is not None
        check_key(key)
        return key, False
    if not isinstance(prefix, str):
        raise TypeError(f"a prefix is a str, not {type(prefix).__name__}")
    check_prefix(prefix)
    return prefix, True


def check_prefix(prefix: str) -> bytes:
    """A prefix's bytes on the wire: as a key's (L{check_key}), but empty is allowed (every key)."""
    return check_key(prefix) if prefix != "" else b""


def watch_request(key: str, prefix: bool) -> bytes:
    """C{watch <key>}, or C{watch-prefix [<prefix>]} (no prefix: every key)."""
    return _watch_line(b"watch", key, prefix)


def unwatch_request(key: str, prefix: bool) -> bytes:
    """C{unwatch <key>}, or C{unwatch-prefix [<prefix>]}."""
    return _watch_line(b"unwatch", key, prefix)


def _watch_line(command: bytes, key: str, prefix: bool) -> bytes:
    if not prefix:
        return b"%s %s\n" % (command, check_key(key))
    raw = check_prefix(key)
    return b"%s-prefix %s\n" % (command, raw) if raw else command + b"-prefix\n"


def auth_request(token: bytes) -> bytes:
    """C{auth <token>}: the first line on a connection to a server with a token (answered C{OK})."""
    if not token or _WHITESPACE.intersection(token) or len(token) > MAX_LINE - len("auth "):
        raise ValueError("an auth token is one word, without whitespace, and fits one request line")
    return b"auth %s\n" % token


def fencing_request(on: bool) -> bytes:
    """
    C{fencing on} asks for a fencing token on every grant; C{fencing off}
    stops (an extension: a server without it answers C{INVALID_COMMAND}).
    """
    return b"fencing on\n" if on else b"fencing off\n"


def release_request(key: str) -> bytes:
    return b"release %s\n" % check_key(key)


#: The key C{ping} asks the status of (asking changes nothing on the server).
PING_KEY = "jesync.ping"


def status_request(key: str) -> bytes:
    return b"status %s\n" % check_key(key)


def owned_request(key: str) -> bytes:
    """C{owned <key>}: whether this connection holds the key (C{OWNED <ms_left> <key>} or C{NOT_OWNED <key>})."""
    return b"owned %s\n" % check_key(key)


def holders_request(key: str) -> bytes:
    """C{holders <key>}: a C{HOLDER} line per holder of the key, then C{END}."""
    return b"holders %s\n" % check_key(key)


def listing_request(order: ListingOrder) -> bytes:
    try:
        return LISTING_COMMANDS[order] + b"\n"
    except KeyError:
        raise ValueError(f"unknown listing order {order!r}: choose one of {', '.join(LISTING_COMMANDS)}") from None


# -- replies ---------------------------------------------------------------


class Holder(NamedTuple):
    """
    One holder of a key, as C{holders} reports it: C{peer} is its address
    (C{host:port}, C{[v6addr]:port}, C{unix:...}, or C{detached-session}
    for an elock session in its grace period); C{held_seconds} the whole
    seconds since it was granted (renewals do not reset it);
    C{seconds_left} the whole seconds until its failsafe expiry, as in
    C{GRANTED} (0: it never expires, or has less than half a second left);
    C{token} the grant's fencing token; C{mode} C{"exclusive"} or
    C{"shared"}; C{value} the value its holder set (bytes), or None.
    """

    key: str
    peer: str
    held_seconds: int
    seconds_left: int
    token: int
    mode: str = EXCLUSIVE
    value: Optional[bytes] = None

    @property
    def shared(self) -> bool:
        return self.mode == SHARED


#: The kinds of watch events (jesync.wire's; the lower-case words of C{EVENT} lines) that name
#: a holder (its peer and token); the others are a prefix watch's keys entering and leaving.
HOLDER_EVENTS = frozenset({GRANTED, RELEASED, EXPIRED, LOST})
KEY_EVENTS = frozenset({APPEARED, DISAPPEARED})


class WatchEvent(NamedTuple):
    """
    One change a watch reports (an C{EVENT} line): C{kind} is one of
    C{"granted"}, C{"released"}, C{"expired"} (its failsafe expiry passed),
    C{"lost"} (its owner went away), or, for a prefix watch only,
    C{"appeared"} and C{"disappeared"} (the key entered or left the lock
    table).  C{holder} (the peer, as L{Holder}'s) and C{token} are the
    holder's, None for C{appeared} and C{disappeared}; C{mode} and C{value}
    come with C{granted} only (C{value} None if it has none), else None.
    """

    kind: str
    key: str
    holder: Optional[str] = None
    token: Optional[int] = None
    mode: Optional[str] = None
    value: Optional[bytes] = None

    def as_dict(self) -> dict[str, Any]:
        """
        The event as JSON can carry it: the value as text if it is UTF-8,
        else with each byte that is not as C{\\xNN} (what C{jesync watch
        --json} prints).
        """
        value = None if self.value is None else self.value.decode("utf-8", "backslashreplace")
        key = encode_key(self.key).decode("utf-8", "backslashreplace")
        return {
            "kind": self.kind,
            "key": key,
            "holder": self.holder,
            "token": self.token,
            "mode": self.mode,
            "value": value,
        }


#: The replies to a C{lock-many}, which name its keys.
MANY_REPLIES = frozenset({"GRANTED-MANY", "TIMEOUT-MANY"})


class Reply(NamedTuple):
    """
    One reply line.  C{word} is its first field (C{GRANTED}, C{STATUS},
    C{INVALID_PARAMETER:}, ...); C{status} is the key's status for the words
    that carry one; C{seconds_left} only for C{GRANTED} and C{GRANTED-MANY};
    C{text} the line.

    C{keys} are the keys the line names, in order: its one key, or a
    C{lock-many}'s keys for C{GRANTED-MANY} and C{TIMEOUT-MANY}.  C{tokens}
    are the fencing tokens of a C{GRANTED} (one) or C{GRANTED-MANY} (one per
    key), None where the server sent none (fencing off, or a server without
    fencing); empty for every other word.  C{fencing} is C{FENCING}'s
    setting (True for C{ON}).
    """

    word: str
    status: Optional[KeyStatus]
    seconds_left: Optional[int]
    text: str
    keys: tuple[str, ...] = ()
    tokens: tuple[Optional[int], ...] = ()
    fencing: Optional[bool] = None
    #: C{OWNED}'s milliseconds until the failsafe expiry (-1: none)
    ms_left: Optional[int] = None
    #: a C{HOLDER} line's holder
    holder: Optional[Holder] = None
    #: a C{STATUS} line's: whether the key's holders are shared
    shared: bool = False
    #: an C{EVENT} line's event
    event: Optional[WatchEvent] = None

    @property
    def key(self) -> Optional[str]:
        """The key the line names (a C{lock-many} reply's first key)."""
        return self.keys[0] if self.keys else None

    @property
    def token(self) -> Optional[int]:
        """A C{GRANTED}'s fencing token (None if it has none)."""
        return self.tokens[0] if self.tokens else None


def parse_reply(line: bytes) -> Reply:
    """Parse one reply line (without its newline); raise L{UnexpectedReply} if it is not JESync."""
    if line.endswith(b"\r"):
        line = line[:-1]
    text = line.decode("utf-8", "replace")
    fields = line.split()
    word = fields[0].decode("ascii", "replace") if fields else ""
    try:
        if word in ("END", "OK") and len(fields) == 1:
            return Reply(word, None, None, text)
        if word in ERROR_WORDS:
            return Reply(word, None, None, text)
        if word in MANY_REPLIES:
            return _many_reply(word, fields[1:], text)
        if word == "OWNED" and len(fields) == 3 and int(fields[1]) >= -1:
            return Reply(word, None, None, text, (decode_key(fields[2]),), ms_left=int(fields[1]))
        if word == "NOT_OWNED" and len(fields) == 2:
            return Reply(word, None, None, text, (decode_key(fields[1]),))
        if word == "HOLDER" and len(fields) >= 6:
            return _holder_reply(fields, text)
        if word == "FENCING" and len(fields) == 2 and fields[1] in (b"ON", b"OFF"):
            return Reply(word, None, None, text, fencing=fields[1] == b"ON")
        if word == "EVENT":
            return _event_reply(fields, text)
        if word in WATCH_REPLIES and len(fields) == 2:
            return Reply(word, None, None, text, (decode_key(fields[1]),))
        if word in PREFIX_WATCH_REPLIES and len(fields) <= 2:
            return Reply(word, None, None, text, (decode_key(fields[1]) if len(fields) == 2 else "",))
        if word == "STATUS" and len(fields) == 5 and fields[4] == b"shared":
            key = decode_key(fields[3])
            return Reply(word, KeyStatus(key, int(fields[1]), int(fields[2])), None, text, (key,), shared=True)
        shape = KEYED_REPLIES.get(word)
        if shape is None or not shape[0] <= len(fields) - 1 <= shape[1]:
            raise ValueError(word)
        key = decode_key(fields[3])
        status = KeyStatus(key, int(fields[1]), int(fields[2]))
        if word != "GRANTED":
            return Reply(word, status, None, text, (key,))
        token = _token(fields[5]) if len(fields) == 6 else None
        return Reply(word, status, int(fields[4]), text, (key,), (token,))
    except (ValueError, BadRequest):
        raise UnexpectedReply(f"not a JESync reply: {text!r}") from None


#: The replies to C{watch} and C{unwatch} (naming the key), and to C{watch-prefix} and C{unwatch-prefix}
#: (naming the prefix, or nothing for every key).
WATCH_REPLIES = frozenset({"WATCHING", "UNWATCHED", "NOT_WATCHING"})
PREFIX_WATCH_REPLIES = frozenset({"WATCHING-PREFIX", "UNWATCHED-PREFIX", "NOT_WATCHING-PREFIX"})


def _holder_reply(fields: list[bytes], text: str) -> Reply:
    """
    C{HOLDER <key> <peer> <held_seconds> <seconds_left> <token>}, then
    C{shared} for a shared holder without a value, or C{<mode> <value>} for
    one with a value (a peer may contain spaces); ValueError if not.
    """
    mode, value = EXCLUSIVE, None
    if len(fields) >= 7 and fields[-1] == b"shared" and _are_numbers(fields[-4:-1]):
        mode, fields = SHARED, fields[:-1]
    elif len(fields) >= 8 and fields[-2] in _MODE_WORDS and _are_numbers(fields[-5:-2]):
        mode, value, fields = _MODE_WORDS[fields[-2]], decode_value(fields[-1]), fields[:-2]
    key = decode_key(fields[1])
    peer = b" ".join(fields[2:-3]).decode("utf-8", "replace")
    held, left = int(fields[-3]), int(fields[-2])
    if held < 0 or left < 0 or not peer:
        raise ValueError("HOLDER")
    holder = Holder(key, peer, held, left, _token(fields[-1]), mode, value or None)
    return Reply("HOLDER", None, None, text, (key,), holder=holder)


def _are_numbers(fields: list[bytes]) -> bool:
    return all(field.lstrip(b"-").isdigit() for field in fields)


def _event_reply(fields: list[bytes], text: str) -> Reply:
    """
    C{EVENT GRANTED <key> <peer> <token> <mode>[ <value>]}, C{EVENT
    RELEASED|EXPIRED|LOST <key> <peer> <token>}, C{EVENT APPEARED|DISAPPEARED
    <key>}; ValueError if not.
    """
    kind = fields[1].decode("ascii", "replace").lower() if len(fields) > 1 and fields[1].isupper() else ""
    if kind in KEY_EVENTS and len(fields) == 3:
        event = WatchEvent(kind, decode_key(fields[2]))
    elif kind == GRANTED and len(fields) in (6, 7) and fields[5] in _MODE_WORDS:
        value = decode_value(fields[6]) or None if len(fields) == 7 else None
        peer = fields[3].decode("utf-8", "replace")
        event = WatchEvent(kind, decode_key(fields[2]), peer, _token(fields[4]), _MODE_WORDS[fields[5]], value)
    elif kind in HOLDER_EVENTS and kind != GRANTED and len(fields) == 5:
        event = WatchEvent(kind, decode_key(fields[2]), fields[3].decode("utf-8", "replace"), _token(fields[4]))
    else:
        raise ValueError("EVENT")
    return Reply("EVENT", None, None, text, (event.key,), event=event)


def _many_reply(word: str, fields: list[bytes], text: str) -> Reply:
    """
    C{GRANTED-MANY <n> <seconds_left> <key>... [<token>...]} or
    C{TIMEOUT-MANY <n> <key>...} (C{fields} after the word); ValueError if
    it is not one.
    """
    count = int(fields[0]) if fields else 0
    if count < 1:
        raise ValueError(word)
    if word == "TIMEOUT-MANY":
        if len(fields) != 1 + count:
            raise ValueError(word)
        return Reply(word, None, None, text, tuple(decode_key(field) for field in fields[1:]))
    seconds_left = int(fields[1]) if len(fields) > 1 else None
    keys = tuple(decode_key(field) for field in fields[2 : 2 + count])
    if len(fields) == 2 + count:
        tokens: tuple[Optional[int], ...] = (None,) * count
    elif len(fields) == 2 + 2 * count:
        tokens = tuple(_token(field) for field in fields[2 + count :])
    else:
        raise ValueError(word)
    return Reply(word, None, seconds_left, text, keys, tokens)


def _token(field: bytes) -> int:
    """A fencing token: a non-negative 64-bit integer in decimal (ValueError if not)."""
    if not field.isdigit() or len(field) > len(str(MAX_TOKEN)) or int(field) > MAX_TOKEN:
        raise ValueError(field)
    return int(field)


class LineSplitter:
    """Cuts a byte stream into lines; refuses a line that grows beyond L{MAX_REPLY_LINE}."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        if len(self._buffer) > MAX_REPLY_LINE:
            raise UnexpectedReply(f"a reply line longer than {MAX_REPLY_LINE} bytes")
        return lines

