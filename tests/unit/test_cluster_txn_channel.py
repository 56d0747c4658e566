"""
L{jesync.cluster.txn_channel}: etcd transactions written from pre-encoded
pieces, pipelined on one connection and answered in turn, on a fake clock
and an in-memory transport.  (tests/etcd/test_cluster_journal.py runs the
journal, and so this channel, against a real etcd.)
"""

from __future__ import annotations

import base64
import json
from typing import List

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.cluster.etcd import (
    Compare,
    Delete,
    EtcdError,
    Get,
    Put,
    TxnResult,
    _encode_compare,
    _encode_operation,
)
from jesync.cluster.txn_channel import ChannelError, TxnChannel, _Connection


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
SUCCESS_OPS = [Put(b"/held/a", b"17"), Delete(b"/held/b"), Put(b"/c", b"3:2:0")]
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

    def test_only_plain_http_endpoints(self) -> None:
        self.assertIsNone(TxnChannel.for_endpoints(self.clock, ["https://e:2379"], 1.0))
        channel = TxnChannel.for_endpoints(self.clock, ["http://a:2379", "http://b"], 1.0)
        assert channel is not None
        self.assertEqual(channel.endpoints, [("a", 2379), ("b", 80)])
        self.assertIsNone(TxnChannel.beside(object()))
