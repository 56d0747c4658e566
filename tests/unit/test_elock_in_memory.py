"""
The elock protocol next to JESync, against the real server in memory
(L{jesync.testing}): one lock service served over JESync, elock and the
operator's admin listener, raw bytes in and out, each client a connection
of its own; only the reactor is memory, and time moves when the test says.

Grace periods and waits are run out by moving the clock: just short of
their end nothing has happened, at their end it has.  Every reply a step
causes is there once it is flushed, so that a reply is I{not} sent is shown
by its absence.  The line framing over real TCP is in
tests/tcp/test_elock_tcp.py.
"""

from __future__ import annotations

from twisted.internet.error import ConnectionDone
from twisted.trial.unittest import SynchronousTestCase

from jesync.testing import MemoryPeer, MemoryServer
from tests.support import BYE, stats

MAX_LINE = 8192


class InMemoryTestCase(SynchronousTestCase):
    """
    A server with JESync, elock and admin listeners.  The cleanup closes
    every connection, ends the sessions still in their grace period (so
    none is left behind), and checks that the lock table was left empty.
    """

    def setUp(self) -> None:
        self.server = MemoryServer(elock_ports=["tcp:11401"], admin_ports=["tcp:11403"])
        self.service = self.server.service
        self.policy = self.server.server.policy
        self.elock_factory = self.server.server.factories["elock"]
        self.sessions = self.elock_factory.sessions
        self.peers: list[MemoryPeer] = []
        self.addCleanup(self.shutdown)

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    def _connect(self, listener: str) -> MemoryPeer:
        peer = self.server.connect(listener)
        self.peers.append(peer)
        return peer

    def elock(self) -> MemoryPeer:
        return self._connect("elock")

    def jesync(self) -> MemoryPeer:
        return self._connect("jesync")

    def admin(self) -> MemoryPeer:
        return self._connect("admin")

    def send(self, peer: MemoryPeer, data: bytes) -> None:
        """Send C{data}, and flush: the server has read all of it and answered what it could."""
        peer.send(data)
        self.server.flush()

    def drop(self, peer: MemoryPeer, abort: bool = True) -> float:
        """Close C{peer}'s connection (a reset, unless not C{abort}); the time the server saw it go."""
        if abort:
            peer.abort()
        else:
            peer.close()
        self.assertTrue(peer.closed)
        return self.server.reactor.seconds()

    def shutdown(self) -> None:
        for peer in self.peers:
            if not peer.closed:
                peer.close()
        self.assertEqual(self.elock_factory.clients, 0)
        # Every connection is gone, so every session left is in its grace
        # period; end them now rather than leave their timers behind:
        # resuming one cancels its timer, ending it releases its locks.
        for session in list(self.sessions._sessions.values()):
            self.assertIsNone(session.connection, session)
            self.assertIs(self.sessions.take(self, session.id), session)
            session.end()
        self.assertEqual(len(self.sessions), 0)
        self.assertEqual(self.service.listing(), [])

    def session_id(self, client: MemoryPeer) -> bytes:
        reply = client.ask(b"conn_id\r\n")
        self.assertTrue(reply.startswith(b"200 ") and reply.endswith(b"\r\n"), reply)
        return reply[4:-2]

    def hold_with_waiter(self, timeout: bytes | None = None, key: bytes = b"k"):
        """
        An elock client that holds C{key} (after C{set_timeout <timeout>}),
        and a JESync client waiting for it (the wait is queued when this
        returns).
        """
        holder = self.elock()
        waiter = self.jesync()
        if timeout is not None:
            self.assertEqual(holder.ask(b"set_timeout %s\r\n" % timeout), b"200 timeout set\r\n")
        self.assertEqual(holder.ask(b"lock %s\r\n" % key), b"200 Acquired\r\n")
        self.assertEqual(waiter.ask(b"lock %s\nstatus %s\n" % (key, key)), b"STATUS 1 1 %s\n" % key)
        return holder, waiter


class CrossProtocolTests(InMemoryTestCase):
    def test_elock_lock_excludes_jesync(self):
        elock = self.elock()
        jesync = self.jesync()
        waiter = self.jesync()
        self.assertEqual(elock.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(jesync.ask(b"lock k 1 0\n"), b"TIMEOUT 1 0 k\n")
        self.assertEqual(waiter.ask(b"lock k 3\nstatus k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(elock.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(elock.ask(b"lock k\r\n"), b"409 Unavailable\r\n")
        self.assertEqual(waiter.ask(b"release k\n"), b"RELEASED 0 0 k\n")

    def test_jesync_lock_excludes_elock(self):
        jesync = self.jesync()
        elock = self.elock()
        self.assertEqual(jesync.ask(b"lock k 5\n"), b"GRANTED 1 0 k 120\n")
        self.assertEqual(elock.ask(b"lock k\r\n"), b"409 Unavailable\r\n")
        self.send(elock, b"lock k 5\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(jesync.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(elock.received(), b"200 Acquired\r\n")
        self.assertEqual(jesync.ask(b"lock k 1 0\n"), b"TIMEOUT 1 0 k\n")

    def test_one_fifo_queue_for_both(self):
        holder = self.jesync()
        jesync = self.jesync()
        first = self.elock()
        last = self.elock()
        holder.ask(b"lock k\n")
        self.send(first, b"lock k 10\r\n")
        self.assertEqual(holder.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(jesync.ask(b"lock k\nstatus k\n"), b"STATUS 1 2 k\n")
        self.send(last, b"lock k 10\r\n")
        self.assertEqual(holder.ask(b"status k\n"), b"STATUS 1 3 k\n")
        self.assertEqual(holder.ask(b"release k\n"), b"RELEASED 1 2 k\n")
        self.assertEqual(first.received(), b"200 Acquired\r\n")
        self.assertEqual(first.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(jesync.received(), b"GRANTED 1 1 k 120\n")
        self.assertEqual(jesync.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        self.assertEqual(last.received(), b"200 Acquired\r\n")

    def test_stats_counts_the_whole_table(self):
        elock = self.elock()
        other = self.elock()
        jesync = self.jesync()
        elock.ask(b"lock a\r\n")
        jesync.ask(b"lock b 2\nlock c\n")
        self.assertEqual(other.ask(b"stats\r\n"), stats(2, 3, 0))
        self.drop(elock)
        self.assertEqual(other.ask(b"stats\r\n"), stats(1, 3, 1))
        self.drop(jesync)
        self.assertEqual(other.ask(b"stats\r\n"), stats(1, 1, 1))


class SessionTests(InMemoryTestCase):
    def test_resumed_with_its_locks(self):
        holder, waiter = self.hold_with_waiter()
        session_id = self.session_id(holder)
        self.drop(holder)
        self.assertEqual(waiter.ask(b"status k\n"), b"STATUS 1 1 k\n")
        new = self.elock()
        self.assertEqual(new.ask(b"conn_id %s\r\n" % session_id), b"200 conn id set\r\n")
        self.assertEqual(new.ask(b"stats\r\n"), stats(1, 1, 0))
        self.assertEqual(new.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(new.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")

    def test_not_resumed_locks_go_to_the_waiter(self):
        # 500 ms: the two round trips below must fit in the grace period
        holder, waiter = self.hold_with_waiter(b"500")
        monitor = self.elock()
        dropped_at = self.drop(holder)
        # in the grace period: the session is monitored and keeps the lock
        self.assertEqual(monitor.ask(b"stats\r\n"), stats(1, 1, 1))
        self.assertEqual(waiter.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.server.advance(0.499)
        self.assertEqual(waiter.received(), b"")
        # then it ends, and the lock goes to the waiter
        self.server.advance(0.001)
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")
        self.assertGreaterEqual(self.server.reactor.seconds() - dropped_at, 0.45)
        self.assertEqual(monitor.ask(b"stats\r\n"), stats(1, 1, 0))
        self.assertEqual(len(self.sessions), 0)

    def test_short_grace_period(self):
        holder, waiter = self.hold_with_waiter(b"200")
        session_id = self.session_id(holder)
        self.drop(holder)
        self.server.advance(0.2)
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")
        # too late: the id names a new session, which holds nothing
        new = self.elock()
        self.assertEqual(
            new.ask(b"conn_id %s\r\nunlock k\r\n" % session_id),
            b"200 conn id set\r\n403 not_yours\r\n",
        )

    def test_zero_timeout_releases_on_drop(self):
        holder, waiter = self.hold_with_waiter(b"0")
        monitor = self.elock()
        self.drop(holder, abort=False)
        # at once, not after the default grace period of 30 s
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")
        self.assertEqual(monitor.ask(b"stats\r\n"), stats(1, 1, 0))

    def test_quit_releases_at_once(self):
        holder, waiter = self.hold_with_waiter()
        session_id = self.session_id(holder)
        self.assertEqual(holder.ask(b"quit\r\nunlock k\r\n"), BYE)
        self.assertIsInstance(holder.lost.value, ConnectionDone)
        self.assertEqual(holder.received(), b"")
        # no grace period (the default would be 30 s)
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")
        new = self.elock()
        self.assertEqual(new.ask(b"stats\r\n"), stats(1, 1, 0))
        self.assertEqual(
            new.ask(b"conn_id %s\r\nunlock k\r\n" % session_id),
            b"200 conn id set\r\n403 not_yours\r\n",
        )

    def test_cannot_take_a_live_session(self):
        owner = self.elock()
        thief = self.elock()
        owner.ask(b"lock k\r\n")
        session_id = self.session_id(owner)
        self.assertEqual(thief.ask(b"conn_id %s\r\n" % session_id), b"403 cannot set conn id\r\n")
        self.assertEqual(thief.ask(b"unlock k\r\n"), b"403 not_yours\r\n")
        self.assertEqual(owner.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")

    def test_connection_with_a_session_cannot_set_another(self):
        first = self.elock()
        second = self.elock()
        first.ask(b"lock k\r\n")
        session_id = self.session_id(first)
        self.drop(first)
        self.assertEqual(
            second.ask(b"set_timeout 100\r\nconn_id %s\r\nunlock k\r\n" % session_id),
            b"200 timeout set\r\n403 cannot set conn id\r\n403 not_yours\r\n",
        )

    def test_line_too_long_detaches(self):
        holder, waiter = self.hold_with_waiter()
        session_id = self.session_id(holder)
        self.assertEqual(holder.ask(b"x" * (MAX_LINE + 1) + b"\r\nunlock k\r\n"), b"400 line too long\r\n")
        self.assertTrue(holder.closed)
        self.assertEqual(holder.received(), b"")
        self.assertEqual(self.elock_factory.clients, 0)
        # a drop like any other: the session waits to be resumed
        new = self.elock()
        self.assertEqual(new.ask(b"stats\r\n"), stats(1, 1, 1))
        self.assertEqual(new.ask(b"conn_id %s\r\n" % session_id), b"200 conn id set\r\n")
        self.assertEqual(new.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")

    def test_longest_line(self):
        self.policy.max_key_length = MAX_LINE
        client = self.elock()
        key = b"k" * (MAX_LINE - len(b"lock "))
        self.assertEqual(client.ask(b"lock %s\r\n" % key), b"200 Acquired\r\n")
        self.assertEqual(client.ask(b"unlock_all\n"), b"200 OK\r\n")


class SessionBoundTests(InMemoryTestCase):
    """What a client that goes away can leave behind: a bounded grace, and nothing if it held nothing."""

    def test_idle_sessions_asking_the_longest_grace_do_not_fill_max_sessions(self):
        self.sessions.limit = 50
        for _ in range(50):
            client = self.elock()
            self.assertEqual(
                client.ask(b"set_timeout 2147483647\r\n"), b"200 timeout set to 300000\r\n"
            )
            self.drop(client)
        self.assertEqual((len(self.sessions), self.sessions.detached_count()), (0, 0))
        newcomer = self.elock()
        self.assertEqual(newcomer.ask(b"lock k\r\n"), b"200 Acquired\r\n")
        self.assertEqual(newcomer.ask(b"stats\r\n"), stats(1, 1, 0))
        self.assertEqual(newcomer.ask(b"unlock k\r\n"), b"200 Unlocked\r\n")

    def test_a_session_holding_a_lock_keeps_it_for_the_bounded_grace(self):
        self.sessions.max_grace_ms = 300
        holder, waiter = self.hold_with_waiter()
        self.assertEqual(holder.ask(b"set_timeout 2147483647\r\n"), b"200 timeout set to 300\r\n")
        dropped_at = self.drop(holder)
        self.assertEqual(self.sessions.detached_count(), 1)
        self.server.advance(0.299)
        self.assertEqual(waiter.received(), b"")
        self.server.advance(0.001)
        self.assertEqual(waiter.received(), b"GRANTED 1 0 k 120\n")
        self.assertGreaterEqual(self.server.reactor.seconds() - dropped_at, 0.25)
        self.assertEqual(len(self.sessions), 0)

    def test_the_operator_lists_sessions_and_ends_them_by_id(self):
        # ids a client chose: UTF-8 that is not ASCII, and bytes that are not UTF-8
        ids = ["s\u00e9ance".encode(), b"\xff\xfe\x80"]
        waiter = self.jesync()
        peers = []
        for number, session_id in enumerate(ids):
            holder = self.elock()
            peers.append(b"127.0.0.1:%d" % holder.transport.getHost().port)
            self.assertEqual(
                holder.ask(b"conn_id %s\r\nlock k%d\r\n" % (session_id, number)),
                b"200 conn id set\r\n200 Acquired\r\n",
            )
            status = waiter.ask(b"lock k%d\nstatus k%d\n" % (number, number))
            self.assertEqual(status, b"STATUS 1 1 k%d\n" % number)
            self.drop(holder)
        attached = self.elock()
        attached_id = self.session_id(attached)
        attached_peer = b"127.0.0.1:%d" % attached.transport.getHost().port
        admin = self.admin()
        listing = admin.ask(b"sessions\n")
        lines = listing.split(b"\n")
        self.assertEqual(lines[-2:], [b"END", b""])
        rows = [line.split(b" ") for line in lines[:-2]]
        self.assertEqual(
            [row[:5] for row in rows],
            [
                [b"SESSION", ids[0], peers[0], b"1", b"detached"],
                [b"SESSION", ids[1], peers[1], b"1", b"detached"],
                [b"SESSION", attached_id, attached_peer, b"0", b"attached"],
            ],
        )
        for row in rows[:2]:
            self.assertTrue(0 < int(row[5]) <= 30_000, row)
        self.assertEqual(rows[2][5], b"30000")
        # each id as listed ends its session, and its lock goes to the waiter
        for number, row in enumerate(rows[:2]):
            self.assertEqual(admin.ask(b"end-session %s\n" % row[1]), b"SESSION-ENDED %s\n" % ids[number])
            self.assertEqual(waiter.received(), b"GRANTED 1 0 k%d 120\n" % number)
        self.assertEqual(
            admin.ask(b"sessions\n"), b"SESSION %s %s 0 attached 30000\nEND\n" % (attached_id, attached_peer)
        )
        self.assertEqual(waiter.ask(b"release k0\nrelease k1\n"), b"RELEASED 0 0 k0\nRELEASED 0 0 k1\n")


class PipeliningTests(InMemoryTestCase):
    def test_waiting_lock_holds_back_later_replies(self):
        jesync = self.jesync()
        elock = self.elock()
        self.assertEqual(jesync.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.send(elock, b"lock k 5\r\nstats\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(elock.received(), b"")
        self.assertEqual(jesync.ask(b"release k\n"), b"RELEASED 1 0 k\n")
        # had stats been answered while the lock waited, it would come first
        self.assertEqual(elock.received().splitlines(True), [b"200 Acquired\r\n", *stats(1, 1, 0).splitlines(True)])

    def test_timed_out_wait_then_held_back_replies(self):
        jesync = self.jesync()
        elock = self.elock()
        jesync.ask(b"lock k\n")
        self.send(elock, b"lock k 1\r\nlock j\r\nunlock k\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.assertEqual(elock.received(), b"")
        self.server.advance(1)
        self.assertEqual(
            elock.received().splitlines(True), [b"409 Unavailable\r\n", b"200 Acquired\r\n", b"403 not_yours\r\n"]
        )
        self.assertEqual(jesync.ask(b"status k\nstatus j\n"), b"STATUS 1 0 k\nSTATUS 1 0 j\n")

    def test_drop_while_waiting_cancels_the_wait(self):
        jesync = self.jesync()
        elock = self.elock()
        monitor = self.elock()
        jesync.ask(b"lock k\n")
        self.assertEqual(elock.ask(b"lock j\r\n"), b"200 Acquired\r\n")
        self.send(elock, b"lock k 5\r\nstats\r\n")
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 1 k\n")
        self.drop(elock)
        self.assertEqual(jesync.ask(b"status k\n"), b"STATUS 1 0 k\n")
        self.assertEqual(monitor.ask(b"stats\r\n"), stats(1, 2, 1))
        self.assertEqual(jesync.ask(b"release k\n"), b"RELEASED 0 0 k\n")
        self.assertEqual(jesync.ask(b"status-by-key\n"), b"STATUS 1 0 j\nEND\n")


class BadInputTests(InMemoryTestCase):
    def test_garbage(self):
        client = self.elock()
        other = self.elock()
        jesync = self.jesync()
        lines = [
            (b"\x00", b"400 Unknown command: [0]"),
            (b"\x00\x00 lock k", b"400 Unknown command: [0,0]"),
            (b"\xff\xfe\xfd", b'400 Unknown command: "\xff\xfe\xfd"'),
            (b"\xc3\x28 \xa0\xa1", b'400 Unknown command: "\xc3("'),
            (b"", b'400 Unknown command: ""'),
            (b" \t ", b'400 Unknown command: ""'),
            (b"\x1b[A\x7f", b"400 Unknown command: [27,91,65,127]"),
            (b"\x1b[A", b'400 Unknown command: "\\e[A"'),
            (b"lock", b"400 missing key"),
            (b"lock k \xff", b"400 wait is not an integer"),
            (b"lock k -3", b"400 wait must not be negative"),
            (b"lock k 1 2", b"400 too many arguments"),
            (b"set_timeout soon", b"400 timeout is not an integer"),
            (b"set_timeout -1", b"400 timeout must not be negative"),
            (b"conn_id " + b"x" * 300, b"400 conn id longer than 256 bytes"),
            (b"unlock \x00 \x00", b"400 too many arguments"),
            (b"unlock \xff\x00", b"403 not_locked"),
        ]
        sent = b"".join(line + b"\r\n" for line, reply in lines) + b"lock \xff\x00\r\n"
        expected = b"".join(reply + b"\r\n" for line, reply in lines) + b"200 Acquired\r\n"
        self.assertEqual(client.ask(sent), expected)
        # and everybody is still served
        self.assertEqual(other.ask(b"lock \xff\x00\r\n"), b"409 Unavailable\r\n")
        self.assertEqual(jesync.ask(b"status \xff\x00\n"), b"STATUS 1 0 \xff\x00\n")
        self.assertEqual(client.ask(b"unlock \xff\x00\r\n"), b"200 Unlocked\r\n")

    def test_binary_noise_then_drop(self):
        client = self.elock()
        other = self.elock()
        noise = bytes(range(256)) * 4
        client.send(noise)
        # whatever lines the noise makes, each one is answered with a 400
        self.server.flush()
        replies = client.received().splitlines(True)
        self.assertEqual(len(replies), noise.count(b"\n"))
        for reply in replies:
            self.assertRegex(reply, rb'^400 Unknown command: ("[^\r\n]*"|\[[0-9,]+\])\r\n$')
        self.drop(client)
        self.assertEqual(other.ask(b"lock k\r\n"), b"200 Acquired\r\n")
