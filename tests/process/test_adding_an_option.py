"""
docs/development.md's "Adding an option" works as written: its two code blocks (the
option, declared as its settings field, and the code that uses it), put
where the page says into a copy of jesync, make an option that
C{twistd jesync --help} lists in its group, that the whole-name check
knows, and that C{settings_from} turns into the settings field, with
nothing else edited; and the table read back from C{ServerSettings} is
its fields, each with its option's default.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.doc_pages import ROOT, page_blocks

# Where the page puts each block: the declaration at the end of its
# group ("Operations", after --verbose's, so before --version), and the use
# in place of the startup line's first part.
FIELD_AFTER = '        short="v",\n        setting=bool,\n    )\n'
USE_REPLACES = '            f"JESync on {shown(self.ports)}"\n'

CHECK = """
import json
from twisted.python import usage
from jesync import tap
from jesync.server import ServerSettings

given = tap.Options()
given.parseOptions(["--server-name", "api"])
settings = tap.settings_from(given)
unnamed = tap.Options()
unnamed.parseOptions([])
try:
    tap.Options().parseOptions(["--server-nam", "api"])
    refusal = None
except usage.UsageError as error:
    refusal = str(error)
print(json.dumps({
    "given": settings.server_name,
    "summary": settings.summary(),
    "unnamed": tap.settings_from(unnamed).server_name,
    "unnamed_summary": tap.settings_from(unnamed).summary(),
    "refusal": refusal,
    "embedded": ServerSettings(server_name="web").server_name,
    "default": ServerSettings().server_name,
}))
"""


def insert(path: Path, anchor: str, text: str, where: str) -> None:
    """Put C{text} before or after C{anchor} (or in its place) in C{path}, where the anchor is once."""
    source = path.read_text(encoding="utf-8")
    if source.count(anchor) != 1:
        raise AssertionError(f"{path.name}: the page's place for the example is not there once: {anchor!r}")
    new = {"before": text + anchor, "after": anchor + text, "instead": text}[where]
    path.write_text(source.replace(anchor, new), encoding="utf-8")


class AddingAnOptionTests(SynchronousTestCase):
    def setUp(self) -> None:
        field, use = page_blocks("docs/development.md", "python", "Adding an option")
        self.copy = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.copy)
        for name in ("jesync", "twisted"):
            shutil.copytree(ROOT / name, self.copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        insert(self.copy / "jesync" / "server.py", FIELD_AFTER, field, "after")
        insert(self.copy / "jesync" / "server.py", USE_REPLACES, use, "instead")

    def run_in_copy(self, *arguments: str) -> str:
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=str(self.copy) + (os.pathsep + path if path else ""), COLUMNS="80")
        result = subprocess.run(
            [sys.executable, *arguments], env=env, cwd=self.copy, capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def test_help_lists_it_in_its_group(self) -> None:
        """twistd jesync --help lists --server-name= under Operations, before --version, with its text."""
        shown = self.run_in_copy("-c", "from twisted.scripts.twistd import run; run()", "jesync", "--help")
        operations = shown.split("\nOperations:\n", 1)[1].split("\n\n", 1)[0]
        self.assertIn(
            "      --server-name=         A name for this server, at the start of its startup\n"
            "                             line (several servers on one host).\n",
            operations,
        )
        self.assertEqual(
            [line.split()[0] for line in operations.splitlines() if line.lstrip().startswith("-")],
            ["--state-dir=", "--keepalive=", "--shutdown-grace=", "-v,", "--server-name=", "--version", "--help"],
        )

    def test_settings_and_whole_names_take_it(self) -> None:
        """--server-name sets the field and names the server in its startup line; a prefix is refused."""
        found = json.loads(self.run_in_copy("-c", CHECK))
        self.assertEqual(found["given"], "api")
        self.assertTrue(found["summary"].startswith("api: JESync on tcp:11400; limits: "), found["summary"])
        self.assertIsNone(found["unnamed"])
        self.assertTrue(found["unnamed_summary"].startswith("JESync on tcp:11400; limits: "), found["unnamed_summary"])
        self.assertEqual(
            found["refusal"],
            "unknown option --server-nam (options are given by their whole names)\nDid you mean --server-name?",
        )
        self.assertEqual(found["embedded"], "web")
        self.assertIsNone(found["default"])

    def test_not_in_the_code_itself(self) -> None:
        """The example is the page's: jesync itself has no --server-name (so the tests above add it)."""
        from jesync import tap
        from jesync.server import ServerSettings

        self.assertNotIn("server-name", tap.Options().whole_names())
        self.assertNotIn("server_name", ServerSettings.__dataclass_fields__)


class TableTests(SynchronousTestCase):
    def test_settings_fields_are_the_tables(self) -> None:
        """
        Every ServerSettings field is an option's declaration, but those
        read from other options (the tokens from their files, the TLS
        policy from the two options declared in it); the table read back
        is those options in the fields' order, each naming its field, then
        --version and --help; every field's default is its option's.
        """
        import dataclasses

        from jesync.options import ACTION, MANY, options_of
        from jesync.server import ServerSettings

        table = options_of(ServerSettings)
        fields = [field.name for field in dataclasses.fields(ServerSettings)]
        by_field = [option.field for option in table if option.field is not None]
        self.assertEqual(by_field, [name for name in fields if name not in ("admin_token", "auth_token", "tls")])
        self.assertEqual(
            [option.name for option in table if option.field is None],
            ["tls-ciphers", "tls-min-version", "version", "help"],
        )
        self.assertEqual([option.name for option in table if option.kind == ACTION], ["version", "help"])
        self.assertEqual(len({option.name for option in table}), len(table))
        defaults = ServerSettings()
        for option in table:
            if option.field is None:
                continue
            if option.kind == MANY:
                expected = [] if option.default is None else [option.default]
            else:
                expected = option.setting(option.default_value())
            self.assertEqual(getattr(defaults, option.field), expected, option.field)
        # (A list default is each instance's own.)
        self.assertIsNot(ServerSettings().ports, defaults.ports)

    def test_startup_line_limits_are_the_logged_options(self) -> None:
        """The startup line's limits are the options declared with logged=, in its order, each shown once."""
        from jesync.options import options_of
        from jesync.server import ServerSettings

        logged = sorted((option for option in options_of(ServerSettings) if option.logged), key=lambda o: o.logged)
        self.assertEqual(len({option.logged for option in logged}), len(logged))
        limits = ServerSettings().summary().split("; limits: ", 1)[1].split("; ", 1)[0]
        self.assertEqual([shown.split("=")[0] for shown in limits.split(", ")], [option.name for option in logged])
