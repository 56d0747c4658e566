"""
A fresh interpreter that imports this checkout's jesync (L{run_python}), and
what a statement run in one loads (L{loaded_after}): for the import
isolation and packaging tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> Any:
    """
    Run C{code} in a fresh interpreter that imports this checkout's jesync
    (as L{tests.servers.environment} arranges, without importing the server
    here) and return what it printed, as JSON.
    """
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise AssertionError(f"the subprocess failed ({result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout)


def loaded_after(statement: str, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """
    After running C{statement} in a fresh interpreter: the modules loaded
    that are, or are inside, one of C{prefixes}; and where jesync came from.
    """
    code = (
        "import json, sys\n"
        f"{statement}\n"
        "import jesync\n"
        f"prefixes = {prefixes!r}\n"
        "loaded = sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in prefixes))\n"
        "print(json.dumps({'loaded': loaded, 'jesync': jesync.__file__}))\n"
    )
    return run_python(code)
