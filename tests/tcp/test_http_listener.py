"""
Tests for the HTTP API's listener (L{jesync.http.listener}) over real
HTTP, in the real server (C{twistd jesync}'s service started in this
process with C{--http-port}): its connections counted with every
listener's, protected mode, the auth deadline, the body cap, and HTTP
sessions that are elock's.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from jesync.lock_server import TokenFile
from tests.http_client import HttpClient, base_url, http_listener, start_http
from tests.server_case import ServerTestCase, listening_port
from tests.support import TIMEOUT, LineClient, capture_log, wait_until, write_file


class SessionTests(ServerTestCase):
    @inlineCallbacks
    def test_session_over_http_is_an_elock_session(self):
        """POST /v1/sessions opens a session in elock's table (its id, its TTL); ending it forgets it."""
        server, port = yield start_http(self)
        client = HttpClient(self, base_url(port))
        created = yield client.post("/v1/sessions", {"ttl": 12})
        self.assertEqual(created.status, 201)
        self.assertEqual(created.json["ttl"], 12.0)
        sessions = server.factories["elock"].sessions
        session = sessions.find(created.json["session"])
        self.assertIsNotNone(session)
        self.assertRegex(session.peer, r"^127\.0\.0\.1:\d+ \(http\)$")
        ended = yield client.post("/v1/sessions/end", {"session": created.json["session"]})
        self.assertEqual((ended.status, ended.json["released"]), (200, 0))
        self.assertIsNone(sessions.find(created.json["session"]))


@inlineCallbacks
def connect_raw(server, port) -> LineClient:
    """A plain TCP client of the HTTP port (closed when the test ends)."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port, timeout=int(TIMEOUT))
    client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
    server.clients.append(client)
    return client


def request(path: bytes, token: bytes = b"") -> bytes:
    authorization = b"Authorization: Bearer " + token + b"\r\n" if token else b""
    return b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + authorization + b"\r\n"


class ConnectionTests(ServerTestCase):
    @inlineCallbacks
    def test_counted_by_max_connections(self):
        """HTTP connections count toward --max-connections with every other; over it, a plain 503."""
        server, port = yield start_http(self, "--max-connections", "1")
        yield server.jesync()
        refused = yield connect_raw(server, port)
        yield refused.wait_closed()
        self.assertTrue(refused.unread().startswith(b"HTTP/1.1 503 Service Unavailable\r\n"))
        self.assertEqual(len(server.policy.connections), 1)

    @inlineCallbacks
    def test_idle_timeout(self):
        """--idle-timeout closes a keep-alive connection idle between requests, never one whose request is answered."""
        server, port = yield start_http(self, "--idle-timeout", "0.3")
        watching = yield connect_raw(server, port)
        self.assertEqual((yield watching.ask(request(b"/v1/watch?key=k"))), b"HTTP/1.1 200 OK\r\n")
        idle = yield connect_raw(server, port)  # (after the stream began: it would close first)
        self.assertEqual((yield idle.ask(request(b"/v1/sessions"))), b"HTTP/1.1 200 OK\r\n")
        yield idle.wait_closed()
        self.assertIsNone(watching.lost_reason)
        self.assertEqual(len(server.policy.connections), 1)

    @inlineCallbacks
    def test_auth_deadline(self):
        """With a token: a connection that sent no request with it is closed after --auth-timeout; one that did stays."""
        path = write_file(self, b"sesame\n")
        server, port = yield start_http(self, "--auth-token-file", path, "--auth-timeout", "0.3")
        authorized = yield connect_raw(server, port)
        silent = yield connect_raw(server, port)
        self.assertEqual((yield authorized.ask(request(b"/v1/sessions", b"sesame"))), b"HTTP/1.1 200 OK\r\n")
        yield silent.wait_closed()
        self.assertIsNone(authorized.lost_reason)
        self.assertEqual(len(server.policy.connections), 1)

    @inlineCallbacks
    def test_token_rotated_out_closes(self):
        """A connection authorized with a token rotated out (SIGHUP's reload) is closed when its grace ends."""
        path = write_file(self, b"old\n")
        server, port = yield start_http(self, "--auth-token-file", path, "--auth-token-grace", "0.2")
        on_old = yield connect_raw(server, port)
        self.assertEqual((yield on_old.ask(request(b"/v1/sessions", b"old"))), b"HTTP/1.1 200 OK\r\n")
        with open(path, "wb") as file:
            file.write(b"new\n")
        (token_file,) = [child for child in server.service if isinstance(child, TokenFile)]
        token_file.reload()
        on_new = yield connect_raw(server, port)
        self.assertEqual((yield on_new.ask(request(b"/v1/sessions", b"new"))), b"HTTP/1.1 200 OK\r\n")
        yield on_old.wait_closed()
        self.assertIsNone(on_new.lost_reason)

    @inlineCallbacks
    def test_quiet_unless_verbose(self):
        """No access log line per request, unless the server is verbose."""
        logged = capture_log(self)
        for verbose in ((), ("--verbose",)):
            server, port = yield start_http(self, *verbose)
            client = HttpClient(self, base_url(port))
            yield client.get("/v1/sessions")
            yield server.service.stopService()
        self.assertEqual(len([line for line in logged if '"GET /v1/sessions HTTP/1.1" 200' in line]), 1, logged)

    @inlineCallbacks
    def test_started_again_serves_again(self):
        """A server stopped (its API closed) and started again serves the API again."""
        server, port = yield start_http(self)
        yield server.service.stopService()
        server.service.startService()
        again = yield listening_port(http_listener(server.service))
        created = yield HttpClient(self, base_url(again)).post("/v1/sessions", {})
        self.assertEqual(created.status, 201)


class SlowReaderTests(ServerTestCase):
    @inlineCallbacks
    def test_pipelined_requests_held_while_not_reading(self):
        """
        One connection sends 40 pipelined GETs of a large group (about 3 MB
        each) and reads nothing: one reply is made, the next request waits
        while the transport is paused (the server's memory stays bounded:
        one reply, not 40); closed, nothing more is made.
        """
        server, port = yield start_http(self, "--max-unsent", "65536")
        site = http_listener(server.service).factory.wrappedFactory
        groups = site.resource.context.groups
        groups.create("big")
        for index in range(750):
            groups.join("big", f"member-{index}", f"owner-{index}", b"c" * 4000, 0)
        made = []
        member_grants = groups.member_grants

        def counted(name):
            made.append(name)
            return member_grants(name)

        groups.member_grants = counted
        channels = []
        build = site.buildProtocol

        def recorded(addr):
            channels.append(build(addr))
            return channels[-1]

        site.buildProtocol = recorded
        client = yield connect_raw(server, port)
        client.transport.pauseProducing()  # (it reads nothing)
        client.send(request(b"/v1/groups/big") * 40)
        yield wait_until(lambda: bool(channels) and channels[0]._held is not None)
        self.assertEqual(made, ["big"])
        yield client.abort()
        yield wait_until(lambda: len(server.policy.connections) == 0)
        self.assertEqual(made, ["big"])
        for index in range(750):
            groups.leave("big", f"member-{index}", f"owner-{index}")
        groups.delete("big")
