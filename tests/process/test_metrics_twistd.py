"""
The metrics endpoint of a real C{twistd jesync} process: C{/metrics} needs
the C{--auth-token-file} token, taken again on SIGHUP (twistd's signal
handler: a process of its own), the old one for its grace, and neither is
logged.  The other token rules, on twistd's server in a thread, are
L{tests.tcp.test_metrics.MetricsTokenTests}.  Skipped without
C{prometheus_client} (C{pip install '.[metrics]'}).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from tests.metrics_server import MetricsTokenServer
from tests.servers import start_server
from tests.support import skip_without_prometheus


class TwistdMetricsTokenTests(MetricsTokenServer, SynchronousTestCase):
    """A real twistd server: /metrics needs the --auth-token-file token unless --metrics-public; /health never."""

    skip = skip_without_prometheus
    serve = staticmethod(start_server)

    def test_token_needed_and_rotated_on_sighup(self) -> None:
        import signal
        import time

        base, path = self.start()
        self.assertEqual(self.get(base + "/metrics")[0], 401)
        self.assertEqual(self.get(base + "/metrics", b"wrong")[0], 401)
        code, body = self.get(base + "/metrics", b"first-t0ken-8c1f")
        self.assertEqual(code, 200)
        self.assertIn(b"\njesync_connections ", body)
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))
        with open(path, "wb") as file:
            file.write(b"second-t0ken-2b7e\n")
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while self.get(base + "/metrics", b"second-t0ken-2b7e")[0] != 200:
            self.assertLess(time.monotonic(), deadline, "the new token was not taken")
            time.sleep(0.05)
        self.assertEqual(self.get(base + "/metrics", b"first-t0ken-8c1f")[0], 200)  # (within --auth-token-grace, 300 s)
        self.assertEqual(self.get(base + "/metrics")[0], 401)
        for token in ("first-t0ken-8c1f", "second-t0ken-2b7e"):
            self.assertNotIn(token, self.server.log())
