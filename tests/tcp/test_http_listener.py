"""
Tests for the HTTP API's listener (L{jesync.http.listener}) over real
HTTP, in the real server (C{twistd jesync}'s service started in this
process with C{--http-port}): its connections counted with every
listener's, protected mode, the auth deadline, the body cap, and HTTP
sessions that are elock's.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks

from tests.http_client import HttpClient, base_url, start_http
from tests.server_case import ServerTestCase


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
