"""
The fuzz tests' byte streams, for both wire protocols (hypothesis strategies:
random bytes, token soup, and valid command streams with bytes flipped,
inserted and deleted), the chunks they are sent in, and the replies each
protocol may answer with: for L{tests.unit.test_fuzz} (over
L{StringTransport}s) and L{tests.tcp.test_fuzz} (over real TCP).
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

MAX_LINE = 8192
MAX_KEY = 1024
# Seconds: longer than any wait, expiry or grace period a stream can ask for.
FOREVER = 2**33

FUZZ = settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# -- streams -------------------------------------------------------------------

# Keys the pre-existing clients hold (see tests.unit.test_fuzz.Harness), keys nobody holds, odd
# bytes, and one over the maximum key length.
KEYS = [b"a", b"b", b"c", b"k", b"\xff\xfe", b"\xc3\xa9", b"\x00", b"k\x1f", b"K" * (MAX_KEY + 1)]
NUMBERS = [
    b"1", b"0", b"-1", b"2", b"3", b"5", b"-2", b"00", b"+1", b"1.5", b"x", b"0x1",
    b"2147483647", b"2147483648", b"-2147483647", b"-2147483648", b"99999999999", b"9" * 40,
]  # fmt: skip
WHITESPACE = [b" ", b"  ", b"\t", b"\x0b", b"\x0c", b" \t "]

keys = st.sampled_from(KEYS)
numbers = st.sampled_from(NUMBERS)


def command(words: list[str], arguments: st.SearchStrategy[list[bytes]]):
    """A command line: a word and its arguments, whitespace between and maybe around."""
    return st.builds(
        lambda word, args, spaces, lead, trail: lead + spaces.join([word, *args]) + trail,
        st.sampled_from([w.encode() for w in words]),
        arguments,
        st.sampled_from(WHITESPACE),
        st.sampled_from([b"", b"", b"", b" ", b"\t"]),
        st.sampled_from([b"", b"", b"", b" ", b"\r"]),
    )


def key_then(numbers_: st.SearchStrategy[bytes], most: int) -> st.SearchStrategy[list[bytes]]:
    """Mostly a key and numbers; sometimes no key, or anything."""
    return st.one_of(
        st.builds(lambda key, rest: [key, *rest], keys, st.lists(numbers_, max_size=most)),
        st.builds(lambda key, rest: [key, *rest], keys, st.lists(numbers_, max_size=most)),
        st.lists(st.one_of(keys, numbers), max_size=most + 2),
    )


# Arguments for a command that takes none: mostly none.
no_arguments = st.sampled_from([[], [], [], [b"a"], [b"1"]])
valid_numbers = st.sampled_from(NUMBERS[:6])

jesync_commands = st.one_of(
    command(["lock"], key_then(valid_numbers, 4)),
    command(["lock"], key_then(numbers, 4)),
    command(["release", "status", "holders"], key_then(numbers, 1)),
    command(["status-by-key", "status-by-requests", "status-by-grants", "auth"], no_arguments),
    # (a quit ends the stream: valid_stream may end with one)
    command(["LOCK", "bogus", "echo", "", "stats", "quit"], st.lists(keys, min_size=1, max_size=2)),
)
elock_commands = st.one_of(
    command(["lock"], key_then(valid_numbers, 1)),
    command(["lock", "unlock"], key_then(numbers, 1)),
    command(["unlock_all", "stats", "conn_id"], no_arguments),
    command(["conn_id", "set_timeout"], st.lists(st.one_of(numbers, keys, st.just(b"i" * 257)), max_size=2)),
    command(["auth", "LOCK", "echo", "bogus", "", "status"], st.lists(keys, max_size=2)),
    command(["quit"], st.lists(keys, min_size=1, max_size=2)),
)


def valid_stream(commands) -> st.SearchStrategy[bytes]:
    """Commands, each ended by \\n or \\r\\n; the stream may end with quit, or mid-line."""
    return st.builds(
        lambda lines, ends, last: b"".join(line + ends[i % len(ends)] for i, line in enumerate(lines)) + last,
        st.lists(commands, min_size=3, max_size=25),
        st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=1, max_size=4),
        st.sampled_from([b"", b"", b"", b"", b"quit\n", b"quit\r\n", b"status a", b"lock"]),
    )


# Inserted by mutations: line ends alone and misplaced, NULs, invalid UTF-8,
# lines at and over the length limit, and one longer than the read-ahead
# (64 KiB) of an elock connection that is holding.
TOKENS = [
    b"\n", b"\r", b"\r\n", b"\n\n", b"\r\r\n", b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b" ", b"\t",
    b"lock a\n", b"lock b 1 1\n", b"lock c 5\n", b"quit\n", b"status-by-key\n", b"stats\n", b"holders a\n",
    b"x" * MAX_LINE, b"y" * (MAX_LINE + 1), b"z" * (MAX_LINE + 2), b"w" * 70_000,
    # whole lines at the limit and just over it, with and without \r
    b"\nstatus " + b"s" * (MAX_LINE - 7) + b"\r\n", b"\nstatus " + b"s" * (MAX_LINE - 7) + b"\n",
    b"\nstatus " + b"s" * (MAX_LINE - 6) + b"\r\n", b"\nstatus " + b"s" * (MAX_LINE - 6) + b"\n",
]  # fmt: skip


@st.composite
def mutated(draw, base: st.SearchStrategy[bytes]) -> bytes:
    """C{base} with bytes flipped, inserted (or tokens) and deleted."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 6))):
        position = draw(st.integers(0, len(data)))
        operation = draw(st.sampled_from(["flip", "insert", "delete", "token"]))
        if operation == "flip" and data:
            data[position % len(data)] ^= 1 << draw(st.integers(0, 7))
        elif operation == "insert":
            data[position:position] = bytes([draw(st.integers(0, 255))])
        elif operation == "delete" and data:
            del data[position % len(data) : position % len(data) + draw(st.integers(1, 8))]
        elif operation == "token":
            data[position:position] = draw(st.sampled_from(TOKENS))
    return bytes(data)


def streams(commands) -> st.SearchStrategy[bytes]:
    return st.one_of(
        valid_stream(commands),
        mutated(valid_stream(commands)),
        st.binary(max_size=300),
        st.lists(st.sampled_from([*TOKENS, b"lock", b"a", b"1", b"-1", b"stats", b"unlock", b"conn_id"]), max_size=40).map(
            b"".join
        ),
    )


# Chunk sizes, used in turn until the stream is sent.
chunkings = st.lists(st.integers(1, 64), min_size=1, max_size=8) | st.lists(
    st.sampled_from([1, 2, 3, 7, 100, 5000, 9000, 70_000]), min_size=1, max_size=4
)


def chunks(stream: bytes, sizes: list[int]) -> list[bytes]:
    pieces, position, turn = [], 0, 0
    while position < len(stream):
        size = sizes[turn % len(sizes)]
        pieces.append(stream[position : position + size])
        position += size
        turn += 1
    return pieces


def split_lines(stream: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of C{stream} (each without its \\n), and what follows the last."""
    *lines, partial = stream.split(b"\n")
    return lines, partial


def request(line: bytes) -> tuple[list[bytes], int]:
    """A line's fields, and its length as the server measures it (one trailing \\r dropped)."""
    if line.endswith(b"\r"):
        line = line[:-1]
    # Runs of space, tab, VT and FF separate fields; a \r inside a line does not.
    stripped = line.strip(b" \t\x0b\x0c")
    return (re.split(rb"[ \t\x0b\x0c]+", stripped) if stripped else []), len(line)


# -- what may answer each line -----------------------------------------------------

# (with fencing on, a grant's reply ends with its token; lock-many answers one line for all its keys)
JESYNC_STATUS = re.compile(rb"(GRANTED|TIMEOUT|RELEASED|NOT_RELEASED|STATUS) (\d+) (\d+) (\S+)( \d+)?( \d+)?")
JESYNC_LINE = re.compile(
    rb"(GRANTED \d+ \d+ \S+ \d+( \d+)?|(TIMEOUT|RELEASED|NOT_RELEASED) \d+ \d+ \S+|STATUS \d+ \d+ \S+( shared)?"
    # (a holder's line ends with its mode and value when it is shared or has one)
    rb"|HOLDER \S+ \S+ \d+ \d+ \d+( shared| (exclusive|shared) [!-~]+)?"
    rb"|GRANTED-MANY \d+ \d+( \S+)+|TIMEOUT-MANY \d+( \S+)+|FENCING (ON|OFF)"
    rb"|OWNED -?\d+ \S+|NOT_OWNED \S+|END|OK|INVALID_COMMAND|INVALID_PARAMETER: [ -~]+"
    rb"|(WATCHING|NOT_WATCHING|UNWATCHED) \S+|(WATCHING|NOT_WATCHING|UNWATCHED)-PREFIX( \S+)?"
    rb"|EVENT (GRANTED \S+ \S+ \d+ (exclusive|shared)( [!-~]+)?|(RELEASED|EXPIRED|LOST) \S+ \S+ \d+|(APPEARED|DISAPPEARED) \S+))\n"
)
ELOCK_LINE = re.compile(
    rb"(200 Acquired|409 Unavailable|200 Unlocked|403 not_yours|403 not_locked|200 OK|200 conn id set"
    rb"|403 cannot set conn id|200 timeout set( to \d+)?|200 STATS|STAT (clients|locks|monitoring) \d+|END"
    rb"|200 fencing (on|off)|200 owned( \d+)?|404 not_owned"
    rb"|200 Hey, it was nice seeing you\.|400 Unknown command: (\"[^\r\n]*\"|\[[0-9,]+\])|400 [ -~]+|503 [ -~]+|200 \S+)\r\n",
    re.S,
)
LISTINGS = {b"status-by-key", b"status-by-requests", b"status-by-grants"}


def assert_reply(test, line: bytes, pattern: re.Pattern) -> None:
    """C{line} (with its terminator) is, as a whole, one of the replies C{pattern} allows."""
    test.assertIsNotNone(pattern.fullmatch(line), f"not a reply: {line[:300]!r}")


def reply_lines(data: bytes, terminator: bytes) -> list[bytes]:
    assert data == b"" or data.endswith(terminator), f"a reply is cut short: {data[-200:]!r}"
    return [line + terminator for line in data.split(terminator)[:-1]]
