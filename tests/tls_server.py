"""
A server on C{--port ssl:...} with a throwaway certificate, and clients over
TLS that trust it (L{TLSServer}): for L{tests.tcp.test_tls} and the TLS
cases of the other TCP tests.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks

from tests.server_case import Server
from tests.support import TIMEOUT
from tests.tls_certificates import connect_tls, make_certificate, ssl_port


class TLSServer:
    """Mixed into a L{tests.server_case.ServerTestCase}: L{start} a server over TLS, L{connect} to it."""

    @inlineCallbacks
    def start(self, *argv: str, key_type: str = "ec"):
        key_path, certificate_path, self.pem = make_certificate(self, key_type)
        server = yield Server.start(self, *argv, port=ssl_port(key_path, certificate_path), elock=False)
        return server

    @inlineCallbacks
    def connect(self, server: Server):
        client = yield connect_tls(server.ports["jesync"].getHost().port, self.pem)
        server.clients.append(client)
        client.kind = "jesync"
        # the TCP port the server sees (under TLS)
        client.served = yield server._server_side("jesync", client.transport.getHost().port).addTimeout(
            TIMEOUT, reactor
        )
        return client
