"""
A server that cannot listen does not start, in this process
(L{jesync.server.build_server} on the test's reactor, real listening
sockets): it says why in one line, every failure of several, stops the
endpoints that did listen, and never logs its startup summary.  The same as
a C{twistd jesync} subprocess (exit status 1, foreground and daemonized) is
L{tests.process.test_listen_failure_twistd}; what the summary shows and the
one-line reasons are L{tests.unit.test_listen_failure}.

Nothing here sleeps for a fixed time: every step waits for a log line or a
file to go, with a bounded timeout.
"""

from __future__ import annotations

import errno
import os
import socket

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import UNIXClientEndpoint, connectProtocol
from twisted.internet.error import CannotListenError, ConnectError
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.trial.unittest import TestCase
from zope.interface import implementer

from jesync.listening import ListenFailed, Listener
from jesync.server import ServerSettings, build_server
from tests.servers import free_port
from tests.support import IN_USE, TIMEOUT, LineClient, accepts, capture_log, short_temp_dir, taken_port


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
        directory = short_temp_dir(self)
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
