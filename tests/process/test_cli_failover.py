"""
The command line on a cluster (C{jesync lock} is a process of its own,
run as C{python -m jesync.cli}) against real servers standing in for the
members, each on a reactor of its own in a thread of the test's process
(L{serve_in_thread}): a member killed under a running COMMAND.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from jesync.cli import EXIT_LOCK_LOST
from jesync.client import KeyStatus
from tests.failover import WITHIN, closed_address, watch
from tests.servers import environment, serve_in_thread


class CommandLineFailoverTests(SynchronousTestCase):
    def test_lock_lost_by_failover_stops_the_command(self) -> None:
        """jesync lock on a cluster: the member killed, COMMAND is stopped, one clear line, status 70."""
        member, other = serve_in_thread(self), serve_in_thread(self)
        directory = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, directory, True)
        started = directory / "started"
        env = dict(environment(), JESYNC_SERVERS=f"{closed_address()}|{member.address}|{other.address}")
        process = subprocess.Popen(
            [sys.executable, "-m", "jesync.cli", "--connect-timeout", "1", "--read-timeout", "1", "lock", "report"]
            + ["--", "sh", "-c", f"touch {started}; exec sleep 30"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(lambda: process.poll() is None and process.kill())
        deadline = time.monotonic() + WITHIN
        while not started.exists():
            self.assertIsNone(process.poll(), "jesync lock ended before its command started")
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.02)
        self.assertEqual(watch(self, member.address).status("report"), KeyStatus("report", 1, 0))
        member.kill()
        _, err = process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, EXIT_LOCK_LOST)
        lost = f"jesync: lost the lock on 'report': the connection to {member.address} was lost (.+); terminating sh"
        self.assertTrue(any(re.fullmatch(lost, line) for line in err.splitlines()), err)
        self.assertIn(f"exited with status {128 + signal.SIGTERM}", err)
        # The next jesync gets it from the member that answers now.
        status = subprocess.run(
            [sys.executable, "-m", "jesync.cli", "--connect-timeout", "1", "status", "report"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("report: 0 holding, 0 waiting", status.stdout)
