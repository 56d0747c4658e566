"""
The auth token rotated by signal: a real C{twistd jesync} process reads its
C{--auth-token-file} again on SIGHUP (twistd installs the handler, so this
needs a process of its own).  The rotation's rules, driven by a Clock, are in
L{tests.unit.test_access_rules}.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase


class SighupTests(SynchronousTestCase):
    """A real twistd server reads its token file again on SIGHUP."""

    def test_sighup(self) -> None:
        import os
        import signal
        import socket
        import tempfile
        import time

        from tests.servers import start_server

        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "token")
        with open(path, "wb") as file:
            file.write(b"old\n")
        server = start_server(self, extra_args=["--auth-token-file", path], auth_token=b"old")

        def answer(token: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
                client.sendall(b"auth " + token + b"\n")
                return client.recv(100)

        with open(path, "wb") as file:
            file.write(b"new\n")
        assert server.process is not None
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while answer(b"new") != b"OK\n":
            self.assertLess(time.monotonic(), deadline, "the new token was not taken")
            time.sleep(0.05)
        self.assertEqual(answer(b"old"), b"OK\n")  # within --auth-token-grace (300 s)
        self.assertEqual(answer(b"other"), b"INVALID_PARAMETER: auth failed\n")
        os.unlink(path)
        os.rmdir(directory)
