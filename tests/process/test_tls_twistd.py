"""
JESync over TLS served by a C{twistd jesync} subprocess: C{--port ssl:...}
with a throwaway self-signed certificate (L{tests.tcp.test_tls}'s), a client
that trusts it served and closed on stop, the summary naming where it
listens and never the key's or the certificate's file, and no
DeprecationWarning logged.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ConnectionDone

from tests.tls_certificates import connect_tls, make_certificate, skip_without_tls, ssl_port
from tests.twistd_process import TwistdTestCase


class TwistdTLSTests(TwistdTestCase):
    skip = skip_without_tls

    @inlineCallbacks
    def test_ssl_port(self):
        key_path, certificate_path, pem = make_certificate(self)
        port = ssl_port(key_path, certificate_path)
        # As run_server, but showing deprecations (which Python hides outside
        # __main__): twistd logs any warning, and none may be one.
        process = self.spawn("-n", "--pidfile=", "jesync", "--port", port, PYTHONWARNINGS="default::DeprecationWarning")
        match = yield process.wait_for(rb"JESyncFactory \(TLS\) starting on (\d+)\n")
        summary = yield self.summary(process)
        # where it listens, never the key's or the certificate's file
        self.assertTrue(summary.startswith(b"JESync on ssl:0:interface=127.0.0.1;"), summary)
        self.assertIn(b"; TLS 1.2+; auth off", summary)
        client = yield connect_tls(int(match.group(1)), pem)
        self.addCleanup(lambda: client.abort() if client.lost_reason is None else None)
        self.assertEqual((yield client.ask(b"lock k\nstatus k\n", 2)), b"GRANTED 1 0 k 120\nSTATUS 1 0 k\n")
        self.assertEqual((yield client.ask(b"release k\nlock k2\n", 2)), b"RELEASED 0 0 k\nGRANTED 1 0 k2 120\n")
        yield self.terminate(process)
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        self.assertIn(
            "jesync stopped: closed 1 connections, released 1 grants and 0 waits on 1 keys "
            "(0 grants left, held by embedders)",
            process.text(),
        )
        self.assertNotIn(key_path.encode(), process.output)
        self.assertNotIn(certificate_path.encode(), process.output)
        self.assertEqual([line for line in process.output.splitlines() if b"DeprecationWarning" in line], [])
