"""
The operating features of C{twistd jesync} that only a real process shows:
its log (the startup and shutdown summaries, and never the auth token), its
exit status after SIGTERM, and the /metrics and /health pages, each through
C{twistd -n jesync} run as a subprocess of the checkout.

Nothing here sleeps: every step waits for a reply, a connection closing, a
log line or the process ending, with a bounded timeout.
"""

from __future__ import annotations

import warnings
from socket import SO_RCVBUF, SOL_SOCKET

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ConnectionDone, ProcessDone
from twisted.web.client import Agent, HTTPConnectionPool, readBody

from tests.support import TIMEOUT, TOKEN, write_file
from tests.twistd_process import TwistdTestCase, assert_usage_error_status

LOCAL = "tcp:0:interface=127.0.0.1"


def largest_send_buffer() -> int:
    """The most a TCP socket's send buffer may grow to (Linux says; elsewhere, a generous guess)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as wmem:
            return int(wmem.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return 8 * 2**20


class AuthTokenTests(TwistdTestCase):
    @inlineCallbacks
    def test_never_shown(self):
        """Neither --help nor a bad token file shows the token."""
        path = write_file(self, TOKEN + b"\n")
        bad = write_file(self, b"%s other-half\n" % TOKEN, "bad-token")
        helping = self.spawn("jesync", "--auth-token-file", path, "--help")
        refused = self.spawn("jesync", "--auth-token-file", bad)
        self.assertIsInstance((yield helping.wait_ended()), ProcessDone)
        self.assertIn(b"--auth-token-file=", helping.output)
        self.assertNotIn(TOKEN, helping.output)
        assert_usage_error_status(self, (yield refused.wait_ended()))
        self.assertIn(b"--auth-token-file: %s must hold one token, without spaces" % bad.encode(), refused.output)
        self.assertNotIn(TOKEN, refused.output)
        self.assertNotIn(b"other-half", refused.output)

    @inlineCallbacks
    def test_never_logged(self):
        """Not at startup, and not when a client sends it, even with --verbose."""
        path = write_file(self, TOKEN + b"\n")
        process = self.run_server("--verbose", "--auth-token-file", path, "--port", LOCAL, "--elock-port", LOCAL)
        summary = yield self.summary(process)
        self.assertTrue(summary.endswith(b"; auth required"), summary)
        jesync_port = yield self.port(process, b"JESyncFactory")
        elock_port = yield self.port(process, b"ELockFactory")

        jesync = yield self.connect(jesync_port)
        self.assertEqual((yield jesync.ask(b"auth %s\n" % TOKEN)), b"OK\n")
        self.assertEqual((yield jesync.ask(b"lock k\nrelease k\n", 2)), b"GRANTED 1 0 k 120\nRELEASED 0 0 k\n")
        wrong = yield self.connect(jesync_port)
        wrong.send(b"auth %s-not\nlock k\n" % TOKEN)
        self.assertIsInstance((yield wrong.wait_closed()), ConnectionDone)
        self.assertEqual(wrong.unread(), b"INVALID_PARAMETER: auth failed\n")
        elock = yield self.connect(elock_port)
        self.assertEqual((yield elock.ask(b"auth %s\r\nlock e\r\n" % TOKEN, 2)), b"200 OK\r\n200 Acquired\r\n")
        self.assertEqual((yield elock.ask(b"quit\r\n")), b"200 Hey, it was nice seeing you.\r\n")
        yield process.wait_for(rb"ELockProtocol#debug\] [^\n]* sent b'quit'\n")
        yield self.terminate(process)

        self.assertNotIn(TOKEN, process.output)
        self.assertEqual(len(process.log_lines(rb"JESyncProtocol#debug\] .* sent b'\(not logged before auth\)'$")), 2, process.text())
        self.assertEqual(len(process.log_lines(rb"ELockProtocol#debug\] .* sent b'\(not logged before auth\)'$")), 1, process.text())
        self.assertEqual(len(process.log_lines(rb"JESyncProtocol#info\] .* failed to authenticate$")), 1, process.text())


class MetricsTests(TwistdTestCase):
    @inlineCallbacks
    def get(self, agent, url: bytes):
        """GET C{url}: (status code, body)."""
        response = yield agent.request(b"GET", url).addTimeout(TIMEOUT, reactor)
        with warnings.catch_warnings():
            # Agent's response transport has no abortConnection (twisted#8227).
            warnings.filterwarnings("ignore", "Using readBody", DeprecationWarning)
            body = readBody(response)
        body = yield body.addTimeout(TIMEOUT, reactor)
        return response.code, body

    @inlineCallbacks
    def assertScraped(self, agent, base: bytes, *samples: bytes):
        """/metrics answers 200, with these lines among its samples."""
        code, body = yield self.get(agent, base + b"/metrics")
        self.assertEqual(code, 200)
        lines = body.split(b"\n")
        for sample in samples:
            self.assertIn(sample, lines, body.decode())

    @inlineCallbacks
    def test_scrape(self):
        process = self.run_server("--port", LOCAL, "--metrics", LOCAL)
        self.assertEqual(
            (yield self.summary(process)),
            b"JESync on tcp:0:interface=127.0.0.1; metrics on tcp:0:interface=127.0.0.1; limits: "
            b"max-connections=10000, max-keys=1000000, max-waiters=10000, max-total-waits=100000, max-held=10000, "
            b"max-sessions=10000, max-session-grace=300, max-key-length=1024, max-unsent=4194304, max-listing-memory=67108864, auth-timeout=10, idle-timeout=none; "
            b"keepalive 60.0; auth off"
            b"; protected mode: only local clients (set --auth-token-file, or --protected-mode off)",
        )
        jesync_port = yield self.port(process, b"JESyncFactory")
        site = yield process.wait_for(rb"_QuietSite starting on (\d+)\n")
        base = b"http://127.0.0.1:%s" % site.group(1)
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        agent = Agent(reactor, connectTimeout=TIMEOUT, pool=pool)

        self.assertEqual((yield self.get(agent, base + b"/health")), (200, b"OK\n"))
        client = yield self.connect(jesync_port)
        self.assertEqual((yield client.ask(b"lock k\nrelease k\n", 2)), b"GRANTED 1 0 k 120\nRELEASED 0 0 k\n")
        yield self.assertScraped(
            agent,
            base,
            b"jesync_grants_total 1.0",
            b"jesync_releases_total 1.0",
            b"jesync_timeouts_total 0.0",
            b"jesync_expiries_total 0.0",
            b"jesync_connections 1.0",
            b"jesync_keys 0.0",
            b"jesync_holders 0.0",
            b"jesync_waiters 0.0",
            b"jesync_wait_seconds_count 1.0",
        )
        other = yield self.connect(jesync_port)
        self.assertEqual((yield other.ask(b"lock held 1 -1 0\n")), b"GRANTED 1 0 held 0\n")
        self.assertEqual((yield client.ask(b"lock held 1 0\n")), b"TIMEOUT 1 0 held\n")
        yield self.assertScraped(
            agent,
            base,
            b"jesync_grants_total 2.0",
            b"jesync_releases_total 1.0",
            b"jesync_timeouts_total 0.0",
            b"jesync_connections 2.0",
            b"jesync_keys 1.0",
            b"jesync_holders 1.0",
        )
        self.assertEqual((yield self.get(agent, base + b"/health")), (200, b"OK\n"))
        yield client.disconnect()
        yield process.wait_for(rb"JESyncProtocol#info\] [^\n]* disconnected\n")
        yield self.terminate(process)
        self.assertIn(
            "jesync stopped: closed 1 connections, released 1 grants and 0 waits on 1 keys "
            "(0 grants left, held by embedders)",
            process.text(),
        )
        # the metrics site logs no line per request
        self.assertEqual(process.log_lines(rb'"GET /'), [])


class GracefulStopTests(TwistdTestCase):
    @inlineCallbacks
    def wait_status(self, client, key: bytes, expected: bytes):
        """Ask C{status key} until the answer is C{expected} (a request another client sent has arrived)."""
        deadline = reactor.seconds() + TIMEOUT
        while True:
            reply = yield client.ask(b"status %s\n" % key)
            if reply == expected or reactor.seconds() > deadline:
                self.assertEqual(reply, expected)
                return

    @inlineCallbacks
    def test_sigterm(self):
        """
        SIGTERM with clients holding and waiting (JESync and elock), an elock
        session in its grace period, and a client that stopped reading: every
        connection is closed, everything released, and twistd exits 0 soon
        after the shutdown grace.
        """
        process = self.run_server("--port", LOCAL, "--elock-port", LOCAL, "--shutdown-grace", "1")
        jesync_port = yield self.port(process, b"JESyncFactory")
        elock_port = yield self.port(process, b"ELockFactory")
        holder = yield self.connect(jesync_port)
        waiter = yield self.connect(jesync_port)
        holding = yield self.connect(elock_port)
        waiting = yield self.connect(elock_port)
        detached = yield self.connect(elock_port)
        stuck = yield self.connect(jesync_port)

        self.assertEqual((yield holder.ask(b"lock a\nlock b\n", 2)), b"GRANTED 1 0 a 120\nGRANTED 1 0 b 120\n")
        self.assertEqual((yield waiter.ask(b"lock c\nlock a\nstatus a\n", 2)), b"GRANTED 1 0 c 120\nSTATUS 1 1 a\n")
        self.assertEqual((yield holding.ask(b"lock e\r\n")), b"200 Acquired\r\n")
        waiting.send(b"lock e 60\r\n")
        yield self.wait_status(holder, b"e", b"STATUS 1 1 e\n")
        self.assertEqual(
            (yield detached.ask(b"set_timeout 60000\r\nlock d\r\n", 2)), b"200 timeout set\r\n200 Acquired\r\n"
        )
        yield detached.abort()
        yield process.wait_for(rb"ELockProtocol#info\] [^\n]* disconnected\n")
        self.assertEqual((yield holder.ask(b"status d\n")), b"STATUS 1 0 d\n")

        # The stuck client holds many long keys, so that one listing of them
        # is more than every socket buffer between it and the server can
        # hold.  It gives up "marker", asks for that listing (the server reads
        # both lines at once), and more, and reads nothing: once the holder is
        # granted "marker", the server has replies it cannot send.
        most_buffered = largest_send_buffer() + 2 * 2**20
        keys = [b"s%05d-%s" % (n, b"x" * 1000) for n in range(most_buffered // 1000 + 1)]
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            yield stuck.ask(b"".join(b"lock %s\n" % key for key in batch), len(batch))
        self.assertEqual((yield stuck.ask(b"lock marker\n")), b"GRANTED 1 0 marker 120\n")
        self.assertEqual((yield holder.ask(b"lock marker\nstatus marker\n")), b"STATUS 1 1 marker\n")
        stuck.transport.pauseProducing()
        stuck.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 4096)
        stuck.send(b"release marker\n" + b"status-by-key\n" * 100)
        self.assertEqual((yield holder.read_line()), b"GRANTED 1 0 marker 120\n")

        started = reactor.seconds()
        yield self.terminate(process)
        # It was dropped after the grace period.
        self.assertGreaterEqual(reactor.seconds() - started, 1)
        self.assertLess(reactor.seconds() - started, 1 + 4)
        (summary,) = process.log_lines(rb"\] jesync stopped: ")
        self.assertTrue(
            summary.endswith(
                b"] jesync stopped: closed 5 connections, released %d grants and 2 waits on %d keys "
                b"(0 grants left, held by embedders)" % (len(keys) + 6, len(keys) + 6)
            ),
            process.text(),
        )
        for client in (holder, waiter, holding, waiting):
            self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        stuck.transport.resumeProducing()
        yield stuck.wait_closed()


class SecondSignalTests(TwistdTestCase):
    @inlineCallbacks
    def test_second_sigterm_while_stopping(self):
        """
        A second SIGTERM during the graceful stop (held open by a client
        that reads nothing of a listing bigger than every buffer) is logged
        and changes nothing: no traceback, and the stop ends as usual, with
        status 0, after the shutdown grace.
        """
        process = self.run_server("--port", LOCAL, "--shutdown-grace", "2", "--max-held", "0")
        port = yield self.port(process, b"JESyncFactory")
        stuck = yield self.connect(port)
        most_buffered = largest_send_buffer() + 2 * 2**20
        keys = [b"s%05d-%s" % (n, b"x" * 1000) for n in range(most_buffered // 1000 + 1)]
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            yield stuck.ask(b"".join(b"lock %s\n" % key for key in batch), len(batch))
        stuck.transport.pauseProducing()
        stuck.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 4096)
        stuck.send(b"status-by-key\n")
        process.transport.signalProcess("TERM")
        yield process.wait_for(rb"Received SIGTERM, shutting down\.\n")
        yield process.wait_for(rb"\(TCP Port \d+ Closed\)\n")
        process.transport.signalProcess("TERM")
        yield process.wait_for(rb"received signal 15 while stopping: already stopping\n")
        reason = yield process.wait_ended()
        output = process.text()
        self.assertIsInstance(reason, ProcessDone, output)
        self.assertEqual(reason.exitCode, 0, output)
        self.assertEqual(output.count("Received SIGTERM"), 1, output)
        self.assertIn("jesync stopped: closed 1 connections", output)
        self.assertNotIn("Traceback", output)
        self.assertNotIn("Unhandled", output)
        stuck.transport.resumeProducing()
        yield stuck.wait_closed()
