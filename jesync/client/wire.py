"""
The JESync protocol from the client's side: checking arguments, formatting
requests, splitting and parsing reply lines.  Shared by every client; which
reply answers which request is L{jesync.client.pipeline}'s business.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from jesync.wire import (
    ERROR_WORDS,
    KEYED_REPLIES,
    LARGEST_NUMBER,
    LISTING_COMMANDS,
    MAX_DIGITS,
    MAX_LINE,
    NEVER_EXPIRES,
    WAIT_FOREVER,
    KeyStatus,
    ListingOrder,
    decode_key,
    encode_key,
)

# The longest request is "lock KEY N N N" with three numbers of a sign and MAX_DIGITS digits.
MAX_KEY_BYTES = MAX_LINE - len("lock ") - 3 * len(" -") - 3 * MAX_DIGITS
# Listing lines are at most a key plus a few numbers; anything far longer is not JESync.
MAX_REPLY_LINE = 2 * MAX_LINE

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


def check_max_concurrent(max_concurrent: int) -> int:
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
        raise TypeError(f"max_concurrent must be an int, not {max_concurrent!r}")
    if not 1 <= max_concurrent <= LARGEST_NUMBER:
        raise ValueError(f"max_concurrent must be from 1 to {LARGEST_NUMBER}")
    return max_concurrent


# -- requests --------------------------------------------------------------


def lock_request(key: str, max_concurrent: int, timeout: int, expires: int) -> bytes:
    return b"lock %s %d %d %d\n" % (check_key(key), max_concurrent, timeout, expires)


def release_request(key: str) -> bytes:
    return b"release %s\n" % check_key(key)


#: The key C{ping} asks the status of (asking changes nothing on the server).
PING_KEY = "jesync.ping"


def status_request(key: str) -> bytes:
    return b"status %s\n" % check_key(key)


def listing_request(order: ListingOrder) -> bytes:
    try:
        return LISTING_COMMANDS[order] + b"\n"
    except KeyError:
        raise ValueError(f"unknown listing order {order!r}: choose one of {', '.join(LISTING_COMMANDS)}") from None


# -- replies ---------------------------------------------------------------


class Reply(NamedTuple):
    """
    One reply line.  C{word} is its first field (C{GRANTED}, C{STATUS},
    C{INVALID_PARAMETER:}, ...); C{status} is the key's status for the words
    that carry one; C{seconds_left} only for C{GRANTED}; C{text} the line.
    """

    word: str
    status: KeyStatus | None
    seconds_left: int | None
    text: str

    @property
    def key(self) -> str | None:
        return None if self.status is None else self.status.key


def parse_reply(line: bytes) -> Reply:
    """Parse one reply line (without its newline); raise L{UnexpectedReply} if it is not JESync."""
    if line.endswith(b"\r"):
        line = line[:-1]
    text = line.decode("utf-8", "replace")
    fields = line.split()
    word = fields[0].decode("ascii", "replace") if fields else ""
    if word == "END" and len(fields) == 1:
        return Reply(word, None, None, text)
    if word in ERROR_WORDS:
        return Reply(word, None, None, text)
    shape = KEYED_REPLIES.get(word)
    if shape is None or not shape[0] <= len(fields) - 1 <= shape[1]:
        raise UnexpectedReply(f"not a JESync reply: {text!r}")
    try:
        granted, waiting = int(fields[1]), int(fields[2])
        seconds_left = int(fields[4]) if word == "GRANTED" else None
    except ValueError:
        raise UnexpectedReply(f"not a JESync reply: {text!r}") from None
    return Reply(word, KeyStatus(decode_key(fields[3]), granted, waiting), seconds_left, text)


class LineSplitter:
    """Cuts a byte stream into lines; refuses a line that grows beyond L{MAX_REPLY_LINE}."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        if len(self._buffer) > MAX_REPLY_LINE:
            raise UnexpectedReply(f"a reply line longer than {MAX_REPLY_LINE} bytes")
        return lines

