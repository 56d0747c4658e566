"""
C{twistd -n jesync --dlock-port ...} as a subprocess: the summary names the
dlock listener, a dlock client over real TCP is served in order, and the log
says it connected and disconnected.  The listener itself is tested in this
process, over real TCP in L{tests.tcp.test_dlock} and on a L{Clock} in
L{tests.unit.test_dlock}.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from tests.dlock_messages import lock, outcome, ping, unlock
from tests.support import TIMEOUT, DlockClient
from tests.twistd_process import TwistdTestCase


class TwistdTests(TwistdTestCase):
    """C{twistd -n jesync --dlock-port ...} as a subprocess (L{tests.twistd_process}'s helpers)."""

    timeout = 60

    @inlineCallbacks
    def test_twistd_dlock_port(self):
        local = "tcp:0:interface=127.0.0.1"
        process = self.run_server("--port", local, "--dlock-port", local)
        summary = yield process.wait_for(rb"\] jesync starting: ([^\n]*)\n")
        self.assertIn(b"; dlock on tcp:0:interface=127.0.0.1;", summary.group(1))
        match = yield process.wait_for(rb"DlockFactory starting on (\d+)\n")
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1)), timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, DlockClient()).addTimeout(TIMEOUT, reactor)
        self.addCleanup(lambda: client.abort() if client.lost_reason is None else None)
        responses = yield client.ask(lock(["k"], id=1), ping(id=2), unlock(["k"], id=3))
        self.assertEqual([outcome(r) for r in responses], [("Ok", 1, []), ("Ok", 2, []), ("Ok", 3, [])])
        yield client.disconnect()
        yield process.wait_for(rb"DlockProtocol#info\] [^\n]* disconnected\n")
        yield self.terminate(process)
        self.assertEqual(len(process.log_lines(rb"DlockProtocol#info\] .* connected$")), 1, process.text())
