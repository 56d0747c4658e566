"""
The elock protocol over real TCP, next to JESync: one L{LockService} shared by
a L{JESyncFactory}, an L{ELockFactory} and the operator's L{AdminFactory},
each listening on 127.0.0.1 port 0, in this process.

Nothing here sleeps: every step waits for the reply line it expects, or a
connection closing, with a bounded timeout.  Grace periods are short
(C{set_timeout 200}) and are waited out by waiting for what ends them: the
waiting JESync client's C{GRANTED} line.  That a reply is I{not} sent is shown
by order: the next line a client reads is the reply to a later command.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.trial.unittest import TestCase

from jesync import ELockFactory, JESyncFactory, LockService
from jesync.connections.policy import ConnectionPolicy
from jesync.protocols.admin import AdminFactory
from tests.support import BYE, TIMEOUT, ConnectionTracker, LineClient, stats

MAX_LINE = 8192
class SharedServer:
    """
    A lock service served over JESync and elock, each on its own port.

    L{start} registers a cleanup that closes every client and server
    connection, stops listening, ends the sessions still in their grace
    period (so no grace timer outlives the test), and checks that the lock
    table was left empty.
    """

    def __init__(self, test) -> None:
        self.test = test
        self.service = LockService(reactor)
        self.policy = ConnectionPolicy()
        self.jesync_factory = JESyncFactory(self.service, policy=self.policy)
        self.elock_factory = ELockFactory(self.service, policy=self.policy)
        self.sessions = self.elock_factory.sessions
        self.admin_factory = AdminFactory(self.service, policy=self.policy, sessions=self.sessions)
        self.trackers = {
            "jesync": ConnectionTracker(self.jesync_factory),
            "elock": ConnectionTracker(self.elock_factory),
            "admin": ConnectionTracker(self.admin_factory),
        }
        self.clients: dict[str, list[LineClient]] = {"jesync": [], "elock": [], "admin": []}
        self.ports: dict[str, object] = {}
        # peer port -> fires with the server side once it is connected
        self._connected: dict[int, Deferred] = {}
        for factory in (self.jesync_factory, self.elock_factory, self.admin_factory):
            self._announce_connections(factory)

    def _announce_connections(self, factory) -> None:
        build = factory.buildProtocol

        def buildProtocol(addr):
            protocol = build(addr)
            made = protocol.connectionMade

            def connectionMade():
                made()
                self._server_side(addr.port).callback(protocol)

            protocol.connectionMade = connectionMade
            return protocol

        factory.buildProtocol = buildProtocol

    def _server_side(self, port: int) -> Deferred:
        return self._connected.setdefault(port, Deferred())

    @classmethod
    @inlineCallbacks
    def start(cls, test):
        server = cls(test)
        test.addCleanup(server.shutdown)
        for name, factory in [
            ("jesync", server.jesync_factory),
            ("elock", server.elock_factory),
            ("admin", server.admin_factory),
        ]:
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            server.ports[name] = yield endpoint.listen(factory)
        return server

    @inlineCallbacks
    def _connect(self, name: str):
        port = self.ports[name].getHost().port
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
        client.kind = name
        self.clients[name].append(client)
        client.served = yield self._server_side(client.transport.getHost().port).addTimeout(TIMEOUT, reactor)
        return client

    def elock(self) -> Deferred:
        return self._connect("elock")

    def jesync(self) -> Deferred:
        return self._connect("jesync")

    def admin(self) -> Deferred:
        return self._connect("admin")

    def send(self, client: LineClient, data: bytes) -> Deferred:
        """
        Send C{data}; fires once the server has read all of it and answered
        or started whatever lines in it it could (a held connection reads
        no further than its waiting C{lock}).
        """
        protocol = client.served
        received = protocol.dataReceived
        left = [len(data)]
        arrived: Deferred[None] = Deferred()

        def dataReceived(chunk: bytes) -> None:
            received(chunk)
            left[0] -= len(chunk)
            if left[0] <= 0 and not arrived.called:
                del protocol.dataReceived
                arrived.callback(None)

        protocol.dataReceived = dataReceived
        client.send(data)
        return arrived.addTimeout(TIMEOUT, reactor)

    def wait_lost(self, client: LineClient) -> Deferred:
        """Fires once the server has seen C{client}'s connection go."""
        return self.trackers[client.kind].wait_lost([client.served])

    @inlineCallbacks
    def drop(self, client: LineClient, abort: bool = True):
        """
        Close C{client}'s connection and wait until the server has seen it
        go; fires with the reactor's time at that moment.
        """
        protocol = client.served
        lost = self.trackers[client.kind].lost[protocol]
        seen: list[float] = []
        lost.addCallback(lambda ignored: seen.append(reactor.seconds()))
        yield (client.abort() if abort else client.disconnect())
        yield self.trackers[client.kind].wait_lost([protocol])
        return seen[0]

    @inlineCallbacks
    def shutdown(self):
        for name, tracker in self.trackers.items():
            yield tracker.close_all(self.clients[name])
        for port in self.ports.values():
            yield port.stopListening()
        self.test.assertEqual(self.elock_factory.clients, 0)
        # Every connection is gone, so every session left is in its grace
        # period; end them now rather than leave their timers behind:
        # resuming one cancels its timer, ending it releases its locks.
        for session in list(self.sessions._sessions.values()):
            self.test.assertIsNone(session.connection, session)
            self.test.assertIs(self.sessions.take(self, session.id), session)
            session.end()
        self.test.assertEqual(len(self.sessions), 0)
        self.test.assertEqual(self.service.listing(), [])


class ELockTCPTestCase(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.server = yield SharedServer.start(self)
        self.service = self.server.service
        self.sessions = self.server.sessions

    def tearDown(self) -> None:
        # Never a traceback, whatever the test sent.
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def session_id(self, client: LineClient):
        reply = yield client.ask(b"conn_id\r\n")
        self.assertTrue(reply.startswith(b"200 ") and reply.endswith(b"\r\n"), reply)
        return reply[4:-2]

    @inlineCallbacks
    def hold_with_waiter(self, timeout: bytes | None = None, key: bytes = b"k"):
        """
        An elock client that holds C{key} (after C{set_timeout <timeout>}),
        and a JESync client waiting for it (the wait is queued when this
        fires).
        """
        holder = yield self.server.elock()
        waiter = yield self.server.jesync()
        if timeout is not None:
            self.assertEqual((yield holder.ask(b"set_timeout %s\r\n" % timeout)), b"200 timeout set\r\n")
        self.assertEqual((yield holder.ask(b"lock %s\r\n" % key)), b"200 Acquired\r\n")
        self.assertEqual((yield waiter.ask(b"lock %s\nstatus %s\n" % (key, key))), b"STATUS 1 1 %s\n" % key)
        return holder, waiter


class FramingTests(ELockTCPTestCase):
    @inlineCallbacks
    def test_many_pipelined_in_one_write(self):
        client = yield self.server.elock()
        commands = b"".join(b"lock k%d\r\nunlock k%d\r\nunlock k%d\r\n" % (i, i, i) for i in range(500))
        expected = b"200 Acquired\r\n200 Unlocked\r\n403 not_locked\r\n" * 500
        self.assertEqual((yield client.ask(commands + b"stats\r\n", 1505)), expected + stats(1, 0, 0))

    @inlineCallbacks
    def test_ids_are_random(self):
        first = yield self.server.elock()
        second = yield self.server.elock()
        first_id = yield self.session_id(first)
        second_id = yield self.session_id(second)
        self.assertNotEqual(first_id, second_id)
        for session_id in (first_id, second_id):
            self.assertGreaterEqual(len(session_id), 20, session_id)
            self.assertFalse(session_id.isdigit(), session_id)
        self.assertEqual((yield self.session_id(first)), first_id)


class CrossProtocolTests(ELockTCPTestCase):
    @inlineCallbacks
    def test_elock_lock_excludes_jesync(self):
        elock = yield self.server.elock()
        jesync = yield self.server.jesync()
        waiter = yield self.server.jesync()
        self.assertEqual((yield elock.ask(b"lock k\r\n")), b"200 Acquired\r\n")
        self.assertEqual((yield jesync.ask(b"status k\n")), b"STATUS 1 0 k\n")
        self.assertEqual((yield jesync.ask(b"lock k 1 0\n")), b"TIMEOUT 1 0 k\n")
        self.assertEqual((yield waiter.ask(b"lock k 3\nstatus k\n")), b"STATUS 1 1 k\n")
        self.assertEqual((yield elock.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield elock.ask(b"lock k\r\n")), b"409 Unavailable\r\n")
        self.assertEqual((yield waiter.ask(b"release k\n")), b"RELEASED 0 0 k\n")

    @inlineCallbacks
    def test_jesync_lock_excludes_elock(self):
        jesync = yield self.server.jesync()
        elock = yield self.server.elock()
        self.assertEqual((yield jesync.ask(b"lock k 5\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield elock.ask(b"lock k\r\n")), b"409 Unavailable\r\n")
        yield self.server.send(elock, b"lock k 5\r\n")
        self.assertEqual((yield jesync.ask(b"status k\n")), b"STATUS 1 1 k\n")
        self.assertEqual((yield jesync.ask(b"release k\n")), b"RELEASED 1 0 k\n")
        self.assertEqual((yield elock.read_line()), b"200 Acquired\r\n")
        self.assertEqual((yield jesync.ask(b"lock k 1 0\n")), b"TIMEOUT 1 0 k\n")

    @inlineCallbacks
    def test_one_fifo_queue_for_both(self):
        holder = yield self.server.jesync()
        jesync = yield self.server.jesync()
        first = yield self.server.elock()
        last = yield self.server.elock()
        yield holder.ask(b"lock k\n")
        yield self.server.send(first, b"lock k 10\r\n")
        self.assertEqual((yield holder.ask(b"status k\n")), b"STATUS 1 1 k\n")
        self.assertEqual((yield jesync.ask(b"lock k\nstatus k\n")), b"STATUS 1 2 k\n")
        yield self.server.send(last, b"lock k 10\r\n")
        self.assertEqual((yield holder.ask(b"status k\n")), b"STATUS 1 3 k\n")
        self.assertEqual((yield holder.ask(b"release k\n")), b"RELEASED 1 2 k\n")
        self.assertEqual((yield first.read_line()), b"200 Acquired\r\n")
        self.assertEqual((yield first.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")
        self.assertEqual((yield jesync.read_line()), b"GRANTED 1 1 k 120\n")
        self.assertEqual((yield jesync.ask(b"release k\n")), b"RELEASED 1 0 k\n")
        self.assertEqual((yield last.read_line()), b"200 Acquired\r\n")

    @inlineCallbacks
    def test_stats_counts_the_whole_table(self):
        elock = yield self.server.elock()
        other = yield self.server.elock()
        jesync = yield self.server.jesync()
        yield elock.ask(b"lock a\r\n")
        yield jesync.ask(b"lock b 2\nlock c\n", 2)
        self.assertEqual((yield other.ask(b"stats\r\n", 5)), stats(2, 3, 0))
        yield self.server.drop(elock)
        self.assertEqual((yield other.ask(b"stats\r\n", 5)), stats(1, 3, 1))
        yield self.server.drop(jesync)
        self.assertEqual((yield other.ask(b"stats\r\n", 5)), stats(1, 1, 1))


class SessionTests(ELockTCPTestCase):
    @inlineCallbacks
    def test_resumed_with_its_locks(self):
        holder, waiter = yield self.hold_with_waiter()
        session_id = yield self.session_id(holder)
        yield self.server.drop(holder)
        self.assertEqual((yield waiter.ask(b"status k\n")), b"STATUS 1 1 k\n")
        new = yield self.server.elock()
        self.assertEqual((yield new.ask(b"conn_id %s\r\n" % session_id)), b"200 conn id set\r\n")
        self.assertEqual((yield new.ask(b"stats\r\n", 5)), stats(1, 1, 0))
        self.assertEqual((yield new.ask(b"lock k\r\n")), b"200 Acquired\r\n")
        self.assertEqual((yield new.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")

    @inlineCallbacks
    def test_not_resumed_locks_go_to_the_waiter(self):
        # 500 ms: the two round trips below must fit in the grace period
        holder, waiter = yield self.hold_with_waiter(b"500")
        monitor = yield self.server.elock()
        dropped_at = yield self.server.drop(holder)
        # in the grace period: the session is monitored and keeps the lock
        self.assertEqual((yield monitor.ask(b"stats\r\n", 5)), stats(1, 1, 1))
        self.assertEqual((yield waiter.ask(b"status k\n")), b"STATUS 1 1 k\n")
        # then it ends, and the lock goes to the waiter
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertGreaterEqual(reactor.seconds() - dropped_at, 0.45)
        self.assertEqual((yield monitor.ask(b"stats\r\n", 5)), stats(1, 1, 0))
        self.assertEqual(len(self.sessions), 0)

    @inlineCallbacks
    def test_short_grace_period(self):
        holder, waiter = yield self.hold_with_waiter(b"200")
        session_id = yield self.session_id(holder)
        yield self.server.drop(holder)
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        # too late: the id names a new session, which holds nothing
        new = yield self.server.elock()
        self.assertEqual(
            (yield new.ask(b"conn_id %s\r\nunlock k\r\n" % session_id, 2)),
            b"200 conn id set\r\n403 not_yours\r\n",
        )

    @inlineCallbacks
    def test_zero_timeout_releases_on_drop(self):
        holder, waiter = yield self.hold_with_waiter(b"0")
        monitor = yield self.server.elock()
        yield self.server.drop(holder, abort=False)
        # well within the default grace period of 30 s
        self.assertEqual((yield waiter.read_line(timeout=2)), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield monitor.ask(b"stats\r\n", 5)), stats(1, 1, 0))

    @inlineCallbacks
    def test_quit_releases_at_once(self):
        holder, waiter = yield self.hold_with_waiter()
        session_id = yield self.session_id(holder)
        holder.send(b"quit\r\nunlock k\r\n")
        self.assertEqual((yield holder.read_line()), BYE)
        self.assertIsInstance((yield holder.wait_closed()), ConnectionDone)
        self.assertEqual(holder.unread(), b"")
        # no grace period (the default would be 30 s)
        self.assertEqual((yield waiter.read_line(timeout=2)), b"GRANTED 1 0 k 120\n")
        new = yield self.server.elock()
        self.assertEqual((yield new.ask(b"stats\r\n", 5)), stats(1, 1, 0))
        self.assertEqual(
            (yield new.ask(b"conn_id %s\r\nunlock k\r\n" % session_id, 2)),
            b"200 conn id set\r\n403 not_yours\r\n",
        )

    @inlineCallbacks
    def test_cannot_take_a_live_session(self):
        owner = yield self.server.elock()
        thief = yield self.server.elock()
        yield owner.ask(b"lock k\r\n")
        session_id = yield self.session_id(owner)
        self.assertEqual((yield thief.ask(b"conn_id %s\r\n" % session_id)), b"403 cannot set conn id\r\n")
        self.assertEqual((yield thief.ask(b"unlock k\r\n")), b"403 not_yours\r\n")
        self.assertEqual((yield owner.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")

    @inlineCallbacks
    def test_connection_with_a_session_cannot_set_another(self):
        first = yield self.server.elock()
        second = yield self.server.elock()
        yield first.ask(b"lock k\r\n")
        session_id = yield self.session_id(first)
        yield self.server.drop(first)
        self.assertEqual(
            (yield second.ask(b"set_timeout 100\r\nconn_id %s\r\nunlock k\r\n" % session_id, 3)),
            b"200 timeout set\r\n403 cannot set conn id\r\n403 not_yours\r\n",
        )

    @inlineCallbacks
    def test_line_too_long_detaches(self):
        holder, waiter = yield self.hold_with_waiter()
        session_id = yield self.session_id(holder)
        holder.send(b"x" * (MAX_LINE + 1) + b"\r\nunlock k\r\n")
        self.assertEqual((yield holder.read_line()), b"400 line too long\r\n")
        yield holder.wait_closed()
        self.assertEqual(holder.unread(), b"")
        yield self.server.wait_lost(holder)
        # a drop like any other: the session waits to be resumed
        new = yield self.server.elock()
        self.assertEqual((yield new.ask(b"stats\r\n", 5)), stats(1, 1, 1))
        self.assertEqual((yield new.ask(b"conn_id %s\r\n" % session_id)), b"200 conn id set\r\n")
        self.assertEqual((yield new.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")

    @inlineCallbacks
    def test_longest_line(self):
        self.server.policy.max_key_length = MAX_LINE
        client = yield self.server.elock()
        key = b"k" * (MAX_LINE - len(b"lock "))
        self.assertEqual((yield client.ask(b"lock %s\r\n" % key)), b"200 Acquired\r\n")
        self.assertEqual((yield client.ask(b"unlock_all\n")), b"200 OK\r\n")


class SessionBoundTests(ELockTCPTestCase):
    """What a client that goes away can leave behind: a bounded grace, and nothing if it held nothing."""

    @inlineCallbacks
    def test_idle_sessions_asking_the_longest_grace_do_not_fill_max_sessions(self):
        self.sessions.limit = 50
        for _ in range(50):
            client = yield self.server.elock()
            self.assertEqual(
                (yield client.ask(b"set_timeout 2147483647\r\n")), b"200 timeout set to 300000\r\n"
            )
            yield self.server.drop(client)
        self.assertEqual((len(self.sessions), self.sessions.detached_count()), (0, 0))
        newcomer = yield self.server.elock()
        self.assertEqual((yield newcomer.ask(b"lock k\r\n")), b"200 Acquired\r\n")
        self.assertEqual((yield newcomer.ask(b"stats\r\n", 5)), stats(1, 1, 0))
        self.assertEqual((yield newcomer.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")

    @inlineCallbacks
    def test_a_session_holding_a_lock_keeps_it_for_the_bounded_grace(self):
        self.sessions.max_grace_ms = 300
        holder, waiter = yield self.hold_with_waiter()
        self.assertEqual((yield holder.ask(b"set_timeout 2147483647\r\n")), b"200 timeout set to 300\r\n")
        dropped_at = yield self.server.drop(holder)
        self.assertEqual(self.sessions.detached_count(), 1)
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertGreaterEqual(reactor.seconds() - dropped_at, 0.25)
        self.assertEqual(len(self.sessions), 0)

    @inlineCallbacks
    def test_the_operator_lists_sessions_and_ends_them_by_id(self):
        # ids a client chose: UTF-8 that is not ASCII, and bytes that are not UTF-8
        ids = ["s\u00e9ance".encode(), b"\xff\xfe\x80"]
        waiter = yield self.server.jesync()
        peers = []
        for number, session_id in enumerate(ids):
            holder = yield self.server.elock()
            peers.append(b"127.0.0.1:%d" % holder.transport.getHost().port)
            self.assertEqual(
                (yield holder.ask(b"conn_id %s\r\nlock k%d\r\n" % (session_id, number), 2)),
                b"200 conn id set\r\n200 Acquired\r\n",
            )
            status = yield waiter.ask(b"lock k%d\nstatus k%d\n" % (number, number))
            self.assertEqual(status, b"STATUS 1 1 k%d\n" % number)
            yield self.server.drop(holder)
        attached = yield self.server.elock()
        attached_id = yield self.session_id(attached)
        attached_peer = b"127.0.0.1:%d" % attached.transport.getHost().port
        admin = yield self.server.admin()
        listing = yield admin.ask(b"sessions\n", 4)
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
            self.assertEqual((yield admin.ask(b"end-session %s\n" % row[1])), b"SESSION-ENDED %s\n" % ids[number])
            self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k%d 120\n" % number)
        self.assertEqual(
            (yield admin.ask(b"sessions\n", 2)), b"SESSION %s %s 0 attached 30000\nEND\n" % (attached_id, attached_peer)
        )
        self.assertEqual((yield waiter.ask(b"release k0\nrelease k1\n", 2)), b"RELEASED 0 0 k0\nRELEASED 0 0 k1\n")


class PipeliningTests(ELockTCPTestCase):
    @inlineCallbacks
    def test_waiting_lock_holds_back_later_replies(self):
        jesync = yield self.server.jesync()
        elock = yield self.server.elock()
        self.assertEqual((yield jesync.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        yield self.server.send(elock, b"lock k 5\r\nstats\r\n")
        self.assertEqual((yield jesync.ask(b"status k\n")), b"STATUS 1 1 k\n")
        self.assertEqual(elock.unread(), b"")
        self.assertEqual((yield jesync.ask(b"release k\n")), b"RELEASED 1 0 k\n")
        # had stats been answered while the lock waited, it would come first
        self.assertEqual((yield elock.read_lines(6)), [b"200 Acquired\r\n", *stats(1, 1, 0).splitlines(True)])

    @inlineCallbacks
    def test_timed_out_wait_then_held_back_replies(self):
        jesync = yield self.server.jesync()
        elock = yield self.server.elock()
        yield jesync.ask(b"lock k\n")
        yield self.server.send(elock, b"lock k 1\r\nlock j\r\nunlock k\r\n")
        self.assertEqual((yield jesync.ask(b"status k\n")), b"STATUS 1 1 k\n")
        self.assertEqual(
            (yield elock.read_lines(3)), [b"409 Unavailable\r\n", b"200 Acquired\r\n", b"403 not_yours\r\n"]
        )
        self.assertEqual((yield jesync.ask(b"status k\nstatus j\n", 2)), b"STATUS 1 0 k\nSTATUS 1 0 j\n")

    @inlineCallbacks
    def test_drop_while_waiting_cancels_the_wait(self):
        jesync = yield self.server.jesync()
        elock = yield self.server.elock()
        monitor = yield self.server.elock()
        yield jesync.ask(b"lock k\n")
        self.assertEqual((yield elock.ask(b"lock j\r\n")), b"200 Acquired\r\n")
        yield self.server.send(elock, b"lock k 5\r\nstats\r\n")
        self.assertEqual((yield jesync.ask(b"status k\n")), b"STATUS 1 1 k\n")
        yield self.server.drop(elock)
        self.assertEqual((yield jesync.ask(b"status k\n")), b"STATUS 1 0 k\n")
        self.assertEqual((yield monitor.ask(b"stats\r\n", 5)), stats(1, 2, 1))
        self.assertEqual((yield jesync.ask(b"release k\n")), b"RELEASED 0 0 k\n")
        self.assertEqual((yield jesync.ask(b"status-by-key\n", 2)), b"STATUS 1 0 j\nEND\n")


class BadInputTests(ELockTCPTestCase):
    @inlineCallbacks
    def test_garbage(self):
        client = yield self.server.elock()
        other = yield self.server.elock()
        jesync = yield self.server.jesync()
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
        self.assertEqual((yield client.ask(sent, len(lines) + 1)), expected)
        # and everybody is still served
        self.assertEqual((yield other.ask(b"lock \xff\x00\r\n")), b"409 Unavailable\r\n")
        self.assertEqual((yield jesync.ask(b"status \xff\x00\n")), b"STATUS 1 0 \xff\x00\n")
        self.assertEqual((yield client.ask(b"unlock \xff\x00\r\n")), b"200 Unlocked\r\n")

    @inlineCallbacks
    def test_binary_noise_then_drop(self):
        client = yield self.server.elock()
        other = yield self.server.elock()
        noise = bytes(range(256)) * 4
        client.send(noise)
        # whatever lines the noise makes, each one is answered with a 400
        replies = yield client.read_lines(noise.count(b"\n"))
        for reply in replies:
            self.assertRegex(reply, rb'^400 Unknown command: ("[^\r\n]*"|\[[0-9,]+\])\r\n$')
        yield self.server.drop(client)
        self.assertEqual((yield other.ask(b"lock k\r\n")), b"200 Acquired\r\n")
