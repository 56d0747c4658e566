"""
A session grant's expiry, mode, C{max_concurrent} and value survive a
failover: two cluster members in this process (L{ClusterMember}, as
C{twistd jesync --etcd} runs one) on a real etcd; the leader's session
(elock's, which is the HTTP API's) holds a shared key with a value and an
expiry, renewed once, and a counting key; the leader steps down (resigns);
the other member takes over and has both grants with their tokens, modes,
values and C{max_concurrent}, and the shared one still expires at the wall
time it was due, through the new leader's expiry (its watcher told, its
record deleted from etcd).

(The grants are made through the lock service: the HTTP API is what gives a
session grant an expiry, a mode or a value on the wire; elock's C{lock}
cannot.  tests/etcd/test_cluster.py takes elock's plain grants through a
kill -9 of a C{twistd} member.)
"""

from __future__ import annotations

import time
from typing import Any, List

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.trial.unittest import TestCase

from jesync.cluster.journal import HeldRecord
from jesync.interfaces import EXPIRED, IOwnerChanges, LockEvent
from jesync.server import ServerSettings
from jesync.wire import EXCLUSIVE, SHARED
from tests.cluster import TAKEOVER_WITHIN
from tests.cluster_members import InProcessMembers

#: The shared grant's failsafe, in seconds: longer than a takeover takes.
EXPIRES = TAKEOVER_WITHIN + 2.0


class SessionGrantFailoverTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.members = InProcessMembers(self, ServerSettings(ports=[]))

    @inlineCallbacks
    def test_a_session_grant_keeps_its_expiry_mode_value_and_token_across_a_failover(self):
        first = self.members.member("first")
        yield first.when_leading().addTimeout(TAKEOVER_WITHIN * 3, reactor)
        second = self.members.member("second")
        old = first.server
        session = old.factories["elock"].sessions.start(object())
        session.set_grace(20_000)
        locks = old.locks
        shared = locks.request("config", session, 1, 0, 1.0, SHARED, b"10.0.0.7:80")
        pool = locks.request("pool", session, 3, 0, 0)
        yield first.term.journal.durable()
        # Renewed with a new expiry and value: told to the journal as a renewing grammar tells it.
        self.assertIs(locks.request("config", session, 1, 0, EXPIRES, SHARED, b"10.0.0.8:80"), shared)
        IOwnerChanges(locks.observer).held_changed(session, "config")
        waiting = first.term.journal.durable()
        self.assertIsNotNone(waiting)
        yield waiting
        due = shared.expires_at
        self.assertLess(abs(due - (time.time() + EXPIRES)), 1.0)
        _, kvs = yield first.etcd.get(first.layout.held_key(session.id, "config"))
        self.assertEqual(
            HeldRecord.decode(kvs[0].value), HeldRecord(shared.token, SHARED, 1, b"10.0.0.8:80", int(due * 1e6))
        )

        stepped_down = time.monotonic()
        yield self.members.stop(first)
        yield second.when_leading().addTimeout(TAKEOVER_WITHIN * 3, reactor)
        self.assertLess(time.monotonic() - stepped_down, TAKEOVER_WITHIN)
        self.assertLess(time.time(), due, "the takeover took longer than the grant's expiry")
        new = second.server
        [restored] = [kept for kept in new.factories["elock"].sessions.sessions() if kept.id == session.id]
        config = new.locks.grant_of("config", restored)
        self.assertEqual(
            (config.mode, config.max_concurrent, config.value, config.token),
            (SHARED, 1, b"10.0.0.8:80", shared.token),
        )
        self.assertLess(abs(config.expires_at - due), 0.05)
        kept_pool = new.locks.grant_of("pool", restored)
        self.assertEqual(
            (kept_pool.mode, kept_pool.max_concurrent, kept_pool.value, kept_pool.token, kept_pool.expires_at),
            (EXCLUSIVE, 3, None, pool.token, None),
        )

        # The expiry runs out on the new leader, at the time it was due.
        expired: Deferred[LockEvent] = Deferred()
        events: List[Any] = []

        def listener(event: LockEvent) -> None:
            events.append(event)
            if event.kind == EXPIRED and not expired.called:
                expired.callback(event)

        new.locks.watch("watcher", "config", listener)
        self.addCleanup(new.locks.unwatch, "watcher", "config")
        event = yield expired.addTimeout(due - time.time() + 5.0, reactor)
        self.assertGreaterEqual(time.time(), due - 0.05)
        self.assertEqual((event.key, event.grant.token), ("config", shared.token))
        self.assertEqual([seen.kind for seen in events], [EXPIRED])
        self.assertIsNone(new.locks.grant_of("config", restored))
        self.assertIsNotNone(new.locks.grant_of("pool", restored))
        yield second.term.journal.durable()
        _, kvs = yield second.etcd.get(second.layout.held_key(session.id, "config"))
        self.assertEqual(list(kvs), [])
        _, kvs = yield second.etcd.get(second.layout.held_key(session.id, "pool"))
        self.assertEqual(HeldRecord.decode(kvs[0].value), HeldRecord(pool.token, EXCLUSIVE, 3))
