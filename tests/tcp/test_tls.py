"""
JESync over TLS: C{--port ssl:...} with a throwaway self-signed certificate,
served in this process (the service L{jesync.tap.makeService} builds) to
clients that trust that certificate, over real sockets.  The same served by
C{twistd jesync} is L{tests.process.test_tls_twistd}; the TLS options refused
as twistd reads them, L{tests.unit.test_tls}.  The certificates and the
server over TLS are L{tests.tls_certificates}' and L{tests.tls_server}'.

Keys and certificates are made with C{cryptography}, and no test here may
see a DeprecationWarning (pyOpenSSL's, Twisted's or jesync's): TLS goes
through the current pyOpenSSL and C{cryptography} APIs, under CPython and
under PyPy (whose pins hold pyOpenSSL at 25.1 and Twisted at 25.5).
"""

from __future__ import annotations

import os
import ssl
import socket
import warnings

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ConnectionDone
from twisted.internet.threads import deferToThread

from jesync.interfaces import Totals
from tests.server_case import Server, ServerTestCase
from tests.support import (
    LINUX_KEEPALIVE,
    TIMEOUT,
    capture_log,
    keepalive_options,
    peer_of,
    short_temp_dir,
    without_tokens,
)
from tests.tls_certificates import make_certificate, skip_without_tls, ssl_port
from tests.tls_server import TLSServer


def deprecations(warned: list[dict]) -> list[str]:
    """The DeprecationWarnings among trial's C{flushWarnings()}, one line each."""
    return [
        f"{warning['filename']}:{warning['lineno']}: {warning['category'].__name__}: {warning['message']}"
        for warning in warned
        if issubclass(warning["category"], DeprecationWarning)
    ]


class TLSTests(TLSServer, ServerTestCase):
    skip = skip_without_tls

    def setUp(self):
        super().setUp()
        # Added first, so run last: after every other cleanup (the server's stop).
        self.addCleanup(self.assert_no_deprecations)

    def assert_no_deprecations(self) -> None:
        """
        Nothing warned of a deprecation: pyOpenSSL, when handed its own
        C{X509} or C{PKey} rather than C{cryptography}'s objects, or when a
        context changes after a connection was made from it.  (Trial collects
        the warnings of a test, under pytest as under trial.)  Any other
        warning is given back, to be reported as usual.
        """
        warned = self.flushWarnings()
        for warning in warned:
            if not issubclass(warning["category"], DeprecationWarning):
                warnings.warn_explicit(warning["message"], warning["category"], warning["filename"], warning["lineno"])
        self.assertEqual(deprecations(warned), [])

    @inlineCallbacks
    def test_lock_and_release(self):
        server = yield self.start("--keepalive", "9")
        holder = yield self.connect(server)
        waiter = yield self.connect(server)
        self.assertEqual((yield holder.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield waiter.ask(b"lock k\nstatus k\n")), b"STATUS 1 1 k\n")
        self.assertEqual(without_tokens((yield waiter.ask(b"holders k\n", 2))), b"HOLDER k %s 0 120\nEND\n" % peer_of(holder))
        self.assertEqual((yield holder.ask(b"release k\n")), b"RELEASED 1 0 k\n")
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        # quit closes the connection (a TLS close, then TCP's), and gives back its locks
        self.assertEqual((yield holder.ask(b"lock h\nquit\n")), b"GRANTED 1 0 h 120\n")
        self.assertIsInstance((yield holder.wait_closed()), ConnectionDone)
        yield server.wait_lost(holder)
        self.assertEqual((yield waiter.ask(b"status-by-key\n", 2)), b"STATUS 1 0 k\nEND\n")

    @inlineCallbacks
    def test_keepalive_under_tls(self):
        server = yield self.start("--keepalive", "9")
        client = yield self.connect(server)
        self.assertEqual((yield client.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        tls = client.served.transport
        self.assertFalse(hasattr(tls.getHandle(), "getsockopt"))  # the TLS connection
        expected = (1, 9, 9, 4) if LINUX_KEEPALIVE else (1,)
        self.assertEqual(keepalive_options(tls.transport.getHandle()), expected)

    @inlineCallbacks
    def test_auth_failure_closes(self):
        server = yield self.start("--auth-token-file", self.token_file())
        client = yield self.connect(server)
        client.send(b"lock k\n")
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        self.assertEqual(client.unread(), b"INVALID_PARAMETER: auth failed\n")

    def token_file(self) -> str:
        path = os.path.join(short_temp_dir(self), "token")
        with open(path, "wb") as file:
            file.write(b"tls-token\n")
        return path

    @inlineCallbacks
    def test_max_connections(self):
        server = yield self.start("--max-connections", "1")
        client = yield self.connect(server)
        self.assertEqual((yield client.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        refused = yield self.connect(server)
        self.assertIsInstance((yield refused.wait_closed()), ConnectionDone)
        self.assertEqual(refused.unread(), b"INVALID_PARAMETER: max-connections exceeded (1)\n")
        self.assertEqual((yield client.ask(b"status k\n")), b"STATUS 1 0 k\n")

    @inlineCallbacks
    def test_stop_closes_tls_connections_at_once(self):
        """A stop closes TLS connections cleanly, not by dropping them once the grace period is over."""
        log = capture_log(self)
        server = yield self.start("--shutdown-grace", "60")
        holder = yield self.connect(server)
        waiter = yield self.connect(server)
        self.assertEqual((yield holder.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield waiter.ask(b"lock k\nstatus k\n")), b"STATUS 1 1 k\n")
        yield server.service.stopService().addTimeout(TIMEOUT, reactor)
        for client in (holder, waiter):
            self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        self.assertEqual(server.locks.totals(), Totals(0, 0, 0))
        self.assertIn(
            "jesync stopped: closed 2 connections, released 1 grants and 1 waits on 1 keys "
            "(0 grants left, held by embedders)",
            log,
        )


def handshake(port: int, pem: bytes, ciphers: str = "", version: str = "") -> tuple[str, str] | str:
    """
    A TLS handshake with 127.0.0.1:C{port}, by Python's C{ssl} (as
    jesync's own clients make it), trusting only C{pem}, offering only the
    TLS 1.2 suites C{ciphers} and only TLS C{version} (1.2 or 1.3), if
    given: the version and suite agreed on, or why there was none.
    Blocking: run it in a thread (L{deferToThread}).
    """
    context = ssl.create_default_context(cadata=pem.decode())
    if ciphers:
        context.set_ciphers(ciphers)
    if version:
        chosen = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}[version]
        context.minimum_version = context.maximum_version = chosen
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                version_name, cipher = tls.version(), tls.cipher()
        except ssl.SSLError as error:
            return error.reason or str(error)
    assert version_name is not None and cipher is not None
    return version_name, cipher[0]


class TLSPolicyTests(ServerTestCase):
    """
    What ssl: listeners accept (C{--tls-ciphers}, C{--tls-min-version}):
    by default TLS 1.2 or 1.3, and for TLS 1.2 forward-secret AEAD suites
    only; over real TLS, with an RSA certificate (which would allow static-RSA
    suites) and clients that offer one suite at a time.
    """

    skip = skip_without_tls

    @inlineCallbacks
    def start(self, *argv: str):
        key_path, certificate_path, self.pem = make_certificate(self, "rsa")
        server = yield Server.start(self, *argv, port=ssl_port(key_path, certificate_path), elock=False)
        self.port = server.ports["jesync"].getHost().port
        return server

    def handshake(self, ciphers: str = "", version: str = ""):
        return deferToThread(handshake, self.port, self.pem, ciphers, version).addTimeout(TIMEOUT * 2, reactor)

    @inlineCallbacks
    def test_modern_suites_by_default(self):
        yield self.start()
        # static RSA key exchange, CBC: refused
        self.assertIsInstance((yield self.handshake("AES128-SHA", "1.2")), str)
        self.assertIsInstance((yield self.handshake("AES256-GCM-SHA384", "1.2")), str)
        # forward-secret, but CBC: refused
        self.assertIsInstance((yield self.handshake("ECDHE-RSA-AES128-SHA", "1.2")), str)
        # forward-secret AEAD suites of TLS 1.2, and TLS 1.3
        self.assertEqual(
            (yield self.handshake("ECDHE-RSA-AES128-GCM-SHA256", "1.2")), ("TLSv1.2", "ECDHE-RSA-AES128-GCM-SHA256")
        )
        self.assertEqual(
            (yield self.handshake("ECDHE-RSA-CHACHA20-POLY1305", "1.2")), ("TLSv1.2", "ECDHE-RSA-CHACHA20-POLY1305")
        )
        self.assertEqual((yield self.handshake(version="1.3"))[0], "TLSv1.3")
        # a client offering every version gets TLS 1.3
        self.assertEqual((yield self.handshake())[0], "TLSv1.3")

    @inlineCallbacks
    def test_the_cipher_string_is_the_operators(self):
        server = yield self.start("--tls-ciphers", "AES128-SHA:ECDHE+AESGCM")
        self.assertIn("; TLS 1.2+, TLS 1.2 ciphers AES128-SHA:ECDHE+AESGCM; auth off", server.service.summary)
        self.assertEqual((yield self.handshake("AES128-SHA", "1.2")), ("TLSv1.2", "AES128-SHA"))
        self.assertIsInstance((yield self.handshake("ECDHE-RSA-CHACHA20-POLY1305", "1.2")), str)
        self.assertEqual((yield self.handshake(version="1.3"))[0], "TLSv1.3")

    @inlineCallbacks
    def test_tls_1_3_only(self):
        server = yield self.start("--tls-min-version", "1.3")
        self.assertIn("; TLS 1.3+; auth off", server.service.summary)
        self.assertIsInstance((yield self.handshake("ECDHE-RSA-AES128-GCM-SHA256", "1.2")), str)
        self.assertEqual((yield self.handshake(version="1.3"))[0], "TLSv1.3")

    @inlineCallbacks
    def test_a_client_of_jesync_connects(self):
        """jesync's own blocking client, with its default TLS settings, over the default policy."""
        from jesync.client import Client

        server = yield self.start()
        ca_file = os.path.join(short_temp_dir(self), "ca.pem")
        with open(ca_file, "wb") as file:
            file.write(self.pem)

        def lock_and_release() -> bool:
            client = Client(
                f"127.0.0.1:{self.port}", tls=True, tls_ca_file=ca_file, tls_server_name="localhost", environ={}
            )
            try:
                return client.lock("tls-key", wait=5).release()
            finally:
                client.close()

        self.assertTrue((yield deferToThread(lock_and_release).addTimeout(TIMEOUT * 2, reactor)))
        self.assertEqual(server.locks.totals(), Totals(0, 0, 0))
