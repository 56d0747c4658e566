"""
The tooz backend's tests' shared parts: tooz itself (their module is skipped
without it), the C{jesync} entry point registered for this run if no
installed distribution declares it, the subprocesses' environment that finds
it, and the base of the tests with a server of their own (L{ToozTestCase}).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from typing import Any, Optional
from unittest import SkipTest

try:
    from tooz import coordination
except ImportError as error:  # the test extra installs it under CPython
    raise SkipTest(
        f"the tooz backend's tests need tooz (pip install '.[tooz]' from a checkout; the test extra installs it under "
        f"CPython only: under PyPy, tooz's psutil must be built against PyPy's C headers, pypy3-dev): {error}"
    )

from tests.client_case import WITHIN, ClientTestCase
from tests.servers import ServerThread, environment, serve_in_thread

ENTRY_POINT = "jesync = jesync.tooz_driver:JESyncDriver"


def _registered_backends() -> list[Any]:
    from importlib import metadata

    entry_points = metadata.entry_points()
    if hasattr(entry_points, "select"):
        return [ep for ep in entry_points.select(group="tooz.backends") if ep.name == "jesync"]
    return [ep for ep in entry_points.get("tooz.backends", ()) if ep.name == "jesync"]  # Python 3.9


def _register_entry_point() -> Optional[str]:
    """
    Make C{jesync} a C{tooz.backends} entry point if no installed
    distribution declares it yet; return the directory put on sys.path.
    """
    if _registered_backends():
        return None
    directory = tempfile.mkdtemp(prefix="jesync-tooz-entry-point-")
    info = os.path.join(directory, "jesync_tooz_test_registration-0.dist-info")
    os.mkdir(info)
    with open(os.path.join(info, "METADATA"), "w") as file:
        file.write("Metadata-Version: 2.1\nName: jesync-tooz-test-registration\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as file:
        file.write(f"[tooz.backends]\n{ENTRY_POINT}\n")
    sys.path.append(directory)
    return directory


_ENTRY_POINT_PATH = _register_entry_point()


def subprocess_environment() -> dict[str, str]:
    """The environment of a subprocess that imports this checkout's jesync and finds its tooz entry point."""
    env = environment()
    if _ENTRY_POINT_PATH is not None:
        env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + _ENTRY_POINT_PATH
    return env


def status(port: int, key: str) -> tuple[int, int]:
    """The server's (granted, waiting) for C{key}, asked with a JESync C{status} on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=WITHIN) as sock:
        sock.sendall(b"status " + key.encode("utf-8", "surrogateescape") + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    word, granted, waiting = reply.split()[:3]
    assert word == b"STATUS", reply
    return int(granted), int(waiting)


class ToozTestCase(ClientTestCase):
    """Each test has a server of its own (one in a thread starts in milliseconds)."""

    server: ServerThread

    def setUp(self) -> None:
        self.server = serve_in_thread(self)
        self.url = f"jesync://127.0.0.1:{self.server.port}"

    def coordinator(self, url: Optional[str] = None, member: bytes = b"member", **options: Any) -> Any:
        coordinator = coordination.get_coordinator(url or self.url, member, **options)
        coordinator.start()

        def stop() -> None:
            if coordinator.is_started:
                coordinator.stop()

        self.addCleanup(stop)
        return coordinator

    def status(self, key: str) -> tuple[int, int]:
        return status(self.server.port, key)
