"""
The examples of docs/clients.md ("Using it from Python", "Using it from the
shell", "A tooz backend") work as written, against a real server (the only
change: the addresses 127.0.0.1:11400 and, for elock, 127.0.0.1:11401
become the test server's).
"""

from __future__ import annotations

import re
import subprocess
import sys
from unittest import SkipTest

from twisted.trial.unittest import SynchronousTestCase

from tests.doc_pages import blocks, section
from tests.servers import ROOT, environment, free_port, shell_environment, start_server

CLIENTS_PAGE = ROOT / "docs" / "clients.md"
DEFAULT_ADDRESS = "127.0.0.1:11400"
DEFAULT_ELOCK_ADDRESS = "127.0.0.1:11401"


def clients_section(title: str) -> str:
    found = section(CLIENTS_PAGE.read_text(encoding="utf-8"), title)
    if found is None:
        raise SkipTest(f"docs/clients.md has no {title!r} section")
    return found


class PythonExamples:
    """Checks on a "Using it from Python" section (a mixin, so any text can be checked)."""

    def check_python_section(self, text: str) -> None:
        elock_port = free_port()
        server = start_server(self, extra_args=["--elock-port", f"tcp:{elock_port}:interface=127.0.0.1"])
        examples = blocks(text, "python")
        self.assertGreaterEqual(len(examples), 4)
        first_output = blocks(text, "console")[0]
        for number, example in enumerate(examples):
            result = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    example.replace(DEFAULT_ADDRESS, server.address).replace(
                        DEFAULT_ELOCK_ADDRESS, f"127.0.0.1:{elock_port}"
                    ),
                ],
                env=environment(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(result.returncode, 0, f"example {number}:\n{example}\n{result.stderr}")
            if number == 0:
                self.assertEqual(result.stdout, first_output)
            if ".watch(" in example:
                printed = re.search(r"It prints `([^`]+)`, `([^`]+)`,\s+`([^`]+)`, then `([^`]+)`", text)
                self.assertIsNotNone(printed)
                self.assertEqual(result.stdout.splitlines(), list(printed.groups()))
            # An example followed by "This prints ..." prints just that.
            printed = re.match(r"\s*```\n\s*This prints (.*?)\.\n", text[text.index(example) + len(example) :], re.S)
            if "Election(" in example:
                self.assertIsNotNone(printed)
            if printed is not None:
                self.assertEqual(result.stdout.splitlines(), re.findall(r"`([^`]+)`", printed.group(1)))
            if "server_for" in example:
                printed = re.search(r"It prints `([^`]+)`, then `([^`]+)`", text)
                self.assertIsNotNone(printed)
                self.assertEqual(result.stdout.splitlines(), list(printed.groups()))

    def check_shell_section(self, text: str) -> None:
        server = start_server(self)
        [commands] = blocks(text, "sh")
        env = shell_environment(self, server.address)
        for line in commands.splitlines():
            result = subprocess.run(
                ["sh", "-c", line], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
            )
            self.assertEqual(result.returncode, 0, f"{line}\n{result.stdout}{result.stderr}")


class ClientsPageExamplesTests(PythonExamples, SynchronousTestCase):
    def test_python_examples(self) -> None:
        self.check_python_section(clients_section("Using it from Python"))

    def test_shell_examples(self) -> None:
        self.check_shell_section(clients_section("Using it from the shell"))

    def test_tooz_example(self) -> None:
        """The tooz example takes and releases its lock against a real server, and prints the lock's name."""
        try:
            import tooz  # noqa: F401
        except ImportError:
            raise SkipTest("tooz is not installed (the test extra installs it under CPython)")
        server = start_server(self)
        [example] = blocks(clients_section("A tooz backend"), "python")
        result = subprocess.run(
            [sys.executable, "-c", example.replace(DEFAULT_ADDRESS, server.address)],
            env=environment(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(result.returncode, 0, f"{example}\n{result.stderr}")
        self.assertEqual(result.stdout, "holding b'volume-17'\n")
