"""
The one authentication deadline of every listener (docs/protocols/index.md, Lifecycle):
with a token, a connection that has not completed a request carrying (or
preceded by) a right token within --auth-timeout is closed, with its
protocol's limit reply, however recently it sent a byte.  JESync, elock,
dlock, memcached (text and binary) and the admin listener, on a
L{twisted.internet.task.Clock}; over real TCP in
L{tests.tcp.test_auth_deadlines}.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.policy import ConnectionPolicy, Connections
from jesync.service import LockService
from tests.auth_listeners import Listener, listeners, sasl_plain
from tests.support import TOKEN, UnitClient

TIMEOUT_REPLY = b"auth-timeout exceeded (1)"


LISTENERS = listeners(TIMEOUT_REPLY)


class ClockTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.connections = Connections()
        self.policy = ConnectionPolicy(auth_token=TOKEN, auth_timeout=1, connections=self.connections)

    def connect(self, listener: Listener, port: int) -> UnitClient:
        factory = listener.factory(self.service, self.policy)
        peer = IPv4Address("TCP", "127.0.0.1", port)
        transport = StringTransport(peerAddress=peer)
        protocol = factory.buildProtocol(peer)  # type: ignore[attr-defined]
        protocol.makeConnection(transport)
        return UnitClient(protocol, transport)

    def assertTimedOut(self, listener: Listener, data: bytes) -> None:
        if listener.timed_out is not None:
            self.assertEqual(data, listener.timed_out, listener.name)
        else:
            from tests.dlock_messages import parse_responses

            [response] = parse_responses(data)
            self.assertEqual((response.request_id, response.error_text), (0, TIMEOUT_REPLY.decode()))

    def test_an_unfinished_request_trickled_is_closed_at_the_auth_timeout(self) -> None:
        for port, listener in enumerate(LISTENERS, 40001):
            start = self.clock.seconds()
            client = self.connect(listener, port)
            client.send(listener.unfinished)
            for _ in range(3):
                self.clock.advance(0.25)
                client.send(listener.trickle)
            self.clock.advance(0.24)
            client.send(listener.trickle)
            self.assertFalse(client.closing, listener.name)
            self.assertEqual(client.take(), b"", listener.name)
            self.clock.advance(start + 1 - self.clock.seconds())
            self.assertTrue(client.closing, listener.name)
            self.assertTimedOut(listener, client.take())
            client.lose()
        self.assertEqual(len(self.connections), 0)

    def test_a_silent_connection_is_closed_at_the_auth_timeout(self) -> None:
        for port, listener in enumerate(LISTENERS, 40001):
            client = self.connect(listener, port)
            self.clock.advance(0.999)
            self.assertFalse(client.closing, listener.name)
            self.clock.advance(0.001)
            self.assertTrue(client.closing, listener.name)
            if listener.name == "memcached binary":
                # (nothing sent: it cannot be told from a text client)
                self.assertEqual(client.take(), b"SERVER_ERROR " + TIMEOUT_REPLY + b"\r\n")
                continue
            self.assertTimedOut(listener, client.take())

    def test_a_binary_client_cut_short_before_its_header_is_not_answered_in_text(self) -> None:
        client = self.connect(LISTENERS[4], 40100)
        client.send(sasl_plain(TOKEN)[:10])
        self.clock.advance(1)
        self.assertTrue(client.closing)
        self.assertEqual(client.take(), b"")

    def test_a_request_with_the_right_token_meets_it(self) -> None:
        clients = []
        for port, listener in enumerate(LISTENERS, 40001):
            client = self.connect(listener, port)
            self.clock.advance(0.5)
            answer = client.ask(listener.authenticate)
            if listener.name == "dlock":
                from tests.dlock_messages import parse_responses

                self.assertEqual(parse_responses(answer)[0].error_text, "")
            else:
                self.assertTrue(answer.startswith(listener.accepted), (listener.name, answer))
            clients.append(client)
        self.clock.advance(10)
        self.assertEqual([client.closing for client in clients], [False] * len(LISTENERS))

    def test_without_a_token_there_is_no_deadline(self) -> None:
        self.policy.auth_token = None
        clients = [self.connect(listener, port) for port, listener in enumerate(LISTENERS, 40001)]
        self.clock.advance(50)  # (within dlock's idle timeout, 60 s)
        self.assertEqual([client.closing for client in clients], [False] * len(LISTENERS))
