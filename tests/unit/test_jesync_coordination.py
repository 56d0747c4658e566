"""
JESync's coordination extensions, one connection at a time over
L{StringTransport}s and a L{Clock}: values on the wire (percent-encoded),
C{lock}'s value field, C{lock-shared} and C{lock-many-shared}, what
C{holders} and C{status} show of shared holders and values, and
L{LockConnection.write_event}'s output rule.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from jesync.wire import MAX_VALUE, BadRequest, decode_value, encode_value
from jesync.testing import MemoryServer
from tests.support import PausingTransport, UnitServer


class ValueEncodingTests(SynchronousTestCase):
    def test_plain_bytes_are_themselves(self) -> None:
        self.assertEqual(encode_value(b"10.0.0.7:8080"), b"10.0.0.7:8080")

    def test_other_bytes_are_escaped_upper_case(self) -> None:
        self.assertEqual(encode_value(b"a b%\n\xff\x00"), b"a%20b%25%0A%FF%00")

    @given(st.binary(max_size=MAX_VALUE))
    def test_any_bytes_round_trip_as_one_field(self, value: bytes) -> None:
        field = encode_value(value)
        self.assertEqual(field.split(), [field] if field else [])
        self.assertEqual(decode_value(field) if field else b"", value)

    def test_lower_case_hex_is_read(self) -> None:
        self.assertEqual(decode_value(b"%4a%4A"), b"JJ")

    def test_not_percent_encoded(self) -> None:
        for field in (b"%", b"%4", b"%zz", b"a%g0", b"%%41", b"a\rb", b"\xff"):
            with self.subTest(field=field):
                with self.assertRaises(BadRequest) as raised:
                    decode_value(field)
                self.assertEqual(str(raised.exception), "value is not percent-encoded")

    def test_limit_is_on_the_decoded_value(self) -> None:
        self.assertEqual(len(decode_value(b"%00" * MAX_VALUE)), MAX_VALUE)
        with self.assertRaises(BadRequest) as raised:
            decode_value(b"v" * (MAX_VALUE + 1))
        self.assertEqual(str(raised.exception), "A value should be at most 4096 bytes")


class ServerTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitServer()
        self.clock = self.server.clock
        self.service = self.server.service

    def tearDown(self) -> None:
        self.assertEqual(self.flushLoggedErrors(), [])

    def connect(self, transport=None):
        return self.server.connect(transport)


class SharedLockTests(ServerTestCase):
    def test_readers_share_writer_waits(self) -> None:
        first, second, writer = self.connect(), self.connect(), self.connect()
        self.assertEqual(first.ask(b"lock-shared k\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(second.ask(b"lock-shared k -1 30\n"), b"GRANTED 2 0 k 30\n")
        self.assertEqual(writer.ask(b"lock k\nstatus k\n"), b"STATUS 2 1 k shared\n")
        self.assertEqual(first.ask(b"release k\n"), b"RELEASED 1 1 k\n")
        self.assertEqual(second.ask(b"release k\n"), b"RELEASED 1 0 k\n")  # (handed over first)
        self.assertEqual(writer.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(writer.ask(b"status k\n"), b"STATUS 1 0 k\n")

    def test_timeout_reply_as_lock(self) -> None:
        holder, reader = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        self.assertEqual(reader.ask(b"lock-shared k 0\n"), b"TIMEOUT 1 0 k\n")
        self.assertEqual(reader.ask(b"lock-shared k 2\n"), b"")
        self.clock.advance(2)
        self.assertEqual(reader.take(), b"TIMEOUT 1 0 k\n")

    def test_token_per_shared_holder(self) -> None:
        first, second = self.connect(), self.connect()
        self.assertEqual(first.ask(b"fencing on\nlock-shared k\n"), b"FENCING ON\nGRANTED 1 0 k 120 1\n")
        self.assertEqual(second.ask(b"fencing on\nlock-shared k\n"), b"FENCING ON\nGRANTED 2 0 k 120 2\n")

    def test_no_upgrade_no_downgrade(self) -> None:
        reader, writer = self.connect(), self.connect()
        reader.ask(b"lock-shared k\n")
        writer.ask(b"lock x\n")
        self.assertEqual(
            reader.ask(b"lock k\n"),
            b"INVALID_PARAMETER: 'k' is held shared by this owner: no upgrade or downgrade to exclusive;"
            b" release it first\n",
        )
        self.assertEqual(
            writer.ask(b"lock-shared x\n"),
            b"INVALID_PARAMETER: 'x' is held exclusive by this owner: no upgrade or downgrade to shared;"
            b" release it first\n",
        )
        self.assertEqual(reader.ask(b"lock-many 0 10 k\n")[:40], b"INVALID_PARAMETER: 'k' is held shared by")
        self.assertEqual(reader.ask(b"status k\nstatus x\n"), b"STATUS 1 0 k shared\nSTATUS 1 0 x\n")

    def test_renewal_in_the_same_mode(self) -> None:
        reader = self.connect()
        reader.ask(b"lock-shared k -1 10\n")
        self.assertEqual(reader.ask(b"lock-shared k -1 50\n"), b"GRANTED 1 0 k 50\n")

    def test_lock_many_shared(self) -> None:
        first, second, writer = self.connect(), self.connect(), self.connect()
        self.assertEqual(first.ask(b"lock-many-shared 0 10 a b\n"), b"GRANTED-MANY 2 10 a b\n")
        self.assertEqual(second.ask(b"lock-many-shared 0 10 b c\n"), b"GRANTED-MANY 2 10 b c\n")
        self.assertEqual(writer.ask(b"lock-many 0 10 c\n"), b"TIMEOUT-MANY 1 c\n")
        self.assertEqual(writer.ask(b"status-by-key\n"), b"STATUS 1 0 a shared\nSTATUS 2 0 b shared\n"
                         b"STATUS 1 0 c shared\nEND\n")

    def test_invalid_parameters(self) -> None:
        client = self.connect()
        for line, message in [
            (b"lock-shared", b"missing key"),
            (b"lock-shared k x", b"timeout is not an integer"),
            (b"lock-shared k -1 x", b"expires is not an integer"),
            (b"lock-shared k -1 10 v extra", b"too many arguments"),
            (b"lock-shared k -1 10 %", b"value is not percent-encoded"),
            (b"lock-many-shared 0 10", b"lock-many takes a timeout, an expiry and at least one key"),
            (b"lock k 1 -1 10 " + b"v" * 4097, b"A value should be at most 4096 bytes"),
        ]:
            with self.subTest(line=line):
                self.assertEqual(client.ask(line + b"\n"), b"INVALID_PARAMETER: " + message + b"\n")
        self.assertEqual(self.service.listing(), [])


class ValueTests(ServerTestCase):
    def test_holders_show_mode_and_value(self) -> None:
        leader, reader, plain = self.connect(), self.connect(), self.connect()
        self.assertEqual(leader.ask(b"lock lead 1 -1 60 10.0.0.7%3A80%20main\n"), b"GRANTED 1 0 lead 60\n")
        self.assertEqual(reader.ask(b"lock-shared r -1 60 %FF%00\n"), b"GRANTED 1 0 r 60\n")
        plain.ask(b"lock-shared r -1 60\n")
        self.clock.advance(5)
        self.assertEqual(
            plain.ask(b"holders lead\nholders r\n"),
            b"HOLDER lead 127.0.0.1:40001 5 55 1 exclusive 10.0.0.7:80%20main\nEND\n"
            b"HOLDER r 127.0.0.1:40002 5 55 2 shared %FF%00\n"
            b"HOLDER r 127.0.0.1:40003 5 55 3 shared\nEND\n",
        )
        self.assertEqual(self.service.holders("lead")[0].value, b"10.0.0.7:80 main")

    def test_renewal_with_a_value_replaces_it(self) -> None:
        leader = self.connect()
        leader.ask(b"lock k 1 -1 60 one\n")
        leader.ask(b"lock k 1 -1 60\n")
        self.assertEqual(self.service.holders("k")[0].value, b"one")
        leader.ask(b"lock k 1 -1 60 two\n")
        self.assertEqual(self.service.holders("k")[0].value, b"two")

    def test_exclusive_holder_without_value_is_unchanged(self) -> None:
        holder = self.connect()
        holder.ask(b"lock k 2 -1 60\n")
        self.assertEqual(holder.ask(b"holders k\n"), b"HOLDER k 127.0.0.1:40001 0 60 1\nEND\n")
        self.assertEqual(holder.ask(b"status k\nstatus-by-grants\n"), b"STATUS 1 0 k\nSTATUS 1 0 k\nEND\n")


class EventOutputTests(ServerTestCase):
    """L{LockConnection.write_event}: the output rules, never a close inside the table change."""

    def paused_watcher(self):
        client = self.connect(PausingTransport())
        client.protocol.pauseProducing()
        self.clock.advance(0)  # (paused for a whole turn: from now on, what it is sent counts)
        return client

    def test_written_at_once_when_reading(self) -> None:
        client = self.connect()
        client.protocol.write_event(b"EVENT APPEARED k\n")
        self.assertEqual(client.take(), b"EVENT APPEARED k\n")

    def test_past_max_unsent_sent_nothing_more_and_dropped_on_a_later_turn(self) -> None:
        self.server.policy.max_unsent = 100
        client = self.paused_watcher()
        for _ in range(11):
            client.protocol.write_event(b"EVENT RELEASED k 127.0.0.1:1 1\n")  # (31 bytes each)
        self.assertFalse(client.transport.disconnecting)
        self.assertEqual(client.protocol.behind, 124)  # (the fourth passed it: none after it was written)
        self.assertEqual(client.transport.value().count(b"EVENT"), 4)
        self.clock.advance(0)
        self.assertTrue(client.transport.disconnecting)
        self.flushLoggedErrors()

    def test_dropped_even_if_it_caught_up(self) -> None:
        """Past the limit, events were not sent: a watcher that reads them all now is dropped all the same."""
        self.server.policy.max_unsent = 100
        client = self.paused_watcher()
        for _ in range(5):
            client.protocol.write_event(b"EVENT RELEASED k 127.0.0.1:1 1\n")
        client.transport.drain()
        self.clock.advance(0)
        self.assertTrue(client.transport.disconnecting)
        self.flushLoggedErrors()

    def test_not_dropped_below_the_limit(self) -> None:
        self.server.policy.max_unsent = 100
        client = self.paused_watcher()
        for _ in range(3):
            client.protocol.write_event(b"EVENT RELEASED k 127.0.0.1:1 1\n")
        client.transport.drain()
        self.clock.advance(0)
        self.assertFalse(client.transport.disconnecting)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 0 0 k\n")

    def test_counted_from_the_first_turn_paused(self) -> None:
        """Unlike replies, events count as soon as the transport pauses: one turn's burst is bounded too."""
        self.server.policy.max_unsent = 10
        client = self.connect(PausingTransport())
        client.protocol.pauseProducing()
        client.protocol.write_event(b"EVENT APPEARED some-key\n")
        client.protocol.write_event(b"EVENT APPEARED other-key\n")
        self.assertEqual(client.transport.value(), b"EVENT APPEARED some-key\n")
        self.clock.advance(0)
        self.assertTrue(client.transport.disconnecting)
        self.flushLoggedErrors()


class WatchTests(ServerTestCase):
    def test_events_in_the_order_of_the_changes(self) -> None:
        watcher, first, second = self.connect(), self.connect(), self.connect()
        self.assertEqual(watcher.ask(b"watch k\n"), b"WATCHING k\n")
        first.ask(b"lock k 1 -1 10\n")
        second.ask(b"lock k\n")
        self.assertEqual(first.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.clock.advance(120)
        self.assertEqual(
            watcher.take(),
            b"EVENT GRANTED k 127.0.0.1:40002 1 exclusive\n"
            b"EVENT RELEASED k 127.0.0.1:40002 1\n"
            b"EVENT GRANTED k 127.0.0.1:40003 2 exclusive\n"
            b"EVENT EXPIRED k 127.0.0.1:40003 2\n",
        )

    def test_own_change_comes_before_the_reply(self) -> None:
        client = self.connect()
        self.assertEqual(
            client.ask(b"watch k\nlock-shared k -1 30 me\nrelease k\n"),
            b"WATCHING k\nEVENT GRANTED k 127.0.0.1:40001 1 shared me\nGRANTED 1 0 k 30\n"
            b"EVENT RELEASED k 127.0.0.1:40001 1\nRELEASED 0 0 k\n",
        )

    def test_lost_after_a_disconnect(self) -> None:
        watcher, holder = self.connect(), self.connect()
        watcher.ask(b"watch-prefix\n")
        holder.ask(b"lock a\nlock-many 0 10 b c\n")
        watcher.take()
        holder.lose()
        self.assertEqual(
            sorted(watcher.take().splitlines()),
            [b"EVENT DISAPPEARED a", b"EVENT DISAPPEARED b", b"EVENT DISAPPEARED c",
             b"EVENT LOST a 127.0.0.1:40002 1", b"EVENT LOST b 127.0.0.1:40002 2", b"EVENT LOST c 127.0.0.1:40002 3"],
        )

    def test_watching_again_changes_nothing(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"watch k\nwatch k\n"), b"WATCHING k\nWATCHING k\n")
        self.assertEqual(client.ask(b"watch-prefix\nwatch-prefix\n"), b"WATCHING-PREFIX\nWATCHING-PREFIX\n")
        self.assertEqual(self.service.watches_of(client.protocol), 2)
        client.ask(b"lock k\n")  # (told once, though two watches match)
        self.assertEqual(
            client.ask(b"release k\n"), b"EVENT RELEASED k 127.0.0.1:40001 1\nEVENT DISAPPEARED k\nRELEASED 0 0 k\n"
        )

    def test_unwatch(self) -> None:
        watcher, holder = self.connect(), self.connect()
        watcher.ask(b"watch k\nwatch-prefix j/\n")
        self.assertEqual(
            watcher.ask(b"unwatch k\nunwatch k\nunwatch-prefix j/\nunwatch-prefix j/\nunwatch-prefix\n"),
            b"UNWATCHED k\nNOT_WATCHING k\nUNWATCHED-PREFIX j/\nNOT_WATCHING-PREFIX j/\nNOT_WATCHING-PREFIX\n",
        )
        holder.ask(b"lock k\nlock j/1\n")
        self.assertEqual(watcher.ask(b"status k\n"), b"STATUS 1 0 k\n")

    def test_caps(self) -> None:
        self.service.max_watches = 2
        self.service.max_total_watches = 3
        first, second = self.connect(), self.connect()
        self.assertEqual(
            first.ask(b"watch a\nwatch-prefix b\nwatch c\nwatch a\n"),
            b"WATCHING a\nWATCHING-PREFIX b\nINVALID_PARAMETER: max-watches exceeded (2)\nWATCHING a\n",
        )
        self.assertEqual(
            second.ask(b"watch a\nwatch-prefix\n"),
            b"WATCHING a\nINVALID_PARAMETER: max-total-watches exceeded (3)\n",
        )
        self.assertEqual(self.service.watches_of(second.protocol), 1)

    def test_bad_keys(self) -> None:
        self.server.policy.max_key_length = 4
        client = self.connect()
        self.assertEqual(
            client.ask(b"watch\nwatch a b\nwatch a\rb\nwatch-prefix abcde\nunwatch abcde\n"),
            b"INVALID_PARAMETER: missing key\nINVALID_PARAMETER: too many arguments\n"
            b"INVALID_PARAMETER: a key cannot contain a carriage return\n"
            b"INVALID_PARAMETER: max-key-length exceeded (4)\nINVALID_PARAMETER: max-key-length exceeded (4)\n",
        )
        self.assertEqual(self.service.watches_of(client.protocol), 0)

    def test_prefix_compared_as_keys_are(self) -> None:
        """docs/protocols/jesync.md: a prefix ending inside a UTF-8 character matches only keys not UTF-8 there."""
        watcher, holder = self.connect(), self.connect()
        self.assertEqual(watcher.ask(b"watch-prefix \xc3\n"), b"WATCHING-PREFIX \xc3\n")
        holder.ask("lock é\n".encode() + b"lock \xc3\xff\n")
        self.assertEqual(
            watcher.take(), b"EVENT APPEARED \xc3\xff\nEVENT GRANTED \xc3\xff 127.0.0.1:40002 2 exclusive\n"
        )

    def test_watches_end_with_the_connection(self) -> None:
        client = self.connect()
        client.ask(b"watch k\n")
        client.lose()
        self.assertEqual(self.service.watch_count, 0)

    def test_quit_sends_nothing_more(self) -> None:
        """A watcher's own locks given back at its quit are no events to it: nothing follows a quit."""
        client = self.connect()
        client.ask(b"watch-prefix\nlock k\n")
        self.assertEqual(client.ask(b"quit\n"), b"")
        self.assertTrue(client.closing)
        self.assertEqual(self.service.watch_count, 0)

    def test_a_watcher_is_not_idle(self) -> None:
        self.server.policy.idle_timeout = 5
        watcher, quiet = self.connect(), self.connect()
        watcher.ask(b"watch k\n")
        self.clock.advance(6)
        self.assertEqual((watcher.closing, quiet.closing), (False, True))
        watcher.ask(b"unwatch k\n")
        self.clock.advance(6)
        self.assertTrue(watcher.closing)

    def test_non_reading_watcher_dropped_on_a_later_turn(self) -> None:
        """
        Past --max-unsent, a watcher that does not read is dropped on the
        turn after the change that took it past, not inside it: the request
        that made the change is answered, and what the watcher held is given
        back once it is gone.
        """
        self.server.policy.max_unsent = 200
        watcher = self.connect(PausingTransport())
        self.assertEqual(watcher.ask(b"lock mine\nwatch k\n"), b"GRANTED 1 0 mine 120\nWATCHING k\n")
        watcher.protocol.pauseProducing()
        self.clock.advance(0)
        worker, other = self.connect(), self.connect()
        other.ask(b"lock mine\n")
        for _ in range(4):
            self.assertEqual(worker.ask(b"lock k\nrelease k\n"), b"GRANTED 1 0 k 120\nRELEASED 0 0 k\n")
        self.assertGreater(watcher.protocol.behind, 200)
        self.assertFalse(watcher.closing)
        self.assertEqual(other.take(), b"")
        self.clock.advance(0)
        self.assertTrue(watcher.closing)
        watcher.lose()
        self.assertEqual(other.take(), b"GRANTED 1 0 mine 120\n")
        self.assertEqual(self.service.watch_count, 0)


class DocsTranscriptTests(ServerTestCase):
    """
    The transcripts of docs/protocols/jesync.md's commands (its example, shared
    locks and values, watches) are what the server sends: each is replayed,
    client C<n> connecting from 10.0.0.<n>:5000<n>; every line the page
    shows a client being sent is the next one it reads, and it reads nothing else.
    """

    def replay(self, transcript: str) -> None:
        from tests.doc_pages import replay_transcript

        replay_transcript(self, self.server, transcript)

    def test_every_transcript(self) -> None:
        from tests.doc_pages import page_blocks

        transcripts = page_blocks("docs/protocols/jesync.md", "", "Commands")
        self.assertEqual(len(transcripts), 3)
        for transcript in transcripts:
            with self.subTest(transcript=transcript.splitlines()[0]):
                self.setUp()
                self.replay(transcript)


class GivenBackOverOtherProtocolsTests(SynchronousTestCase):
    """Over every protocol, a holder that gives everything back is released; one that goes away is lost."""

    def setUp(self) -> None:
        self.server = MemoryServer(elock_ports=["tcp:11401"], memcache_ports=["tcp:11211"])
        self.addCleanup(self.server.stop)
        self.watcher = self.server.connect()
        self.assertEqual(self.watcher.ask(b"watch k\n"), b"WATCHING k\n")

    def events(self) -> list:
        return [line.split()[1] for line in self.watcher.received().splitlines()]

    def test_elock_unlock_all_releases(self) -> None:
        elock = self.server.connect("elock")
        self.assertEqual(elock.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(elock.ask(b"unlock_all\r\n"), b"200 OK\r\n")
        self.assertEqual(self.events(), [b"GRANTED", b"RELEASED"])

    def test_memcached_unlock_all_releases_and_a_disconnect_loses(self) -> None:
        memcache = self.server.connect("memcache")
        self.assertEqual(memcache.ask(b"set k 0 0 1\r\nx\r\nlock k\r\n"), b"STORED\r\nOK\r\n")
        self.assertEqual(memcache.ask(b"unlock_all\r\n"), b"OK\r\n")
        self.assertEqual(memcache.ask(b"lock k\r\n"), b"OK\r\n")
        memcache.close()
        self.server.flush()
        self.assertEqual(self.events(), [b"GRANTED", b"RELEASED", b"GRANTED", b"LOST"])


class EmptyValueTests(SynchronousTestCase):
    def test_an_empty_value_is_shown_as_none(self) -> None:
        """An embedder's grant with the value b"" is shown as one without: a field is never empty."""
        server = MemoryServer()
        self.addCleanup(server.stop)
        watcher = server.connect()
        self.assertEqual(watcher.ask(b"watch k\n"), b"WATCHING k\n")
        grant = server.service.request("k", "embedded", value=b"")
        self.assertEqual(grant.value, b"")
        server.flush()
        self.assertEqual(watcher.received(), b"EVENT GRANTED k 'embedded' %d exclusive\n" % grant.token)
        self.assertEqual(watcher.ask(b"holders k\n"), b"HOLDER k 'embedded' 0 120 %d\nEND\n" % grant.token)
