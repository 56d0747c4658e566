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


class CloseStopsKeptTests(SynchronousTestCase):
    """
    C{close()} stops the client's candidacies and memberships: its dropped
    connections are no loss to them, and nothing campaigns or joins again.
    """

    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_blocking_close_stops_campaigning_and_joining(self) -> None:
        told: queue.Queue[str] = queue.Queue()
        client = Client(self.server.address, connect_retries=0)
        self.addCleanup(client.close)
        candidacy = Election(client, "db").keep_campaigning(
            "a", lambda _: told.put("elected"), lambda _: told.put("lost"), retry=0.05
        )
        membership = client.group("workers").keep_joined(
            "w1", on_joined=lambda _: told.put("joined"), on_lost=lambda _: told.put("mlost"), retry=0.05
        )
        self.assertEqual({told.get(timeout=WITHIN), told.get(timeout=WITHIN)}, {"elected", "joined"})
        client.close()
        candidacy._thread.join(WITHIN)
        membership._thread.join(WITHIN)
        self.assertFalse(candidacy._thread.is_alive())
        self.assertFalse(membership._thread.is_alive())
        self.assertTrue(candidacy.stopped and membership.stopped)
        self.assertTrue(told.empty())  # neither lost nor elected (joined) again
        with Client(self.server.address) as observer:
            self.assertIsNone(Election(observer, "db").leader())
            self.assertEqual(observer.group("workers").members(), [])

    def test_async_close_stops_campaigning_and_joining(self) -> None:
        async def scenario() -> None:
            told: asyncio.Queue[str] = asyncio.Queue()
            client = AsyncClient(self.server.address, connect_retries=0)
            candidacy = AsyncElection(client, "db").keep_campaigning(
                "a", lambda _: told.put_nowait("elected"), lambda _: told.put_nowait("lost"), retry=0.05
            )
            membership = client.group("workers").keep_joined(
                "w1", on_joined=lambda _: told.put_nowait("joined"), on_lost=lambda _: told.put_nowait("mlost")
            )
            firsts = {await asyncio.wait_for(told.get(), WITHIN), await asyncio.wait_for(told.get(), WITHIN)}
            self.assertEqual(firsts, {"elected", "joined"})
            await client.close()
            await asyncio.wait_for(asyncio.wait([candidacy._task, membership._task]), WITHIN)
            self.assertTrue(candidacy.stopped and membership.stopped)
            self.assertTrue(told.empty())
            async with AsyncClient(self.server.address) as observer:
                self.assertIsNone(await AsyncElection(observer, "db").leader())
                self.assertEqual(await observer.group("workers").members(), [])
            await client.close()

        asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN))


class AsyncStopWhileJoiningTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_stop_while_the_join_is_on_its_way_leaves(self) -> None:
        """A stop() while the join's line is sent and unanswered: the join lands, and is left."""

        async def scenario() -> None:
            async with AsyncClient(self.server.address, connect_retries=0) as client:
                group = client.group("workers")
                stopping: list[asyncio.Future[bool]] = []
                sent_join = group.join

                async def join_then_stop(*arguments: Any) -> Any:
                    joining = asyncio.ensure_future(sent_join(*arguments))
                    await asyncio.sleep(0)  # (its line is written)
                    stopping.append(asyncio.ensure_future(membership.stop()))
                    return await joining

                group.join = join_then_stop  # type: ignore[method-assign]
                membership = group.keep_joined("w1", retry=0.05)
                while not stopping:
                    await asyncio.sleep(0.01)
                self.assertFalse(await asyncio.wait_for(stopping[0], WITHIN))
                self.assertFalse(membership.joined)
                self.assertEqual(await client.group("workers").members(), [])

        asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN))


class TwoServersTests(SynchronousTestCase):
    """With two servers, a kept membership watches its key on the group's server, where it joined."""

    def setUp(self) -> None:
        self.servers = [serve_in_thread(self), serve_in_thread(self)]
        self.addresses = [server.address for server in self.servers]

    def member_elsewhere(self, client: Any) -> str:
        """A member id whose key alone would be placed on the other server than the group's."""
        group_server = client.server_for("group:workers")
        members = (f"w{n}" for n in range(100))
        return next(member for member in members if client.server_for(f"group:workers/{member}") != group_server)

    def test_blocking_membership_sees_its_loss(self) -> None:
        told: queue.Queue[str] = queue.Queue()
        client = Client(self.addresses, connect_retries=0)
        self.addCleanup(client.close)
        member = self.member_elsewhere(client)
        membership = client.group("workers").keep_joined(
            member, on_joined=lambda _: told.put("joined"), on_lost=lambda _: told.put("lost"), retry=0.05
        )
        self.addCleanup(membership.stop)
        self.assertEqual(told.get(timeout=WITHIN), "joined")
        client.group("workers").leave(member)  # (its connection: the membership ends)
        self.assertEqual([told.get(timeout=WITHIN), told.get(timeout=WITHIN)], ["lost", "joined"])
        self.assertEqual([m.member for m in client.group("workers").members()], [member])

    def test_async_membership_sees_its_loss(self) -> None:
        async def scenario() -> list[str]:
            told: asyncio.Queue[str] = asyncio.Queue()
            async with AsyncClient(self.addresses, connect_retries=0) as client:
                member = self.member_elsewhere(client)
                membership = client.group("workers").keep_joined(
                    member, on_joined=lambda _: told.put_nowait("joined"), on_lost=lambda _: told.put_nowait("lost")
                )
                turns = [await asyncio.wait_for(told.get(), WITHIN)]
                await client.group("workers").leave(member)
                turns.append(await asyncio.wait_for(told.get(), WITHIN))
                turns.append(await asyncio.wait_for(told.get(), WITHIN))
                self.assertTrue(await membership.stop())
                return turns

        self.assertEqual(asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN)), ["joined", "lost", "joined"])


class AsyncMembershipBrokenTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def test_an_error_no_retry_mends_is_logged_and_stops(self) -> None:
        """An exception other than a ClientError while joining is logged as an error, and the membership stops."""

        async def scenario() -> Any:
            async with AsyncClient(self.server.address, connect_retries=0) as client:
                group = client.group("workers")

                async def broken(*arguments: Any) -> Any:
                    raise RuntimeError("a bug")

                group.create = broken  # type: ignore[method-assign]
                membership = group.keep_joined("w1", retry=0.05)
                await asyncio.wait_for(membership._task, WITHIN)
                return membership

        with self.assertLogs("jesync.client", "ERROR") as logged:
            membership = asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN))
        self.assertTrue(membership.stopped)
        self.assertIn("a bug", logged.output[0])

    def test_without_a_lease_a_closed_watch_is_a_drop_not_a_heartbeat(self) -> None:
        """
        With no lease, the end of its watch (get() answering None: only its
        own close does that) is told as a loss; no heartbeat is sent.
        """

        async def scenario() -> list[str]:
            told: asyncio.Queue[str] = asyncio.Queue()
            async with AsyncClient(self.server.address, connect_retries=0) as client:
                group = client.group("workers")
                heartbeats: list[Any] = []

                async def heartbeat(*arguments: Any) -> bool:
                    heartbeats.append(arguments)
                    return True

                group.heartbeat = heartbeat  # type: ignore[method-assign]
                sent_watch = client.watch

                def closed_at_once(**arguments: Any) -> Any:
                    async def start() -> Any:
                        watch = await sent_watch(**arguments)
                        if not told.qsize():
                            await watch.close()  # (the first turn's watch only)
                        return watch

                    return start()

                client.watch = closed_at_once  # type: ignore[method-assign]
                membership = group.keep_joined(
                    "w1", on_joined=lambda _: told.put_nowait("joined"), on_lost=lambda _: told.put_nowait("lost")
                )
                turns = [await asyncio.wait_for(told.get(), WITHIN) for _ in range(2)]
                self.assertEqual(heartbeats, [])
                await membership.stop()
                return turns

        self.assertEqual(asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN)), ["joined", "lost"])
