"""
The examples of docs/coordination.md work as written and print what the
page says they print: the lock table's (in this process's interpreter), the
Python client's and the shell's against a real C{twistd jesync} (the only
change: the address 127.0.0.1:11400 becomes the test server's).
"""

from __future__ import annotations

import socket
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.doc_pages import ROOT, blocks, section
from tests.servers import environment, shell_environment, start_server

DEFAULT_ADDRESS = "127.0.0.1:11400"

PAGE = ROOT / "docs" / "coordination.md"


def page_section(title: str) -> str:
    found = section(PAGE.read_text(encoding="utf-8"), title)
    assert found is not None, f"docs/coordination.md has no {title!r} section"
    return found


def run_example(source: str) -> subprocess.CompletedProcess[str]:
    """Run a Python example in a fresh interpreter that imports this checkout's jesync."""
    return subprocess.run(
        [sys.executable, "-c", source], env=environment(), capture_output=True, text=True, timeout=60
    )


class TwistedApplicationExampleTests(SynchronousTestCase):
    def test_the_lock_table_example(self) -> None:
        """The lock table's example: shared holders, a value, a writer waiting, no upgrade, events in order."""
        text = page_section("In a Twisted application")
        [example] = blocks(text, "python")
        [printed] = blocks(text, "text")
        result = run_example(example)
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertEqual(result.stdout, printed)


class ClientExampleTests(SynchronousTestCase):
    def test_the_asyncio_example(self) -> None:
        """A reader, a waiting writer holding back a later reader, values in holders, and the monitor's events."""
        server = start_server(self)
        text = page_section("From Python")
        [example] = blocks(text, "python")
        [printed] = blocks(text, "text")
        result = run_example(example.replace(DEFAULT_ADDRESS, server.address))
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertEqual(result.stdout, printed)

    def test_the_shell_lines(self) -> None:
        """The first line shows its one shared holder with its value; the second two shared holders at once."""
        server = start_server(self)
        [commands] = blocks(page_section("From the shell"), "sh")
        env = shell_environment(self, server.address)
        outputs = []
        for line in commands.splitlines():
            result = subprocess.run(
                ["sh", "-c", line], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
            )
            self.assertEqual(result.returncode, 0, f"{line}\n{result.stdout}{result.stderr}")
            outputs.append(result.stdout)
        holders, status = outputs
        [header, holder] = holders.splitlines()
        self.assertEqual(header.split(), ["HOLDER", "HELD", "LEFT", "TOKEN", "MODE", "VALUE"])
        self.assertEqual(holder.split()[4:6], ["shared", "reader%20on%20" + socket.gethostname()])
        self.assertTrue(status.startswith("schema: 2 holding, 0 waiting"), status)


class GroupsExampleTests(SynchronousTestCase):
    def test_the_group_table_example(self) -> None:
        """Members join with capabilities, a second w1 is refused, a lapsed lease and a closed connection end them."""
        text = page_section("Groups")
        [example] = blocks(text, "python")
        [printed] = blocks(text, "text")
        result = run_example(example)
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertEqual(result.stdout, printed)
