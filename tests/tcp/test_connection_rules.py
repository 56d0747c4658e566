"""
The rules the connection layer (L{jesync.connections}) holds every protocol
to, each through a real listening server and real TCP clients (the server
C{twistd jesync} builds, in this process); where time is the point, or no
socket is needed, on a L{Clock} and L{StringTransport}s, in
L{tests.unit.test_connection_rules}:

 - a FIN ends the connection's waits with the protocol's not-granted reply;
   what can be answered at once still is; then the connection closes;
 - a closing connection is never granted anything;
 - a client that reads is never dropped for what one reactor turn wrote,
   however much; a large reply is streamed, so a client that does not read
   is neither dropped for it nor makes the server buffer it;
 - --auth-timeout, --idle-timeout, --max-total-waits and --max-sessions;
 - numbers have at most 10 digits; a CR inside a line is no separator.

Nothing sleeps: every step waits for a reply, a close, or the server seeing
one, with a bounded timeout.
"""

from __future__ import annotations

from socket import SO_SNDBUF, SOL_SOCKET

from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ConnectionDone

from jesync.connections.connection import STREAM_TURN
from jesync.interfaces import Totals
from tests.server_case import Server, ServerTestCase
from tests.support import TOKEN, hold_keys, unsent_bytes, wait_until, write_file


class HalfCloseTests(ServerTestCase):
    """A FIN from the peer: its waits end not granted, the rest is answered, then the close."""

    @inlineCallbacks
    def test_nc_N_gets_its_lock(self):
        """C{printf 'lock k\\n' | nc -N}: the free key is granted; then the close releases it."""
        server = yield Server.start(self, elock=False)
        client, other = yield server.connect_many(2)
        client.send(b"lock k\n")
        client.transport.loseWriteConnection()
        self.assertEqual((yield client.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        yield server.wait_lost(client)
        self.assertEqual((yield other.ask(b"status k\n")), b"STATUS 0 0 k\n")

    @inlineCallbacks
    def test_jesync_waits_end_at_the_fin(self):
        server = yield Server.start(self, elock=False)
        client, other = yield server.connect_many(2)
        yield other.ask(b"lock held\n")
        client.send(b"lock held\nlock free\nstatus held\n")
        client.transport.loseWriteConnection()
        replies = yield client.read_lines(3)
        self.assertEqual(replies, [b"GRANTED 1 0 free 120\n", b"STATUS 1 1 held\n", b"TIMEOUT 1 0 held\n"])
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        yield server.wait_lost(client)
        # Nothing was granted to it: the holder's release frees the key.
        self.assertEqual((yield other.ask(b"release held\nstatus free\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 free\n")

    @inlineCallbacks
    def test_elock_waits_end_at_the_fin(self):
        """
        The waiting lock is answered 409 at the FIN; the lines behind it are
        answered, and one that would wait gets 409 at once.  The session
        detaches with what it holds, and no wait.
        """
        server = yield Server.start(self)
        holder = yield server.jesync()
        client = yield server.elock()
        yield holder.ask(b"lock held\n")
        client.send(b"lock held 30\r\nlock free\r\nlock held 30\r\nstats\r\n")
        client.transport.loseWriteConnection()
        replies = yield client.read_lines(8)
        self.assertEqual(
            replies,
            [
                b"409 Unavailable\r\n",
                b"200 Acquired\r\n",
                b"409 Unavailable\r\n",
                b"200 STATS\r\n",
                b"STAT clients 1\r\n",
                b"STAT locks 2\r\n",
                b"STAT monitoring 0\r\n",
                b"END\r\n",
            ],
        )
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        yield server.wait_lost(client)
        self.assertEqual(server.factories["elock"].sessions.detached_count(), 1)
        self.assertEqual(server.locks.totals(), Totals(2, 2, 0))
        self.assertEqual((yield holder.ask(b"status free\n")), b"STATUS 1 0 free\n")
        server.factories["elock"].sessions.end_detached()

    @inlineCallbacks
    def test_many_replies_owed(self):
        """A FIN behind 20,000 pipelined requests: every one is answered, then the close."""
        server = yield Server.start(self, elock=False)
        client = yield server.jesync()
        # A small send buffer on the server's side: its replies back up, and
        # it stops reading with requests and the FIN still unread.  (A small
        # receive buffer on the client's side, set once connected, backs up
        # nothing in the server and stalls on TCP's 200 ms zero-window probes.)
        client.served.transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 8192)
        client.send(b"lock k\n" + b"status k\n" * 20000 + b"release k\n")
        client.transport.loseWriteConnection()
        replies = yield client.read_lines(20002, timeout=20)
        self.assertEqual(replies[0], b"GRANTED 1 0 k 120\n")
        self.assertEqual(set(replies[1:-1]), {b"STATUS 1 0 k\n"})
        self.assertEqual(replies[-1], b"RELEASED 0 0 k\n")
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)


class ClosingTests(ServerTestCase):
    @inlineCallbacks
    def test_nothing_granted_after_quit(self):
        """C{quit} cancels the connection's waits at once: a release then grants nobody."""
        server = yield Server.start(self, elock=False)
        client, other = yield server.connect_many(2)
        yield other.ask(b"lock k\n")
        client.send(b"lock k\nquit\n")
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        self.assertEqual(client.unread(), b"")
        self.assertEqual((yield other.ask(b"release k\n")), b"RELEASED 0 0 k\n")


class BigOutputTests(ServerTestCase):
    @inlineCallbacks
    def test_reading_client_gets_over_4_mib_from_one_turn(self):
        """
        One release grants a client 4,200 waits at once: over 4 MiB of
        replies written in one reactor turn, 64 times --max-unsent.  It reads
        them all and is not dropped.
        """
        server = yield Server.start(self, "--max-unsent", "65536", elock=False)
        holder, reader = yield server.connect_many(2)
        keys = [b"%04d-%s" % (n, b"x" * 1000) for n in range(4200)]
        yield hold_keys(holder, keys, 500)
        reader.send(b"".join(b"lock %s\n" % key for key in keys))
        self.assertEqual((yield reader.ask(b"status %s\n" % keys[-1])), b"STATUS 1 1 %s\n" % keys[-1])
        yield server.drop(holder)  # its connection's end releases all 4,200 at once
        replies = yield reader.read_lines(len(keys), timeout=20)
        self.assertGreater(sum(map(len, replies)), 4 * 2**20)
        # (the seconds left are read as each reply is written: a turn that
        # takes over half a second on a loaded machine writes 119 for the last)
        self.assertEqual([reply.rsplit(b" ", 1)[0] for reply in replies], [b"GRANTED 1 0 %s" % key for key in keys])
        self.assertLessEqual({reply.rsplit(b" ", 1)[1] for reply in replies}, {b"120\n", b"119\n"})
        self.assertEqual((yield reader.ask(b"status %s\n" % keys[0])), b"STATUS 1 0 %s\n" % keys[0])
        self.assertEqual(len(server.policy.connections), 1)

    @inlineCallbacks
    def test_listing_to_a_client_that_does_not_read(self):
        """
        A client that reads nothing asks for a listing far bigger than
        --max-unsent and every buffer: it is not dropped, the server holds
        only a bounded part of the listing in its transport, others are
        served, and once it reads it gets the whole listing, then the reply
        to what it asked next.
        """
        server = yield Server.start(self, "--max-unsent", "4096", "--max-held", "0", elock=False)
        holder, slow, other = yield server.connect_many(3)
        keys = [b"key-%06d-%s" % (n, b"x" * 20) for n in range(40000)]
        yield hold_keys(holder, keys, 5000)
        listing = [b"STATUS 1 0 %s\n" % key for key in keys] + [b"END\n"]
        self.assertGreater(sum(map(len, listing)), 1_000_000)
        slow.served.transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 8192)
        slow.transport.pauseProducing()
        slow.send(b"status-by-key\nstatus key-000000-xxxxxxxxxxxxxxxxxxxx\n")
        yield wait_until(lambda: slow.served.paused)
        for _ in range(3):
            self.assertEqual((yield other.ask(b"status %s\n" % keys[1])), b"STATUS 1 0 %s\n" % keys[1])
        # What the server has buffered for it is bounded by the stream's pieces.
        self.assertLessEqual(unsent_bytes(slow.served.transport), slow.served.transport.bufferSize + STREAM_TURN)
        self.assertEqual(len(server.policy.connections), 3)
        # It reads at last (with a send buffer big enough for it not to crawl).
        slow.served.transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 2**20)
        slow.transport.resumeProducing()
        replies = yield slow.read_lines(len(listing) + 1, timeout=20)
        self.assertEqual(replies, listing + [b"STATUS 1 0 %s\n" % keys[0]])

    @inlineCallbacks
    def test_listing_in_pieces_with_others_answered_between(self):
        """
        A big listing goes out a piece per reactor turn: a request from
        another client that arrives meanwhile is answered before its end.
        """
        server = yield Server.start(self, "--max-held", "0", elock=False)
        holder, lister, other = yield server.connect_many(3)
        keys = [b"k%06d" % n for n in range(60000)]
        yield hold_keys(holder, keys, 10000)
        writes: list[tuple[str, int]] = []
        # The listing's pieces go to the transport; a short reply may go
        # straight to the socket, so the other's is seen where it is made.
        for name, owner in (("lister", lister.served.transport), ("other", other.served)):
            real_write = owner.write

            def write(data, name=name, real_write=real_write):
                writes.append((name, len(data)))
                real_write(data)

            owner.write = write
            self.addCleanup(delattr, owner, "write")
        lister.send(b"status-by-key\n")
        other.send(b"status k000001\n")
        self.assertEqual((yield other.read_line()), b"STATUS 1 0 k000001\n")
        replies = yield lister.read_lines(len(keys) + 1, timeout=20)
        self.assertEqual(replies[-1], b"END\n")
        names = [name for name, size in writes]
        pieces = [size for name, size in writes if name == "lister"]
        self.assertGreater(len(pieces), 10)
        self.assertLessEqual(max(pieces), STREAM_TURN)
        self.assertLess(names.index("lister"), names.index("other"))
        self.assertLess(names.index("other"), len(names) - 1 - names[::-1].index("lister"))


class TotalWaitsTests(ServerTestCase):
    @inlineCallbacks
    def test_capped_across_keys_connections_and_protocols(self):
        server = yield Server.start(self, "--max-total-waits", "2")
        holder, first, second, third = yield server.connect_many(4)
        elock = yield server.elock()
        yield holder.ask(b"lock a\nlock b\n", 2)
        first.send(b"lock a\n")
        second.send(b"lock b\n")
        yield wait_until(lambda: server.locks.totals().waiting == 2)
        refused = b"INVALID_PARAMETER: max-total-waits exceeded (2)\n"
        self.assertEqual((yield third.ask(b"lock a\nlock c\n", 2)), refused + b"GRANTED 1 0 c 120\n")
        # A lock that would not wait is never refused for it.
        self.assertEqual((yield third.ask(b"lock a 1 0\n")), b"TIMEOUT 1 1 a\n")
        self.assertEqual((yield elock.ask(b"lock b 5\r\n")), b"503 max-total-waits exceeded (2)\r\n")
        yield holder.ask(b"release a\n")
        self.assertEqual((yield first.read_line()), b"GRANTED 1 0 a 120\n")
        self.assertEqual((yield elock.ask(b"lock a 0\r\n")), b"409 Unavailable\r\n")
        elock.send(b"lock a 30\r\n")
        yield wait_until(lambda: server.locks.totals().waiting == 2)


class SessionCapTests(ServerTestCase):
    @inlineCallbacks
    def test_detached_sessions_capped_over_many_cycles(self):
        """
        Connect, set a long grace period, take a lock, disconnect, over and
        over: once 3 sessions are in their grace period, no new session
        starts (503), but a detached one can still be resumed.  (A session
        holding nothing ends when its connection goes, so it takes a lock.)
        """
        server = yield Server.start(self, "--max-sessions", "3")
        table = server.factories["elock"].sessions
        ids = []
        for cycle in range(12):
            client = yield server.elock()
            reply = yield client.ask(b"set_timeout 300000\r\n")
            if cycle < 3:
                self.assertEqual(reply, b"200 timeout set\r\n")
                self.assertEqual((yield client.ask(b"lock k%d\r\n" % cycle)), b"200 Acquired\r\n")
                ids.append((yield client.ask(b"conn_id\r\n"))[4:-2])
            else:
                self.assertEqual(reply, b"503 max-sessions exceeded (3)\r\n")
                self.assertEqual((yield client.ask(b"conn_id guessed-%d\r\n" % cycle)), b"503 max-sessions exceeded (3)\r\n")
            yield server.drop(client)
            self.assertEqual(table.detached_count(), min(cycle + 1, 3))
        self.assertEqual(len(table), 3)
        client = yield server.elock()
        self.assertEqual((yield client.ask(b"conn_id %s\r\nlock k0\r\n" % ids[0], 2)), b"200 conn id set\r\n200 Acquired\r\n")
        self.assertEqual(table.detached_count(), 2)
        table.end_detached()


class AuthTimeoutTests(ServerTestCase):
    @inlineCallbacks
    def test_unauthenticated_connection_is_closed(self):
        path = write_file(self, TOKEN + b"\n")
        server = yield Server.start(self, "--auth-token-file", path, "--auth-timeout", "0.2")
        silent = yield server.jesync()
        elock = yield server.elock()
        authenticated = yield server.jesync()
        self.assertEqual((yield authenticated.ask(b"auth %s\nlock k\n" % TOKEN, 2)), b"OK\nGRANTED 1 0 k 120\n")
        self.assertIsInstance((yield silent.wait_closed()), ConnectionDone)
        self.assertEqual(silent.unread(), b"INVALID_PARAMETER: auth-timeout exceeded (0.2)\n")
        self.assertIsInstance((yield elock.wait_closed()), ConnectionDone)
        self.assertEqual(elock.unread(), b"503 auth-timeout exceeded (0.2)\r\n")
        self.assertEqual((yield authenticated.ask(b"status k\n")), b"STATUS 1 0 k\n")


class ReviewRegressionTests(ServerTestCase):
    @inlineCallbacks
    def test_fin_before_auth_closes(self):
        """A client that closes before it authenticates does not keep its connection slot."""
        path = write_file(self, TOKEN + b"\n")
        server = yield Server.start(self, "--auth-token-file", path, "--max-connections", "1", elock=False)
        first = yield server.jesync()
        first.transport.loseWriteConnection()
        self.assertIsInstance((yield first.wait_closed()), ConnectionDone)
        yield server.wait_lost(first)
        second = yield server.jesync()
        self.assertEqual((yield second.ask(b"auth %s\n" % TOKEN)), b"OK\n")

    @inlineCallbacks
    def test_closing_client_that_does_not_read_is_dropped(self):
        """An idle-timed-out client that takes none of its last replies is dropped after the grace."""
        server = yield Server.start(self, "--idle-timeout", "0.2", "--shutdown-grace", "0.3", elock=False)
        slow = yield server.jesync()
        yield server.fill(slow)
        yield server.wait_lost(slow)
        self.assertEqual(len(server.policy.connections), 0)
