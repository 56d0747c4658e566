"""
What a server that cannot listen says, and what its summary shows: the one
line of a listen error (L{listen_error}), a TLS endpoint's key and
certificate paths never in the summary (L{public_endpoint}), and
C{--port ssl:...} without the tls extra saying how to install it.  No socket
is opened; a server that cannot listen is L{tests.tcp.test_listen_failure}
(in-process) and L{tests.process.test_listen_failure_twistd} (twistd).
"""

from __future__ import annotations

import errno
import os
import sys
from unittest import mock

from twisted.internet.error import CannotListenError
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.listening import listen_error, public_endpoint
from jesync.server import ServerSettings
from tests.support import IN_USE, parse


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
                    usage.UsageError, parse, option, "ssl:11443:privateKey=key.pem:certKey=cert.pem"
                )
                self.assertEqual(
                    str(error),
                    f"{option} ssl:11443:privateKey=key.pem:certKey=cert.pem: TLS needs pyOpenSSL: "
                    "pip install 'jesync[tls]'",
                )
            # other endpoints need no TLS
            self.assertEqual(parse("--port", "tcp:7777")["ports"], ["tcp:7777"])
