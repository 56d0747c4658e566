"""
The HTTP API as the tests call it: JSON requests over real HTTP with treq
(L{HttpClient}), each response read whole and checked against the API's
OpenAPI document (C{tests.openapi_check}), so that every test that calls
the API proves the document too.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from jesync.http.listener import ApiSite
from tests.server_case import Server, listening_port
from tests.support import LOCAL

try:
    import treq
except ImportError:  # pragma: no cover - the test extra has it
    treq = None

from tests.openapi_check import check_response

# How long one HTTP request may take before the test fails.
TIMEOUT = 5.0


@inlineCallbacks
def start_http(test, *argv: str, elock: bool = True, http_port: str = LOCAL):
    """
    The real server (L{Server}: C{twistd jesync}'s service in this process)
    with one C{--http-port}: fires with the server and the HTTP port's
    listening port.
    """
    server = yield Server.start(test, "--http-port", http_port, *argv, elock=elock)
    port = yield listening_port(http_listener(server.service))
    return server, port


def http_listener(service: Any) -> Any:
    """The one C{--http-port} listener of a lock server."""
    (child,) = [child for child in service.listeners() if isinstance(getattr(child.factory, "wrappedFactory", None), ApiSite)]
    return child


def base_url(port: Any, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{port.getHost().port}"


class Response:
    """A response read whole: C{status}, C{headers} (Twisted's), C{body} (bytes) and C{json} (the parsed body, or None)."""

    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        try:
            self.json: Any = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def header(self, name: str) -> Optional[str]:
        values = self.headers.getRawHeaders(name)
        return values[0] if values else None

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.body[:200]!r}>"


@implementer(IPolicyForHTTPS)
class _TrustOnly:
    """HTTPS that trusts one certificate (L{tests.tls_certificates.client_options})."""

    def __init__(self, pem: bytes) -> None:
        self.pem = pem

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        from tests.tls_certificates import client_options

        return client_options(self.pem)


class HttpClient:
    """
    Calls to the API at C{base} (C{http://127.0.0.1:<port>}); C{token}: sent
    as C{Authorization: Bearer}.  Its connections are its own (kept alive
    between calls) and closed when C{test} ends.
    """

    def __init__(
        self, test: Any, base: str, token: Optional[str] = None, persistent: bool = True, trust: Optional[bytes] = None
    ) -> None:
        self.base = base
        self.token = token
        self.pool = HTTPConnectionPool(reactor, persistent=persistent)
        test.addCleanup(self.pool.closeCachedConnections)
        self.options: Dict[str, Any] = {"pool": self.pool}
        if trust is not None:
            # (https: a server presenting the certificate C{trust}, PEM, alone)
            self.options = {"agent": Agent(reactor, contextFactory=_TrustOnly(trust), pool=self.pool)}

    @inlineCallbacks
    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: Any = Ellipsis,
        headers: Optional[Dict[str, str]] = None,
        data: Optional[bytes] = None,
        timeout: float = TIMEOUT,
    ):
        """C{method path} with C{body} as JSON (or raw C{data}); fires with its L{Response}."""
        sent = dict(headers or {})
        token = self.token if token is Ellipsis else token
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            sent.setdefault("Content-Type", "application/json")
        requested = treq.request(
            method, self.base + path, data=data, headers=sent, timeout=timeout, **self.options
        )
        response = yield requested
        content = yield treq.content(response)
        read = Response(response.code, response.headers, content)
        headers_read = {name.decode("latin-1"): values for name, values in response.headers.getAllRawHeaders()}
        check_response(method, path, read.status, headers_read, content, data if isinstance(data, bytes) else None)
        return read

    def get(self, path: str, **options: Any):
        return self.call("GET", path, **options)

    def post(self, path: str, body: Any = None, **options: Any):
        return self.call("POST", path, {} if body is None else body, **options)
