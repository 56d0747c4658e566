"""
C{twistd --reactor jesync-epoll jesync ...} (L{jesync.reactor}) as a real
subprocess: twistd lists the reactor, runs under it, serves a lock round
trip, and logs as under Twisted's default reactor (each line's system
included: jesync logs through L{twisted.logger} alone), then stops cleanly.
"""

from __future__ import annotations

import re

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ProcessDone

from tests.twistd_process import TwistdTestCase


def lines_without_addresses(text: str) -> list[str]:
    """The log's lines from the first connection on, without timestamps, ports and peers' addresses."""
    lines = [line.split(" ", 1)[-1] for line in text.splitlines()]
    lines = [re.sub(r"127\.0\.0\.1:\d+", "PEER", re.sub(r"Port \d+", "Port N", line)) for line in lines]
    return lines[next(i for i, line in enumerate(lines) if line.endswith(" connected")) :]


class JESyncEPollTests(TwistdTestCase):
    timeout = 60

    @inlineCallbacks
    def test_listed_by_twistd(self):
        process = self.spawn("--help-reactors")
        reason = yield process.wait_ended()
        self.assertIsInstance(reason, ProcessDone)
        self.assertRegex(process.output, rb"\n    jesync-epoll\s+epoll\(4\) based, without the per-event logging context")

    @inlineCallbacks
    def serve_one_round_trip(self, *reactor_option: str):
        """A server under C{reactor_option}: a lock, a release and a quit; its log."""
        process = self.spawn(*reactor_option, "-n", "--pidfile=", "jesync", "--port", "tcp:0:interface=127.0.0.1")
        match = yield process.wait_for(rb"JESyncFactory starting on (\d+)\n")
        client = yield self.connect(TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1))))
        self.assertEqual((yield client.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield client.ask(b"release k\n")), b"RELEASED 0 0 k\n")
        client.send(b"quit\n")
        yield client.wait_closed()
        yield process.wait_for(rb"disconnected\n")
        yield self.terminate(process)
        return process.text()

    @inlineCallbacks
    def test_serves_and_logs_as_the_default(self):
        default = yield self.serve_one_round_trip()
        ours = yield self.serve_one_round_trip("--reactor", "jesync-epoll")
        self.assertIn("reactor class: jesync.reactor.JESyncEPollReactor", ours)
        self.assertNotIn("reactor class: jesync.reactor", default)
        self.assertEqual(lines_without_addresses(ours), lines_without_addresses(default))
        self.assertIn("[jesync.protocols.jesync.JESyncProtocol#info] PEER connected", lines_without_addresses(ours))
