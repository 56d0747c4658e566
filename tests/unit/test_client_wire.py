"""The client's side of the JESync protocol: arguments, requests, reply parsing."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.listing import sort_listing
from jesync.client.wire import (
    MAX_KEY_BYTES,
    MAX_LINE,
    MAX_REPLY_LINE,
    LineSplitter,
    UnexpectedReply,
    check_key,
    fencing_request,
    lock_arguments,
    lock_many_arguments,
    lock_many_request,
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
        self.assertEqual(lock_many_request(("a", "caf\u00e9"), 0, 60), b"lock-many 0 60 a caf\xc3\xa9\n")
        self.assertEqual((fencing_request(True), fencing_request(False)), (b"fencing on\n", b"fencing off\n"))

    def test_lock_many_arguments(self) -> None:
        """The keys are checked and counted once each, in the order given; wait and expires are lock()'s."""
        self.assertEqual(lock_many_arguments(["b", "a", "b"], None, 120), (("b", "a"), -1, 120))
        self.assertEqual(lock_many_arguments(iter(["k"]), 0.5, None), (("k",), 1, 0))
        self.assertRaises(ValueError, lock_many_arguments, [], None, 120)
        self.assertRaises(ValueError, lock_many_arguments, ["a", "two words"], None, 120)
        self.assertRaises(ValueError, lock_many_arguments, ["a"], -1, 120)
        self.assertRaises(TypeError, lock_many_arguments, "ab", None, 120)  # one key, not a list of keys
        self.assertRaises(TypeError, lock_many_arguments, ["a", b"b"], None, 120)

    def test_lock_many_fits_one_line(self) -> None:
        """As many keys as fit in one request line, and not one more."""
        prefix = len("lock-many -1 2147483647")
        fitting = [f"{n:04}" for n in range((MAX_LINE - prefix) // 5)]
        line = lock_many_request(lock_many_arguments(fitting, None, 2**31 - 1)[0], -1, 2**31 - 1)
        self.assertLessEqual(len(line) - 1, MAX_LINE)
        self.assertRaises(ValueError, lock_many_arguments, fitting + ["extra"], None, 2**31 - 1)


class ReplyTests(SynchronousTestCase):
    def test_keyed(self) -> None:
        granted = parse_reply(b"GRANTED 1 2 k 60")
        self.assertEqual((granted.word, granted.status, granted.seconds_left), ("GRANTED", KeyStatus("k", 1, 2), 60))
        self.assertEqual(parse_reply(b"TIMEOUT 1 0 k").key, "k")
        self.assertEqual(parse_reply(b"STATUS 0 0 caf\xc3\xa9\r").key, "caf\u00e9")
        self.assertEqual(parse_reply(b"STATUS 0 0 raw\xff").key, "raw\udcff")

    def test_granted_with_a_fencing_token(self) -> None:
        """With fencing on, GRANTED has a fifth field: the token, up to 2**64 - 1."""
        granted = parse_reply(b"GRANTED 1 0 k 120 42")
        self.assertEqual((granted.key, granted.seconds_left, granted.token, granted.tokens), ("k", 120, 42, (42,)))
        self.assertEqual(parse_reply(b"GRANTED 1 0 k 120 18446744073709551615").token, 2**64 - 1)
        self.assertEqual(parse_reply(b"GRANTED 1 0 k 120 0").token, 0)
        without = parse_reply(b"GRANTED 1 0 k 120")
        self.assertEqual((without.token, without.tokens), (None, (None,)))
        for bad in [b"-1", b"18446744073709551616", b"00000000000000000000001", b"x", b"+1", b"1.0"]:
            self.assertRaises(UnexpectedReply, parse_reply, b"GRANTED 1 0 k 120 " + bad)
        self.assertRaises(UnexpectedReply, parse_reply, b"GRANTED 1 0 k 120 1 2")

    def test_many(self) -> None:
        """GRANTED-MANY names its keys, with a token each if fencing is on; TIMEOUT-MANY names its keys."""
        granted = parse_reply(b"GRANTED-MANY 2 60 a caf\xc3\xa9 7 8")
        self.assertEqual(
            (granted.word, granted.keys, granted.tokens, granted.seconds_left, granted.key, granted.status),
            ("GRANTED-MANY", ("a", "caf\u00e9"), (7, 8), 60, "a", None),
        )
        plain = parse_reply(b"GRANTED-MANY 3 0 a b c\r")
        self.assertEqual((plain.keys, plain.tokens, plain.seconds_left), (("a", "b", "c"), (None, None, None), 0))
        timeout = parse_reply(b"TIMEOUT-MANY 2 b d")
        self.assertEqual((timeout.word, timeout.keys, timeout.tokens), ("TIMEOUT-MANY", ("b", "d"), ()))
        self.assertEqual(parse_reply(b"GRANTED-MANY 1 5 1 2").keys, ("1",))  # a key may look like a number
        for bad in [
            b"GRANTED-MANY",
            b"GRANTED-MANY 0 0",
            b"GRANTED-MANY 2 0 a",
            b"GRANTED-MANY 2 0 a b 1",
            b"GRANTED-MANY 2 0 a b 1 2 3",
            b"GRANTED-MANY 2 0 a b 1 -2",
            b"GRANTED-MANY x 0 a",
            b"GRANTED-MANY 1 x a",
            b"GRANTED-MANY -1 0 a",
            b"TIMEOUT-MANY 2 a",
            b"TIMEOUT-MANY 1 a b",
            b"TIMEOUT-MANY 0",
            b"TIMEOUT-MANY",
        ]:
            self.assertRaises(UnexpectedReply, parse_reply, bad)

    def test_fencing(self) -> None:
        self.assertIs(parse_reply(b"FENCING ON").fencing, True)
        self.assertIs(parse_reply(b"FENCING OFF\r").fencing, False)
        self.assertIsNone(parse_reply(b"STATUS 0 0 k").fencing)
        for bad in [b"FENCING", b"FENCING on", b"FENCING ON 1", b"FENCING MAYBE"]:
            self.assertRaises(UnexpectedReply, parse_reply, bad)

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
        self.assertRaises(UnexpectedReply, LineSplitter().feed, b"x" * (MAX_REPLY_LINE + 1))
        self.assertEqual(LineSplitter().feed(b"x" * MAX_REPLY_LINE), [])


class ListingOrderTests(SynchronousTestCase):
    def test_merge_orders(self) -> None:
        rows = [KeyStatus("b", 1, 3), KeyStatus("a", 2, 3), KeyStatus("c", 5, 0)]
        self.assertEqual([r.key for r in sort_listing(rows, "key")], ["a", "b", "c"])
        self.assertEqual([r.key for r in sort_listing(rows, "requests")], ["a", "b", "c"])
        self.assertEqual([r.key for r in sort_listing(rows, "grants")], ["c", "a", "b"])
        self.assertRaises(ValueError, sort_listing, rows, "size")
