"""
A connection the server has stopped reading still learns that its peer is
gone (L{jesync.connections.hangup}).

Reading stops while more than 64 KiB of requests are held behind a wait
(elock, dlock: ordered), or while the client does not take its replies (any
protocol).  Then the reactor no longer watches the descriptor for input,
which is how it sees a FIN or an RST.  These tests pause connections both
ways, over real TCP to the server C{twistd jesync} builds (in this process),
then reset them (C{SO_LINGER} 0) or half-close them, and check that the
server closed them within a bounded time, that their waits ended, and that a
release of the key they waited for is granted to nobody.  A L{Clock} test
shows the check's schedule: once per L{PEER_CHECK} while paused, never
otherwise.  Over TCP the check runs every L{TCP_PEER_CHECK} seconds (the
server reads L{hangup.PEER_CHECK} at each check it schedules): what these
tests show is that the check sees the peer go, not how often it looks, and
a check a second apart made them wait a second or more each.

Nothing sleeps: every step waits for a reply, a close, or the server seeing
one, with a bounded timeout.
"""

from __future__ import annotations

import socket
import struct

from twisted.internet.defer import gatherResults, inlineCallbacks
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections import hangup
from jesync.connections.connection import HOLD_BUFFER
from jesync.connections.hangup import GONE, INPUT_ENDED, PEER_CHECK, peer_state
from jesync.connections.policy import socket_of
from jesync.interfaces import KeyStatus
from tests.server_case import Server, ServerTestCase
from tests.support import TIMEOUT, UnitServer, dlock_frame, wait_until
from tests.tls_certificates import skip_without_tls
from tests.tls_server import TLSServer

# What an elock client pipelines behind its waiting lock: more than
# HOLD_BUFFER, so that the server stops reading it.
BEHIND = b"lock free%d\r\nunlock free%d\r\n"
PAIRS = HOLD_BUFFER // len(BEHIND % (0, 0)) + 500
# How long the server may take to see a paused peer go: a few checks.
NOTICED = PEER_CHECK * 3 + TIMEOUT
# Seconds between two checks of a paused connection in the TCP tests.
TCP_PEER_CHECK = 0.05


def reset(client) -> None:
    """Close C{client}'s socket so that it sends an RST (C{SO_LINGER} 0)."""
    socket_of(client.transport).setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.transport.abortConnection()


def unsent(sock: socket.socket) -> int:
    """Bytes C{sock} has not yet got the peer to take (Linux's TIOCOUTQ; 0 where it cannot be told)."""
    try:
        import fcntl
        import termios
    except ImportError:  # pragma: no cover - not Unix
        return 0
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


@inlineCallbacks
def half_close(client):
    """
    C{client}'s socket sends FIN (beneath TLS too: no TLS close), once all it
    sent is in the server's receive buffer: a FIN queued behind bytes the
    server's kernel has no room for cannot arrive until the server reads
    (the case docs/protocols/index.md says is seen late), which is not what these tests
    are about.
    """
    sock = socket_of(client.transport)
    yield wait_until(lambda: unsent(sock) == 0, timeout=TIMEOUT)
    sock.shutdown(socket.SHUT_WR)


class PausedPeerTestCase(ServerTestCase):
    """The server checks a paused connection's socket every L{TCP_PEER_CHECK} seconds."""

    def setUp(self) -> None:
        self.patch(hangup, "PEER_CHECK", TCP_PEER_CHECK)


class ElockHeldBehindAWaitTests(PausedPeerTestCase):
    """elock: a waiting C{lock} and over 64 KiB pipelined behind it."""

    @inlineCallbacks
    def paused_waiters(self, server, count: int):
        """C{count} elock clients, each waiting for C{held} (held by a JESync client) with requests held behind."""
        holder = yield server.jesync()
        self.assertEqual((yield holder.ask(b"lock held\n")), b"GRANTED 1 0 held 120\n")
        clients = yield server.connect_many(count, "elock")
        for n, client in enumerate(clients):
            client.send(b"lock held 3600\r\n" + b"".join(BEHIND % (n, n) for _ in range(PAIRS)))
        yield wait_until(lambda: all(client.served.reading_paused for client in clients))
        self.assertEqual(server.locks.status("held"), KeyStatus("held", 1, count))
        return holder, clients

    @inlineCallbacks
    def test_reset_is_noticed(self):
        server = yield Server.start(self)
        holder, clients = yield self.paused_waiters(server, 20)
        for client in clients:
            reset(client)
        yield gatherResults([client.wait_closed() for client in clients])
        # The server closes every descriptor, and every wait has ended ...
        yield gatherResults([server.trackers["elock"].wait_lost([c.served], timeout=NOTICED) for c in clients])
        self.assertEqual(len(server.policy.connections), 1)
        self.assertEqual((yield holder.ask(b"status held\n")), b"STATUS 1 0 held\n")
        # ... so a release is granted to none of them.
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")
        self.assertEqual(server.locks.listing(), [])
        server.factories["elock"].sessions.end_detached()

    @inlineCallbacks
    def test_fin_is_noticed(self):
        """
        A FIN behind the held requests is seen while they are still unread:
        the wait ends, 409, as at any FIN; the requests held are answered,
        then the server closes.
        """
        server = yield Server.start(self)
        holder, (client,) = yield self.paused_waiters(server, 1)
        client.transport.loseWriteConnection()
        replies = yield client.read_lines(1 + 2 * PAIRS, timeout=NOTICED)
        self.assertEqual(replies[0], b"409 Unavailable\r\n")
        self.assertEqual(set(replies[1::2]), {b"200 Acquired\r\n"})
        self.assertEqual(set(replies[2::2]), {b"200 Unlocked\r\n"})
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        yield server.wait_lost(client)
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")
        server.factories["elock"].sessions.end_detached()

    @inlineCallbacks
    def test_fin_behind_unread_requests(self):
        """
        A FIN queued in the kernel behind requests the server has not read
        yet (far more than it holds back): the check sees the FIN first, the
        wait ends (409), and still every request sent before the FIN is read
        and answered before the server closes (before this was fixed, the
        server closed with requests unread: a reset).  The client is a plain
        blocking socket in a thread (all sent, then FIN, then read to EOF),
        three times.
        """
        server = yield Server.start(self)
        holder = yield server.jesync()
        self.assertEqual((yield holder.ask(b"lock held\n")), b"GRANTED 1 0 held 120\n")
        address = server.ports["elock"].getHost()
        # (a receive buffer that holds all of it, FIN included, whatever the
        # system's autotuning: accepted sockets inherit it)
        server.ports["elock"].socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        # Long keys: little reply for much request, so that answering what
        # is held back does not fill the transport (which would pause the
        # connection again, and let the reactor read on meanwhile).
        pairs = 200
        long_key = b"k" * 1000
        payload = b"lock held 3600\r\n" + b"".join(
            b"lock %s%d\r\nunlock %s%d\r\n" % (long_key, n, long_key, n) for n in range(pairs)
        )

        def send_then_read_all() -> bytes:
            with socket.create_connection((address.host, address.port), timeout=NOTICED + TIMEOUT) as client:
                client.sendall(payload)
                client.shutdown(socket.SHUT_WR)
                received = []
                while True:
                    data = client.recv(1 << 20)
                    if not data:
                        return b"".join(received)
                    received.append(data)

        for _ in range(3):
            replies = (yield deferToThread(send_then_read_all)).split(b"\r\n")
            self.assertEqual(replies[-1], b"")  # (a clean EOF after the last whole reply)
            self.assertEqual(len(replies) - 1, 1 + 2 * pairs)
            self.assertEqual(replies[0], b"409 Unavailable")
            self.assertEqual(set(replies[1:-1:2]), {b"200 Acquired"})
            self.assertEqual(set(replies[2:-1:2]), {b"200 Unlocked"})
        self.assertEqual((yield holder.ask(b"status held\n")), b"STATUS 1 0 held\n")
        server.factories["elock"].sessions.end_detached()


class DlockHeldBehindAWaitTests(PausedPeerTestCase):
    """dlock: a waiting Lock and over 64 KiB of Pings behind it."""

    @inlineCallbacks
    def test_reset_is_noticed(self):
        from tests.dlock_messages import lock, ping

        server = yield Server.start(self, elock=False, dlock=True)
        holder = yield server.jesync()
        self.assertEqual((yield holder.ask(b"lock held\n")), b"GRANTED 1 0 held 120\n")
        client = yield server.dlock()
        pings = b"".join(dlock_frame(ping(id=n)) for n in range(2, 2 + HOLD_BUFFER // 8 + 1000))
        client.send(dlock_frame(lock(["held"], id=1)) + pings)
        yield wait_until(lambda: client.served.reading_paused)
        self.assertEqual(server.locks.status("held"), KeyStatus("held", 1, 1))
        reset(client)
        yield server.trackers["dlock"].wait_lost([client.served], timeout=NOTICED)
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")


class JESyncNotReadingTests(PausedPeerTestCase):
    """JESync: a waiting C{lock}, and a client that does not read its replies."""

    @inlineCallbacks
    def paused_waiter(self, server, holder, client):
        """C{client} waits for C{held}, held by C{holder}, and does not read: the server stops reading it."""
        self.assertEqual((yield holder.ask(b"lock held\n")), b"GRANTED 1 0 held 120\n")
        yield server.send(client, b"lock held 1 3600\n")
        # Room on the server's side for what the client is still sending when the server stops reading.
        socket_of(client.served.transport).setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        socket_of(client.served.transport).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        socket_of(client.transport).setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        # Replies enough to fill every buffer on their way back (so the server stops reading), from
        # requests few enough that all of them fit in the server's receive buffer (so a FIN sent
        # after them can arrive).
        yield server.fill(client, b"status x\n" * 12000, small_buffers=False)
        self.assertTrue(client.served.reading_paused)
        self.assertEqual(server.locks.status("held"), KeyStatus("held", 1, 1))
        return holder, client

    @inlineCallbacks
    def test_fin_ends_the_wait(self):
        """
        It half-closes without reading: before, the FIN was not seen until it
        read its replies; now its wait ends at once, and a release grants
        it nothing.
        """
        server = yield Server.start(self, elock=False)
        holder, client = yield self.paused_waiter(server, *(yield server.connect_many(2)))
        yield half_close(client)
        yield wait_until(lambda: server.locks.status("held") == KeyStatus("held", 1, 0), timeout=NOTICED)
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")
        self.assertEqual(server.locks.listing(), [])

    @inlineCallbacks
    def test_reset_is_noticed(self):
        server = yield Server.start(self, elock=False)
        holder, client = yield self.paused_waiter(server, *(yield server.connect_many(2)))
        reset(client)
        yield server.trackers["jesync"].wait_lost([client.served], timeout=NOTICED)
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")


class TLSNotReadingTests(TLSServer, JESyncNotReadingTests):
    """The same, over TLS: the check looks at the socket beneath the TLS layer."""

    skip = skip_without_tls

    @inlineCallbacks
    def test_fin_ends_the_wait(self):
        """TLS cannot half-close: a FIN closes the connection (as when the server reads it), its wait with it."""
        server = yield self.start()
        holder = yield self.connect(server)
        holder, client = yield self.paused_waiter(server, holder, (yield self.connect(server)))
        yield half_close(client)
        yield server.trackers["jesync"].wait_lost([client.served], timeout=NOTICED)
        self.assertEqual(server.locks.status("held"), KeyStatus("held", 1, 0))
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")

    @inlineCallbacks
    def test_reset_is_noticed(self):
        server = yield self.start()
        holder = yield self.connect(server)
        holder, client = yield self.paused_waiter(server, holder, (yield self.connect(server)))
        reset(client)
        yield server.trackers["jesync"].wait_lost([client.served], timeout=NOTICED)
        self.assertEqual((yield holder.ask(b"release held\nstatus held\n", 2)), b"RELEASED 0 0 held\nSTATUS 0 0 held\n")


class SocketTransport(StringTransport):
    """A L{StringTransport} whose handle is a real socket (one end of a socket pair), as a TCP transport's is."""

    def __init__(self, handle: socket.socket, **kwargs) -> None:
        super().__init__(**kwargs)
        self.handle = handle

    def getHandle(self) -> socket.socket:
        return self.handle


class CheckScheduleTests(SynchronousTestCase):
    """On a L{Clock}: checked once per L{PEER_CHECK} while reading is paused, and not otherwise."""

    def setUp(self) -> None:
        self.server = UnitServer()
        self.ours, self.peer = socket.socketpair()
        self.addCleanup(self.ours.close)
        self.addCleanup(self.peer.close)
        self.holder = self.server.connect()
        self.assertEqual(self.holder.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        self.client = self.server.connect_elock(SocketTransport(self.ours))
        self.client.send(b"lock k 3600\r\n" + BEHIND % (0, 0) * PAIRS)
        self.assertTrue(self.client.protocol.reading_paused)
        self.assertEqual(self.client.transport.producerState, "paused")

    def checks(self) -> list:
        """When the peer checks scheduled are due."""
        calls = self.server.clock.getDelayedCalls()
        return [call.getTime() for call in calls if getattr(call.func, "__name__", "") == "_check_peer"]

    def test_alive_then_gone(self) -> None:
        clock = self.server.clock
        for _ in range(3):
            clock.advance(PEER_CHECK)
            self.assertFalse(self.client.closing)
            self.assertEqual(self.checks(), [clock.seconds() + PEER_CHECK])
        self.peer.close()
        self.assertEqual(peer_state(self.ours), GONE)
        clock.advance(PEER_CHECK)
        self.assertTrue(self.client.closing)
        self.assertEqual(self.checks(), [])
        self.assertEqual(self.client.take(), b"")  # its wait ended, not answered
        self.assertEqual(self.server.service.status("k"), KeyStatus("k", 1, 0))
        self.client.lose()
        self.assertEqual(self.holder.ask(b"release k\n"), b"RELEASED 0 0 k\n")

    def test_fin(self) -> None:
        self.peer.shutdown(socket.SHUT_WR)
        self.assertEqual(peer_state(self.ours), INPUT_ENDED)
        self.server.clock.advance(PEER_CHECK)
        replies = self.client.take().split(b"\r\n")
        self.assertEqual(replies[0], b"409 Unavailable")
        self.assertEqual(len(replies), 2 + 2 * PAIRS)
        self.assertFalse(self.client.protocol.reading_paused)
        # Not closed yet: requests sent before the FIN may still be unread;
        # and none of them may wait.
        self.assertFalse(self.client.closing)
        self.assertEqual(self.client.ask(b"lock k 3600\r\n"), b"409 Unavailable\r\n")
        self.client.protocol.readConnectionLost()  # (the reactor reads up to the FIN)
        self.assertTrue(self.client.closing)

    def test_no_check_once_reading(self) -> None:
        self.assertEqual(self.holder.ask(b"release k\n"), b"RELEASED 1 0 k\n")  # granted to the client
        self.server.clock.advance(0)  # (what it held back is read on the next turn)
        replies = self.client.take().split(b"\r\n")
        self.assertEqual((replies[0], len(replies)), (b"200 Acquired", 2 + 2 * PAIRS))
        self.assertFalse(self.client.protocol.reading_paused)
        self.assertEqual(self.checks(), [])
        self.peer.close()
        self.server.clock.advance(PEER_CHECK * 10)
        self.assertFalse(self.client.closing)  # (the reactor would see this close: it reads again)
