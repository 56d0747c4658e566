"""
The admin listener's own credential (C{--admin-token-file}), over real TCP
to a real C{twistd jesync}: with it, the admin listener accepts that token
alone, the lock token opens only the lock listeners, and SIGHUP reads both
files again (the previous admin token accepted for C{--auth-token-grace}).
Without it, the admin listener takes the lock token, as before.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from jesync.tap import Options
from tests.servers import free_port, start_server

WITHIN = 10.0


def exchange(port: int, request: bytes, expected: int = 1) -> bytes:
    """Send C{request} on a new connection to 127.0.0.1:C{port}; its answer: C{expected} lines, or until closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=WITHIN) as client:
        client.sendall(request)
        received = b""
        while received.count(b"\n") < expected:
            chunk = client.recv(4096)
            if not chunk:
                break
            received += chunk
        return received


def closed_after(port: int, request: bytes) -> bytes:
    """Send C{request}; everything the server sends until it closes the connection (within L{WITHIN} s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WITHIN) as client:
        client.sendall(request)
        received = b""
        while True:
            chunk = client.recv(4096)
            if not chunk:
                return received
            received += chunk


class AdminTokenTests(SynchronousTestCase):
    def write(self, name: str, content: bytes) -> str:
        path = os.path.join(self.directory, name)
        with open(path, "wb") as file:
            file.write(content)
        return path

    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.directory)

    def start(self, *args: str, admin_token: bool = True, lock_token: bool = True):
        self.admin_port = free_port()
        self.elock_port = free_port()
        self.token_path = self.write("token", b"lock-token\n")
        self.admin_token_path = self.write("admin-token", b"admin-token\n")
        extra = [
            *(["--auth-token-file", self.token_path] if lock_token else []),
            "--admin-port",
            f"tcp:{self.admin_port}:interface=127.0.0.1",
            "--elock-port",
            f"tcp:{self.elock_port}:interface=127.0.0.1",
            *args,
        ]
        if admin_token:
            extra += ["--admin-token-file", self.admin_token_path]
        return start_server(self, extra_args=extra, auth_token=b"lock-token" if lock_token else None)

    def wait_for_log(self, server, text: str) -> None:
        deadline = time.monotonic() + WITHIN
        while text not in server.log():
            self.assertLess(time.monotonic(), deadline, f"not logged: {text!r}\n{server.log()}")
            time.sleep(0.02)

    def test_the_lock_token_does_not_open_the_admin_listener(self) -> None:
        server = self.start()
        self.assertEqual(
            closed_after(self.admin_port, b"auth lock-token\nforce-release k\n"), b"INVALID_PARAMETER: auth failed\n"
        )
        # nor does nothing at all
        self.assertEqual(closed_after(self.admin_port, b"force-release k\n"), b"INVALID_PARAMETER: auth failed\n")
        self.assertIn("admin auth: its own token", server.log())

    def test_the_admin_token_opens_the_admin_listener_alone(self) -> None:
        server = self.start()
        # a lock held through the lock listener, force-released through the admin one
        with socket.create_connection(("127.0.0.1", server.port), timeout=WITHIN) as holder:
            holder.sendall(b"auth lock-token\nlock k 1 -1 0\n")
            received = b""
            while received.count(b"\n") < 2:
                received += holder.recv(100)
            self.assertEqual(received.split(b"\n")[0], b"OK")
            self.assertTrue(received.split(b"\n")[1].startswith(b"GRANTED 1 0 k"), received)
            self.assertEqual(
                exchange(self.admin_port, b"auth admin-token\nforce-release k\nstatus k\n", 3),
                b"OK\nFORCE-RELEASED 1 k\nSTATUS 0 0 k\n",
            )
        # the admin token is refused by the lock listeners: JESync's and elock's
        self.assertEqual(
            closed_after(server.port, b"auth admin-token\nstatus k\n"), b"INVALID_PARAMETER: auth failed\n"
        )
        self.assertEqual(closed_after(self.elock_port, b"auth admin-token\r\n"), b"403 auth failed\r\n")

    def test_sighup_reads_the_admin_token_again(self) -> None:
        self.server = self.start("--auth-token-grace", "300")
        self.write("admin-token", b"admin-token-2\n")
        self.write("token", b"lock-token-2\n")
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGHUP)
        # one SIGHUP reads both files
        self.wait_for_log(self.server, "new admin token taken")
        self.wait_for_log(self.server, "new auth token taken")
        self.assertEqual(exchange(self.admin_port, b"auth admin-token-2\nstatus k\n", 2), b"OK\nSTATUS 0 0 k\n")
        # the previous admin token within --auth-token-grace
        self.assertEqual(exchange(self.admin_port, b"auth admin-token\nstatus k\n", 2), b"OK\nSTATUS 0 0 k\n")
        # neither lock token opens it
        for token in (b"lock-token-2", b"lock-token"):
            self.assertEqual(
                closed_after(self.admin_port, b"auth " + token + b"\n"), b"INVALID_PARAMETER: auth failed\n"
            )
        self.assertEqual(exchange(self.server.port, b"auth lock-token-2\nstatus k\n", 2), b"OK\nSTATUS 0 0 k\n")
        self.assertEqual(
            closed_after(self.server.port, b"auth admin-token-2\n"), b"INVALID_PARAMETER: auth failed\n"
        )
        self.assertNotIn("admin-token-2", self.server.log())  # tokens are never logged

    def test_an_admin_token_without_a_lock_token(self) -> None:
        """The lock listeners need no token (local clients, protected mode), the admin listener its own."""
        server = self.start(lock_token=False)
        self.assertEqual(exchange(server.port, b"status k\n"), b"STATUS 0 0 k\n")
        self.assertEqual(closed_after(self.admin_port, b"force-release k\n"), b"INVALID_PARAMETER: auth failed\n")
        self.assertEqual(closed_after(self.admin_port, b"auth x\n"), b"INVALID_PARAMETER: auth failed\n")
        self.assertEqual(
            exchange(self.admin_port, b"auth admin-token\nforce-release k\n", 2), b"OK\nFORCE-RELEASED 0 k\n"
        )

    def test_without_it_the_admin_listener_takes_the_lock_token(self) -> None:
        server = self.start(admin_token=False)
        self.assertEqual(exchange(self.admin_port, b"auth lock-token\nstatus k\n", 2), b"OK\nSTATUS 0 0 k\n")
        self.assertNotIn("admin auth", server.log())


class AdminTokenOptionTests(SynchronousTestCase):
    def path(self, content: bytes) -> str:
        descriptor, path = tempfile.mkstemp()
        os.write(descriptor, content)
        os.close(descriptor)
        self.addCleanup(os.unlink, path)
        return path

    def refusal(self, *argv: str) -> str:
        with self.assertRaises(usage.UsageError) as raised:
            Options().parseOptions(list(argv))
        return str(raised.exception)

    def test_the_same_token_twice_is_refused(self) -> None:
        token = self.path(b"same\n")
        self.assertEqual(
            self.refusal("--auth-token-file", token, "--admin-port", "0", "--admin-token-file", self.path(b"same\n")),
            "--admin-token-file must hold a token other than --auth-token-file's",
        )
        self.assertNotIn("same", self.refusal("--admin-port", "0", "--admin-token-file", self.path(b"two words\n")))

    def test_it_needs_an_admin_listener(self) -> None:
        self.assertEqual(
            self.refusal("--admin-token-file", self.path(b"t\n")), "--admin-token-file has no use without --admin-port"
        )

    def test_an_unreadable_file_is_named(self) -> None:
        self.assertEqual(
            self.refusal("--admin-port", "0", "--admin-token-file", "/nonexistent/admin-token"),
            "--admin-token-file: cannot read /nonexistent/admin-token: No such file or directory",
        )


class ReadmeAdminTokenTests(SynchronousTestCase):
    """docs/operating.md's example of an admin listener with its own token starts the server it describes."""

    def test_readme_example(self) -> None:
        import re
        import shlex
        from pathlib import Path

        from jesync import tap

        text = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text(encoding="utf-8")
        blocks = [block for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL) if "--admin-token-file" in block]
        self.assertEqual(len(blocks), 1)
        argv = shlex.split(blocks[0].replace("\\\n", " "))
        self.assertEqual(argv[:4], ["twistd", "-n", "--pidfile=", "jesync"])
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        files = {}
        for name, token in (("/etc/jesync/token", b"lock-token\n"), ("/etc/jesync/admin-token", b"admin-token\n")):
            files[name] = os.path.join(directory, os.path.basename(name))
            with open(files[name], "wb") as file:
                file.write(token)
        options = tap.Options()
        options.parseOptions([files.get(argument, argument) for argument in argv[4:]])
        server = tap.makeService(options)
        admin = server.factories["admin"]
        self.assertEqual(admin.policy.auth_token, b"admin-token")
        self.assertIs(admin.policy.connections, server.policy.connections)  # max-connections counts them too
        self.assertEqual(server.factories["jesync"].policy.auth_token, b"lock-token")
        self.assertEqual([listener.description for listener in server.listeners()][-1], "tcp:11409:interface=10.0.0.5")
