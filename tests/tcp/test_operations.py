"""
The operating features of C{twistd jesync}, each through a real listening
server in this process: the service L{jesync.tap.makeService} builds from
command-line options, started on 127.0.0.1 port 0 (JESync and elock), with
real TCP clients.

 - limits: --max-connections, --max-keys, --max-waiters, --max-held,
   --max-key-length, each answered on the protocol it came in on, with
   nothing else changed;
 - dead and stuck peers: TCP keepalive (--keepalive), a client that stops
   reading its replies (--max-unsent) (a holder that goes silent, on a
   Clock: L{tests.unit.test_operations});
 - --auth-token-file, the C{holders} listing, and a graceful stop
   (--shutdown-grace) with its summary.

Nothing here sleeps: every step waits for the reply it expects, a connection
closing, or the server seeing one close, with a bounded timeout.  What goes
through a twistd subprocess (the log, exit status, /metrics) is in
L{tests.process.test_operations_twistd}; TLS is in L{tests.tcp.test_tls};
the options as makeService builds them, with nothing listening, are in
L{tests.unit.test_operations}.  The server and the tests' base
(L{tests.server_case.Server}, L{tests.server_case.ServerTestCase}) serve
the other TCP tests too.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from socket import SO_KEEPALIVE, SO_RCVBUF, SO_SNDBUF, SOL_SOCKET

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ConnectionDone, ConnectionLost

from jesync.interfaces import Totals
from jesync.connections.policy import KEEPALIVE_PROBES
from tests.server_case import Server, ServerTestCase
from tests.support import (
    LINUX_KEEPALIVE,
    TIMEOUT,
    TOKEN,
    capture_log,
    keepalive_options,
    peer_of,
    short_temp_dir,
    without_tokens,
    write_file,
)


def system_keepalive() -> tuple[int, ...]:
    """What a socket nobody configured has (SO_KEEPALIVE on)."""
    with socket.socket() as fresh:
        fresh.setsockopt(SOL_SOCKET, SO_KEEPALIVE, 1)
        return keepalive_options(fresh)


# -- limits ---------------------------------------------------------------------


class MaxConnectionsTests(ServerTestCase):
    @inlineCallbacks
    def test_counted_across_protocols(self):
        server = yield Server.start(self, "--max-connections", "2")
        jesync = yield server.jesync()
        elock = yield server.elock()
        self.assertEqual((yield jesync.ask(b"lock a\n")), b"GRANTED 1 0 a 120\n")
        self.assertEqual((yield elock.ask(b"lock b\r\n")), b"200 Acquired\r\n")

        for kind, refusal in [
            ("jesync", b"INVALID_PARAMETER: max-connections exceeded (2)\n"),
            ("elock", b"503 max-connections exceeded (2)\r\n"),
        ]:
            refused = yield server.connect(kind)
            # one line, then the close (the server reads nothing from it)
            reason = yield refused.wait_closed()
            self.assertIsInstance(reason, ConnectionDone)
            self.assertEqual(refused.unread(), refusal)
            yield server.wait_lost(refused)

        # Nothing else changed.
        self.assertEqual(len(server.policy.connections), 2)
        self.assertEqual((yield jesync.ask(b"status-by-key\n", 3)), b"STATUS 1 0 a\nSTATUS 1 0 b\nEND\n")
        self.assertEqual(
            (yield elock.ask(b"stats\r\n", 5)),
            b"200 STATS\r\nSTAT clients 1\r\nSTAT locks 2\r\nSTAT monitoring 0\r\nEND\r\n",
        )

        # Once one closes, another is admitted, whatever its protocol.
        yield server.drop(jesync)
        admitted = yield server.elock()
        self.assertEqual((yield admitted.ask(b"lock a\r\n")), b"200 Acquired\r\n")
        refused = yield server.jesync()
        yield self.assertRefused(refused, b"", b"INVALID_PARAMETER: max-connections exceeded (2)\n")
        self.assertEqual((yield elock.ask(b"quit\r\n")), b"200 Hey, it was nice seeing you.\r\n")
        yield server.wait_lost(elock)
        admitted = yield server.jesync()
        self.assertEqual((yield admitted.ask(b"lock b 1 0\n")), b"GRANTED 1 0 b 120\n")


class ServiceLimitTests(ServerTestCase):
    @inlineCallbacks
    def test_max_keys(self):
        server = yield Server.start(self, "--max-keys", "2")
        jesync, other = yield server.connect_many(2)
        elock = yield server.elock()
        self.assertEqual((yield jesync.ask(b"lock a\n")), b"GRANTED 1 0 a 120\n")
        self.assertEqual((yield elock.ask(b"lock b\r\n")), b"200 Acquired\r\n")
        refused = b"INVALID_PARAMETER: max-keys exceeded (2)\n"
        self.assertEqual((yield jesync.ask(b"lock c\nlock c 1 0\nlock c 1 5 30\n", 3)), refused * 3)
        self.assertEqual((yield elock.ask(b"lock c\r\nlock c 5\r\n", 2)), b"503 max-keys exceeded (2)\r\n" * 2)
        # Keys in use take any request: renewals, waits, tries.
        self.assertEqual((yield jesync.ask(b"lock a 1 -1 30\n")), b"GRANTED 1 0 a 30\n")
        self.assertEqual((yield other.ask(b"lock a 1 0\nlock a\nstatus a\n", 2)), b"TIMEOUT 1 0 a\nSTATUS 1 1 a\n")
        self.assertEqual((yield elock.ask(b"lock a\r\n")), b"409 Unavailable\r\n")
        self.assertEqual((yield jesync.ask(b"status-by-key\n", 3)), b"STATUS 1 1 a\nSTATUS 1 0 b\nEND\n")
        # A key nobody uses any more no longer counts.
        self.assertEqual((yield jesync.ask(b"release a\n")), b"RELEASED 1 0 a\n")
        self.assertEqual((yield other.read_line()), b"GRANTED 1 0 a 120\n")
        self.assertEqual((yield jesync.ask(b"lock c\n")), refused)
        self.assertEqual((yield elock.ask(b"unlock b\r\n")), b"200 Unlocked\r\n")
        self.assertEqual((yield jesync.ask(b"lock c\n")), b"GRANTED 1 0 c 120\n")
        self.assertEqual((yield elock.ask(b"lock d\r\n")), b"503 max-keys exceeded (2)\r\n")

    @inlineCallbacks
    def test_max_waiters(self):
        server = yield Server.start(self, "--max-waiters", "1")
        holder, waiter, other = yield server.connect_many(3)
        elock = yield server.elock()
        self.assertEqual((yield holder.ask(b"lock k\nlock m\n", 2)), b"GRANTED 1 0 k 120\nGRANTED 1 0 m 120\n")
        self.assertEqual((yield waiter.ask(b"lock k\nstatus k\n")), b"STATUS 1 1 k\n")
        refused = b"INVALID_PARAMETER: max-waiters exceeded (1)\n"
        self.assertEqual((yield other.ask(b"lock k\nlock k 1 5\n", 2)), refused * 2)
        self.assertEqual((yield elock.ask(b"lock k 5\r\n")), b"503 max-waiters exceeded (1)\r\n")
        # Requests that do not wait are not limited.
        self.assertEqual((yield other.ask(b"lock k 1 0\n")), b"TIMEOUT 1 1 k\n")
        self.assertEqual((yield elock.ask(b"lock k\r\nlock k 0\r\n", 2)), b"409 Unavailable\r\n" * 2)
        # The limit is per key.
        self.assertEqual((yield other.ask(b"lock m\nstatus m\n")), b"STATUS 1 1 m\n")
        self.assertEqual((yield holder.ask(b"status-by-key\n", 3)), b"STATUS 1 1 k\nSTATUS 1 1 m\nEND\n")
        # A waiter granted leaves room for another.
        self.assertEqual((yield holder.ask(b"release k\n")), b"RELEASED 1 0 k\n")
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield other.ask(b"lock k\nstatus k\n")), b"STATUS 1 1 k\n")

    @inlineCallbacks
    def test_max_held(self):
        server = yield Server.start(self, "--max-held", "2")
        jesync, other = yield server.connect_many(2)
        elock = yield server.elock()
        self.assertEqual((yield jesync.ask(b"lock a\nlock b\n", 2)), b"GRANTED 1 0 a 120\nGRANTED 1 0 b 120\n")
        refused = b"INVALID_PARAMETER: max-held exceeded (2)\n"
        self.assertEqual((yield jesync.ask(b"lock c\nlock c 1 0\n", 2)), refused * 2)
        # renewals do not count
        self.assertEqual((yield jesync.ask(b"lock a 1 -1 30\n")), b"GRANTED 1 0 a 30\n")
        # waits do
        self.assertEqual((yield other.ask(b"lock x\n")), b"GRANTED 1 0 x 120\n")
        self.assertEqual((yield jesync.ask(b"release b\nlock x\nstatus x\n", 2)), b"RELEASED 0 0 b\nSTATUS 1 1 x\n")
        self.assertEqual((yield jesync.ask(b"lock c\n")), refused)
        # per connection: others are not limited by it
        self.assertEqual((yield other.ask(b"lock c\n")), b"GRANTED 1 0 c 120\n")
        # elock: per session
        self.assertEqual((yield elock.ask(b"lock e1\r\nlock e2\r\n", 2)), b"200 Acquired\r\n" * 2)
        self.assertEqual((yield elock.ask(b"lock e3\r\nlock e3 5\r\n", 2)), b"503 max-held exceeded (2)\r\n" * 2)
        self.assertEqual((yield elock.ask(b"lock e1\r\n")), b"200 Acquired\r\n")
        self.assertEqual(
            (yield other.ask(b"status-by-key\n", 6)),
            b"STATUS 1 0 a\nSTATUS 1 0 c\nSTATUS 1 0 e1\nSTATUS 1 0 e2\nSTATUS 1 1 x\nEND\n",
        )
        self.assertEqual((yield other.ask(b"release x\n")), b"RELEASED 1 0 x\n")
        self.assertEqual((yield jesync.read_line()), b"GRANTED 1 0 x 120\n")

    @inlineCallbacks
    def test_max_key_length(self):
        server = yield Server.start(self)
        jesync, other = yield server.connect_many(2)
        elock = yield server.elock()
        longest = b"k" * 1024
        too_long = b"k" * 1025
        self.assertEqual((yield jesync.ask(b"lock %s\n" % longest)), b"GRANTED 1 0 %s 120\n" % longest)
        self.assertEqual((yield other.ask(b"status %s\n" % longest)), b"STATUS 1 0 %s\n" % longest)
        self.assertEqual(
            without_tokens((yield other.ask(b"holders %s\n" % longest, 2))), b"HOLDER %s %s 0 120\nEND\n" % (longest, peer_of(jesync))
        )
        self.assertEqual((yield other.ask(b"release %s\n" % longest)), b"NOT_RELEASED 1 0 %s\n" % longest)
        refused = b"INVALID_PARAMETER: max-key-length exceeded (1024)\n"
        for command in [b"lock %s", b"lock %s 1 0", b"release %s", b"status %s", b"holders %s"]:
            self.assertEqual((yield jesync.ask(command % too_long + b"\n")), refused, command)
        self.assertEqual(
            (yield elock.ask(b"lock %s\r\nlock %s 5\r\nunlock %s\r\n" % ((too_long,) * 3), 3)),
            b"503 max-key-length exceeded (1024)\r\n" * 3,
        )
        # In bytes, not characters.
        accented = "\u00e9".encode() * 512
        self.assertEqual((yield elock.ask(b"lock %s\r\n" % accented)), b"200 Acquired\r\n")
        self.assertEqual((yield elock.ask(b"unlock %sx\r\n" % accented)), b"503 max-key-length exceeded (1024)\r\n")
        self.assertEqual((yield elock.ask(b"unlock %s\r\n" % accented)), b"200 Unlocked\r\n")
        # Nothing else changed.
        self.assertEqual((yield other.ask(b"status-by-key\n", 2)), b"STATUS 1 0 %s\nEND\n" % longest)
        self.assertEqual((yield jesync.ask(b"release %s\n" % longest)), b"RELEASED 0 0 %s\n" % longest)

    @inlineCallbacks
    def test_max_key_length_option(self):
        server = yield Server.start(self, "--max-key-length", "3")
        jesync = yield server.jesync()
        elock = yield server.elock()
        self.assertEqual(
            (yield jesync.ask(b"lock abc\nlock abcd\n", 2)),
            b"GRANTED 1 0 abc 120\nINVALID_PARAMETER: max-key-length exceeded (3)\n",
        )
        self.assertEqual(
            (yield elock.ask(b"lock xyz\r\nlock wxyz\r\n", 2)), b"200 Acquired\r\n503 max-key-length exceeded (3)\r\n"
        )


# -- dead and stuck peers ---------------------------------------------------------


class KeepaliveTests(ServerTestCase):
    @inlineCallbacks
    def test_on_every_accepted_connection(self):
        server = yield Server.start(self, "--keepalive", "7")
        jesync = yield server.jesync()
        elock = yield server.elock()
        self.assertEqual((yield jesync.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield elock.ask(b"lock e\r\n")), b"200 Acquired\r\n")
        expected = (1, 7, 7, KEEPALIVE_PROBES) if LINUX_KEEPALIVE else (1,)
        self.assertEqual(KEEPALIVE_PROBES, 4)
        for client in (jesync, elock):
            self.assertEqual(keepalive_options(client.served.transport.getHandle()), expected)

    @inlineCallbacks
    def test_zero_leaves_the_systems_settings(self):
        server = yield Server.start(self, "--keepalive", "0")
        self.assertIsNone(server.policy.keepalive)
        jesync = yield server.jesync()
        self.assertEqual((yield jesync.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual(keepalive_options(jesync.served.transport.getHandle()), system_keepalive())

    @inlineCallbacks
    def test_unix_socket(self):
        path = os.path.join(short_temp_dir(self), "j.sock")
        server = yield Server.start(self, "--keepalive", "7", port=f"unix:{path}")
        client = yield server.jesync()
        self.assertEqual((yield client.ask(b"lock k\nstatus k\n", 2)), b"GRANTED 1 0 k 120\nSTATUS 1 0 k\n")
        (served,) = server.trackers["jesync"].protocols
        self.assertEqual(served.transport.getHandle().family, socket.AF_UNIX)
        self.assertEqual((yield client.ask(b"release k\nquit\n")), b"RELEASED 0 0 k\n")
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)


class SlowReaderTests(ServerTestCase):
    KEYS = [b"key-%03d-%s" % (n, b"x" * 40) for n in range(200)]

    @inlineCallbacks
    def start_waiting(self, count: int, *argv: str):
        """
        C{other} holds C{count} keys and C{slow} waits for them all; C{slow}
        holds C{mine}, which C{other} waits for.
        """
        self.server = yield Server.start(self, *argv, elock=False)
        slow, other = yield self.server.connect_many(2)
        keys = self.KEYS[:count]
        self.assertEqual(
            (yield other.ask(b"".join(b"lock %s\n" % key for key in keys), count)),
            b"".join(b"GRANTED 1 0 %s 120\n" % key for key in keys),
        )
        self.assertEqual((yield slow.ask(b"lock mine\n")), b"GRANTED 1 0 mine 120\n")
        slow.send(b"".join(b"lock %s\n" % key for key in keys))
        self.assertEqual((yield slow.ask(b"status %s\n" % keys[-1])), b"STATUS 1 1 %s\n" % keys[-1])
        self.assertEqual((yield other.ask(b"lock mine\nstatus mine\n")), b"STATUS 1 1 mine\n")
        return slow, other, keys

    @inlineCallbacks
    def test_dropped_once_too_far_behind(self):
        slow, other, keys = yield self.start_waiting(len(self.KEYS), "--max-unsent", "4096")
        log = capture_log(self)
        yield self.server.fill(slow)
        served = slow.served
        # counted from when it stopped reading
        self.assertEqual(served.behind, 0)

        # Releasing the keys grants them to the paused client: its replies
        # keep coming, until it is more than 4096 bytes behind.
        granted = [b"GRANTED 1 0 %s 120\n" % key for key in keys]
        dropped_at = next(n for n in range(len(keys)) if sum(map(len, granted[: n + 1])) > 4096)
        other.send(b"".join(b"release %s\n" % key for key in keys))
        yield self.server.wait_lost(slow)
        self.assertEqual(
            (yield other.read_lines(len(keys) + 1)),
            [b"RELEASED 1 0 %s\n" % key for key in keys[:dropped_at]]
            # dropping it gave back what it held (mine) and waited for
            + [b"GRANTED 1 0 mine 120\n"]
            + [b"RELEASED 0 0 %s\n" % key for key in keys[dropped_at:]],
        )
        self.assertEqual((yield other.ask(b"status-by-key\n", 2)), b"STATUS 1 0 mine\nEND\n")
        self.assertEqual(len(self.server.policy.connections), 1)
        behind = sum(map(len, granted[: dropped_at + 1]))
        self.assertEqual(
            [line for line in log if "dropped" in line],
            [f"{served.peer} dropped: not reading its replies ({behind} bytes behind)"],
        )

        # The client sees the connection end once it reads.
        slow.transport.resumeProducing()
        self.assertIsInstance((yield slow.wait_closed()), ConnectionLost)

    @inlineCallbacks
    def test_pause_then_read_is_not_dropped(self):
        slow, other, keys = yield self.start_waiting(20, "--max-unsent", "4096")
        sent = yield self.server.fill(slow)
        served = slow.served
        other.send(b"".join(b"release %s\n" % key for key in keys))
        self.assertEqual((yield other.read_lines(len(keys))), [b"RELEASED 1 0 %s\n" % key for key in keys])
        self.assertTrue(served.paused)
        self.assertLessEqual(served.behind, 4096)

        # It reads at last: every reply, and it still holds what it was granted.
        served.transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 2**20)
        slow.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 2**20)
        slow.transport.resumeProducing()
        replies = yield slow.read_lines(sent + len(keys), timeout=20)
        expected = Counter({b"STATUS 0 0 x\n": sent})
        expected.update(b"GRANTED 1 0 %s 120\n" % key for key in keys)
        self.assertEqual(Counter(replies), expected)
        listing = b"".join(b"STATUS 1 0 %s\n" % key for key in keys) + b"STATUS 1 1 mine\nEND\n"
        self.assertEqual((yield slow.ask(b"status-by-key\n", len(keys) + 2)), listing)
        self.assertFalse(served.paused)
        self.assertEqual(len(self.server.policy.connections), 2)


class BigReplyTests(ServerTestCase):
    @inlineCallbacks
    def test_one_reply_bigger_than_max_unsent(self):
        """
        A client that reads is not dropped for asking for a listing bigger
        than --max-unsent (and than the transport's buffer, so that writing
        it pauses the connection): only what is written after it stopped
        reading counts.
        """
        server = yield Server.start(self, "--max-unsent", "4096", elock=False)
        client, other = yield server.connect_many(2)
        keys = [b"k%04d" % n for n in range(5000)]
        yield client.ask(b"".join(b"lock %s\n" % key for key in keys), len(keys))
        listing = b"".join(b"STATUS 1 0 %s\n" % key for key in keys) + b"END\n"
        self.assertGreater(len(listing), client.served.transport.bufferSize)
        paused = []
        real_pause = client.served.pauseProducing
        client.served.pauseProducing = lambda: paused.append(True) or real_pause()
        for _ in range(3):
            self.assertEqual((yield client.ask(b"status-by-key\n", len(keys) + 1)), listing)
        self.assertTrue(paused)
        self.assertEqual((yield client.ask(b"status k0000\n")), b"STATUS 1 0 k0000\n")
        self.assertEqual(len(server.policy.connections), 2)


# -- authentication ---------------------------------------------------------------


class AuthTests(ServerTestCase):
    @inlineCallbacks
    def setUp(self):
        path = write_file(self, TOKEN + b"\n")
        self.server = yield Server.start(self, "--auth-token-file", path)

    @inlineCallbacks
    def test_jesync(self):
        client = yield self.server.jesync()
        self.assertEqual((yield client.ask(b"auth %s\n" % TOKEN)), b"OK\n")
        self.assertEqual((yield client.ask(b"lock k\nstatus k\n", 2)), b"GRANTED 1 0 k 120\nSTATUS 1 0 k\n")
        self.assertEqual((yield client.ask(b"auth %s\n" % TOKEN)), b"OK\n")

        failed = b"INVALID_PARAMETER: auth failed\n"
        for data in [
            b"auth nope\nlock x\n",
            b"auth %s\nlock x\n" % TOKEN[:-1],
            b"auth %sx\n" % TOKEN,
            b"auth\n",
            b"auth %s extra\n" % TOKEN,
            # anything else first: refused, and not done
            b"lock x\nauth %s\n" % TOKEN,
            b"status-by-key\n",
            b"holders k\n",
            b"quit\n",
        ]:
            other = yield self.server.jesync()
            yield self.assertRefused(other, data, failed)
        self.assertEqual((yield client.ask(b"status-by-key\n", 2)), b"STATUS 1 0 k\nEND\n")

    @inlineCallbacks
    def test_elock(self):
        client = yield self.server.elock()
        self.assertEqual((yield client.ask(b"auth %s\r\n" % TOKEN)), b"200 OK\r\n")
        self.assertEqual((yield client.ask(b"lock k\r\n")), b"200 Acquired\r\n")
        for data in [b"auth nope\r\nlock x\r\n", b"auth\r\n", b"lock x\r\nauth %s\r\n" % TOKEN, b"conn_id\r\n"]:
            other = yield self.server.elock()
            yield self.assertRefused(other, data, b"403 auth failed\r\n")
        self.assertEqual(len(self.server.factories["elock"].sessions), 1)
        jesync = yield self.server.jesync()
        self.assertEqual((yield jesync.ask(b"auth %s\nstatus-by-key\n" % TOKEN, 3)), b"OK\nSTATUS 1 0 k\nEND\n")


class NoAuthTests(ServerTestCase):
    @inlineCallbacks
    def test_auth_anything_is_ok(self):
        server = yield Server.start(self)
        jesync = yield server.jesync()
        elock = yield server.elock()
        self.assertEqual((yield jesync.ask(b"lock k\nauth anything\nauth\n", 3)), b"GRANTED 1 0 k 120\nOK\nOK\n")
        self.assertEqual((yield elock.ask(b"auth whatever\r\nlock e\r\n", 2)), b"200 OK\r\n200 Acquired\r\n")


# -- holders ----------------------------------------------------------------------


class HoldersTests(ServerTestCase):
    @inlineCallbacks
    def test_in_grant_order(self):
        server = yield Server.start(self)
        first, second, third = yield server.connect_many(3)
        self.assertEqual((yield first.ask(b"lock k 3 -1 30\n")), b"GRANTED 1 0 k 30\n")
        self.assertEqual((yield second.ask(b"lock k 3 -1 0\n")), b"GRANTED 2 0 k 0\n")
        self.assertEqual(
            without_tokens((yield third.ask(b"holders k\n", 3))),
            b"HOLDER k %s 0 30\nHOLDER k %s 0 0\nEND\n" % (peer_of(first), peer_of(second)),
        )
        self.assertEqual((yield first.ask(b"release k\nlock k 3 -1 60\n", 2)), b"RELEASED 1 0 k\nGRANTED 2 0 k 60\n")
        self.assertEqual(
            without_tokens((yield third.ask(b"holders k\n", 3))),
            b"HOLDER k %s 0 0\nHOLDER k %s 0 60\nEND\n" % (peer_of(second), peer_of(first)),
        )
        # waiters are not holders
        self.assertEqual((yield third.ask(b"lock k 1\nstatus k\n")), b"STATUS 2 1 k\n")
        self.assertEqual(without_tokens((yield third.ask(b"holders k\n", 3))).count(b"HOLDER k "), 2)
        self.assertEqual((yield third.ask(b"holders unused\n")), b"END\n")
        self.assertEqual((yield third.ask(b"holders\n")), b"INVALID_PARAMETER: missing key\n")
        self.assertEqual((yield third.ask(b"holders a b\n")), b"INVALID_PARAMETER: too many arguments\n")

    @inlineCallbacks
    def test_elock_sessions(self):
        server = yield Server.start(self)
        jesync = yield server.jesync()
        elock = yield server.elock()
        session_id = (yield elock.ask(b"conn_id\r\n"))[4:-2]
        self.assertEqual(
            (yield elock.ask(b"set_timeout 60000\r\nlock e\r\n", 2)), b"200 timeout set\r\n200 Acquired\r\n"
        )
        listing = without_tokens((yield jesync.ask(b"holders e\n", 2)))
        self.assertEqual(listing, b"HOLDER e %s 0 0\nEND\n" % peer_of(elock))
        self.assertNotIn(session_id, listing)
        yield server.drop(elock, abort=True)
        listing = without_tokens((yield jesync.ask(b"holders e\n", 2)))
        self.assertEqual(listing, b"HOLDER e detached-session 0 0\nEND\n")
        # resumed: the new connection's peer
        resumed = yield server.elock()
        self.assertEqual((yield resumed.ask(b"conn_id %s\r\n" % session_id)), b"200 conn id set\r\n")
        self.assertEqual(without_tokens((yield jesync.ask(b"holders e\n", 2))), b"HOLDER e %s 0 0\nEND\n" % peer_of(resumed))
        self.assertEqual((yield resumed.ask(b"quit\r\n")), b"200 Hey, it was nice seeing you.\r\n")
        self.assertEqual((yield jesync.ask(b"holders e\n")), b"END\n")


# -- graceful stop ----------------------------------------------------------------


class GracefulStopTests(ServerTestCase):
    @inlineCallbacks
    def test_closes_everything_and_says_what_it_released(self):
        log = capture_log(self)
        server = yield Server.start(self)
        self.assertEqual(
            [line for line in log if line.startswith("jesync starting")],
            [
                "jesync starting: JESync on tcp:0:interface=127.0.0.1; elock on tcp:0:interface=127.0.0.1; "
                "limits: max-connections=10000, max-keys=1000000, max-waiters=10000, max-total-waits=100000, "
                "max-held=10000, max-sessions=10000, max-session-grace=300, max-key-length=1024, max-unsent=4194304, "
                "max-listing-memory=67108864, auth-timeout=10, idle-timeout=none; keepalive 60.0; auth off"
                "; protected mode: only local clients (set --auth-token-file, or --protected-mode off)"
            ],
        )
        holder, waiter = yield server.connect_many(2)
        holding, waiting, detached = yield server.connect_many(3, "elock")
        stuck = yield server.jesync()
        self.assertEqual((yield holder.ask(b"lock a\nlock b\n", 2)), b"GRANTED 1 0 a 120\nGRANTED 1 0 b 120\n")
        self.assertEqual((yield waiter.ask(b"lock c\nlock a\nstatus a\n", 2)), b"GRANTED 1 0 c 120\nSTATUS 1 1 a\n")
        self.assertEqual((yield holding.ask(b"lock e\r\n")), b"200 Acquired\r\n")
        yield server.send(waiting, b"lock e 60\r\n")
        self.assertEqual(
            (yield detached.ask(b"set_timeout 60000\r\nlock d\r\n", 2)), b"200 timeout set\r\n200 Acquired\r\n"
        )
        yield server.drop(detached, abort=True)
        keys = [b"s%02d" % n for n in range(50)]
        yield stuck.ask(b"".join(b"lock %s\n" % key for key in keys), len(keys))
        yield server.fill(stuck)
        self.assertEqual(server.locks.totals(), Totals(55, 55, 2))
        open_clients = [holder, waiter, holding, waiting]

        started = reactor.seconds()
        yield server.service.stopService().addTimeout(TIMEOUT, reactor)
        # The stuck client was dropped after the grace period (1 s).
        self.assertLess(reactor.seconds() - started, 1 + TIMEOUT / 2)
        self.assertGreaterEqual(reactor.seconds() - started, 1)
        self.assertEqual(
            [line for line in log if line.startswith("jesync stopped")],
            [
                "jesync stopped: closed 5 connections, released 55 grants and 2 waits on 55 keys "
                "(0 grants left, held by embedders)"
            ],
        )
        self.assertEqual(server.locks.totals(), Totals(0, 0, 0))
        self.assertEqual(len(server.factories["elock"].sessions), 0)
        for client in open_clients:
            self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        stuck.transport.resumeProducing()
        self.assertIsInstance((yield stuck.wait_closed()), ConnectionLost)
        # What the waiters were told before the end: nothing, or their grant.
        self.assertIn(waiter.unread(), [b"", b"GRANTED 1 0 a 120\n"])
        self.assertIn(waiting.unread(), [b"", b"200 Acquired\r\n"])

    @inlineCallbacks
    def test_slow_reader_that_reads_is_closed_without_waiting_for_the_grace(self):
        """
        A client the server had paused (it was not reading) but that takes
        its last replies once the server stops gets them, then a clean
        close, long before the grace period is over.
        """
        server = yield Server.start(self, "--shutdown-grace", "60", elock=False)
        slow = yield server.jesync()
        keys = [b"k%04d" % n for n in range(5000)]
        yield slow.ask(b"".join(b"lock %s\n" % key for key in keys), len(keys))
        # Each listing is bigger than the transport's buffer: the first one
        # pauses the connection, the rest stay unread in the server.
        yield server.fill(slow, b"status-by-key\n" * 3)
        stopped = server.service.stopService()
        slow.served.transport.getHandle().setsockopt(SOL_SOCKET, SO_SNDBUF, 2**20)
        slow.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 2**20)
        slow.transport.resumeProducing()
        self.assertIsInstance((yield slow.wait_closed()), ConnectionDone)
        listing = b"".join(b"STATUS 1 0 %s\n" % key for key in keys) + b"END\n"
        # (the listings it had been sent, whole: the rest were not answered)
        self.assertIn(slow.unread(), [listing, listing * 2, listing * 3])
        yield stopped.addTimeout(TIMEOUT, reactor)
        self.assertEqual(server.locks.totals(), Totals(0, 0, 0))

    @inlineCallbacks
    def test_nothing_open(self):
        """A stop with nothing open is immediate, and says so."""
        log = capture_log(self)
        server = yield Server.start(self)
        yield server.service.stopService().addTimeout(TIMEOUT, reactor)
        self.assertEqual(
            [line for line in log if line.startswith("jesync stopped")],
            [
                "jesync stopped: closed 0 connections, released 0 grants and 0 waits on 0 keys "
                "(0 grants left, held by embedders)"
            ],
        )
