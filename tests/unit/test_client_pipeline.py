"""
Matching replies to requests on one pipelined connection: scripted replies
first, then random request sequences against the real server protocol in
memory.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import task
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from jesync.client.errors import ConnectionLost, KeyBusy, LockManyTimeout, ServerError
from jesync.client.pipeline import Pipeline
from jesync.client.wire import UnexpectedReply
from jesync.errors import LockTimeout
from jesync.interfaces import KeyStatus
from jesync.protocols.jesync import JESyncFactory
from jesync.service import LockService


class Recorder:
    """A pipeline whose sent bytes and results are recorded."""

    def __init__(self) -> None:
        self.sent = b""
        self.expired: list[str] = []
        self.pipeline = Pipeline(self._send, self.expired.append)
        self.results: dict[str, Any] = {}

    def _send(self, data: bytes) -> None:
        self.sent += data

    def callbacks(self, name: str) -> tuple[Any, Any]:
        def result(value: object) -> None:
            assert name not in self.results, f"{name} settled twice"
            self.results[name] = value

        def error(failure: Exception) -> None:
            assert name not in self.results, f"{name} settled twice"
            self.results[name] = failure

        return result, error

    def lock(self, name: str, key: str, timeout: int = -1, max_concurrent: int = 1) -> None:
        self.pipeline.lock(key, max_concurrent, timeout, 120, *self.callbacks(name))

    def lock_many(self, name: str, keys: str, timeout: int = -1) -> None:
        self.pipeline.lock_many(tuple(keys.split()), timeout, 120, *self.callbacks(name))

    def reply(self, *lines: bytes) -> None:
        for line in lines:
            self.pipeline.line_received(line)


class ScriptedTests(SynchronousTestCase):
    def test_lock_carries_a_fence(self) -> None:
        """Every lock is written with a status of its key, in the same write."""
        r = Recorder()
        r.lock("a", "A", timeout=5)
        self.assertEqual(r.sent, b"lock A 1 5 120\nstatus A\n")

    def test_out_of_order(self) -> None:
        """
        lock A (answered at once), lock B (waits), status C, release A: the
        late GRANTED B reaches the lock B however late it comes.
        """
        r = Recorder()
        r.lock("A", "A")
        r.lock("B", "B")
        r.pipeline.status("C", *r.callbacks("C"))
        r.pipeline.release("A", *r.callbacks("release A"))
        self.assertTrue(r.pipeline.owes_reply)
        r.reply(b"GRANTED 1 0 A 120", b"STATUS 1 0 A")  # lock A and its fence
        self.assertEqual(r.results["A"].status, KeyStatus("A", 1, 0))
        r.reply(b"STATUS 1 1 B")  # B's fence, before any answer: B waits
        r.reply(b"STATUS 0 0 C", b"RELEASED 0 0 A")
        self.assertEqual(r.results["C"], KeyStatus("C", 0, 0))
        self.assertIs(r.results["release A"], True)
        self.assertNotIn("B", r.results)
        self.assertFalse(r.pipeline.owes_reply)
        self.assertTrue(r.pipeline.outstanding())
        r.reply(b"GRANTED 1 0 B 120")
        self.assertEqual(r.results["B"].key, "B")
        self.assertFalse(r.pipeline.outstanding())

    def test_invalid_parameter_after_a_lock(self) -> None:
        """An INVALID_PARAMETER before a lock's fence is that lock's; after it, the next request's."""
        r = Recorder()
        r.lock("bad", "A", max_concurrent=0)
        r.lock("waits", "B")
        r.pipeline.status("C", *r.callbacks("C"))
        r.reply(b"INVALID_PARAMETER: Max concurrent should be greater or equal than 1", b"STATUS 0 0 A")
        r.reply(b"STATUS 1 1 B")
        r.reply(b"INVALID_PARAMETER: whatever")  # answers the status, not the waiting lock
        self.assertIsInstance(r.results["bad"], ServerError)
        self.assertEqual(r.results["bad"].message, "INVALID_PARAMETER: Max concurrent should be greater or equal than 1")
        self.assertIsInstance(r.results["C"], ServerError)
        self.assertNotIn("waits", r.results)

    def test_timeout(self) -> None:
        r = Recorder()
        r.lock("now", "A", timeout=0)
        r.lock("later", "B", timeout=3)
        r.reply(b"TIMEOUT 1 0 A", b"STATUS 1 0 A", b"STATUS 1 1 B", b"TIMEOUT 1 0 B")
        self.assertIsInstance(r.results["now"], LockTimeout)
        self.assertIsInstance(r.results["later"], LockTimeout)
        self.assertEqual(r.results["later"].key, "B")

    def test_listing(self) -> None:
        r = Recorder()
        r.lock("B", "B")
        r.pipeline.listing("key", *r.callbacks("list"))
        r.reply(b"STATUS 1 1 B", b"STATUS 1 0 A", b"GRANTED 1 0 B 120", b"STATUS 1 0 B", b"END")
        self.assertEqual(r.results["list"], [KeyStatus("A", 1, 0), KeyStatus("B", 1, 0)])
        self.assertEqual(r.results["B"].key, "B")

    def test_one_waiting_lock_per_key(self) -> None:
        """A second lock for a key whose lock may still wait is refused locally; renewals may overlap."""
        r = Recorder()
        r.lock("first", "A")
        self.assertRaises(KeyBusy, r.lock, "second", "A")
        self.assertRaises(KeyBusy, r.lock, "renewal", "A", timeout=0)
        r.reply(b"GRANTED 1 0 A 120")
        r.lock("renewal 1", "A", timeout=0)  # settled: the fence need not have come yet
        r.lock("renewal 2", "A", timeout=0)
        self.assertRaises(KeyBusy, r.lock, "waiting", "A")
        r.reply(b"STATUS 1 0 A", b"GRANTED 1 0 A 60", b"STATUS 1 0 A", b"GRANTED 1 0 A 50", b"STATUS 1 0 A")
        self.assertEqual([r.results[n].seconds_left for n in ("renewal 1", "renewal 2")], [60, 50])
        self.assertFalse(r.pipeline.outstanding())

    def test_abandoned_lock_released_when_granted(self) -> None:
        r = Recorder()
        r.lock("A", "A")
        r.reply(b"STATUS 1 1 A")
        r.pipeline.abandon("A")
        self.assertRaises(KeyBusy, r.lock, "again", "A")
        r.sent = b""
        r.reply(b"GRANTED 1 0 A 120")
        self.assertEqual(r.sent, b"release A\n")
        self.assertEqual(r.results, {})
        r.reply(b"RELEASED 0 0 A")
        self.assertFalse(r.pipeline.outstanding())

    def test_abandoned_timeout_sends_nothing(self) -> None:
        r = Recorder()
        r.lock("A", "A", timeout=1)
        r.pipeline.abandon("A")
        r.sent = b""
        r.reply(b"STATUS 1 1 A", b"TIMEOUT 1 0 A")
        self.assertEqual((r.sent, r.results), (b"", {}))

    def test_expired(self) -> None:
        """JESync 0.8.1's unsolicited EXPIRED is reported, and answers nothing."""
        r = Recorder()
        r.pipeline.status("A", *r.callbacks("A"))
        r.reply(b"EXPIRED 0 0 K 0", b"STATUS 0 0 A")
        self.assertEqual(r.expired, ["K"])
        self.assertEqual(r.results["A"], KeyStatus("A", 0, 0))

    def test_unexpected(self) -> None:
        for requests, line in [
            ([], b"STATUS 0 0 A"),
            ([], b"GRANTED 1 0 A 120"),
            (["status B"], b"STATUS 0 0 A"),
            (["status B"], b"RELEASED 0 0 B"),
            (["lock B"], b"RELEASED 0 0 B"),
            (["status B"], b"WHAT"),
        ]:
            r = Recorder()
            for request in requests:
                command, key = request.split()
                if command == "lock":
                    r.lock(key, key)
                else:
                    r.pipeline.status(key, *r.callbacks(key))
            self.assertRaises(UnexpectedReply, r.reply, line)

    def test_fail_all(self) -> None:
        """Every unsettled request fails once; a settled lock awaiting its fence does not fail again."""
        r = Recorder()
        r.lock("held", "A")
        r.lock("waiting", "B")
        r.pipeline.status("C", *r.callbacks("C"))
        r.reply(b"GRANTED 1 0 A 120")
        lost = ConnectionLost("server", "gone")
        r.pipeline.fail_all(lost)
        self.assertEqual(r.results["held"].key, "A")
        self.assertIs(r.results["waiting"], lost)
        self.assertIs(r.results["C"], lost)
        self.assertRaises(ConnectionLost, r.pipeline.status, "D", *r.callbacks("D"))
        r.pipeline.fail_all(ConnectionLost("server", "again"))  # harmless


class LockManyTests(SynchronousTestCase):
    """lock-many, scripted: every reply shape, at once and late."""

    def test_carries_a_fence(self) -> None:
        """A lock-many is written with a status of its first key, in the same write."""
        r = Recorder()
        r.lock_many("AB", "A B", timeout=5)
        self.assertEqual(r.sent, b"lock-many 5 120 A B\nstatus A\n")

    def test_granted_at_once(self) -> None:
        r = Recorder()
        r.lock_many("AB", "A B")
        r.lock_many("CD", "C D")
        r.reply(b"GRANTED-MANY 2 120 A B 7 9", b"STATUS 1 0 A")
        r.reply(b"GRANTED-MANY 2 60 C D", b"STATUS 1 0 C")  # fencing off: no tokens
        granted = r.results["AB"]
        self.assertEqual((granted.word, granted.keys, granted.tokens, granted.seconds_left), ("GRANTED-MANY", ("A", "B"), (7, 9), 120))
        self.assertEqual((r.results["CD"].keys, r.results["CD"].tokens), (("C", "D"), (None, None)))
        self.assertFalse(r.pipeline.outstanding())

    def test_waits_then_granted(self) -> None:
        """
        STATUS of the first key before any answer: the lock-many waits; later
        requests are answered meanwhile, and the late GRANTED-MANY reaches it.
        """
        r = Recorder()
        r.lock_many("ABC", "A B C")
        r.pipeline.status("B", *r.callbacks("status B"))
        r.lock("D", "D")
        r.reply(b"STATUS 0 1 A")
        self.assertNotIn("ABC", r.results)
        self.assertTrue(r.pipeline.owes_reply)  # status B and lock D
        r.reply(b"STATUS 1 1 B", b"GRANTED 1 0 D 120 3", b"STATUS 1 0 D")
        self.assertEqual(r.results["status B"], KeyStatus("B", 1, 1))
        self.assertEqual(r.results["D"].token, 3)
        self.assertNotIn("ABC", r.results)
        self.assertFalse(r.pipeline.owes_reply)
        self.assertTrue(r.pipeline.outstanding())
        r.reply(b"GRANTED-MANY 3 120 A B C 4 5 6")
        self.assertEqual(r.results["ABC"].tokens, (4, 5, 6))
        self.assertFalse(r.pipeline.outstanding())

    def test_late_answer_while_a_lock_many_heads_the_queue(self) -> None:
        """A waiting lock-many's late answer is told from the one at the head by its keys."""
        r = Recorder()
        r.lock_many("AB", "A B")
        r.reply(b"STATUS 1 1 A")
        r.lock_many("CD", "C D")
        r.reply(b"GRANTED-MANY 2 120 A B", b"GRANTED-MANY 2 120 C D", b"STATUS 1 0 C")
        self.assertEqual((r.results["AB"].keys, r.results["CD"].keys), (("A", "B"), ("C", "D")))

    def test_timeout(self) -> None:
        """TIMEOUT-MANY, at once (wait 0) or late, is a LockManyTimeout (a LockTimeout) naming every key."""
        r = Recorder()
        r.lock_many("now", "A B", timeout=0)
        r.lock_many("later", "C D", timeout=3)
        r.reply(b"TIMEOUT-MANY 2 A B", b"STATUS 1 0 A", b"STATUS 1 1 C")
        self.assertNotIn("later", r.results)
        r.reply(b"TIMEOUT-MANY 2 C D")
        for name, keys in [("now", ["A", "B"]), ("later", ["C", "D"])]:
            error = r.results[name]
            self.assertIsInstance(error, LockManyTimeout)
            self.assertIsInstance(error, LockTimeout)
            self.assertEqual((error.key, error.keys), (keys[0], keys))
        self.assertIn("'C', 'D'", str(r.results["later"]))
        self.assertFalse(r.pipeline.outstanding())

    def test_refused(self) -> None:
        """An error before the fence is the lock-many's: a bad parameter, or an older server's INVALID_COMMAND."""
        r = Recorder()
        r.lock_many("bad", "A B")
        r.lock_many("old", "C")
        r.reply(b"INVALID_PARAMETER: max-held reached", b"STATUS 0 0 A", b"INVALID_COMMAND", b"STATUS 0 0 C")
        self.assertEqual(r.results["bad"].message, "INVALID_PARAMETER: max-held reached")
        self.assertEqual(r.results["old"].message, "INVALID_COMMAND")
        self.assertFalse(r.pipeline.outstanding())
        r.lock_many("again", "A B")  # nothing is outstanding for them any more
        self.assertTrue(r.sent.endswith(b"lock-many -1 120 A B\nstatus A\n"))

    def test_one_waiting_request_per_key(self) -> None:
        """
        No two lock requests sharing a key are outstanding when either may
        wait: not two lock-manys, nor a lock and a lock-many, whichever came
        first.  Requests that cannot wait (timeout 0) may overlap.
        """
        r = Recorder()
        r.lock_many("AB", "A B")
        for attempt in [
            lambda: r.lock_many("BC", "B C"),
            lambda: r.lock_many("BC now", "B C", timeout=0),
            lambda: r.lock("B", "B"),
            lambda: r.lock("B now", "B", timeout=0),
        ]:
            with self.assertRaises(KeyBusy) as caught:
                attempt()
            self.assertEqual(caught.exception.key, "B")
        r.lock("C", "C")
        self.assertRaises(KeyBusy, r.lock_many, "DC", "D C", timeout=0)
        r.lock("D", "D", timeout=0)
        r.lock_many("DE", "D E", timeout=0)  # neither may wait
        self.assertEqual(r.sent.count(b"lock"), 4)
        r.reply(b"STATUS 0 1 A", b"GRANTED 1 0 C 120", b"STATUS 1 0 C")
        r.reply(b"GRANTED 1 0 D 120", b"STATUS 1 0 D", b"GRANTED-MANY 2 120 D E", b"STATUS 1 0 D")
        self.assertEqual(r.results["DE"].keys, ("D", "E"))
        self.assertRaises(KeyBusy, r.lock, "A", "A", timeout=0)  # AB still waits
        r.reply(b"GRANTED-MANY 2 120 A B")
        r.lock_many("renewal", "A B", timeout=0)

    def test_unexpected(self) -> None:
        """A many-reply that fits neither the head nor the waiting request (its keys, their order, its kind) is not trusted."""
        for line in [
            b"GRANTED-MANY 2 120 B A",
            b"GRANTED-MANY 1 120 A",
            b"GRANTED-MANY 3 120 A B C",
            b"TIMEOUT-MANY 1 A",
            b"GRANTED 1 0 A 120",
            b"TIMEOUT 1 0 A",
        ]:
            for waiting in (False, True):
                r = Recorder()
                r.lock_many("AB", "A B")
                if waiting:
                    r.reply(b"STATUS 1 1 A")
                self.assertRaises(UnexpectedReply, r.reply, line)
        r = Recorder()
        r.lock("A", "A")
        self.assertRaises(UnexpectedReply, r.reply, b"GRANTED-MANY 1 120 A")
        r = Recorder()
        r.lock_many("AB", "A B")
        self.assertRaises(UnexpectedReply, r.reply, b"STATUS 1 0 B")  # the fence is the first key's

    def test_abandoned(self) -> None:
        """An abandoned lock-many (by any of its keys) that is granted later has all its keys released."""
        r = Recorder()
        r.lock_many("AB", "A B")
        r.reply(b"STATUS 1 1 A")
        r.pipeline.abandon("B")
        self.assertRaises(KeyBusy, r.lock, "again", "A")
        r.sent = b""
        r.reply(b"GRANTED-MANY 2 120 A B 1 2")
        self.assertEqual(r.sent, b"release A\nrelease B\n")
        r.reply(b"RELEASED 0 0 A", b"RELEASED 0 0 B")
        self.assertEqual(r.results, {})
        self.assertFalse(r.pipeline.outstanding())
        r.lock_many("timeout", "C D", timeout=1)
        r.pipeline.abandon("C")
        r.sent = b""
        r.reply(b"STATUS 1 1 C", b"TIMEOUT-MANY 2 C D")
        self.assertEqual((r.sent, r.results), (b"", {}))

    def test_fail_all(self) -> None:
        r = Recorder()
        r.lock_many("granted", "A B")
        r.lock_many("waiting", "C D")
        r.reply(b"GRANTED-MANY 2 120 A B", b"STATUS 1 0 A", b"STATUS 1 1 C")
        lost = ConnectionLost("server", "gone")
        r.pipeline.fail_all(lost)
        self.assertEqual(r.results["granted"].keys, ("A", "B"))
        self.assertIs(r.results["waiting"], lost)
        self.assertRaises(ConnectionLost, r.lock_many, "later", "E")


class FencingTests(SynchronousTestCase):
    def test_on(self) -> None:
        """fencing on, answered FENCING ON; then a GRANTED carries the token."""
        r = Recorder()
        r.pipeline.fencing(True, *r.callbacks("fencing"))
        r.lock("A", "A")
        self.assertEqual(r.sent, b"fencing on\nlock A 1 -1 120\nstatus A\n")
        r.reply(b"FENCING ON", b"GRANTED 1 0 A 120 18446744073709551615", b"STATUS 1 0 A")
        self.assertIs(r.results["fencing"], True)
        self.assertEqual(r.results["A"].token, 2**64 - 1)

    def test_off(self) -> None:
        r = Recorder()
        r.pipeline.fencing(False, *r.callbacks("fencing"))
        self.assertEqual(r.sent, b"fencing off\n")
        r.reply(b"FENCING OFF")
        self.assertIs(r.results["fencing"], False)

    def test_older_server(self) -> None:
        """A server without fencing answers INVALID_COMMAND; the grants after it have no token."""
        r = Recorder()
        r.pipeline.fencing(True, *r.callbacks("fencing"))
        r.lock("A", "A")
        r.reply(b"INVALID_COMMAND", b"GRANTED 1 0 A 120", b"STATUS 1 0 A")
        self.assertEqual(r.results["fencing"].message, "INVALID_COMMAND")
        self.assertIsNone(r.results["A"].token)

    def test_unexpected(self) -> None:
        r = Recorder()
        self.assertRaises(UnexpectedReply, r.reply, b"FENCING ON")
        r.pipeline.status("A", *r.callbacks("A"))
        self.assertRaises(UnexpectedReply, r.reply, b"FENCING ON")
        r = Recorder()
        r.pipeline.fencing(True, *r.callbacks("fencing"))
        self.assertRaises(UnexpectedReply, r.reply, b"STATUS 0 0 on")


class InMemoryServer:
    """The real protocol and lock service, on StringTransports and a fake clock."""

    def __init__(self) -> None:
        self.clock = task.Clock()
        self.service = LockService(self.clock)
        self.factory = JESyncFactory(self.service)

    def connect(self) -> Connection:
        return Connection(self)


class Connection:
    def __init__(self, server: InMemoryServer) -> None:
        self.transport = StringTransport()
        self.protocol = server.factory.buildProtocol(None)
        self.protocol.makeConnection(self.transport)
        self.outbox = b""
        self.pipeline = Pipeline(self._send)

    def _send(self, data: bytes) -> None:
        self.outbox += data

    def deliver(self) -> bool:
        """The server reads what the client wrote; True if there was anything."""
        data, self.outbox = self.outbox, b""
        if data:
            self.protocol.dataReceived(data)
        return bool(data)

    def read(self) -> bool:
        """The client reads what the server wrote; True if there was anything."""
        replies = self.transport.value()
        self.transport.clear()
        for line in replies.split(b"\n")[:-1]:
            self.pipeline.line_received(line)
        return bool(replies)

    def pump(self) -> bool:
        return self.deliver() | self.read()


requests = st.one_of(
    st.tuples(
        st.just("lock"),
        st.integers(0, 1),  # connection
        st.sampled_from("ab"),  # key
        st.sampled_from([0, 1, 2]),  # max_concurrent (0 is refused by the server)
        st.sampled_from([-1, 0, 1, 2]),  # timeout
        st.sampled_from([0, 1, 3]),  # expires
    ),
    st.tuples(
        st.just("lock-many"),
        st.integers(0, 1),
        st.lists(st.sampled_from("abc"), min_size=1, max_size=3).map(lambda keys: tuple(dict.fromkeys(keys))),
        st.sampled_from([-1, 0, 1, 2]),  # timeout
        st.sampled_from([0, 1, 3]),  # expires
    ),
    st.tuples(st.just("fencing"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 1), st.sampled_from("abc")),
    st.tuples(st.just("status"), st.integers(0, 1), st.sampled_from("ab")),
    st.tuples(st.just("listing"), st.integers(0, 1), st.sampled_from(["key", "requests", "grants"])),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 2.5])),
    # The network: requests reach the server, and replies the client, whenever.
    st.tuples(st.just("deliver"), st.integers(0, 1)),
    st.tuples(st.just("read"), st.integers(0, 1)),
)


class AgainstTheServerTests(SynchronousTestCase):
    def test_late_answer_while_another_lock_heads_the_queue(self) -> None:
        """
        A waits for B; while its lock A is still unanswered, the late GRANTED
        B arrives first: it goes to lock B, and lock A gets its own answer.
        """
        server = InMemoryServer()
        waiter, holder = server.connect(), server.connect()
        results: dict[str, Any] = {}
        holder.pipeline.lock("B", 1, -1, 120, lambda r: results.setdefault("holder", r), results.setdefault)
        holder.pump()
        waiter.pipeline.lock("B", 1, -1, 120, lambda r: results.setdefault("B", r), results.setdefault)
        waiter.pump()
        self.assertEqual(server.service.status("B").waiting, 1)
        holder.pipeline.release("B", lambda r: None, results.setdefault)
        waiter.pipeline.lock("A", 1, -1, 120, lambda r: results.setdefault("A", r), results.setdefault)
        holder.deliver()  # GRANTED B is written to the waiter ...
        waiter.deliver()  # ... before the server answers lock A
        waiter.read()
        self.assertEqual((results["A"].key, results["B"].key), ("A", "B"))

    def test_second_lock_while_waiting_is_refused(self) -> None:
        """The server would not answer it (the connection already waits for the key)."""
        server = InMemoryServer()
        waiter, holder = server.connect(), server.connect()
        holder.pipeline.lock("B", 1, -1, 120, lambda r: None, lambda e: None)
        waiter.pipeline.lock("B", 1, 5, 120, lambda r: None, lambda e: None)
        holder.pump()
        waiter.pump()
        for timeout in (-1, 0, 5):
            self.assertRaises(KeyBusy, waiter.pipeline.lock, "B", 1, timeout, 120, lambda r: None, lambda e: None)

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(requests, max_size=60))
    def test_every_request_settles_once_with_its_own_reply(self, script: list[tuple[Any, ...]]) -> None:
        """
        Random requests from two pipelined connections, delivered to the
        server and read back at random moments: no reply is ever unmatched, each request settles at most
        once and with a reply about its own key (a C{GRANTED} for a lock, a
        C{TIMEOUT} only for a lock, C{INVALID_PARAMETER} only for the
        malformed one), and once the connections close everything has
        settled.
        """
        server = InMemoryServer()
        connections = [server.connect() for _ in range(2)]
        settled: dict[int, Any] = {}
        asked: dict[int, tuple[Any, ...]] = {}

        def callbacks(number: int, request: tuple[Any, ...]) -> tuple[Any, Any]:
            asked[number] = request

            def result(value: Any) -> None:
                assert number not in settled, request
                settled[number] = value
                if request[0] == "lock":
                    assert value.key == request[2], (request, value)
                    assert value.word == "GRANTED" and value.status.granted >= 1, (request, value)
                elif request[0] == "lock-many":
                    assert value.word == "GRANTED-MANY" and value.keys == request[2], (request, value)
                    assert len(value.tokens) == len(request[2]), (request, value)
                    assert len({token is None for token in value.tokens}) == 1, (request, value)
                elif request[0] == "status":
                    assert value.key == request[2], (request, value)
                elif request[0] == "fencing":
                    assert value is request[2], (request, value)

            def error(failure: Exception) -> None:
                assert number not in settled, request
                settled[number] = failure
                if isinstance(failure, LockManyTimeout):
                    assert request[0] == "lock-many" and tuple(failure.keys) == request[2], (request, failure)
                elif isinstance(failure, LockTimeout):
                    assert request[0] == "lock" and failure.key == request[2], (request, failure)
                elif isinstance(failure, ServerError):
                    assert request[0] == "lock" and request[3] == 0, (request, failure)

            return result, error

        for number, request in enumerate(script):
            if request[0] == "advance":
                server.clock.advance(request[1])
            elif request[0] == "deliver":
                connections[request[1]].deliver()
            elif request[0] == "read":
                connections[request[1]].read()
            else:
                connection = connections[request[1]]
                pipeline = connection.pipeline
                try:
                    if request[0] == "lock":
                        _, _, key, max_concurrent, timeout, expires = request
                        pipeline.lock(key, max_concurrent, timeout, expires, *callbacks(number, request))
                    elif request[0] == "lock-many":
                        _, _, keys, timeout, expires = request
                        pipeline.lock_many(keys, timeout, expires, *callbacks(number, request))
                    elif request[0] == "fencing":
                        pipeline.fencing(request[2], *callbacks(number, request))
                    elif request[0] == "release":
                        pipeline.release(request[2], *callbacks(number, request))
                    elif request[0] == "status":
                        pipeline.status(request[2], *callbacks(number, request))
                    else:
                        pipeline.listing(request[2], *callbacks(number, request))
                except KeyBusy:
                    asked.pop(number, None)
        while any([c.pump() for c in connections]):
            pass
        server.clock.advance(10)  # every wait with a timeout ends
        while any([c.pump() for c in connections]):
            pass
        for connection in connections:
            self.assertFalse(connection.pipeline.owes_reply)
            connection.pipeline.fail_all(ConnectionLost("memory", "closed"))
        self.assertEqual(sorted(settled), sorted(asked))
