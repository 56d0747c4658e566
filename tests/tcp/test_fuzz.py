"""
Fuzzing both wire protocols over real TCP (the streams of
L{tests.unit.test_fuzz}, fewer of them): raw connections send fuzzed streams
to an in-process server (both protocols over one lock service) and shut
down their sending side; every reply is well-formed, and afterwards fresh
clients are served correctly and nothing is left held.  The many examples,
over L{StringTransport}s and a L{Clock}, are in L{tests.unit.test_fuzz}.
"""

from __future__ import annotations

from typing import Callable

from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

from jesync import ELockFactory, JESyncFactory, LockService
from jesync.connections.policy import ConnectionPolicy
from tests.fuzz_streams import (
    ELOCK_LINE,
    FUZZ,
    JESYNC_LINE,
    assert_reply,
    chunkings,
    chunks,
    elock_commands,
    jesync_commands,
    reply_lines,
    streams,
)
from tests.support import TIMEOUT, ConnectionTracker, LineClient


def examples(strategy: st.SearchStrategy, count: int) -> list:
    """C{count} examples of C{strategy}, the same every run (for tests that cannot be @given)."""
    found: list = []

    @settings(FUZZ, max_examples=count, phases=[Phase.generate])
    @given(strategy)
    def collect(example) -> None:
        found.append(example)

    collect()
    return found


def pick(cases: list[tuple[bytes, list[int]]], count: int) -> list[tuple[bytes, list[int]]]:
    """
    C{count} of the streams: mostly the ones with the most lines (hypothesis
    starts with the simplest examples), and some of the rest.
    """
    cases = sorted(cases, key=lambda case: -case[0].count(b"\n"))
    busiest = count * 2 // 3
    rest = cases[busiest:]
    step = max(1, len(rest) // max(1, count - busiest))
    return cases[:busiest] + rest[::step][: count - busiest]


class HoldTracker(ConnectionTracker):
    """Also records, for each server-side connection, when a reply is first owed later (a lock waiting)."""

    def __init__(self, factory) -> None:
        super().__init__(factory)
        self.held: dict[object, Deferred[None]] = {}
        build = factory.buildProtocol

        def buildProtocol(addr):
            protocol = build(addr)
            held: Deferred[None] = Deferred()
            self.held[protocol] = held
            real_await = protocol.await_reply

            def await_reply(reply: Deferred) -> None:
                real_await(reply)
                if not reply.called and not held.called:
                    held.callback(None)

            protocol.await_reply = await_reply
            return protocol

        factory.buildProtocol = buildProtocol


class TCPFuzzTests(TestCase):
    """
    Raw connections send fuzzed streams to an in-process server (both
    protocols over one lock service), one stream at a time, while another
    client holds C{a} and C{b}.  After each, fresh clients are served
    correctly, and nothing is left held.
    """

    timeout = 60

    @inlineCallbacks
    def setUp(self):
        self.service = LockService(reactor)
        policy = ConnectionPolicy()
        self.factories = {
            "jesync": JESyncFactory(self.service, policy=policy),
            "elock": ELockFactory(self.service, policy=policy),
        }
        self.trackers = {name: HoldTracker(factory) for name, factory in self.factories.items()}
        self.ports = {}
        self.clients: list[LineClient] = []
        for name, factory in self.factories.items():
            endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
            self.ports[name] = yield endpoint.listen(factory)
        self.addCleanup(self.shut_down)

    @inlineCallbacks
    def shut_down(self):
        for client in self.clients:
            if client.lost_reason is None:
                client.transport.abortConnection()
        for tracker in self.trackers.values():
            for protocol in tracker.protocols:
                if not tracker.lost[protocol].called:
                    protocol.transport.abortConnection()
            yield tracker.wait_lost()
        for port in self.ports.values():
            yield port.stopListening()
        self.assertEqual(self.service.listing(), [])
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def connect(self, name: str):
        port = self.ports[name].getHost().port
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
        self.clients.append(client)
        return client

    @inlineCallbacks
    def send_stream(self, name: str, stream: bytes, sizes: list[int]):
        holder = yield self.connect("jesync")
        self.assertEqual(
            (yield holder.ask(b"lock a 1 -1 0\nlock b 2 -1 0\n", 2)),
            b"GRANTED 1 0 a 0\nGRANTED 1 0 b 0\n",
        )
        tracker = self.trackers[name]
        built = len(tracker.protocols)
        fuzz = yield self.connect(name)
        for piece in chunks(stream, sizes):
            fuzz.send(piece)
        fuzz.transport.loseWriteConnection()
        # The server answers and closes (its input has ended), unless an elock
        # lock waits for the holder's keys: then the holder goes.
        yield self.wait_for(lambda: len(tracker.protocols) > built)
        served = tracker.protocols[built]
        yield DeferredList([tracker.lost[served], tracker.held[served]], fireOnOneCallback=True).addTimeout(
            TIMEOUT, reactor
        )
        yield holder.abort()
        yield tracker.lost[served].addTimeout(TIMEOUT, reactor)
        yield fuzz.wait_closed()
        yield self.trackers["jesync"].wait_lost()
        # (the elock session of a dropped connection waits out its grace
        # period; nobody will resume these)
        self.factories["elock"].sessions.end_detached()
        terminator = b"\n" if name == "jesync" else b"\r\n"
        received = fuzz.unread()
        # (a reset, when the server closes with requests unread, may cut the replies short)
        complete = received[: received.rfind(terminator) + len(terminator)] if terminator in received else b""
        for line in reply_lines(complete, terminator):
            assert_reply(self, line, JESYNC_LINE if name == "jesync" else ELOCK_LINE)

    def wait_for(self, condition: Callable[[], bool]) -> Deferred:
        """Fires once C{condition()} holds, checked on every reactor turn (bounded)."""
        waiting: Deferred[None] = Deferred()

        def check(turns: int) -> None:
            if condition():
                waiting.callback(None)
            elif turns > 10_000:
                waiting.errback(AssertionError("the server never accepted the connection"))
            else:
                reactor.callLater(0, check, turns + 1)

        check(0)
        return waiting

    @inlineCallbacks
    def probe(self):
        """A well-behaved client of each protocol is served as ever; nothing is held."""
        self.assertEqual(self.service.listing(), [])
        jesync = yield self.connect("jesync")
        self.assertEqual(
            (yield jesync.ask(b"status probe\nlock probe 1 0 0\nstatus-by-key\nrelease probe\n", 5)),
            b"STATUS 0 0 probe\nGRANTED 1 0 probe 0\nSTATUS 1 0 probe\nEND\nRELEASED 0 0 probe\n",
        )
        elock = yield self.connect("elock")
        self.assertEqual(
            (yield elock.ask(b"stats\r\nlock probe\r\nunlock probe\r\nquit\r\n", 8)),
            b"200 STATS\r\nSTAT clients 1\r\nSTAT locks 0\r\nSTAT monitoring 0\r\nEND\r\n"
            b"200 Acquired\r\n200 Unlocked\r\n200 Hey, it was nice seeing you.\r\n",
        )
        yield elock.wait_closed()
        yield jesync.disconnect()
        for tracker in self.trackers.values():
            yield tracker.wait_lost()
        self.assertEqual(self.service.listing(), [])
        self.assertEqual(self.service.totals(), (0, 0, 0))

    @inlineCallbacks
    def test_streams(self):
        jesync = pick(examples(st.tuples(streams(jesync_commands), chunkings), 200), 12)
        elock = pick(examples(st.tuples(streams(elock_commands), chunkings), 200), 12)
        for (jesync_stream, jesync_sizes), (elock_stream, elock_sizes) in zip(jesync, elock):
            yield self.send_stream("jesync", jesync_stream, jesync_sizes)
            yield self.probe()
            yield self.send_stream("elock", elock_stream, elock_sizes)
            yield self.probe()
        self.assertEqual(self.flushLoggedErrors(), [])
