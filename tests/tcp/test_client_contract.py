"""
The client contract, written once and run for every JESync client: the
blocking L{Client}, the L{AsyncClient} and the L{TwistedClient} promise the
same things (a lock held and released, a wait that times out with
L{LockTimeout}, status, holders, listing and ping, renewal by hand and
automatic, C{lock_many} with its fencing tokens, a server's refusal told to
the user, a dead server's locks lost and its waiters failed with
L{ConnectionLost}), so one set of tests says them, and each client runs it
through a driver that makes it look synchronous:

  - blocking: the client itself (a background call runs in a thread);
  - asyncio: a loop of the driver's own, run until each call is done
    (C{loop.run_until_complete}); a background call is a task;
  - Twisted: a reactor of the driver's own in a thread, each call made in it
    and waited for (C{blockingCallFromThread}).  Not the server's reactor:
    L{ServerThread.kill} stops that one, and the client must outlive it.

The server is the real one in a thread of this process
(L{tests.servers.serve_in_thread}), over real TCP; a server that misbehaves
on purpose is L{tests.servers.FakeServer}.  Everything here is a plain
C{SynchronousTestCase}, so C{python -m twisted.trial tests} runs it too.
What a single client does differently (its C{with} statements, an
interrupted or cancelled wait, its thread or task sharing) stays in that
client's own tests.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import socket
import threading
import time
from typing import Any, Callable, Optional

from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    AsyncClient,
    Client,
    ConnectFailed,
    ConnectionLost,
    KeyBusy,
    KeyStatus,
    LockLost,
    LockManyTimeout,
    LockTimeout,
    ServerError,
    TwistedClient,
)
from tests.servers import ReactorThread, fake_server, free_port, serve_in_thread
from tests.support import strictly_increasing

WITHIN = 5.0  # seconds anything that should happen "at once" may take
CALL_WITHIN = 30.0  # seconds any one call may take (the longest wait asked for here is 10 s)


def older_server(line: bytes) -> Optional[bytes]:
    """
    A server without the extensions (as JESync 0.8.1): every lock granted at
    once, without a token; C{fencing} and C{lock-many} unknown.
    """
    word, *args = line.split()
    if word == b"lock":
        return b"GRANTED 1 0 %s 120\n" % args[0]
    if word == b"status":
        return b"STATUS 0 0 %s\n" % args[0]
    if word == b"release":
        return b"RELEASED 0 0 %s\n" % args[0]
    return b"INVALID_COMMAND\n"


def refusing_locks(line: bytes) -> bytes:
    """A server that refuses every lock with a message of its own, and answers status."""
    if line.startswith(b"lock"):
        return b"INVALID_PARAMETER: no thanks\n"
    if line.startswith(b"status"):
        return b"STATUS 0 0 %s\n" % line.split()[1]
    return b"INVALID_COMMAND\n"  # fencing: an older server


# -- the drivers -----------------------------------------------------------------------


class Synced:
    """
    A client or a lock as the contract sees it: each method called through
    the driver (in the client's own world) and its result waited for; a lock
    it returns is L{Synced} too; attributes are read as they are.  C{raw} is
    the client or lock itself (for L{Driver.start}, which waits for nothing).
    """

    def __init__(self, target: Any, driver: "Driver") -> None:
        self.raw = target
        self._driver = driver

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.raw, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._driver.synced(self._driver.call(lambda: value(*args, **kwargs)))

        return call


class Pending:
    """A call running in the background: C{done()}, then C{result()} (or its exception raised)."""

    def __init__(self, done: Callable[[], bool], outcome: Callable[[float], Any]) -> None:
        self.done = done
        self._outcome = outcome

    def result(self, within: float = WITHIN) -> Any:
        return self._outcome(within)


class Watching:
    """
    A watch as the contract sees it, whatever the client's form (an
    iterator, an async iterator, a callback): C{next()} is the next event
    (None if none came within C{within} seconds), raising what the watch
    raises (its ConnectionLost); C{stop()} ends it.
    """

    def __init__(self, next_event: Callable[[float], Any], stop: Callable[[], Any]) -> None:
        self._next_event = next_event
        self.stop = stop

    def next(self, within: float = WITHIN) -> Any:
        return self._next_event(within)

    def events(self, count: int) -> list[Any]:
        """The next C{count} events (each within WITHIN seconds)."""
        found = []
        for _ in range(count):
            event = self.next()
            if event is None:
                raise AssertionError(f"{count} events expected, got {found}")
            found.append(event)
        return found


class Driver:
    """How a contract test uses one kind of client, synchronously."""

    def watch(self, client: Synced, key: Optional[str] = None, prefix: Optional[str] = None) -> Watching:
        """C{client.watch(...)}, as a L{Watching}; stopped when the test ends."""
        raise NotImplementedError

    def __init__(self, test: SynchronousTestCase) -> None:
        self.test = test

    def make(self, servers: Any, **options: Any) -> Any:
        """A new client (not synced)."""
        raise NotImplementedError

    def call(self, function: Callable[[], Any]) -> Any:
        """C{function()} in the client's world; its result, once it is one (not a coroutine or Deferred)."""
        raise NotImplementedError

    def start(self, function: Callable[[], Any]) -> Pending:
        """C{function()} in the client's world, left to run while the test goes on."""
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        """Let C{seconds} pass, the client's timers and callbacks running meanwhile."""
        time.sleep(seconds)

    def close(self, client: Any) -> None:
        self.call(client.close)

    def synced(self, result: Any) -> Any:
        if hasattr(result, "release") and hasattr(result, "held"):  # a lock
            return Synced(result, self)
        return result

    def client(self, servers: Any, **options: Any) -> Synced:
        client = self.call(lambda: self.make(servers, **options))
        self.test.addCleanup(self.close, client)
        return Synced(client, self)


class BlockingDriver(Driver):
    def make(self, servers: Any, **options: Any) -> Any:
        return Client(servers, **options)

    def watch(self, client: Synced, key: Optional[str] = None, prefix: Optional[str] = None) -> Watching:
        watch = client.raw.watch(key, prefix=prefix)
        self.test.addCleanup(watch.close)
        return Watching(watch.get, watch.close)

    def call(self, function: Callable[[], Any]) -> Any:
        return function()

    def start(self, function: Callable[[], Any]) -> Pending:
        outcome: dict[str, Any] = {}
        finished = threading.Event()

        def run() -> None:
            try:
                outcome["result"] = self.synced(function())
            except BaseException as error:
                outcome["error"] = error
            finished.set()

        threading.Thread(target=run, daemon=True).start()

        def result(within: float) -> Any:
            self.test.assertTrue(finished.wait(within), "the call did not finish")
            if "error" in outcome:
                raise outcome["error"]
            return outcome["result"]

        return Pending(finished.is_set, result)


class AsyncioDriver(Driver):
    def __init__(self, test: SynchronousTestCase) -> None:
        super().__init__(test)
        self.loop = asyncio.new_event_loop()
        test.addCleanup(self.loop.close)  # (added first: runs after every client's close)

    def make(self, servers: Any, **options: Any) -> Any:
        return AsyncClient(servers, **options)

    def call(self, function: Callable[[], Any]) -> Any:
        result = function()
        if inspect.isawaitable(result):

            async def bounded() -> Any:
                return await asyncio.wait_for(result, CALL_WITHIN)

            return self.loop.run_until_complete(bounded())
        return result

    def start(self, function: Callable[[], Any]) -> Pending:
        task = self.loop.create_task(self._awaited(function))

        def result(within: float) -> Any:
            self.loop.run_until_complete(asyncio.wait([task], timeout=within))
            self.test.assertTrue(task.done(), "the call did not finish")
            return self.synced(task.result())

        self.test.addCleanup(task.cancel)
        return Pending(task.done, result)

    async def _awaited(self, function: Callable[[], Any]) -> Any:
        return await function()

    def watch(self, client: Synced, key: Optional[str] = None, prefix: Optional[str] = None) -> Watching:
        watch = self.call(lambda: client.raw.watch(key, prefix=prefix))
        self.test.addCleanup(lambda: self.call(watch.close))
        return Watching(lambda within: self.call(lambda: watch.get(within)), lambda: self.call(watch.close))

    def sleep(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))


class TwistedDriver(Driver):
    """A reactor of its own, running in a thread; every call made in that thread."""

    def __init__(self, test: SynchronousTestCase) -> None:
        super().__init__(test)
        self._running = ReactorThread()
        self.reactor = self._running.reactor
        test.addCleanup(self._running.stop)  # (added first: runs after every client's close)

    def make(self, servers: Any, **options: Any) -> Any:
        return TwistedClient(self.reactor, servers, **options)

    def call(self, function: Callable[[], Any]) -> Any:
        def bounded() -> Any:
            result = function()
            if isinstance(result, defer.Deferred):
                return result.addTimeout(CALL_WITHIN, self.reactor)
            return result

        return self._running.call(bounded)

    def start(self, function: Callable[[], Any]) -> Pending:
        outcome: list[Any] = []
        finished = threading.Event()

        def store(result: Any) -> None:
            outcome.append(result)
            finished.set()

        self.reactor.callFromThread(lambda: defer.maybeDeferred(function).addBoth(store))

        def result(within: float) -> Any:
            self.test.assertTrue(finished.wait(within), "the call did not finish")
            if isinstance(outcome[0], Failure):
                outcome[0].raiseException()
            return self.synced(outcome[0])

        return Pending(finished.is_set, result)

    def watch(self, client: Synced, key: Optional[str] = None, prefix: Optional[str] = None) -> Watching:
        arrived: queue.Queue[Any] = queue.Queue()  # events, and the watch's lost error, from the reactor

        def start() -> defer.Deferred[Any]:
            def watching(watch: Any) -> Any:
                watch.add_lost_callback(arrived.put)
                return watch

            return client.raw.watch(key, arrived.put, prefix=prefix).addCallback(watching)

        watch = self.call(start)
        self.test.addCleanup(lambda: self.call(watch.stop))

        def next_event(within: float) -> Any:
            try:
                item = arrived.get(timeout=within)
            except queue.Empty:
                return None
            if isinstance(item, Exception):
                raise item
            return item

        return Watching(next_event, lambda: self.call(watch.stop))


# -- the contract ----------------------------------------------------------------------


class ClientContract:
    """
    What every client promises, against a real server (C{self.server}) and
    two clients of it (C{self.first}, C{self.second}).  A subclass names its
    driver (C{driver_class}) and is a C{SynchronousTestCase}.
    """

    driver_class: type[Driver]

    def setUp(self) -> None:
        self.driver = self.driver_class(self)
        self.server = serve_in_thread(self)
        self.first = self.client()
        self.second = self.client()

    def client(self, servers: Any = None, **options: Any) -> Synced:
        return self.driver.client(servers or self.server.address, **options)

    def wait_for(self, condition: Callable[[], bool], within: float = WITHIN) -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for a condition")
            self.driver.sleep(0.01)

    def status_is(self, key: str, granted: int, waiting: int) -> Callable[[], bool]:
        return lambda: self.second.status(key) == KeyStatus(key, granted, waiting)

    def statuses(self, *keys: str) -> list[tuple[int, int]]:
        return [(status.granted, status.waiting) for status in (self.second.status(key) for key in keys)]

    # -- locks

    def test_contention(self) -> None:
        """A held mutex makes another client wait until it is released; then that client gets it."""
        lock = self.first.lock("report")
        self.assertTrue(lock.held)
        self.assertRaises(LockTimeout, self.second.lock, "report", wait=0)
        waiting = self.driver.start(lambda: self.second.raw.lock("report"))
        self.wait_for(lambda: self.first.status("report") == KeyStatus("report", 1, 1))
        self.assertFalse(waiting.done())
        self.assertTrue(lock.release())
        other = waiting.result()
        self.assertTrue(other.held)
        self.assertEqual(self.first.status("report"), KeyStatus("report", 1, 0))
        self.assertFalse(lock.held)
        self.assertFalse(lock.release())  # a second release does nothing
        self.assertTrue(other.release())
        self.assertFalse(other.release())

    def test_wait_timeout(self) -> None:
        """A wait times out with LockTimeout naming the key; a fractional wait is rounded up to whole seconds."""
        self.first.lock("report")
        started = time.monotonic()
        with self.assertRaises(LockTimeout) as caught:
            self.second.lock("report", wait=0.3)
        self.assertEqual(caught.exception.key, "report")
        self.assertTrue(1.0 <= time.monotonic() - started < 1.0 + WITHIN)
        self.assertEqual(self.second.status("report"), KeyStatus("report", 1, 0))

    def test_semaphore(self) -> None:
        third = self.client()
        self.first.lock("slots", max_concurrent=2)
        self.second.lock("slots", max_concurrent=2)
        self.assertRaises(LockTimeout, third.lock, "slots", max_concurrent=2, wait=0)
        self.assertEqual(third.status("slots"), KeyStatus("slots", 2, 0))

    def test_one_request_per_key(self) -> None:
        """A client holds a key once; asking again is refused locally."""
        lock = self.first.lock("report")
        self.assertRaises(KeyBusy, self.first.lock, "report", wait=0)
        self.assertTrue(lock.release())
        self.assertTrue(self.first.lock("report").release())

    def test_bad_arguments_never_reach_the_server(self) -> None:
        self.assertRaises(ValueError, self.first.lock, "two words")
        self.assertRaises(ValueError, self.first.lock, "k", max_concurrent=0)
        self.assertRaises(ValueError, self.first.lock, "k", wait=-1)
        self.assertRaises(ValueError, self.first.status, "")
        self.assertEqual(self.second.listing(), [])

    # -- renewal and expiry

    def test_renewal_keeps_the_lock_past_expires(self) -> None:
        """
        Renewed automatically, a lock with a 1 s failsafe is still held after
        2.5 s; the same lock without renewal expired, and its release says so.
        """
        renewed = self.first.lock("renewed", expires=1, auto_renew=True)
        forgotten = self.first.lock("forgotten", expires=1)
        self.assertEqual(renewed.renew_interval, 1 / 3)
        self.driver.sleep(2.5)
        self.assertEqual(self.second.status("renewed"), KeyStatus("renewed", 1, 0))
        self.assertRaises(LockTimeout, self.second.lock, "renewed", wait=0)
        self.assertEqual(self.second.status("forgotten"), KeyStatus("forgotten", 0, 0))
        self.assertTrue(renewed.held and 0 < renewed.seconds_left <= 1)
        self.assertFalse(forgotten.release())
        self.assertTrue(forgotten.lost)
        self.assertIn("expired", forgotten.lost_reason.reason)
        self.assertTrue(renewed.release())
        self.driver.sleep(2 * renewed.renew_interval)  # a renewal sent now would take it again
        self.assertEqual(self.second.status("renewed"), KeyStatus("renewed", 0, 0))

    def test_renew_by_hand(self) -> None:
        lock = self.first.lock("report", expires=60)
        lock.renew()
        self.assertTrue(59 < lock.seconds_left <= 60)
        self.assertTrue(lock.release())
        self.assertRaises(LockLost, lock.renew)

    def test_expires_never(self) -> None:
        lock = self.first.lock("report", expires=None)
        self.assertIsNone(lock.seconds_left)
        self.assertIsNone(lock.renew_interval)

    def test_lost_by_itself(self) -> None:
        """Not renewed: lost at its deadline (counted from the request), callback called; an auto-renewed lock stays held."""
        lost: list[LockLost] = []
        start = time.monotonic()
        forgotten = self.first.lock("forgotten", expires=2)
        renewed = self.first.lock("renewed", expires=2, auto_renew=True)
        forgotten.add_lost_callback(lost.append)
        self.wait_for(lambda: bool(lost))
        self.assertGreaterEqual(time.monotonic() - start, 1.9)
        self.assertTrue(forgotten.lost)
        self.assertIn("expired", forgotten.lost_reason.reason)
        self.assertFalse(forgotten.owned())
        self.assertTrue(renewed.held)
        self.assertTrue(renewed.owned())
        self.driver.sleep(0.5)  # past the server's own expiry too
        self.assertTrue(renewed.owned())
        self.assertTrue(renewed.release())

    # -- what the server knows

    def test_owned(self) -> None:
        lock = self.first.lock("k", expires=60)
        self.assertTrue(lock.owned())
        self.assertTrue(lock.release())
        self.assertFalse(lock.owned())
        other = self.second.lock("k", expires=60)
        self.assertTrue(other.owned())
        self.assertFalse(lock.owned())

    def test_holders(self) -> None:
        self.assertEqual(self.first.holders("sem"), [])
        a = self.first.lock("sem", 2, expires=60)
        b = self.second.lock("sem", 2, expires=0)
        holders = self.first.holders("sem")
        self.assertEqual([h.token for h in holders], [a.token, b.token])
        self.assertEqual([h.key for h in holders], ["sem", "sem"])
        self.assertTrue(58 <= holders[0].seconds_left <= 60)
        self.assertEqual(holders[1].seconds_left, 0)
        self.assertTrue(all(h.held_seconds >= 0 and h.peer for h in holders))
        self.assertTrue(a.release())
        self.assertEqual([h.token for h in self.second.holders("sem")], [b.token])

    # -- shared locks, holder values, watches

    def test_shared_locks(self) -> None:
        """
        Shared holders hold together, each with its own token; an exclusive
        request waits for them, and holds back a shared one that comes after it.
        """
        a = self.first.lock("schema", shared=True, wait=0)
        b = self.second.lock("schema", shared=True, wait=0)
        self.assertEqual((a.mode, a.shared, b.shared), ("shared", True, True))
        self.assertNotEqual(a.token, b.token)
        holders = self.first.holders("schema")
        self.assertEqual(
            [(h.token, h.mode, h.value) for h in holders], [(a.token, "shared", None), (b.token, "shared", None)]
        )
        writer = self.client()
        reader = self.client()
        writing = self.driver.start(lambda: writer.raw.lock("schema", wait=10))
        self.wait_for(self.status_is("schema", 2, 1))
        reading = self.driver.start(lambda: reader.raw.lock("schema", shared=True, wait=10))
        self.wait_for(self.status_is("schema", 2, 2))
        self.assertTrue(a.release())
        self.assertTrue(b.release())
        written = writing.result()
        self.assertEqual(written.mode, "exclusive")
        self.assertFalse(reading.done())
        self.assertTrue(written.release())
        self.assertTrue(reading.result().shared)

    def test_shared_lock_renewed_in_its_mode(self) -> None:
        lock = self.first.lock("schema", shared=True, expires=60)
        lock.renew()
        self.assertTrue(lock.held)
        self.assertEqual([h.mode for h in self.second.holders("schema")], ["shared"])
        self.assertRaises(KeyBusy, self.first.lock, "schema", wait=0)
        self.assertRaises(ValueError, self.first.lock, "other", 2, shared=True)

    def test_lock_many_shared(self) -> None:
        a = self.first.lock_many(["x", "y"], shared=True, wait=0)
        b = self.second.lock_many(["y", "x"], shared=True, wait=0)
        self.assertTrue(a.shared and b.shared)
        self.assertEqual(self.statuses("x", "y"), [(2, 0), (2, 0)])
        self.assertRaises(LockTimeout, self.client().lock, "x", wait=0)
        a.renew()
        self.assertTrue(a.release() and b.release())

    def test_values(self) -> None:
        """A value is seen by anyone in holders(); a str is its UTF-8; one over the limit is never sent."""
        lock = self.first.lock("leader", value="10.0.0.5:8080 é")
        self.assertEqual(lock.value, "10.0.0.5:8080 é".encode())
        [holder] = self.second.holders("leader")
        self.assertEqual((holder.mode, holder.value, holder.token), ("exclusive", lock.value, lock.token))
        binary = self.second.lock("blob", value=bytes(range(256)))
        self.assertEqual(self.first.holders("blob")[0].value, bytes(range(256)))
        self.assertTrue(binary.release())
        with self.assertRaises(ValueError) as refused:
            self.second.lock("big", value=b"v" * 4097)
        self.assertIn("4096", str(refused.exception))
        self.assertEqual(len(self.second.lock("big", value=b"v" * 4096).value), 4096)
        self.assertRaises(ValueError, self.second.lock, "bigger", value=b"\x00" * 4096)  # 12 KiB encoded: no line
        self.assertEqual(self.first.holders("plain"), [])
        plain = self.first.lock("plain")
        self.assertEqual(self.second.holders("plain")[0].value, None)
        self.assertTrue(plain.release())

    def test_watch_events_in_order(self) -> None:
        """granted (holder, token, mode, value), released, expired, lost: in the order of the changes."""
        watch = self.driver.watch(self.first, "k")
        lock = self.second.lock("k", value="me")
        granted = watch.next()
        self.assertEqual(
            (granted.kind, granted.key, granted.token, granted.mode, granted.value),
            ("granted", "k", lock.token, "exclusive", b"me"),
        )
        self.assertEqual(granted.holder, self.first.holders("k")[0].peer)
        self.assertTrue(lock.release())
        released = watch.next()
        self.assertEqual((released.kind, released.token, released.holder), ("released", lock.token, granted.holder))
        # A holder that never renews nor releases (a client's handle would release at its deadline, first).
        host, port = self.server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=WITHIN) as silent:
            silent.sendall(b"lock k 1 -1 1\n")
            self.assertEqual([e.kind for e in watch.events(2)], ["granted", "expired"])
        gone = self.client()
        shared = gone.lock("k", shared=True)
        self.driver.close(gone.raw)
        granted, lost = watch.events(2)
        self.assertEqual(
            (granted.kind, granted.mode, lost.kind, lost.token), ("granted", "shared", "lost", shared.token)
        )
        watch.stop()

    def test_watch_prefix(self) -> None:
        """A prefix watch reports keys appearing before their first grant and disappearing after the last holder."""
        watch = self.driver.watch(self.first, prefix="jobs/")
        every = self.driver.watch(self.first, prefix="")
        lock = self.second.lock("jobs/1")
        other = self.second.lock("other")
        self.assertTrue(lock.release())
        events = watch.events(4)
        self.assertEqual(
            [(e.kind, e.key) for e in events],
            [("appeared", "jobs/1"), ("granted", "jobs/1"), ("released", "jobs/1"), ("disappeared", "jobs/1")],
        )
        self.assertEqual(
            [e.key for e in every.events(6)], ["jobs/1", "jobs/1", "other", "other", "jobs/1", "jobs/1"]
        )
        self.assertTrue(other.release())

    def test_watch_twice_and_stop(self) -> None:
        """Two watches of a key on one connection both see it; stopping one leaves the other watching."""
        one = self.driver.watch(self.first, "k")
        two = self.driver.watch(self.first, "k")
        self.second.lock("k").release()
        self.assertEqual([e.kind for e in one.events(2)], ["granted", "released"])
        self.assertEqual([e.kind for e in two.events(2)], ["granted", "released"])
        one.stop()
        self.second.lock("k").release()
        self.assertEqual([e.kind for e in two.events(2)], ["granted", "released"])
        self.assertIsNone(one.next(0))

    def test_watch_ends_with_the_connection(self) -> None:
        """The server goes away: the watch raises (or calls back with) ConnectionLost, never silence."""
        watch = self.driver.watch(self.first, "k")
        self.server.kill()
        with self.assertRaises(ConnectionLost):
            watch.next()
        self.server.start()
        again = self.driver.watch(self.first, "k")
        self.second.lock("k")
        self.assertEqual(again.next().kind, "granted")

    def test_listing_and_ping(self) -> None:
        self.first.lock("b", max_concurrent=2)
        self.second.lock("b", max_concurrent=2)
        self.first.lock("a")
        waiting = self.driver.start(lambda: self.second.raw.lock("a"))
        self.wait_for(lambda: self.first.status("a").waiting == 1)
        self.assertEqual(self.first.listing(), [KeyStatus("a", 1, 1), KeyStatus("b", 2, 0)])
        self.assertEqual([row.key for row in self.first.listing("grants")], ["b", "a"])
        self.assertEqual([row.key for row in self.first.listing("requests")], ["a", "b"])
        self.assertRaises(ValueError, self.first.listing, "size")
        [(address, seconds)] = self.first.ping().items()
        self.assertEqual(address, self.server.address)
        self.assertTrue(0 < seconds < WITHIN)
        self.assertFalse(waiting.done())

    def test_concurrent_first_requests(self) -> None:
        """Requests racing to use a new client share the one connection it opens."""
        client = self.client()
        pending = [self.driver.start(lambda n=n: client.raw.lock(f"k{n}")) for n in range(10)]
        locks = [request.result() for request in pending]
        self.assertEqual(len({lock.raw._connection for lock in locks}), 1)
        self.assertEqual(len(client.listing()), 10)

    # -- lock_many and fencing tokens

    def test_lock_many_granted(self) -> None:
        """Every key is granted (a key given twice counts once), each with its token; release gives them all back."""
        lock = self.first.lock_many(["a", "b", "a", "c"])
        self.assertEqual(lock.keys, ("a", "b", "c"))
        self.assertEqual(list(lock.tokens), ["a", "b", "c"])
        self.assertTrue(all(isinstance(token, int) and token >= 0 for token in lock.tokens.values()))
        self.assertEqual(self.statuses("a", "b", "c"), [(1, 0)] * 3)
        self.assertTrue(lock.held and 119 < lock.seconds_left <= 120)
        self.assertRaises(LockTimeout, self.second.lock, "b", wait=0)
        self.assertTrue(lock.release())
        self.assertTrue(lock.released)
        self.assertEqual(self.statuses("a", "b", "c"), [(0, 0)] * 3)
        self.assertFalse(lock.release())

    def test_lock_many_waits_until_released(self) -> None:
        """A lock_many that must wait is answered when the last key it needs is released; nothing is held meanwhile."""
        holder = self.first.lock("b")
        waiting = self.driver.start(lambda: self.second.raw.lock_many(["a", "b"]))
        self.wait_for(lambda: self.first.status("b") == KeyStatus("b", 1, 1))
        self.assertEqual(self.first.status("a").granted, 0)
        self.assertFalse(waiting.done())
        self.assertEqual(self.second.status("c"), KeyStatus("c", 0, 0))  # its connection still answers
        self.assertTrue(holder.release())
        lock = waiting.result()
        self.assertEqual((lock.keys, lock.held), (("a", "b"), True))
        self.assertGreater(lock.tokens["b"], holder.token)
        self.assertEqual([self.first.status(key) for key in "ab"], [KeyStatus("a", 1, 0), KeyStatus("b", 1, 0)])

    def test_lock_many_timeout(self) -> None:
        """The wait runs out: LockManyTimeout (a LockTimeout) naming every key, and none of them is granted."""
        self.first.lock("b")
        started = time.monotonic()
        with self.assertRaises(LockTimeout) as caught:
            self.second.lock_many(["a", "b"], wait=0.5)
        self.assertTrue(1.0 <= time.monotonic() - started < 1.0 + WITHIN)
        self.assertIsInstance(caught.exception, LockManyTimeout)
        self.assertEqual(caught.exception.keys, ["a", "b"])
        self.assertEqual(self.statuses("a", "b"), [(0, 0), (1, 0)])
        with self.assertRaises(LockManyTimeout):
            self.second.lock_many(["b", "a"], wait=0)
        self.assertTrue(self.second.lock_many(["a", "c"], wait=0).release())  # the connection is fine
        self.assertRaises(KeyBusy, self.first.lock_many, ["b", "c"])

    def test_tokens_strictly_increase(self) -> None:
        """Each grant of a key, to whichever client and whichever way, has a larger token than the one before."""
        tokens = []
        for client in [self.first, self.second, self.first]:
            lock = client.lock("k")
            tokens.append(lock.token)
            self.assertTrue(lock.release())
            group = client.lock_many(["j", "k"])
            tokens.append(group.tokens["k"])
            self.assertTrue(group.release())
        self.assertTrue(strictly_increasing(tokens), tokens)

    def test_lock_many_bad_arguments(self) -> None:
        for keys in [[], ["two words"], "ab", ["a", 1]]:
            self.assertRaises((ValueError, TypeError), self.first.lock_many, keys)
        self.assertRaises(ValueError, self.first.lock_many, ["a"], wait=-1)

    def test_older_server(self) -> None:
        """Without fencing, locks work as before with no token; lock_many is refused, the connection stays usable."""
        client = self.client(fake_server(self, older_server).address)
        lock = client.lock("k")
        self.assertIsNone(lock.token)
        self.assertEqual(lock.tokens, {"k": None})
        with self.assertRaises(ServerError) as caught:
            client.lock_many(["a", "b"])
        self.assertEqual(caught.exception.message, "INVALID_COMMAND")
        self.assertTrue(lock.release())
        self.assertEqual(client.status("k"), KeyStatus("k", 0, 0))

    # -- a server that fails or misbehaves

    def test_server_killed_while_holding(self) -> None:
        """
        The server dies: held locks are lost (callbacks called, renewal
        stopped, release() False), waiting requests fail with ConnectionLost,
        the server is unreachable; once it is back, the client reconnects but
        the old locks stay lost.
        """
        self.second.lock("busy")
        held = self.first.lock("report", expires=1, auto_renew=True)
        lost: list[LockLost] = []
        held.add_lost_callback(lost.append)
        waiting = self.driver.start(lambda: self.first.raw.lock("busy"))
        self.wait_for(self.status_is("busy", 1, 1))
        self.server.kill()
        self.wait_for(lambda: bool(lost))
        self.assertTrue(held.lost)
        self.assertEqual(len(lost), 1)
        self.assertIn("connection", lost[0].reason)
        self.assertRaises(ConnectionLost, waiting.result)
        self.assertFalse(held.release())
        self.assertRaises(LockLost, held.renew)
        self.assertRaises(ConnectFailed, self.first.status, "report")
        self.server.start()
        self.assertEqual(self.first.status("report"), KeyStatus("report", 0, 0))
        self.assertTrue(held.lost)
        again = self.first.lock("report", wait=0)
        self.assertTrue(again.held)
        self.assertFalse(held.release())
        self.assertEqual(self.first.status("report"), KeyStatus("report", 1, 0))
        held.add_lost_callback(lost.append)  # already lost: called at once
        self.assertEqual(len(lost), 2)

    def test_lock_many_lost_with_the_server(self) -> None:
        lock = self.first.lock_many(["a", "b"])
        lost: list[LockLost] = []
        lock.add_lost_callback(lost.append)
        self.server.kill()
        self.wait_for(lambda: bool(lost))
        self.assertEqual(len(lost), 1)
        self.assertEqual(lost[0].keys, ["a", "b"])
        self.assertFalse(lock.release())

    def test_waiting_is_not_silence(self) -> None:
        """A lock that waits owes no reply: the read timeout does not cut it short."""
        self.first.lock("report")
        client = self.client(read_timeout=0.3)
        self.assertRaises(LockTimeout, client.lock, "report", wait=1)

    def test_unreachable(self) -> None:
        client = self.client(f"127.0.0.1:{free_port()}", connect_timeout=2)
        with self.assertRaises(ConnectFailed) as caught:
            client.lock("report")
        self.assertIn("cannot connect", str(caught.exception))

    def test_silent_server(self) -> None:
        """A server that stops answering is given up for dead after read_timeout."""
        client = self.client(fake_server(self, lambda line: None).address, read_timeout=0.5)
        started = time.monotonic()
        with self.assertRaises(ConnectionLost) as caught:
            client.status("report")
        self.assertIn("no reply within 0.5 s", str(caught.exception))
        self.assertTrue(0.5 <= time.monotonic() - started < WITHIN)

    def test_server_error(self) -> None:
        """A refusal carries the server's message; the connection stays usable."""
        client = self.client(fake_server(self, refusing_locks).address)
        with self.assertRaises(ServerError) as caught:
            client.lock("report")
        self.assertEqual(caught.exception.message, "INVALID_PARAMETER: no thanks")
        self.assertEqual(client.status("report"), KeyStatus("report", 0, 0))

    def test_garbage_reply(self) -> None:
        client = self.client(fake_server(self, lambda line: b"HELLO\n").address)
        with self.assertRaises(ConnectionLost) as caught:
            client.status("report")
        self.assertIn("not a JESync reply", str(caught.exception))

    # -- several servers

    def test_several_servers_php_placement(self) -> None:
        """
        With the PHP placement, nightly-report (md5 c38..., 3128) lives on
        the first of two servers and user:42 (56d..., 1389) on the second;
        a lock_many must keep to one server.
        """
        other = serve_in_thread(self)
        client = self.client([self.server.address, other.address], placement="php")
        client.lock("nightly-report")
        user = client.lock("user:42")
        self.assertEqual(str(client.server_for("nightly-report")), self.server.address)
        self.assertEqual(self.client(self.server.address).listing(), [KeyStatus("nightly-report", 1, 0)])
        self.assertEqual(self.client(other.address).listing(), [KeyStatus("user:42", 1, 0)])
        self.assertEqual([row.key for row in client.listing()], ["nightly-report", "user:42"])
        self.assertEqual(sorted(client.ping()), sorted([self.server.address, other.address]))
        with self.assertRaises(ValueError) as caught:
            client.lock_many(["nightly-report", "user:42"])
        self.assertIn("one server", str(caught.exception))
        self.assertTrue(user.release())
        self.assertTrue(client.lock_many(["user:42"]).release())


class BlockingClientContractTests(ClientContract, SynchronousTestCase):
    driver_class = BlockingDriver


class AsyncClientContractTests(ClientContract, SynchronousTestCase):
    driver_class = AsyncioDriver


class TwistedClientContractTests(ClientContract, SynchronousTestCase):
    driver_class = TwistedDriver
