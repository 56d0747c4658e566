"""
The blocking and asyncio elections (L{jesync.client.election}) over real
TCP to the real server in a thread: a resignation hands over at once to
the next candidate in arrival order, a leader's dropped connection too;
observers get the leader at their start and every change in order; a
leader whose server goes away is told (lost callback, C{LockLost} leaving
its C{with} block); each leader's fencing token is larger.  The Twisted
election, on a clock, is in L{tests.unit.test_client_election}.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import AsyncClient, AsyncElection, Client, ConnectionLost, Election, Leader, LockLost, LockTimeout
from tests.servers import serve_in_thread
from tests.support import grant_and_release_before_answering

WITHIN = 5.0


def values(leaders: list[Optional[Leader]]) -> list[Optional[bytes]]:
    return [None if leader is None else leader.value for leader in leaders]


class BlockingElectionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def election(self, name: str = "db") -> Election:
        client = Client(self.server.address)
        self.addCleanup(client.close)
        return Election(client, name)

    def waiting(self, count: int) -> None:
        """Wait (bounded) until C{count} candidates wait in the election, so the next arrives after them."""
        watcher = self.election()
        deadline = time.monotonic() + WITHIN
        while watcher.client.status(watcher.key).waiting != count:
            if time.monotonic() > deadline:
                self.fail(f"{count} candidates never waited")
            time.sleep(0.01)

    def campaign_in_thread(self, election: Election, value: str) -> tuple[threading.Event, list[Any]]:
        won: list[Any] = []
        elected = threading.Event()

        def run() -> None:
            won.append(election.campaign(value))
            elected.set()

        threading.Thread(target=run, daemon=True).start()
        return elected, won

    def test_hand_over_on_resign_and_disconnect_observed_in_order(self) -> None:
        """
        "a" leads; "b" then "c" campaign and wait.  "a" resigns: "b" leads
        at once; "b"'s connection closes: "c" leads.  An observer sees
        each, in order, and each token is larger than the one before.
        """
        with self.election().observe() as changes:
            first = self.election().campaign("a")
            b_election = self.election()
            b_elected, b_won = self.campaign_in_thread(b_election, "b")
            self.waiting(1)
            c_elected, c_won = self.campaign_in_thread(self.election(), "c")
            self.waiting(2)
            self.assertTrue(first.resign())
            self.assertTrue(b_elected.wait(WITHIN))
            status = self.election().client.status("election:db")
            self.assertEqual((status.granted, status.waiting), (1, 1))  # "c" still waits: the hand-over was to "b"
            b_election.client.close()
            self.assertTrue(c_elected.wait(WITHIN))
            [second], [third] = b_won, c_won
            self.assertTrue(third.resign())
            told = []
            while len(told) < 7:
                changed, leader = changes.get(WITHIN)
                self.assertTrue(changed, told)
                told.append(leader)
        self.assertEqual(values(told), [None, b"a", None, b"b", None, b"c", None])
        tokens = [leader.token for leader in told if leader is not None]
        self.assertEqual(tokens, [first.token, second.token, third.token])
        self.assertEqual(sorted(set(tokens)), tokens)
        self.assertTrue(second.lost)
        self.assertEqual(changes.get(0), (False, None))  # closed

    def test_leader(self) -> None:
        election = self.election()
        self.assertIsNone(election.leader())
        with self.election().campaign(b"host-1:8080") as leadership:
            leader = election.leader()
            assert leader is not None
            self.assertEqual((leader.value, leader.token), (b"host-1:8080", leadership.token))
        self.assertTrue(leadership.released)
        self.assertIsNone(election.leader())

    def test_leader_told_when_the_server_goes(self) -> None:
        """The lost callback is called, and leaving the C{with} block raises L{LockLost}."""
        lost = threading.Event()
        with self.assertRaises(LockLost):
            with self.election().campaign("a") as leadership:
                leadership.add_lost_callback(lambda error: lost.set())
                self.server.kill()
                self.assertTrue(lost.wait(WITHIN))
        self.assertTrue(leadership.lost)

    def test_campaign_wait_runs_out(self) -> None:
        leadership = self.election().campaign("a")
        self.addCleanup(leadership.resign)
        self.assertRaises(LockTimeout, self.election().campaign, "b", wait=0)

    def test_no_leader_start_with_a_grant_and_release_before_the_answer(self) -> None:
        """
        A grant and its release reach the watch before the C{holders}
        answer, which counts them: the observer is told no leader, then
        only what came after (a campaign, its resignation).
        """
        grant_and_release_before_answering(self.server.server.locks, "election:db")
        with self.election().observe() as changes:
            self.assertEqual(changes.get(WITHIN), (True, None))
            self.assertTrue(self.election().campaign("a").resign())
            told = [changes.get(WITHIN), changes.get(WITHIN)]
        self.assertEqual([(changed, values([leader])) for changed, leader in told], [(True, [b"a"]), (True, [None])])

    def test_observer_told_of_its_lost_connection(self) -> None:
        changes = self.election().observe()
        self.assertEqual(changes.get(WITHIN), (True, None))
        self.server.kill()
        self.assertRaises(ConnectionLost, changes.get, WITHIN)
        changes.close()


class AsyncElectionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def run_async(self, coroutine: Any) -> Any:
        return asyncio.run(asyncio.wait_for(coroutine, 3 * WITHIN))

    def test_hand_over_observed_in_order(self) -> None:
        """As the blocking client's: a resignation hands over at once, in order; leadership lost is told."""

        async def scenario() -> tuple[list[Optional[Leader]], list[Any], Any]:
            clients = [AsyncClient(self.server.address) for _ in range(4)]
            try:
                observer, a, b, c = (AsyncElection(client, "db") for client in clients)
                told = []
                async with await observer.observe() as changes:
                    first = await a.campaign("a")
                    second_campaign = asyncio.ensure_future(b.campaign("b"))
                    while (await clients[0].status(observer.key)).waiting < 1:
                        await asyncio.sleep(0.01)
                    third_campaign = asyncio.ensure_future(c.campaign("c"))
                    while (await clients[0].status(observer.key)).waiting < 2:
                        await asyncio.sleep(0.01)
                    self.assertTrue(await first.resign())
                    second = await second_campaign
                    status = await clients[0].status(observer.key)
                    self.assertEqual((status.granted, status.waiting), (1, 1))  # "c" still waits
                    async with second:
                        pass  # leaving resigns
                    third = await third_campaign
                    lost = asyncio.Event()
                    third.add_lost_callback(lambda error: lost.set())
                    await clients[3].close()
                    await asyncio.wait_for(lost.wait(), WITHIN)
                    async for leader in changes:
                        told.append(leader)
                        if len(told) == 7:
                            break
                return told, [first, second, third], await observer.leader()
            finally:
                for client in clients:
                    await client.close()

        told, leaderships, now = self.run_async(scenario())
        self.assertEqual(values(told), [None, b"a", None, b"b", None, b"c", None])
        self.assertEqual([leader.token for leader in told if leader], [each.token for each in leaderships])
        self.assertEqual([each.released for each in leaderships], [True, True, False])
        self.assertTrue(leaderships[2].lost)
        self.assertIsNone(now)

    def test_no_leader_start_with_a_grant_and_release_before_the_answer(self) -> None:
        """As the blocking client's: the pair from before the answer is not told."""
        grant_and_release_before_answering(self.server.server.locks, "election:db")

        async def scenario() -> list[Optional[Leader]]:
            observer_client, candidate_client = AsyncClient(self.server.address), AsyncClient(self.server.address)
            try:
                async with await AsyncElection(observer_client, "db").observe() as changes:
                    told = [(await changes.get(WITHIN))[1]]
                    await (await AsyncElection(candidate_client, "db").campaign("a")).resign()
                    while len(told) < 3:
                        changed, leader = await changes.get(WITHIN)
                        self.assertTrue(changed, told)
                        told.append(leader)
                return told
            finally:
                await observer_client.close()
                await candidate_client.close()

        self.assertEqual(values(self.run_async(scenario())), [None, b"a", None])
