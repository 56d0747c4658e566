"""
The Twisted client against the real server, in memory (L{jesync.testing}):
the real C{TwistedClient} and the server's real factories, paired over
iosim, on a clock the test moves.  Its requests and replies, its handles
(a failsafe that runs out, C{owned()}, C{holders()}) and C{lock_many} with
fencing tokens.  What the client does over real TCP, against the real
server, servers that are not jesync's (silent, refusing, answering
garbage, older) and a port nothing listens on, is in the client contract
(L{tests.tcp.test_client_contract}, C{TwistedClientContractTests}).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    ConnectionLost,
    KeyBusy,
    KeyStatus,
    LockLost,
    LockManyTimeout,
    LockTimeout,
    TwistedClient,
)
from jesync.testing import MemoryServer
from tests.support import strictly_increasing


class TwistedClientTestCase(SynchronousTestCase):
    """Two clients of a server in memory; L{result} flushes and takes a Deferred's result."""

    def setUp(self) -> None:
        self.server = MemoryServer()
        self.first = self.client()
        self.second = self.client()

    def client(self, address: str | None = None, **options: Any) -> TwistedClient:
        client = self.server.client(**({"servers": address} if address else {}), **options)
        self.addCleanup(lambda: (client.close(), self.server.flush()))
        return client

    def result(self, deferred: defer.Deferred[Any]) -> Any:
        """Flush, then the result C{deferred} fired with (it must have succeeded)."""
        self.server.flush()
        return self.successResultOf(deferred)

    def failure(self, deferred: defer.Deferred[Any], *errors: type[BaseException]) -> BaseException:
        """Flush, then the exception C{deferred} failed with (one of C{errors})."""
        self.server.flush()
        return self.failureResultOf(deferred, *errors).value


class TwistedClientTests(TwistedClientTestCase):
    def test_replies_out_of_order(self) -> None:
        """
        On one connection: lock A (granted at once), lock B (waits: another
        connection holds it), status C, then release A.  All are written
        before any reply is read; the replies come back out of order, and
        each Deferred gets its own.
        """
        holder = self.result(self.second.lock("B"))
        fired: list[tuple[str, Any]] = []

        def note(name: str, deferred: defer.Deferred[Any]) -> defer.Deferred[Any]:
            return deferred.addCallback(lambda result: fired.append((name, result)) or result)

        lock_a = note("lock A", self.first.lock("A"))
        lock_b = note("lock B", self.first.lock("B", wait=10))
        status_c = note("status C", self.first.status("C"))
        a = self.result(lock_a)
        self.result(note("release A", a.release()))
        self.assertEqual(self.result(status_c), KeyStatus("C", 0, 0))
        self.assertNotIn("lock B", [name for name, _ in fired])
        self.assertEqual(self.server.service.status("B"), KeyStatus("B", 1, 1))
        self.result(holder.release())
        b = self.result(lock_b)
        self.assertEqual(
            [name for name, _ in fired],
            ["lock A", "status C", "release A", "lock B"],
        )
        self.assertEqual((a.key, b.key), ("A", "B"))
        self.assertEqual(dict(fired)["release A"], True)
        self.assertTrue(b.held and not a.held)
        self.assertEqual(self.server.connections, 2)

    def test_contention_and_timeout(self) -> None:
        lock = self.result(self.first.lock("report"))
        self.failure(self.second.lock("report", wait=0), LockTimeout)
        started = self.server.reactor.seconds()
        timing_out = self.second.lock("report", wait=1)
        self.server.advance(0.99)
        self.assertNoResult(timing_out)
        self.server.advance(0.01)
        self.failure(timing_out, LockTimeout)
        self.assertGreaterEqual(self.server.reactor.seconds() - started, 1.0)
        waiting = self.second.lock("report")
        self.server.flush()
        self.assertEqual(self.server.service.status("report"), KeyStatus("report", 1, 1))
        self.assertTrue(self.result(lock.release()))
        other = self.result(waiting)
        self.assertTrue(other.held)
        self.assertFalse(self.result(lock.release()))
        self.failure(self.second.lock("report"), KeyBusy)

    def test_renewal_keeps_the_lock_past_expires(self) -> None:
        renewed = self.result(self.first.lock("renewed", expires=1, auto_renew=True))
        forgotten = self.result(self.first.lock("forgotten", expires=1))
        self.server.advance(2.5)
        self.assertEqual(self.server.service.status("renewed"), KeyStatus("renewed", 1, 0))
        self.assertEqual(self.server.service.status("forgotten"), KeyStatus("forgotten", 0, 0))
        self.assertTrue(renewed.held)
        self.assertFalse(self.result(forgotten.release()))
        self.assertTrue(forgotten.lost)
        self.assertTrue(self.result(renewed.release()))
        self.assertEqual(self.server.service.status("renewed"), KeyStatus("renewed", 0, 0))

    def test_connection_dropped(self) -> None:
        """
        The server drops the connection: held locks are lost (callbacks
        called), outstanding requests fail with ConnectionLost, and the next
        request reconnects without bringing the old locks back.
        """
        self.result(self.second.lock("busy"))
        held = self.result(self.first.lock("report", expires=1, auto_renew=True))
        lost: defer.Deferred[LockLost] = defer.Deferred()
        held.add_lost_callback(lost.callback)
        waiting = self.first.lock("busy")
        self.server.flush()
        self.assertEqual(self.server.service.status("busy"), KeyStatus("busy", 1, 1))
        self.server.drop_connections()
        error = self.result(lost)
        self.assertIn("was lost", error.reason)
        self.failure(waiting, ConnectionLost)
        self.assertTrue(held.lost)
        self.assertFalse(self.result(held.release()))
        self.failure(held.renew(), LockLost)
        self.assertEqual(self.result(self.first.status("report")), KeyStatus("report", 0, 0))
        again = self.result(self.first.lock("report", wait=0))
        self.assertTrue(again.held and held.lost)

    def test_cancelled_wait(self) -> None:
        holder = self.result(self.second.lock("report"))
        waiting = self.first.lock("report")
        self.server.flush()
        self.assertEqual(self.server.service.status("report"), KeyStatus("report", 1, 1))
        waiting.cancel()
        self.failure(waiting, defer.CancelledError)
        self.failure(self.first.lock("report", wait=0), KeyBusy)
        self.result(holder.release())
        self.assertEqual(self.server.service.status("report"), KeyStatus("report", 0, 0))
        self.result(self.result(self.first.lock("report", wait=0)).release())

    def test_listing_and_ping(self) -> None:
        self.result(self.first.lock("b", max_concurrent=2))
        self.result(self.second.lock("b", max_concurrent=2))
        self.result(self.first.lock("a"))
        self.assertEqual(self.result(self.first.listing()), [KeyStatus("a", 1, 0), KeyStatus("b", 2, 0)])
        self.assertEqual([row.key for row in self.result(self.first.listing("grants"))], ["b", "a"])
        [(address, seconds)] = self.result(self.first.ping()).items()
        self.assertEqual(address, self.server.address())
        self.assertGreaterEqual(seconds, 0)

    def test_bad_arguments(self) -> None:
        self.failure(self.first.lock("two words"), ValueError)
        self.failure(self.first.status(""), ValueError)


class TwistedHandleTests(TwistedClientTestCase):
    def test_lost_by_itself(self) -> None:
        lost: defer.Deferred[LockLost] = defer.Deferred()
        start = self.server.reactor.seconds()
        forgotten = self.result(self.first.lock("forgotten", expires=2))
        renewed = self.result(self.first.lock("renewed", expires=2, auto_renew=True))
        forgotten.add_lost_callback(lost.callback)
        self.server.advance(1.99)
        self.assertNoResult(lost)
        self.server.advance(0.01)
        self.result(lost)
        self.assertGreaterEqual(self.server.reactor.seconds() - start, 1.9)
        self.assertTrue(forgotten.lost)
        self.assertFalse(self.result(forgotten.owned()))
        self.server.advance(0.5)
        self.assertTrue(renewed.held and self.result(renewed.owned()))
        self.assertTrue(self.result(renewed.release()))

    def test_owned_and_holders(self) -> None:
        a = self.result(self.first.lock("sem", 2, expires=60))
        b = self.result(self.second.lock("sem", 2, expires=60))
        self.assertEqual([h.token for h in self.result(self.first.holders("sem"))], [a.token, b.token])
        self.assertTrue(self.result(a.owned()))
        self.assertTrue(self.result(a.release()))
        self.assertFalse(self.result(a.owned()))
        c = self.result(self.first.lock("sem", 2, expires=60))
        self.assertFalse(self.result(a.owned()))  # the same connection holds it again, through another handle
        self.assertTrue(self.result(c.owned()))


class TwistedTests(TwistedClientTestCase):
    """C{lock_many} and fencing tokens."""

    def test_granted_and_released(self) -> None:
        lock = self.result(self.first.lock_many(["a", "b", "a"]))
        self.assertEqual(lock.keys, ("a", "b"))
        self.assertTrue(all(isinstance(token, int) for token in lock.tokens.values()))
        self.assertEqual([self.server.service.status(key) for key in "ab"], [KeyStatus("a", 1, 0), KeyStatus("b", 1, 0)])
        self.assertTrue(self.result(lock.release()))
        self.assertEqual([self.server.service.status(key) for key in "ab"], [KeyStatus("a", 0, 0), KeyStatus("b", 0, 0)])

    def test_waits_until_released(self) -> None:
        holder = self.result(self.second.lock("b"))
        granted: list[Any] = []
        waiting = self.first.lock_many(["a", "b"]).addCallback(lambda lock: granted.append(lock) or lock)
        self.server.flush()
        self.assertEqual(self.server.service.status("b"), KeyStatus("b", 1, 1))
        self.assertEqual(self.result(self.first.status("c")), KeyStatus("c", 0, 0))
        self.assertEqual(granted, [])
        self.result(holder.release())
        lock = self.result(waiting)
        self.assertTrue(lock.held)
        self.assertGreater(lock.tokens["b"], holder.token)
        self.assertEqual(self.server.service.status("a"), KeyStatus("a", 1, 0))

    def test_timeout(self) -> None:
        self.result(self.second.lock("b"))
        started = self.server.reactor.seconds()
        timing_out = self.first.lock_many(["a", "b"], wait=1)
        self.server.advance(0.99)
        self.assertNoResult(timing_out)
        self.server.advance(0.01)
        error = self.failure(timing_out, LockManyTimeout)
        self.assertGreaterEqual(self.server.reactor.seconds() - started, 1.0)
        self.assertEqual(error.keys, ["a", "b"])
        self.assertEqual(self.server.service.status("a"), KeyStatus("a", 0, 0))
        self.failure(self.second.lock_many(["b", "c"]), KeyBusy)

    def test_tokens_strictly_increase(self) -> None:
        tokens = []
        for client in [self.first, self.second, self.first]:
            lock = self.result(client.lock("k"))
            tokens.append(lock.token)
            self.result(lock.release())
            group = self.result(client.lock_many(["j", "k"], expires=None, auto_renew=True))
            tokens.append(group.tokens["k"])
            self.result(group.release())
        self.assertTrue(strictly_increasing(tokens), tokens)
