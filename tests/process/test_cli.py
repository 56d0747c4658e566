"""
The C{jesync} command line, run as a subprocess (C{python -m jesync.cli})
against real servers (the composition root's, on a reactor of its own in a
thread of the test's process: L{serve_in_thread}; C{kill} closes its
connections as a dead process's): exit statuses, renewal, signals, a
server killed under a running command, the read-only commands, and what
it shares with flock(1) (--nonblock, -c) and etcdctl lock (the key in
$JESYNC_KEY).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync import __version__
from jesync.cli import (
    EXIT_BUSY,
    EXIT_CANNOT_RUN,
    EXIT_LOCK_LOST,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    FENCING_TOKEN_VARIABLE,
    KEY_VARIABLE,
)
from jesync.client import Client, KeyStatus
from tests.servers import environment, fake_server, free_port, serve_in_thread

WITHIN = 10.0


def cli_environment(**extra: str) -> dict[str, str]:
    env = environment()
    env.pop("JESYNC_SERVERS", None)
    env.update(extra)
    return env


def jesync(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run the command line to completion (stdin is not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "jesync.cli", *args],
        env=env or cli_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class CLITestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.directory = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.directory, True)

    def start_server(self) -> str:
        self.server = serve_in_thread(self)
        return self.server.address

    def client(self, address: str) -> Client:
        client = Client(address)
        self.addCleanup(client.close)
        return client

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "jesync.cli", *args],
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

    def wait_for(self, condition: Any, within: float = WITHIN) -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for a condition")
            time.sleep(0.02)

    def marker(self, name: str = "started") -> Path:
        return self.directory / name


class LockCommandTests(CLITestCase):
    def test_runs_the_command_holding_the_lock(self) -> None:
        """COMMAND runs while the lock is held (and renewed past --expires); jesync exits with its status."""
        address = self.start_server()
        watcher = self.client(address)
        started = self.marker()
        process = self.spawn(
            "--server", address, "lock", "--expires", "1", "report", "--",
            "sh", "-c", f'touch {started}; sleep 2.5; echo "done $0"; exit 3', "argument",
        )
        self.wait_for(started.exists)
        self.assertEqual(watcher.status("report"), KeyStatus("report", 1, 0))
        time.sleep(1.8)  # past the 1 s failsafe: only renewal keeps it
        self.assertEqual(watcher.status("report"), KeyStatus("report", 1, 0))
        out, err = process.communicate(timeout=WITHIN)
        self.assertEqual((process.returncode, out, err), (3, "done argument\n", ""))
        self.assertEqual(watcher.status("report"), KeyStatus("report", 0, 0))

    def test_wait_timeout(self) -> None:
        address = self.start_server()
        self.client(address).lock("report")
        result = jesync("--server", address, "lock", "--wait", "0", "report", "--", "touch", str(self.marker()))
        self.assertEqual(result.returncode, EXIT_TIMEOUT)
        self.assertIn("timed out after waiting 0 s for the lock on 'report'", result.stderr)
        self.assertFalse(self.marker().exists())
        result = jesync("--server", address, "lock", "-w", "0", "-E", "9", "report", "--", "true")
        self.assertEqual(result.returncode, 9)

    def test_command_not_found_or_not_executable(self) -> None:
        address = self.start_server()
        result = jesync("--server", address, "lock", "report", "--", "no-such-command-jesync")
        self.assertEqual(result.returncode, EXIT_NOT_FOUND)
        self.assertIn("command not found", result.stderr)
        not_executable = self.marker("script")
        not_executable.write_text("#!/bin/sh\n")
        result = jesync("--server", address, "lock", "report", "--", str(not_executable))
        self.assertEqual(result.returncode, EXIT_CANNOT_RUN)
        self.assertEqual(self.client(address).status("report"), KeyStatus("report", 0, 0))

    def test_server_refuses(self) -> None:
        server = fake_server(self, lambda line: b"INVALID_PARAMETER: no thanks\n")
        result = jesync("--server", server.address, "lock", "report", "--", "touch", str(self.marker()))
        self.assertEqual(result.returncode, EXIT_REFUSED)
        self.assertIn("the server refused the request: INVALID_PARAMETER: no thanks", result.stderr)
        self.assertFalse(self.marker().exists())

    def test_server_unreachable(self) -> None:
        result = jesync("--server", f"127.0.0.1:{free_port()}", "lock", "report", "--", "true")
        self.assertEqual(result.returncode, EXIT_UNAVAILABLE)
        self.assertIn("cannot connect", result.stderr)


class FencingTokenTests(CLITestCase):
    PRINT_TOKEN = ["sh", "-c", 'echo "${JESYNC_FENCING_TOKEN-unset}"']
    PRINT_KEY_AND_TOKEN = 'echo "$JESYNC_KEY ${JESYNC_FENCING_TOKEN-unset}"'

    def test_token_in_the_environment(self) -> None:
        """
        COMMAND gets the grant's fencing token in $JESYNC_FENCING_TOKEN (not
        an outer one): each grant's is larger than the one before.
        """
        address = self.start_server()
        self.assertEqual(FENCING_TOKEN_VARIABLE, "JESYNC_FENCING_TOKEN")
        nested = cli_environment(JESYNC_FENCING_TOKEN="stale")
        first = jesync("--server", address, "lock", "report", "--", *self.PRINT_TOKEN, env=nested)
        between = self.client(address).lock("report")
        between.release()
        second = jesync("--server", address, "lock", "report", "--", *self.PRINT_TOKEN)
        self.assertEqual((first.returncode, second.returncode), (0, 0), first.stderr + second.stderr)
        tokens = [int(first.stdout), between.token, int(second.stdout)]
        self.assertTrue(tokens[0] < tokens[1] < tokens[2], tokens)

    def test_no_token_from_an_older_server(self) -> None:
        """A server without fencing (INVALID_COMMAND): COMMAND runs as before, the variable unset."""

        def older(line: bytes) -> bytes:
            word, *args = line.split()
            if word == b"lock":
                return b"GRANTED 1 0 %s 120\n" % args[0]
            if word == b"release":
                return b"RELEASED 0 0 %s\n" % args[0]
            if word == b"status":
                return b"STATUS 1 0 %s\n" % args[0]
            return b"INVALID_COMMAND\n"

        server = fake_server(self, older)
        nested = cli_environment(JESYNC_FENCING_TOKEN="stale")
        result = jesync("--server", server.address, "lock", "report", "--", *self.PRINT_TOKEN, env=nested)
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "unset\n", ""))
        self.assertIn(b"fencing on", server.received)
        result = jesync("--server", server.address, "lock", "report", "-c", self.PRINT_KEY_AND_TOKEN, env=nested)
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "report unset\n", ""))

    def test_key_in_the_environment(self) -> None:
        """
        COMMAND gets the key it runs under in $JESYNC_KEY (as etcdctl lock
        exports ETCD_LOCK_KEY), beside the fencing token; an outer jesync
        lock's is replaced, and a nested lock sees its own.
        """
        address = self.start_server()
        self.assertEqual(KEY_VARIABLE, "JESYNC_KEY")
        nested = cli_environment(JESYNC_KEY="outer", JESYNC_FENCING_TOKEN="stale")
        result = jesync("--server", address, "lock", "report", "-c", self.PRINT_KEY_AND_TOKEN, env=nested)
        self.assertEqual(result.returncode, 0, result.stderr)
        key, token = result.stdout.split()
        self.assertEqual(key, "report")
        self.assertGreater(int(token), 0)
        result = jesync(
            "--server", address, "lock", "outer", "--",
            sys.executable, "-m", "jesync.cli", "--server", address, "lock", "inner", "--",
            "sh", "-c", 'echo "$JESYNC_KEY"',
        )
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "inner\n", ""))


class NonblockTests(CLITestCase):
    """--nonblock is flock -n: when the lock is held, exit at once, silently, with status 1 (or -E's)."""

    def test_held_by_another_client(self) -> None:
        address = self.start_server()
        watcher = self.client(address)
        watcher.lock("report")  # returns once the server has said GRANTED
        result = jesync("--server", address, "lock", "--nonblock", "report", "--", "touch", str(self.marker()))
        self.assertEqual((result.returncode, result.stdout, result.stderr), (EXIT_BUSY, "", ""))
        self.assertEqual(EXIT_BUSY, 1)
        self.assertFalse(self.marker().exists())
        result = jesync("--server", address, "lock", "--nonblock", "-E", "9", "report", "-c", f"touch {self.marker()}")
        self.assertEqual((result.returncode, result.stderr), (9, ""))
        self.assertFalse(self.marker().exists())
        # Nothing was left waiting.
        self.assertEqual(watcher.status("report"), KeyStatus("report", 1, 0))

    def test_held_by_another_jesync_lock(self) -> None:
        """A lock held by a running `jesync lock`: --nonblock gives up; once it is over, --nonblock gets it."""
        address = self.start_server()
        started, finish = self.marker(), self.marker("finish")
        holder = self.spawn(
            "--server", address, "lock", "report", "-c",
            f"touch {started}; while [ ! -e {finish} ]; do sleep 0.02; done",
        )
        self.wait_for(started.exists)
        result = jesync("--server", address, "lock", "--nonblock", "report", "--", "echo", "ran")
        self.assertEqual((result.returncode, result.stdout, result.stderr), (EXIT_BUSY, "", ""))
        finish.touch()
        holder.communicate(timeout=WITHIN)
        self.assertEqual(holder.returncode, 0)
        result = jesync("--server", address, "lock", "--nonblock", "report", "--", "echo", "ran")
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "ran\n", ""))

    def test_free_or_a_free_slot(self) -> None:
        """A free lock, or a semaphore (-n, unlike flock's) with a slot left: COMMAND runs at once."""
        address = self.start_server()
        result = jesync("--server", address, "lock", "--nonblock", "report", "--", "sh", "-c", "exit 5")
        self.assertEqual(result.returncode, 5)
        self.client(address).lock("slots", max_concurrent=2)
        result = jesync("--server", address, "lock", "--nonblock", "-n", "2", "slots", "-c", "echo in")
        self.assertEqual((result.returncode, result.stdout), (0, "in\n"))
        result = jesync("--server", address, "lock", "--nonblock", "-n", "1", "slots", "-c", "echo in")
        self.assertEqual((result.returncode, result.stdout), (EXIT_BUSY, ""))

    def test_same_try_as_wait_0(self) -> None:
        """--wait 0 tries once too, but says so and exits 75 (jesync's own status for a timed-out wait)."""
        address = self.start_server()
        self.client(address).lock("report")
        result = jesync("--server", address, "lock", "--wait", "0", "report", "--", "true")
        self.assertEqual(result.returncode, EXIT_TIMEOUT)
        self.assertIn("timed out after waiting 0 s", result.stderr)


class ShellCommandTests(CLITestCase):
    """-c STRING runs STRING with /bin/sh -c, as flock -c does."""

    def test_shell_syntax(self) -> None:
        address = self.start_server()
        watcher = self.client(address)
        status_file = self.marker("status")
        result = jesync(
            "--server", address, "lock", "report", "-c",
            f"printf '%s\\n' b a c | sort | tr a-z A-Z && echo done > {status_file}; exit 4",
        )
        self.assertEqual((result.returncode, result.stdout, result.stderr), (4, "A\nB\nC\n", ""))
        self.assertEqual(status_file.read_text(), "done\n")
        self.assertEqual(watcher.status("report"), KeyStatus("report", 0, 0))

    def test_holds_the_lock(self) -> None:
        """The lock is held while the shell command runs, and released after."""
        address = self.start_server()
        watcher = self.client(address)
        started, finish = self.marker(), self.marker("finish")
        process = self.spawn(
            "--server", address, "lock", "--command", f"touch {started}; until [ -e {finish} ]; do sleep 0.02; done",
            "report",
        )
        self.wait_for(started.exists)
        self.assertEqual(watcher.status("report"), KeyStatus("report", 1, 0))
        finish.touch()
        process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, 0)
        self.assertEqual(watcher.status("report"), KeyStatus("report", 0, 0))

    def test_command_not_found_in_the_shell(self) -> None:
        """The shell's own status: 127 for a command it cannot find."""
        address = self.start_server()
        result = jesync("--server", address, "lock", "report", "-c", "no-such-command-jesync")
        self.assertEqual(result.returncode, EXIT_NOT_FOUND)


class SignalTests(CLITestCase):
    def test_sigterm_reaches_the_command(self) -> None:
        """SIGTERM to jesync is passed on; COMMAND dies of it (128+15), and the lock is released."""
        address = self.start_server()
        started = self.marker()
        process = self.spawn("--server", address, "lock", "report", "--", "sh", "-c", f"touch {started}; exec sleep 30")
        self.wait_for(started.exists)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, 128 + signal.SIGTERM)
        self.assertEqual(self.client(address).status("report"), KeyStatus("report", 0, 0))

    def test_sigint_reaches_the_command(self) -> None:
        """
        SIGINT to jesync (not from a terminal) is passed on; COMMAND may
        handle it, and jesync exits with COMMAND's status.
        """
        address = self.start_server()
        started, got = self.marker(), self.marker("got-signal")
        child = (
            "import pathlib, signal, sys, time\n"
            "def interrupted(signum, frame):\n"
            f"    pathlib.Path({str(got)!r}).write_text(signal.Signals(signum).name)\n"
            "    sys.exit(7)\n"
            "signal.signal(signal.SIGINT, interrupted)\n"
            f"pathlib.Path({str(started)!r}).touch()\n"
            "time.sleep(30)\n"
        )
        process = self.spawn("--server", address, "lock", "report", "--", sys.executable, "-c", child)
        self.wait_for(started.exists)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, 7)
        self.assertEqual(got.read_text(), "SIGINT")
        self.assertEqual(self.client(address).status("report"), KeyStatus("report", 0, 0))

    def test_interrupted_while_waiting(self) -> None:
        """SIGINT while waiting for the lock: jesync exits 130, COMMAND never runs, the wait is withdrawn."""
        address = self.start_server()
        watcher = self.client(address)
        watcher.lock("report")
        process = self.spawn("--server", address, "lock", "report", "--", "touch", str(self.marker()))
        self.wait_for(lambda: watcher.status("report").waiting == 1)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, 128 + signal.SIGINT)
        self.assertFalse(self.marker().exists())
        self.wait_for(lambda: watcher.status("report") == KeyStatus("report", 1, 0))


class LockLostTests(CLITestCase):
    def test_server_killed_while_the_command_runs(self) -> None:
        """jesync says so at once, lets COMMAND finish, and exits 70."""
        address = self.start_server()
        started = self.marker()
        process = self.spawn("--server", address, "lock", "report", "--", "sh", "-c", f"touch {started}; sleep 1.5")
        self.wait_for(started.exists)
        began = time.monotonic()
        self.server.kill()
        out, err = process.communicate(timeout=WITHIN)
        self.assertGreater(time.monotonic() - began, 1.0)  # COMMAND was left to finish
        self.assertEqual(process.returncode, EXIT_LOCK_LOST)
        self.assertIn("lost the lock on 'report'", err)
        self.assertIn("keeps running", err)
        self.assertIn("exited with status 0, but the lock was lost while it ran", err)

    def test_terminate_on_loss(self) -> None:
        address = self.start_server()
        started = self.marker()
        process = self.spawn(
            "--server", address, "lock", "--terminate-on-loss", "report", "--",
            "sh", "-c", f"touch {started}; exec sleep 30",
        )
        self.wait_for(started.exists)
        self.server.kill()
        out, err = process.communicate(timeout=WITHIN)
        self.assertEqual(process.returncode, EXIT_LOCK_LOST)
        self.assertIn("terminating", err)
        self.assertIn(f"exited with status {128 + signal.SIGTERM}", err)


class ReadingCommandTests(CLITestCase):
    def test_status_list_ping(self) -> None:
        address = self.start_server()
        holder = self.client(address)
        holder.lock("report")
        holder.lock("slots", max_concurrent=3)
        result = jesync("--server", address, "status", "report")
        self.assertEqual((result.returncode, result.stdout), (0, f"report: 1 holding, 0 waiting ({address})\n"))
        result = jesync("status", "--json", "report", env=cli_environment(JESYNC_SERVERS=address))
        self.assertEqual(json.loads(result.stdout), {"key": "report", "granted": 1, "waiting": 0, "server": address})
        result = jesync("list", "--server", address)
        self.assertEqual(result.stdout, "KEY     GRANTED  WAITING\nreport        1        0\nslots         1        0\n")
        result = jesync("--server", address, "list", "--by", "grants", "--json")
        self.assertEqual([row["key"] for row in json.loads(result.stdout)], ["report", "slots"])
        result = jesync("--server", address, "ping")
        self.assertEqual(result.returncode, 0)
        self.assertRegex(result.stdout, rf"^{address}: reachable, round trip [0-9.]+ ms\n$")

    def test_several_servers(self) -> None:
        """Listing merges every server's keys; ping reports each, and exits 69 if one is down."""
        first, second = serve_in_thread(self).address, serve_in_thread(self).address
        Client(first).lock("on-first")
        Client(second).lock("on-second")
        down = f"127.0.0.1:{free_port()}"
        env = cli_environment(JESYNC_SERVERS=f"{first},{second}")
        result = jesync("list", env=env)
        self.assertEqual(
            result.stdout.splitlines(),
            [
                "KEY        GRANTED  WAITING  SERVER",
                f"on-first         1        0  {first}",
                f"on-second        1        0  {second}",
            ],
        )
        result = jesync("ping", "--json", "--server", first, "--server", down)
        self.assertEqual(result.returncode, EXIT_UNAVAILABLE)
        [up, unreachable] = json.loads(result.stdout)
        self.assertEqual((up["server"], up["reachable"]), (first, True))
        self.assertEqual((unreachable["server"], unreachable["reachable"]), (down, False))

    def test_unreachable(self) -> None:
        down = f"127.0.0.1:{free_port()}"
        for command in (["status", "report"], ["list"], ["ping"]):
            result = jesync("--server", down, *command)
            self.assertEqual(result.returncode, EXIT_UNAVAILABLE, command)


class InstalledCommandTests(SynchronousTestCase):
    """
    The command line's help, version and usage errors as it runs installed
    (a process: C{python -m jesync.cli}); the rest of its argument handling
    is checked in this process, in tests/unit/test_cli_arguments.py.
    """

    def test_help_everywhere(self) -> None:
        """Every command has --help with examples; the main help documents the exit statuses."""
        result = jesync("--help")
        self.assertEqual(result.returncode, 0)
        for text in ["examples:", "exit status:", str(EXIT_TIMEOUT), str(EXIT_LOCK_LOST), str(EXIT_UNAVAILABLE)]:
            self.assertIn(text, result.stdout)

    def test_version(self) -> None:
        """jesync --version prints the package's version and exits 0."""
        result = jesync("--version")
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, f"jesync {__version__}\n", ""))

    def test_bad_arguments(self) -> None:
        result = jesync("lock", "k")
        self.assertEqual(result.returncode, 2)
        self.assertIn("a COMMAND to run is needed", result.stderr)

    def test_usage_errors_show_the_command_usage(self) -> None:
        """
        A usage error in jesync lock (or any command) prints that command's
        usage and the error, status 2; one before the command, jesync's.
        """
        lock_usage = "usage: jesync lock [options] KEY -- COMMAND [ARGS...]\n       jesync lock [options] KEY -c STRING\n"
        result = jesync("lock", "--bogus", "k", "--", "true")  # the installed way: the same
        self.assertEqual(result.returncode, 2)
        self.assertTrue(result.stderr.startswith(lock_usage), result.stderr)
