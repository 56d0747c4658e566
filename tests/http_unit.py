"""
The HTTP API in the unit tier: an L{HttpApi} over a real lock table,
session table and group table on a L{Clock} (L{UnitApi}), and requests sent
through twisted.web's own channel over a L{StringTransport}
(L{HttpConnection}), so that a test sees the bytes a client would: the
status line, the headers, a JSON body or a Server-Sent Events stream as far
as it has been written (chunked, decoded here).  A client that stops
reading is the channel paused (as a full transport pauses it); a client
gone is the channel's C{connectionLost}.  Every response a test reads
with L{HttpConnection.ask}, and every stream it reads with
L{HttpConnection.checked}, is checked against the API's OpenAPI document
(C{tests.openapi_check}).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.server import Site

from jesync.connections.policy import ConnectionPolicy
from jesync.groups import GroupTable
from jesync.http.api import ApiContext, HttpApi, Route
from jesync.service import LockService
from jesync.sessions import SessionTable, new_session_id
from tests.openapi_check import check_response

PEER = IPv4Address("TCP", "127.0.0.1", 40000)



def parse_events(text: str) -> List[Tuple[str, Any]]:
    """
    The complete events of an event stream's C{text}, in order: C{(name,
    data)} (data parsed as JSON); a C{: ping} comment is C{("ping", None)}.
    """
    events: List[Tuple[str, Any]] = []
    for block in text.split("\n\n")[:-1]:
        name, data = "message", None
        for line in block.split("\n"):
            if line == ": ping":
                name = "ping"
            elif line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
        events.append((name, data))
    return events

class Response:
    """What the server wrote for one request, as far as it has: C{status}, C{headers} (lower-case), C{body}."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes, complete: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.complete = complete

    def json(self) -> Any:
        assert self.complete, "the response is not complete"
        return json.loads(self.body)

    def events(self) -> List[Tuple[str, Any]]:
        """The stream's complete events, in order (L{parse_events})."""
        return parse_events(self.body.decode("utf-8"))


def parse_response(raw: bytes) -> Optional[Response]:
    """The response at the start of C{raw} (None until its head is complete); a chunked body decoded so far."""
    head, separator, rest = raw.partition(b"\r\n\r\n")
    if not separator:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        length = int(headers["content-length"])
        return Response(status, headers, rest[:length], len(rest) >= length)
    if headers.get("transfer-encoding") != "chunked":
        return Response(status, headers, rest, False)
    body = b""
    while True:
        size_line, separator, after = rest.partition(b"\r\n")
        if not separator:
            return Response(status, headers, body, False)
        size = int(size_line, 16)
        if size == 0:
            return Response(status, headers, body, True)
        if len(after) < size + 2:
            return Response(status, headers, body, False)
        body += after[:size]
        rest = after[size + 2 :]


class HttpConnection:
    """One client connection to a L{UnitApi}'s site, one request at a time."""

    def __init__(self, site: Site) -> None:
        self.transport = StringTransport(peerAddress=PEER)
        self.channel = site.buildProtocol(PEER)
        self.channel.makeConnection(self.transport)
        self.sent: Tuple[str, str, bytes] = ("GET", "/", b"")

    def send(self, method: str, path: str, body: Any = None, token: Optional[str] = None) -> None:
        payload = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.sent = (method, path, payload)
        head = [f"{method} {path} HTTP/1.1", "Host: jesync", f"Content-Length: {len(payload)}"]
        if token is not None:
            head.append(f"Authorization: Bearer {token}")
        self.channel.dataReceived(("\r\n".join(head) + "\r\n\r\n").encode() + payload)

    def response(self) -> Optional[Response]:
        """The response to the request sent, as far as it has been written (None: nothing yet)."""
        return parse_response(self.transport.value())

    def ask(self, method: str, path: str, body: Any = None, token: Optional[str] = None) -> Response:
        """Send a request; its complete response (it must have been answered at once)."""
        self.transport.clear()
        self.send(method, path, body, token)
        response = self.response()
        assert response is not None and response.complete, f"no complete response: {self.transport.value()!r}"
        return self.checked(response)

    def checked(self, response: Optional[Response] = None) -> Response:
        """The response (as far as it has been written), checked against the OpenAPI document."""
        response = response or self.response()
        assert response is not None
        method, path, payload = self.sent
        check_response(method, path, response.status, response.headers, response.body, payload or None)
        return response

    def pause(self) -> None:
        """The client stops reading: the transport's buffer is full, and it pauses its producer (the channel)."""
        self.transport.producer.pauseProducing()

    def resume(self) -> None:
        """The client read it all: the transport resumes its producer."""
        self.transport.producer.resumeProducing()

    def lose(self) -> None:
        """The client went away."""
        self.channel.connectionLost(Failure(ConnectionDone()))

    @property
    def aborted(self) -> bool:
        return bool(self.transport.disconnected)


class UnitApi:
    """The HTTP API with C{routes}, over a lock table on a L{Clock} (the module's rules)."""

    def __init__(
        self,
        routes: Sequence[Route],
        max_unsent: int = 4 * 1024 * 1024,
        max_watches: Optional[int] = None,
        max_total_watches: Optional[int] = None,
        auth_token: Optional[bytes] = None,
        max_wait: float = 60.0,
    ) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.locks = LockService(self.clock, max_watches=max_watches, max_total_watches=max_total_watches)
        self.sessions = SessionTable(self.clock, self.locks)
        self.groups = GroupTable(self.locks)
        self.policy = ConnectionPolicy(max_unsent=max_unsent, auth_token=auth_token)
        self.context = ApiContext(
            self.locks,
            self.sessions,
            self.groups,
            self.policy,
            self.clock,
            max_wait=max_wait,
            describe=self.describe,
        )
        self.api = HttpApi(self.context, routes)
        self.site = Site(self.api, timeout=None, reactor=self.clock)

    def describe(self) -> Dict[str, Any]:
        """The server's own part of the status document (the real server's is jesync.server's)."""
        return {
            "server": {
                "version": "test",
                "role": "standalone",
                "term": None,
                "uptime": self.clock.seconds() - 1000,
                "listeners": ["tcp:8080"],
            },
            "limits": {"max_connections": None, "http_max_wait": self.context.max_wait},
        }

    def connect(self) -> HttpConnection:
        return HttpConnection(self.site)

    def ask(self, method: str, path: str, body: Any = None, token: Optional[str] = None) -> Response:
        return self.connect().ask(method, path, body, token)

    def session(self, ttl: float = 30.0) -> str:
        """A new HTTP session's id (detached, its TTL running)."""
        opened = getattr(self.sessions, "open", None)
        if opened is not None:
            return str(opened(int(ttl * 1000), "127.0.0.1:40000").id)
        return str(self.sessions.restore(new_session_id(), int(ttl * 1000)).id)
