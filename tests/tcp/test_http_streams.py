"""
The HTTP API's event streams and status (L{jesync.http.streams},
L{jesync.http.status}) over real HTTP, read as they arrive with treq, in
the real server (C{twistd jesync}'s service in this process with
C{--http-port}): a key watched while a JESync client locks and unlocks it;
a client that goes, a limit, the server stopping; the status document and
its stream; the page and the OpenAPI document without a token.
"""

from __future__ import annotations

import json
from importlib import resources
from socket import SO_RCVBUF, SOL_SOCKET

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol

from tests.http_client import HttpClient, base_url, start_http
from tests.http_events import open_stream
from tests.server_case import ServerTestCase
from tests.support import TIMEOUT, capture_log, wait_until, write_file


class Unread(Protocol):
    """A client that sends a request and reads nothing: C{lost} fires when the server closes its connection."""

    def __init__(self) -> None:
        self.lost: Deferred = Deferred()

    def connectionLost(self, reason=None) -> None:
        self.lost.callback(None)


class StreamCase(ServerTestCase):
    @inlineCallbacks
    def serve(self, *argv: str, token=None):
        self.server, self.port = yield start_http(self, *argv)
        self.http = HttpClient(self, base_url(self.port), token=token)
        return self.server


class WatchTests(StreamCase):
    @inlineCallbacks
    def test_jesync_client_seen(self):
        """A key watched over HTTP while a JESync client locks and unlocks it: snapshot, granted, released, in order."""
        yield self.serve()
        jesync = yield self.server.jesync()
        yield jesync.ask(b"lock-shared k 0 0\n")
        stream = yield open_stream(self.http, "/v1/watch?key=k")
        self.assertEqual(
            (stream.status, stream.header("content-type"), stream.header("cache-control")),
            (200, "text/event-stream", "no-cache"),
        )
        yield stream.wait_for(1)
        [(name, snapshot)] = stream.events
        self.assertEqual((name, [holder["mode"] for holder in snapshot["holders"]]), ("snapshot", ["shared"]))
        yield jesync.ask(b"release k\n")
        yield jesync.ask(b"lock k 1 0 30\n")
        yield jesync.ask(b"release k\n")
        yield stream.wait_for(4)
        self.assertEqual(stream.names(), ["snapshot", "released", "granted", "released"])
        granted = stream.events[2][1]["holder"]
        self.assertEqual((granted["key"], granted["mode"]), ("k", "exclusive"))
        self.assertTrue(0 < granted["expires_in"] <= 30)
        self.assertEqual(granted["peer"], stream.events[1][1]["holder"]["peer"])
        stream.check()

    @inlineCallbacks
    def test_client_gone(self):
        """A watcher whose client goes: its watch is withdrawn."""
        yield self.serve()
        stream = yield open_stream(self.http, "/v1/watch?prefix=job/")
        yield wait_until(lambda: self.server.locks.watch_count == 1)
        stream.close()
        yield wait_until(lambda: self.server.locks.watch_count == 0)

    @inlineCallbacks
    def test_total_watches(self):
        """Past --max-total-watches: 503 limit_reached, before any stream."""
        yield self.serve("--max-total-watches", "1")
        first = yield open_stream(self.http, "/v1/watch?key=a")
        refused = yield self.http.get("/v1/watch?key=b")
        self.assertEqual((refused.status, refused.json["limit"]), (503, "max-total-watches"))
        first.close()

    @inlineCallbacks
    def test_slow_reader_dropped(self):
        """A watcher that reads nothing is dropped once --max-unsent bytes of events wait for it past its buffers."""
        yield self.serve("--max-unsent", "65536")
        log = capture_log(self)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port, timeout=int(TIMEOUT))
        unread = yield connectProtocol(endpoint, Unread())
        unread.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 8192)
        unread.transport.pauseProducing()
        unread.transport.write(b"GET /v1/watch?prefix=big/ HTTP/1.1\r\nHost: jesync\r\n\r\n")
        yield wait_until(lambda: self.server.locks.watch_count == 1)
        jesync = yield self.server.jesync()
        value = b"v" * 4000
        rounds = 0
        while self.server.locks.watch_count and rounds < 400:
            # (each round: four events to the watcher, two of them 4 KB; the buffers between take a few MB)
            rounds += 1
            jesync.send(b"".join(b"lock big/%d 1 0 0 %s\nrelease big/%d\n" % (i, value, i) for i in range(10)))
            yield jesync.read_lines(20)
        self.assertEqual(self.server.locks.watch_count, 0)
        unread.transport.resumeProducing()  # (a client that does not read does not see its connection go either)
        yield unread.lost.addTimeout(TIMEOUT, reactor)
        self.assertTrue([line for line in log if "dropped an event stream" in line and "65536" in line], log)

    @inlineCallbacks
    def test_server_stopping(self):
        """The server stopping ends a stream with an 'end' event saying why."""
        yield self.serve()
        stream = yield open_stream(self.http, "/v1/watch?key=k")
        yield stream.wait_for(1)
        yield self.server.service.stopService()
        yield stream.done
        self.assertEqual(stream.names()[-1], "end")
        self.assertIn("stopping", stream.events[-1][1]["reason"])


class StatusTests(StreamCase):
    @inlineCallbacks
    def test_document(self):
        """GET /v1/status: the server, its limits, the table's totals, sessions, connections, the top."""
        yield self.serve("--max-keys", "5000")
        jesync = yield self.server.jesync()
        yield jesync.ask(b"lock busy\n")
        jesync.send(b"lock busy 1 -1\n")
        waiter = yield self.server.jesync()
        waiter.send(b"lock busy 1 -1\n")
        yield wait_until(lambda: self.server.locks.status("busy").waiting == 1)
        yield self.http.post("/v1/sessions", {"ttl": 10})
        document = (yield self.http.get("/v1/status")).json
        self.assertEqual((document["server"]["role"], document["server"]["term"]), ("standalone", None))
        self.assertGreaterEqual(document["server"]["uptime"], 0)
        self.assertIsInstance(document["server"]["version"], str)
        self.assertEqual(document["limits"]["max_keys"], 5000)
        self.assertEqual(document["totals"], {"keys": 1, "holders": 1, "waiters": 1})
        self.assertEqual(document["sessions"], {"total": 1, "detached": 1})
        self.assertGreaterEqual(document["connections"], 3)
        self.assertEqual(document["top"], [{"key": "busy", "mode": "exclusive", "holders": 1, "waiters": 1}])

    @inlineCallbacks
    def test_stream(self):
        """The status stream: the document at once, then a new one when the table changes."""
        yield self.serve()
        stream = yield open_stream(self.http, "/v1/status/stream")
        yield stream.wait_for(1)
        self.assertEqual(stream.events[0][1]["totals"]["holders"], 0)
        jesync = yield self.server.jesync()
        yield jesync.ask(b"lock k\n")
        yield stream.wait_for(2)
        self.assertEqual(stream.events[1][0], "status")
        self.assertEqual(stream.events[1][1]["totals"]["holders"], 1)
        stream.check()
        stream.close()

    @inlineCallbacks
    def test_files_without_a_token(self):
        """With a token: GET / (text/html) and /v1/openapi.json are served without it; /v1/status needs it."""
        path = write_file(self, b"sesame\n")
        yield self.serve("--auth-token-file", path)
        page = yield self.http.get("/")
        self.assertEqual((page.status, page.header("content-type")), (200, "text/html; charset=utf-8"))
        self.assertEqual(page.body, resources.files("jesync.http").joinpath("status.html").read_bytes())
        document = yield self.http.get("/v1/openapi.json")
        self.assertEqual((document.status, document.header("content-type")), (200, "application/json"))
        self.assertEqual(document.json, json.loads(resources.files("jesync.http").joinpath("openapi.json").read_bytes()))
        refused = yield self.http.get("/v1/status")
        self.assertEqual((refused.status, refused.json["code"]), (401, "unauthorized"))
        self.assertEqual((yield self.http.get("/v1/status", token="sesame")).status, 200)
