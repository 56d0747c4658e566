"""
The HTTP API's Server-Sent Events (L{jesync.http.streams}) on a Clock,
through twisted.web's channel: watches of a key and of a prefix, the
observe stream of an election, the status stream; pings, a reader that
stops reading (kept, then dropped past --max-unsent), the end when the
server stops and when the client goes.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.http import coordination, status, streams
from jesync.http.streams import PING_INTERVAL, STATUS_INTERVAL
from tests.http_unit import UnitApi
from tests.support import capture_log

ROUTES = streams.ROUTES + coordination.ROUTES + status.ROUTES


class WatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)
        self.locks = self.server.locks

    def test_headers_and_snapshot(self) -> None:
        """A key watch answers 200 text/event-stream, not cached nor buffered, and starts with the holders of now."""
        self.locks.request("k", "a", 2, 0, 0, value=b"v")
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?key=k")
        response = watcher.response()
        assert response is not None
        self.assertEqual(response.status, 200)
        self.assertEqual(response.headers["content-type"], "text/event-stream")
        self.assertEqual(response.headers["cache-control"], "no-cache")
        self.assertEqual(response.headers["x-accel-buffering"], "no")
        [(name, data)] = response.events()
        self.assertEqual(name, "snapshot")
        self.assertEqual(data["key"], "k")
        self.assertEqual([(h["key"], h["value"], h["max_concurrent"]) for h in data["holders"]], [("k", "v", 2)])

    def test_events_in_order(self) -> None:
        """Each change of the key's holders is an event named by its kind, its holder as a grant."""
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?key=k")
        first = self.locks.request("k", "a", 1, 0, 0)
        self.locks.request("k", "b", 1, -1, 5)  # waits: no event
        first.release()  # released; b granted
        self.server.clock.advance(5)  # b's grant expires
        third = self.locks.request("k", "c", 1, 0, 0)
        self.locks.release_all("c")  # lost
        events = watcher.response().events()
        self.assertEqual(
            [(name, data["holder"]["token"] if data.get("holder") else None) for name, data in events[1:]],
            [
                ("granted", first.token),
                ("released", first.token),
                ("granted", first.token + 1),
                ("expired", first.token + 1),
                ("granted", third.token),
                ("lost", third.token),
            ],
        )
        self.assertEqual(events[2][1], {"key": "k", "holder": events[1][1]["holder"]})
        watcher.checked()

    def test_prefix(self) -> None:
        """A prefix watch: keys appearing and disappearing too, no snapshot, nothing of other keys."""
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?prefix=job/")
        grant = self.locks.request("job/1", "a", 1, 0, 0)
        self.locks.request("other", "a", 1, 0, 0)
        grant.release()
        events = watcher.response().events()
        self.assertEqual(
            [(name, data["key"], data["holder"] is None) for name, data in events],
            [
                ("appeared", "job/1", True),
                ("granted", "job/1", False),
                ("released", "job/1", False),
                ("disappeared", "job/1", True),
            ],
        )
        watcher.checked()

    def test_bad_requests(self) -> None:
        """Exactly one of key and prefix, a key of the key space: else 400 before any stream."""
        for path, code in [
            ("/v1/watch", "invalid_parameter"),
            ("/v1/watch?key=a&prefix=b", "invalid_parameter"),
            ("/v1/watch?prefix=", "invalid_parameter"),
            ("/v1/watch?key=a%20b", "invalid_key"),
            ("/v1/watch?prefix=a%0Ab", "invalid_key"),
            ("/v1/watch?key=" + "k" * 1025, "invalid_key"),
        ]:
            response = self.server.ask("GET", path)
            self.assertEqual((response.status, response.json()["code"]), (400, code), path)
        self.assertEqual(self.locks.watch_count, 0)

    def test_limit(self) -> None:
        """--max-total-watches answers 503 before the stream starts."""
        server = UnitApi(ROUTES, max_total_watches=1)
        server.connect().send("GET", "/v1/watch?key=k")
        response = server.ask("GET", "/v1/watch?prefix=k")
        self.assertEqual((response.status, response.json()["limit"]), (503, "max-total-watches"))
        self.assertEqual(server.locks.watch_count, 1)

    def test_ping(self) -> None:
        """A ': ping' comment every 15 s on the clock, and none before."""
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?key=k")
        self.server.clock.advance(PING_INTERVAL - 0.1)
        self.assertEqual([name for name, _ in watcher.response().events()], ["snapshot"])
        self.server.clock.advance(0.1)
        self.assertEqual([name for name, _ in watcher.response().events()], ["snapshot", "ping"])
        self.server.clock.advance(PING_INTERVAL)
        self.assertEqual([name for name, _ in watcher.response().events()], ["snapshot", "ping", "ping"])
        self.assertIn(b"\r\n: ping\n\n\r\n", watcher.transport.value())

    def test_client_gone(self) -> None:
        """A client gone: the watch is withdrawn, the pings stop, nothing more is written."""
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?key=k")
        self.assertEqual(self.locks.watch_count, 1)
        watcher.lose()
        self.assertEqual(self.locks.watch_count, 0)
        self.assertEqual(self.server.clock.getDelayedCalls(), [])
        self.assertEqual(self.server.api.in_flight, set())
        written = watcher.transport.value()
        self.locks.request("k", "a", 1, 0, 0)
        self.assertEqual(watcher.transport.value(), written)

    def test_stop(self) -> None:
        """The server stopping ends every stream: a last 'end' event saying why, the response finished, the watch gone."""
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?prefix=job/")
        self.server.api.close("the server is stopping")
        response = watcher.response()
        self.assertTrue(response.complete)
        self.assertEqual(response.events(), [("end", {"reason": "the server is stopping"})])
        watcher.checked()
        self.assertEqual(self.locks.watch_count, 0)
        self.assertEqual(self.server.clock.getDelayedCalls(), [])
        self.assertFalse(watcher.aborted)

    def test_slow_reader_kept(self) -> None:
        """While the transport has paused the stream, events are kept (no pings); on resume they go, in order."""
        watcher = self.server.connect()
        watcher.send("GET", "/v1/watch?key=k")
        watcher.pause()
        written = watcher.transport.value()
        for owner in "abc":
            self.locks.request("k", owner, 3, 0, 0)
        self.server.clock.advance(PING_INTERVAL)
        self.assertEqual(watcher.transport.value(), written)
        watcher.resume()
        self.assertEqual([name for name, _ in watcher.response().events()], ["snapshot"] + ["granted"] * 3)
        self.assertFalse(watcher.aborted)

    def test_slow_reader_dropped(self) -> None:
        """Past --max-unsent bytes kept, the stream is dropped on the next turn: logged, the connection aborted, the watch gone."""
        server = UnitApi(ROUTES, max_unsent=2000)
        log = capture_log(self)
        watcher = server.connect()
        watcher.send("GET", "/v1/watch?key=k")
        watcher.pause()
        written = watcher.transport.value()
        sent = 0
        while len(server.clock.getDelayedCalls()) == 1 and sent < 100:
            # (one delayed call is the pings' timer; the drop is another)
            server.locks.request("k", f"o{sent}", 1000, 0, 0)
            sent += 1
        self.assertFalse(watcher.aborted)  # (never inside the lock table's change)
        self.assertGreater(sent, 3)
        server.clock.advance(0)
        self.assertTrue(watcher.aborted)
        self.assertEqual(
            [line for line in log if "event stream" in line],
            ["dropped an event stream of 127.0.0.1:40000: its client is not reading (past 2000 bytes behind)"],
        )
        self.assertEqual(watcher.transport.value(), written)
        watcher.lose()
        self.assertEqual(server.locks.watch_count, 0)
        self.assertEqual(server.clock.getDelayedCalls(), [])

    def test_head(self) -> None:
        """HEAD of a stream: its headers, no watch."""
        response = self.server.ask("HEAD", "/v1/watch?key=k")
        self.assertEqual((response.status, response.headers["content-type"]), (200, "text/event-stream"))
        self.assertEqual(self.locks.watch_count, 0)


class ObserveTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)

    def leaders(self, observer) -> list:
        return [(data["leader"] or {}).get("value", None) for _, data in observer.response().events()]

    def test_leader_changes(self) -> None:
        """The leader at once (null: none), then each new leader, a proclaim, a resignation."""
        first, second = self.server.session(), self.server.session()
        observer = self.server.connect()
        observer.send("GET", "/v1/elections/e/observe")
        self.assertEqual(observer.response().events(), [("leader", {"election": "e", "leader": None})])
        self.server.ask("POST", "/v1/elections/e/campaign", {"session": first, "value": "one"})
        waiting = self.server.connect()
        waiting.send("POST", "/v1/elections/e/campaign", {"session": second, "value": "two", "wait": 10})
        self.server.ask("POST", "/v1/elections/e/proclaim", {"session": first, "value": "uno"})
        self.server.ask("POST", "/v1/elections/e/resign", {"session": first})
        self.assertEqual(waiting.response().json()["leader"]["value"], "two")
        self.server.ask("POST", "/v1/elections/e/resign", {"session": second})
        # (a hand-over is the old leader's release, then the new one's grant: the table tells them in that order)
        self.assertEqual(self.leaders(observer), [None, "one", "uno", None, "two", None])
        leader = observer.response().events()[1][1]["leader"]
        self.assertEqual((leader["key"], leader["mode"], leader["expires_in"]), ("election:e", "exclusive", None))
        observer.checked()

    def test_other_keys_and_renewals_are_not_changes(self) -> None:
        """A campaign by the leader without a value, another election: no event."""
        first = self.server.session()
        observer = self.server.connect()
        observer.send("GET", "/v1/elections/e/observe")
        self.server.ask("POST", "/v1/elections/e/campaign", {"session": first})
        self.server.ask("POST", "/v1/elections/e/campaign", {"session": first})
        self.server.ask("POST", "/v1/elections/f/campaign", {"session": first})
        self.assertEqual(len(observer.response().events()), 2)

    def test_gone(self) -> None:
        """An observer gone: its watch is withdrawn, and a proclaim tells nobody."""
        first = self.server.session()
        observer = self.server.connect()
        observer.send("GET", "/v1/elections/e/observe")
        observer.lose()
        self.assertEqual(self.server.locks.watch_count, 0)
        self.server.ask("POST", "/v1/elections/e/campaign", {"session": first})
        self.assertEqual(self.server.ask("POST", "/v1/elections/e/proclaim", {"session": first, "value": "x"}).status, 200)
        self.assertEqual(len(observer.response().events()), 1)


class StatusStreamTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)
        self.stream = self.server.connect()
        self.stream.send("GET", "/v1/status/stream")

    def totals(self) -> list:
        return [data["totals"]["holders"] for name, data in self.stream.response().events() if name == "status"]

    def test_first_at_once(self) -> None:
        """The document of GET /v1/status, at once."""
        [(name, document)] = self.stream.response().events()
        self.assertEqual(name, "status")
        self.assertEqual(document, self.server.ask("GET", "/v1/status").json())
        self.stream.checked()

    def test_only_changes(self) -> None:
        """Nothing while nothing changed (a renewal is no change); a change, at the next 0.5 s tick."""
        grant = self.server.locks.request("k", "a", 1, 0, 10)
        self.server.clock.advance(STATUS_INTERVAL - 0.01)
        self.assertEqual(self.totals(), [0])
        self.server.clock.advance(0.01)
        self.assertEqual(self.totals(), [0, 1])
        self.server.locks.request("k", "a", 1, 0, 10)  # a renewal
        self.server.clock.advance(STATUS_INTERVAL * 4)
        self.assertEqual(self.totals(), [0, 1])
        grant.release()
        self.server.clock.advance(STATUS_INTERVAL)
        self.assertEqual(self.totals(), [0, 1, 0])

    def test_coalesced(self) -> None:
        """Many changes within 0.5 s: one document, of the last state; sessions count as changes."""
        for index in range(10):
            self.server.locks.request(f"k{index}", "a", 1, 0, 0)
        self.server.clock.advance(STATUS_INTERVAL)
        self.assertEqual(self.totals(), [0, 10])
        self.server.session()
        self.server.clock.advance(STATUS_INTERVAL)
        events = self.stream.response().events()
        self.assertEqual([data["sessions"]["total"] for _, data in events], [0, 0, 1])

    def test_gone_and_stopped(self) -> None:
        """The tick stops with the stream (client gone, or the server stopping)."""
        other = self.server.connect()
        other.send("GET", "/v1/status/stream")
        self.stream.lose()
        self.server.api.close("the server is stopping")
        self.assertEqual(other.response().events()[-1], ("end", {"reason": "the server is stopping"}))
        self.assertEqual(self.server.clock.getDelayedCalls(), [])
