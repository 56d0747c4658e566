"""
The examples of docs/coordination.md work as written and print what the
page says they print.
"""

from __future__ import annotations

import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.doc_pages import ROOT, blocks, section
from tests.servers import environment

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
