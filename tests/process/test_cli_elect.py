"""
C{jesync elect}, run as subprocesses against a real server in a thread
(L{serve_in_thread}): of two candidates, one leads and runs its command
while the other waits, and runs its own once the first's has exited, each
with a larger fencing token; C{--observe} (and C{--json}) prints the leader
at its start and on every change, in order; a leadership lost while the
command runs terminates it (status 70); C{--wait} runs out (status 75).
Observers write to a file, read as it grows (with a bound on the wait).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Callable

from twisted.trial.unittest import SynchronousTestCase

from jesync.cli import EXIT_LOCK_LOST, EXIT_TIMEOUT, parse_arguments
from jesync.client import Client
from tests.servers import environment, serve_in_thread

WITHIN = 15.0


class ElectCommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)
        self.address = self.server.address
        self.directory = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.directory, True)
        self.client = Client(self.address)
        self.addCleanup(self.client.close)

    def wait_for(self, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WITHIN
        while not condition():
            if time.monotonic() > deadline:
                self.fail(f"not true within {WITHIN} s: {condition}")
            time.sleep(0.02)

    def spawn(self, *args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "jesync.cli", "--server", self.address, "elect", *args],
            env={name: value for name, value in environment().items() if not name.startswith("JESYNC_")},
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(self._reap, process)
        return process

    def _reap(self, process: subprocess.Popen[str]) -> None:
        if process.poll() is None:
            process.kill()
        process.communicate()

    def observer(self, *options: str) -> tuple[subprocess.Popen[str], Path]:
        """A C{jesync elect --observe db}, its output going to a file (returned), once it has printed its start."""
        path = self.directory / f"observed{len(list(self.directory.iterdir()))}"
        output: IO[str] = path.open("w")
        self.addCleanup(output.close)
        process = self.spawn("--observe", *options, "db", stdout=output)
        self.wait_for(lambda: path.read_text().count("\n") >= 1)
        return process, path

    def lines(self, path: Path, count: int) -> list[str]:
        self.wait_for(lambda: path.read_text().count("\n") >= count)
        return path.read_text().splitlines()

    def test_one_leads_the_other_runs_after(self) -> None:
        """
        The first candidate runs its command (until told to end); the
        second waits, and runs once the first has exited.  Observers print
        each leader in order, with "no leader" between.
        """
        human, human_output = self.observer()
        as_json, json_output = self.observer("--json")
        log = self.directory / "log"
        go = self.directory / "go"
        first = self.spawn(
            "db", "first", "--", "sh", "-c",
            f'echo "first $JESYNC_KEY $JESYNC_FENCING_TOKEN" >> {log}; while [ ! -e {go} ]; do sleep 0.02; done',
        )
        self.wait_for(log.exists)
        second = self.spawn("db", "second", "-c", f'echo "second $JESYNC_KEY $JESYNC_FENCING_TOKEN" >> {log}')
        self.wait_for(lambda: self.client.status("election:db").waiting == 1)
        self.assertEqual([line.split()[0] for line in log.read_text().splitlines()], ["first"])
        go.touch()
        self.assertEqual(first.communicate(timeout=WITHIN)[0], "")
        self.assertEqual(first.returncode, 0)
        second.communicate(timeout=WITHIN)
        self.assertEqual(second.returncode, 0)
        ran = [line.split() for line in log.read_text().splitlines()]
        self.assertEqual([(name, key) for name, key, _ in ran], [("first", "election:db"), ("second", "election:db")])
        first_token, second_token = (int(token) for _, _, token in ran)
        self.assertLess(first_token, second_token)

        printed = self.lines(human_output, 5)
        self.assertEqual(printed[0::2], ["no leader"] * 3)
        self.assertRegex(printed[1], rf"^leader \S+ token={first_token} value=first$")
        self.assertRegex(printed[3], rf"^leader \S+ token={second_token} value=second$")
        rows = [json.loads(line) for line in self.lines(json_output, 5)]
        self.assertEqual([(row["election"], row["value"], row["token"]) for row in rows], [
            ("db", None, None), ("db", "first", first_token), ("db", None, None),
            ("db", "second", second_token), ("db", None, None),
        ])
        for observer in (human, as_json):
            observer.send_signal(signal.SIGINT)
            observer.communicate(timeout=WITHIN)
            self.assertEqual(observer.returncode, 0)

    def test_leadership_lost_terminates_the_command(self) -> None:
        """The server goes away while the leader's command runs: SIGTERM to it, and status 70."""
        started = self.directory / "started"
        process = self.spawn("db", "me", "--", "sh", "-c", f"touch {started}; exec sleep 30")
        self.wait_for(started.exists)
        self.server.kill()
        _, err = process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, EXIT_LOCK_LOST)
        self.assertIn("lost the leadership of 'db'", err)
        self.assertIn("terminating sh", err)
        self.assertIn(f"exited with status {128 + signal.SIGTERM}, but the leadership was lost while it ran", err)

    def test_wait_runs_out(self) -> None:
        """Another leads for longer than --wait: status 75, and the command never runs."""
        held = self.client.lock("election:db", value="someone")
        self.addCleanup(held.release)
        marker = self.directory / "ran"
        process = self.spawn("--wait", "1", "db", "me", "--", "touch", str(marker))
        _, err = process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, EXIT_TIMEOUT)
        self.assertIn("timed out after waiting 1 s for the leadership of 'db'", err)
        self.assertFalse(marker.exists())


class ElectArgumentTests(SynchronousTestCase):
    def parsed(self, *argv: str) -> argparse.Namespace:
        return parse_arguments(["--server", "127.0.0.1:1", "elect", *argv])

    def refused(self, *argv: str) -> None:
        with self.assertRaises(SystemExit) as raised:
            self.parsed(*argv)
        self.assertEqual(raised.exception.code, 2)

    def test_arguments(self) -> None:
        args = self.parsed("db", "host:1", "--", "run", "-x")
        self.assertEqual((args.command, args.program, args.value), (["run", "-x"], "run", b"host:1"))
        self.assertTrue(args.terminate_on_loss)
        self.assertEqual(self.parsed("db", "v", "-c", "a | b").command, ["/bin/sh", "-c", "a | b"])
        self.assertTrue(self.parsed("--observe", "--json", "db").observe)
        self.assertEqual(self.parsed("db", "v", "-c", "x").expires, 60)  # the default
        self.assertEqual(self.parsed("db", "v", "--expires", "0", "-c", "x").expires, 0)
        self.assertFalse(self.parsed("db", "v", "--no-terminate-on-loss", "-c", "x").terminate_on_loss)

    def test_refused(self) -> None:
        self.refused("db")  # no VALUE
        self.refused("db", "v")  # no COMMAND
        self.refused("db", "v", "-c", "x", "--", "y")  # both
        self.refused("--observe", "db", "v")
        self.refused("--observe", "db", "--", "x")
        self.refused("--observe", "--wait", "5", "db")  # campaigning options: not silently ignored
        self.refused("--observe", "--expires", "10", "db")
        self.refused("--observe", "--expires", "0", "db")
        self.refused("--observe", "--no-terminate-on-loss", "db")
        self.refused("--json", "db", "v", "--", "x")
        self.refused("two words", "v", "--", "x")
