"""
The line-framing contract, written once and run for every line protocol.

Every line protocol cuts its byte stream the same way (L{LineFraming}, or
the text side of L{MemcachedFraming}), so the rules are stated once, in
L{LineFramingContract}, and run for each protocol over L{StringTransport}
(L{tests.support.connect_unit}):

 - a line ends at LF; a CR just before it is dropped, a CR anywhere else is
   part of the line; nothing is answered before the LF comes, however the
   line is cut into writes (byte by byte, any chunking), and several lines
   in one write are answered in order;
 - a blank line (or one of whitespace) is a request like any other, answered
   with the protocol's reply to an empty request; the connection goes on;
 - a line of exactly the protocol's limit is accepted (its CR not counted),
   however it arrives; a longer one, finished or not (past the limit and a
   CR), is answered with the protocol's error for a long line, and the
   connection closes: nothing sent after it is read;
 - a partial line when the connection goes is never run.

Each protocol gives only what differs: a request and its reply, the reply
to an unknown word, to a blank line and to a lone CR, its error for a long
line, its limit and a request of a given length.  Tests that say more
than the framing about one protocol (what a long line does to its locks or
its session, how its fields split) sit in that protocol's class.  The
socket's own part (TCP segments, a real close) is tested in C{tests/tcp}.
"""

from __future__ import annotations

from typing import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.connection import LockServerFactory
from jesync.connections.grammar import Grammar
from jesync.connections.policy import ConnectionPolicy
from jesync.errors import LimitReached
from jesync.protocols.memcache import MemcacheFactory
from jesync.service import LockService
from jesync.store import ObjectStore
from tests.support import UnitClient, UnitServer, connect_unit, stats

# The longest line of JESync and elock (docs/protocols/index.md, "Lines, fields and numbers"), without its line end.
MAX_LINE = 8192

chunkings = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30)


class LineFramingContract:
    """
    The rules of line framing, for a L{SynchronousTestCase} that gives its
    protocol's parts: C{connect}, C{line_of}, C{unfinished} and the
    attributes below.
    """

    # the longest line accepted, without its line end
    limit: int
    # a request that changes nothing, and its reply
    request: bytes
    reply: bytes
    # a request of a word the protocol does not know, and its reply
    bogus = b"bogus"
    bogus_reply: bytes
    # the replies to a blank line, to a line of whitespace (C{" \\t "}) and to a line of one CR
    blank_reply: bytes
    whitespace_reply: bytes
    lone_cr_reply: bytes
    # the last reply to a line over the limit
    too_long_reply: bytes

    # (the assertions of SynchronousTestCase, for the type checker)
    assertEqual: Callable[..., None]
    assertTrue: Callable[..., None]
    assertFalse: Callable[..., None]

    def connect(self) -> UnitClient:
        """A new connection to the protocol's server (the same server for one test)."""
        raise NotImplementedError

    def line_of(self, length: int) -> tuple[bytes, bytes]:
        """A request of C{length} bytes (no line end), and its reply if it is not too long."""
        raise NotImplementedError

    def unfinished(self) -> tuple[bytes, Callable[[], None]]:
        """A request that would change something, and a check that it was not carried out."""
        raise NotImplementedError

    # -- line ends

    def test_a_line_ends_at_lf(self) -> None:
        self.assertEqual(self.connect().ask(self.request + b"\n"), self.reply)

    def test_a_cr_before_the_lf_is_dropped(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(self.request + b"\r\n"), self.reply)
        self.assertEqual(client.ask(self.request + b"\r\n" + self.request + b"\n"), self.reply * 2)

    def test_a_cr_elsewhere_is_part_of_the_line(self) -> None:
        """A lone CR ends no line: C{CR CR LF} is one line, a CR."""
        client = self.connect()
        self.assertEqual(client.ask(b"\r\r\n"), self.lone_cr_reply)
        self.assertEqual(client.ask(b"\r"), b"")
        self.assertEqual(client.ask(b"\r\n"), self.lone_cr_reply)

    def test_no_reply_until_the_line_ends(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(self.request), b"")
        self.assertEqual(client.ask(b"\r"), b"")
        self.assertEqual(client.ask(b"\n"), self.reply)

    def test_byte_by_byte(self) -> None:
        client = self.connect()
        for byte in self.request + b"\r\n" + self.bogus + b"\n" + self.request + b"\n":
            client.send(bytes([byte]))
        self.assertEqual(client.take(), self.reply + self.bogus_reply + self.reply)

    def test_several_lines_in_one_write_answered_in_order(self) -> None:
        client = self.connect()
        stream = (self.request + b"\r\n" + self.bogus + b"\n") * 300
        self.assertEqual(client.ask(stream), (self.reply + self.bogus_reply) * 300)
        self.assertFalse(client.closing)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)

        # (a hypothesis test belongs to one class: each protocol gets its own)
        @settings(max_examples=50, deadline=None)
        @given(chunkings)
        def test_chunking_never_changes_replies(self, sizes: list[int]) -> None:
            """However the stream is cut into writes, the replies are the same."""
            self.check_chunking(sizes)

        cls.test_chunking_never_changes_replies = test_chunking_never_changes_replies

    def check_chunking(self, sizes: list[int]) -> None:
        longest, longest_reply = self.line_of(self.limit)
        stream = (self.request + b"\r\n" + self.bogus + b"\n\n \t \r\n\r\r\n" + self.request + b"\n") * 3
        stream += longest + b"\n" + self.request + b"\n"
        client = self.connect()
        position = 0
        while position < len(stream):
            for size in sizes:
                client.send(stream[position : position + size])
                position += size
        self.assertEqual(
            client.take(),
            (self.reply + self.bogus_reply + self.blank_reply + self.whitespace_reply + self.lone_cr_reply + self.reply)
            * 3
            + longest_reply
            + self.reply,
        )

    # -- blank lines

    def test_blank_lines_are_requests(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"\r\n\n"), self.blank_reply * 2)
        self.assertEqual(client.ask(b" \t \r\n"), self.whitespace_reply)
        self.assertFalse(client.closing)
        self.assertEqual(client.ask(self.request + b"\n"), self.reply)

    # -- the limit

    def test_a_line_at_the_limit_is_accepted(self) -> None:
        client = self.connect()
        line, reply = self.line_of(self.limit)
        self.assertEqual(len(line), self.limit)
        self.assertEqual(client.ask(line + b"\n"), reply)
        self.assertEqual(client.ask(line + b"\r\n"), reply)
        self.assertFalse(client.closing)

    def test_a_line_at_the_limit_in_pieces(self) -> None:
        client = self.connect()
        line, reply = self.line_of(self.limit)
        self.assertEqual(client.ask(line[: self.limit // 2 + 1]), b"")
        self.assertEqual(client.ask(line[self.limit // 2 + 1 :] + b"\r"), b"")
        self.assertEqual(client.ask(b"\n"), reply)
        self.assertFalse(client.closing)

    def test_a_line_over_the_limit_closes_the_connection(self) -> None:
        """What came before it is answered; it gets the error; what comes after it is never read."""
        client = self.connect()
        line, _ = self.line_of(self.limit + 1)
        self.assertEqual(
            client.ask(self.request + b"\n" + line + b"\n" + self.request + b"\n"), self.reply + self.too_long_reply
        )
        self.assertTrue(client.closing)
        self.assertEqual(client.ask(self.request + b"\n"), b"")

    def test_a_line_over_the_limit_before_a_cr(self) -> None:
        client = self.connect()
        line, _ = self.line_of(self.limit + 1)
        self.assertEqual(client.ask(line + b"\r\n"), self.too_long_reply)
        self.assertTrue(client.closing)

    def test_an_unfinished_line_over_the_limit(self) -> None:
        """
        An unfinished line may be the limit and a CR: one byte more, and it
        is too long, before its LF comes.
        """
        client = self.connect()
        self.assertEqual(client.ask(b"x" * (self.limit + 1)), b"")
        self.assertFalse(client.closing)
        self.assertEqual(client.ask(b"x"), self.too_long_reply)
        self.assertTrue(client.closing)
        self.assertEqual(client.ask(b"\n" + self.request + b"\n"), b"")

    def test_an_endless_line(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"x" * 100_000), self.too_long_reply)
        self.assertTrue(client.closing)

    # -- the end

    def test_a_partial_line_when_the_connection_goes_is_never_run(self) -> None:
        request, not_done = self.unfinished()
        client = self.connect()
        self.assertEqual(client.ask(request), b"")
        client.lose(ConnectionLost)
        self.assertEqual(client.take(), b"")
        not_done()


class ProtocolTestCase(SynchronousTestCase):
    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])


# -- the framing itself -----------------------------------------------------------


class EchoGrammar(Grammar):
    """Every line, echoed after C{echo }: L{LineFraming} through the connection layer, with a small limit."""

    max_frame = 16

    def frame_received(self, line: bytes) -> None:
        self.connection.write(b"echo " + line + b"\n")

    def refusal(self, error: LimitReached) -> bytes:
        return b"refused\n"

    def auth_refused(self) -> bytes:
        return b"refused\n"

    def frame_too_long(self) -> bytes:
        return b"too long\n"


class EchoFactory(LockServerFactory):
    grammar = EchoGrammar


class LineFramingTests(LineFramingContract, ProtocolTestCase):
    limit = EchoGrammar.max_frame
    request, reply = b"ping", b"echo ping\n"
    bogus_reply = b"echo bogus\n"
    blank_reply = b"echo \n"
    whitespace_reply = b"echo  \t \n"
    lone_cr_reply = b"echo \r\n"
    too_long_reply = b"too long\n"

    def setUp(self) -> None:
        self.factory = EchoFactory(LockService(Clock()))
        self.port = 40000

    def connect(self) -> UnitClient:
        self.port += 1
        return connect_unit(self.factory, IPv4Address("TCP", "127.0.0.1", self.port))

    def line_of(self, length: int) -> tuple[bytes, bytes]:
        line = b"q" * length
        return line, b"echo " + line + b"\n"

    def unfinished(self) -> tuple[bytes, Callable[[], None]]:
        return b"ping", lambda: None  # (the echo changes nothing: no reply is all there is to see)


# -- JESync -----------------------------------------------------------------------


class JESyncLineFramingTests(LineFramingContract, ProtocolTestCase):
    limit = MAX_LINE
    request, reply = b"status k", b"STATUS 0 0 k\n"
    bogus_reply = blank_reply = whitespace_reply = lone_cr_reply = b"INVALID_COMMAND\n"
    too_long_reply = b"INVALID_PARAMETER: line too long\n"

    def setUp(self) -> None:
        self.server = UnitServer()
        self.service = self.server.service

    def connect(self) -> UnitClient:
        return self.server.connect()

    def line_of(self, length: int) -> tuple[bytes, bytes]:
        # (a key as long as the line allows: the line's limit is the one met)
        self.server.policy.max_key_length = MAX_LINE
        key = b"k" * (length - len(b"status "))
        return b"status " + key, b"STATUS 0 0 " + key + b"\n"

    def unfinished(self) -> tuple[bytes, Callable[[], None]]:
        return b"lock k", lambda: self.assertEqual(self.service.listing(), [])

    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
    def test_chunking_never_changes_what_a_stream_does(self, sizes: list[int]) -> None:
        """However a stream that takes, renews and releases locks is cut, the replies (and the table) are the same."""
        stream = b"lock a 2\r\nlock b 1 0\nstatus a\n\n  \nLOCK a\nlock\nrelease a\nstatus-by-key\n" * 3
        client = UnitServer().connect()  # (a table of its own: hypothesis runs every example in one test)
        position = 0
        while position < len(stream):
            for size in sizes:
                client.send(stream[position : position + size])
                position += size
        self.assertEqual(
            client.take(),
            b"GRANTED 1 0 a 120\nGRANTED 1 0 b 120\nSTATUS 1 0 a\n"
            b"INVALID_COMMAND\nINVALID_COMMAND\nINVALID_COMMAND\nINVALID_PARAMETER: missing key\n"
            b"RELEASED 0 0 a\nSTATUS 1 0 b\nEND\n" * 3,
        )

    def test_longest_lock_line(self) -> None:
        client = self.connect()
        self.server.policy.max_key_length = MAX_LINE
        key = b"k" * (MAX_LINE - len(b"lock "))
        self.assertEqual(client.ask(b"lock " + key + b"\n"), b"GRANTED 1 0 " + key + b" 120\n")
        self.assertFalse(client.closing)

    def test_runs_of_whitespace_separate_fields(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"  lock \t k   2\t\t-1 \x0b 30  \n"), b"GRANTED 1 0 k 30\n")
        self.assertEqual(client.ask(b"\tstatus\x0ck \r\n"), b"STATUS 1 0 k\n")
        self.assertEqual(client.ask(b"release  k\t\n"), b"RELEASED 0 0 k\n")

    def test_pipelined_commands_answered_in_order(self) -> None:
        """A lock that waits holds back no reply: the lines after it are answered at once."""
        client = self.connect()
        other = self.connect()
        other.ask(b"lock busy\n")
        commands = b"".join(b"lock k%d\nstatus k%d\n" % (i, i) for i in range(500))
        commands += b"lock busy\nbogus\nstatus busy\nstatus-by-grants\nrelease k0\n"
        expected = b"".join(b"GRANTED 1 0 k%d 120\nSTATUS 1 0 k%d\n" % (i, i) for i in range(500))
        expected += b"INVALID_COMMAND\nSTATUS 1 1 busy\n"
        keys = sorted([b"busy"] + [b"k%d" % i for i in range(500)])
        expected += b"".join(b"STATUS 1 %d %s\n" % (key == b"busy", key) for key in keys)
        expected += b"END\nRELEASED 0 0 k0\n"
        self.assertEqual(client.ask(commands), expected)

    def test_too_long_line_closes(self) -> None:
        """The connection's locks are released at once, and other clients are undisturbed."""
        holder, other = self.connect(), self.connect()
        holder.ask(b"lock held\n")
        line, _ = self.line_of(MAX_LINE + 1)
        self.assertEqual(
            holder.ask(b"status a\n" + line + b"\nstatus b\n"),
            b"STATUS 0 0 a\nINVALID_PARAMETER: line too long\n",
        )
        self.assertTrue(holder.closing)
        self.assertEqual(other.ask(b"lock held\n"), b"GRANTED 1 0 held 120\n")
        holder.lose()
        self.assertEqual(holder.take(), b"")


# -- elock ------------------------------------------------------------------------


class ELockLineFramingTests(LineFramingContract, ProtocolTestCase):
    limit = MAX_LINE
    request, reply = b"unlock k", b"403 not_locked\r\n"
    bogus_reply = b'400 Unknown command: "bogus"\r\n'
    blank_reply = whitespace_reply = b'400 Unknown command: ""\r\n'
    lone_cr_reply = b'400 Unknown command: "\\r"\r\n'
    too_long_reply = b"400 line too long\r\n"

    def setUp(self) -> None:
        self.server = UnitServer()
        self.clock = self.server.clock
        self.service = self.server.service
        self.sessions = self.server.elock_factory.sessions

    def connect(self) -> UnitClient:
        return self.server.connect_elock()

    def line_of(self, length: int) -> tuple[bytes, bytes]:
        # (a key as long as the line allows: the line's limit is the one met)
        self.server.policy.max_key_length = MAX_LINE
        return b"unlock " + b"k" * (length - len(b"unlock ")), b"403 not_locked\r\n"

    def unfinished(self) -> tuple[bytes, Callable[[], None]]:
        def not_done() -> None:
            self.assertEqual(self.service.listing(), [])
            self.assertEqual(len(self.sessions), 0)

        return b"lock k", not_done

    def test_runs_of_whitespace(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"  lock \t k \x0b  3 \r\n"), b"200 Acquired\r\n")
        self.assertEqual(client.ask(b"\tunlock\x0ck\r\n"), b"200 Unlocked\r\n")

    def test_pipelined_commands_answered_in_order(self) -> None:
        client = self.connect()
        other = self.connect()
        other.ask(b"lock busy\r\n")
        commands = b"".join(b"lock k%d\r\nunlock k%d\r\n" % (i, i) for i in range(300))
        commands += b"lock busy\r\nbogus\r\nlock a\r\nstats\r\nunlock busy\r\nunlock_all\r\nunlock a\r\n"
        expected = b"200 Acquired\r\n200 Unlocked\r\n" * 300
        expected += b'409 Unavailable\r\n400 Unknown command: "bogus"\r\n200 Acquired\r\n'
        expected += stats(2, 2, 0)
        expected += b"403 not_yours\r\n200 OK\r\n403 not_locked\r\n"
        self.assertEqual(client.ask(commands), expected)

    def test_longest_line(self) -> None:
        self.server.policy.max_key_length = MAX_LINE
        client = self.connect()
        key = b"k" * (MAX_LINE - len(b"lock "))
        self.assertEqual(client.ask(b"lock " + key + b"\r\n"), b"200 Acquired\r\n")
        self.assertFalse(client.closing)
        self.assertEqual(self.service.status(key.decode()).granted, 1)

    def test_line_too_long(self) -> None:
        """A drop like any other: the session is detached, and its grace applies."""
        client, jesync = self.connect(), self.server.connect()
        client.ask(b"lock k\r\n")
        jesync.ask(b"lock k\n")
        self.assertEqual(client.ask(b"x" * (MAX_LINE + 1) + b"\r\nunlock k\r\n"), b"400 line too long\r\n")
        self.assertTrue(client.closing)
        client.lose()
        self.assertEqual(self.sessions.detached_count(), 1)
        self.clock.advance(29.9)
        self.assertEqual(jesync.take(), b"")
        self.clock.advance(0.1)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")


# -- memcached, its text side -----------------------------------------------------------


class MemcachedTextLineFramingTests(LineFramingContract, ProtocolTestCase):
    """The text requests of the memcached port (its binary ones are told apart by their first byte: C{test_framing})."""

    request, reply = b"get k", b"END\r\n"
    bogus_reply = blank_reply = whitespace_reply = lone_cr_reply = b"ERROR\r\n"
    too_long_reply = b"CLIENT_ERROR line too long\r\n"

    def setUp(self) -> None:
        clock = Clock()
        clock.advance(1_800_000_000)
        self.store = ObjectStore(LockService(clock), memory=1 << 20, max_item=1000)
        self.factory = MemcacheFactory(self.store, policy=ConnectionPolicy())
        # (a line holds a request and its keys; the largest item is its data's limit, not the line's)
        self.limit = self.store.max_item + 1024
        self.port = 40000

    def connect(self) -> UnitClient:
        self.port += 1
        return connect_unit(self.factory, IPv4Address("TCP", "127.0.0.1", self.port))

    def line_of(self, length: int) -> tuple[bytes, bytes]:
        """C{get} of as many keys (none stored, of at most 250 bytes) as make C{length} bytes."""
        line = b"get"
        while len(line) < length:
            room = length - len(line) - 1
            size = min(250, room)
            if room - size == 1:
                size -= 1  # (no room is left for a space alone)
            line += b" " + b"k" * size
        return line, b"END\r\n"

    def unfinished(self) -> tuple[bytes, Callable[[], None]]:
        return b"set k 0 0 1", lambda: self.assertEqual(len(self.store), 0)
