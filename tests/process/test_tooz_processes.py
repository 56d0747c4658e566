"""
The tooz backend where a process of its own is the point: a coordinator's
process is killed (its connection closes with it, and the server frees its
locks at once), what C{import jesync} loads in a fresh interpreter (no
tooz), and a TLS server, which runs as C{twistd jesync} (Twisted's
C{listenSSL} schedules a TLS connection's writes on the global reactor, not
on the reactor of a L{tests.servers.ServerThread}, so a TLS listener cannot
run in one).  The server is L{tests.tcp.test_tooz}'s (in a thread of this
process); so are the entry point registration and the subprocesses'
environment that finds it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from unittest import SkipTest

from twisted.trial.unittest import SynchronousTestCase

from tests.servers import free_port, start_server
# (tooz as tests.tcp.test_tooz imports it: that module skips without it)
from tests.tcp.test_tooz import WITHIN, ToozTestCase, coordination, subprocess_environment, tooz


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


class TLSTests(ToozTestCase):
    def test_tls_ca(self) -> None:
        """tls_ca= connects with TLS, trusting that CA."""
        from tests.tcp.test_tls import make_certificate, skip_without_tls

        if skip_without_tls:
            raise SkipTest(skip_without_tls)
        key_path, certificate_path, _ = make_certificate(self)
        tls_port = free_port()
        start_server(  # (twistd: a TLS listener cannot run in a ServerThread, see above)
            self,
            extra_args=[
                "--port",
                f"ssl:{tls_port}:privateKey={key_path}:certKey={certificate_path}:interface=127.0.0.1",
            ],
        )
        coordinator = self.coordinator(f"jesync://127.0.0.1:{tls_port}?tls_ca={certificate_path}")
        with coordinator.get_lock(b"over-tls"):
            pass
        # Without the CA the certificate does not check out.
        plain = coordination.get_coordinator(f"jesync://127.0.0.1:{tls_port}?tls=1", b"member")
        self.assertRaises(tooz.ToozError, plain.start)
