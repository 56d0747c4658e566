"""
C{twistd jesync} run as a subprocess of the checkout, for the process tests:
L{TwistdProcess} (its output, and waits for patterns in it) and
L{TwistdTestCase} (spawns it, connects to it, stops it).
"""

from __future__ import annotations

import os
import re
import sys

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectError, ProcessDone, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from tests.support import TIMEOUT, LineClient, short_temp_dir

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


# How twistd jesync ends after an error in its options: two lines (the error
# and a hint), exit status 1, whatever the Twisted version (twistd's own
# handling prints the whole --help, and exits 0 before Twisted 26.10).
USAGE_ERROR_STATUS = 1


def assert_usage_error_status(test, reason) -> None:
    """C{reason} is how a twistd jesync refused by a usage error ends."""
    test.assertIsInstance(reason, ProcessTerminated)
    test.assertEqual(reason.exitCode, USAGE_ERROR_STATUS)


class TwistdProcess(ProcessProtocol):
    """A C{twistd} subprocess: its output so far, and waits for patterns in it."""

    def __init__(self) -> None:
        # stdout and stderr as they came; and stderr alone
        self.output = b""
        self.errors = b""
        self.ended: Deferred[Exception] = Deferred()
        self._watchers: list[tuple[re.Pattern[bytes], int, Deferred]] = []

    def outReceived(self, data: bytes) -> None:
        self.output += data
        self._check()

    def errReceived(self, data: bytes) -> None:
        self.errors += data
        self.outReceived(data)

    def processEnded(self, reason) -> None:
        for pattern, count, waiting in self._watchers:
            waiting.errback(AssertionError(f"twistd ended before {pattern.pattern!r}:\n{self.text()}"))
        self._watchers = []
        self.ended.callback(reason.value)

    def _check(self) -> None:
        for watcher in list(self._watchers):
            pattern, count, waiting = watcher
            matches = list(pattern.finditer(self.output))
            if len(matches) >= count:
                self._watchers.remove(watcher)
                waiting.callback(matches[count - 1])

    def wait_for(self, pattern: bytes, count: int = 1, timeout: float = 15) -> Deferred:
        """Fires with the C{count}th match of C{pattern} in the output."""
        waiting: Deferred = Deferred(lambda d: self._watchers.remove(entry))
        entry = (re.compile(pattern), count, waiting)
        self._watchers.append(entry)
        self._check()
        return waiting.addTimeout(timeout, reactor)

    def wait_ended(self, timeout: float = 15) -> Deferred[Exception]:
        """Fires with how the process ended (ProcessDone or ProcessTerminated)."""
        waiting: Deferred[Exception] = Deferred()

        def ended(reason: Exception) -> Exception:
            if not waiting.called:
                waiting.callback(reason)
            return reason

        self.ended.addCallback(ended)
        return waiting.addTimeout(timeout, reactor)

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def log_lines(self, pattern: bytes) -> list[bytes]:
        return [line for line in self.output.splitlines() if re.search(pattern, line)]


class TwistdTestCase(TestCase):
    """Runs C{twistd}: the helpers of L{tests.process.test_twistd.TwistdTests} and the other process tests."""

    timeout = 60

    def spawn(self, *args: str, **environment: str) -> TwistdProcess:
        process = TwistdProcess()
        directory = short_temp_dir(self)
        env = dict(os.environ, PYTHONPATH=REPOSITORY, PYTHONUNBUFFERED="1")
        env.update(environment)
        transport = reactor.spawnProcess(process, TWISTD, [TWISTD, *args], env=env, path=directory)

        @inlineCallbacks
        def stop():
            if not process.ended.called:
                transport.signalProcess("KILL")
                yield process.wait_ended()

        self.addCleanup(stop)
        process.transport = transport
        process.directory = directory
        return process

    def run_server(self, *args: str) -> TwistdProcess:
        return self.spawn("-n", "--pidfile=", "jesync", *args)

    @inlineCallbacks
    def connect(self, endpoint, retry: bool = False):
        """
        Connect a L{LineClient}.  With C{retry}, a refused connection is
        tried again for up to L{TIMEOUT} seconds: twistd logs "starting on"
        for a UNIX socket before it binds it.
        """
        deadline = reactor.seconds() + TIMEOUT
        while True:
            try:
                client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
            except ConnectError:
                if not retry or reactor.seconds() > deadline:
                    raise
                yield deferLater(reactor, 0.02, lambda: None)
            else:
                break
        self.addCleanup(lambda: client.abort() if client.lost_reason is None else None)
        return client

    @inlineCallbacks
    def terminate(self, process: TwistdProcess):
        process.transport.signalProcess("TERM")
        reason = yield process.wait_ended()
        output = process.text()
        # A graceful stop is a clean exit (status 0), after the summary.
        self.assertIsInstance(reason, ProcessDone, output)
        self.assertEqual(reason.exitCode, 0, output)
        for line in [
            "Received SIGTERM, shutting down.",
            "jesync stopped: closed ",
            "Main loop terminated.",
            "Server Shut Down.",
        ]:
            self.assertIn(line, output)
        self.assertNotIn("Traceback", output)
        self.assertNotIn("Unhandled", output)

    @inlineCallbacks
    def port(self, process, factory: bytes):
        """The port C{factory} listens on, once twistd says so."""
        match = yield process.wait_for(re.escape(factory) + rb" starting on (\d+)\n")
        return TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1)), timeout=int(TIMEOUT))

    @inlineCallbacks
    def summary(self, process) -> bytes:
        match = yield process.wait_for(rb"\] jesync starting: ([^\n]*)\n")
        return match.group(1)
