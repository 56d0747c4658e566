"""
L{jesync.reactor} over real descriptors (socket pairs, a real epoll): an
exception from one descriptor's C{doRead} is logged under its prefix, that
descriptor is disconnected and unregistered, and the others ready in the same
poll are still read; the reactor then polls on.  (The unit tier has the same
with a fake poller, beside Twisted's reactor.)
"""

from __future__ import annotations

import socket
from typing import Any, Dict, List

from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.reactor import JESyncEPollReactor


class Reader:
    """One end of a socket pair, as a reader; C{fail} makes its C{doRead} raise."""

    def __init__(self, name: str, fail: bool) -> None:
        self.name = name
        self.fail = fail
        self.mine, self.peer = socket.socketpair()
        self.mine.setblocking(False)
        self.received: List[bytes] = []
        self.lost: List[Failure] = []

    def fileno(self) -> int:
        return self.mine.fileno()

    def logPrefix(self) -> str:
        return self.name

    def doRead(self) -> None:
        data = self.mine.recv(100)
        if self.fail:
            raise RuntimeError(f"{self.name} failed on {data!r}")
        self.received.append(data)

    def connectionLost(self, reason: Failure) -> None:
        self.lost.append(reason)

    def close(self) -> None:
        self.mine.close()
        self.peer.close()


class RealDescriptorTests(SynchronousTestCase):
    def test_a_failing_reader_among_others(self) -> None:
        reactor = JESyncEPollReactor()
        self.addCleanup(reactor._poller.close)
        self.addCleanup(reactor.waker.connectionLost, None)
        readers = [Reader("first", False), Reader("failing", True), Reader("last", False)]
        for reader in readers:
            self.addCleanup(reader.close)
            reactor.addReader(reader)
            reader.peer.send(b"x")
        logged: List[Dict[str, Any]] = []
        globalLogPublisher.addObserver(logged.append)
        try:
            reactor.doIteration(0)
            for reader in readers:
                reader.peer.send(b"y")
            reactor.doIteration(0)
        finally:
            globalLogPublisher.removeObserver(logged.append)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

        first, failing, last = readers
        self.assertEqual((first.received, last.received), ([b"x", b"y"], [b"x", b"y"]))
        self.assertEqual((first.lost, last.lost), ([], []))
        self.assertEqual([reason.type for reason in failing.lost], [RuntimeError])
        self.assertNotIn(failing, reactor.getReaders())
        self.assertEqual(set(reactor.getReaders()) - {reactor.waker}, {first, last})
        errors = [event for event in logged if event.get("isError")]
        self.assertEqual([event["log_system"] for event in errors], ["failing"])
