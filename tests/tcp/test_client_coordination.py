"""
Each client's own form of a watch, over real TCP to the real server in a
thread (what all three promise alike is the client contract,
L{tests.tcp.test_client_contract}): the blocking client's iterator in a
C{with} block, ended by C{close()} from another thread, and a prefix watch
over several servers; the asyncio client's C{async with} / C{async for};
the recipe for a consistent start (watch, then C{holders()}); a reader
that falls behind (each client: its watch unwatches on the server at
once, seen through the server's C{--max-watches 1}); a watch on a
cluster's leader ended by its death, and watched again on the next member
(the members are real servers standing in, as in
L{tests.tcp.test_client_failover}).
"""

from __future__ import annotations

import asyncio
import threading

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import AsyncClient, Client, ConnectionLost, WatchEvent, WatchFellBehind
from tests.servers import serve_in_thread

WITHIN = 5.0


class BlockingWatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def client(self, servers: object = None) -> Client:
        client = Client(servers or self.server.address)
        self.addCleanup(client.close)
        return client

    def test_iterating_until_closed(self) -> None:
        """A thread iterates over the events; close() from another thread ends its loop (no exception)."""
        watcher, worker = self.client(), self.client()
        seen: list[WatchEvent] = []
        two_seen, ended = threading.Event(), threading.Event()
        with watcher.watch("k") as events:

            def consume() -> None:
                for event in events:
                    seen.append(event)
                    if len(seen) == 2:
                        two_seen.set()
                ended.set()

            threading.Thread(target=consume, daemon=True).start()
            lock = worker.lock("k", value=b"v")
            self.assertTrue(lock.release())
            self.assertTrue(two_seen.wait(WITHIN))
            self.assertFalse(ended.is_set())
        self.assertTrue(ended.wait(WITHIN))
        self.assertEqual([(e.kind, e.value) for e in seen], [("granted", b"v"), ("released", None)])
        self.assertIsNone(events.get(0))

    def test_consistent_start(self) -> None:
        """Watch, then holders(): every change after the holders' answer is an event."""
        watcher, worker = self.client(), self.client()
        first = worker.lock("k", shared=True, value="a")
        with watcher.watch("k") as events:
            holders = watcher.holders("k")
            self.assertEqual([(h.token, h.value) for h in holders], [(first.token, b"a")])
            second = self.client().lock("k", shared=True)
            self.assertTrue(first.release())
            kinds = [(e.kind, e.token) for e in (events.get(WITHIN), events.get(WITHIN))]
        self.assertEqual(kinds, [("granted", second.token), ("released", first.token)])

    def test_prefix_over_several_servers(self) -> None:
        """With two servers, a prefix watch watches both: each key's events come from the server it lives on."""
        other = serve_in_thread(self)
        servers = [self.server.address, other.address]
        watcher, worker = self.client(servers), self.client(servers)
        # (the servers' ports are random, so which keys each one gets is too: take keys until both have some)
        keys: list = []
        for n in range(200):
            keys.append(f"jobs/{n}")
            if len(keys) >= 8 and len({str(worker.server_for(key)) for key in keys}) == 2:
                break
        self.assertEqual(len({str(worker.server_for(key)) for key in keys}), 2)
        with watcher.watch(prefix="jobs/") as events:
            for key in keys:
                self.assertTrue(worker.lock(key).release())
            seen = [events.get(WITHIN) for _ in range(4 * len(keys))]
        self.assertNotIn(None, seen)
        self.assertEqual({e.key for e in seen}, set(keys))
        for key in keys:
            self.assertEqual([e.kind for e in seen if e.key == key], ["appeared", "granted", "released", "disappeared"])

    def test_raises_until_closed_once_lost(self) -> None:
        watcher = self.client()
        events = watcher.watch("k")
        self.server.kill()
        self.assertRaises(ConnectionLost, events.get, WITHIN)
        self.assertRaises(ConnectionLost, next, events)
        events.close()


class FallingBehindTests(SynchronousTestCase):
    """
    A watch whose reader falls more than C{max_events} behind stops
    watching on the server as soon as the next event is read: with
    C{--max-watches 1}, the same connection may then watch another key.
    (The C{status} round trip makes sure the watcher has read every event
    of the changes before it: the server sends them before its reply.)
    """

    def setUp(self) -> None:
        self.server = serve_in_thread(self, extra_args=["--max-watches", "1"])

    def test_blocking(self) -> None:
        watcher, worker = Client(self.server.address), Client(self.server.address)
        self.addCleanup(watcher.close)
        self.addCleanup(worker.close)
        events = watcher.watch("k", max_events=2)
        for _ in range(2):
            self.assertTrue(worker.lock("k").release())
        watcher.status("k")
        with watcher.watch("j") as other:
            kinds = [event.kind for event in (events.get(0), events.get(0)) if event is not None]
            self.assertEqual(kinds, ["granted", "released"])
            self.assertRaises(WatchFellBehind, events.get, 0)
            lock = worker.lock("j")
            event = other.get(WITHIN)
            assert event is not None
            self.assertEqual((event.kind, event.key, event.token), ("granted", "j", lock.token))

    def test_asyncio(self) -> None:
        async def scenario() -> list[str]:
            async with AsyncClient(self.server.address) as watcher, AsyncClient(self.server.address) as worker:
                events = await watcher.watch("k", max_events=2)
                for _ in range(2):
                    await (await worker.lock("k")).release()
                await watcher.status("k")
                async with watcher.watch("j"):
                    kinds = [event.kind for event in (await events.get(0), await events.get(0)) if event is not None]
                    try:
                        await events.get(0)
                    except WatchFellBehind:
                        kinds.append("fell behind")
                return kinds

        self.assertEqual(
            asyncio.run(asyncio.wait_for(scenario(), 3 * WITHIN)), ["granted", "released", "fell behind"]
        )


class FailoverWatchTests(SynchronousTestCase):
    def test_leader_killed_while_watching(self) -> None:
        """The watch raises ConnectionLost (never silence); watching again goes to the member that answers."""
        first, second = serve_in_thread(self), serve_in_thread(self)
        cluster = f"{first.address}|{second.address}"
        watcher = Client(cluster, environ={}, connect_timeout=0.5, read_timeout=0.5, retry_backoff=0.05)
        self.addCleanup(watcher.close)
        events = watcher.watch("leader")
        self.addCleanup(events.close)
        first.kill()
        with self.assertRaises(ConnectionLost) as caught:
            events.get(WITHIN)
        self.assertEqual(caught.exception.address, first.address)
        with watcher.watch("leader") as again:
            worker = Client(second.address, environ={})
            self.addCleanup(worker.close)
            lock = worker.lock("leader", value="me")
            event = again.get(WITHIN)
        assert event is not None
        self.assertEqual((event.kind, event.token, event.value), ("granted", lock.token, b"me"))


class AsyncWatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    def run_async(self, coroutine: object) -> object:
        return asyncio.run(asyncio.wait_for(coroutine, 3 * WITHIN))  # type: ignore[arg-type]

    def test_async_with_and_async_for(self) -> None:
        async def scenario() -> list[tuple[str, str]]:
            async with AsyncClient(self.server.address) as watcher, AsyncClient(self.server.address) as worker:
                seen = []
                async with watcher.watch(prefix="") as events:
                    lock = await worker.lock("k", shared=True)
                    await lock.release()
                    async for event in events:
                        seen.append((event.kind, event.key))
                        if event.kind == "disappeared":
                            break
                events_after = await events.get(0)
                assert events_after is None
                return seen

        self.assertEqual(
            self.run_async(scenario()), [("appeared", "k"), ("granted", "k"), ("released", "k"), ("disappeared", "k")]
        )

    def test_get_takes_what_is_queued_without_waiting(self) -> None:
        """(The status round trip has both events read: the server sends them before its reply.)"""

        async def scenario() -> list[str]:
            async with AsyncClient(self.server.address) as watcher, AsyncClient(self.server.address) as worker:
                async with watcher.watch("k") as events:
                    await (await worker.lock("k")).release()
                    await watcher.status("k")
                    first = await events.get(0)
                    assert first is not None
                    second = await events.get(0)
                    assert second is not None
                    return [first.kind, second.kind]

        self.assertEqual(self.run_async(scenario()), ["granted", "released"])

    def test_awaited_watch_and_its_lost_connection(self) -> None:
        async def scenario() -> None:
            async with AsyncClient(self.server.address) as watcher:
                events = await watcher.watch("k")
                self.server.kill()
                with self.assertRaises(ConnectionLost):
                    async for _ in events:
                        pass
                await events.close()

        self.run_async(scenario())
