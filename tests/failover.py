"""
What the failover tests of the clients (L{tests.tcp.test_client_failover})
and of the C{jesync} command (L{tests.process.test_cli_failover}) share: a
standby's address, and a client watching one stand-in.
"""

from __future__ import annotations

from typing import Any

from jesync.client import Client
from tests.servers import free_port

WITHIN = 10.0  # seconds anything bounded here may take, on a loaded machine


def closed_address() -> str:
    """A loopback address nothing listens on: a standby, which refuses connections."""
    return f"127.0.0.1:{free_port()}"


def watch(testcase: Any, address: str) -> Client:
    """A client of one stand-in alone, to see what it holds (closed when the test ends)."""
    client = Client(address, environ={})
    testcase.addCleanup(client.close)
    return client
