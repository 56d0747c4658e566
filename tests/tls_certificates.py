"""
Throwaway self-signed certificates for the TLS tests (L{make_certificate}),
the C{--port ssl:...} that serves one (L{ssl_port}), and a client that
trusts it alone (L{connect_tls}); L{skip_without_tls} without the tls extra.
"""

from __future__ import annotations

import datetime
import ipaddress
import os

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks

from tests.support import TIMEOUT, LineClient, short_temp_dir

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
