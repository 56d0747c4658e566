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
from socket import SO_RCVBUF, SO_SNDBUF, SOL_SOCKET

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


class WatchTests(CoordinationTestCase):
    @inlineCallbacks
    def test_events_in_order(self):
        """A hand-over (RELEASED, then GRANTED), an expiry, and LOST after a disconnect."""
        watcher, first, second = yield self.clients(3)
        self.assertEqual((yield watcher.ask(b"watch k\n")), b"WATCHING k\n")
        yield first.ask(b"fencing on\nlock k 1 -1 60 one\n", count=2)
        one = peer_of(first)
        second.send(b"lock k 1 -1 1\n")
        self.assertEqual((yield second.ask(b"status k\n")), b"STATUS 1 1 k\n")
        yield first.ask(b"release k\n")
        self.assertEqual((yield second.read_line()), b"GRANTED 1 0 k 1\n")
        events = yield watcher.read_lines(4)  # (the expiry: a second later)
        two = peer_of(second)
        tokens = [line.split()[4] for line in events]
        self.assertEqual(tokens[0], tokens[1])
        self.assertEqual(tokens[2], tokens[3])
        self.assertEqual(
            [line.split()[:4] + line.split()[5:] for line in events],
            [
                [b"EVENT", b"GRANTED", b"k", one, b"exclusive", b"one"],
                [b"EVENT", b"RELEASED", b"k", one],
                [b"EVENT", b"GRANTED", b"k", two, b"exclusive"],
                [b"EVENT", b"EXPIRED", b"k", two],
            ],
        )
        yield second.ask(b"lock-shared k\n")
        self.assertEqual((yield watcher.read_line()).split()[:4], [b"EVENT", b"GRANTED", b"k", two])
        yield second.disconnect()
        lost = yield watcher.read_line()
        self.assertEqual(lost.split()[:4], [b"EVENT", b"LOST", b"k", two])
        self.assertEqual((yield watcher.ask(b"status k\n")), b"STATUS 0 0 k\n")

    @inlineCallbacks
    def test_event_before_the_reply_that_observes_it(self):
        """An event is read before the reply to any later request on the watcher's connection that sees its change."""
        watcher, worker = yield self.clients(2)
        yield watcher.ask(b"watch k\n")
        for _ in range(50):
            yield worker.ask(b"lock k\n")
            self.assertEqual((yield watcher.ask(b"status k\n")), b"EVENT GRANTED k %s %s exclusive\n" % (
                peer_of(worker), str(self.service.holders("k")[0].token).encode()))
            self.assertEqual((yield watcher.read_line()), b"STATUS 1 0 k\n")
            yield worker.ask(b"release k\n")
            self.assertEqual((yield watcher.ask(b"status k\n")).split()[:2], [b"EVENT", b"RELEASED"])
            self.assertEqual((yield watcher.read_line()), b"STATUS 0 0 k\n")

    @inlineCallbacks
    def test_prefix_appeared_and_disappeared(self):
        watcher, worker, waiter = yield self.clients(3)
        self.assertEqual((yield watcher.ask(b"watch-prefix jobs/\n")), b"WATCHING-PREFIX jobs/\n")
        yield worker.ask(b"lock other\nlock jobs/1 1 -1 60 %E2%9C%93\n", count=2)
        waiter.send(b"lock jobs/1\n")
        self.assertEqual((yield waiter.ask(b"status jobs/1\n")), b"STATUS 1 1 jobs/1\n")
        yield worker.ask(b"release jobs/1\n")
        yield waiter.read_line()
        yield waiter.ask(b"release jobs/1\n")
        events = yield watcher.read_lines(6)
        self.assertEqual(
            [line.split()[:3] for line in events],
            [[b"EVENT", b"APPEARED", b"jobs/1"], [b"EVENT", b"GRANTED", b"jobs/1"],
             [b"EVENT", b"RELEASED", b"jobs/1"], [b"EVENT", b"GRANTED", b"jobs/1"],
             [b"EVENT", b"RELEASED", b"jobs/1"], [b"EVENT", b"DISAPPEARED", b"jobs/1"]],
        )
        self.assertEqual(events[1].split()[5:], [b"exclusive", b"%E2%9C%93"])
        self.assertEqual((yield watcher.ask(b"unwatch-prefix jobs/\n")), b"UNWATCHED-PREFIX jobs/\n")

    @inlineCallbacks
    def test_caps(self):
        self.service.max_watches = 2
        self.service.max_total_watches = 3
        first, second = yield self.clients(2)
        self.assertEqual(
            (yield first.ask(b"watch a\nwatch-prefix b\nwatch c\n", count=3)),
            b"WATCHING a\nWATCHING-PREFIX b\nINVALID_PARAMETER: max-watches exceeded (2)\n",
        )
        self.assertEqual(
            (yield second.ask(b"watch a\nwatch d\n", count=2)),
            b"WATCHING a\nINVALID_PARAMETER: max-total-watches exceeded (3)\n",
        )
        served = self.server.protocol_for(first)
        yield first.disconnect()
        yield self.server.wait_server_lost([served])  # (its watches end with it)
        self.assertEqual((yield second.ask(b"unwatch a\nwatch d\n", count=2)), b"UNWATCHED a\nWATCHING d\n")

    @inlineCallbacks
    def test_watcher_that_does_not_read_is_dropped(self):
        """
        Past --max-unsent its connection is dropped (and what it held given
        back); the clients that read are answered throughout, and what they
        hold stays theirs.
        """
        self.server.policy.max_unsent = 20000
        self.server.port.socket.setsockopt(SOL_SOCKET, SO_SNDBUF, 8192)
        watcher, worker, other = yield self.clients(3)
        watcher.transport.getHandle().setsockopt(SOL_SOCKET, SO_RCVBUF, 8192)
        key = b"k" * 1000
        yield watcher.ask(b"lock mine\nwatch " + key + b"\n", count=2)
        served = self.server.protocol_for(watcher)
        watcher.transport.pauseProducing()  # (it stops reading)
        yield worker.ask(b"lock held\n")
        other.send(b"lock mine\n")
        self.assertEqual((yield other.ask(b"status mine\n")), b"STATUS 1 1 mine\n")
        batch = (b"lock " + key + b"\nrelease " + key + b"\n") * 50
        for _ in range(100):
            if self.server.lost[served].called:
                break
            replies = yield worker.ask(batch, count=100)
            self.assertEqual(replies.count(b"\n"), 100)
            self.assertNotIn(b"EVENT", replies)
        yield self.server.wait_server_lost([served])
        self.assertGreater(served.behind, 20000)  # (dropped for being behind, not for anything else)
        self.assertEqual((yield other.read_line()), b"GRANTED 1 0 mine 120\n")
        self.assertEqual((yield worker.ask(b"status held\n")), b"STATUS 1 0 held\n")
        self.assertEqual(self.service.watch_count, 0)


class UnchangedTests(CoordinationTestCase):
    @inlineCallbacks
    def test_old_replies_byte_for_byte(self):
        """
        A client that uses none of the extensions reads what it always did,
        while others hold keys shared, set values and watch every key.
        """
        watcher, reader, old, other = yield self.clients(4)
        yield watcher.ask(b"watch-prefix\n")
        yield reader.ask(b"lock-shared s -1 60 label\n")
        yield other.ask(b"lock v 1 -1 60 value\n")
        transcript = [
            (b"lock report 1 -1 60\n", b"GRANTED 1 0 report 60\n"),
            (b"lock report 2 -1 60\n", b"GRANTED 1 0 report 60\n"),
            (b"lock sem 3 -1 0\n", b"GRANTED 1 0 sem 0\n"),
            (b"status report\n", b"STATUS 1 0 report\n"),
            (b"holders report\n", b"HOLDER report %s 0 60 %%s\nEND\n" % peer_of(old)),
            (b"owned sem\n", b"OWNED -1 sem\n"),
            (b"lock-many 0 30 a b\n", b"GRANTED-MANY 2 30 a b\n"),
            (b"lock s 1 0\n", b"TIMEOUT 1 0 s\n"),
            (b"release nothing\n", b"NOT_RELEASED 0 0 nothing\n"),
            (b"release a\n", b"RELEASED 0 0 a\n"),
            (b"status-by-key\n", b"STATUS 1 0 b\nSTATUS 1 0 report\nSTATUS 1 0 s\nSTATUS 1 0 sem\nSTATUS 1 0 v\nEND\n"),
            (b"lock k 1 -1 0 extra more\n", b"INVALID_PARAMETER: too many arguments\n"),
            (b"bogus\n", b"INVALID_COMMAND\n"),
        ]
        for request, expected in transcript:
            if b"%s" in expected:
                expected = expected % str(self.service.holders("report")[0].token).encode()
            got = yield old.ask(request, count=expected.count(b"\n"))
            if request.startswith(b"status-by-key"):
                # (the shared key's line is marked; the lines of keys held exclusive are as ever)
                expected = expected.replace(b"STATUS 1 0 s\n", b"STATUS 1 0 s shared\n")
            self.assertEqual(got, expected, request)
        self.assertEqual((yield old.ask(b"status report\n")), b"STATUS 1 0 report\n")
        self.assertEqual(old.unread(), b"")
