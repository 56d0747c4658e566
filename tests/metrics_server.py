"""
The real server with a metrics listener that wants a bearer token, started by
the test's C{serve} (a thread of this process, or a C{twistd} process), and
a GET of its pages (L{MetricsTokenServer}): for
L{tests.tcp.test_metrics.MetricsTokenTests} and
L{tests.process.test_metrics_twistd}.
"""

from __future__ import annotations

from tests.support import TIMEOUT


class MetricsTokenServer:
    """Mixed into a test case with a C{serve} (L{tests.servers.serve_in_thread} or L{tests.servers.start_server})."""

    def start(self, *extra: str) -> tuple[str, str]:
        """
        A server with a token file (holding first-t0ken-8c1f) and these
        options: (its metrics URL base, the token file's path).
        """
        import os
        import tempfile

        from tests.servers import free_port

        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "token")
        with open(path, "wb") as file:
            file.write(b"first-t0ken-8c1f\n")
        self.addCleanup(os.rmdir, directory)
        self.addCleanup(os.unlink, path)
        port = free_port()
        self.server = self.serve(
            self,
            extra_args=["--auth-token-file", path, "--metrics", f"tcp:{port}:interface=127.0.0.1", *extra],
            auth_token=b"first-t0ken-8c1f",
        )
        return f"http://127.0.0.1:{port}", path

    def get(self, url: str, token: bytes | None = None) -> tuple[int, bytes]:
        """GET C{url} (with the bearer C{token}): (status, body); waits for the metrics listener if need be."""
        import time
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url)
        if token is not None:
            request.add_header("Authorization", "Bearer " + token.decode())
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()
            except urllib.error.URLError:
                # (the metrics listener may start a moment after the lock port answers)
                self.assertLess(time.monotonic(), deadline, f"{url} did not answer")
                time.sleep(0.05)
