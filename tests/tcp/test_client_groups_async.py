"""
The asyncio client's groups (L{jesync.client.group.AsyncGroup}) over real
TCP to the real server in a thread: the blocking group's operations,
awaited, with the same errors; a member ends when its connection closes;
a group watch tells joins and leaves in order.  The rules themselves are
proved once, for the blocking client, in L{tests.tcp.test_client_groups}.
"""

from __future__ import annotations

import asyncio
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    AsyncClient,
    AsyncGroup,
    GroupAlreadyExists,
    GroupNotCreated,
    GroupNotEmpty,
    MemberAlreadyExists,
    MemberNotJoined,
    ServerError,
)
from jesync.client.group import member_of
from tests.servers import serve_in_thread

WITHIN = 5.0


class AsyncGroupTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self, extra_args=["--max-members", "2"])

    def run_async(self, coroutine: Any) -> Any:
        return asyncio.run(asyncio.wait_for(coroutine, 3 * WITHIN))

    def test_create_join_members_leave_delete(self) -> None:
        """The whole life of a group, awaited, each refusal its own error."""

        async def scenario() -> None:
            async with AsyncClient(self.server.address) as one, AsyncClient(self.server.address) as two:
                workers = one.group("workers")
                self.assertIsInstance(workers, AsyncGroup)
                with self.assertRaises(GroupNotCreated):
                    await workers.members()
                await workers.create()
                with self.assertRaises(GroupAlreadyExists):
                    await workers.create()
                self.assertEqual(await one.groups(), ["workers"])
                self.assertEqual(await workers.join("w1", b"role=web", lease=10), 10)
                self.assertEqual(await two.group("workers").join("w2"), 0)
                with self.assertRaises(MemberAlreadyExists):
                    await two.group("workers").join("w1")
                with self.assertRaises(ServerError):  # --max-members 2
                    await two.group("workers").join("w3")
                members = await workers.members()
                self.assertEqual([(m.member, m.capabilities) for m in members], [("w1", b"role=web"), ("w2", None)])
                with self.assertRaises(GroupNotEmpty):
                    await workers.delete()
                with self.assertRaises(MemberNotJoined):
                    await workers.leave("w2")  # two's, not one's
                await workers.update("w1", "role=db")
                self.assertEqual((await workers.members())[0].capabilities, b"role=db")
                self.assertTrue(await workers.heartbeat("w1", 10))
                self.assertFalse(await workers.heartbeat("w2", 10))
                await workers.leave("w1")
                await two.close()  # w2 ends with its connection
                for _ in range(int(WITHIN / 0.01)):
                    if not await workers.members():
                        break
                    await asyncio.sleep(0.01)
                self.assertEqual(await workers.members(), [])
                await workers.delete()
                self.assertEqual(await one.groups(), [])

        self.run_async(scenario())

    def test_watch_tells_joins_and_leaves_in_order(self) -> None:
        async def scenario() -> list[tuple[str, Any, Any]]:
            async with AsyncClient(self.server.address) as one, AsyncClient(self.server.address) as two:
                group = one.group("g")
                await group.create()
                seen: list[tuple[str, Any, Any]] = []
                async with group.watch() as events:
                    await two.group("g").join("m1", b"caps")
                    await group.join("m2")
                    await two.group("g").leave("m1")
                    while len(seen) < 3:
                        event = await events.get(WITHIN)
                        self.assertIsNotNone(event, f"only {seen}")
                        if event.kind in ("granted", "released", "expired", "lost"):
                            seen.append((event.kind, member_of("g", event.key), event.value))
                return seen

        self.assertEqual(
            self.run_async(scenario()),
            [("granted", "m1", b"caps"), ("granted", "m2", None), ("released", "m1", None)],
        )

    def test_bad_names_are_refused_before_sending(self) -> None:
        client = AsyncClient(self.server.address)
        self.assertRaises(ValueError, client.group, "a/b")
        self.assertRaises(ValueError, client.group("g").join, "m m")
