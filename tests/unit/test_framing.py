"""
The framings (L{jesync.connections.framing}), fed by hand and in every
chunking; and a toy binary protocol, written as one grammar over
length-prefixed frames, that gets the connection layer's rules for free.

The rules of text lines (line ends, blank lines, the limit) are one contract,
run for L{LineFraming} and for every line protocol, in
L{tests.unit.test_line_framing}; here are what only a framing shows (a
paused framing holds whole lines back), length-prefixed frames, and the
memcached port's mix of text, blocks and binary requests.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.connection import LockServerFactory
from jesync.connections.framing import LengthPrefixedFraming, LineFraming, MemcachedFraming
from jesync.connections.grammar import Grammar
from jesync.errors import LimitReached, LockTimeout
from jesync.interfaces import IGrant
from jesync.service import LockService


class Recorder:
    """Collects what a framing delivers, and can ask it for a raw block after a line."""

    def __init__(self, framing_class, max_length: int = 16) -> None:
        self.frames: list[bytes] = []
        self.too_long = 0
        self.framing = framing_class(self.frames.append, self.refused, max_length)

    def refused(self) -> None:
        self.too_long += 1

    def feed(self, data: bytes, sizes: list[int] | None = None) -> list[bytes]:
        sizes = sizes or [len(data) or 1]
        start, index = 0, 0
        while start < len(data):
            size = max(1, sizes[index % len(sizes)])
            self.framing.dataReceived(data[start : start + size])
            start, index = start + size, index + 1
        return self.frames


def binary_request(body: bytes) -> bytes:
    return b"\x80\x01" + b"\x00" * 6 + struct.pack(">I", len(body)) + b"\x00" * 12 + body


chunkings = st.lists(st.integers(1, 40), min_size=1, max_size=8)


class LineFramingTests(SynchronousTestCase):
    def test_paused_holds_lines_back(self) -> None:
        recorder = Recorder(LineFraming)
        framing = recorder.framing
        framing.deliver = lambda line: (recorder.frames.append(line), setattr(framing, "paused", True))
        recorder.feed(b"one\ntwo\nthree\n" + b"x" * 40)
        self.assertEqual(recorder.frames, [b"one"])
        self.assertEqual(recorder.too_long, 0)  # a paused buffer holds whole lines
        framing.paused = False
        framing.dataReceived(b"")
        self.assertEqual(recorder.frames, [b"one", b"two"])


class LengthPrefixedFramingTests(SynchronousTestCase):
    @given(chunkings)
    @settings(max_examples=50, deadline=None)
    def test_frames(self, sizes: list[int]) -> None:
        frames = [b"", b"x", b"\n\r\x00" * 5, b"y" * 16]
        stream = b"".join(struct.pack(">I", len(frame)) + frame for frame in frames)
        self.assertEqual(Recorder(LengthPrefixedFraming).feed(stream, sizes), frames)

    def test_too_long(self) -> None:
        recorder = Recorder(LengthPrefixedFraming)
        recorder.feed(struct.pack(">I", 1) + b"a" + struct.pack(">I", 17) + b"b" * 17 + struct.pack(">I", 1) + b"c")
        self.assertEqual((recorder.frames, recorder.too_long), ([b"a"], 1))


class MemcachedFramingTests(SynchronousTestCase):
    """Text lines (and blocks after them) and binary requests on one stream, told apart by their first byte."""

    @staticmethod
    def recorder(max_length: int = 64) -> Recorder:
        """A recorder whose grammar reads a block after C{set <n>} and skips one after C{skip <n>}."""
        recorder = Recorder(MemcachedFraming, max_length)
        framing = recorder.framing

        def deliver(frame: bytes) -> None:
            recorder.frames.append(frame)
            if frame.startswith(b"set "):
                framing.read_block(int(frame.split()[1]) + 2)
            elif frame.startswith(b"skip "):
                framing.skip(int(frame.split()[1]))

        framing.deliver = deliver
        return recorder

    @given(chunkings)
    @settings(max_examples=100, deadline=None)
    def test_any_chunking(self, sizes: list[int]) -> None:
        binary = [binary_request(b""), binary_request(b"key"), binary_request(b"\x80\n" * 15)]
        stream = (
            b"get a\r\n" + binary[0] + b"set 5\r\na\nb\r\n\r\n" + binary[1] + b"skip 7\r\n\x80\x80\n\n\x80xy"
            + b"set 0\r\n\r\n" + binary[2] + b"end\n"
        )
        expected = [b"get a", binary[0], b"set 5", b"a\nb\r\n\r\n", binary[1], b"skip 7", b"set 0", b"\r\n", binary[2], b"end"]
        self.assertEqual(self.recorder().feed(stream, sizes), expected)

    def test_binary_too_long_is_its_header_alone_and_its_body_skipped(self) -> None:
        recorder = self.recorder()
        big = binary_request(b"b" * 41)
        recorder.feed(binary_request(b"a") + big[:30], [7])
        recorder.feed(big[30:] + b"after\n", [5])
        self.assertEqual(recorder.frames, [binary_request(b"a"), big[:24], b"after"])
        self.assertEqual(recorder.too_long, 0)

    def test_paused_holds_requests_back(self) -> None:
        recorder = self.recorder()
        framing = recorder.framing
        deliver = framing.deliver
        framing.deliver = lambda frame: (deliver(frame), setattr(framing, "paused", True))
        recorder.feed(b"one\n" + binary_request(b"two") + b"three\n")
        self.assertEqual(recorder.frames, [b"one"])
        framing.paused = False
        framing.dataReceived(b"")
        self.assertEqual(recorder.frames, [b"one", binary_request(b"two")])
        self.assertEqual(framing.buffered(), len(b"three\n"))


# -- a binary protocol in one grammar ------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


class ToyLockGrammar(Grammar):
    """
    C{L<key>}: lock C{key}, waiting up to 10 s; answered C{G<key>} (granted)
    or C{N<key>} (not granted), in request order.  Everything else is C{E}.
    """

    framing = LengthPrefixedFraming
    max_frame = 64
    ordered = True

    def frame_received(self, request: bytes) -> None:
        if not request.startswith(b"L") or len(request) < 2:
            self.connection.write(frame(b"E"))
            return
        key = request[1:].decode()
        result = self.service.acquire(key, self.connection, 1, 10, 0)
        result.addCallbacks(self._granted, self._not_granted, (key,), None, (key,))
        self.connection.await_reply(result)

    def _granted(self, grant: IGrant, key: str) -> None:
        self.connection.write(frame(b"G" + key.encode()))

    def _not_granted(self, failure: Failure, key: str) -> None:
        failure.trap(LockTimeout, CancelledError)
        self.connection.write(frame(b"N" + key.encode()))

    def refusal(self, error: LimitReached) -> bytes:
        return frame(b"E" + str(error).encode())

    def auth_refused(self) -> bytes:
        return frame(b"E")

    def frame_too_long(self) -> bytes:
        return frame(b"Etoo long")


class ToyLockFactory(LockServerFactory):
    grammar = ToyLockGrammar


class ToyProtocolTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.factory = ToyLockFactory(self.service)

    def connect(self):
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000))
        protocol = self.factory.buildProtocol(None)
        protocol.makeConnection(transport)
        return protocol, transport

    def test_waits_in_order_and_ends_at_a_fin(self) -> None:
        holder, holder_out = self.connect()
        waiter, waiter_out = self.connect()
        holder.dataReceived(frame(b"La"))
        self.assertEqual(holder_out.value(), frame(b"Ga"))
        waiter.dataReceived(frame(b"La") + frame(b"Lb") + frame(b"?"))
        self.assertEqual(waiter_out.value(), b"")  # the rest waits its turn
        waiter.readConnectionLost()
        self.assertEqual(waiter_out.value(), frame(b"Na"))
        self.clock.advance(0)
        self.assertEqual(waiter_out.value(), frame(b"Na") + frame(b"Gb") + frame(b"E"))
        self.assertTrue(waiter_out.disconnecting)
        self.assertEqual(self.service.status("b").granted, 0)  # the close gave it back

    def test_frame_too_long(self) -> None:
        holder, _ = self.connect()
        client, out = self.connect()
        holder.dataReceived(frame(b"La"))
        client.dataReceived(frame(b"Lb") + frame(b"L" + b"x" * 64) + frame(b"Lc"))
        self.assertEqual(out.value(), frame(b"Gb") + frame(b"Etoo long"))
        self.assertTrue(out.disconnecting)
        self.assertEqual([row.key for row in self.service.listing()], ["a"])
