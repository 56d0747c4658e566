"""
The asyncio client's own ways, against the real server in a thread of this
process over real TCP (L{tests.servers.serve_in_thread}), each test in its
own C{asyncio.run}: C{async with}, tasks sharing one connection, a cancelled
wait.  What every client promises is said once, in
L{tests.tcp.test_client_contract}.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import AsyncClient, KeyBusy, KeyStatus, LockLost, LockTimeout
from tests.servers import serve_in_thread

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
        self.server = serve_in_thread(self)

    def test_context_manager(self) -> None:
        """C{async with} holds the lock for the block and releases it after; a waiter then gets it."""

        async def test() -> None:
            async with AsyncClient(self.server.address) as first, AsyncClient(self.server.address) as second:
                async with first.lock("report", wait=10) as lock:
                    self.assertTrue(lock.held)
                    waiting = asyncio.ensure_future(second.lock("report"))
                    await eventually(lambda: self._status_is(first, "report", 1, 1))
                    self.assertFalse(waiting.done())
                self.assertTrue(lock.released)
                other = await waiting
                self.assertEqual(await first.status("report"), KeyStatus("report", 1, 0))
                self.assertTrue(await other.release())

        run(test)

    async def _status_is(self, client: AsyncClient, key: str, granted: int, waiting: int) -> bool:
        return await client.status(key) == KeyStatus(key, granted, waiting)

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

    def test_with_block_raises_when_the_server_dies(self) -> None:
        """
        The server dies inside an C{async with} block: the block raises
        LockLost (the rest of a dead server's story is the contract's:
        L{tests.tcp.test_client_contract.ClientContract.test_server_killed_while_holding}).
        """

        async def test() -> None:
            async with AsyncClient(self.server.address) as client:
                lost = asyncio.get_running_loop().create_future()
                with self.assertRaises(LockLost):
                    async with client.lock("block") as lock:
                        lock.add_lost_callback(lost.set_result)
                        self.server.kill()
                        error = await asyncio.wait_for(lost, WITHIN)
                self.assertIn("connection", error.reason)
                self.assertTrue(lock.lost)

        run(test)


