"""
The one authentication deadline of every listener (docs/protocols/index.md, Lifecycle),
over real TCP to a real server (the server C{twistd jesync} builds, in this
process): a client trickling an unfinished request on each listener is
closed at --auth-timeout with its protocol's limit reply, and a TLS client
that never finishes its handshake is aborted then too.  The rule itself, on
a L{twisted.internet.task.Clock}, is in L{tests.unit.test_auth_deadlines}.
These servers take a half-second deadline (the Clock tests take 1 s): what
is shown here is that the real listeners keep it, not how long it is.
"""

from __future__ import annotations

from twisted.internet import reactor, task
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone

from tests.auth_listeners import listeners
from tests.server_case import Server, ServerTestCase, listening_port
from tests.support import LOCAL, TIMEOUT, TOKEN, LineClient, write_file
from tests.tls_certificates import connect_tls, make_certificate, skip_without_tls, ssl_port

#: The servers' --auth-timeout, and what a connection timed out is told.
AUTH_TIMEOUT = "0.5"
TIMEOUT_REPLY = b"auth-timeout exceeded (0.5)"
LISTENERS = listeners(TIMEOUT_REPLY)
#: How often the trickling clients send a byte: several times within the deadline.
TRICKLE = 0.1


class TCPTests(ServerTestCase):
    """Every listener of one real server: a client trickling an unfinished request is closed after --auth-timeout."""

    @inlineCallbacks
    def test_every_listener_closes_a_trickling_client(self):
        path = write_file(self, TOKEN + b"\n")
        server = yield Server.start(
            self,
            "--auth-token-file",
            path,
            "--auth-timeout",
            AUTH_TIMEOUT,
            "--memcache-port",
            LOCAL,
            "--admin-port",
            LOCAL,
            dlock=True,
        )
        ports = {}
        factories = server.service.factories
        for child in server.service.listeners():
            for name, listener_names in (
                ("jesync", ["jesync"]),
                ("elock", ["elock"]),
                ("dlock", ["dlock"]),
                ("memcache", ["memcached text", "memcached binary"]),
                ("admin", ["admin"]),
            ):
                if child.factory is factories[name]:
                    port = yield listening_port(child)
                    for listener_name in listener_names:
                        ports[listener_name] = port.getHost().port
        self.assertEqual(sorted(ports), sorted(listener.name for listener in LISTENERS))
        clients = []
        for listener in LISTENERS:
            endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", ports[listener.name], timeout=int(TIMEOUT))
            client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
            server.clients.append(client)
            client.send(listener.unfinished)
            clients.append((listener, client))

        def trickle() -> None:
            for listener, client in clients:
                if client.lost_reason is None:
                    client.send(listener.trickle)

        ticker = task.LoopingCall(trickle)
        ticker.start(TRICKLE, now=False)
        self.addCleanup(lambda: ticker.running and ticker.stop())
        for listener, client in clients:
            self.assertIsInstance((yield client.wait_closed()), ConnectionDone, listener.name)
            if listener.timed_out is not None:
                self.assertEqual(client.unread(), listener.timed_out, listener.name)
            else:
                self.assertIn(TIMEOUT_REPLY, client.unread())
        # A client with the token is served.
        jesync = yield server.jesync()
        self.assertEqual((yield jesync.ask(b"auth %s\nstatus k\n" % TOKEN, count=2)), b"OK\nSTATUS 0 0 k\n")


class TLSHandshakeTests(ServerTestCase):
    """A TLS client that never completes its handshake is aborted at the auth deadline, not after the close grace."""

    skip = skip_without_tls

    @inlineCallbacks
    def test_an_unfinished_handshake_is_aborted_at_the_deadline(self):
        key_path, certificate_path, pem = make_certificate(self)
        path = write_file(self, TOKEN + b"\n")
        server = yield Server.start(
            self,
            "--auth-token-file",
            path,
            "--auth-timeout",
            AUTH_TIMEOUT,
            "--shutdown-grace",
            "60",
            port=ssl_port(key_path, certificate_path),
            elock=False,
        )
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", server.ports["jesync"].getHost().port)
        client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
        server.clients.append(client)
        client.send(b"\x16\x03\x01\x02\x00\x01")  # (the start of a ClientHello, never finished)
        started = reactor.seconds()
        yield client.wait_closed(timeout=TIMEOUT)  # (not the 60 s close grace)
        self.assertLess(reactor.seconds() - started, TIMEOUT)
        self.assertEqual(client.unread(), b"")
        self.assertEqual(len(server.policy.connections), 0)
        # A TLS client that completes its handshake still gets the refusal.
        tls_client = yield connect_tls(server.ports["jesync"].getHost().port, pem)
        server.clients.append(tls_client)
        yield tls_client.wait_closed(timeout=TIMEOUT)
        self.assertEqual(tls_client.unread(), b"INVALID_PARAMETER: " + TIMEOUT_REPLY + b"\n")
