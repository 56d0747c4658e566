"""
The asyncio client against real servers (C{twistd jesync} subprocesses), each
test in its own C{asyncio.run}.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    AsyncClient,
    ConnectFailed,
    ConnectionLost,
    KeyBusy,
    KeyStatus,
    LockLost,
    LockTimeout,
    ServerError,
)
from tests.servers import environment, fake_server, start_server

WITHIN = 5.0


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(test(), 30)

    return asyncio.run(bounded())


async def eventually(condition: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + WITHIN
    while not await condition():
        assert time.monotonic() < deadline, "timed out waiting for a condition"
        await asyncio.sleep(0.01)


class AsyncClientTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = start_server(self)

    def test_contention(self) -> None:
        async def test() -> None:
            async with AsyncClient(self.server.address) as first, AsyncClient(self.server.address) as second:
                async with first.lock("report", wait=10) as lock:
                    self.assertTrue(lock.held)
                    with self.assertRaises(LockTimeout):
                        await second.lock("report", wait=0)
                    waiting = asyncio.ensure_future(second.lock("report"))
                    await eventually(lambda: self._status_is(first, "report", 1, 1))
                    self.assertFalse(waiting.done())
                self.assertTrue(lock.released)
                other = await waiting
                self.assertEqual(await first.status("report"), KeyStatus("report", 1, 0))
                self.assertTrue(await other.release())
                self.assertFalse(await other.release())

        run(test)

    async def _status_is(self, client: AsyncClient, key: str, granted: int, waiting: int) -> bool:
        return await client.status(key) == KeyStatus(key, granted, waiting)

    def test_wait_timeout(self) -> None:
        async def test() -> None:
            async with AsyncClient(self.server.address) as first, AsyncClient(self.server.address) as second:
                await first.lock("report")
                started = time.monotonic()
                with self.assertRaises(LockTimeout):
                    await second.lock("report", wait=0.5)
                self.assertTrue(1.0 <= time.monotonic() - started < 1.0 + WITHIN)

        run(test)

    def test_renewal_and_pipelining(self) -> None:
        """
        Many tasks share one connection: a lock renewed in the background
        outlives its 1 s failsafe while another task's lock waits on the same
        connection, and a third task's requests are answered meanwhile.
        """

        async def test() -> None:
            async with AsyncClient(self.server.address) as client, AsyncClient(self.server.address) as other:
                await other.lock("b")
                renewed = await client.lock("a", expires=1, auto_renew=True)
                forgotten = await client.lock("c", expires=1)
                waiting = asyncio.ensure_future(client.lock("b"))
                statuses = await asyncio.gather(*[client.status(key) for key in "abc"])
                self.assertEqual(statuses, [KeyStatus("a", 1, 0), KeyStatus("b", 1, 1), KeyStatus("c", 1, 0)])
                await asyncio.sleep(2.5)
                self.assertEqual(await other.status("a"), KeyStatus("a", 1, 0))
                self.assertEqual(await other.status("c"), KeyStatus("c", 0, 0))
                self.assertTrue(renewed.held)
                self.assertFalse(await forgotten.release())
                self.assertTrue(forgotten.lost)
                self.assertFalse(waiting.done())
                with self.assertRaises(LockTimeout):
                    await other.lock("a", wait=0)
                self.assertTrue(await renewed.release())
                self.assertEqual(await other.status("a"), KeyStatus("a", 0, 0))
                waiting.cancel()

        run(test)

    def test_cancelled_wait(self) -> None:
        """
        A cancelled wait stays on the server (JESync cannot withdraw it): the
        key is busy for this client until then, and the grant is released.
        """

        async def test() -> None:
            async with AsyncClient(self.server.address) as client, AsyncClient(self.server.address) as other:
                holder = await other.lock("report")
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.lock("report"), 0.2)
                self.assertEqual(await other.status("report"), KeyStatus("report", 1, 1))
                with self.assertRaises(KeyBusy):
                    await client.lock("report", wait=0)
                await holder.release()
                await eventually(lambda: self._status_is(other, "report", 0, 0))
                await (await client.lock("report", wait=0)).release()

        run(test)

    def test_server_killed(self) -> None:
        async def test() -> None:
            async with AsyncClient(self.server.address) as client, AsyncClient(self.server.address) as other:
                await other.lock("busy")
                held = await client.lock("report", expires=1, auto_renew=True)
                lost = asyncio.get_running_loop().create_future()
                held.add_lost_callback(lost.set_result)
                waiting = asyncio.ensure_future(client.lock("busy"))
                await eventually(lambda: self._status_is(other, "busy", 1, 1))
                with self.assertRaises(LockLost):
                    async with client.lock("block"):
                        self.server.kill()
                        error = await asyncio.wait_for(lost, WITHIN)
                self.assertIn("connection", error.reason)
                self.assertTrue(held.lost)
                with self.assertRaises(ConnectionLost):
                    await waiting
                self.assertFalse(await held.release())
                with self.assertRaises(LockLost):
                    await held.renew()
                with self.assertRaises(ConnectFailed):
                    await client.status("report")
                self.server.start()
                self.assertEqual(await client.status("report"), KeyStatus("report", 0, 0))
                self.assertTrue(held.lost)

        run(test)

    def test_listing_and_ping(self) -> None:
        async def test() -> None:
            async with AsyncClient(self.server.address) as client:
                await client.lock("b", max_concurrent=2)
                await client.lock("a")
                self.assertEqual(await client.listing(), [KeyStatus("a", 1, 0), KeyStatus("b", 1, 0)])
                [(address, seconds)] = (await client.ping()).items()
                self.assertEqual(address, self.server.address)
                self.assertTrue(0 < seconds < WITHIN)

        run(test)

    def test_concurrent_first_requests(self) -> None:
        """Tasks racing to use a new client share the one connection it opens."""

        async def test() -> None:
            async with AsyncClient(self.server.address) as client:
                locks = await asyncio.gather(*[client.lock(f"k{n}") for n in range(10)])
                self.assertEqual(len({lock._connection for lock in locks}), 1)
                self.assertEqual(len(await client.listing()), 10)

        run(test)

    def test_no_reactor(self) -> None:
        """The asyncio client never touches the Twisted reactor."""
        script = (
            "import asyncio, sys\n"
            "from jesync.client import AsyncClient\n"
            "async def main():\n"
            f"    async with AsyncClient({self.server.address!r}) as client:\n"
            "        async with client.lock('k'):\n"
            "            pass\n"
            "asyncio.run(main())\n"
            "assert 'twisted.internet.reactor' not in sys.modules\n"
        )
        subprocess.run([sys.executable, "-c", script], env=environment(), check=True, timeout=30)


class MisbehavingServerTests(SynchronousTestCase):
    def test_silent_server(self) -> None:
        server = fake_server(self, lambda line: None)

        async def test() -> None:
            async with AsyncClient(server.address, read_timeout=0.5) as client:
                with self.assertRaises(ConnectionLost) as caught:
                    await client.status("report")
                self.assertIn("no reply within 0.5 s", str(caught.exception))

        run(test)

    def test_server_error(self) -> None:
        def respond(line: bytes) -> bytes:
            if line.startswith(b"lock"):
                return b"INVALID_PARAMETER: no thanks\n"
            if line.startswith(b"status"):
                return b"STATUS 0 0 %s\n" % line.split()[1]
            return b"INVALID_COMMAND\n"  # fencing: an older server

        server = fake_server(self, respond)

        async def test() -> None:
            async with AsyncClient(server.address) as client:
                with self.assertRaises(ServerError) as caught:
                    await client.lock("report")
                self.assertEqual(caught.exception.message, "INVALID_PARAMETER: no thanks")
                self.assertEqual(await client.status("report"), KeyStatus("report", 0, 0))

        run(test)

    def test_unreachable(self) -> None:
        from tests.servers import free_port

        async def test() -> None:
            async with AsyncClient(f"127.0.0.1:{free_port()}") as client:
                with self.assertRaises(ConnectFailed):
                    await client.status("report")

        run(test)
