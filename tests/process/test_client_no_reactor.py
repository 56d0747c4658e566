"""
The blocking and asyncio clients never touch the Twisted reactor: each is
run in a fresh Python process (a process is the point: this test process
has imported the reactor long ago) against the real server in a thread of
this one, and the process checks that C{twisted.internet.reactor} was never
imported.
"""

from __future__ import annotations

import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.servers import environment, serve_in_thread


class NoReactorTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def run_script(self, script: str) -> None:
        subprocess.run([sys.executable, "-c", script], env=environment(), check=True, timeout=30)

    def test_blocking(self) -> None:
        """The blocking client never touches the Twisted reactor."""
        self.run_script(
            "import sys\n"
            "from jesync.client import Client\n"
            f"with Client({self.server.address!r}) as client:\n"
            "    client.lock('k').release()\n"
            "assert 'twisted.internet.reactor' not in sys.modules\n"
        )

    def test_asyncio(self) -> None:
        """The asyncio client never touches the Twisted reactor."""
        self.run_script(
            "import asyncio, sys\n"
            "from jesync.client import AsyncClient\n"
            "async def main():\n"
            f"    async with AsyncClient({self.server.address!r}) as client:\n"
            "        async with client.lock('k'):\n"
            "            pass\n"
            "asyncio.run(main())\n"
            "assert 'twisted.internet.reactor' not in sys.modules\n"
        )
