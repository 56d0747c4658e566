"""
JESync over TLS: C{--port ssl:...} with a throwaway self-signed certificate,
served in this process (the service L{jesync.tap.makeService} builds) to
clients that trust that certificate, over real sockets.  The same served by
C{twistd jesync} is L{tests.process.test_tls_twistd}; the TLS options refused
as twistd reads them, L{tests.unit.test_tls}.  The certificate helpers here
(L{make_certificate}, L{ssl_port}, L{connect_tls}) serve those too.

Keys and certificates are made with C{cryptography}, and no test here may
see a DeprecationWarning (pyOpenSSL's, Twisted's or jesync's): TLS goes
through the current pyOpenSSL and C{cryptography} APIs, under CPython and
under PyPy (whose pins hold pyOpenSSL at 25.1 and Twisted at 25.5).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import socket
import warnings

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import ConnectionDone
from twisted.internet.threads import deferToThread

from jesync.interfaces import Totals
from tests.support import TIMEOUT, LineClient, without_tokens
from tests.tcp.test_operations import LINUX_KEEPALIVE, Server, ServerTestCase, capture_log, keepalive_options, peer_of
from tests.process.test_twistd import short_temp_dir

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID
    from twisted.internet.endpoints import SSL4ClientEndpoint, connectProtocol
    from twisted.internet.ssl import Certificate, CertificateOptions
except ImportError as error:  # pragma: no cover - the test extra installs twisted[tls]
    skip_without_tls = f"TLS needs twisted[tls] (pyOpenSSL, service_identity, cryptography): {error}"
else:
    skip_without_tls = None


def make_certificate(test, key_type: str = "ec") -> tuple[str, str, bytes]:
    """
    A self-signed certificate for localhost and 127.0.0.1: (key path,
    certificate path, certificate PEM).  Its key is C{ec} (P-256) or
    C{rsa} (2048 bits: the key static-RSA suites such as C{AES128-SHA} need).
    """
    key = ec.generate_private_key(ec.SECP256R1()) if key_type == "ec" else rsa.generate_private_key(65537, 2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = short_temp_dir(test)
    key_path = os.path.join(directory, "key.pem")
    certificate_path = os.path.join(directory, "cert.pem")
    with open(key_path, "wb") as file:
        file.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    with open(certificate_path, "wb") as file:
        file.write(pem)
    return key_path, certificate_path, pem


def ssl_port(key_path: str, certificate_path: str) -> str:
    return f"ssl:0:privateKey={key_path}:certKey={certificate_path}:interface=127.0.0.1"


def client_options(pem: bytes) -> CertificateOptions:
    """
    TLS options for a client that trusts the certificate C{pem} alone: the
    server must present that very certificate (or one it signed, which these
    tests never make), so no host name check is needed on top.

    Not L{twisted.internet.ssl.optionsForClientTLS}, whose host name check
    needs it to set a callback on its context after pyOpenSSL 25.1 (PyPy's)
    has made a connection from it to check the cipher list: pyOpenSSL warns
    (DeprecationWarning: "Attempting to mutate a Context after a Connection
    was created") at every call with Twisted 25.5 (Twisted's issue 12500).
    The newer pyOpenSSL and Twisted that CPython gets (26.4 and 26.10 here)
    do not, but PyPy's pins rule them out.  A L{CertificateOptions} with a
    C{trustRoot} verifies the chain and changes nothing once its context is
    made, under both.
    """
    return CertificateOptions(trustRoot=Certificate.loadPEM(pem))


@inlineCallbacks
def connect_tls(port: int, pem: bytes):
    """A L{LineClient} over TLS to 127.0.0.1:C{port}, trusting only C{pem}."""
    endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, client_options(pem), timeout=int(TIMEOUT))
    client = yield connectProtocol(endpoint, LineClient()).addTimeout(TIMEOUT, reactor)
    return client


def deprecations(warned: list[dict]) -> list[str]:
    """The DeprecationWarnings among trial's C{flushWarnings()}, one line each."""
    return [
        f"{warning['filename']}:{warning['lineno']}: {warning['category'].__name__}: {warning['message']}"
        for warning in warned
        if issubclass(warning["category"], DeprecationWarning)
    ]


class TLSTests(ServerTestCase):
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
