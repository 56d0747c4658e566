"""
The Twisted client over real TCP, in the test's own reactor: against servers
that are not jesync's (silent, or answering wrongly) and a port nothing
listens on, which need a real socket.  Its behaviour against the real server
is tested in memory: tests/unit/test_client_twisted.py.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import endpoints, reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase

from jesync.client import (
    ConnectFailed,
    ConnectionLost,
    KeyStatus,
    ServerError,
    TwistedClient,
)
from tests.servers import free_port


class _Silent(Protocol):
    def dataReceived(self, data: bytes) -> None:
        if self.factory.reply is not None:
            for line in data.splitlines():
                self.transport.write(self.factory.reply(line))


class MisbehavingServerTests(TestCase):
    timeout = 30

    async def listen(self, reply: Any) -> str:
        factory = Factory.forProtocol(_Silent)
        factory.reply = reply
        port = await endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(factory)
        self.addCleanup(port.stopListening)
        return f"127.0.0.1:{port.getHost().port}"

    async def test_silent_server(self) -> None:
        client = TwistedClient(reactor, await self.listen(None), read_timeout=0.5)
        self.addCleanup(client.close)
        with self.assertRaises(ConnectionLost) as caught:
            await client.status("report")
        self.assertIn("no reply within 0.5 s", str(caught.exception))

    async def test_server_error(self) -> None:
        def reply(line: bytes) -> bytes:
            if line.startswith(b"lock"):
                return b"INVALID_PARAMETER: no thanks\n"
            if line.startswith(b"status"):
                return b"STATUS 0 0 %s\n" % line.split()[1]
            return b"INVALID_COMMAND\n"  # fencing: an older server

        client = TwistedClient(reactor, await self.listen(reply))
        self.addCleanup(client.close)
        with self.assertRaises(ServerError) as caught:
            await client.lock("report")
        self.assertEqual(caught.exception.message, "INVALID_PARAMETER: no thanks")
        self.assertEqual(await client.status("report"), KeyStatus("report", 0, 0))

    async def test_unreachable(self) -> None:
        client = TwistedClient(reactor, f"127.0.0.1:{free_port()}")
        with self.assertRaises(ConnectFailed):
            await client.status("report")
