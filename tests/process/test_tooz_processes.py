"""
The tooz backend where a process of its own is the point: a coordinator's
process is killed (its connection closes with it, and the server frees its
locks at once), and what C{import jesync} loads in a fresh interpreter (no
tooz).  The server is L{tests.tooz_case}'s (in a thread of this
process); so are the entry point registration and the subprocesses'
environment that finds it.
"""

from __future__ import annotations

import subprocess
import sys
import time

from twisted.trial.unittest import SynchronousTestCase

from tests.tooz_case import WITHIN, ToozTestCase, subprocess_environment


class ImportTests(SynchronousTestCase):
    def test_jesync_does_not_import_tooz(self) -> None:
        """import jesync and its clients load no tooz; only jesync.tooz_driver does."""
        script = (
            "import sys\n"
            "import jesync, jesync.client, jesync.client.blocking, jesync.client.aio\n"
            "assert not [m for m in sys.modules if m == 'tooz' or m.startswith('tooz.')], 'tooz imported'\n"
            "import jesync.tooz_driver\n"
            "assert 'tooz' in sys.modules\n"
        )
        subprocess.run([sys.executable, "-c", script], env=subprocess_environment(), check=True, timeout=60)


class DeadProcessTests(ToozTestCase):
    def test_dead_process_loses_its_locks(self) -> None:
        """A coordinator's process is killed: its connection closes and the server frees its locks at once."""
        script = (
            "import sys, time\n"
            "from tooz import coordination\n"
            "c = coordination.get_coordinator(sys.argv[1], b'doomed')\n"
            "c.start()\n"
            "assert c.get_lock(b'orphaned').acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n"
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", script, f"{self.url}?lock_expires=600"],
            env=subprocess_environment(),
            stdout=subprocess.PIPE,
        )
        self.addCleanup(holder.wait)
        self.addCleanup(holder.kill)
        assert holder.stdout is not None
        self.assertEqual(holder.stdout.readline(), b"held\n")
        holder.stdout.close()
        survivor = self.coordinator(member=b"survivor")
        lock = survivor.get_lock(b"orphaned")
        self.assertFalse(lock.acquire(blocking=False))
        holder.kill()
        start = time.monotonic()
        self.assertTrue(lock.acquire(blocking=WITHIN))
        self.assertLess(time.monotonic() - start, WITHIN)
        self.assertTrue(lock.release())
