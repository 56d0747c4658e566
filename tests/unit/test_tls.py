"""
The TLS options as C{twistd jesync} reads them, with nothing listening: a
cipher string that selects nothing, a version below 1.2 and C{sslmethod=}
are refused with one line each.  The certificates are
L{tests.tls_certificates}' (made with C{cryptography}); TLS over real
sockets is L{tests.tcp.test_tls}.
"""

from __future__ import annotations

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from jesync.tap import Options
from tests.tls_certificates import make_certificate, skip_without_tls, ssl_port


class TLSOptionTests(SynchronousTestCase):
    skip = skip_without_tls

    def refusal(self, *argv: str, port_arguments: str = "") -> str:
        key_path, certificate_path, _ = make_certificate(self)
        with self.assertRaises(usage.UsageError) as raised:
            Options().parseOptions(["--port", ssl_port(key_path, certificate_path) + port_arguments, *argv])
        return str(raised.exception)

    def test_a_cipher_string_that_selects_nothing(self):
        self.assertEqual(
            self.refusal("--tls-ciphers", "NO-SUCH-SUITE"),
            "--tls-ciphers: 'NO-SUCH-SUITE' selects no cipher suite this OpenSSL has",
        )

    def test_versions(self):
        self.assertEqual(self.refusal("--tls-min-version", "1.1"), "--tls-min-version 1.1: must be 1.2 or 1.3")

    def test_sslmethod_is_refused(self):
        refusal = self.refusal(port_arguments=":sslmethod=TLSv1_2_METHOD")
        self.assertEqual(
            refusal,
            "--port ssl:0:interface=127.0.0.1: "
            "sslmethod= is not taken: --tls-min-version says which TLS versions are accepted",
        )
        self.flushWarnings()  # Twisted's own, on parsing sslmethod: deprecated
