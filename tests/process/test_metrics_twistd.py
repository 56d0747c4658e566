"""
The metrics endpoint of a real C{twistd jesync}: C{/metrics} needs the
C{--auth-token-file} token (taken again on SIGHUP) unless
C{--metrics-public}; C{/health} never does; a client without the token is
closed after C{--auth-timeout}, a keep-alive health check with a FIN.
Skipped without C{prometheus_client} (C{pip install '.[metrics]'}).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from tests.support import TIMEOUT
from tests.tcp.test_metrics import skip_without_prometheus


class TwistdMetricsTokenTests(SynchronousTestCase):
    """A real twistd server: /metrics needs the --auth-token-file token unless --metrics-public; /health never."""

    skip = skip_without_prometheus

    def start(self, *extra: str) -> tuple[str, str]:
        """
        A server with a token file (holding first-t0ken-8c1f) and these
        options: (its metrics URL base, the token file's path).
        """
        import os
        import tempfile

        from tests.servers import free_port, start_server

        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "token")
        with open(path, "wb") as file:
            file.write(b"first-t0ken-8c1f\n")
        self.addCleanup(os.rmdir, directory)
        self.addCleanup(os.unlink, path)
        port = free_port()
        self.server = start_server(
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

    def test_a_client_without_the_token_is_closed_after_the_auth_timeout(self) -> None:
        """
        One that trickles a request (a byte every 0.2 s, never done) holds one
        of the endpoint's 16 connections for --auth-timeout only; one that
        scraped with the token keeps its keep-alive connection past it.
        """
        import socket
        import time

        base, _ = self.start("--auth-timeout", "1")
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))  # (the listener is up)
        port = int(base.rsplit(":", 1)[1])
        request = b"GET /metrics HTTP/1.1\r\nHost: jesync\r\nAuthorization: Bearer first-t0ken-8c1f\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as scraper, socket.create_connection(
            ("127.0.0.1", port), timeout=TIMEOUT
        ) as trickler:
            scraper.sendall(request)
            self.assertTrue(self.response(scraper).startswith(b"HTTP/1.1 200 "))
            opened = time.monotonic()
            closed_after = None
            trickle = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100
            for byte in trickle:
                try:
                    trickler.sendall(bytes([byte]))
                    trickler.settimeout(0.2)
                    if trickler.recv(100) == b"":
                        closed_after = time.monotonic() - opened
                        break
                except socket.timeout:
                    continue
                except OSError:  # (aborted: a reset)
                    closed_after = time.monotonic() - opened
                    break
            self.assertIsNotNone(closed_after, "the trickling client was never closed")
            assert closed_after is not None
            self.assertGreaterEqual(closed_after, 0.8)
            self.assertLess(closed_after, 5)
            scraper.sendall(request)  # (past the deadline: still open, and answered)
            received = self.response(scraper)
            self.assertTrue(received.startswith(b"HTTP/1.1 200 "), received[:100])

    def test_a_health_check_keep_alive_connection_is_closed_cleanly(self) -> None:
        """
        A load balancer's keep-alive connection that only asks /health is
        closed at --auth-timeout with a FIN between its requests, never
        reset; one sending a request never finished is closed too.
        """
        import socket
        import time

        base, _ = self.start("--auth-timeout", "1")
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))  # (the listener is up)
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as checker:
            opened = time.monotonic()
            checker.sendall(b"GET /health HTTP/1.1\r\nHost: jesync\r\n\r\n")
            received = self.response(checker)
            self.assertTrue(received.startswith(b"HTTP/1.1 200 "), received[:100])
            self.assertTrue(received.endswith(b"OK\n"))
            checker.settimeout(TIMEOUT)
            self.assertEqual(checker.recv(100), b"")  # (a FIN: a reset raises ConnectionResetError)
            self.assertGreaterEqual(time.monotonic() - opened, 0.8)
            # (the server closed it: a request now finds it closed, not answered)
            try:
                checker.sendall(b"GET /health HTTP/1.1\r\nHost: jesync\r\n\r\n")
                self.assertEqual(checker.recv(100), b"")
            except (BrokenPipeError, ConnectionResetError):
                pass

    def response(self, sock: object) -> bytes:
        """One whole HTTP response (headers and its Content-Length of body) read from C{sock}."""
        import re
        import socket

        assert isinstance(sock, socket.socket)
        sock.settimeout(TIMEOUT)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, "the connection was closed")
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        length = re.search(rb"\r\nContent-Length: (\d+)", head)
        assert length is not None, head
        while len(body) < int(length.group(1)):
            chunk = sock.recv(65536)
            self.assertTrue(chunk, "the connection was closed")
            body += chunk
        return received

    def test_metrics_public(self) -> None:
        base, _ = self.start("--metrics-public")
        code, body = self.get(base + "/metrics")
        self.assertEqual(code, 200)
        self.assertIn(b"\njesync_connections ", body)
        self.assertEqual(self.get(base + "/health"), (200, b"OK\n"))
