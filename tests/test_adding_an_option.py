"""
README's "Adding an option" works as written: its three code blocks (the
table entry, the settings field, the code that uses it), put where the
README says into a copy of jesync, make an option that C{twistd jesync
--help} lists in its group, that the whole-name check knows, and that
C{settings_from} turns into the settings field, with nothing else edited;
and the table and C{ServerSettings} agree field for field.
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

from tests.test_docs import ROOT, readme_blocks

# Where the README puts each block: the entry at the end of its group
# ("Operations", before --version), the field beside the others, and the
# use in place of the startup line's first part.
ENTRY_BEFORE = '    Option("version", "Operations", None, kind=ACTION),\n'
FIELD_AFTER = '    state_dir: Optional[str] = setting_default("state-dir")\n'
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
        raise AssertionError(f"{path.name}: the README's place for the example is not there once: {anchor!r}")
    new = {"before": text + anchor, "after": anchor + text, "instead": text}[where]
    path.write_text(source.replace(anchor, new), encoding="utf-8")


class AddingAnOptionTests(SynchronousTestCase):
    def setUp(self) -> None:
        entry, field, use = readme_blocks("python", "Adding an option")
        self.copy = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.copy)
        for name in ("jesync", "twisted"):
            shutil.copytree(ROOT / name, self.copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        insert(self.copy / "jesync" / "options.py", ENTRY_BEFORE, entry, "before")
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
        """The example is the README's: jesync itself has no --server-name (so the tests above add it)."""
        from jesync import tap
        from jesync.server import ServerSettings

        self.assertNotIn("server-name", tap.Options().whole_names())
        self.assertNotIn("server_name", ServerSettings.__dataclass_fields__)


class TableTests(SynchronousTestCase):
    def test_settings_fields_are_the_tables(self) -> None:
        """
        Every ServerSettings field is set by one option of the table, but
        those read from other options (the tokens from their files, the TLS
        policy from two options); every option's field is a ServerSettings
        field, whose default is the option's.
        """
        import dataclasses

        from jesync.options import OPTIONS, setting_default
        from jesync.server import ServerSettings

        fields = {field.name: field for field in dataclasses.fields(ServerSettings)}
        by_field = {option.field: option for option in OPTIONS if option.field is not None}
        self.assertEqual(len(by_field), len([option for option in OPTIONS if option.field is not None]))
        self.assertEqual(sorted(set(fields) - set(by_field)), ["admin_token", "auth_token", "tls"])
        self.assertEqual(sorted(set(by_field) - set(fields)), [])
        defaults = ServerSettings()
        for name, option in by_field.items():
            declared = setting_default(option.name)
            expected = declared.default_factory() if isinstance(declared, dataclasses.Field) else declared
            self.assertEqual(getattr(defaults, name), expected, name)
