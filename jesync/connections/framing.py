"""
Framing: how a connection's byte stream is cut into requests.

A framing is fed the bytes read from the connection (C{dataReceived}) and
hands each whole frame to C{deliver}.  It never touches the transport: the
connection sets C{paused} to hold frames back (they stay buffered, and are
delivered by C{dataReceived(b"")} once C{paused} is false again), asks how
much is buffered (C{buffered}), and is told by C{too_long} when a frame
passes the framing's limit, after which the framing delivers nothing more.

These are Twisted's own framing protocols used for their parsers only:

 - L{LineFraming}: a L{LineReceiver}; lines end in LF, an optional CR before
   it is dropped, and C{MAX_LENGTH} bounds a line.
 - L{LengthPrefixedFraming}: an C{Int32StringReceiver}; each frame is a
   4-byte big-endian length and that many bytes, at most C{MAX_LENGTH}.
 - L{MemcachedFraming}: the memcached port, where each request is a text
   line (and perhaps a block of data after it) or a binary header and the
   body it announces, told apart by its first byte.  Twisted has no parser
   for this; it is written as C{IntNStringReceiver} is, one pass over an
   offset.
"""

from __future__ import annotations

from typing import Callable, Protocol

from twisted.protocols.basic import Int32StringReceiver, LineReceiver

Deliver = Callable[[bytes], None]
TooLong = Callable[[], None]


class Framing(Protocol):
    """What a connection uses of its framing (L{LineFraming}, L{LengthPrefixedFraming}, L{MemcachedFraming})."""

    paused: bool

    def __init__(self, deliver: Deliver, too_long: TooLong, max_length: int) -> None: ...

    def dataReceived(self, data: bytes) -> None: ...

    def buffered(self) -> int: ...

    def stop(self) -> None: ...


class LineFraming(LineReceiver):
    """
    Lines, split in one pass over each chunk received (C{LineReceiver}'s own
    C{dataReceived} re-splits its whole buffer for every line, which is
    quadratic for a client that pipelines many commands).
    """

    delimiter = b"\n"

    def __init__(self, deliver: Deliver, too_long: TooLong, max_length: int) -> None:
        self.deliver = deliver
        self.too_long = too_long
        self.MAX_LENGTH = max_length
        self._stopped = False

    def buffered(self) -> int:
        return len(self._buffer)

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return
        if data and not self._buffer and not self.paused and data.find(b"\n") == len(data) - 1:
            # The common case, one whole request: no buffer to keep.
            line = data[:-2] if data.endswith(b"\r\n") else data[:-1]
            if len(line) > self.MAX_LENGTH:
                self.lineLengthExceeded(line)
            else:
                self.deliver(line)
            return
        buffer = self._buffer + data if self._buffer else data
        start = 0
        while not self.paused and not self._stopped:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > self.MAX_LENGTH:
                self.lineLengthExceeded(line)
                return
            self.lineReceived(line)
        rest = buffer[start:] if start else buffer
        self._buffer = b"" if self._stopped else rest
        # The rest is one line's beginning, unless reading is paused: then it
        # may hold whole lines not read yet.
        if not self.paused and len(rest) > self.MAX_LENGTH + 1 and not self._stopped:
            self.lineLengthExceeded(rest)

    def lineReceived(self, line: bytes) -> None:
        self.deliver(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        self.stop()
        self.too_long()

    def stop(self) -> None:
        """Deliver nothing more, and drop what is buffered."""
        self._stopped = True
        self._buffer = b""


class LengthPrefixedFraming(Int32StringReceiver):
    """Frames of a 4-byte big-endian length and that many bytes."""

    def __init__(self, deliver: Deliver, too_long: TooLong, max_length: int) -> None:
        self.deliver = deliver
        self.too_long = too_long
        self.MAX_LENGTH = max_length
        self._stopped = False

    def buffered(self) -> int:
        return len(self._unprocessed)

    def dataReceived(self, data: bytes) -> None:
        if not self._stopped:
            super().dataReceived(data)

    def stringReceived(self, frame: bytes) -> None:
        if not self._stopped:
            self.deliver(frame)

    def lengthLimitExceeded(self, length: int) -> None:
        self.stop()
        self.too_long()

    def stop(self) -> None:
        self._stopped = True
        self.paused = True
        self._unprocessed = b""


class MemcachedFraming:
    """
    Text and binary memcached requests on one stream, told apart by each
    request's first byte, as memcached does.

     - C{0x80}: a binary request, a 24-byte header whose bytes 8-11 (big
       endian) say how long the body after it is; the frame is header and
       body.  One longer than C{max_length} is delivered as its header
       alone, and its body is skipped as it arrives (the grammar answers
       "too large", and the connection goes on, as memcached's does).
     - anything else: a text line, up to LF (a CR before it is dropped).
       After a line, the grammar may ask for the next bytes as one raw frame
       (L{read_block}: a storage command's data and its CRLF) or for them to
       be discarded (L{skip}: data too large to store).  A line longer than
       C{max_length} is too long: C{too_long} is called and nothing more is
       delivered.
    """

    BINARY_MAGIC = 0x80
    HEADER_SIZE = 24
    paused = False

    def __init__(self, deliver: Deliver, too_long: TooLong, max_length: int) -> None:
        self.deliver = deliver
        self.too_long = too_long
        self.max_length = max_length
        self._buffer = b""
        self._block = 0  # bytes to deliver as one raw frame next
        self._skip = 0  # bytes to discard next
        self._searched = 0  # bytes of an unfinished line already searched for LF
        self._stopped = False

    def buffered(self) -> int:
        return len(self._buffer)

    def unfinished(self, size: int) -> bytes:
        """The first C{size} bytes of the frame received in part (what it is, for a reply cut short)."""
        return self._buffer[:size]

    def read_block(self, size: int) -> None:
        """Deliver the next C{size} bytes as one frame, whatever they hold."""
        self._block = size

    def skip(self, size: int) -> None:
        """Discard the next C{size} bytes."""
        self._skip += size

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return
        buffer = self._buffer + data if self._buffer else data
        offset = 0
        while not self.paused and not self._stopped:
            available = len(buffer) - offset
            if self._skip:
                skipped = min(self._skip, available)
                self._skip -= skipped
                offset += skipped
                if self._skip:
                    break
            elif self._block:
                if available < self._block:
                    break
                end = offset + self._block
                self._block = 0
                self.deliver(buffer[offset:end])
                offset = end
            elif not available:
                break
            elif buffer[offset] == self.BINARY_MAGIC:
                if available < self.HEADER_SIZE:
                    break
                header_end = offset + self.HEADER_SIZE
                end = header_end + int.from_bytes(buffer[offset + 8 : offset + 12], "big")
                if end - offset > self.max_length:
                    self._skip = end - header_end
                    self.deliver(buffer[offset:header_end])
                    offset = header_end
                    continue
                if len(buffer) < end:
                    break
                self.deliver(buffer[offset:end])
                offset = end
            else:
                end = buffer.find(b"\n", offset + self._searched)
                if end < 0:
                    if available > self.max_length + 1:
                        self.stop()
                        self.too_long()
                        return
                    self._searched = available
                    break
                self._searched = 0
                line = buffer[offset : end - 1 if end > offset and buffer[end - 1] == 13 else end]
                offset = end + 1
                if len(line) > self.max_length:
                    self.stop()
                    self.too_long()
                    return
                self.deliver(line)
        self._buffer = b"" if self._stopped else buffer[offset:]

    def stop(self) -> None:
        """Deliver nothing more, and drop what is buffered."""
        self._stopped = True
        self.paused = True
        self._buffer = b""
