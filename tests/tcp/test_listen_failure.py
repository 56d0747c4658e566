"""
A server that cannot listen does not start: it says why in one line, stops
the endpoints that did listen, never logs its startup summary, and
C{twistd jesync} exits with status 1 (in the foreground and daemonized).
Also: the summary never shows a TLS endpoint's key or certificate paths, and
C{--port ssl:...} without the tls extra says how to install it.

Nothing here sleeps for a fixed time: every step waits for the process to
end, a log line or a file to go, with a bounded timeout.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
from unittest import mock

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import UNIXClientEndpoint, connectProtocol
from twisted.internet.error import CannotListenError, ConnectError, ProcessTerminated
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.internet.task import deferLater
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import implementer

from jesync.listening import ListenFailed, Listener, listen_error, public_endpoint
from jesync.server import ServerSettings, build_server
from tests.process import test_twistd
from tests.servers import free_port
from tests.support import TIMEOUT, LineClient
from tests.tcp.test_operations import capture_log

# How long a twistd that cannot listen may take to end (it ends before its
# reactor runs; this only bounds a slow machine).
ENDS_WITHIN = 20.0


def taken_port(test) -> int:
    """A port on 127.0.0.1 that something else listens on, for the rest of the test."""
    holder = socket.socket()
    test.addCleanup(holder.close)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    return holder.getsockname()[1]




def accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:C{port}."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


IN_USE = os.strerror(errno.EADDRINUSE).lower()


class PublicEndpointTests(SynchronousTestCase):
    """The summary never shows where a TLS endpoint's key and certificates are."""

    def test_tls_endpoints_lose_their_files(self) -> None:
        for description, shown in [
            ("ssl:11443:privateKey=/etc/jesync/key.pem:certKey=/etc/jesync/cert.pem", "ssl:11443"),
            ("ssl:11443:/etc/jesync/key.pem", "ssl:11443"),  # (ssl:'s second argument is privateKey)
            (
                "ssl:port=11443:privateKey=k.pem:certKey=c.pem:extraCertChain=chain.pem:dhParameters=dh.pem"
                ":interface=127.0.0.1:backlog=100:caCertsDir=/etc/ssl/certs:sslmethod=TLS_METHOD",
                "ssl:port=11443:interface=127.0.0.1:backlog=100",
            ),
            ("ssl:11443:privateKey=C\\:/keys/k.pem:interface=\\:\\:1", "ssl:11443:interface=\\:\\:1"),
            ("ssl:11443", "ssl:11443"),
            # another endpoint type: its port and interface only, too
            ("onion:443:hiddenServiceDir=/var/lib/secret", "onion:443"),
        ]:
            self.assertEqual(public_endpoint(description), shown, description)

    def test_plain_endpoints_as_they_are(self) -> None:
        for description in [
            "tcp:11400",
            "tcp:port=11400:interface=127.0.0.1:backlog=4096",
            "tcp6:11400:interface=\\:\\:1",
            "unix:/run/jesync/jesync.sock:mode=660:lockfile=1",
            "systemd:domain=INET:index=0",
        ]:
            self.assertEqual(public_endpoint(description), description)

    def test_summary(self) -> None:
        key = "ssl:{}:privateKey=/etc/jesync/key.pem:certKey=/etc/jesync/cert.pem:extraCertChain=/etc/jesync/ca.pem"
        summary = ServerSettings(
            ports=[key.format(11443), "tcp:11400"],
            elock_ports=[key.format(11444)],
            dlock_ports=[key.format(11445)],
            memcache_ports=[key.format(11446)],
            metrics_ports=[key.format(9400)],
        ).summary()
        self.assertNotIn("/etc/jesync", summary)
        self.assertNotIn(".pem", summary)
        self.assertTrue(
            summary.startswith(
                "JESync on ssl:11443, tcp:11400; elock on ssl:11444; dlock on ssl:11445; "
                "memcached on ssl:11446; metrics on ssl:9400; limits: "
            ),
            summary,
        )

    def test_listen_error(self) -> None:
        in_use = Failure(
            CannotListenError("127.0.0.1", 11400, OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE)))
        )
        self.assertEqual(listen_error("tcp:11400", in_use), f"cannot listen on tcp:11400: {IN_USE}")
        denied = Failure(CannotListenError("", 443, OSError(errno.EACCES, os.strerror(errno.EACCES))))
        self.assertEqual(
            listen_error("ssl:443:privateKey=/etc/k.pem", denied),
            f"cannot listen on ssl:443: {os.strerror(errno.EACCES).lower()}",
        )
        locked = Failure(CannotListenError(None, b"/run/j.sock", "Cannot acquire lock"))
        self.assertEqual(
            listen_error("unix:/run/j.sock:lockfile=1", locked),
            "cannot listen on unix:/run/j.sock:lockfile=1: Cannot acquire lock",
        )
        self.assertEqual(listen_error("tcp:1", Failure(RuntimeError("no"))), "cannot listen on tcp:1: no")


class TLSExtraTests(SynchronousTestCase):
    def test_ssl_without_pyopenssl(self) -> None:
        """Without pyOpenSSL, an ssl: endpoint is a usage error that says how to get it."""
        hidden = {name: None for name in list(sys.modules) if name == "OpenSSL" or name.startswith("OpenSSL.")}
        hidden.update({"OpenSSL": None, "OpenSSL.SSL": None})
        with mock.patch.dict(sys.modules, hidden):
            for option in ["--port", "--elock-port", "--dlock-port", "--memcache-port", "--metrics"]:
                error = self.assertRaises(
                    usage.UsageError, test_twistd.parse, option, "ssl:11443:privateKey=key.pem:certKey=cert.pem"
                )
                self.assertEqual(
                    str(error),
                    f"{option} ssl:11443:privateKey=key.pem:certKey=cert.pem: TLS needs pyOpenSSL: "
                    "pip install 'jesync[tls]'",
                )
            # other endpoints need no TLS
            self.assertEqual(test_twistd.parse("--port", "tcp:7777")["ports"], ["tcp:7777"])


@implementer(IListeningPort)
class FakePort:
    def __init__(self) -> None:
        self.stopped = 0

    def startListening(self) -> None:
        pass

    def stopListening(self) -> None:
        self.stopped += 1

    def getHost(self) -> None:
        return None


@implementer(IStreamServerEndpoint)
class LaterEndpoint:
    """An endpoint that listens, or fails to, only when the test says (as an endpoint plugin may)."""

    def __init__(self) -> None:
        self.listens: list[Deferred] = []

    def listen(self, factory) -> Deferred:
        listening: Deferred = Deferred()
        self.listens.append(listening)
        return listening


class InProcessTests(TestCase):
    """build_server's LockServer, started in this process (as an embedding application does)."""

    timeout = 60

    def server(self, **settings):
        server = build_server(reactor, ServerSettings(**settings))
        self.addCleanup(lambda: server.stopService() if server.running else None)
        return server

    @inlineCallbacks
    def test_one_endpoint_cannot_listen(self):
        """
        startService raises ListenFailed; the endpoints that did listen are
        closed (a UNIX socket's file removed); the summary is never logged.
        Once the port is free, starting again works.
        """
        log = capture_log(self)
        directory = test_twistd.short_temp_dir(self)
        path = os.path.join(directory, "j.sock")
        holder = socket.socket()
        self.addCleanup(holder.close)
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        server = self.server(ports=[f"unix:{path}"], elock_ports=[f"tcp:{port}:interface=127.0.0.1"])
        error = self.assertRaises(ListenFailed, server.startService)
        self.assertEqual(str(error), f"cannot listen on tcp:{port}:interface=127.0.0.1: {IN_USE}")
        self.assertFalse(server.running)
        self.assertFalse(os.path.exists(path))
        self.assertEqual([line for line in log if line.startswith("jesync")], [f"jesync not started: {error}"])
        self.failureResultOf(server.when_listening(), ListenFailed)
        with self.assertRaises(ConnectError):
            yield connectProtocol(UNIXClientEndpoint(reactor, path), LineClient()).addTimeout(TIMEOUT, reactor)

        holder.close()
        server.startService()
        self.assertTrue(server.running)
        self.successResultOf(server.when_listening())
        self.assertEqual(len([line for line in log if line.startswith("jesync starting: ")]), 1, log)
        client = yield connectProtocol(UNIXClientEndpoint(reactor, path), LineClient()).addTimeout(TIMEOUT, reactor)
        self.assertEqual((yield client.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        yield server.stopService()
        yield client.wait_closed()
        self.assertFalse(os.path.exists(path))

    def test_privileged_start_raises(self) -> None:
        """twistd listens in privilegedStartService (before --uid takes root away): it raises there."""
        port = taken_port(self)
        free = free_port()
        server = self.server(ports=[f"tcp:{free}:interface=127.0.0.1"], elock_ports=[f"tcp:{port}:interface=127.0.0.1"])
        self.assertRaises(ListenFailed, server.privilegedStartService)
        self.assertFalse(server.running)
        self.assertFalse(accepts(free))

    def test_every_failure_said(self) -> None:
        first, second = taken_port(self), taken_port(self)
        server = self.server(
            ports=[f"tcp:{first}:interface=127.0.0.1"],
            metrics_ports=[],
            memcache_ports=[f"tcp:{second}:interface=127.0.0.1"],
        )
        error = self.assertRaises(ListenFailed, server.startService)
        self.assertEqual(
            str(error),
            f"cannot listen on tcp:{first}:interface=127.0.0.1: {IN_USE}; "
            f"cannot listen on tcp:{second}:interface=127.0.0.1: {IN_USE}",
        )

    def test_later_failure(self) -> None:
        """An endpoint that fails after startService: when_listening says so, and the others stop."""
        log = capture_log(self)
        server = self.server(ports=["tcp:0:interface=127.0.0.1"])
        endpoint = LaterEndpoint()
        Listener("later:1:secret=x", endpoint, server.factories["jesync"]).setServiceParent(server)
        listening = server.when_listening()
        server.startService()
        self.assertNoResult(listening)
        (tcp,) = [listener.port for listener in server.listeners() if listener.port is not None]
        port = tcp.getHost().port
        self.assertTrue(accepts(port))
        (pending,) = endpoint.listens
        pending.errback(CannotListenError("", 1, OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))))
        error = self.failureResultOf(listening, ListenFailed).value
        self.assertEqual(str(error), f"cannot listen on later:1: {IN_USE}")
        self.assertFalse(accepts(port))
        self.assertEqual([line for line in log if line.startswith("jesync")], [f"jesync not started: {error}"])
        self.failureResultOf(server.when_listening(), ListenFailed)

    @inlineCallbacks
    def test_later_success(self):
        """The summary waits for every endpoint to listen."""
        log = capture_log(self)
        server = self.server(ports=["tcp:0:interface=127.0.0.1"])
        endpoint = LaterEndpoint()
        Listener("later:1", endpoint, server.factories["jesync"]).setServiceParent(server)
        server.startService()
        listening = server.when_listening()
        self.assertNoResult(listening)
        self.assertEqual([line for line in log if line.startswith("jesync")], [])
        fake = FakePort()
        endpoint.listens[0].callback(fake)
        self.successResultOf(listening)
        self.assertEqual(len([line for line in log if line.startswith("jesync starting: ")]), 1, log)
        yield server.stopService()
        self.assertEqual(fake.stopped, 1)
        self.assertEqual(len([line for line in log if line.startswith("jesync stopped: ")]), 1, log)

    @inlineCallbacks
    def test_stopped_while_listening(self):
        """Stopping before an endpoint has listened cancels its listen, quietly."""
        log = capture_log(self)
        server = self.server(ports=["tcp:0:interface=127.0.0.1"])
        endpoint = LaterEndpoint()
        Listener("later:1", endpoint, server.factories["jesync"]).setServiceParent(server)
        server.startService()
        yield server.stopService()
        self.assertEqual([line for line in log if line.startswith("jesync")], [])
        self.assertFalse(server.running)


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


class TwistdTests(TestCase):
    """C{twistd jesync} as a subprocess, on a port something else holds."""

    timeout = 90
    spawn = test_twistd.TwistdTests.spawn
    run_server = test_twistd.TwistdTests.run_server

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
        plugins = os.path.join(test_twistd.short_temp_dir(self), "twisted", "plugins")
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
            PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(plugins)), test_twistd.REPOSITORY]),
        )
        yield self.assert_not_started(process, b"cannot listen on jesync-test-slowfail:0.1: address already in use")
        self.assertIn(b"JESyncFactory starting on %d\n" % free, process.output)
        self.assertIn(b"Main loop terminated.", process.output)
        self.assertFalse(accepts(free))

    @inlineCallbacks
    def test_option_error_is_brief(self):
        """An option error: the error and a hint, exit status 1; not the whole --help."""
        process = self.spawn("jesync", "--max-keys=-1")
        test_twistd.assert_usage_error_status(self, (yield process.wait_ended()))
        self.assertEqual(
            process.errors,
            b"twistd jesync: --max-keys -1: must be 0 (no limit) or more\n"
            b"Run 'twistd jesync --help' for the options.\n",
        )
        self.assertEqual(process.output, process.errors)

    @inlineCallbacks
    def test_ssl_without_tls_extra(self):
        """Without pyOpenSSL (hidden here by a stand-in that fails to import), ssl: says how to get it."""
        hiding = test_twistd.short_temp_dir(self)
        os.makedirs(os.path.join(hiding, "OpenSSL"))
        with open(os.path.join(hiding, "OpenSSL", "__init__.py"), "w") as file:
            file.write("raise ImportError('No module named OpenSSL (hidden by the test)')\n")
        process = self.spawn(
            "-n",
            "--pidfile=",
            "jesync",
            "--port",
            "ssl:11443:privateKey=key.pem:certKey=cert.pem",
            PYTHONPATH=os.pathsep.join([hiding, test_twistd.REPOSITORY]),
        )
        test_twistd.assert_usage_error_status(self, (yield process.wait_ended()))
        self.assertEqual(
            process.errors,
            b"twistd jesync: --port ssl:11443:privateKey=key.pem:certKey=cert.pem: TLS needs pyOpenSSL: "
            b"pip install 'jesync[tls]'\n"
            b"Run 'twistd jesync --help' for the options.\n",
        )
