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
   it is dropped, and C{MAX_LENGTH} bounds a line.  A grammar can ask for a
   counted block of raw bytes after a line (L{LineFraming.read_block}: a
   memcached storage command's data and the CRLF after it), which is
   delivered whole as the next frame.
 - L{LengthPrefixedFraming}: an C{Int32StringReceiver}; each frame is a
   4-byte big-endian length and that many bytes, at most C{MAX_LENGTH}.
 - L{HeaderFraming}: a fixed-size header that says how long the body after
   it is (the memcached binary protocol's 24 bytes); a frame is header and
   body.  Twisted has no parser for this shape; it is written as
   C{IntNStringReceiver} is, one pass over an offset.
"""

from __future__ import annotations

from typing import Callable, Protocol

from twisted.protocols.basic import Int32StringReceiver, LineReceiver

Deliver = Callable[[bytes], None]
TooLong = Callable[[], None]


class Framing(Protocol):
    """What a connection uses of its framing (L{LineFraming}, L{LengthPrefixedFraming}, L{HeaderFraming})."""

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
        self._block = 0  # bytes of a raw block still to come (read_block)
        self._stopped = False

    def buffered(self) -> int:
        return len(self._buffer)

    def read_block(self, size: int) -> None:
        """Deliver the next C{size} bytes as one frame, whatever they hold; then lines again."""
        self._block = size
        self.setRawMode()

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return
        if data and not self._buffer and not self.paused and self.line_mode and data.find(b"\n") == len(data) - 1:
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
            if not self.line_mode:
                start = self._take_block(buffer, start)
                if not self.line_mode:
                    break
                continue
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
        if not self.paused and self.line_mode and len(rest) > self.MAX_LENGTH + 1 and not self._stopped:
            self.lineLengthExceeded(rest)

    def _take_block(self, buffer: bytes, start: int) -> int:
        """Deliver the raw block if it has all arrived; return where the rest starts."""
        end = start + self._block
        if len(buffer) < end:
            return start
        self.setLineMode()
        self._block = 0
        self.deliver(buffer[start:end])
        return end

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


class HeaderFraming:
    """
    Frames of a C{header_size}-byte header and the body it announces
    (L{body_length}); a frame (header and body) longer than C{max_length}
    is too long.  A subclass says both, for its protocol.
    """

    header_size = 0
    paused = False

    def __init__(self, deliver: Deliver, too_long: TooLong, max_length: int) -> None:
        self.deliver = deliver
        self.too_long = too_long
        self.max_length = max_length
        self._unprocessed = b""
        self._stopped = False

    def body_length(self, header: bytes) -> int:
        """How many bytes of body follow C{header}."""
        raise NotImplementedError

    def buffered(self) -> int:
        return len(self._unprocessed)

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return
        buffer = self._unprocessed + data if self._unprocessed else data
        offset = 0
        header_size = self.header_size
        while not self.paused and not self._stopped and len(buffer) - offset >= header_size:
            end = offset + header_size + self.body_length(buffer[offset : offset + header_size])
            if end - offset > self.max_length:
                self.stop()
                self.too_long()
                return
            if len(buffer) < end:
                break
            frame = buffer[offset:end]
            offset = end
            self.deliver(frame)
        self._unprocessed = b"" if self._stopped else buffer[offset:]

    def stop(self) -> None:
        self._stopped = True
        self.paused = True
        self._unprocessed = b""
