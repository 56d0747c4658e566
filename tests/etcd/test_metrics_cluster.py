"""
A cluster member's C{/metrics} (a C{twistd jesync} on a real etcd) needs the
token too, as a standby and as the leader.  Skipped without
C{prometheus_client} (C{pip install '.[metrics]'}).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from tests.support import TIMEOUT, skip_without_prometheus


class ClusterMetricsTokenTests(SynchronousTestCase):
    """A cluster member's /metrics needs the token too, as a standby (the token it started with) and as the leader."""

    skip = skip_without_prometheus

    def test_standby_and_leader(self) -> None:
        import os
        import tempfile
        import time
        import urllib.error
        import urllib.request

        from tests.cluster import MemberProcess
        from tests.etcd_server import start_etcd
        from tests.servers import free_port

        etcd = start_etcd(self)
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "token")
        with open(path, "wb") as file:
            file.write(b"cluster-t0ken-5d2a\n")
        self.addCleanup(os.rmdir, directory)
        self.addCleanup(os.unlink, path)
        member = MemberProcess([etcd.endpoint], f"test-{free_port()}", extra_args=["--auth-token-file", path])
        self.addCleanup(member.close)
        member.start()  # (ready once /health answers: a standby, or the leader already)

        def scrape(token: bytes | None) -> tuple[int, bytes]:
            request = urllib.request.Request(f"http://127.0.0.1:{member.metrics_port}/metrics")
            if token is not None:
                request.add_header("Authorization", "Bearer " + token.decode())
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        self.assertEqual(scrape(None)[0], 401)
        self.assertEqual(scrape(b"cluster-t0ken-5d2a")[0], 200)
        deadline = time.monotonic() + 20
        while member.health() != "leader":
            self.assertLess(time.monotonic(), deadline, member.log())
            time.sleep(0.05)
        self.assertEqual(scrape(None)[0], 401)
        self.assertEqual(scrape(b"wrong")[0], 401)
        code, body = scrape(b"cluster-t0ken-5d2a")
        self.assertEqual(code, 200)
        self.assertIn(b"\njesync_cluster_leader 1.0\n", body)
