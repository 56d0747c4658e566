"""
The grammars on their own: a grammar needs only something that looks like
its connection (a service, a policy, somewhere to write), no transport.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections.policy import ConnectionPolicy
from jesync.protocols.elock import ELockFactory, ELockProtocol, quote_word
from jesync.protocols.jesync import JESyncProtocol
from jesync.service import LockService


class FakeConnection:
    """What a grammar uses of its connection, recording what it is asked to do."""

    verbose = False
    authenticated = True
    may_wait = True
    peer = "fake:1"

    def __init__(self, service: LockService, factory: object = None) -> None:
        self.service = service
        self.policy = ConnectionPolicy()
        self.factory = factory
        self.written: list[bytes] = []
        self.owed: list[Deferred] = []
        self.closed_with: bytes | None = None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    # (no journal: single-process mode answers at once)
    write_durable = write

    def write_stream(self, pieces, held=None) -> None:
        self.written.extend(pieces)
        if held is not None:
            held.release()

    def await_reply(self, reply: Deferred) -> None:
        if not reply.called:
            self.owed.append(reply)

    def close(self, last: bytes = b"") -> None:
        self.closed_with = last

    def authenticate(self, token: bytes | None) -> bool:
        return True

    def take(self) -> bytes:
        data, self.written = b"".join(self.written), []
        return data


class JESyncGrammarTests(SynchronousTestCase):
    def test_requests(self) -> None:
        service = LockService(Clock())
        first, second = FakeConnection(service), FakeConnection(service)
        grammar, other = JESyncProtocol(first), JESyncProtocol(second)
        grammar.frame_received(b"lock k 1 -1 30")
        self.assertEqual(first.take(), b"GRANTED 1 0 k 30\n")
        other.frame_received(b"lock k")
        self.assertEqual((second.take(), len(second.owed)), (b"", 1))
        grammar.frame_received(b"status-by-key")
        grammar.frame_received(b"release k")
        self.assertEqual(first.take(), b"STATUS 1 1 k\nEND\nRELEASED 1 0 k\n")
        self.assertEqual(second.take(), b"GRANTED 1 0 k 120\n")
        grammar.frame_received(b"lock k 0")
        grammar.frame_received(b"quit")
        self.assertEqual(first.take(), b"INVALID_PARAMETER: Max concurrent should be greater or equal than 1\n")
        self.assertEqual(first.closed_with, b"")


class ELockGrammarTests(SynchronousTestCase):
    def test_requests(self) -> None:
        service = LockService(Clock())
        factory = ELockFactory(service)
        connection = FakeConnection(service, factory)
        grammar = ELockProtocol(connection)
        grammar.frame_received(b"lock k")
        grammar.frame_received(b"unlock j")
        grammar.frame_received(b'say"hi')
        self.assertEqual(connection.take(), b'200 Acquired\r\n403 not_locked\r\n400 Unknown command: "say\\"hi"\r\n')
        grammar.frame_received(b"quit")
        self.assertEqual(connection.closed_with, b"200 Hey, it was nice seeing you.\r\n")

    def test_quote_word(self) -> None:
        self.assertEqual(quote_word(b"lock"), b'"lock"')
        self.assertEqual(quote_word(b'a"b\\c'), b'"a\\"b\\\\c"')
        self.assertEqual(quote_word(b"\t\r\x1b\xe9\xff"), b'"\\t\\r\\e\xe9\xff"')
        self.assertEqual(quote_word(b"a\x01b"), b"[97,1,98]")
        self.assertEqual(quote_word(b"\x7f"), b"[127]")
        self.assertEqual(quote_word(b"\x9f\xa0"), b"[159,160]")
        self.assertEqual(quote_word(b""), b'""')
