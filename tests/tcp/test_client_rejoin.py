"""
The blocking and asyncio clients campaigning again
(L{jesync.client.election.Candidacy}) and joining again
(L{jesync.client.group.Membership}) after their server dies and comes back
on the same port, over real TCP to the real server in a thread: the
candidate (the member) is told it lost the leadership (the membership),
then (retried every C{retry} seconds while nothing answers) leads again
(is a member again: the restarted server's empty table gets the group
again) on the restarted server, with the callbacks in that order; C{stop}
resigns (leaves).  The Twisted ones, on a clock, are in
L{tests.unit.test_client_rejoin}.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import AsyncClient, AsyncElection, Client, Election, LockLost, MembershipLost
from tests.servers import serve_in_thread

WITHIN = 5.0


class BlockingCandidacyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_lost_then_leads_again_after_a_restart(self) -> None:
        told: queue.Queue[tuple[str, Any]] = queue.Queue()
        client = Client(self.server.address, connect_retries=0)
        self.addCleanup(client.close)
        candidacy = Election(client, "db").keep_campaigning(
            "a",
            lambda leadership: told.put(("elected", leadership)),
            lambda error: told.put(("lost", error)),
            retry=0.05,
        )
        self.addCleanup(candidacy.stop)
        what, first = told.get(timeout=WITHIN)
        self.assertEqual(what, "elected")
        self.server.kill()
        what, error = told.get(timeout=WITHIN)
        self.assertEqual(what, "lost")
        self.assertIsInstance(error, LockLost)
        self.assertIs(error, first.lost_reason)
        self.server.start()  # back, on the same port, its table empty
        what, second = told.get(timeout=WITHIN)
        self.assertEqual(what, "elected")
        self.assertTrue(second.held)
        self.assertIs(candidacy.leadership, second)
        with Client(self.server.address) as observer:
            self.assertEqual(Election(observer, "db").leader().value, b"a")
            self.assertTrue(candidacy.stop())
            self.assertIsNone(Election(observer, "db").leader())
        self.assertTrue(told.empty())  # a stop is not a loss: nothing told


class AsyncCandidacyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_lost_then_leads_again_after_a_restart(self) -> None:
        async def scenario() -> list[str]:
            told: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
            async with AsyncClient(self.server.address, connect_retries=0) as client:
                candidacy = AsyncElection(client, "db").keep_campaigning(
                    "a",
                    lambda leadership: told.put_nowait(("elected", leadership)),
                    lambda error: told.put_nowait(("lost", error)),
                    retry=0.05,
                )
                turns = [await asyncio.wait_for(told.get(), WITHIN)]
                await asyncio.get_running_loop().run_in_executor(None, self.server.kill)
                turns.append(await asyncio.wait_for(told.get(), WITHIN))
                self.assertIsInstance(turns[-1][1], LockLost)
                await asyncio.get_running_loop().run_in_executor(None, self.server.start)
                turns.append(await asyncio.wait_for(told.get(), WITHIN))
                self.assertTrue(turns[-1][1].held)
                self.assertEqual((await AsyncElection(client, "db").leader()).value, b"a")
                self.assertTrue(await candidacy.stop())
                self.assertIsNone(await AsyncElection(client, "db").leader())
                return [what for what, _ in turns]

        self.assertEqual(asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN)), ["elected", "lost", "elected"])


class BlockingMembershipTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_lost_then_joined_again_after_a_restart(self) -> None:
        told: queue.Queue[tuple[str, Any]] = queue.Queue()
        client = Client(self.server.address, connect_retries=0)
        self.addCleanup(client.close)
        membership = client.group("workers").keep_joined(
            "w1",
            b"caps",
            lease=3,
            on_joined=lambda kept: told.put(("joined", kept)),
            on_lost=lambda error: told.put(("lost", error)),
            retry=0.05,
        )
        self.addCleanup(membership.stop)
        self.assertEqual(told.get(timeout=WITHIN), ("joined", membership))
        self.server.kill()
        what, error = told.get(timeout=WITHIN)
        self.assertEqual(what, "lost")
        self.assertIsInstance(error, MembershipLost)
        self.assertFalse(membership.joined)
        self.assertRaises(MembershipLost, membership.update, b"v2")  # kept for the re-join
        self.server.start()  # back, on the same port, its table empty
        self.assertEqual(told.get(timeout=WITHIN), ("joined", membership))
        with Client(self.server.address) as observer:
            members = observer.group("workers").members()
            self.assertEqual([(m.member, m.capabilities) for m in members], [("w1", b"v2")])
            self.assertTrue(membership.stop())
            self.assertEqual(observer.group("workers").members(), [])
        self.assertTrue(told.empty())  # a stop is not a loss: nothing told


class AsyncMembershipTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_lost_then_joined_again_after_a_restart(self) -> None:
        async def scenario() -> list[str]:
            told: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
            async with AsyncClient(self.server.address, connect_retries=0) as client:
                membership = client.group("workers").keep_joined(
                    "w1",
                    b"caps",
                    on_joined=lambda kept: told.put_nowait(("joined", kept)),
                    on_lost=lambda error: told.put_nowait(("lost", error)),
                    retry=0.05,
                )
                turns = [await asyncio.wait_for(told.get(), WITHIN)]
                await asyncio.get_running_loop().run_in_executor(None, self.server.kill)
                turns.append(await asyncio.wait_for(told.get(), WITHIN))
                self.assertIsInstance(turns[-1][1], MembershipLost)
                await asyncio.get_running_loop().run_in_executor(None, self.server.start)
                turns.append(await asyncio.wait_for(told.get(), WITHIN))
                self.assertTrue(membership.joined)
                members = await client.group("workers").members()
                self.assertEqual([(m.member, m.capabilities) for m in members], [("w1", b"caps")])
                self.assertTrue(await membership.stop())
                self.assertEqual(await client.group("workers").members(), [])
                return [what for what, _ in turns]

        self.assertEqual(asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN)), ["joined", "lost", "joined"])
