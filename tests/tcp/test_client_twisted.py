"""
The Twisted client against a real server listening on a real port in the
test's own reactor.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, endpoints, reactor, task
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase

from jesync.client import (
    ConnectFailed,
    ConnectionLost,
    KeyBusy,
    KeyStatus,
    LockLost,
    LockTimeout,
    ServerError,
    TwistedClient,
)
from tests.servers import free_port, listen_in_process


def sleep(seconds: float) -> defer.Deferred[None]:
    return task.deferLater(reactor, seconds, lambda: None)


class TwistedClientTestCase(TestCase):
    """Two clients of a server in this process, and a way to wait for its table to reach a state."""

    timeout = 30

    async def setUp(self) -> None:
        self.server = await listen_in_process(self, reactor)
        self.first = self.client()
        self.second = self.client()

    def client(self, address: str | None = None, **options: Any) -> TwistedClient:
        client = TwistedClient(reactor, address or self.server.address, **options)
        self.addCleanup(client.close)
        return client

    async def eventually(self, key: str, granted: int, waiting: int) -> None:
        for _ in range(500):
            if self.server.service.status(key) == KeyStatus(key, granted, waiting):
                return
            await sleep(0.01)
        self.fail(f"{key} never reached {granted} granted, {waiting} waiting")


class TwistedClientTests(TwistedClientTestCase):

    async def test_replies_out_of_order(self) -> None:
        """
        On one connection: lock A (granted at once), lock B (waits: another
        connection holds it), status C, then release A.  All are written
        before any reply is read; the replies come back out of order, and
        each Deferred gets its own.
        """
        holder = await self.second.lock("B")
        fired: list[tuple[str, Any]] = []

        def note(name: str, deferred: defer.Deferred[Any]) -> defer.Deferred[Any]:
            return deferred.addCallback(lambda result: fired.append((name, result)) or result)

        lock_a = note("lock A", self.first.lock("A"))
        lock_b = note("lock B", self.first.lock("B", wait=10))
        status_c = note("status C", self.first.status("C"))
        a = await lock_a
        await note("release A", a.release())
        self.assertEqual(await status_c, KeyStatus("C", 0, 0))
        self.assertNotIn("lock B", [name for name, _ in fired])
        self.assertEqual(self.server.service.status("B"), KeyStatus("B", 1, 1))
        await holder.release()
        b = await lock_b
        self.assertEqual(
            [name for name, _ in fired],
            ["lock A", "status C", "release A", "lock B"],
        )
        self.assertEqual((a.key, b.key), ("A", "B"))
        self.assertEqual(dict(fired)["release A"], True)
        self.assertTrue(b.held and not a.held)
        self.assertEqual(len(self.server.factory.connections), 2)

    async def test_contention_and_timeout(self) -> None:
        lock = await self.first.lock("report")
        with self.assertRaises(LockTimeout):
            await self.second.lock("report", wait=0)
        started = reactor.seconds()
        with self.assertRaises(LockTimeout):
            await self.second.lock("report", wait=1)
        self.assertGreaterEqual(reactor.seconds() - started, 1.0)
        waiting = self.second.lock("report")
        await self.eventually("report", 1, 1)
        self.assertTrue(await lock.release())
        other = await waiting
        self.assertTrue(other.held)
        self.assertFalse(await lock.release())
        with self.assertRaises(KeyBusy):
            await self.second.lock("report")

    async def test_renewal_keeps_the_lock_past_expires(self) -> None:
        renewed = await self.first.lock("renewed", expires=1, auto_renew=True)
        forgotten = await self.first.lock("forgotten", expires=1)
        await sleep(2.5)
        self.assertEqual(self.server.service.status("renewed"), KeyStatus("renewed", 1, 0))
        self.assertEqual(self.server.service.status("forgotten"), KeyStatus("forgotten", 0, 0))
        self.assertTrue(renewed.held)
        self.assertFalse(await forgotten.release())
        self.assertTrue(forgotten.lost)
        self.assertTrue(await renewed.release())
        self.assertEqual(self.server.service.status("renewed"), KeyStatus("renewed", 0, 0))

    async def test_connection_dropped(self) -> None:
        """
        The server drops the connection: held locks are lost (callbacks
        called), outstanding requests fail with ConnectionLost, and the next
        request reconnects without bringing the old locks back.
        """
        await self.second.lock("busy")
        held = await self.first.lock("report", expires=1, auto_renew=True)
        lost: defer.Deferred[LockLost] = defer.Deferred()
        held.add_lost_callback(lost.callback)
        waiting = self.first.lock("busy")
        await self.eventually("busy", 1, 1)
        await self.server.drop_connections()
        error = await lost
        self.assertIn("was lost", error.reason)
        with self.assertRaises(ConnectionLost):
            await waiting
        self.assertTrue(held.lost)
        self.assertFalse(await held.release())
        with self.assertRaises(LockLost):
            await held.renew()
        self.assertEqual(await self.first.status("report"), KeyStatus("report", 0, 0))
        again = await self.first.lock("report", wait=0)
        self.assertTrue(again.held and held.lost)

    async def test_cancelled_wait(self) -> None:
        holder = await self.second.lock("report")
        waiting = self.first.lock("report")
        await self.eventually("report", 1, 1)
        waiting.cancel()
        with self.assertRaises(defer.CancelledError):
            await waiting
        with self.assertRaises(KeyBusy):
            await self.first.lock("report", wait=0)
        await holder.release()
        await self.eventually("report", 0, 0)
        await (await self.first.lock("report", wait=0)).release()

    async def test_listing_and_ping(self) -> None:
        await self.first.lock("b", max_concurrent=2)
        await self.second.lock("b", max_concurrent=2)
        await self.first.lock("a")
        self.assertEqual(await self.first.listing(), [KeyStatus("a", 1, 0), KeyStatus("b", 2, 0)])
        self.assertEqual([row.key for row in await self.first.listing("grants")], ["b", "a"])
        [(address, seconds)] = (await self.first.ping()).items()
        self.assertEqual(address, self.server.address)
        self.assertGreaterEqual(seconds, 0)

    async def test_bad_arguments(self) -> None:
        with self.assertRaises(ValueError):
            await self.first.lock("two words")
        with self.assertRaises(ValueError):
            await self.first.status("")


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
