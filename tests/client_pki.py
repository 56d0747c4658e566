"""
The certificates and the server the clients' security tests share: a test CA
signing the server's certificate (for localhost and 127.0.0.1), and another
CA that signs nothing the server shows (L{PKI}, made with C{cryptography});
the real server in a thread wanting L{TOKEN}, plain and over TLS
(L{secured_server}).  Used by L{tests.tcp.test_client_security} and the
C{jesync} command's tests in L{tests.process}.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import os
import shutil
import tempfile
from typing import Any, Callable, Optional
from unittest import SkipTest

from tests.servers import free_port, serve_in_thread

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as error:  # pragma: no cover - the test extra installs cryptography
    skip_without_tls: Optional[str] = f"TLS tests need cryptography (pip install 'jesync[tls]'): {error}"
else:
    skip_without_tls = None

TOKEN = b"correct-horse-battery-staple"


def temp_dir(test: Any) -> str:
    path = tempfile.mkdtemp(prefix="jesync-")
    test.addCleanup(shutil.rmtree, path, True)
    return path


def write(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        file.write(data)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate authority: its key and self-signed certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def make_server_certificate(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate for localhost and 127.0.0.1, signed by C{ca}."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, certificate


class PKI:
    """The files of a test CA, a server certificate it signed, and another CA."""

    def __init__(self, directory: str) -> None:
        ca_key, ca = make_ca("jesync test CA")
        _, other_ca = make_ca("another CA")
        key, certificate = make_server_certificate(ca_key, ca)
        self.ca_file = write(directory, "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
        self.other_ca_file = write(directory, "other-ca.pem", other_ca.public_bytes(serialization.Encoding.PEM))
        self.key_file = write(directory, "server-key.pem", _pem_key(key))
        self.certificate_file = write(directory, "server-cert.pem", certificate.public_bytes(serialization.Encoding.PEM))


class _AtExit:
    """Cleans up at the end of the test run (the server dies with it anyway: see L{tests.servers})."""

    def addCleanup(self, function: Callable[..., object], *args: object) -> None:
        atexit.register(function, *args)


class SecuredServer:
    """
    The real server (in a thread) wanting L{TOKEN}: plain TCP on C{address}, TLS
    on C{tls_address} (127.0.0.1) and C{tls_name_address} (localhost), the
    same port.  One for every test here (L{secured_server}).
    """

    def __init__(self, test: Any) -> None:
        directory = temp_dir(test)
        self.token_file = write(directory, "token", TOKEN + b"\n")
        self.wrong_token_file = write(directory, "wrong-token", b"not-the-token\n")
        self.pki = PKI(directory)
        tls_port = free_port()
        tls = f"ssl:{tls_port}:privateKey={self.pki.key_file}:certKey={self.pki.certificate_file}:interface=127.0.0.1"
        self.server = serve_in_thread(
            test, extra_args=["--auth-token-file", self.token_file, "--port", tls], auth_token=TOKEN
        )
        self.address = self.server.address
        self.tls_address = f"127.0.0.1:{tls_port}"
        self.tls_name_address = f"localhost:{tls_port}"


_shared: list[SecuredServer] = []


def secured_server() -> SecuredServer:
    """The L{SecuredServer}, started on first use."""
    if skip_without_tls:
        raise SkipTest(skip_without_tls)
    if not _shared:
        _shared.append(SecuredServer(_AtExit()))
    return _shared[0]
