"""
Fencing tokens and C{lock_many}: the session's rules without I/O (scripted
reply lines), then the blocking and asyncio clients over real TCP against
the real server (the Twisted client's: L{tests.unit.test_client_twisted},
against the real server in memory).
What every client promises (granted, waiting, timed out, tokens that only
grow, lost with the server, refused by an older server, keys on one server)
is said once in the client contract (L{tests.tcp.test_client_contract});
here is what is a client's own (its C{with} statements, a cancelled wait).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    AsyncClient,
    Client,
    KeyBusy,
    KeyStatus,
    LockLost,
    LockManyTimeout,
    LockTimeout,
)
from jesync.client.handle import LockState
from jesync.client.session import Session
from jesync.client.wire import Reply
from tests.client_case import WITHIN, ClientTestCase
from tests.servers import serve_in_thread


# -- the session, scripted ------------------------------------------------------


class ScriptedSession:
    """A L{Session} whose sent bytes are recorded and whose replies are scripted."""

    def __init__(self) -> None:
        self.sent = b""
        self.now = 1000.0
        self.session = Session("memory", self._send, self._make_lock, lambda: self.now)
        self.results: dict[str, Any] = {}

    def _send(self, data: bytes) -> None:
        self.sent += data

    def _make_lock(self, reply: Reply, max_concurrent: int, expires: int) -> LockState:
        return LockState(reply, "memory", max_concurrent, expires, lambda: self.now)

    def callbacks(self, name: str) -> tuple[Callable[[Any], None], Callable[[Exception], None]]:
        def settle(value: Any) -> None:
            assert name not in self.results, f"{name} settled twice"
            self.results[name] = value

        return settle, settle

    def take_sent(self) -> bytes:
        sent, self.sent = self.sent, b""
        return sent

    def reply(self, *lines: bytes) -> None:
        for line in lines:
            self.session.line_received(line)

    def lock_many(self, name: str, keys: str, timeout: int = -1, expires: int = 120) -> None:
        self.session.lock_many(tuple(keys.split()), timeout, expires, *self.callbacks(name))


class SessionTests(SynchronousTestCase):
    def test_fencing_on(self) -> None:
        s = ScriptedSession()
        s.session.enable_fencing(*s.callbacks("fencing"))
        s.session.lock("A", 1, -1, 120, *s.callbacks("A"))
        self.assertEqual(s.take_sent(), b"fencing on\nlock A 1 -1 120\nstatus A\n")
        s.reply(b"FENCING ON", b"GRANTED 1 0 A 120 41", b"STATUS 1 0 A")
        self.assertIs(s.session.fencing, True)
        lock = s.results["A"]
        self.assertEqual((lock.token, lock.tokens, lock.keys, lock.many), (41, {"A": 41}, ("A",), False))

    def test_fencing_refused_by_an_older_server(self) -> None:
        """INVALID_COMMAND: the session goes on without tokens (and fencing is False, not an error)."""
        s = ScriptedSession()
        s.session.enable_fencing(*s.callbacks("fencing"))
        s.session.lock("A", 1, -1, 120, *s.callbacks("A"))
        s.reply(b"INVALID_COMMAND", b"GRANTED 1 0 A 120", b"STATUS 1 0 A")
        self.assertIs(s.results["fencing"], False)
        self.assertIs(s.session.fencing, False)
        self.assertIsNone(s.results["A"].token)
        self.assertEqual(s.results["A"].tokens, {"A": None})

    def test_one_handle_for_all_keys(self) -> None:
        s = ScriptedSession()
        s.lock_many("AB", "A B", expires=60)
        s.reply(b"GRANTED-MANY 2 60 A B 5 6", b"STATUS 1 0 A")
        lock = s.results["AB"]
        self.assertEqual((lock.keys, lock.key, lock.tokens, lock.many), (("A", "B"), "A", {"A": 5, "B": 6}, True))
        self.assertEqual((lock.max_concurrent, lock.expires, lock.seconds_left), (1, 60, 60))
        self.assertEqual(s.session.held, {"A": lock, "B": lock})
        self.assertRaises(TypeError, lambda: lock.token)
        self.assertIn("'A' 'B'", repr(lock))
        s.take_sent()
        for attempt in [
            lambda: s.session.lock("B", 1, 0, 120, *s.callbacks("B")),
            lambda: s.lock_many("CA", "C A", timeout=0),
        ]:
            self.assertRaises(KeyBusy, attempt)
        self.assertEqual(s.sent, b"")

    def test_one_key_many(self) -> None:
        """lock_many of one key: its token is also C{token}, and it renews with lock-many."""
        s = ScriptedSession()
        s.lock_many("A", "A")
        s.reply(b"GRANTED-MANY 1 120 A 9", b"STATUS 1 0 A")
        lock = s.results["A"]
        self.assertEqual((lock.token, lock.many), (9, True))
        s.take_sent()
        s.session.renew(lock, *s.callbacks("renew"))
        self.assertEqual(s.sent, b"lock-many 0 120 A\nstatus A\n")

    def test_release_every_key(self) -> None:
        s = ScriptedSession()
        s.lock_many("AB", "A B")
        s.reply(b"GRANTED-MANY 2 120 A B", b"STATUS 1 0 A")
        lock = s.results["AB"]
        s.take_sent()
        s.session.release(lock, *s.callbacks("release"))
        self.assertEqual(s.sent, b"release A\nrelease B\n")
        self.assertEqual(s.session.held, {})
        s.reply(b"RELEASED 0 0 A")
        self.assertNotIn("release", s.results)
        s.reply(b"RELEASED 0 0 B")
        self.assertIs(s.results["release"], True)
        self.assertTrue(lock.released)
        s.session.release(lock, *s.callbacks("again"))
        self.assertIs(s.results["again"], False)

    def test_release_finds_one_key_expired(self) -> None:
        s = ScriptedSession()
        s.lock_many("AB", "A B")
        s.reply(b"GRANTED-MANY 2 120 A B", b"STATUS 1 0 A")
        lock = s.results["AB"]
        s.session.release(lock, *s.callbacks("release"))
        s.reply(b"RELEASED 0 0 A", b"NOT_RELEASED 0 0 B")
        self.assertIs(s.results["release"], False)
        self.assertTrue(lock.lost)
        self.assertEqual(lock.lost_reason.keys, ["A", "B"])
        self.assertIn("expired", lock.lost_reason.reason)

    def test_renew(self) -> None:
        """A lock-many lock renews with lock-many, timeout 0, all its keys at once."""
        s = ScriptedSession()
        s.lock_many("AB", "A B", timeout=5, expires=30)
        s.reply(b"GRANTED-MANY 2 30 A B 1 2", b"STATUS 1 0 A")
        lock = s.results["AB"]
        s.take_sent()
        s.now += 20
        self.assertEqual(lock.seconds_left, 10)
        s.session.renew(lock, *s.callbacks("renew"))
        self.assertEqual(s.take_sent(), b"lock-many 0 30 A B\nstatus A\n")
        s.reply(b"GRANTED-MANY 2 30 A B 1 2", b"STATUS 1 0 A")
        self.assertIsNone(s.results["renew"])
        self.assertEqual(lock.seconds_left, 30)
        self.assertTrue(lock.held)

    def test_renewal_refused(self) -> None:
        """
        TIMEOUT-MANY: a key had expired and was taken: the lock is lost, and
        the keys this connection may still hold are released.
        """
        s = ScriptedSession()
        s.lock_many("AB", "A B")
        s.reply(b"GRANTED-MANY 2 120 A B", b"STATUS 1 0 A")
        lock = s.results["AB"]
        s.take_sent()
        s.session.renew(lock, *s.callbacks("renew"))
        s.take_sent()
        s.reply(b"TIMEOUT-MANY 2 A B")
        self.assertEqual(s.sent, b"release A\nrelease B\n")
        error = s.results["renew"]
        self.assertIsInstance(error, LockLost)
        self.assertEqual((error.key, error.keys), ("A", ["A", "B"]))
        self.assertIn("lost the locks on 'A', 'B'", str(error))
        self.assertTrue(lock.lost)
        self.assertEqual(s.session.held, {})
        self.assertEqual(s.session.take_lost(), [lock])
        s.reply(b"STATUS 0 0 A", b"RELEASED 0 0 A", b"NOT_RELEASED 0 0 B")

    def test_connection_lost(self) -> None:
        """A lock-many lock is lost once (one handle, however many keys), and so is every waiting one."""
        s = ScriptedSession()
        s.lock_many("AB", "A B")
        s.lock_many("CD", "C D")
        s.reply(b"GRANTED-MANY 2 120 A B", b"STATUS 1 0 A", b"STATUS 1 1 C")
        lock = s.results["AB"]
        s.session.fail("gone")
        self.assertEqual(s.session.take_lost(), [lock])
        self.assertIn("gone", lock.lost_reason.reason)
        self.assertEqual(lock.lost_reason.keys, ["A", "B"])
        self.assertIn("gone", str(s.results["CD"]))

    def test_give_up(self) -> None:
        """A lock_many the caller gave up on (named by its first key) is released when granted."""
        s = ScriptedSession()
        s.lock_many("AB", "A B")
        s.reply(b"STATUS 1 1 A")
        s.session.give_up("A")
        s.take_sent()
        s.reply(b"GRANTED-MANY 2 120 A B 3 4")
        self.assertEqual(s.sent, b"release A\nrelease B\n")
        self.assertEqual((s.results, s.session.held), ({}, {}))


# -- the blocking client ----------------------------------------------------------


class BlockingTests(ClientTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)
        self.first = self.client()
        self.second = self.client()

    def client(self, address: Optional[str] = None, **options: Any) -> Client:  # type: ignore[override]
        return super().client(address or self.server.address, **options)

    def statuses(self, *keys: str) -> list[tuple[int, int]]:
        return [tuple(self.second.status(key))[1:] for key in keys]

    def test_renewal_and_context_manager(self) -> None:
        """Renewed automatically, a lock_many lock with a 1 s failsafe is held after 2.5 s; the block releases it."""
        with self.first.lock_many(["a", "b"], expires=1, auto_renew=True) as lock:
            forgotten = self.first.lock_many(["c", "d"], expires=1)
            time.sleep(2.5)
            self.assertEqual(self.statuses("a", "b", "c", "d"), [(1, 0), (1, 0), (0, 0), (0, 0)])
            tokens = dict(lock.tokens)
            lock.renew()
            self.assertEqual(lock.tokens, tokens)
            self.assertFalse(forgotten.release())
            self.assertTrue(forgotten.lost)
        self.assertTrue(lock.released)
        self.assertEqual(self.statuses("a", "b"), [(0, 0), (0, 0)])

    def test_key_busy(self) -> None:
        self.first.lock("a")
        self.assertRaises(KeyBusy, self.first.lock_many, ["b", "a"])
        group = self.first.lock_many(["b", "c"])
        self.assertRaises(KeyBusy, self.first.lock, "c", wait=0)
        self.assertRaises(TypeError, lambda: group.token)
        self.assertEqual(self.statuses("b", "c"), [(1, 0), (1, 0)])


# -- the asyncio client ---------------------------------------------------------


def run(test: Callable[[], Any]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(test(), 30)

    return asyncio.run(bounded())


class AsyncTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self)

    async def eventually(self, client: AsyncClient, status: KeyStatus) -> None:
        deadline = time.monotonic() + WITHIN
        while await client.status(status.key) != status:
            assert time.monotonic() < deadline, f"{status.key} never reached {status}"
            await asyncio.sleep(0.01)

    def test_granted_waiting_and_timeout(self) -> None:
        async def test() -> None:
            async with AsyncClient(self.server.address) as first, AsyncClient(self.server.address) as second:
                async with first.lock_many(["a", "b"]) as lock:
                    self.assertEqual(lock.keys, ("a", "b"))
                    self.assertTrue(all(isinstance(token, int) for token in lock.tokens.values()))
                    self.assertEqual(await second.status("b"), KeyStatus("b", 1, 0))
                    with self.assertRaises(LockManyTimeout) as caught:
                        await second.lock_many(["b", "c"], wait=0)
                    self.assertEqual(caught.exception.keys, ["b", "c"])
                    waiting = asyncio.ensure_future(second.lock_many(["c", "b"]))
                    await self.eventually(first, KeyStatus("b", 1, 1))
                    self.assertFalse(waiting.done())
                self.assertTrue(lock.released)
                other = await waiting
                self.assertEqual(other.keys, ("c", "b"))
                self.assertGreater(other.tokens["b"], lock.tokens["b"])
                with self.assertRaises(LockTimeout):
                    await first.lock_many(["b"], wait=1)
                self.assertEqual(await first.status("b"), KeyStatus("b", 1, 0))
                self.assertTrue(await other.release())
                self.assertEqual(await first.status("b"), KeyStatus("b", 0, 0))

        run(test)

    def test_cancelled_wait(self) -> None:
        """A cancelled lock_many stays on the server; its keys are busy until the grant, which is released."""

        async def test() -> None:
            async with AsyncClient(self.server.address) as client, AsyncClient(self.server.address) as other:
                holder = await other.lock("b")
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.lock_many(["a", "b"]), 0.2)
                with self.assertRaises(KeyBusy):
                    await client.lock("a", wait=0)
                await holder.release()
                await self.eventually(other, KeyStatus("a", 0, 0))
                await self.eventually(other, KeyStatus("b", 0, 0))
                await (await client.lock_many(["a", "b"], wait=0)).release()

        run(test)
