"""
The README's embedding example runs as written and prints what the README
says it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).resolve().parents[2]


def readme_blocks(language: str, section: str | None = None) -> list[str]:
    """The README's code blocks in C{language}, in the section C{## section} if given."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    if section is not None:
        text = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.S | re.M).group(1)
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


class ReadmeTests(SynchronousTestCase):
    def test_opens_with_two_commands(self) -> None:
        """The first code block holds exactly the install-and-run and install-and-test commands."""
        first = readme_blocks("sh")[0].splitlines()
        self.assertEqual(
            first,
            ["pip install . && twistd -n --pidfile= jesync", "pip install '.[test]' && python -m pytest"],
        )

    def test_embedding_example_runs_as_documented(self) -> None:
        example, _ = readme_blocks("python", "Embedding it")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        result = subprocess.run(
            [sys.executable, "-c", example],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        [expected] = readme_blocks("text", "Embedding it")
        lines = result.stdout.splitlines()
        expected_lines = expected.splitlines()
        self.assertEqual(len(lines), len(expected_lines), result.stdout)
        self.assertRegex(lines[0], r"^serving JESync on port \d+$")
        self.assertEqual(lines[1:], expected_lines[1:])

    def test_whole_server_example_builds(self) -> None:
        """The README's build_server example builds both listeners over one lock table."""
        _, example = readme_blocks("python", "Embedding it")
        check = (
            "\nprint(sorted(type(child.factory).__name__ for child in server))"
            "\nprint(all(child.factory.service is server.locks for child in server))"
            "\nprint(server.policy.idle_timeout)"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        result = subprocess.run(
            [sys.executable, "-c", example + check], env=env, capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), ["['ELockFactory', 'JESyncFactory']", "True", "300"])

    def test_memcached_example_locks_an_object(self) -> None:
        """The README's pymemcache example runs against a real server and leaves the object written and unlocked."""
        from tests.servers import free_port, start_server

        text = (ROOT / "README.md").read_text(encoding="utf-8")
        [example] = [
            textwrap.dedent(block)
            for block in re.findall(r"^  ```python\n(.*?)^  ```", text, re.S | re.M)
            if "pymemcache" in block
        ]
        port = free_port()
        start_server(self, extra_args=["--memcache-port", f"tcp:{port}:interface=127.0.0.1"])
        check = (
            "\nother = Client(('127.0.0.1', PORT))"
            "\nprint(other.get('report'))"
            "\nprint(other.raw_command(b'lock report'))"
        ).replace("PORT", str(port))
        result = subprocess.run(
            [sys.executable, "-c", example.replace("11211", str(port)) + check],
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), ["b'final'", "b'OK'"])
