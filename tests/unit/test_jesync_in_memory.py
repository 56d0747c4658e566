"""
The JESync protocol against the real server in memory (L{jesync.testing}):
raw bytes in, raw bytes out, each client a connection of its own, as over
TCP; only the reactor is memory, and time moves when the test says.

Every reply a step causes is there once it is flushed, so the tests compare
everything a client received, not only the lines they expected: that a
line is I{not} sent is shown by its absence.  Each test ends with every
connection closed and the lock table empty.
"""

from __future__ import annotations

from twisted.internet.error import ConnectionAborted, ConnectionDone
from twisted.trial.unittest import SynchronousTestCase

from jesync.testing import MemoryPeer, MemoryServer
from tests.support import INVALID_PARAMETER_CASES


class InMemoryTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = MemoryServer()
        self.service = self.server.service
        self.peers: list[MemoryPeer] = []
        self.addCleanup(self.shutdown)

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    def connect(self) -> MemoryPeer:
        peer = self.server.connect("jesync")
        self.peers.append(peer)
        return peer

    def connect_many(self, count: int) -> list[MemoryPeer]:
        return [self.connect() for _ in range(count)]

    def shutdown(self) -> None:
        """Close every connection; everything it held or waited for is then gone from the table."""
        for peer in self.peers:
            if not peer.closed:
                peer.close()
        self.assertEqual(self.server.connections, 0)
        self.assertEqual(self.service.listing(), [])


class LockTests(InMemoryTestCase):
    def test_defaults_and_waiting_does_not_block(self):
        holder, waiter = self.connect_many(2)
        self.assertEqual(holder.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(
            waiter.ask(b"lock k\nstatus k\nlock other\nstatus-by-key\n"),
            b"STATUS 1 1 k\nGRANTED 1 0 other 120\nSTATUS 1 1 k\nSTATUS 1 0 other\nEND\n",
        )
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")

    def test_max_concurrent(self):
        clients = self.connect_many(4)
        for n, client in enumerate(clients[:3], 1):
            self.assertEqual(client.ask(b"lock k 3\n"), b"GRANTED %d 0 k 120\n" % n)
        self.assertEqual(clients[3].ask(b"lock k 3\nstatus k\n"), b"STATUS 3 1 k\n")
        self.assertEqual(clients[1].ask(b"release k\n"), b"RELEASED 3 0 k\n")
        self.assertEqual(clients[3].received(), b"GRANTED 3 0 k 120\n")

    def test_less_strict_request_passes_stricter_one(self):
        holder, strict, loose = self.connect_many(3)
        self.assertEqual(holder.ask(b"lock k 3\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(strict.ask(b"lock k 1\nstatus k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(loose.ask(b"lock k 3\n"), b"GRANTED 2 1 k 120\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 1 k\n")
        self.assertEqual(loose.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(strict.received(), b"GRANTED 1 0 k 120\n")

    def test_protocol_md_example(self):
        c1, c2 = self.connect_many(2)
        self.assertEqual(c1.ask(b"lock report 1 -1 60\n"), b"GRANTED 1 0 report 60\n")
        self.assertEqual(c2.ask(b"lock report 1 30\nstatus report\n"), b"STATUS 1 1 report\n")
        self.assertEqual(c1.ask(b"release report\n"), b"RELEASED 1 0 report\n")
        self.assertEqual(c2.received(), b"GRANTED 1 0 report 120\n")
        self.assertEqual(c2.ask(b"status-by-key\n"), b"STATUS 1 0 report\nEND\n")

    def test_expires_argument(self):
        client = self.connect()
        self.assertEqual(client.ask(b"lock k 1 10 30\n"), b"GRANTED 1 0 k 30\n")
        self.assertEqual(client.ask(b"lock j 1 -1 0\n"), b"GRANTED 1 0 j 0\n")

    def test_timeout(self):
        holder, waiter, other = self.connect_many(3)
        holder.ask(b"lock k\n")
        other.ask(b"lock k\nstatus k\n")
        waiter.send(b"lock k 1 1\n")
        self.assertEqual(waiter.ask(b"status k\n"), b"STATUS 1 2 k\n")
        self.server.advance(0.99)
        self.assertEqual(waiter.received(), b"")
        self.server.advance(0.01)
        self.assertEqual(waiter.received(), b"TIMEOUT 1 1 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(other.received(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(waiter.ask(b"status k\n"), b"STATUS 1 0 k\n")

    def test_timeout_zero(self):
        holder, waiter = self.connect_many(2)
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k 1 0\n"), b"TIMEOUT 1 0 k\n")
        self.assertEqual(waiter.ask(b"lock free 1 0\n"), b"GRANTED 1 0 free 120\n")

    def test_waiter_granted_with_own_expires(self):
        holder, waiter = self.connect_many(2)
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k 1 -1 30\nstatus k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 30\n")

    def test_fifo(self):
        holder, *waiters = self.connect_many(4)
        holder.ask(b"lock k\n")
        for n, waiter in enumerate(waiters, 1):
            self.assertEqual(waiter.ask(b"lock k\nstatus k\n"), b"STATUS 1 %d k\n" % n)
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 2 k\n")
        self.assertEqual(waiters[0].received(), b"GRANTED 1 2 k 120\n")
        self.assertEqual(waiters[0].ask(b"release k\n"), b"RELEASED 1 1 k\n")
        self.assertEqual(waiters[1].received(), b"GRANTED 1 1 k 120\n")
        self.assertEqual(waiters[2].ask(b"status k\n"), b"STATUS 1 1 k\n")


class RenewalTests(InMemoryTestCase):
    def test_lock_again_while_holding_restarts_expiry(self):
        holder, waiter = self.connect_many(2)
        self.assertEqual(holder.ask(b"lock k 1 -1 1\n"), b"GRANTED 1 0 k 1\n")
        self.assertEqual(holder.ask(b"lock k 1 -1 60\n"), b"GRANTED 1 0 k 60\n")
        # Had the first expiry stood, this wait would be granted after 1s.
        self.assertEqual(waiter.ask(b"lock k 1 2\nstatus k\n"), b"STATUS 1 1 k\n")
        self.server.advance(1.5)
        self.assertEqual(waiter.received(), b"")
        self.server.advance(0.5)
        self.assertEqual(waiter.received(), b"TIMEOUT 1 0 k\n")
        self.assertEqual(holder.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 0 0 k\n")

    def test_lock_again_while_waiting_answered_once(self):
        holder, waiter = self.connect_many(2)
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k\nlock k 1 1\nlock k 3 0 9\nstatus k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.ask(b"status k\n"), b"GRANTED 1 0 k 120\nSTATUS 1 0 k\n")


class ExpiryTests(InMemoryTestCase):
    def test_owner_not_told_and_waiter_granted(self):
        owner, waiter = self.connect_many(2)
        self.assertEqual(owner.ask(b"lock k 1 -1 1\n"), b"GRANTED 1 0 k 1\n")
        self.assertEqual(waiter.ask(b"lock k 1 -1 20\nstatus k\n"), b"STATUS 1 1 k\n")
        self.server.advance(1)
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 20\n")
        # The owner's next line is the answer to its next command.
        self.assertEqual(owner.ask(b"release k\n"), b"NOT_RELEASED 1 0 k\n")
        self.assertEqual(owner.received(), b"")
        self.assertEqual(waiter.ask(b"release k\n"), b"RELEASED 0 0 k\n")


class ReleaseTests(InMemoryTestCase):
    def test_release_replies(self):
        holder, other = self.connect_many(2)
        self.assertEqual(other.ask(b"release k\n"), b"NOT_RELEASED 0 0 k\n")
        holder.ask(b"lock k 2\n")
        self.assertEqual(other.ask(b"release k\n"), b"NOT_RELEASED 1 0 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 0 0 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"NOT_RELEASED 0 0 k\n")

    def test_release_while_waiting(self):
        holder, waiter = self.connect_many(2)
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k\nrelease k\n"), b"NOT_RELEASED 1 1 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")


class StatusTests(InMemoryTestCase):
    def test_status(self):
        clients = self.connect_many(5)
        self.assertEqual(clients[0].ask(b"status unused\n"), b"STATUS 0 0 unused\n")
        for client in clients:
            client.send(b"lock k 2\n")
        self.server.flush()
        self.assertEqual(clients[0].received(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(clients[1].received(), b"GRANTED 2 0 k 120\n")
        # the last three lock requests are read, and wait: nothing is answered
        for client in clients[2:]:
            self.assertEqual(client.received(), b"")
        self.assertEqual(clients[0].ask(b"status k\n"), b"STATUS 2 3 k\n")

    def test_listings(self):
        c1, c2, c3, c4, client = self.connect_many(5)
        self.assertEqual(client.ask(b"status-by-key\nstatus-by-requests\nstatus-by-grants\n"), b"END\n" * 3)
        c1.ask(b"lock d\nlock c\nlock b 3\nlock a\n")
        c2.ask(b"lock a\nlock b 3\n")
        c3.ask(b"lock a\nlock d\nstatus d\n")
        c4.ask(b"lock d\nstatus d\n")
        self.assertEqual(
            client.ask(b"status-by-key\n"),
            b"STATUS 1 2 a\nSTATUS 2 0 b\nSTATUS 1 0 c\nSTATUS 1 2 d\nEND\n",
        )
        self.assertEqual(
            client.ask(b"status-by-requests\n"),
            b"STATUS 1 2 a\nSTATUS 1 2 d\nSTATUS 2 0 b\nSTATUS 1 0 c\nEND\n",
        )
        self.assertEqual(
            client.ask(b"status-by-grants\n"),
            b"STATUS 2 0 b\nSTATUS 1 2 a\nSTATUS 1 0 c\nSTATUS 1 2 d\nEND\n",
        )


class QuitTests(InMemoryTestCase):
    def test_quit_closes_and_releases(self):
        quitter, waiter = self.connect_many(2)
        quitter.ask(b"lock a\nlock b 2\nstatus b\n")
        self.assertEqual(waiter.ask(b"lock a\nlock b 1\nstatus b\n"), b"STATUS 1 1 b\n")
        self.assertEqual(quitter.ask(b"status a\nquit\nlock c\nstatus a\n"), b"STATUS 1 1 a\n")
        self.assertIsInstance(quitter.lost.value, ConnectionDone)
        self.assertEqual(quitter.received(), b"")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 a 120\nGRANTED 1 0 b 120\n")
        self.assertEqual(waiter.ask(b"status-by-key\n"), b"STATUS 1 0 a\nSTATUS 1 0 b\nEND\n")

    def test_quit_with_arguments_is_invalid(self):
        client = self.connect()
        self.assertEqual(
            client.ask(b"quit now\nQUIT\nstatus k\n"),
            b"INVALID_PARAMETER: too many arguments\nINVALID_COMMAND\nSTATUS 0 0 k\n",
        )


class InvalidRequestTests(InMemoryTestCase):
    def test_invalid_commands(self):
        client = self.connect()
        lines = [b"", b"\r", b"   ", b" \t \x0b\x0c ", b"hello", b"LOCK k", b"Lock k", b"RELEASE k",
                 b"STATUS k", b"lockk", b"status_by_key", b"\x00", b"\xff\xfe\x80 k", b"l\xc3\xb6ck k"]
        self.assertEqual(
            client.ask(b"\n".join(lines) + b"\nstatus k\n"),
            b"INVALID_COMMAND\n" * len(lines) + b"STATUS 0 0 k\n",
        )
        garbage = bytes(range(256)).replace(b"\n", b"").replace(b" ", b"")
        self.assertEqual(
            client.ask(garbage + b"\n" + garbage[::-1] + b"\r\nlock k\n"),
            b"INVALID_COMMAND\nINVALID_COMMAND\nGRANTED 1 0 k 120\n",
        )
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_invalid_parameters(self):
        holder, client = self.connect_many(2)
        holder.ask(b"lock k 1 -1 0\n")
        cases = INVALID_PARAMETER_CASES
        request = b"".join(line + b"\n" for line, message in cases)
        expected = b"".join(b"INVALID_PARAMETER: " + message + b"\n" for line, message in cases)
        self.assertEqual(client.ask(request), expected)
        self.assertEqual(client.ask(b"status-by-key\nlock k2\n"), b"STATUS 1 0 k\nEND\nGRANTED 1 0 k2 120\n")


class DisconnectTests(InMemoryTestCase):
    def hand_over(self, leave):
        """C{leave} makes the holder go; its waiter gets both its keys."""
        holder, waiter = self.connect_many(2)
        holder.ask(b"lock k\nlock j 1 -1 0\n")
        self.assertEqual(waiter.ask(b"lock k\nlock j\nstatus j\n"), b"STATUS 1 1 j\n")
        leave(holder)
        self.assertTrue(holder.closed)
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\nGRANTED 1 0 j 120\n")
        self.assertEqual(self.server.connections, 1)
        self.assertEqual(waiter.ask(b"status-by-key\n"), b"STATUS 1 0 j\nSTATUS 1 0 k\nEND\n")

    def test_clean_close(self):
        self.hand_over(lambda client: client.close())

    def test_abort(self):
        self.hand_over(lambda client: client.abort())

    def test_mid_line(self):
        def leave(client):
            self.assertEqual(client.ask(b"release k\nrelease j"), b"RELEASED 1 0 k\n")
            client.abort()
            self.assertIsInstance(client.lost.value, ConnectionAborted)

        self.hand_over(leave)

    def test_while_waiting(self):
        holder, waiter, third = self.connect_many(3)
        holder.ask(b"lock k\n")
        self.assertEqual(waiter.ask(b"lock k\nstatus k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(third.ask(b"lock k\nstatus k\n"), b"STATUS 1 2 k\n")
        waiter.close()
        self.assertEqual(self.server.connections, 2)
        self.assertEqual(third.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(third.received(), b"GRANTED 1 0 k 120\n")


class OpaqueKeyTests(InMemoryTestCase):
    def test_keys_are_bytes(self):
        client, other = self.connect_many(2)
        keys = [b"\xff\xfe", b"a\x00b", b"\x00", b"\xc3", b"\xed\xa0\x80", b"caf\xc3\xa9", b"\xc3\xbf", b"\xff"]
        for key in keys:
            self.assertEqual(client.ask(b"lock " + key + b"\n"), b"GRANTED 1 0 " + key + b" 120\n")
            self.assertEqual(
                other.ask(b"lock %s 1 0\nstatus %s\nrelease %s\n" % (key, key, key)),
                b"TIMEOUT 1 0 %s\nSTATUS 1 0 %s\nNOT_RELEASED 1 0 %s\n" % (key, key, key),
            )
        listing = client.ask(b"status-by-key\n")
        self.assertEqual(listing.count(b"\n"), len(keys) + 1)
        self.assertEqual(sorted(listing.split(b"\n")[:-2]), sorted(b"STATUS 1 0 " + key for key in keys))
        for key in keys:
            self.assertEqual(client.ask(b"release " + key + b"\n"), b"RELEASED 0 0 " + key + b"\n")
        self.assertEqual(self.flushLoggedErrors(), [])
