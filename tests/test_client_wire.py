"""The client's side of the JESync protocol: arguments, requests, reply parsing."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.listing import sort_listing
from jesync.client.wire import (
    MAX_KEY_BYTES,
    MAX_LINE,
    LineSplitter,
    UnexpectedReply,
    check_key,
    lock_arguments,
    lock_request,
    listing_request,
    parse_reply,
    wire_expires,
    wire_timeout,
)
from jesync.interfaces import KeyStatus


class ArgumentTests(SynchronousTestCase):
    def test_wait(self) -> None:
        """None waits for ever (-1), 0 does not wait, fractions round up to whole seconds."""
        self.assertEqual([wire_timeout(w) for w in (None, 0, 0.2, 1, 1.5, 30)], [-1, 0, 1, 1, 2, 30])
        self.assertRaises(ValueError, wire_timeout, -1)
        self.assertRaises(ValueError, wire_timeout, 2**31)
        self.assertRaises(TypeError, wire_timeout, "5")
        self.assertRaises(TypeError, wire_timeout, float("nan"))

    def test_expires(self) -> None:
        """None and 0 never expire (0 on the wire); fractions round up."""
        self.assertEqual([wire_expires(e) for e in (None, 0, 0.5, 120)], [0, 0, 1, 120])
        self.assertRaises(ValueError, wire_expires, -0.5)

    def test_max_concurrent(self) -> None:
        self.assertEqual(lock_arguments(3, None, 120), (3, -1, 120))
        self.assertRaises(ValueError, lock_arguments, 0, None, 120)
        self.assertRaises(TypeError, lock_arguments, 1.5, None, 120)
        self.assertRaises(TypeError, lock_arguments, True, None, 120)

    def test_keys(self) -> None:
        """Keys are UTF-8 (raw bytes as surrogate escapes), without whitespace, short enough for one line."""
        self.assertEqual(check_key("nightly-report"), b"nightly-report")
        self.assertEqual(check_key("caf\u00e9"), b"caf\xc3\xa9")
        self.assertEqual(check_key("raw\udcff"), b"raw\xff")
        for bad in ["", "a b", "a\tb", "a\nb", "a\rb", "a\x0bb", "a\x0cb", "k" * (MAX_KEY_BYTES + 1)]:
            self.assertRaises(ValueError, check_key, bad)
        self.assertRaises(TypeError, check_key, b"bytes")
        longest = lock_request("k" * MAX_KEY_BYTES, 2**31 - 1, -1, 2**31 - 1)
        self.assertLessEqual(len(longest) - 1, MAX_LINE)

    def test_requests(self) -> None:
        self.assertEqual(lock_request("k", 1, -1, 120), b"lock k 1 -1 120\n")
        self.assertEqual(listing_request("grants"), b"status-by-grants\n")
        self.assertRaises(ValueError, listing_request, "size")


class ReplyTests(SynchronousTestCase):
    def test_keyed(self) -> None:
        granted = parse_reply(b"GRANTED 1 2 k 60")
        self.assertEqual((granted.word, granted.status, granted.seconds_left), ("GRANTED", KeyStatus("k", 1, 2), 60))
        self.assertEqual(parse_reply(b"TIMEOUT 1 0 k").key, "k")
        self.assertEqual(parse_reply(b"STATUS 0 0 caf\xc3\xa9\r").key, "caf\u00e9")
        self.assertEqual(parse_reply(b"STATUS 0 0 raw\xff").key, "raw\udcff")

    def test_jesync_0_8_1(self) -> None:
        """JESync 0.8.1's RELEASED had a fifth field, and it sent EXPIRED lines."""
        self.assertEqual(parse_reply(b"RELEASED 0 0 k 12").status, KeyStatus("k", 0, 0))
        self.assertEqual(parse_reply(b"EXPIRED 0 0 k 0").word, "EXPIRED")

    def test_words(self) -> None:
        self.assertEqual(parse_reply(b"END").word, "END")
        self.assertEqual(parse_reply(b"INVALID_COMMAND").word, "INVALID_COMMAND")
        error = parse_reply(b"INVALID_PARAMETER: missing key")
        self.assertEqual((error.word, error.text), ("INVALID_PARAMETER:", "INVALID_PARAMETER: missing key"))

    def test_garbage(self) -> None:
        for line in [b"", b"HELLO", b"GRANTED 1 0 k", b"STATUS x 0 k", b"STATUS 1 0 k extra", b"END 1"]:
            self.assertRaises(UnexpectedReply, parse_reply, line)


class SplitterTests(SynchronousTestCase):
    def test_split(self) -> None:
        splitter = LineSplitter()
        self.assertEqual(splitter.feed(b"STATUS 0 0 a\nSTAT"), [b"STATUS 0 0 a"])
        self.assertEqual(splitter.feed(b"US 0 0 b\n\n"), [b"STATUS 0 0 b", b""])

    def test_runaway(self) -> None:
        self.assertRaises(UnexpectedReply, LineSplitter().feed, b"x" * 100_000)


class ListingOrderTests(SynchronousTestCase):
    def test_merge_orders(self) -> None:
        rows = [KeyStatus("b", 1, 3), KeyStatus("a", 2, 3), KeyStatus("c", 5, 0)]
        self.assertEqual([r.key for r in sort_listing(rows, "key")], ["a", "b", "c"])
        self.assertEqual([r.key for r in sort_listing(rows, "requests")], ["a", "b", "c"])
        self.assertEqual([r.key for r in sort_listing(rows, "grants")], ["c", "a", "b"])
        self.assertRaises(ValueError, sort_listing, rows, "size")
