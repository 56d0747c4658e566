"""
L{jesync.cluster.txn_channel}: etcd transactions written from pre-encoded
pieces, pipelined on one connection and answered in turn, on a fake clock
and an in-memory transport; with several requests in flight when time runs
out or the connection goes, the unanswered fail in order, the answered one
stands, and nothing of an abandoned connection is used again; and the
journal over it, whose unanswered transactions go again through the client,
in order, within its cap on what is in flight.  (tests/etcd/
test_cluster_journal.py runs the journal, and so this channel, against a
real etcd.)
"""

from __future__ import annotations

import base64
import json
from typing import Any, List, Tuple, cast

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.cluster.etcd import (
    _COMPARE_FIELDS,
    Compare,
    Delete,
    EtcdClient,
    EtcdError,
    Get,
    Operation,
    Put,
    TxnResult,
    _encode_compare,
    _encode_operation,
)
from jesync.cluster.journal import MAX_IN_FLIGHT, Journal, Layout
from jesync.cluster.txn_channel import ChannelError, TxnChannel, _Connection
from jesync.service import LockService
from jesync.sessions import SessionTable
from tests.fake_etcd import FakeEtcd


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def answer(body: dict, chunked: bool = False) -> bytes:
    data = json.dumps(body).encode()
    if not chunked:
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    middle = len(data) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (data[:middle], data[middle:]))
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


SUCCESS = {"header": {"revision": "12"}, "succeeded": True, "responses": [{"response_put": {}}, {"response_put": {}}]}
REFUSED = {
    "header": {"revision": "12"},
    "responses": [
        {"response_range": {"kvs": [{"key": b64(b"/l"), "value": b64(b"me"), "create_revision": "3", "mod_revision": "3"}]}},
        {"response_range": {}},
    ],
}
COMPARE = [Compare(b"/l", "CREATE", 3), Compare(b"/c", "VALUE", b"3:1:0")]
SUCCESS_OPS: List[Operation] = [Put(b"/held/a", b"17"), Delete(b"/held/b"), Put(b"/c", b"3:2:0")]
FAILURE_OPS = [Get(b"/l"), Get(b"/c")]


class ChannelTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.observed: List[str] = []
        self.channel = TxnChannel(self.clock, [("127.0.0.1", 2379)], 0.5, lambda op, s: self.observed.append(op))
        self.connection = _Connection(self.channel)
        self.transport = StringTransport()
        self.connection.makeConnection(self.transport)
        self.channel._connection = self.connection  # (as if connected)

    def requests(self) -> List[dict]:
        """The bodies written so far, as JSON."""
        data = self.transport.value()
        bodies = []
        while data:
            head, _, rest = data.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"POST /v3/kv/txn HTTP/1.1\r\n"), head)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            bodies.append(json.loads(rest[:length]))
            data = rest[length:]
        return bodies

    def test_a_request_is_what_the_client_would_send(self) -> None:
        self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        [body] = self.requests()
        expected_success = [_encode_operation(operation) for operation in SUCCESS_OPS]
        for put in expected_success:
            put.get("request_put", {}).pop("lease", None)  # (0: the default, left out)
        self.assertEqual(
            body,
            {
                "compare": [_encode_compare(condition) for condition in COMPARE],
                "success": expected_success,
                "failure": [_encode_operation(operation) for operation in FAILURE_OPS],
            },
        )

    def test_requests_are_pipelined_and_answered_in_turn(self) -> None:
        results: List[TxnResult] = []
        for _ in range(3):
            self.channel.txn(COMPARE, SUCCESS_OPS[:1] + SUCCESS_OPS[2:], FAILURE_OPS).addCallback(results.append)
        self.assertEqual(len(self.requests()), 3)  # all written, none answered yet
        self.connection.dataReceived(answer(SUCCESS) + answer(REFUSED, chunked=True)[:50])
        self.assertEqual([result.succeeded for result in results], [True])
        self.connection.dataReceived(answer(REFUSED, chunked=True)[50:] + answer(SUCCESS, chunked=True))
        self.assertEqual([result.succeeded for result in results], [True, False, True])
        leader, commit = results[1].responses
        self.assertEqual(([kv.value for kv in leader or []], commit), ([b"me"], []))
        self.assertEqual(results[0].revision, 12)
        self.assertEqual(self.observed, ["txn"] * 3)
        self.assertFalse(self.transport.disconnecting)

    def test_no_answer_in_time_fails_every_waiting_request_and_drops_the_connection(self) -> None:
        first = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        self.clock.advance(0.3)
        second = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        self.clock.advance(0.25)  # the first's deadline
        for waiting in (first, second):
            self.failureResultOf(waiting, ChannelError)
        self.assertIsNone(self.channel._connection)
        self.assertEqual(self.channel._endpoint, 0)  # (one endpoint: the next is the same)

    def test_a_lost_connection_fails_every_waiting_request(self) -> None:
        waiting = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        self.connection.connectionLost(Failure(ConnectionError("reset")))
        failure = self.failureResultOf(waiting, ChannelError)
        self.assertIn("lost", failure.getErrorMessage())
        self.assertIsNone(self.channel._connection)

    def test_what_is_not_http_fails_the_request(self) -> None:
        waiting = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        self.connection.dataReceived(b"SSH-2.0-OpenSSH\r\n\r\n")
        self.failureResultOf(waiting, ChannelError)
        self.assertTrue(self.transport.disconnecting or self.connection.lost)

    def test_data_answering_no_request_drops_the_connection(self) -> None:
        self.connection.dataReceived(answer(SUCCESS))
        self.assertTrue(self.connection.lost)

    def test_etcds_error_is_an_etcd_error(self) -> None:
        waiting = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        error = {"error": "etcdserver: too many operations in txn request", "code": 3, "message": "too many"}
        self.connection.dataReceived(answer(error))
        failure = self.failureResultOf(waiting, EtcdError)
        self.assertFalse(failure.check(ChannelError))
        self.assertFalse(self.connection.lost)  # (the connection is fine)

    def test_close_fails_what_waits(self) -> None:
        waiting = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        self.channel.close()
        self.failureResultOf(waiting, ChannelError)
        self.failureResultOf(self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS), ChannelError)

    def test_on_an_etcd_learned_slow_a_request_waits_as_long_as_the_clients_attempts(self) -> None:
        """
        Beside an etcd client that has learned etcd slow on every request
        (EtcdClient.attempt_bound: 1.5 s), a request waits that long, not
        the channel's 0.5 s: else every transaction would be sent here in
        vain and again by the client.
        """
        learned = [0.4]
        self.channel._slow_etcd = lambda: learned[0]
        fast = self.channel.txn(COMPARE, SUCCESS_OPS, FAILURE_OPS)
        self.clock.advance(0.5)
        self.failureResultOf(fast, ChannelError)  # (0.4 learned: the channel's own 0.5 s)
        self.connection = _Connection(self.channel)
        self.connection.makeConnection(StringTransport())
        self.channel._connection = self.connection
        learned[0] = 1.5
        slow = self.channel.txn(COMPARE, SUCCESS_OPS[:1] + SUCCESS_OPS[2:], FAILURE_OPS)
        self.clock.advance(1.4)
        self.assertNoResult(slow)
        self.connection.dataReceived(answer(SUCCESS))
        self.assertTrue(self.successResultOf(slow).succeeded)

    def test_beside_an_etcd_client_the_channel_follows_what_it_learned(self) -> None:
        client = EtcdClient(self.clock, ["http://127.0.0.1:2379"], 4.0)
        self.addCleanup(client.close)
        channel = TxnChannel.beside(client)
        assert channel is not None
        self.assertEqual(channel.answer_within(), 0.5)  # (a quarter of 4 s, at most 0.5)
        client._answered.extend([0.6] * 8)  # eight answers, each 0.6 s late
        self.assertEqual((client.attempt_bound(), channel.answer_within()), (2.0, 2.0))

    def test_only_plain_http_endpoints(self) -> None:
        self.assertIsNone(TxnChannel.for_endpoints(self.clock, ["https://e:2379"], 1.0))
        channel = TxnChannel.for_endpoints(self.clock, ["http://a:2379", "http://b"], 1.0)
        assert channel is not None
        self.assertEqual(channel.endpoints, [("a", 2379), ("b", 80)])
        self.assertIsNone(TxnChannel.beside(object()))


# -- several requests in flight when time runs out or the connection goes --------
#
# The channel on a MemoryReactorClock: each connection it opens is taken
# from the reactor's connectTCP calls and made on a StringTransport, so a
# test sees what was written on which connection, and answers it when it
# says.  The channel never retries (its module docstring): what it could
# not answer fails with ChannelError, and the caller (the journal, below)
# sends it again through the client.


def tagged(n: int) -> List[Put]:
    """A transaction's success operations, told apart by their last write (as the journal's tags)."""
    return [Put(b"/held/a", b"17"), Put(b"/c", b"%d" % n)]


def written(data: bytes) -> List[dict]:
    """The request bodies in C{data}, as JSON, in order."""
    bodies = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"POST /v3/kv/txn HTTP/1.1\r\n"), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        bodies.append(json.loads(rest[:length]))
        data = rest[length:]
    return bodies


def tag_of(body: dict) -> bytes:
    return base64.b64decode(body["success"][-1]["request_put"]["value"])


class Wire:
    """The channel's connection number C{index} (from 0), made now on an in-memory transport."""

    def __init__(self, reactor: MemoryReactorClock, index: int) -> None:
        host, port, factory, _, _ = reactor.tcpClients[index]
        self.address = (host, port)
        self.protocol: Any = factory.buildProtocol(IPv4Address("TCP", host, port))  # (the endpoint's wrapper)
        assert self.protocol is not None
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)

    def tags(self) -> List[bytes]:
        """The tags of the requests written on this connection, in order."""
        return [tag_of(body) for body in written(self.transport.value())]

    def receive(self, data: bytes) -> None:
        self.protocol.dataReceived(data)


class PipelinedTimeoutTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.channel = TxnChannel(self.reactor, [("127.0.0.1", 2379), ("127.0.0.2", 2379)], 0.5)
        # What each request's Deferred fired with, in the order they fired: (tag, revision or error).
        self.fired: List[Tuple[int, object]] = []

    def post(self, n: int) -> None:
        def done(result: object) -> None:
            if isinstance(result, Failure):
                self.fired.append((n, result.type))
            else:
                self.fired.append((n, cast(TxnResult, result).revision))

        self.channel.txn(COMPARE, tagged(n), FAILURE_OPS).addBoth(done)

    def test_silence_past_the_deadline_fails_the_unanswered_in_order_and_not_the_answered_one(self) -> None:
        for n in (1, 2, 3):
            self.post(n)
        self.assertEqual(len(self.reactor.tcpClients), 1)  # one connection for all three
        old = Wire(self.reactor, 0)
        self.assertEqual(old.tags(), [b"1", b"2", b"3"])  # pipelined: all written at once, in order
        old.receive(answer(SUCCESS))
        self.assertEqual(self.fired, [(1, 12)])
        self.reactor.advance(0.49)
        self.assertEqual(self.fired, [(1, 12)])
        self.reactor.advance(0.02)  # the second's deadline (0.5 s after it was written)
        self.assertEqual(self.fired, [(1, 12), (2, ChannelError), (3, ChannelError)])
        self.assertTrue(old.transport.disconnected)  # abandoned with its connection
        self.assertIsNone(self.channel._connection)
        # The channel sends nothing again itself; the next requests go on a
        # fresh connection, to the next endpoint, and are answered there.
        self.assertEqual(len(self.reactor.tcpClients), 1)
        self.post(2)
        self.post(3)
        self.assertEqual(len(self.reactor.tcpClients), 2)
        fresh = Wire(self.reactor, 1)
        self.assertEqual(fresh.address, ("127.0.0.2", 2379))
        self.assertEqual(fresh.tags(), [b"2", b"3"])
        later = dict(SUCCESS, header={"revision": "13"})
        fresh.receive(answer(later) + answer(dict(SUCCESS, header={"revision": "14"})))
        self.assertEqual(self.fired[3:], [(2, 13), (3, 14)])
        self.assertEqual(old.tags(), [b"1", b"2", b"3"])  # nothing more on the old one

    def test_an_answer_on_the_abandoned_connection_is_never_matched_to_a_later_request(self) -> None:
        self.post(1)
        self.post(2)
        old = Wire(self.reactor, 0)
        self.reactor.advance(0.5)
        self.assertEqual(self.fired, [(1, ChannelError), (2, ChannelError)])
        self.post(3)
        fresh = Wire(self.reactor, 1)
        self.assertEqual(fresh.tags(), [b"3"])
        # The old connection's answers arrive late (the abort not yet taken
        # effect): ignored, neither fired nor taken for the fresh one's.
        old.receive(answer(SUCCESS) + answer(REFUSED))
        self.assertEqual(len(self.fired), 2)
        self.assertIs(self.channel._connection, fresh.protocol._wrappedProtocol)
        fresh.receive(answer(dict(SUCCESS, header={"revision": "20"})))
        self.assertEqual(self.fired[2:], [(3, 20)])

    def test_a_connection_lost_with_requests_in_flight_fails_them_in_order_and_the_next_go_on_a_fresh_one(self) -> None:
        for n in range(1, 6):
            self.post(n)
        old = Wire(self.reactor, 0)
        old.receive(answer(SUCCESS) + answer(REFUSED)[:30])  # the first answered, the second half
        old.protocol.connectionLost(Failure(ConnectionError("reset")))
        self.assertEqual(self.fired, [(1, 12)] + [(n, ChannelError) for n in range(2, 6)])
        self.assertIsNone(self.channel._connection)
        self.post(6)
        fresh = Wire(self.reactor, 1)
        self.assertEqual(fresh.tags(), [b"6"])
        fresh.receive(answer(SUCCESS))
        self.assertEqual(self.fired[5:], [(6, 12)])
        self.reactor.advance(1)  # no timer of the lost connection is left to fire
        self.assertEqual(len(self.fired), 6)

    def test_each_request_on_a_connection_has_its_own_deadline(self) -> None:
        self.post(1)
        wire = Wire(self.reactor, 0)
        self.reactor.advance(0.3)
        self.post(2)
        self.reactor.advance(0.1)
        wire.receive(answer(SUCCESS))  # the first, in time
        self.reactor.advance(0.39)  # 0.79 s: the second has waited 0.49 s
        self.assertEqual(self.fired, [(1, 12)])
        self.assertFalse(wire.transport.disconnected)
        self.reactor.advance(0.02)
        self.assertEqual(self.fired, [(1, 12), (2, ChannelError)])
        self.assertTrue(wire.transport.disconnected)

    def test_a_request_waiting_for_a_connection_that_never_opens_fails_with_the_others(self) -> None:
        self.post(1)
        self.reactor.advance(0.3)
        self.post(2)
        self.reactor.advance(0.2)  # the connection attempt's deadline
        self.assertEqual(self.fired, [(1, ChannelError), (2, ChannelError)])
        self.post(3)
        self.assertEqual(len(self.reactor.tcpClients), 2)
        fresh = Wire(self.reactor, 1)
        self.assertEqual((fresh.address, fresh.tags()), (("127.0.0.2", 2379), [b"3"]))

    def test_a_request_queued_while_connecting_fails_at_its_own_deadline(self) -> None:
        self.post(1)
        self.reactor.advance(0.4)
        wire = Wire(self.reactor, 0)  # connected late, within the connection attempt's deadline
        self.assertEqual(wire.tags(), [b"1"])
        self.reactor.advance(0.09)
        self.assertEqual(self.fired, [])
        self.reactor.advance(0.02)  # 0.51 s after it was posted
        self.assertEqual(self.fired, [(1, ChannelError)])
        self.assertTrue(wire.transport.disconnected)

    def test_a_half_received_answer_when_time_runs_out_is_never_used(self) -> None:
        for chunked in (False, True):
            self.fired.clear()
            self.post(1)
            self.post(2)
            wire = Wire(self.reactor, len(self.reactor.tcpClients) - 1)
            second = answer(REFUSED, chunked=chunked)
            cut = second.index(b"\r\n\r\n") + 4 + 20  # the head and part of the body
            wire.receive(answer(SUCCESS) + second[:cut])
            self.assertEqual(self.fired, [(1, 12)])
            self.reactor.advance(0.5)
            self.assertEqual(self.fired, [(1, 12), (2, ChannelError)])
            wire.receive(second[cut:])  # the rest, late: not used
            self.assertEqual(len(self.fired), 2)
            # A fresh connection parses from scratch: its first answer is its first request's.
            self.post(3)
            fresh = Wire(self.reactor, len(self.reactor.tcpClients) - 1)
            self.assertEqual(fresh.tags(), [b"3"])
            fresh.receive(answer(dict(SUCCESS, header={"revision": "30"}), chunked=chunked))
            self.assertEqual(self.fired[2:], [(3, 30)])
            self.reactor.advance(0.5)  # (nothing left waiting: no failure)
            self.assertEqual(len(self.fired), 3)
            fresh.protocol.connectionLost(Failure(ConnectionError("closed")))  # (the next round connects anew)


# -- the journal over the channel: what the channel could not answer goes again -----
#
# The journal (jesync.cluster.journal) sends its chain through a real
# channel whose connections are Wires answered from a fake etcd's store,
# and sends what the channel failed through that fake etcd as the client
# (tests/unit/test_cluster_journal.py has the chain's rules alone).


def decode_compare(item: dict) -> Compare:
    target = item["target"]
    raw = item.get(_COMPARE_FIELDS[target], "")
    value = base64.b64decode(raw) if target == "VALUE" else int(raw or 0)
    return Compare(base64.b64decode(item["key"]), target, value, item.get("result", "EQUAL"))


def decode_operation(item: dict) -> Operation:
    if "request_put" in item:
        put = item["request_put"]
        return Put(base64.b64decode(put["key"]), base64.b64decode(put.get("value", "")))
    if "request_delete_range" in item:
        span = item["request_delete_range"]
        return Delete(base64.b64decode(span["key"]), prefix="range_end" in span)
    span = item["request_range"]
    return Get(base64.b64decode(span["key"]), prefix="range_end" in span)


def encode_result(result: TxnResult) -> dict:
    responses: List[dict] = []
    for found in result.responses:
        if found is None:
            responses.append({"response_put": {}})
        else:
            kvs = [
                {"key": b64(kv.key), "value": b64(kv.value), "create_revision": str(kv.create_revision), "mod_revision": str(kv.mod_revision)}
                for kv in found
            ]
            responses.append({"response_range": {"kvs": kvs}})
    return {"header": {"revision": str(result.revision)}, "succeeded": result.succeeded, "responses": responses}


class EtcdWire(Wire):
    """A connection of the channel to the fake etcd C{etcd}, which applies and answers what is written when told."""

    def __init__(self, reactor: MemoryReactorClock, index: int, etcd: FakeEtcd) -> None:
        super().__init__(reactor, index)
        self.etcd = etcd
        self.applied: List[bytes] = []  # the answers of the requests applied so far, in order

    def apply(self) -> None:
        """etcd applies the next request written (its answer kept for L{reply})."""
        body = written(self.transport.value())[len(self.applied)]
        result = self.etcd.evaluate(
            [decode_compare(item) for item in body["compare"]],
            [decode_operation(item) for item in body["success"]],
            [decode_operation(item) for item in body["failure"]],
        )
        self.applied.append(answer(encode_result(result)))

    def reply(self, first: int, last: int) -> None:
        """The answers of the requests applied, C{first} to C{last} (from 0, inclusive), arrive."""
        self.receive(b"".join(self.applied[first : last + 1]))


class JournalOverChannelTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.etcd = FakeEtcd()
        self.layout = Layout("c")
        self.election = self.etcd.put(self.layout.leader, b"this member")
        self.locks = LockService(self.reactor)
        self.sessions = SessionTable(self.reactor, self.locks)
        self.failures: List[str] = []
        self.channel = TxnChannel(self.reactor, [("127.0.0.1", 2379)], 0.5)
        self.journal = Journal(
            self.etcd,  # type: ignore[arg-type]
            self.layout,
            self.election,
            self.locks,
            self.reactor,
            on_failure=self.failures.append,
            channel=self.channel,
        )
        self.locks.observer = self.journal
        self.addCleanup(self.journal.stop)
        self.replied: List[str] = []  # the replies released, in order

    def turn(self, key: str) -> None:
        """A lock in a reactor turn of its own (a batch, one transaction); its reply noted in L{replied}."""
        session = self.sessions.start(object())
        self.addCleanup(session.end)
        self.locks.request(key, session, 1, 0, 0)
        waiting = self.journal.durable()
        assert waiting is not None
        waiting.addCallback(lambda _: self.replied.append(key))
        self.reactor.advance(0)

    def test_the_unanswered_go_again_through_the_client_in_order_and_the_answered_one_does_not(self) -> None:
        for key in "abc":
            self.turn(key)
        wire = EtcdWire(self.reactor, 0, self.etcd)
        tags = wire.tags()
        self.assertEqual(len(tags), 3)  # pipelined
        wire.apply()
        wire.reply(0, 0)
        self.assertEqual(self.replied, ["a"])
        self.reactor.advance(0.5)  # the connection silent: the other two abandoned
        self.assertEqual([request.tag for request in self.etcd.sent], tags[1:])  # in order, not the first
        self.assertEqual(self.replied, ["a"])
        for request in self.etcd.sent:
            request.commit()
        self.assertEqual(self.replied, ["a", "b", "c"])
        self.assertEqual((self.journal.transactions, self.failures), (3, []))
        # What comes next goes on a fresh connection.
        self.turn("d")
        self.assertEqual(len(self.reactor.tcpClients), 2)
        fresh = EtcdWire(self.reactor, 1, self.etcd)
        fresh.apply()
        fresh.reply(0, 0)
        self.assertEqual((self.replied, self.failures), (["a", "b", "c", "d"], []))

    def test_a_lost_connection_sends_its_requests_again_in_order_within_the_cap_on_what_is_in_flight(self) -> None:
        keys = [f"k{n}" for n in range(MAX_IN_FLIGHT + 2)]
        for key in keys:
            self.turn(key)
        wire = EtcdWire(self.reactor, 0, self.etcd)
        tags = wire.tags()
        self.assertEqual(len(tags), MAX_IN_FLIGHT)  # the last two wait, as one batch
        wire.protocol.connectionLost(Failure(ConnectionError("reset")))
        self.assertEqual([request.tag for request in self.etcd.sent], tags)  # all again, in order
        self.assertEqual(len(self.reactor.tcpClients), 1)  # nothing more: eight are in flight
        self.etcd.sent[0].commit()
        self.assertEqual(self.replied, keys[:1])
        self.assertEqual(len(self.reactor.tcpClients), 2)  # a place came free: the waiting batch goes
        fresh = EtcdWire(self.reactor, 1, self.etcd)
        self.assertEqual(len(fresh.tags()), 1)
        for request in self.etcd.sent[1:]:
            request.commit()
        self.assertEqual(self.replied, keys[:MAX_IN_FLIGHT])
        fresh.apply()
        fresh.reply(0, 0)
        self.assertEqual((self.replied, self.failures), (keys, []))
        self.assertEqual(len(self.etcd.sent), MAX_IN_FLIGHT)

    def test_copies_applied_on_the_abandoned_connection_are_harmless_and_their_late_answers_ignored(self) -> None:
        for key in "abc":
            self.turn(key)
        wire = EtcdWire(self.reactor, 0, self.etcd)
        for _ in range(3):
            wire.apply()  # all three in etcd...
        wire.reply(0, 0)  # ...but only the first's answer arrives in time
        self.reactor.advance(0.5)
        self.assertEqual(len(self.etcd.sent), 2)
        for request in self.etcd.sent:
            request.commit()  # refused (the commit key holds the third's tag): applied already
        self.assertEqual((self.replied, self.failures), (["a", "b", "c"], []))
        wire.reply(1, 2)  # the old connection's answers, late: ignored
        self.turn("d")
        fresh = EtcdWire(self.reactor, 1, self.etcd)
        fresh.apply()
        fresh.reply(0, 0)
        self.assertEqual((self.replied, self.failures), (["a", "b", "c", "d"], []))
        self.assertEqual(self.journal.resent, 0)
