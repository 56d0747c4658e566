"""
The C{jesync} command using the clients' security settings through the
environment (C{JESYNC_SERVERS}, C{JESYNC_AUTH_TOKEN_FILE}, C{JESYNC_TLS_*}):
a token, TLS, their refusals and unusable settings, each run as a real
command (a process is the point: its exit status and its stderr) against the
secured server of L{tests.tcp.test_client_security}, in a thread of this
process.
"""

from __future__ import annotations

import os
import sys
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from jesync.cli import EXIT_CONFIG, EXIT_REFUSED, EXIT_UNAVAILABLE
from tests.client_pki import secured_server
from tests.servers import run_command_line


class CommandLineTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.secured = secured_server()

    def test_status_with_token(self) -> None:
        done = run_command_line(
            "status", "a", JESYNC_SERVERS=self.secured.address, JESYNC_AUTH_TOKEN_FILE=self.secured.token_file
        )
        self.assertEqual((done.returncode, done.stderr), (0, ""))
        self.assertIn("a: 0 holding, 0 waiting", done.stdout)

    def test_lock_over_tls(self) -> None:
        done = run_command_line(
            "lock",
            "cli-tls",
            "--",
            sys.executable,
            "-c",
            "print('ran')",
            JESYNC_SERVERS=self.secured.tls_name_address,
            JESYNC_AUTH_TOKEN_FILE=self.secured.token_file,
            JESYNC_TLS_CA_FILE=self.secured.pki.ca_file,
        )
        self.assertEqual((done.returncode, done.stdout.strip()), (0, "ran"), done.stderr)

    def test_without_token(self) -> None:
        done = run_command_line("status", "a", JESYNC_SERVERS=self.secured.address)
        self.assertEqual(done.returncode, EXIT_REFUSED)
        self.assertIn("auth failed", done.stderr)

    def test_wrong_ca(self) -> None:
        done = run_command_line(
            "status",
            "a",
            JESYNC_SERVERS=self.secured.tls_address,
            JESYNC_AUTH_TOKEN_FILE=self.secured.token_file,
            JESYNC_TLS_CA_FILE=self.secured.pki.other_ca_file,
        )
        self.assertEqual(done.returncode, EXIT_UNAVAILABLE)
        self.assertIn("TLS failed", done.stderr)

    def test_unusable_settings_are_one_line_and_status_78(self) -> None:
        missing = os.path.join(tempfile.mkdtemp(), "no-such-token")
        for variables in ({"JESYNC_AUTH_TOKEN_FILE": missing}, {"JESYNC_TLS": "perhaps"}):
            done = run_command_line("status", "a", JESYNC_SERVERS=self.secured.address, **variables)
            self.assertEqual(done.returncode, EXIT_CONFIG, done.stderr)
            self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
            self.assertNotIn("Traceback", done.stderr)

    def test_token_is_no_option(self) -> None:
        """No command-line option takes the token itself."""
        done = run_command_line("--help")
        self.assertNotIn("--auth-token ", done.stdout)
        self.assertNotIn("--token", done.stdout)
