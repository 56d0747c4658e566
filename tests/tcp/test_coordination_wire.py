"""
JESync's coordination extensions over real TCP, against a server listening
in this process (C{JESyncFactory(LockService(reactor))}, the memcached
listener beside it on the same lock table): shared locks (fairness between
modes, no writer starvation, no upgrade deadlock, a token per holder),
holder values and their limit, watches and their events (in order, before
the reply of a later request that observes them), a watcher that does not
read, the watch caps, and that a client using none of it reads exactly
the replies it always did.

Nothing sleeps: every step waits for the line it expects, with a bounded
timeout; that a line is I{not} sent is shown by order (the next line read
is the reply to a later command).
"""

from __future__ import annotations

import os

from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from jesync.protocols.memcache import MemcacheFactory
from jesync.store import ObjectStore
from jesync.wire import encode_value
from tests.support import TIMEOUT, LineClient, TCPServer, peer_of


class CoordinationTestCase(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.server = yield TCPServer.start(self)
        self.service = self.server.service

    def tearDown(self) -> None:
        self.assertEqual(self.flushLoggedErrors(), [])

    def connect(self) -> Deferred:
        return self.server.connect()

    @inlineCallbacks
    def clients(self, count: int):
        clients = yield self.server.connect_many(count)
        return clients


class SharedLockTests(CoordinationTestCase):
    @inlineCallbacks
    def test_fair_with_mixed_modes(self):
        """
        One arrival order per key: readers R1 R2 hold; writer W waits; R3,
        arriving after W, waits behind it (no writer starvation); W2 waits
        behind R3; once the readers go, W gets it alone, then R3 (and only R3,
        W2 being exclusive), then W2.
        """
        r1, r2, w, r3, w2 = yield self.clients(5)
        self.assertEqual((yield r1.ask(b"lock-shared k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield r2.ask(b"lock-shared k\n")), b"GRANTED 2 0 k 120\n")
        w.send(b"lock k\n")
        self.assertEqual((yield w.ask(b"status k\n")), b"STATUS 2 1 k shared\n")
        r3.send(b"lock-shared k\n")
        self.assertEqual((yield r3.ask(b"status k\n")), b"STATUS 2 2 k shared\n")
        w2.send(b"lock k\n")
        self.assertEqual((yield w2.ask(b"status k\n")), b"STATUS 2 3 k shared\n")
        self.assertEqual((yield r1.ask(b"release k\n")), b"RELEASED 1 3 k\n")
        self.assertEqual((yield r2.ask(b"release k\n")), b"RELEASED 1 2 k\n")
        self.assertEqual((yield w.read_line()), b"GRANTED 1 2 k 120\n")
        self.assertEqual((yield w.ask(b"release k\n")), b"RELEASED 1 1 k\n")
        self.assertEqual((yield r3.read_line()), b"GRANTED 1 1 k 120\n")
        self.assertEqual((yield r3.ask(b"release k\n")), b"RELEASED 1 0 k\n")
        self.assertEqual((yield w2.read_line()), b"GRANTED 1 0 k 120\n")

    @inlineCallbacks
    def test_readers_at_the_head_are_granted_together(self):
        writer, r1, r2, r3 = yield self.clients(4)
        yield writer.ask(b"lock k\n")
        for reader in (r1, r2, r3):
            reader.send(b"lock-shared k\n")
        self.assertEqual((yield r3.ask(b"status k\n")), b"STATUS 1 3 k\n")
        self.assertEqual((yield writer.ask(b"release k\n")), b"RELEASED 3 0 k\n")
        replies = yield gatherResults([r1.read_line(), r2.read_line(), r3.read_line()])
        self.assertEqual(sorted(replies), [b"GRANTED 3 0 k 120\n"] * 3)

    @inlineCallbacks
    def test_no_upgrade_deadlock(self):
        """Two readers both asking to write are refused at once; they keep their shared grants; nothing hangs."""
        first, second = yield self.clients(2)
        yield first.ask(b"lock-shared k\n")
        yield second.ask(b"lock-shared k\n")
        refusal = b"INVALID_PARAMETER: 'k' is held shared by this owner: no upgrade or downgrade to exclusive;" \
                  b" release it first\n"
        first.send(b"lock k\n")
        second.send(b"lock k\n")
        self.assertEqual((yield first.read_line()), refusal)
        self.assertEqual((yield second.read_line()), refusal)
        self.assertEqual((yield first.ask(b"status k\n")), b"STATUS 2 0 k shared\n")

    @inlineCallbacks
    def test_a_token_per_shared_holder(self):
        first, second = yield self.clients(2)
        yield first.ask(b"fencing on\n")
        yield second.ask(b"fencing on\n")
        one = (yield first.ask(b"lock-shared k\n")).split()[-1]
        two = (yield second.ask(b"lock-shared k\n")).split()[-1]
        self.assertLess(int(one), int(two))
        holders = yield first.ask(b"holders k\n", count=3)
        self.assertEqual(
            holders,
            b"HOLDER k %s 0 120 %s shared\nHOLDER k %s 0 120 %s shared\nEND\n"
            % (peer_of(first), one, peer_of(second), two),
        )

    @inlineCallbacks
    def test_memcached_write_refused_while_held_shared(self):
        store = ObjectStore(self.service)
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(MemcacheFactory(store))
        self.addCleanup(port.stopListening)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port, timeout=int(TIMEOUT))
        cache = yield connectProtocol(endpoint, LineClient())
        self.addCleanup(cache.disconnect)
        self.assertEqual((yield cache.ask(b"set k 0 0 1\r\na\r\n")), b"STORED\r\n")
        reader = yield self.connect()
        yield reader.ask(b"lock-shared k\n")
        self.assertEqual((yield cache.ask(b"set k 0 0 1\r\nb\r\n")), b"LOCKED\r\n")
        self.assertEqual((yield cache.ask(b"delete k\r\n")), b"LOCKED\r\n")
        yield reader.ask(b"release k\n")
        self.assertEqual((yield cache.ask(b"set k 0 0 1\r\nc\r\n")), b"STORED\r\n")


class ValueTests(CoordinationTestCase):
    @inlineCallbacks
    def test_any_bytes_round_trip(self):
        leader, reader = yield self.clients(2)
        value = bytes(range(256)) + os.urandom(1000)
        field = encode_value(value)
        self.assertEqual((yield leader.ask(b"lock leader 1 -1 60 " + field + b"\n")), b"GRANTED 1 0 leader 60\n")
        line, end = yield reader.ask(b"holders leader\n", count=2).addCallback(lambda text: text.split(b"\n")[:2])
        self.assertEqual(end, b"END")
        self.assertEqual(line.split(b" ")[6:], [b"exclusive", field])
        self.assertEqual(self.service.holders("leader")[0].value, value)

    @inlineCallbacks
    def test_limit(self):
        """
        4096 bytes, decoded.  (The 8192-byte line bounds the encoded field
        too: 4096 printable bytes always fit; a binary value, 3 bytes a byte
        encoded, up to about 2700 bytes.)
        """
        client = yield self.connect()
        most = b"v" * 4096
        self.assertEqual((yield client.ask(b"lock k 1 -1 60 " + most + b"\n")), b"GRANTED 1 0 k 60\n")
        self.assertEqual(
            (yield client.ask(b"lock-shared j -1 60 " + most + b"%00\n")),
            b"INVALID_PARAMETER: A value should be at most 4096 bytes\n",
        )
        self.assertEqual(
            (yield client.ask(b"lock-shared j -1 60 " + b"%00" * 2700 + b"\n")), b"GRANTED 1 0 j 60\n"
        )
        self.assertEqual(len(self.service.holders("j")[0].value), 2700)
        yield client.ask(b"release j\n")
        self.assertEqual((yield client.ask(b"status j\n")), b"STATUS 0 0 j\n")
