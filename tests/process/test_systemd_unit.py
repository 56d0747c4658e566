"""
C{etc/jesync.service}, the systemd unit: C{systemd-analyze verify} accepts it,
C{systemd-analyze security} rates its sandbox "OK" or better, and its
C{ExecStart} command line, run as it is written (but for the paths and the
port), serves JESync and logs for the journal.

The first two need C{systemd-analyze} (Debian's C{systemd} package, which
C{.ci/run} installs when it is missing), not a running systemd: they skip, and
say so, where it is not installed.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from twisted.trial.unittest import SkipTest, SynchronousTestCase

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPOSITORY, "etc", "jesync.service")
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")

#: Where the unit expects things, and what the command-line test puts there.
UNIT_TWISTD = "/opt/jesync/bin/twistd"
UNIT_PORT = "tcp:11400"
UNIT_STATE_DIR = "/var/lib/jesync"

#: systemd-analyze security's levels, best first; "OK" is an exposure below 5.0.
LEVELS = ["PERFECT", "SAFE", "OK", "MEDIUM", "EXPOSED", "UNSAFE", "DANGEROUS"]

#: --offline=yes came with systemd 250.
OFFLINE_SECURITY_SINCE = 250


def unit_settings() -> Dict[str, List[str]]:
    """Every C{Key=value} of the unit file, values in order, sections merged."""
    settings: Dict[str, List[str]] = {}
    with open(UNIT, encoding="utf-8") as unit:
        for line in unit:
            line = line.strip()
            if not line or line.startswith(("#", ";", "[")):
                continue
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def systemd_analyze() -> Tuple[str, int]:
    """The path of systemd-analyze and systemd's version; skips the test without it."""
    path = shutil.which("systemd-analyze")
    if path is None:
        raise SkipTest(
            "systemd-analyze is not installed (apt-get install systemd; .ci/run installs it when run as root)"
        )
    output = subprocess.run([path, "--version"], stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    match = re.match(r"systemd (\d+)", output)
    if match is None:
        raise AssertionError(f"systemd-analyze --version: unexpected output {output!r}")
    return path, int(match.group(1))


def analyze(*args: str) -> subprocess.CompletedProcess:
    path, _ = systemd_analyze()
    environment = dict(os.environ, SYSTEMD_COLORS="0", SYSTEMD_PAGER="", SYSTEMD_LOG_COLOR="0")
    return subprocess.run(
        [path, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        env=environment,
        timeout=120,
    )


class SystemdAnalyzeTests(SynchronousTestCase):
    """The unit as systemd sees it."""

    def test_verify(self) -> None:
        """
        C{systemd-analyze verify} finds nothing wrong.  It checks that
        C{ExecStart}'s program exists, so it reads a copy whose C{ExecStart}
        runs this Python's twistd instead of C{/opt/jesync/bin/twistd}.
        """
        systemd_analyze()
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory, True)
        with open(UNIT, encoding="utf-8") as unit:
            text = unit.read()
        self.assertIn(f"ExecStart={UNIT_TWISTD} ", text)
        copy = os.path.join(directory, "jesync.service")
        with open(copy, "w", encoding="utf-8") as unit:
            unit.write(text.replace(f"ExecStart={UNIT_TWISTD} ", f"ExecStart={TWISTD} "))
        result = analyze("verify", "--man=no", copy)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertNotIn("jesync.service", result.stdout, "systemd-analyze verify warned:\n" + result.stdout)

    def test_security_ok_or_better(self) -> None:
        """C{systemd-analyze security --offline=yes} rates the unit "OK" or better."""
        _, version = systemd_analyze()
        if version < OFFLINE_SECURITY_SINCE:
            raise SkipTest(
                f"systemd {version}'s systemd-analyze has no security --offline=yes "
                f"(systemd {OFFLINE_SECURITY_SINCE} or newer; Debian 12 has 252)"
            )
        result = analyze("security", "--offline=yes", "--no-pager", UNIT)
        self.assertEqual(result.returncode, 0, result.stdout)
        match = re.search(r"Overall exposure level for jesync\.service: (\d+\.\d+) (\w+)", result.stdout)
        self.assertIsNotNone(match, result.stdout)
        assert match is not None
        exposure, level = float(match.group(1)), match.group(2)
        self.assertIn(level, LEVELS, result.stdout)
        self.assertLessEqual(LEVELS.index(level), LEVELS.index("OK"), result.stdout)
        self.assertLess(exposure, 5.0, result.stdout)


class UnitSettingsTests(SynchronousTestCase):
    """What the unit must and must not set, read from the file itself."""

    def test_no_documentation_link(self) -> None:
        """No C{Documentation=}: nothing the install steps put on disk could be linked to."""
        self.assertNotIn("Documentation", unit_settings())

    def test_no_memory_deny_write_execute(self) -> None:
        """
        C{MemoryDenyWriteExecute=yes} would break PyPy (its JIT aborts at
        start) and TLS listeners (pyOpenSSL's cffi callbacks), both
        supported: the unit leaves it out, and says why.
        """
        self.assertNotIn("MemoryDenyWriteExecute", unit_settings())
        with open(UNIT, encoding="utf-8") as unit:
            comments = "".join(line for line in unit if line.startswith("#"))
        self.assertIn("MemoryDenyWriteExecute=", comments)

    def test_sandbox(self) -> None:
        settings = unit_settings()
        for key, value in [
            ("CapabilityBoundingSet", ""),
            ("NoNewPrivileges", "true"),
            ("ProtectSystem", "strict"),
            ("PrivateDevices", "true"),
            ("ProtectKernelTunables", "true"),
            ("ProtectKernelModules", "true"),
            ("ProtectKernelLogs", "true"),
            ("ProtectClock", "true"),
            ("ProtectControlGroups", "true"),
            ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
            ("LockPersonality", "true"),
            ("UMask", "0077"),
            ("StateDirectory", "jesync"),
        ]:
            self.assertEqual(settings.get(key), [value], key)
        self.assertEqual(settings["SystemCallFilter"][0], "@system-service")

    def test_exec_start_logs_for_the_journal(self) -> None:
        """twistd logs through L{jesync.journal}, not with --logfile (which stamps each line)."""
        (command,) = unit_settings()["ExecStart"]
        argv = shlex.split(command)
        self.assertIn("--logger", argv)
        self.assertEqual(argv[argv.index("--logger") + 1], "jesync.journal.observer")
        self.assertFalse([argument for argument in argv if argument.startswith("--logfile")], argv)
        self.assertIn("--pidfile=", argv)
        self.assertEqual(argv[argv.index("--state-dir") + 1], UNIT_STATE_DIR)


class ExecStartTests(SynchronousTestCase):
    """The unit's command line, run here as systemd would run it (no systemd needed)."""

    def exec_start(self, state_dir: str) -> List[str]:
        """
        The unit's C{ExecStart}, with this Python's twistd, a free port on
        loopback and C{state_dir} in place of the unit's.
        """
        (command,) = unit_settings()["ExecStart"]
        argv = shlex.split(command)
        replacements = {UNIT_TWISTD: TWISTD, UNIT_PORT: "tcp:0:interface=127.0.0.1", UNIT_STATE_DIR: state_dir}
        for argument in replacements:
            self.assertIn(argument, argv)
        return [replacements.get(argument, argument) for argument in argv]

    def read_until(self, process: subprocess.Popen, pattern: bytes, output: bytearray, timeout: float = 60) -> re.Match:
        """Reads C{process}'s output into C{output} until a line of it matches C{pattern}."""
        assert process.stdout is not None
        descriptor = process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, output, re.MULTILINE)
            if match:
                return match
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([descriptor], [], [], remaining)[0]:
                self.fail(f"no {pattern!r} in twistd's output within {timeout} s:\n{output.decode()}")
            data = os.read(descriptor, 65536)
            if not data:
                process.wait(timeout=10)
                self.fail(f"twistd ended (status {process.returncode}) before {pattern!r}:\n{output.decode()}")
            output += data

    def test_serves_and_logs_for_the_journal(self) -> None:
        """
        The command line starts a server that answers, writes its fencing
        token mark to the state directory, logs every line with an sd-daemon
        priority prefix and no timestamp of its own, and stops with status 0
        on SIGTERM.
        """
        state_dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, state_dir, True)
        environment = dict(os.environ, PYTHONPATH=REPOSITORY)
        process = subprocess.Popen(
            self.exec_start(state_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
            env=environment,
        )

        def kill() -> None:
            if process.poll() is None:
                process.kill()
                process.wait()
            assert process.stdout is not None
            process.stdout.close()

        self.addCleanup(kill)
        output = bytearray()
        port = int(self.read_until(process, rb"JESyncFactory starting on (\d+)\n", output).group(1))
        reply = self.ask(port, b"lock k\nstatus k\n", 2)
        self.assertEqual(reply, b"GRANTED 1 0 k 120\nSTATUS 1 0 k\n")
        self.assertTrue(os.listdir(state_dir), "nothing in --state-dir")

        process.send_signal(signal.SIGTERM)
        assert process.stdout is not None
        rest, _ = process.communicate(timeout=60)
        text = (output + rest).decode()
        self.assertEqual(process.returncode, 0, text)
        self.assertIn("jesync stopped: ", text)
        self.assertNotIn("Traceback", text)
        lines = text.splitlines()
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^<[0-7]>", "a line without a priority prefix")
            self.assertNotRegex(line, r"^<[0-7]>\d{4}-\d\d-\d\d", "a line with a timestamp")
        self.assertIn("<6>[twisted.internet.base#info] Received SIGTERM, shutting down.", lines)
        self.assertNotIn("twistd.pid", os.listdir(state_dir))

    def ask(self, port: int, request: bytes, lines: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(request)
            reply = b""
            while reply.count(b"\n") < lines:
                data = connection.recv(4096)
                if not data:
                    break
                reply += data
        return reply


CLUSTER_UNIT = os.path.join(REPOSITORY, "etc", "jesync-cluster.service")


class ClusterUnitTests(SynchronousTestCase):
    """C{etc/jesync-cluster.service}: a cluster member's unit, as sound and as sandboxed as the single server's."""

    def settings(self) -> Dict[str, List[str]]:
        with open(CLUSTER_UNIT, encoding="utf-8") as unit:
            lines = [line.strip() for line in unit]
        settings: Dict[str, List[str]] = {}
        for line in lines:
            if line and not line.startswith(("#", ";", "[")):
                key, _, value = line.partition("=")
                settings.setdefault(key.strip(), []).append(value.strip())
        return settings

    def test_same_sandbox_as_the_single_server(self) -> None:
        single, cluster = unit_settings(), self.settings()
        for key in set(single) - {"ExecStart", "Description", "After", "StateDirectory"}:
            self.assertEqual(cluster.get(key), single[key], key)

    def test_exec_start_joins_a_cluster(self) -> None:
        (command,) = self.settings()["ExecStart"]
        argv = shlex.split(command)
        self.assertEqual(argv[argv.index("--logger") + 1], "jesync.journal.observer")
        self.assertGreaterEqual(argv.count("--etcd"), 3)
        self.assertIn("--cluster", argv)
        self.assertNotIn("--state-dir", argv)
        # The command line is one twistd jesync accepts.
        from jesync.tap import Options

        options = Options()
        with_token = argv[argv.index("jesync") + 1 :]
        token_file = tempfile.NamedTemporaryFile("w", suffix=".token", delete=False)
        self.addCleanup(os.unlink, token_file.name)
        token_file.write("a-token\n")
        token_file.close()
        with_token[with_token.index("--auth-token-file") + 1] = token_file.name
        options.parseOptions(with_token)
        self.assertEqual(len(options["etcd"]), argv.count("--etcd"))

    def test_verify_and_security(self) -> None:
        _, version = systemd_analyze()
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory, True)
        with open(CLUSTER_UNIT, encoding="utf-8") as unit:
            text = unit.read()
        copy = os.path.join(directory, "jesync.service")
        with open(copy, "w", encoding="utf-8") as unit:
            unit.write(text.replace(f"ExecStart={UNIT_TWISTD} ", f"ExecStart={TWISTD} "))
        result = analyze("verify", "--man=no", copy)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertNotIn("jesync.service", result.stdout, "systemd-analyze verify warned:\n" + result.stdout)
        if version < OFFLINE_SECURITY_SINCE:
            return
        result = analyze("security", "--offline=yes", "--no-pager", copy)
        match = re.search(r"Overall exposure level for jesync\.service: (\d+\.\d+) (\w+)", result.stdout)
        self.assertIsNotNone(match, result.stdout)
        assert match is not None
        self.assertLessEqual(LEVELS.index(match.group(2)), LEVELS.index("OK"), result.stdout)
