"""
The unit tier's one rule, enforced (under pytest): a unit test connects or
binds no socket, starts no process and no thread.  Time is a L{twisted.internet.task.Clock},
a connection a L{twisted.internet.testing.StringTransport} or an in-memory
pair (L{jesync.testing}), so the tier runs in seconds and the same on any
machine.  A test that needs more belongs to C{tests/tcp} (a listener in this
process), C{tests/process} (twistd, the command line, a tool) or
C{tests/etcd}; here it fails, naming what it tried.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from typing import Any, Iterator

import pytest


class OutsideTheUnitTier(AssertionError):
    """A unit test reached for a socket, a process or a thread."""


def _refuse(what: str) -> Any:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OutsideTheUnitTier(f"a unit test may not {what} (move it to tests/tcp, tests/process or tests/etcd)")

    return refuse


@pytest.fixture(autouse=True)
def no_sockets_processes_or_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "connect", _refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "bind", _refuse("bind a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a process"))
    monkeypatch.setattr(threading.Thread, "start", _refuse("start a thread"))
    yield
