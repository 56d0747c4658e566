"""
The memcached grammar (L{jesync.protocols.memcache}) on a
L{twisted.internet.task.Clock} and L{StringTransport}s: what the connection
layer says through it (auth, its timeout, idle, refusals, over-long lines)
in whichever protocol the client last spoke, and what it gives back when a
connection goes.  The commands themselves are tested over real TCP, with a
real memcached client, in L{tests.tcp.test_memcache}; the store's rules in
L{tests.unit.test_store}.
"""

from __future__ import annotations

import struct

from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.policy import Connections
from jesync.protocols.memcache import MemcacheFactory
from tests.memcache_messages import HEADER, Unit, binary, responses
from tests.support import parse


class MixedTests(SynchronousTestCase):
    def test_text_and_binary_in_one_write_answered_in_order(self) -> None:
        client = Unit().connect()
        stream = (
            b"set k 3 0 2\r\nhi\r\n"
            + binary(0x0C, b"k", opaque=9)  # GetK
            + b"get k\r\n"
            + binary(0x0D, b"missing", opaque=10)  # GetKQ: nothing for a miss
            + binary(0x0A, opaque=11)  # Noop
        )
        data = client.ask(stream)
        self.assertTrue(data.startswith(b"STORED\r\n"))
        data = data[len(b"STORED\r\n") :]
        first = responses(data[: 24 + 4 + 1 + 2])
        self.assertEqual(first, [(0x0C, 0, 9, struct.pack(">I", 3), b"k", b"hi")])
        data = data[24 + 4 + 1 + 2 :]
        self.assertTrue(data.startswith(b"VALUE k 3 2\r\nhi\r\nEND\r\n"))
        self.assertEqual(responses(data[len(b"VALUE k 3 2\r\nhi\r\nEND\r\n") :]), [(0x0A, 0, 11, b"", b"", b"")])

    def test_large_value_skipped_connection_goes_on(self) -> None:
        unit = Unit()
        client = unit.connect()
        self.assertEqual(
            client.ask(b"set big 0 0 1001\r\n" + b"x" * 1001 + b"\r\nget big\r\n"),
            b"SERVER_ERROR object too large for cache\r\nEND\r\n",
        )
        big = binary(0x01, b"big", struct.pack(">II", 0, 0), b"y" * 5000, opaque=4)
        self.assertEqual(
            responses(client.ask(big + binary(0x0A, opaque=5))),
            [(0x01, 3, 4, b"", b"", b"Too large."), (0x0A, 0, 5, b"", b"", b"")],
        )
        self.assertFalse(client.closing)
        self.assertEqual(len(unit.store), 0)

    def test_a_large_get_is_streamed(self) -> None:
        unit = Unit()
        client = unit.connect()
        value = b"v" * 1000
        client.ask(b"set k 0 0 1000\r\n" + value + b"\r\n")
        expected = b"VALUE k 0 1000\r\n" + value + b"\r\n"
        first = client.ask(b"get" + b" k" * 200 + b"\r\nversion\r\n")
        self.assertLess(len(first), 100 * len(expected))  # not built whole, nor sent in one turn
        data = first
        for _ in range(20):
            unit.clock.advance(0)
            data += client.take()
        self.assertEqual(data, expected * 200 + b"END\r\nVERSION 1.6.0-jesync\r\n")

    def test_keys_is_a_snapshot_streamed_turn_by_turn(self) -> None:
        unit = Unit()
        client = unit.connect()
        # (1,800 keys of 200 bytes fill most of the unit's 1 MiB store)
        keys = [b"key.%06d." % n + b"k" * 189 for n in range(1_800)]
        self.assertEqual(len(keys[0]), 200)
        for key in keys:
            unit.store.store("set", key, b"v", 0, 0, None)
        first = client.ask(b"keys key.\r\nversion\r\n")
        self.assertLess(len(first), 100_000)  # (a 370 KB listing: not sent in one turn)
        # written after the listing was taken: not in it
        unit.store.store("set", b"key.late", b"v", 0, 0, None)
        unit.store.delete(keys[-1], None)
        data = first
        for _ in range(20):
            unit.clock.advance(0)
            data += client.take()
        listing, end, rest = data.partition(b"END\r\n")
        self.assertEqual(sorted(listing.split(b"\r\n")[:-1]), [b"VALUE " + key for key in keys])
        self.assertEqual((end, rest), (b"END\r\n", b"VERSION 1.6.0-jesync\r\n"))

    def test_binary_keys_streamed(self) -> None:
        unit = Unit()
        client = unit.connect()
        keys = [b"key.%06d." % n + b"k" * 189 for n in range(1_800)]
        for key in keys:
            unit.store.store("set", key, b"v", 0, 0, None)
        data = client.ask(binary(0x50, b"key.", opaque=3) + binary(0x0A, opaque=4))
        for _ in range(20):
            unit.clock.advance(0)
            data += client.take()
        found = responses(data)
        self.assertEqual(sorted(found[:-2]), [(0x50, 0, 3, b"", key, b"") for key in keys])
        self.assertEqual(found[-2:], [(0x50, 0, 3, b"", b"", b""), (0x0A, 0, 4, b"", b"", b"")])

    def test_line_too_long_closes(self) -> None:
        unit = Unit()
        other = unit.connect()
        other.ask(b"set mine 0 0 1\r\nx\r\nlock mine\r\n")
        client = unit.connect()
        self.assertEqual(client.ask(b"get " + b"k" * 1500), b"")
        client.send(b"k" * (unit.store.max_item + 1024))
        self.assertEqual(client.take(), b"CLIENT_ERROR line too long\r\n")
        self.assertTrue(client.closing)
        self.assertEqual(unit.service.status("mine").granted, 1)
        self.assertEqual(other.ask(b"get mine\r\n"), b"VALUE mine 0 1\r\nx\r\nEND\r\n")


class LifecycleTests(SynchronousTestCase):
    def test_disconnect_releases_every_lock_of_the_connection(self) -> None:
        unit = Unit()
        client = unit.connect()
        client.ask(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nlock a\r\n")
        self.assertEqual(responses(client.ask(binary(0x40, b"b"))), [(0x40, 0, 0, b"", b"", b"")])
        self.assertEqual(unit.service.totals().granted, 2)
        client.lose()
        self.assertEqual(unit.service.totals().granted, 0)
        self.assertEqual(unit.connect().ask(b"lock a\r\nlock b\r\n"), b"OK\r\nOK\r\n")

    def test_a_limit_is_a_server_error(self) -> None:
        unit = Unit()
        unit.service.max_held = 1
        client = unit.connect()
        self.assertEqual(
            client.ask(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nlock a\r\nlock b\r\n"),
            b"STORED\r\nSTORED\r\nOK\r\nSERVER_ERROR max-held exceeded (1)\r\n",
        )
        self.assertEqual(
            responses(client.ask(binary(0x40, b"b", opaque=3))), [(0x40, 0x86, 3, b"", b"", b"max-held exceeded (1)")]
        )

    def test_idle_timeout_answered_in_the_protocol_last_spoken(self) -> None:
        unit = Unit(idle_timeout=5)
        text = unit.connect()
        text.ask(b"version\r\n")
        binary_client = unit.connect()
        binary_client.ask(binary(0x0A, opaque=1))
        unit.clock.advance(5)
        self.assertEqual(text.take(), b"SERVER_ERROR idle-timeout exceeded (5)\r\n")
        self.assertEqual(responses(binary_client.take()), [(0x0A, 0x86, 1, b"", b"", b"idle-timeout exceeded (5)")])
        self.assertTrue(text.closing and binary_client.closing)

    def test_max_connections_refused_in_text(self) -> None:
        unit = Unit(connections=Connections(1))
        unit.connect()
        refused = unit.connect()
        self.assertEqual(refused.take(), b"SERVER_ERROR max-connections exceeded (1)\r\n")
        self.assertTrue(refused.closing)


class AuthTests(SynchronousTestCase):
    def unit(self) -> Unit:
        return Unit(auth_token=b"s3cret", auth_timeout=10)

    def test_text_authentication(self) -> None:
        client = self.unit().connect()
        self.assertEqual(client.ask(b"set auth 0 0 11\r\nuser s3cret\r\nset k 0 0 1\r\nv\r\n"), b"STORED\r\nSTORED\r\n")
        self.assertEqual(client.ask(b"get k\r\n"), b"VALUE k 0 1\r\nv\r\nEND\r\n")

    def test_text_wrong_token_closes(self) -> None:
        unit = self.unit()
        client = unit.connect()
        self.assertEqual(
            client.ask(b"set auth 0 0 10\r\nuser wrong\r\nget k\r\n"), b"CLIENT_ERROR authentication failure\r\n"
        )
        self.assertTrue(client.closing)
        no_user = unit.connect()
        self.assertEqual(
            no_user.ask(b"set auth 0 0 6\r\ns3cret\r\n"), b"CLIENT_ERROR bad authentication token format\r\n"
        )

    def test_text_authentication_data_is_short(self) -> None:
        client = self.unit().connect()
        self.assertEqual(client.ask(b"set auth 0 0 5000\r\n"), b"CLIENT_ERROR bad authentication token format\r\n")
        self.assertTrue(client.closing)

    def test_text_command_before_auth(self) -> None:
        client = self.unit().connect()
        self.assertEqual(client.ask(b"get k\r\n"), b"CLIENT_ERROR unauthenticated\r\n")
        self.assertTrue(client.closing)

    def test_sasl_plain(self) -> None:
        client = self.unit().connect()
        self.assertEqual(responses(client.ask(binary(0x20, opaque=1))), [(0x20, 0, 1, b"", b"", b"PLAIN")])
        answer = client.ask(binary(0x21, b"PLAIN", value=b"\0anyone\0s3cret", opaque=2) + binary(0x0A, opaque=3))
        self.assertEqual(responses(answer), [(0x21, 0, 2, b"", b"", b"Authenticated"), (0x0A, 0, 3, b"", b"", b"")])

    def test_sasl_wrong_password_closes(self) -> None:
        client = self.unit().connect()
        answer = client.ask(binary(0x21, b"PLAIN", value=b"\0anyone\0nope", opaque=2) + binary(0x0A, opaque=3))
        self.assertEqual(responses(answer), [(0x21, 0x20, 2, b"", b"", b"Auth failure.")])
        self.assertTrue(client.closing)

    def test_binary_command_before_auth(self) -> None:
        client = self.unit().connect()
        self.assertEqual(
            responses(client.ask(binary(0x00, b"k", opaque=7))), [(0x00, 0x20, 7, b"", b"", b"Auth failure.")]
        )
        self.assertTrue(client.closing)

    def test_every_malformed_text_request_before_auth_is_answered_then_closes(self) -> None:
        """
        Before authentication, every request but a right text or SASL
        authentication is the last: answered (as memcached would answer it;
        silent with noreply), then the connection is closed and nothing after
        it is read.
        """
        unit = self.unit()
        for request, reply in (
            (b"set k 0 0\r\n", b"ERROR\r\n"),
            (b"set k 0 0 1 2 3\r\n", b"ERROR\r\n"),
            (b"set k x 0 5\r\n", b"CLIENT_ERROR bad command line format\r\n"),
            (b"set k 0 0 -1\r\n", b"CLIENT_ERROR bad command line format\r\n"),
            (b"set " + b"k" * 251 + b" 0 0 5\r\n", b"CLIENT_ERROR bad command line format\r\n"),
            (b"set k x 0 5 noreply\r\n", b""),
            (b"set k 0 0 2000\r\n", b"SERVER_ERROR object too large for cache\r\n"),  # (max_item 1000)
            (b"set k 0 0 3\r\nuser s3cret\r\n", b"CLIENT_ERROR bad data chunk\r\n"),
            (b"set k 0 0 3 noreply\r\nuser s3cret\r\n", b""),
            (b"cas k 0 0 11 1\r\nuser s3cret\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
            (b"delete k noreply\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
            (b"\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        ):
            client = unit.connect()
            self.assertEqual(client.ask(request + b"version\r\nset a 0 0 11\r\nuser s3cret\r\n"), reply, request)
            self.assertTrue(client.closing, request)
        self.assertEqual(unit.store.keys(b""), [])

    def test_every_malformed_binary_request_before_auth_is_answered_then_closes(self) -> None:
        unit = self.unit()
        too_long = HEADER.pack(0x80, 0x21, 5, 0, 0, 0, 10_000_000, 4, 0)
        short_body = HEADER.pack(0x80, 0x21, 5, 0, 0, 0, 2, 5, 0) + b"PL"
        for request, expected in (
            (too_long, (0x21, 0x03, 4)),  # longer than the largest frame
            (short_body, (0x21, 0x04, 5)),  # key and extras longer than the body
            (binary(0x20, b"key", opaque=6), (0x20, 0x04, 6)),  # list-mechs takes no key
            (binary(0x21, b"PLAIN", extras=b"\0" * 4, value=b"\0u\0s3cret", opaque=7), (0x21, 0x04, 7)),
            (binary(0x21, value=b"\0u\0s3cret", opaque=8), (0x21, 0x04, 8)),  # no mechanism
            (binary(0x99, opaque=9), (0x99, 0x20, 9)),  # unknown: "Auth failure." as any other
        ):
            client = unit.connect()
            answer = responses(client.ask(request + binary(0x0A, opaque=99)))
            self.assertEqual([(opcode, status, opaque) for opcode, status, opaque, *_ in answer], [expected])
            self.assertTrue(client.closing, request)

    def test_text_authentication_follows_noreply(self) -> None:
        """C{set ... noreply} authenticates silently; a wrong token is as silent, and still closes."""
        unit = self.unit()
        client = unit.connect()
        answer = client.ask(b"set auth 0 0 11 noreply\r\nuser s3cret\r\nversion\r\n")
        self.assertEqual(answer, b"VERSION 1.6.0-jesync\r\n")
        self.assertFalse(client.closing)
        wrong = unit.connect()
        self.assertEqual(wrong.ask(b"set auth 0 0 10 noreply\r\nuser wrong\r\nversion\r\n"), b"")
        self.assertTrue(wrong.closing)
        no_user = unit.connect()
        self.assertEqual(no_user.ask(b"set auth 0 0 6 noreply\r\ns3cret\r\nversion\r\n"), b"")
        self.assertTrue(no_user.closing)

    def test_auth_timeout(self) -> None:
        unit = self.unit()
        client = unit.connect()
        unit.clock.advance(10)
        self.assertEqual(client.take(), b"SERVER_ERROR auth-timeout exceeded (10)\r\n")
        self.assertTrue(client.closing)

    def test_the_token_is_never_logged(self) -> None:
        logged: list[str] = []

        def observe(event: dict) -> None:
            if event.get("log_level") == LogLevel.debug:
                logged.append(repr(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        unit = self.unit()
        unit.factory.verbose = True
        text = unit.connect()
        text.ask(b"set auth 0 0 11\r\nuser s3cret\r\nversion\r\n")
        sasl = unit.connect()
        sasl.ask(binary(0x21, b"PLAIN", value=b"\0anyone\0s3cret"))
        self.assertTrue(logged)
        self.assertFalse([line for line in logged if "s3cret" in line])


class StatsTests(SynchronousTestCase):
    def test_stats_cover_the_store(self) -> None:
        unit = Unit()
        client = unit.connect()
        client.ask(b"set a 0 0 1\r\n1\r\nset b 0 0 2\r\n22\r\nget a b c\r\nlock a\r\n")
        stats = dict(
            line.split(b" ", 2)[1:] for line in client.ask(b"stats\r\n").split(b"\r\n") if line.startswith(b"STAT ")
        )
        self.assertEqual(
            {
                name: stats[name]
                for name in (
                    b"curr_items",
                    b"get_hits",
                    b"get_misses",
                    b"locked_items",
                    b"cmd_set",
                    b"curr_connections",
                )
            },
            {
                b"curr_items": b"2",
                b"get_hits": b"2",
                b"get_misses": b"1",
                b"locked_items": b"1",
                b"cmd_set": b"2",
                b"curr_connections": b"1",
            },
        )
        self.assertEqual(int(stats[b"bytes"]), unit.store.bytes)
        settings = client.ask(b"stats settings\r\n")
        self.assertIn(b"STAT item_size_max 1000\r\n", settings)
        self.assertTrue(settings.endswith(b"END\r\n"))
        packets = responses(client.ask(binary(0x10, opaque=5)))
        self.assertEqual(packets[-1], (0x10, 0, 5, b"", b"", b""))
        self.assertIn((b"curr_items", b"2"), [(key, value) for _, _, _, _, key, value in packets])


class OptionsTests(SynchronousTestCase):
    """--memcache-port, --memcache-memory and --memcache-max-item, as twistd reads them."""

    def factory(self, *argv: str) -> MemcacheFactory:
        from jesync import tap

        server = tap.makeService(parse("--memcache-port", "tcp:0:interface=127.0.0.1", *argv))
        factory = server.factories["memcache"]
        assert isinstance(factory, MemcacheFactory)
        self.assertIn("memcached on tcp:0:interface=127.0.0.1", server.summary)
        return factory

    def test_defaults(self) -> None:
        from jesync import tap

        store = self.factory().store
        self.assertEqual((store.memory, store.max_item), (64 * 1024**2, 1024**2))
        self.assertIsNone(tap.makeService(parse()).factories["memcache"])

    def test_sizes_with_units(self) -> None:
        store = self.factory("--memcache-memory", "1g", "--memcache-max-item", "512k").store
        self.assertEqual((store.memory, store.max_item), (1024**3, 512 * 1024))
        self.assertEqual(
            self.factory("--memcache-memory", "100000", "--memcache-max-item", "64KB").store.max_item, 65536
        )

    def test_bad_values(self) -> None:
        from twisted.python import usage

        for argv in (
            ["--memcache-memory", "0"],
            ["--memcache-memory", "lots"],
            ["--memcache-max-item", "-1m"],
            ["--memcache-memory", "1m", "--memcache-max-item", "2m"],
            ["--memcache-port", "bogus:1"],
        ):
            with self.assertRaises(usage.UsageError, msg=argv):
                parse("--memcache-port", "tcp:0", *argv)

    def test_the_store_is_swept_while_the_server_runs(self) -> None:
        from jesync.server import ServerSettings, build_server

        clock = Clock()
        server = build_server(clock, ServerSettings(ports=[], memcache_ports=[]))
        self.assertIsNone(server.factories["memcache"])
        settings = ServerSettings(ports=[], memcache_ports=["tcp:0:interface=127.0.0.1"])
        server = build_server(clock, settings)
        factory = server.factories["memcache"]
        assert isinstance(factory, MemcacheFactory)
        factory.store.store("set", b"k", b"v", 0, 2, "someone")
        # (only the sweep: the listener is not started on a Clock)
        sweeper = [child for child in server if not hasattr(child, "endpoint")]
        self.assertEqual(len(sweeper), 1)
        sweeper[0].startService()
        clock.advance(1)
        self.assertEqual(len(factory.store), 1)
        clock.pump([1, 1, 1])
        self.assertEqual(len(factory.store), 0)
        sweeper[0].stopService()
