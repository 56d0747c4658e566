"""
The memcached listener against a conformance tool nobody on this project
wrote: libmemcached's C{memccapable} (Debian's libmemcached-tools), a
process of its own, run against a real server with C{--memcache-port}
(C{twistd jesync}'s options built by the composition root, in a thread of
this process: L{tests.servers.ServerThread}), text (C{-a}) and binary
(C{-b}) protocols each.  Every one of its tests must pass, as against
memcached 1.6 itself (27 in each mode, libmemcached 1.1.4).

The test skips only when C{memccapable} is not installed (C{.ci/run}
installs it as root).  C{memccapable} flushes the server, so this module has
a server of its own.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unittest
from typing import List

from tests.servers import free_port, serve_in_thread

MEMCCAPABLE = shutil.which("memccapable")
#: How long one mode's run may take (it takes about a second; a few of its
#: tests wait for an expiry).
RUN_WITHIN = 120.0


@unittest.skipIf(MEMCCAPABLE is None, "memccapable is not installed (Debian: apt-get install libmemcached-tools)")
class MemccapableTests(unittest.TestCase):
    def setUp(self) -> None:
        self.port = free_port()
        serve_in_thread(self, extra_args=["--memcache-port", f"tcp:{self.port}:interface=127.0.0.1"])

    def run_mode(self, mode: str) -> List[str]:
        """Run memccapable in one mode (C{-a} text, C{-b} binary); the names of the tests that passed."""
        assert MEMCCAPABLE is not None
        result = subprocess.run(
            [MEMCCAPABLE, "-h", "127.0.0.1", "-p", str(self.port), "-t", "10", mode],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=RUN_WITHIN,
            check=False,
        )
        output = result.stdout.decode(errors="replace")
        passed = re.findall(r"^(.+?)\s+\[pass\]$", output, re.MULTILINE)
        self.assertEqual(result.returncode, 0, output)
        self.assertIn("All tests passed", output, output)
        self.assertNotIn("[FAIL]", output, output)
        return passed

    def test_text_protocol(self) -> None:
        passed = self.run_mode("-a")
        self.assertEqual(len(passed), 27, passed)
        self.assertTrue(all(name.startswith("ascii ") for name in passed), passed)
        # the test that a "verbosity noreply" with no level is answered with nothing
        self.assertIn("ascii verbosity", passed)

    def test_binary_protocol(self) -> None:
        passed = self.run_mode("-b")
        self.assertEqual(len(passed), 27, passed)
        self.assertTrue(all(name.startswith("binary ") for name in passed), passed)
