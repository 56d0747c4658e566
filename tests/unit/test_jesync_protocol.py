"""
The JESync protocol, one connection at a time, over L{StringTransport}s and a
L{Clock}: every request and reply of the protocol, byte for byte.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv6Address, UNIXAddress
from twisted.internet.error import ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, Logger, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from jesync.protocols.jesync import JESyncFactory
from jesync.connections.grammar import Grammar
from jesync.service import LockService
from tests.support import INVALID_PARAMETER_CASES, PausingTransport, UnitServer


class ServerTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitServer()
        self.clock = self.server.clock
        self.service = self.server.service

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    def connect(self):
        return self.server.connect()


class LockTests(ServerTestCase):
    def test_lock_defaults(self) -> None:
        """max_concurrent 1, wait for ever, expire after 120 seconds."""
        first, second = self.connect(), self.connect()
        self.assertEqual(first.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(second.ask(b"lock k\n"), b"")
        self.clock.advance(119)
        self.assertEqual(second.take(), b"")
        self.assertEqual(first.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.clock.advance(1)
        self.assertEqual(second.take(), b"GRANTED 1 0 k 120\n")

    def test_max_concurrent(self) -> None:
        clients = [self.connect() for _ in range(4)]
        self.assertEqual(clients[0].ask(b"lock k 3\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(clients[1].ask(b"lock k 3\n"), b"GRANTED 2 0 k 120\n")
        self.assertEqual(clients[2].ask(b"lock k 3\n"), b"GRANTED 3 0 k 120\n")
        self.assertEqual(clients[3].ask(b"lock k 3\nstatus k\n"), b"STATUS 3 1 k\n")
        self.assertEqual(clients[1].ask(b"release k\n"), b"RELEASED 3 0 k\n")
        self.assertEqual(clients[3].take(), b"GRANTED 3 0 k 120\n")

    def test_stricter_holder_limits_others(self) -> None:
        """A holder that admitted the key with max_concurrent 1 keeps it exclusive."""
        first, second = self.connect(), self.connect()
        self.assertEqual(first.ask(b"lock k 1\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(second.ask(b"lock k 5\nstatus k\n"), b"STATUS 1 1 k\n")

    def test_less_strict_request_passes_stricter_one(self) -> None:
        """docs/protocols/jesync.md's grant rule: a waiting lock k 1 stays queued while a later lock k 3 is granted."""
        holder, strict, loose = self.connect(), self.connect(), self.connect()
        self.assertEqual(holder.ask(b"lock k 3\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(strict.ask(b"lock k 1\nstatus k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(loose.ask(b"lock k 3\n"), b"GRANTED 2 1 k 120\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 1 k\n")
        self.assertEqual(loose.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(strict.take(), b"GRANTED 1 0 k 120\n")

    def test_protocol_md_example(self) -> None:
        c1, c2 = self.connect(), self.connect()
        self.assertEqual(c1.ask(b"lock report 1 -1 60\n"), b"GRANTED 1 0 report 60\n")
        self.assertEqual(c2.ask(b"lock report 1 30\nstatus report\n"), b"STATUS 1 1 report\n")
        self.assertEqual(c1.ask(b"release report\n"), b"RELEASED 1 0 report\n")
        self.assertEqual(c2.ask(b"status-by-key\n"), b"GRANTED 1 0 report 120\nSTATUS 1 0 report\nEND\n")

    def test_timeout_and_expires(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"lock k 1 10 30\n"), b"GRANTED 1 0 k 30\n")
        self.clock.advance(29)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.clock.advance(1)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 0 0 k\n")
        self.assertEqual(client.take(), b"")

    def test_expires_zero_never_expires(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"lock k 1 -1 0\n"), b"GRANTED 1 0 k 0\n")
        self.clock.advance(10**7)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(client.ask(b"lock k 1 -1 0\n"), b"GRANTED 1 0 k 0\n")

    def test_seconds_left_counts_from_grant(self) -> None:
        """A waiter's expiry starts when it is granted, not when it asked."""
        first, second = self.connect(), self.connect()
        first.ask(b"lock k\n")
        self.assertEqual(second.ask(b"lock k 1 -1 30\n"), b"")
        self.clock.advance(50)
        self.assertEqual(first.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(second.take(), b"GRANTED 1 0 k 30\n")

    def test_waiting_lock_does_not_block_connection(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        self.assertEqual(
            waiter.ask(b"lock k\nstatus k\nlock other\nstatus-by-key\n"),
            b"STATUS 1 1 k\nGRANTED 1 0 other 120\nSTATUS 1 1 k\nSTATUS 1 0 other\nEND\n",
        )
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")

    def test_timeout(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k 1 5\n"), b"")
        self.clock.advance(4.99)
        self.assertEqual(waiter.take(), b"")
        self.clock.advance(0.01)
        self.assertEqual(waiter.take(), b"TIMEOUT 1 0 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 0 0 k\n")
        self.assertEqual(waiter.take(), b"")

    def test_timeout_counts_other_waiters(self) -> None:
        holder, patient, impatient = self.connect(), self.connect(), self.connect()
        holder.ask(b"lock k\n")
        patient.ask(b"lock k\n")
        self.assertEqual(impatient.ask(b"lock k 1 1\n"), b"")
        self.clock.advance(1)
        self.assertEqual(impatient.take(), b"TIMEOUT 1 1 k\n")

    def test_timeout_zero_answers_at_once(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k 1 0\n"), b"TIMEOUT 1 0 k\n")
        self.assertEqual(waiter.ask(b"lock free 1 0\n"), b"GRANTED 1 0 free 120\n")

    def test_wait_for_ever(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k 1 -1 0\n")
        self.assertEqual(waiter.ask(b"lock k 1 -1\n"), b"")
        self.clock.advance(10**6)
        self.assertEqual(waiter.ask(b"status k\n"), b"STATUS 1 1 k\n")
        holder.ask(b"release k\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")

    def test_fifo_order(self) -> None:
        holder = self.connect()
        waiters = [self.connect() for _ in range(3)]
        holder.ask(b"lock k\n")
        for waiter in waiters:
            self.assertEqual(waiter.ask(b"lock k\n"), b"")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 2 k\n")
        self.assertEqual([w.take() for w in waiters], [b"GRANTED 1 2 k 120\n", b"", b""])
        self.assertEqual(waiters[0].ask(b"release k\n"), b"RELEASED 1 1 k\n")
        self.assertEqual([w.take() for w in waiters], [b"", b"GRANTED 1 1 k 120\n", b""])


class RenewalTests(ServerTestCase):
    def test_lock_again_while_holding_restarts_expiry(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.clock.advance(100)
        self.assertEqual(client.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.clock.advance(100)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.clock.advance(20)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 0 0 k\n")

    def test_renewal_takes_new_expires(self) -> None:
        client = self.connect()
        client.ask(b"lock k 1 -1 0\n")
        self.assertEqual(client.ask(b"lock k 1 -1 7\n"), b"GRANTED 1 0 k 7\n")
        self.clock.advance(7)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 0 0 k\n")

    def test_renewal_with_waiters_keeps_counts(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        waiter.ask(b"lock k\n")
        self.assertEqual(holder.ask(b"lock k 1 -1 60\n"), b"GRANTED 1 1 k 60\n")

    def test_lock_again_while_waiting_answered_once(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k\nlock k 1 5\nlock k 3 0 9\nstatus k\n"), b"STATUS 1 1 k\n")
        self.clock.advance(6)  # the repeated request's timeout means nothing
        self.assertEqual(waiter.take(), b"")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")
        self.clock.advance(1000)
        self.assertEqual(waiter.take(), b"")


class ExpiryTests(ServerTestCase):
    def test_owner_not_told_and_waiter_granted(self) -> None:
        owner, waiter = self.connect(), self.connect()
        self.assertEqual(owner.ask(b"lock k 1 -1 10\n"), b"GRANTED 1 0 k 10\n")
        waiter.ask(b"lock k 1 -1 20\n")
        self.clock.advance(10)
        self.assertEqual(owner.take(), b"")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 20\n")
        self.assertEqual(owner.ask(b"release k\n"), b"NOT_RELEASED 1 0 k\n")
        self.assertEqual(waiter.ask(b"release k\n"), b"RELEASED 0 0 k\n")

    def test_expired_key_is_forgotten(self) -> None:
        owner = self.connect()
        owner.ask(b"lock k 1 -1 1\n")
        self.clock.advance(1)
        self.assertEqual(owner.ask(b"release k\n"), b"NOT_RELEASED 0 0 k\n")
        self.assertEqual(owner.ask(b"status-by-key\n"), b"END\n")
        self.assertEqual(owner.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")


class ReleaseTests(ServerTestCase):
    def test_released(self) -> None:
        client = self.connect()
        client.ask(b"lock k\n")
        self.assertEqual(client.ask(b"release k\n"), b"RELEASED 0 0 k\n")
        self.assertEqual(client.ask(b"release k\n"), b"NOT_RELEASED 0 0 k\n")

    def test_never_held(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"release k\n"), b"NOT_RELEASED 0 0 k\n")

    def test_held_by_another(self) -> None:
        holder, other = self.connect(), self.connect()
        holder.ask(b"lock k 2\n")
        self.assertEqual(other.ask(b"release k\n"), b"NOT_RELEASED 1 0 k\n")
        self.assertEqual(holder.ask(b"status k\n"), b"STATUS 1 0 k\n")

    def test_while_waiting_wait_stands(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        waiter.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"release k\n"), b"NOT_RELEASED 1 1 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")

    def test_counts_after_handover(self) -> None:
        clients = [self.connect() for _ in range(4)]
        for client in clients:
            client.ask(b"lock k 2\n")
        self.assertEqual(clients[0].ask(b"release k\n"), b"RELEASED 2 1 k\n")
        self.assertEqual(clients[2].take(), b"GRANTED 2 1 k 120\n")


class StatusTests(ServerTestCase):
    def test_unused_key(self) -> None:
        self.assertEqual(self.connect().ask(b"status nobody-uses-this\n"), b"STATUS 0 0 nobody-uses-this\n")

    def test_counts(self) -> None:
        clients = [self.connect() for _ in range(5)]
        for client in clients:
            client.ask(b"lock k 2\n")
        self.assertEqual(clients[0].ask(b"status k\n"), b"STATUS 2 3 k\n")

    def make_listing(self) -> None:
        # created in reverse order so insertion order cannot pass for sorting
        c1, c2, c3, c4 = (self.connect() for _ in range(4))
        for command in (b"lock d\n", b"lock c\n", b"lock b 3\n", b"lock a\n"):
            c1.ask(command)
        c2.ask(b"lock a\nlock b 3\n")
        c3.ask(b"lock a\nlock d\n")
        c4.ask(b"lock d\n")
        self.client = self.connect()

    def test_status_by_key(self) -> None:
        self.make_listing()
        self.assertEqual(
            self.client.ask(b"status-by-key\n"),
            b"STATUS 1 2 a\nSTATUS 2 0 b\nSTATUS 1 0 c\nSTATUS 1 2 d\nEND\n",
        )

    def test_status_by_requests(self) -> None:
        self.make_listing()
        self.assertEqual(
            self.client.ask(b"status-by-requests\n"),
            b"STATUS 1 2 a\nSTATUS 1 2 d\nSTATUS 2 0 b\nSTATUS 1 0 c\nEND\n",
        )

    def test_status_by_grants(self) -> None:
        self.make_listing()
        self.assertEqual(
            self.client.ask(b"status-by-grants\n"),
            b"STATUS 2 0 b\nSTATUS 1 2 a\nSTATUS 1 0 c\nSTATUS 1 2 d\nEND\n",
        )

    def test_empty_listings(self) -> None:
        client = self.connect()
        self.assertEqual(
            client.ask(b"status-by-key\nstatus-by-requests\nstatus-by-grants\n"), b"END\nEND\nEND\n"
        )

    def test_released_keys_leave_listing(self) -> None:
        client = self.connect()
        client.ask(b"lock a\nlock b\n")
        self.assertEqual(client.ask(b"release a\nstatus-by-key\n"), b"RELEASED 0 0 a\nSTATUS 1 0 b\nEND\n")


class OwnedTests(ServerTestCase):
    def test_owned(self) -> None:
        client, other = self.connect(), self.connect()
        self.assertEqual(client.ask(b"owned k\n"), b"NOT_OWNED k\n")
        client.ask(b"lock k 1 -1 30\n")
        self.clock.advance(10.25)
        self.assertEqual(client.ask(b"owned k\n"), b"OWNED 19750 k\n")
        self.assertEqual(other.ask(b"owned k\n"), b"NOT_OWNED k\n")  # held, but not by this connection
        other.ask(b"lock j 1 -1 0\n")
        self.assertEqual(other.ask(b"owned j\n"), b"OWNED -1 j\n")
        self.clock.advance(20)  # the failsafe expiry
        self.assertEqual(client.ask(b"owned k\n"), b"NOT_OWNED k\n")
        self.assertEqual(client.ask(b"owned\n"), b"INVALID_PARAMETER: missing key\n")


class QuitTests(ServerTestCase):
    def test_quit_closes_without_reply(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"quit\n"), b"")
        self.assertTrue(client.closing)

    def test_later_commands_ignored(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"status k\nquit\nlock k\nstatus k\n"), b"STATUS 0 0 k\n")
        client.lose()
        self.assertEqual(self.connect().ask(b"status k\n"), b"STATUS 0 0 k\n")

    def test_quit_releases_everything_at_once(self) -> None:
        quitter, waiter, observer = self.connect(), self.connect(), self.connect()
        observer.ask(b"lock w\n")
        quitter.ask(b"lock a\nlock b 2\nlock w\n")
        waiter.ask(b"lock a\nlock b 1\n")
        self.assertEqual(observer.ask(b"status-by-key\n"), b"STATUS 1 1 a\nSTATUS 1 1 b\nSTATUS 1 1 w\nEND\n")
        quitter.ask(b"quit\n")
        # before the transport even reports the connection lost
        self.assertEqual(waiter.take(), b"GRANTED 1 0 a 120\nGRANTED 1 0 b 120\n")
        self.assertEqual(observer.ask(b"status-by-key\n"), b"STATUS 1 0 a\nSTATUS 1 0 b\nSTATUS 1 0 w\nEND\n")
        quitter.lose()
        self.assertEqual(observer.ask(b"status-by-key\n"), b"STATUS 1 0 a\nSTATUS 1 0 b\nSTATUS 1 0 w\nEND\n")
        self.assertEqual(quitter.take(), b"")

    def test_client_half_close(self) -> None:
        """
        The client shut down its sending side: what it sent is answered, then
        the connection is closed and everything it had is released.
        """
        client, waiter = self.connect(), self.connect()
        self.assertEqual(client.ask(b"lock k\nlock j\n"), b"GRANTED 1 0 k 120\nGRANTED 1 0 j 120\n")
        waiter.ask(b"lock k\n")
        client.send(b"status k\nstatus j")
        client.protocol.readConnectionLost()
        self.assertEqual(client.take(), b"STATUS 1 1 k\n")
        self.assertTrue(client.closing)
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(waiter.ask(b"status-by-key\n"), b"STATUS 1 0 k\nEND\n")

    def test_quit_with_arguments(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"quit now\n"), b"INVALID_PARAMETER: too many arguments\n")
        self.assertFalse(client.closing)

    def test_quit_case_sensitive(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"QUIT\n"), b"INVALID_COMMAND\n")
        self.assertFalse(client.closing)


class InvalidCommandTests(ServerTestCase):
    def test_invalid_commands(self) -> None:
        client = self.connect()
        for line in [
            b"",
            b"\r",
            b"   ",
            b" \t \x0b\x0c ",
            b"hello",
            b"hello k",
            b"LOCK k",
            b"Lock k",
            b"RELEASE k",
            b"STATUS k",
            b"Status-By-Key",
            b"lockk",
            b"status_by_key",
            b"status-by",
            b"\x00",
            b"\xff\xfe\x80 k",
            b"l\xc3\xb6ck k",
        ]:
            self.assertEqual(client.ask(line + b"\n"), b"INVALID_COMMAND\n", line)
        self.assertFalse(client.closing)
        self.assertEqual(client.ask(b"status k\n"), b"STATUS 0 0 k\n")
        self.assertEqual(self.service.listing(), [])

    def test_garbage_bytes(self) -> None:
        client = self.connect()
        garbage = bytes(range(256)).replace(b"\n", b"").replace(b" ", b"")
        self.assertEqual(client.ask(garbage + b"\n" + garbage[::-1] + b"\r\n"), b"INVALID_COMMAND\n" * 2)
        self.assertEqual(client.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")


class InvalidParameterTests(ServerTestCase):
    cases = INVALID_PARAMETER_CASES

    def test_invalid_parameters(self) -> None:
        holder, client = self.connect(), self.connect()
        holder.ask(b"lock k 1 -1 0\n")
        for line, message in self.cases:
            self.assertEqual(client.ask(line + b"\n"), b"INVALID_PARAMETER: " + message + b"\n", line)
            self.assertFalse(client.closing)
        # nothing changed, and the connection is still usable
        self.assertEqual(client.ask(b"status-by-key\n"), b"STATUS 1 0 k\nEND\n")
        self.assertEqual(client.ask(b"lock k2\n"), b"GRANTED 1 0 k2 120\n")

    def test_largest_numbers_accepted(self) -> None:
        client = self.connect()
        self.assertEqual(
            client.ask(b"lock k 2147483647 2147483647 2147483647\n"), b"GRANTED 1 0 k 2147483647\n"
        )
        self.assertEqual(client.ask(b"lock j 0001 -0 000\n"), b"GRANTED 1 0 j 0\n")


class DisconnectTests(ServerTestCase):
    def setup_holder_and_waiter(self):
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\nlock j 1 -1 0\n")
        self.assertEqual(waiter.ask(b"lock k\nlock j\n"), b"")
        return holder, waiter

    def test_clean_close_releases(self) -> None:
        holder, waiter = self.setup_holder_and_waiter()
        holder.lose()
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\nGRANTED 1 0 j 120\n")

    def test_abort_releases(self) -> None:
        holder, waiter = self.setup_holder_and_waiter()
        holder.lose(ConnectionLost)
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\nGRANTED 1 0 j 120\n")

    def test_mid_line_releases(self) -> None:
        holder, waiter = self.setup_holder_and_waiter()
        holder.send(b"release k")  # never finished: never executed
        self.assertEqual(holder.take(), b"")
        holder.lose(ConnectionLost)
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\nGRANTED 1 0 j 120\n")

    def test_waiter_leaving_passes_turn(self) -> None:
        holder, waiter = self.setup_holder_and_waiter()
        third = self.connect()
        self.assertEqual(third.ask(b"lock k\nstatus k\n"), b"STATUS 1 2 k\n")
        waiter.lose()
        self.assertEqual(third.ask(b"status-by-key\n"), b"STATUS 1 0 j\nSTATUS 1 1 k\nEND\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(third.take(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(waiter.take(), b"")

    def test_everything_forgotten(self) -> None:
        clients = [self.connect() for _ in range(20)]
        for i, client in enumerate(clients):
            client.ask(b"lock shared 3\nlock own%d\nlock k 1 100\n" % i)
        for i, client in enumerate(clients):
            client.take()
            client.lose(ConnectionLost)
            # the next ones may be granted; nothing goes to the ones gone
            self.assertEqual([c.take() for c in clients[: i + 1]], [b""] * (i + 1))
        self.assertEqual(self.service.listing(), [])
        self.clock.advance(1000)
        self.assertEqual([c.take() for c in clients], [b""] * 20)


class OpaqueKeyTests(ServerTestCase):
    def test_invalid_utf8_and_nul_keys(self) -> None:
        client, other = self.connect(), self.connect()
        for key in [b"\xff\xfe", b"a\x00b", b"\x00", b"\xc3", b"\xed\xa0\x80", b"caf\xc3\xa9", b"\x80\x81\x01\x7f"]:
            self.assertEqual(client.ask(b"lock " + key + b"\n"), b"GRANTED 1 0 " + key + b" 120\n")
            self.assertEqual(other.ask(b"lock " + key + b" 1 0\n"), b"TIMEOUT 1 0 " + key + b"\n")
            self.assertEqual(other.ask(b"status " + key + b"\n"), b"STATUS 1 0 " + key + b"\n")
            self.assertEqual(other.ask(b"release " + key + b"\n"), b"NOT_RELEASED 1 0 " + key + b"\n")
            self.assertEqual(client.ask(b"release " + key + b"\n"), b"RELEASED 0 0 " + key + b"\n")

    def test_distinct_byte_strings_are_distinct_keys(self) -> None:
        client = self.connect()
        # U+00FF as UTF-8, and the lone byte 0xFF; U+0000 and the empty-ish NUL
        self.assertEqual(client.ask(b"lock \xc3\xbf\n"), b"GRANTED 1 0 \xc3\xbf 120\n")
        self.assertEqual(client.ask(b"lock \xff\n"), b"GRANTED 1 0 \xff 120\n")
        self.assertEqual(client.ask(b"status \xff\n"), b"STATUS 1 0 \xff\n")
        self.assertEqual(client.ask(b"release \xc3\xbf\n"), b"RELEASED 0 0 \xc3\xbf\n")
        self.assertEqual(client.ask(b"status \xff\n"), b"STATUS 1 0 \xff\n")

    def test_listing_echoes_keys_exactly(self) -> None:
        client = self.connect()
        client.ask(b"lock b\xff\nlock a\x00\nlock \xe2\x82\xac\n")
        self.assertEqual(
            client.ask(b"status-by-key\n"),
            b"STATUS 1 0 a\x00\nSTATUS 1 0 b\xff\nSTATUS 1 0 \xe2\x82\xac\nEND\n",
        )

    @settings(max_examples=200, deadline=None)
    @given(st.binary(min_size=1, max_size=64).filter(lambda key: key.split() == [key]))
    def test_any_key_round_trips(self, key: bytes) -> None:
        client = UnitServer().connect()
        self.assertEqual(
            client.ask(b"lock %s\nstatus %s\nstatus-by-grants\nrelease %s\nstatus %s\n" % ((key,) * 4)),
            b"GRANTED 1 0 %s 120\nSTATUS 1 0 %s\nSTATUS 1 0 %s\nEND\nRELEASED 0 0 %s\nSTATUS 0 0 %s\n"
            % ((key,) * 5),
        )


class BackpressureTests(ServerTestCase):
    """A client that does not read its replies stops being read."""

    def test_paused_connection_answers_when_resumed(self) -> None:
        client = self.connect()
        client.protocol.pauseProducing()
        self.assertEqual(client.transport.producerState, "paused")
        self.assertEqual(client.ask(b"status a\nstatus b\n"), b"")
        client.protocol.resumeProducing()
        self.assertEqual(client.take(), b"STATUS 0 0 a\nSTATUS 0 0 b\n")

    def test_grant_delivered_while_paused(self) -> None:
        holder, waiter = self.connect(), self.connect()
        holder.ask(b"lock k\n")
        waiter.ask(b"lock k\n")
        waiter.protocol.pauseProducing()
        holder.ask(b"release k\n")
        self.assertEqual(waiter.take(), b"GRANTED 1 0 k 120\n")

    def test_big_pipelined_chunk_is_paused_not_refused(self) -> None:
        """
        Replies to one chunk of pipelined commands fill the transport buffer;
        the rest of the chunk waits (it is not a line too long) and is
        answered as the replies drain.
        """
        transport = PausingTransport()
        client = self.server.connect(transport)
        count = 20000
        client.send(b"status x\n" * count + b"status end\n")
        self.assertEqual(transport.producerState, "paused")
        self.assertFalse(client.closing)
        replies = b""
        for _ in range(100):
            chunk = transport.drain()
            if not chunk:
                break
            # never more than the buffer plus one reply
            self.assertLessEqual(len(chunk), transport.bufferSize + len(b"STATUS 0 0 x\n"))
            replies += chunk
        self.assertEqual(replies, b"STATUS 0 0 x\n" * count + b"STATUS 0 0 end\n")
        self.assertEqual(transport.producerState, "producing")
        self.assertFalse(client.closing)

    def test_long_partial_line_after_pause_still_refused(self) -> None:
        transport = PausingTransport()
        client = self.server.connect(transport)
        client.send(b"status x\n" * 10000 + b"y" * 9000)
        self.assertFalse(client.closing)
        replies = b""
        while True:
            chunk = transport.drain()
            if not chunk:
                break
            replies += chunk
        self.assertEqual(replies, b"STATUS 0 0 x\n" * 10000 + b"INVALID_PARAMETER: line too long\n")
        self.assertTrue(client.closing)


class LoggingTests(ServerTestCase):
    def capture(self) -> list[dict]:
        events: list[dict] = []
        self.patch(Grammar, "log", Logger(observer=events.append))
        return events

    def lines(self, events: list[dict]) -> list[tuple[str, str]]:
        return [(event["log_level"].name, formatEvent(event)) for event in events]

    def test_quiet_by_default(self) -> None:
        events = self.capture()
        client = self.connect()
        client.ask(b"lock k\nstatus k\nbogus\n")
        client.lose()
        self.assertEqual(
            self.lines(events), [("info", "127.0.0.1:40001 connected"), ("info", "127.0.0.1:40001 disconnected")]
        )

    def test_verbose(self) -> None:
        events = self.capture()
        client = UnitServer(verbose=True).connect()
        client.ask(b"lock k\nbogus\nstatus-by-key\nquit\n")
        client.lose()
        self.assertEqual(
            self.lines(events),
            [
                ("info", "127.0.0.1:40001 connected"),
                ("debug", "127.0.0.1:40001 sent b'lock k'"),
                ("debug", "127.0.0.1:40001 answered b'GRANTED 1 0 k 120'"),
                ("debug", "127.0.0.1:40001 sent b'bogus'"),
                ("debug", "127.0.0.1:40001 answered b'INVALID_COMMAND'"),
                ("debug", "127.0.0.1:40001 sent b'status-by-key'"),
                ("debug", "127.0.0.1:40001 answered b'STATUS 1 0 k'"),
                ("debug", "127.0.0.1:40001 answered b'END'"),
                ("debug", "127.0.0.1:40001 sent b'quit'"),
                ("info", "127.0.0.1:40001 disconnected"),
            ],
        )
        self.assertEqual(events[1]["log_level"], LogLevel.debug)

    def test_verbose_never_logs_a_token(self) -> None:
        """Not in an auth line, nor in a mistyped one sent before authenticating."""
        events = self.capture()
        server = UnitServer(verbose=True)
        server.policy.auth_token = b"s3cret"
        mistyped = server.connect()
        mistyped.ask(b"AUTH s3cret\n")
        right = server.connect()
        right.ask(b"auth s3cret\nstatus k\n")
        text = "\n".join(line for _, line in self.lines(events))
        self.assertNotIn("s3cret", text)
        self.assertIn("sent b'(not logged before auth)'", text)
        self.assertIn("sent b'status k'", text)


    def test_peer_names(self) -> None:
        events = self.capture()
        for peer in [
            IPv6Address("TCP", "::1", 4711),
            UNIXAddress(None),
            UNIXAddress("/run/client.sock"),
            # an abstract socket name, not UTF-8: still no traceback
            UNIXAddress(b"\x00\xff\xfe"),
        ]:
            client = self.server.connect(peer=peer)
            self.assertEqual(client.ask(b"status k\n"), b"STATUS 0 0 k\n")
        self.assertEqual(
            [text for level, text in self.lines(events)],
            ["[::1]:4711 connected", "unix: connected", "unix:/run/client.sock connected", "unix:\x00\\xff\\xfe connected"],
        )


class EmbeddingTests(SynchronousTestCase):
    def test_public_names(self) -> None:
        import jesync

        self.assertIs(jesync.JESyncFactory, JESyncFactory)
        self.assertIs(jesync.LockService, LockService)

    def test_factory_over_any_transport(self) -> None:
        from jesync import JESyncFactory as Factory, LockService as Service

        factory = Factory(Service(Clock()))
        self.assertFalse(factory.verbose)
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(b"lock k\n")
        self.assertEqual(transport.value(), b"GRANTED 1 0 k 120\n")


class LockManyTests(ServerTestCase):
    """C{lock-many <timeout> <expires> <key>...}: all or nothing, a mutex on each key."""

    def test_granted_at_once(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"lock-many -1 30 a b c\n"), b"GRANTED-MANY 3 30 a b c\n")
        self.assertEqual(client.ask(b"status b\n"), b"STATUS 1 0 b\n")
        # a key given twice counts once; keys held already are renewed
        self.assertEqual(client.ask(b"lock-many 0 60 c c d\n"), b"GRANTED-MANY 2 60 c d\n")
        self.clock.advance(45)
        self.assertEqual(client.ask(b"status a\nstatus c\n"), b"STATUS 0 0 a\nSTATUS 1 0 c\n")

    def test_all_or_nothing_wait(self) -> None:
        holder, many, other = self.connect(), self.connect(), self.connect()
        holder.ask(b"lock b\n")
        # b is held: nothing is taken; the answer comes later, other commands meanwhile
        self.assertEqual(many.ask(b"lock-many -1 0 a b\nstatus a\n"), b"STATUS 0 1 a\n")
        # a is free, but reserved for the earlier request: a later mutex waits behind it
        self.assertEqual(other.ask(b"lock a 1 5\nstatus a\n"), b"STATUS 0 2 a\n")
        self.assertEqual(holder.ask(b"release b\n"), b"RELEASED 1 0 b\n")
        self.assertEqual(many.take(), b"GRANTED-MANY 2 0 a b\n")
        self.clock.advance(5)
        self.assertEqual(other.take(), b"TIMEOUT 1 0 a\n")

    def test_timeout(self) -> None:
        holder, many, other = self.connect(), self.connect(), self.connect()
        holder.ask(b"lock b\n")
        self.assertEqual(many.ask(b"lock-many 2 0 a b\n"), b"")
        self.clock.advance(2.01)
        self.assertEqual(many.take(), b"TIMEOUT-MANY 2 a b\n")
        self.assertEqual(other.ask(b"lock a 1 0\n"), b"GRANTED 1 0 a 120\n")
        self.assertEqual(many.ask(b"lock-many 0 0 a b\n"), b"TIMEOUT-MANY 2 a b\n")

    def test_fin_ends_the_wait(self) -> None:
        holder, many = self.connect(), self.connect()
        holder.ask(b"lock b\n")
        self.assertEqual(many.ask(b"lock-many -1 0 a b\n"), b"")
        many.protocol.readConnectionLost()
        self.assertEqual(many.take(), b"TIMEOUT-MANY 2 a b\n")
        self.assertEqual(holder.ask(b"status a\n"), b"STATUS 0 0 a\n")

    def test_disconnect_gives_everything_back(self) -> None:
        holder, many, waiter = self.connect(), self.connect(), self.connect()
        many.ask(b"lock-many -1 0 a b\n")
        self.assertEqual(waiter.ask(b"lock b\nstatus b\n"), b"STATUS 1 1 b\n")
        many.lose()
        self.assertEqual(waiter.take(), b"GRANTED 1 0 b 120\n")
        self.assertEqual(holder.ask(b"status a\n"), b"STATUS 0 0 a\n")

    def test_already_waiting_for_one_of_its_keys(self) -> None:
        holder, client = self.connect(), self.connect()
        holder.ask(b"lock a\n")
        self.assertEqual(client.ask(b"lock a\nstatus a\n"), b"STATUS 1 1 a\n")
        self.assertEqual(client.ask(b"lock-many -1 0 b a\n"), b"INVALID_PARAMETER: already waiting for 'a'\n")
        self.assertEqual(client.ask(b"status b\n"), b"STATUS 0 0 b\n")

    def test_bad_requests(self) -> None:
        client = self.connect()
        for line, error in [
            (b"lock-many\n", b"lock-many takes a timeout, an expiry and at least one key"),
            (b"lock-many -1 0\n", b"lock-many takes a timeout, an expiry and at least one key"),
            (b"lock-many x 0 a\n", b"timeout is not an integer"),
            (b"lock-many -1 y a\n", b"expires is not an integer"),
            (b"lock-many -2 0 a\n", b"Timeout should be greater or equal than -1"),
            (b"lock-many -1 -1 a\n", b"Expire timeout should be greater or equal than 0"),
            (b"lock-many -1 0 a " + b"k" * 1025 + b"\n", b"max-key-length exceeded (1024)"),
        ]:
            self.assertEqual(client.ask(line), b"INVALID_PARAMETER: " + error + b"\n", line)
        self.assertEqual(client.ask(b"status a\n"), b"STATUS 0 0 a\n")


class FencingTests(ServerTestCase):
    """C{fencing on}: every GRANTED carries the grant's fencing token."""

    def test_off_by_default_then_on(self) -> None:
        client, other = self.connect(), self.connect()
        self.assertEqual(client.ask(b"lock a\n"), b"GRANTED 1 0 a 120\n")
        self.assertEqual(client.ask(b"fencing on\n"), b"FENCING ON\n")
        a_token = self.service.holders("a")[0].token
        # a renewal keeps its token
        self.assertEqual(client.ask(b"lock a\n"), b"GRANTED 1 0 a 120 %d\n" % a_token)
        self.assertEqual(client.ask(b"lock b\n"), b"GRANTED 1 0 b 120 %d\n" % (a_token + 1))
        self.assertEqual(other.ask(b"lock b 1 0\nlock c\n"), b"TIMEOUT 1 0 b\nGRANTED 1 0 c 120\n")
        self.assertEqual(
            client.ask(b"lock-many -1 0 d e\n"), b"GRANTED-MANY 2 0 d e %d %d\n" % (a_token + 3, a_token + 4)
        )
        self.assertEqual(client.ask(b"fencing off\nlock f\n"), b"FENCING OFF\nGRANTED 1 0 f 120\n")

    def test_tokens_increase_with_the_clock_and_per_key(self) -> None:
        client, other = self.connect(), self.connect()
        client.ask(b"fencing on\n")
        other.ask(b"fencing on\n")
        tokens = []
        for second in range(3):
            self.clock.advance(1.5)
            tokens.append(int(client.ask(b"lock k 2\n").split()[-1]))
            tokens.append(int(other.ask(b"lock k 2\n").split()[-1]))  # a semaphore: each holder its own
            client.ask(b"release k\n")
            other.ask(b"release k\n")
        self.assertEqual(tokens, sorted(set(tokens)))
        self.assertGreaterEqual(tokens[-1], int(self.clock.seconds() * 1e6))

    def test_holders_show_tokens(self) -> None:
        client, other = self.connect(), self.connect()
        client.ask(b"lock k 2\n")
        other.ask(b"lock k 2 -1 0\n")
        first, second = self.service.holders("k")
        lines = other.ask(b"holders k\n").splitlines()
        self.assertEqual([line.split()[-1] for line in lines[:2]], [b"%d" % first.token, b"%d" % second.token])
        self.assertEqual(lines[2], b"END")

    def test_bad_setting(self) -> None:
        client = self.connect()
        self.assertEqual(client.ask(b"fencing\n"), b"INVALID_PARAMETER: missing on or off\n")
        self.assertEqual(client.ask(b"fencing yes\n"), b"INVALID_PARAMETER: fencing is on or off\n")
        self.assertEqual(client.ask(b"fencing on off\n"), b"INVALID_PARAMETER: too many arguments\n")
