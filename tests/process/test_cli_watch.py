"""
The C{jesync} command's coordination commands, run as subprocesses against
a real server in a thread (L{serve_in_thread}): C{jesync watch KEY} and
C{--prefix P} print one event per line as other clients lock and release
(C{--json}: one object per line), until SIGINT or SIGTERM (status 0), and
end with status 69 when the server goes away or their output is read too
slowly; two C{jesync lock --shared} run their commands at once; C{--value
V} is what C{jesync holders} shows.
"""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from twisted.trial.unittest import SynchronousTestCase

from jesync.cli import EXIT_UNAVAILABLE
from jesync.client import Client
from tests.doc_pages import page_blocks
from tests.servers import environment, serve_in_thread

WITHIN = 10.0


def cli_environment() -> dict[str, str]:
    return {name: value for name, value in environment().items() if not name.startswith("JESYNC_")}


class Lines:
    """A process's stdout, read line by line in a thread, so a test waits for each with a bound."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[Optional[str]] = queue.Queue()
        assert process.stdout is not None
        stdout = process.stdout

        def read() -> None:
            for line in stdout:
                self._lines.put(line.rstrip("\n"))
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def next(self, within: float = WITHIN) -> Optional[str]:
        """The next line; None at the end of the output.  Fails the test if none comes in time."""
        try:
            return self._lines.get(timeout=within)
        except queue.Empty:
            raise AssertionError(f"no line within {within} s") from None


class CoordinationCLITests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)
        self.address = self.server.address
        self.directory = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.directory, True)

    def client(self) -> Client:
        client = Client(self.address)
        self.addCleanup(client.close)
        return client

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "jesync.cli", "--server", self.address, *args],
            env=cli_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(self._reap, process)
        return process

    def _reap(self, process: subprocess.Popen[str]) -> None:
        if process.poll() is None:
            process.kill()
        process.communicate()

    def run_command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jesync.cli", "--server", self.address, *args],
            env=cli_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def wait_for(self, condition: Callable[[], bool], within: float = WITHIN) -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for a condition")
            time.sleep(0.02)

    def watching(self, count: int = 1) -> None:
        """Wait until the server has C{count} watches (the command has started watching)."""
        self.wait_for(lambda: self.server.server.locks.watch_count >= count)

    def ended(self, process: subprocess.Popen[str], sent: Optional[int] = None) -> tuple[int, str]:
        if sent is not None:
            process.send_signal(sent)
        _, err = process.communicate(timeout=WITHIN)
        return process.returncode, err

    def test_watch_key(self) -> None:
        """One human line per event, in order; a value percent-encoded; SIGINT ends it with status 0."""
        watch = self.spawn("watch", "leader")
        lines = Lines(watch)
        self.watching()
        worker = self.client()
        lock = worker.lock("leader", value="10.0.0.5:8080 a")
        peer = worker.holders("leader")[0].peer
        self.assertTrue(lock.release())
        self.assertEqual(lines.next(), f"granted leader {peer} token={lock.token} exclusive value=10.0.0.5:8080%20a")
        self.assertEqual(lines.next(), f"released leader {peer} token={lock.token}")
        status, err = self.ended(watch, signal.SIGINT)
        self.assertEqual((status, err), (0, ""))

    def test_watch_prefix_json(self) -> None:
        """--prefix --json: one JSON object per line, keys appearing and disappearing; SIGTERM: status 0."""
        watch = self.spawn("watch", "--prefix", "jobs/", "--json")
        lines = Lines(watch)
        self.watching()
        worker = self.client()
        worker.lock("elsewhere").release()
        lock = worker.lock("jobs/1", shared=True)
        self.assertTrue(lock.release())
        events = [json.loads(lines.next() or "") for _ in range(4)]
        self.assertEqual(
            [(e["kind"], e["key"]) for e in events],
            [("appeared", "jobs/1"), ("granted", "jobs/1"), ("released", "jobs/1"), ("disappeared", "jobs/1")],
        )
        appeared = {"kind": "appeared", "key": "jobs/1", "holder": None, "token": None, "mode": None, "value": None}
        self.assertEqual(events[0], appeared)
        self.assertEqual((events[1]["mode"], events[1]["token"], events[1]["value"]), ("shared", lock.token, None))
        status, err = self.ended(watch, signal.SIGTERM)
        self.assertEqual((status, err), (0, ""))

    def test_watch_ends_when_the_server_goes(self) -> None:
        watch = self.spawn("watch", "leader")
        self.watching()
        self.server.kill()
        status, err = self.ended(watch)
        self.assertEqual(status, EXIT_UNAVAILABLE)
        self.assertIn("jesync: ", err)

    def test_watch_read_too_slowly(self) -> None:
        """
        jesync watch | slow: once 10,000 events wait to be printed it stops
        watching (at the next event), prints those, says so and exits 69.
        Nobody reads its output here until then: past the pipe's buffer
        (a few hundred lines) every event waits in its queue.
        """
        watch = self.spawn("watch", "--prefix", "")
        self.watching()
        worker = self.client()
        keys = [f"k{n}" for n in range(1000)]
        for _ in range(4):  # 4,000 events each: appeared and granted, released and disappeared, per key
            self.assertTrue(worker.lock_many(keys).release())
        self.wait_for(lambda: self.server.server.locks.watch_count == 0)
        out, err = watch.communicate(timeout=WITHIN)
        self.assertEqual(watch.returncode, EXIT_UNAVAILABLE, err)
        self.assertIn("jesync: the watch of prefix '': its output was read too slowly (10000 events waiting): stopped", err)
        printed = out.splitlines()
        self.assertGreater(len(printed), 10_000)
        self.assertLess(len(printed), 16_000)
        self.assertEqual(printed[:2], ["appeared k0", printed[1]])
        self.assertTrue(printed[1].startswith("granted k0 "), printed[1])

    def test_two_shared_locks_run_at_once(self) -> None:
        """Each command waits for the other's marker: both succeed only if both hold the lock together."""
        script = (
            'touch "$MINE"; i=0; while [ ! -e "$THEIRS" ]; do i=$((i+1)); '
            '[ $i -gt 500 ] && exit 3; sleep 0.02; done'
        )
        a, b = str(self.directory / "a"), str(self.directory / "b")
        first = self.spawn("lock", "--shared", "schema", "-c", script.replace("$MINE", a).replace("$THEIRS", b))
        second = self.spawn("lock", "--shared", "schema", "-c", script.replace("$MINE", b).replace("$THEIRS", a))
        self.assertEqual(self.ended(first), (0, ""))
        self.assertEqual(self.ended(second), (0, ""))

    def test_exclusive_waits_for_shared(self) -> None:
        """jesync lock (exclusive) waits while a shared holder holds the key."""
        reader = self.client().lock("schema", shared=True)
        result = self.run_command("lock", "--wait", "1", "schema", "--", "true")
        self.assertEqual(result.returncode, 75, result.stderr)
        self.assertTrue(reader.release())
        self.assertEqual(self.run_command("lock", "--wait", "1", "schema", "--", "true").returncode, 0)

    def test_value_in_holders(self) -> None:
        """--value V is on the grant: jesync holders shows it, with the mode (and --json as text)."""
        result = self.run_command(
            "lock", "--shared", "--value", "reader é", "schema", "--",
            sys.executable, "-m", "jesync.cli", "--server", self.address, "holders", "--json", "schema",
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        [holder] = json.loads(result.stdout)
        self.assertEqual((holder["key"], holder["mode"], holder["value"]), ("schema", "shared", "reader é"))
        lock = self.client().lock("leader", value="me")
        table = self.run_command("holders", "leader")
        self.assertEqual(table.returncode, 0, table.stderr)
        heading, row = table.stdout.splitlines()
        self.assertEqual(heading.split(), ["HOLDER", "HELD", "LEFT", "TOKEN", "MODE", "VALUE"])
        self.assertEqual(row.split()[3:], [str(lock.token), "exclusive", "me"])

    def test_the_docs_transcript(self) -> None:
        """docs/clients.md's jesync watch example: a worker takes jobs/17 with a value and releases it."""
        [transcript] = [
            block for block in page_blocks("docs/clients.md", "console", "Using it from the shell")
            if "jesync watch" in block
        ]
        command, *expected = transcript.splitlines()
        watch = self.spawn(*command.split()[2:])
        lines = Lines(watch)
        self.watching()
        worker = self.client()
        lock = worker.lock("jobs/17", value="worker-3")
        peer = worker.holders("jobs/17")[0].peer
        self.assertTrue(lock.release())
        printed = [lines.next() for _ in expected]
        documented = [line.replace("10.0.0.5:40112", peer) for line in expected]
        self.assertEqual(printed, [line.replace("token=42", f"token={lock.token}") for line in documented])
        self.assertEqual(self.ended(watch, signal.SIGINT), (0, ""))
