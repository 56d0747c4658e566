"""
The clients' core with shared locks, holder values and watches, read from
literal server lines (docs/protocols/jesync.md's extensions): the requests
it writes, the C{HOLDER}, C{STATUS} and C{EVENT} lines it parses, events
routed to the connection's watches and never taken for the reply to a
pending request, and a dropped connection ending every watch; the blocking
client's watch over that core, its reader falling behind.  Then the
Twisted client against the real server in memory (L{jesync.testing}), on a
clock the test moves: shared locks, values, and watches with their
callbacks, stop() and lost callbacks.
"""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from typing import Any

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    ConnectionLost,
    Holder,
    KeyStatus,
    LockTimeout,
    ServerError,
    TwistedClient,
    Watch,
    WatchFellBehind,
)
from jesync.client.pipeline import Pipeline
from jesync.client.wire import (
    UnexpectedReply,
    WatchEvent,
    check_value,
    lock_value,
    parse_reply,
    watch_arguments,
)
from jesync.testing import MemoryServer
from jesync.wire import MAX_LINE
from tests.fake_session import FakeSession


class WatchRecorder:
    """A watch's events and its end, as a client's watch object would keep them."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self.ended: list[Exception] = []


def watch(s: FakeSession, name: str, key: str, prefix: bool = False) -> WatchRecorder:
    recorder = WatchRecorder()
    s.call(name, s.session.watch, key, prefix, recorder.events.append, recorder.ended.append)
    return recorder


class RequestTests(SynchronousTestCase):
    def test_shared_lock_line(self) -> None:
        """A shared lock is sent as lock-shared (no max_concurrent), with its fence."""
        s = FakeSession()
        s.call("lock", partial(s.session.lock, shared=True), "k", 1, 5, 30)
        self.assertEqual(s.take_sent(), b"lock-shared k 5 30\nstatus k\n")

    def test_value_is_the_fifth_field_percent_encoded(self) -> None:
        s = FakeSession()
        s.call("lock", partial(s.session.lock, value=b"10.0.0.5:80 %\xff"), "k", 2, -1, 30)
        self.assertEqual(s.take_sent(), b"lock k 2 -1 30 10.0.0.5:80%20%25%FF\nstatus k\n")
        s.call("lock2", partial(s.session.lock, shared=True, value=b"v"), "j", 1, 0, 30)
        self.assertEqual(s.take_sent(), b"lock-shared j 0 30 v\nstatus j\n")

    def test_lock_many_shared(self) -> None:
        s = FakeSession()
        s.call("many", partial(s.session.lock_many, shared=True), ("a", "b"), 3, 30)
        self.assertEqual(s.take_sent(), b"lock-many-shared 3 30 a b\nstatus a\n")

    def test_values_checked(self) -> None:
        """A str is its UTF-8; empty is no value; a value whose line would not fit is refused before sending."""
        self.assertEqual(check_value("é"), "é".encode())
        self.assertIsNone(check_value(""))
        self.assertIsNone(check_value(None))
        self.assertRaises(TypeError, check_value, 42)
        self.assertRaises(ValueError, check_value, b"v" * 4097)
        self.assertEqual(lock_value("k", b"x" * 4096, False), b"x" * 4096)
        self.assertRaises(ValueError, lock_value, "k", b"\x00" * (MAX_LINE // 3), True)

    def test_watch_lines(self) -> None:
        s = FakeSession()
        watch(s, "w1", "k")
        watch(s, "w2", "jobs/", prefix=True)
        watch(s, "w3", "", prefix=True)
        self.assertEqual(s.take_sent(), b"watch k\nwatch-prefix jobs/\nwatch-prefix\n")

    def test_watch_arguments(self) -> None:
        self.assertEqual(watch_arguments("k", None), ("k", False))
        self.assertEqual(watch_arguments(None, ""), ("", True))
        self.assertRaises(TypeError, watch_arguments, None, None)
        self.assertRaises(TypeError, watch_arguments, "k", "p")
        self.assertRaises(ValueError, watch_arguments, "a b", None)


class ReplyTests(SynchronousTestCase):
    def test_holder_lines(self) -> None:
        """Today's line is an exclusive holder without a value; trailing fields give the mode and the value."""
        plain = parse_reply(b"HOLDER k 10.0.0.5:4242 3 117 7").holder
        self.assertEqual(plain, Holder("k", "10.0.0.5:4242", 3, 117, 7))
        self.assertEqual((plain.mode, plain.value, plain.shared), ("exclusive", None, False))
        shared = parse_reply(b"HOLDER k 10.0.0.5:4242 3 117 7 shared").holder
        self.assertEqual((shared.mode, shared.value, shared.token), ("shared", None, 7))
        valued = parse_reply(b"HOLDER k 10.0.0.5:4242 3 117 7 exclusive a%20b").holder
        self.assertEqual((valued.mode, valued.value, valued.seconds_left), ("exclusive", b"a b", 117))
        # A value that is itself a mode word is still the value.
        tricky = parse_reply(b"HOLDER k unix:/s 0 0 8 exclusive shared").holder
        self.assertEqual((tricky.peer, tricky.mode, tricky.value), ("unix:/s", "exclusive", b"shared"))
        self.assertRaises(UnexpectedReply, parse_reply, b"HOLDER k p 1 2 3 exclusive %zz")

    def test_status_shared(self) -> None:
        reply = parse_reply(b"STATUS 3 1 k shared")
        self.assertEqual((reply.status, reply.shared), (KeyStatus("k", 3, 1), True))
        self.assertFalse(parse_reply(b"STATUS 1 0 k").shared)
        self.assertRaises(UnexpectedReply, parse_reply, b"STATUS 1 0 k exclusive")

    def test_event_lines(self) -> None:
        cases = {
            b"EVENT GRANTED k 10.0.0.5:4242 12 shared": WatchEvent("granted", "k", "10.0.0.5:4242", 12, "shared"),
            b"EVENT GRANTED k h:1 13 exclusive me%0A": WatchEvent("granted", "k", "h:1", 13, "exclusive", b"me\n"),
            b"EVENT RELEASED k h:1 13": WatchEvent("released", "k", "h:1", 13),
            b"EVENT EXPIRED k h:1 13": WatchEvent("expired", "k", "h:1", 13),
            b"EVENT LOST k h:1 13": WatchEvent("lost", "k", "h:1", 13),
            b"EVENT APPEARED k": WatchEvent("appeared", "k"),
            b"EVENT DISAPPEARED k": WatchEvent("disappeared", "k"),
        }
        for line, event in cases.items():
            self.assertEqual(parse_reply(line).event, event, line)
        for bad in (b"EVENT", b"EVENT GRANTED k h:1 13", b"EVENT RELEASED k", b"EVENT granted k h 1 shared",
                    b"EVENT APPEARED k h:1 3", b"EVENT GRANTED k h:1 x shared", b"EVENT MOVED k"):
            self.assertRaises(UnexpectedReply, parse_reply, bad)

    def test_event_as_dict(self) -> None:
        event = WatchEvent("granted", "k", "h:1", 3, "exclusive", b"\xffa")
        self.assertEqual(
            event.as_dict(),
            {"kind": "granted", "key": "k", "holder": "h:1", "token": 3, "mode": "exclusive", "value": "\\xffa"},
        )


class PipelineEventTests(SynchronousTestCase):
    def test_an_event_never_answers_a_request(self) -> None:
        """
        Events arriving while a status, a holders listing and a waiting lock
        are outstanding go to on_event; each request still gets its own reply.
        """
        sent: list[bytes] = []
        events: list[WatchEvent] = []
        results: dict[str, object] = {}
        pipeline = Pipeline(sent.append, on_event=events.append)
        pipeline.lock("k", 1, -1, 120, lambda r: results.setdefault("lock", r), lambda e: results.setdefault("lock", e))
        pipeline.holders("k", lambda r: results.setdefault("holders", r), lambda e: results.setdefault("holders", e))
        pipeline.status("j", lambda r: results.setdefault("status", r), lambda e: results.setdefault("status", e))
        pipeline.line_received(b"EVENT GRANTED k h:1 3 exclusive")
        pipeline.line_received(b"STATUS 1 1 k")  # the lock's fence: it waits
        pipeline.line_received(b"HOLDER k h:1 0 120 3")
        pipeline.line_received(b"EVENT RELEASED k h:1 3")
        pipeline.line_received(b"END")
        pipeline.line_received(b"EVENT GRANTED k me:2 4 exclusive")
        pipeline.line_received(b"STATUS 0 0 j")
        self.assertEqual(results["holders"], [Holder("k", "h:1", 0, 120, 3)])
        self.assertEqual(results["status"], KeyStatus("j", 0, 0))
        self.assertNotIn("lock", results)
        pipeline.line_received(b"GRANTED 1 0 k 120 4")
        self.assertEqual(results["lock"].token, 4)
        self.assertEqual([e.kind for e in events], ["granted", "released", "granted"])

    def test_shared_keys_in_a_listing(self) -> None:
        """A listing's STATUS lines of shared keys carry " shared": still rows of the listing."""
        results: list[object] = []
        pipeline = Pipeline(lambda data: None)
        pipeline.listing("key", results.append, results.append)
        for line in (b"STATUS 2 1 a shared", b"EVENT APPEARED b", b"STATUS 1 0 b", b"END"):
            pipeline.line_received(line)
        self.assertEqual(results, [[KeyStatus("a", 2, 1), KeyStatus("b", 1, 0)]])

    def test_an_event_with_nothing_outstanding(self) -> None:
        events: list[WatchEvent] = []
        pipeline = Pipeline(lambda data: None, on_event=events.append)
        pipeline.line_received(b"EVENT APPEARED k")
        self.assertEqual(events, [WatchEvent("appeared", "k")])
        self.assertFalse(pipeline.owes_reply)


class SessionTests(SynchronousTestCase):
    def test_shared_lock_handle_and_renewal(self) -> None:
        """The handle knows its mode and value; a renewal asks the same mode, without the value (kept)."""
        s = FakeSession()
        s.call("lock", partial(s.session.lock, shared=True, value=b"me"), "k", 1, 0, 30)
        s.reply(b"GRANTED 2 0 k 30 9", b"STATUS 2 0 k shared")
        lock = s.results["lock"]
        self.assertEqual((lock.mode, lock.shared, lock.value, lock.token), ("shared", True, b"me", 9))
        s.take_sent()
        s.call("renew", s.session.renew, lock)
        self.assertEqual(s.take_sent(), b"lock-shared k 0 30\nstatus k\n")
        s.reply(b"GRANTED 2 0 k 30 9", b"STATUS 2 0 k shared")
        self.assertIsNone(s.results["renew"])
        self.assertTrue(lock.held)

    def test_exclusive_handle(self) -> None:
        s = FakeSession()
        s.call("lock", s.session.lock, "k", 1, 0, 30)
        s.reply(b"GRANTED 1 0 k 30 9", b"STATUS 1 0 k")
        lock = s.results["lock"]
        self.assertEqual((lock.mode, lock.shared, lock.value), ("exclusive", False, None))

    def test_shared_lock_many_renewal(self) -> None:
        s = FakeSession()
        s.call("many", partial(s.session.lock_many, shared=True), ("a", "b"), 0, 30)
        s.reply(b"GRANTED-MANY 2 30 a b 5 6", b"STATUS 1 0 a shared")
        lock = s.results["many"]
        self.assertTrue(lock.shared)
        s.take_sent()
        s.call("renew", s.session.renew, lock)
        self.assertEqual(s.take_sent(), b"lock-many-shared 0 30 a b\nstatus a\n")

    def test_events_after_watching(self) -> None:
        """A subscription gets the events read after its WATCHING, in order."""
        s = FakeSession()
        w = watch(s, "w", "k")
        s.reply(b"EVENT GRANTED k h:1 3 exclusive")  # another watch's, before this one is confirmed
        s.reply(b"WATCHING k")
        subscription = s.results["w"]
        self.assertTrue(subscription.active)
        s.reply(b"EVENT GRANTED k h:1 4 shared v", b"EVENT RELEASED k h:1 4", b"EVENT GRANTED j h:1 5 exclusive")
        self.assertEqual(
            w.events, [WatchEvent("granted", "k", "h:1", 4, "shared", b"v"), WatchEvent("released", "k", "h:1", 4)]
        )

    def test_prefix_routing(self) -> None:
        """A prefix subscription gets its keys' events and appeared/disappeared; a key subscription never those."""
        s = FakeSession()
        key = watch(s, "key", "jobs/1")
        jobs = watch(s, "jobs", "jobs/", prefix=True)
        every = watch(s, "every", "", prefix=True)
        s.reply(b"WATCHING jobs/1", b"WATCHING-PREFIX jobs/", b"WATCHING-PREFIX")
        s.reply(b"EVENT APPEARED jobs/1", b"EVENT GRANTED jobs/1 h:1 3 exclusive", b"EVENT APPEARED other")
        self.assertEqual([e.kind for e in key.events], ["granted"])
        self.assertEqual([(e.kind, e.key) for e in jobs.events], [("appeared", "jobs/1"), ("granted", "jobs/1")])
        self.assertEqual(len(every.events), 3)

    def test_unwatch_when_the_last_subscription_ends(self) -> None:
        """Two subscriptions of one key: the server is asked to unwatch only when both have ended."""
        s = FakeSession()
        first, second = watch(s, "a", "k"), watch(s, "b", "k")
        s.reply(b"WATCHING k", b"WATCHING k")
        s.take_sent()
        s.call("unwatch a", s.session.unwatch, s.results["a"])
        self.assertEqual(s.take_sent(), b"")
        self.assertTrue(s.results["unwatch a"])
        s.reply(b"EVENT LOST k h:1 3")
        self.assertEqual((len(first.events), len(second.events)), (0, 1))
        s.call("unwatch b", s.session.unwatch, s.results["b"])
        self.assertEqual(s.take_sent(), b"unwatch k\n")
        s.reply(b"UNWATCHED k")
        self.assertTrue(s.results["unwatch b"])
        s.call("again", s.session.unwatch, s.results["b"])
        self.assertFalse(s.results["again"])

    def test_pending_watch_keeps_the_server_watching(self) -> None:
        """
        An unwatch is not sent while another subscription's watch of the
        key is unanswered; it is once that one, answered, ends too.
        """
        s = FakeSession()
        watch(s, "a", "k")
        s.reply(b"WATCHING k")
        second = watch(s, "b", "k")
        self.assertEqual(s.take_sent(), b"watch k\nwatch k\n")
        s.call("unwatch a", s.session.unwatch, s.results["a"])
        self.assertEqual(s.take_sent(), b"")
        s.reply(b"WATCHING k", b"EVENT RELEASED k h:1 3")
        self.assertEqual([e.kind for e in second.events], ["released"])
        s.call("unwatch b", s.session.unwatch, s.results["b"])
        self.assertEqual(s.take_sent(), b"unwatch k\n")
        s.reply(b"UNWATCHED k")
        self.assertTrue(s.results["unwatch b"])
        self.assertEqual(len(s.session.watches), 0)

    def test_unwatch_prefix_lines(self) -> None:
        s = FakeSession()
        watch(s, "every", "", prefix=True)
        s.reply(b"WATCHING-PREFIX")
        s.take_sent()
        s.call("unwatch", s.session.unwatch, s.results["every"])
        self.assertEqual(s.take_sent(), b"unwatch-prefix\n")
        s.reply(b"UNWATCHED-PREFIX")
        self.assertTrue(s.results["unwatch"])

    def test_refused_watch(self) -> None:
        """Over the server's cap: ServerError, and the subscription is forgotten."""
        s = FakeSession()
        w = watch(s, "w", "k")
        s.reply(b"INVALID_PARAMETER: max-watches exceeded (1)")
        self.assertIsInstance(s.results["w"], ServerError)
        self.assertEqual(len(s.session.watches), 0)
        s.reply(b"EVENT RELEASED k h:1 3")
        self.assertEqual(w.events, [])

    def test_connection_lost_ends_every_watch(self) -> None:
        """A dropped connection ends active watches with ConnectionLost; pending ones fail with it."""
        s = FakeSession()
        active = watch(s, "active", "k")
        s.reply(b"WATCHING k")
        pending = watch(s, "pending", "j")
        s.session.fail("the server closed the connection")
        [error] = active.ended
        self.assertIsInstance(error, ConnectionLost)
        self.assertIn("the server closed the connection", str(error))
        self.assertIsInstance(s.results["pending"], ConnectionLost)
        self.assertEqual(pending.ended, [])
        s.call("unwatch", s.session.unwatch, s.results["active"])
        self.assertFalse(s.results["unwatch"])
        self.assertEqual(len(s.session.watches), 0)


class FakeConnection:
    """
    What a blocking L{Watch} asks of its client connection, over a
    L{FakeSession}: C{start} a request (its result in a Future), and
    C{call} one that the session answers at once (nothing here answers later).
    """

    def __init__(self, s: FakeSession) -> None:
        self.session = s.session

    def start(self, operation: Any, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        operation(*args, future.set_result, future.set_exception)
        return future

    def call(self, operation: Any, *args: Any) -> Any:
        return self.start(operation, *args).result(timeout=0)


class QueuedWatchTests(SynchronousTestCase):
    """
    The blocking client's watch (the asyncio one shares its queueing:
    L{jesync.client.watch.QueuedWatch}) told events by literal server lines:
    at most C{max_events} wait for the reader; one more ends the watch
    with L{WatchFellBehind} after them, and unwatches on the server at once.
    """

    def watching(self, max_events: int, key: str = "k", prefix: bool = False) -> tuple[FakeSession, Watch]:
        s = FakeSession()
        connection = FakeConnection(s)
        events = Watch(key, prefix, max_events)
        connection.start(events._subscription_request(connection))
        s.reply(b"WATCHING-PREFIX " + key.encode() if prefix else b"WATCHING " + key.encode())
        s.take_sent()
        return s, events

    def test_a_reader_that_falls_behind(self) -> None:
        s, events = self.watching(max_events=2)
        s.reply(b"EVENT GRANTED k h:1 1 exclusive", b"EVENT RELEASED k h:1 1")
        self.assertEqual(s.take_sent(), b"")
        s.reply(b"EVENT GRANTED k h:2 2 shared v", b"EVENT LOST k h:2 2")
        self.assertEqual(s.take_sent(), b"unwatch k\n")  # at the third event, once
        s.reply(b"UNWATCHED k")
        self.assertEqual(len(s.session.watches), 0)
        self.assertEqual([(e.kind, e.token) for e in (next(events), events.get(0))], [("granted", 1), ("released", 1)])
        error = self.assertRaises(WatchFellBehind, events.get, 0)
        self.assertEqual((error.key, error.prefix, error.max_events), ("k", False, 2))
        self.assertIn("the watch of key 'k' fell behind: 2 events were waiting to be read", str(error))
        self.assertRaises(WatchFellBehind, next, events)  # and again, as ConnectionLost
        self.assertEqual(s.take_sent(), b"")  # closed: nothing was left to unwatch
        self.assertIn("closed", repr(events))

    def test_reading_in_time_never_falls_behind(self) -> None:
        s, events = self.watching(max_events=1, key="jobs/", prefix=True)
        for n in range(3):
            s.reply(b"EVENT APPEARED jobs/%d" % n)
            self.assertEqual(events.get(0), WatchEvent("appeared", f"jobs/{n}"))
        self.assertIsNone(events.get(0))
        self.assertEqual(s.take_sent(), b"")

    def test_the_connection_lost_after_the_queued_events(self) -> None:
        """The end of a connection is not an event: it is queued even when the queue is full."""
        s, events = self.watching(max_events=1)
        s.reply(b"EVENT EXPIRED k h:1 4")
        s.session.fail("the server closed the connection")
        self.assertEqual(events.get(0), WatchEvent("expired", "k", "h:1", 4))
        self.assertRaises(ConnectionLost, events.get, 0)

    def test_max_events_checked(self) -> None:
        self.assertRaises(ValueError, Watch, "k", False, 0)
        self.assertRaises(TypeError, Watch, "k", False, 1.5)


class TwistedCoordinationTests(SynchronousTestCase):
    """The Twisted client against the real server in memory."""

    def setUp(self) -> None:
        self.server = MemoryServer()
        self.first = self.client()
        self.second = self.client()

    def client(self) -> TwistedClient:
        client = self.server.client()
        self.addCleanup(lambda: (client.close(), self.server.flush()))
        return client

    def result(self, deferred: defer.Deferred[Any]) -> Any:
        self.server.flush()
        return self.successResultOf(deferred)

    def test_shared_and_exclusive(self) -> None:
        """Shared holders together; an exclusive request waits for them and holds back later shared ones."""
        a = self.result(self.first.lock("schema", shared=True))
        b = self.result(self.second.lock("schema", shared=True, value=b"r2"))
        self.assertTrue(a.shared and b.shared)
        writer, reader = self.client(), self.client()
        writing = writer.lock("schema")
        reading = reader.lock("schema", shared=True)
        self.server.flush()
        self.assertEqual(self.server.service.status("schema"), KeyStatus("schema", 2, 2))
        holders = self.result(self.first.holders("schema"))
        self.assertEqual([(h.mode, h.value) for h in holders], [("shared", None), ("shared", b"r2")])
        self.assertTrue(self.result(a.release()) and self.result(b.release()))
        written = self.result(writing)
        self.assertNoResult(reading)
        self.assertTrue(self.result(written.release()))
        self.assertTrue(self.result(reading).shared)

    def test_shared_renewal_keeps_the_lock(self) -> None:
        lock = self.result(self.first.lock("schema", shared=True, expires=3, auto_renew=True, value="v"))
        for _ in range(4):
            self.server.advance(1.5)
        self.assertTrue(lock.held)
        [holder] = self.result(self.second.holders("schema"))
        self.assertEqual((holder.mode, holder.value, holder.token), ("shared", b"v", lock.token))
        refused = self.second.lock("schema", wait=0)
        self.server.flush()
        self.failureResultOf(refused, LockTimeout)

    def test_watch_callback(self) -> None:
        """Each event to the callback, in order; stop() ends it (True once, then False)."""
        events: list[WatchEvent] = []
        watch = self.result(self.first.watch("k", events.append))
        lock = self.result(self.second.lock("k", value="me"))
        self.result(lock.release())
        self.assertEqual([(e.kind, e.token) for e in events], [("granted", lock.token), ("released", lock.token)])
        self.assertEqual(events[0].value, b"me")
        self.assertTrue(self.result(watch.stop()))
        self.assertFalse(self.result(watch.stop()))
        self.result(self.second.lock("k"))
        self.assertEqual(len(events), 2)
        self.assertEqual(self.server.service.watch_count, 0)

    def test_watch_every_key_and_lost(self) -> None:
        """prefix="": every key; a holder whose connection closes is lost, then its key disappears."""
        events: list[WatchEvent] = []
        self.result(self.first.watch(prefix="", callback=events.append))
        third = self.client()
        self.result(third.lock("a"))
        self.result(third.close())
        kinds = [(e.kind, e.key) for e in events]
        self.assertEqual(kinds, [("appeared", "a"), ("granted", "a"), ("lost", "a"), ("disappeared", "a")])

    def test_a_failing_callback_is_logged(self) -> None:
        def broken(event: WatchEvent) -> None:
            raise RuntimeError("boom")

        watch = self.result(self.first.watch("k", broken))
        with self.assertLogs("jesync.client", "ERROR") as logged:
            self.result(self.second.lock("k"))
        self.assertEqual(len(logged.records), 1)
        self.assertIn("the watch callback", logged.output[0])
        self.assertTrue(watch.active)
        self.assertTrue(self.result(watch.stop()))

    def test_lost_connection_calls_the_lost_callbacks(self) -> None:
        """A dropped connection ends the watch: its lost callbacks get ConnectionLost, never silence."""
        lost: list[Exception] = []
        watch = self.result(self.first.watch("k", lambda event: None))
        watch.add_lost_callback(lost.append)
        self.server.drop_connections()
        self.server.flush()
        [error] = lost
        self.assertIsInstance(error, ConnectionLost)
        self.assertIs(watch.lost_reason, error)
        self.assertFalse(watch.active)
        watch.add_lost_callback(lost.append)  # already lost: at once
        self.assertEqual(len(lost), 2)
        self.assertFalse(self.result(watch.stop()))
        # Watching again reconnects.
        events: list[WatchEvent] = []
        self.result(self.first.watch("k", events.append))
        self.result(self.second.lock("k"))
        self.assertEqual([e.kind for e in events], ["granted"])

    def test_watch_cap(self) -> None:
        server = MemoryServer(max_watches=1)
        client = server.client()
        self.addCleanup(lambda: (client.close(), server.flush()))
        server.flush()
        watching = client.watch("a", lambda event: None)
        server.flush()
        self.successResultOf(watching)
        refused = client.watch("b", lambda event: None)
        server.flush()
        error = self.failureResultOf(refused, ServerError).value
        self.assertEqual(error.message, "INVALID_PARAMETER: max-watches exceeded (1)")

    def test_bad_watch_arguments(self) -> None:
        self.failureResultOf(self.first.watch("k"), TypeError)
        self.failureResultOf(self.first.watch("k", print, prefix="p"), TypeError)
        self.failureResultOf(self.first.watch("a b", print), ValueError)
