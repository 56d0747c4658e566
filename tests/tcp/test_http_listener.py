"""
Tests for the HTTP API's listener (L{jesync.http.listener}) over real
HTTP, in the real server (C{twistd jesync}'s service started in this
process with C{--http-port}): sessions opened over HTTP are elock's.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks

from jesync.http.listener import ApiSite
from tests.http_client import HttpClient
from tests.server_case import Server, ServerTestCase, listening_port
from tests.support import LOCAL


@inlineCallbacks
def start_http(test, *argv: str, elock: bool = True):
    """The real server with one C{--http-port}: fires with (the L{Server}, the HTTP port's base URL)."""
    server = yield Server.start(test, "--http-port", LOCAL, *argv, elock=elock)
    (child,) = [child for child in server.service.listeners() if isinstance(getattr(child.factory, "wrappedFactory", None), ApiSite)]
    port = yield listening_port(child)
    return server, f"http://127.0.0.1:{port.getHost().port}"


class SessionTests(ServerTestCase):
    @inlineCallbacks
    def test_session_over_http_is_an_elock_session(self):
        """POST /v1/sessions opens a session in elock's table (its id, its TTL); ending it forgets it."""
        server, base = yield start_http(self)
        client = HttpClient(self, base)
        created = yield client.post("/v1/sessions", {"ttl": 12})
        self.assertEqual(created.status, 201)
        self.assertEqual(created.json["ttl"], 12.0)
        sessions = server.factories["elock"].sessions
        session = sessions.find(created.json["session"])
        self.assertIsNotNone(session)
        self.assertEqual(session.peer, f"127.0.0.1:{session.peer.split(':')[1].split(' ')[0]} (http)")
        ended = yield client.post("/v1/sessions/end", {"session": created.json["session"]})
        self.assertEqual((ended.status, ended.json["released"]), (200, 0))
        self.assertIsNone(sessions.find(created.json["session"]))
