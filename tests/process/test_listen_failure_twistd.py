"""
C{twistd jesync} that cannot listen, as a subprocess: it says why in one
line on stderr and in its log, stops the endpoints that did listen, never
logs its startup summary, and exits with status 1 (in the foreground and
daemonized); an option error is brief; C{--port ssl:...} without the tls
extra says how to install it.  The same rules in one process are
L{tests.tcp.test_listen_failure} (and L{tests.unit.test_listen_failure}).

Nothing here sleeps for a fixed time: every step waits for the process to
end, a log line or a file to go, with a bounded timeout.
"""

from __future__ import annotations

import os
import signal

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ProcessTerminated
from twisted.internet.task import deferLater

from tests.servers import free_port
from tests.support import IN_USE, accepts, short_temp_dir, taken_port
from tests.twistd_process import REPOSITORY, TwistdTestCase, assert_usage_error_status

# How long a twistd that cannot listen may take to end (it ends before its
# reactor runs; this only bounds a slow machine).
ENDS_WITHIN = 20.0


# An endpoint plugin that fails to listen a moment after it is asked, as an
# endpoint that listens in its own time can (every endpoint type of
# Twisted's own fails at once).
SLOW_FAILING_PLUGIN = """
from twisted.internet import defer, error
from twisted.internet.interfaces import IStreamServerEndpoint, IStreamServerEndpointStringParser
from twisted.plugin import IPlugin
from zope.interface import implementer


@implementer(IStreamServerEndpoint)
class SlowFailing:
    def __init__(self, reactor, delay):
        self.reactor = reactor
        self.delay = float(delay)

    def listen(self, factory):
        listening = defer.Deferred()
        self.reactor.callLater(
            self.delay, listening.errback, error.CannotListenError("", 0, OSError(98, "Address already in use"))
        )
        return listening


@implementer(IPlugin, IStreamServerEndpointStringParser)
class Parser:
    prefix = "jesync-test-slowfail"

    def parseStreamServer(self, reactor, delay="0.1"):
        return SlowFailing(reactor, delay)


parser = Parser()
"""


class TwistdTests(TwistdTestCase):
    """C{twistd jesync} as a subprocess, on a port something else holds."""

    timeout = 90

    @inlineCallbacks
    def assert_not_started(self, process, message: bytes):
        """It ends, soon, with status 1, having said C{message} on stderr and in its log, and never started."""
        reason = yield process.wait_ended(timeout=ENDS_WITHIN)
        output = process.text()
        self.assertIsInstance(reason, ProcessTerminated, output)
        self.assertEqual(reason.exitCode, 1, output)
        self.assertIn(b"#critical] jesync not started: " + message + b"\n", process.output)
        self.assertEqual(process.errors, b"twistd jesync: not started: " + message + b"\n")
        self.assertNotIn("jesync starting", output)
        self.assertNotIn("Traceback", output)
        self.assertNotIn("Unhandled", output)

    @inlineCallbacks
    def test_port_taken(self):
        port = taken_port(self)
        process = self.run_server("--port", str(port))
        yield self.assert_not_started(process, b"cannot listen on tcp:%d: %s" % (port, IN_USE.encode()))

    @inlineCallbacks
    def test_second_listener_taken(self):
        """The endpoints that did listen stop listening: nothing keeps listening, no socket file stays."""
        port = taken_port(self)
        free = free_port()
        process = self.run_server(
            "--port",
            f"tcp:{free}:interface=127.0.0.1",
            "--port",
            "unix:j.sock",
            "--elock-port",
            f"tcp:{port}:interface=127.0.0.1",
        )
        yield self.assert_not_started(
            process, b"cannot listen on tcp:%d:interface=127.0.0.1: %s" % (port, IN_USE.encode())
        )
        self.assertIn(b"JESyncFactory starting on %d\n" % free, process.output)
        self.assertFalse(accepts(free))
        self.assertFalse(os.path.exists(os.path.join(process.directory, "j.sock")))

    @inlineCallbacks
    def test_no_pid_file_left(self):
        """With twistd's default pid file (twistd.pid), a server that did not start removes it."""
        port = taken_port(self)
        process = self.spawn("-n", "jesync", "--port", f"tcp:{port}:interface=127.0.0.1")
        yield self.assert_not_started(
            process, b"cannot listen on tcp:%d:interface=127.0.0.1: %s" % (port, IN_USE.encode())
        )
        self.assertEqual(os.listdir(process.directory), [])

    @inlineCallbacks
    def test_daemonized(self):
        """Daemonized, twistd's first process exits with status 1 and the reason; the log has it too."""
        port = taken_port(self)
        process = self.spawn(
            "--pidfile=d.pid", "--logfile=d.log", "jesync", "--port", f"tcp:{port}:interface=127.0.0.1"
        )
        pid_file = os.path.join(process.directory, "d.pid")

        def kill_daemon() -> None:  # (only if it started after all)
            try:
                with open(pid_file) as file:
                    os.kill(int(file.read()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

        self.addCleanup(kill_daemon)
        reason = yield process.wait_ended(timeout=ENDS_WITHIN)
        message = b"cannot listen on tcp:%d:interface=127.0.0.1: %s" % (port, IN_USE.encode())
        self.assertIsInstance(reason, ProcessTerminated, process.text())
        self.assertEqual(reason.exitCode, 1, process.text())
        self.assertIn(b"An error has occurred: ", process.errors)
        self.assertIn(message, process.errors)
        # The daemon removes its pid file just after telling the first process.
        deadline = reactor.seconds() + ENDS_WITHIN
        while os.path.exists(pid_file) and reactor.seconds() < deadline:
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertFalse(os.path.exists(pid_file))
        with open(os.path.join(process.directory, "d.log"), "rb") as file:
            log = file.read()
        self.assertIn(b"#critical] jesync not started: " + message + b"\n", log)
        self.assertNotIn(b"jesync starting", log)

    @inlineCallbacks
    def test_fails_once_running(self):
        """An endpoint that fails only once the reactor runs: twistd stops, with status 1."""
        plugins = os.path.join(short_temp_dir(self), "twisted", "plugins")
        os.makedirs(plugins)
        with open(os.path.join(plugins, "jesync_test_slowfail.py"), "w") as file:
            file.write(SLOW_FAILING_PLUGIN)
        free = free_port()
        process = self.spawn(
            "-n",
            "--pidfile=",
            "jesync",
            "--port",
            f"tcp:{free}:interface=127.0.0.1",
            "--elock-port",
            "jesync-test-slowfail:0.1",
            PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(plugins)), REPOSITORY]),
        )
        yield self.assert_not_started(process, b"cannot listen on jesync-test-slowfail:0.1: address already in use")
        self.assertIn(b"JESyncFactory starting on %d\n" % free, process.output)
        self.assertIn(b"Main loop terminated.", process.output)
        self.assertFalse(accepts(free))

    @inlineCallbacks
    def test_option_error_is_brief(self):
        """An option error: the error and a hint, exit status 1; not the whole --help."""
        process = self.spawn("jesync", "--max-keys=-1")
        assert_usage_error_status(self, (yield process.wait_ended()))
        self.assertEqual(
            process.errors,
            b"twistd jesync: --max-keys -1: must be 0 (no limit) or more\n"
            b"Run 'twistd jesync --help' for the options.\n",
        )
        self.assertEqual(process.output, process.errors)

    @inlineCallbacks
    def test_ssl_without_tls_extra(self):
        """Without pyOpenSSL (hidden here by a stand-in that fails to import), ssl: says how to get it."""
        hiding = short_temp_dir(self)
        os.makedirs(os.path.join(hiding, "OpenSSL"))
        with open(os.path.join(hiding, "OpenSSL", "__init__.py"), "w") as file:
            file.write("raise ImportError('No module named OpenSSL (hidden by the test)')\n")
        process = self.spawn(
            "-n",
            "--pidfile=",
            "jesync",
            "--port",
            "ssl:11443:privateKey=key.pem:certKey=cert.pem",
            PYTHONPATH=os.pathsep.join([hiding, REPOSITORY]),
        )
        assert_usage_error_status(self, (yield process.wait_ended()))
        self.assertEqual(
            process.errors,
            b"twistd jesync: --port ssl:11443:privateKey=key.pem:certKey=cert.pem: TLS needs pyOpenSSL: "
            b"pip install 'jesync[tls]'\n"
            b"Run 'twistd jesync --help' for the options.\n",
        )
