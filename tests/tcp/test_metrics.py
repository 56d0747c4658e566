"""
Tests for L{jesync.metrics}'s web resource over real HTTP, on the loopback
interface: what C{/metrics} and C{/health} serve, and the bearer token that
C{/metrics} may need, on its own and in the real server (twistd's, in a
thread: a client without the token closed after --auth-timeout, a
keep-alive health check with a FIN, --metrics-public).  The counters, gauges and histogram themselves, with
no socket, are L{tests.unit.test_metrics}.

The lock service runs on a L{Clock}.  Skipped without C{prometheus_client}
(C{pip install '.[metrics]'}).
"""

from __future__ import annotations

import warnings
from unittest import mock

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.server import Site

from jesync.service import LockService
from tests.metrics_server import MetricsTokenServer
from tests.servers import serve_in_thread
from tests.support import skip_without_prometheus

try:
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.parser import text_string_to_metric_families

    from jesync.metrics import LockMetrics, metrics_resource
except ImportError:
    pass  # (the tests that need them are skipped: skip_without_prometheus)

# How long any one HTTP request may take before the test fails.
TIMEOUT = 5.0


@inlineCallbacks
def served_over_http(test, resource):
    """
    C{resource} served over real HTTP on 127.0.0.1 until C{test} ends: a
    function that GETs a path (with C{headers}), firing with the response
    and its body.
    """
    site = Site(resource)
    site.noisy = False
    port = yield serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(site)
    test.addCleanup(port.stopListening)
    base = f"http://127.0.0.1:{port.getHost().port}".encode("ascii")
    pool = HTTPConnectionPool(reactor, persistent=False)
    test.addCleanup(pool.closeCachedConnections)
    agent = Agent(reactor, connectTimeout=TIMEOUT, pool=pool)

    @inlineCallbacks
    def get(path: bytes, headers=None):
        request = agent.request(b"GET", base + path, headers)
        request.addTimeout(TIMEOUT, reactor)
        response = yield request
        with warnings.catch_warnings():
            # Agent's response transport has no abortConnection (twisted#8227).
            warnings.filterwarnings("ignore", "Using readBody", DeprecationWarning)
            body = readBody(response)
        body.addTimeout(TIMEOUT, reactor)
        return response, (yield body)

    return get


class HTTPTests(TestCase):
    """The metrics resource over real HTTP on 127.0.0.1."""

    skip = skip_without_prometheus
    timeout = 10

    @inlineCallbacks
    def setUp(self):
        self.service = LockService(Clock())
        self.connections: list[object] = []
        self.metrics = LockMetrics(self.service, self.connections)
        self.service.observer = self.metrics
        self.serving = True
        self.fetch = yield served_over_http(self, metrics_resource(self.metrics, lambda: self.serving))

    @inlineCallbacks
    def get(self, path: bytes):
        """GET C{path}: (status code, content type, body)."""
        response, body = yield self.fetch(path)
        content_type = response.headers.getRawHeaders(b"content-type", [b""])[0]
        return response.code, content_type.decode("ascii"), body

    @inlineCallbacks
    def test_metrics(self):
        self.connections.extend([object()] * 3)
        self.successResultOf(self.service.acquire("a", "alice"))
        self.service.acquire("a", "bob")
        code, content_type, body = yield self.get(b"/metrics")
        self.assertEqual((code, content_type), (200, CONTENT_TYPE_LATEST))
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(body.decode("utf-8"))
            for sample in family.samples
            if not sample.labels
        }
        expected = {
            "jesync_grants_total": 1,
            "jesync_timeouts_total": 0,
            "jesync_expiries_total": 0,
            "jesync_releases_total": 0,
            "jesync_wait_seconds_count": 1,
            "jesync_wait_seconds_sum": 0,
            "jesync_connections": 3,
            "jesync_keys": 1,
            "jesync_holders": 1,
            "jesync_waiters": 1,
        }
        self.assertEqual({name: samples.get(name) for name in expected}, expected)
        self.assertIn(b"# TYPE jesync_wait_seconds histogram\n", body)

    @inlineCallbacks
    def test_health(self):
        self.assertEqual((yield self.get(b"/health")), (200, "text/plain; charset=utf-8", b"OK\n"))
        self.serving = False
        self.assertEqual(
            (yield self.get(b"/health")), (503, "text/plain; charset=utf-8", b"stopping\n")
        )

    @inlineCallbacks
    def test_anything_else_is_not_found(self):
        for path in (b"/nope", b"/", b"/metrics/nope", b"/health/"):
            code, _, _ = yield self.get(path)
            self.assertEqual(code, 404, path)


class BearerTokenTests(TestCase):
    """
    With a token, /metrics answers only a request that carries it as a
    bearer token (the connection policy's check: the previous token during
    its grace too); /health stays open.  Over real HTTP on 127.0.0.1.
    """

    skip = skip_without_prometheus
    timeout = 10

    @inlineCallbacks
    def setUp(self):
        from jesync.connections.policy import ConnectionPolicy

        self.clock = Clock()
        self.policy = ConnectionPolicy(auth_token=b"s3cret")
        self.service = LockService(self.clock)
        self.metrics = LockMetrics(self.service, [])
        self.service.observer = self.metrics
        self.fetch = yield served_over_http(
            self, metrics_resource(self.metrics, accepts=lambda token: self.policy.accepts(token, self.clock.seconds()))
        )

    @inlineCallbacks
    def get(self, path: bytes, authorization: bytes | None = None):
        """GET C{path}: (status code, its WWW-Authenticate header or None, body)."""
        from twisted.web.http_headers import Headers

        headers = Headers({b"Authorization": [authorization]} if authorization is not None else {})
        response, body = yield self.fetch(path, headers)
        challenge = response.headers.getRawHeaders(b"www-authenticate", [None])[0]
        return response.code, challenge, body

    @inlineCallbacks
    def assertRefused(self, authorization: bytes | None, challenge: bytes):
        code, sent_challenge, body = yield self.get(b"/metrics", authorization)
        self.assertEqual((code, sent_challenge), (401, challenge), authorization)
        self.assertNotIn(b"jesync_", body)
        self.assertNotIn(b"s3cret", body)

    @inlineCallbacks
    def assertServed(self, authorization: bytes | None):
        code, _, body = yield self.get(b"/metrics", authorization)
        self.assertEqual(code, 200, authorization)
        self.assertIn(b"\njesync_holders 0.0\n", body)

    @inlineCallbacks
    def test_only_the_token_reads_the_metrics(self):
        yield self.assertRefused(None, b'Bearer realm="jesync"')
        yield self.assertRefused(b"Basic czNjcmV0", b'Bearer realm="jesync"')  # (not a bearer token)
        yield self.assertRefused(b"Bearer", b'Bearer realm="jesync"')
        for wrong in (b"Bearer s3cre", b"Bearer s3cret2", b"Bearer S3CRET"):
            yield self.assertRefused(wrong, b'Bearer realm="jesync", error="invalid_token"')
        for right in (b"Bearer s3cret", b"bearer s3cret", b"BEARER  s3cret "):
            yield self.assertServed(right)

    @inlineCallbacks
    def test_health_stays_open(self):
        self.assertEqual((yield self.get(b"/health")), (200, None, b"OK\n"))

    @inlineCallbacks
    def test_rotation_and_its_grace(self):
        """A token rotated out (SIGHUP) reads the metrics for the grace period, and not after."""
        self.assertTrue(self.policy.rotate(b"n3w", self.clock.seconds(), grace=300))
        yield self.assertServed(b"Bearer n3w")
        yield self.assertServed(b"Bearer s3cret")
        self.clock.advance(300)
        yield self.assertServed(b"Bearer n3w")
        yield self.assertRefused(b"Bearer s3cret", b'Bearer realm="jesync", error="invalid_token"')

    def test_the_token_is_compared_in_constant_time(self):
        """The check is the policy's, hmac.compare_digest: no early exit on the first wrong byte."""
        import hmac

        with mock.patch.object(hmac, "compare_digest", wraps=hmac.compare_digest) as compare:
            self.assertFalse(self.policy.accepts(b"s3crex", self.clock.seconds()))
        compare.assert_called_once_with(b"s3crex", b"s3cret")


class MetricsTokenTests(MetricsTokenServer, SynchronousTestCase):
    """
    The real server (C{twistd jesync}'s, built from its options, in a thread
    of this process: L{serve_in_thread}): /metrics needs the
    --auth-token-file token unless --metrics-public; /health never.
    """

    skip = skip_without_prometheus
    serve = staticmethod(serve_in_thread)

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
