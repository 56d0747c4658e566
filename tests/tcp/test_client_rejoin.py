"""
The blocking and asyncio clients campaigning again after their server dies
and comes back on the same port (L{jesync.client.election.Candidacy}),
over real TCP to the real server in a thread: the candidate is told it
lost the leadership, then (its campaigns retried every C{retry} seconds
while nothing answers) leads again on the restarted server, with the
callbacks in that order; L{stop} resigns.  The Twisted candidacy, on a
clock, is in L{tests.unit.test_client_rejoin}.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import AsyncClient, AsyncElection, Client, Election, LockLost
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
