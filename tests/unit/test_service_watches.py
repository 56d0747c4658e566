"""
Tests for L{jesync.service.LockService}'s watches: the events a key watch
and a prefix watch are told (granted, released, expired, lost; keys
appearing and disappearing), their order within one change, one event per
owner however many of its watches match, the caps, and a watch's end.
"""

from __future__ import annotations

from typing import Hashable, List, Tuple

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import LimitReached, LockTimeout
from jesync.service import (
    APPEARED,
    DISAPPEARED,
    EXPIRED,
    GRANTED,
    LOST,
    RELEASED,
    SHARED,
    LockEvent,
    LockService,
)

Seen = Tuple[str, str, object]


class WatchTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.events: dict = {}

    def listener(self, name: Hashable):
        seen: List[Seen] = self.events.setdefault(name, [])

        def told(event: LockEvent) -> None:
            # (the table is the one a listener may read, never change)
            seen.append((event.kind, event.key, None if event.grant is None else event.grant.owner))

        return told

    def watch(self, owner: Hashable, key: str, prefix: bool = False) -> bool:
        return self.service.watch(owner, key, self.listener(owner), prefix=prefix)

    def seen(self, owner: Hashable) -> List[Seen]:
        return self.events.get(owner, [])


class KeyWatchTests(WatchTestCase):
    def test_a_grant_and_its_release(self) -> None:
        self.assertTrue(self.watch("w", "k"))
        grant = self.successResultOf(self.service.acquire("k", "a"))
        self.assertEqual(self.seen("w"), [(GRANTED, "k", "a")])
        grant.release()
        self.assertEqual(self.seen("w"), [(GRANTED, "k", "a"), (RELEASED, "k", "a")])

    def test_the_event_carries_the_grant(self) -> None:
        told: List[LockEvent] = []
        self.service.watch("w", "k", told.append)
        grant = self.successResultOf(self.service.acquire("k", "a", mode=SHARED, value=b"10.0.0.5:80"))
        self.assertEqual(told, [LockEvent(GRANTED, "k", grant)])
        self.assertEqual((told[0].grant.mode, told[0].grant.value, told[0].grant.token), (SHARED, b"10.0.0.5:80", grant.token))

    def test_a_renewal_is_no_event(self) -> None:
        self.watch("w", "k")
        self.successResultOf(self.service.acquire("k", "a"))
        self.successResultOf(self.service.acquire("k", "a", expires=5))
        self.assertEqual(self.seen("w"), [(GRANTED, "k", "a")])

    def test_a_wait_is_no_event(self) -> None:
        self.successResultOf(self.service.acquire("k", "a"))
        self.watch("w", "k")
        waiting = self.service.acquire("k", "b", timeout=3)
        self.clock.advance(3)
        self.failureResultOf(waiting, LockTimeout)
        self.assertEqual(self.seen("w"), [])

    def test_a_hand_over_is_released_then_granted(self) -> None:
        grant = self.successResultOf(self.service.acquire("k", "a"))
        waiting = self.service.acquire("k", "b")
        self.watch("w", "k")
        grant.release()
        self.successResultOf(waiting)
        self.assertEqual(self.seen("w"), [(RELEASED, "k", "a"), (GRANTED, "k", "b")])

    def test_expiry(self) -> None:
        self.successResultOf(self.service.acquire("k", "a", expires=10))
        waiting = self.service.acquire("k", "b")
        self.watch("w", "k")
        self.clock.advance(10)
        self.successResultOf(waiting)
        self.assertEqual(self.seen("w"), [(EXPIRED, "k", "a"), (GRANTED, "k", "b")])

    def test_an_owner_gone_is_lost(self) -> None:
        self.successResultOf(self.service.acquire("k", "a"))
        self.successResultOf(self.service.acquire("j", "a"))
        waiting = self.service.acquire("k", "b")
        self.watch("w", "k")
        self.watch("w", "j")
        self.service.release_all("a")
        self.successResultOf(waiting)
        self.assertEqual(self.seen("w"), [(LOST, "k", "a"), (LOST, "j", "a"), (GRANTED, "k", "b")])

    def test_shared_holders_each_granted_together(self) -> None:
        writer = self.successResultOf(self.service.acquire("k", "writer"))
        readers = [self.service.acquire("k", name, mode=SHARED) for name in ("r1", "r2", "r3")]
        self.watch("w", "k")
        writer.release()
        for reader in readers:
            self.successResultOf(reader)
        self.assertEqual(
            self.seen("w"), [(RELEASED, "k", "writer"), (GRANTED, "k", "r1"), (GRANTED, "k", "r2"), (GRANTED, "k", "r3")]
        )

    def test_several_keys_at_once(self) -> None:
        self.watch("w", "a")
        self.watch("w", "b")
        grants = self.successResultOf(self.service.acquire_many(["a", "b", "c"], "o"))
        self.assertEqual(self.seen("w"), [(GRANTED, "a", "o"), (GRANTED, "b", "o")])
        grants[1].release()
        self.assertEqual(self.seen("w")[-1], (RELEASED, "b", "o"))

    def test_every_watcher_is_told(self) -> None:
        for name in ("w1", "w2", "w3"):
            self.watch(name, "k")
        self.successResultOf(self.service.acquire("k", "a"))
        for name in ("w1", "w2", "w3"):
            self.assertEqual(self.seen(name), [(GRANTED, "k", "a")])

    def test_only_the_key_watched(self) -> None:
        self.watch("w", "k")
        self.successResultOf(self.service.acquire("k2", "a"))
        self.successResultOf(self.service.acquire("j", "a"))
        self.assertEqual(self.seen("w"), [])

    def test_a_key_watch_is_not_told_of_keys_appearing(self) -> None:
        self.watch("w", "k")
        self.service.acquire("k", "a").addCallback(lambda grant: grant.release())
        self.assertEqual(self.seen("w"), [(GRANTED, "k", "a"), (RELEASED, "k", "a")])

    def test_an_event_is_told_before_the_request_is_answered(self) -> None:
        """A listener that writes at once writes the event before the reply to the request that caused it."""
        order: List[str] = []
        self.service.watch("w", "k", lambda event: order.append(event.kind))
        grant = self.successResultOf(self.service.acquire("k", "a"))
        waiting = self.service.acquire("k", "b")
        waiting.addCallback(lambda _: order.append("answered"))
        grant.release()
        self.assertEqual(order, [GRANTED, RELEASED, GRANTED, "answered"])


class PrefixWatchTests(WatchTestCase):
    def test_keys_appearing_and_disappearing(self) -> None:
        self.watch("w", "group/", prefix=True)
        grant = self.successResultOf(self.service.acquire("group/one", "a"))
        self.successResultOf(self.service.acquire("other", "a"))
        grant.release()
        self.assertEqual(
            self.seen("w"),
            [
                (APPEARED, "group/one", None),
                (GRANTED, "group/one", "a"),
                (RELEASED, "group/one", "a"),
                (DISAPPEARED, "group/one", None),
            ],
        )

    def test_a_hand_over_keeps_the_key(self) -> None:
        grant = self.successResultOf(self.service.acquire("p/k", "a"))
        waiting = self.service.acquire("p/k", "b")
        self.watch("w", "p/", prefix=True)
        grant.release()
        self.successResultOf(waiting)
        self.assertEqual(self.seen("w"), [(RELEASED, "p/k", "a"), (GRANTED, "p/k", "b")])

    def test_an_owner_gone(self) -> None:
        self.successResultOf(self.service.acquire("p/k", "a"))
        self.watch("w", "p/", prefix=True)
        self.service.release_all("a")
        self.assertEqual(self.seen("w"), [(LOST, "p/k", "a"), (DISAPPEARED, "p/k", None)])

    def test_expiry(self) -> None:
        self.successResultOf(self.service.acquire("p/k", "a", expires=1))
        self.watch("w", "p/", prefix=True)
        self.clock.advance(1)
        self.assertEqual(self.seen("w"), [(EXPIRED, "p/k", "a"), (DISAPPEARED, "p/k", None)])

    def test_a_key_with_a_wait_only(self) -> None:
        """A key enters the table with its first request, granted or not, and leaves it when nobody waits either."""
        grants = self.successResultOf(self.service.acquire_many(["x", "p/k"], "a"))
        self.watch("w", "p/", prefix=True)
        grants[1].release()
        # (p/k is free, but a multi-key request waiting for x keeps its place there)
        waiting = self.service.acquire_many(["x", "p/k"], "b", timeout=5)
        self.successResultOf(self.service.acquire("p/j", "c", timeout=0)).release()
        self.clock.advance(5)
        self.failureResultOf(waiting, LockTimeout)
        self.assertEqual(
            self.seen("w"),
            [
                (RELEASED, "p/k", "a"),
                (DISAPPEARED, "p/k", None),
                (APPEARED, "p/k", None),
                (APPEARED, "p/j", None),
                (GRANTED, "p/j", "c"),
                (RELEASED, "p/j", "c"),
                (DISAPPEARED, "p/j", None),
                (DISAPPEARED, "p/k", None),
            ],
        )

    def test_every_key(self) -> None:
        """An empty prefix watches every key."""
        self.watch("w", "", prefix=True)
        self.successResultOf(self.service.acquire("k", "a")).release()
        self.assertEqual([kind for kind, _, _ in self.seen("w")], [APPEARED, GRANTED, RELEASED, DISAPPEARED])

    def test_only_keys_with_the_prefix(self) -> None:
        self.watch("w", "ab", prefix=True)
        for key in ("a", "b", "ba", "xab"):
            self.successResultOf(self.service.acquire(key, "o"))
        self.successResultOf(self.service.acquire("ab", "o"))
        self.successResultOf(self.service.acquire("abc", "o"))
        self.assertEqual(
            self.seen("w"), [(APPEARED, "ab", None), (GRANTED, "ab", "o"), (APPEARED, "abc", None), (GRANTED, "abc", "o")]
        )

    def test_told_once_however_many_watches_match(self) -> None:
        self.watch("w", "k")
        self.watch("w", "", prefix=True)
        self.watch("w", "k", prefix=True)
        self.successResultOf(self.service.acquire("k", "a"))
        self.assertEqual(self.seen("w"), [(APPEARED, "k", None), (GRANTED, "k", "a")])


class WatchLifeTests(WatchTestCase):
    def test_watching_again_changes_nothing(self) -> None:
        self.assertTrue(self.watch("w", "k"))
        self.assertFalse(self.watch("w", "k"))
        self.assertTrue(self.watch("w", "k", prefix=True))
        self.assertEqual((self.service.watches_of("w"), self.service.watch_count), (2, 2))

    def test_the_latest_listener_is_told(self) -> None:
        first: list = []
        latest: list = []
        self.service.watch("w", "k", first.append)
        self.service.watch("w", "j", latest.append)
        self.successResultOf(self.service.acquire("k", "a"))
        self.assertEqual((len(first), len(latest)), (0, 1))

    def test_unwatch(self) -> None:
        self.watch("w", "k")
        self.watch("w", "p", prefix=True)
        self.assertTrue(self.service.unwatch("w", "k"))
        self.assertFalse(self.service.unwatch("w", "k"))
        self.assertFalse(self.service.unwatch("w", "q", prefix=True))
        self.assertTrue(self.service.unwatch("w", "p", prefix=True))
        self.successResultOf(self.service.acquire("k", "a"))
        self.successResultOf(self.service.acquire("pk", "a"))
        self.assertEqual(self.seen("w"), [])
        self.assertEqual((self.service.watches_of("w"), self.service.watch_count), (0, 0))
        self.assertWatchesGone()

    def test_release_all_ends_the_watches(self) -> None:
        self.watch("w", "k")
        self.watch("w", "p", prefix=True)
        self.successResultOf(self.service.acquire("k", "w"))
        self.service.release_all("w")
        self.successResultOf(self.service.acquire("k", "a"))
        self.assertEqual(self.seen("w"), [(GRANTED, "k", "w")])
        self.assertEqual(self.service.watch_count, 0)
        self.assertWatchesGone()

    def test_an_empty_key(self) -> None:
        self.assertRaises(ValueError, self.watch, "w", "")
        self.assertEqual(self.service.watch_count, 0)

    def test_max_watches(self) -> None:
        self.service.max_watches = 2
        self.watch("w", "a")
        self.watch("w", "b", prefix=True)
        error = self.assertRaises(LimitReached, self.watch, "w", "c")
        self.assertEqual((error.limit, error.value, str(error)), ("max-watches", 2, "max-watches exceeded (2)"))
        self.assertFalse(self.watch("w", "a"))  # (one it has: no change, no refusal)
        self.assertTrue(self.watch("other", "c"))
        self.service.unwatch("w", "a")
        self.assertTrue(self.watch("w", "c"))

    def test_max_total_watches(self) -> None:
        self.service.max_total_watches = 2
        self.watch("w1", "a")
        self.watch("w2", "a")
        error = self.assertRaises(LimitReached, self.watch, "w3", "b", True)
        self.assertEqual(str(error), "max-total-watches exceeded (2)")
        self.assertNotIn("w3", self.service._watchers)
        self.service.release_all("w1")
        self.assertTrue(self.watch("w3", "b", True))

    def assertWatchesGone(self) -> None:
        service = self.service
        self.assertEqual((service._watchers, service._key_watchers, service._prefix_watchers), ({}, {}, {}))
        self.assertEqual(service._prefix_lengths, {})


class SharedKeysTests(WatchTestCase):
    def test_keys_held_shared_are_counted(self) -> None:
        one = self.successResultOf(self.service.acquire("k", "a", mode=SHARED))
        self.successResultOf(self.service.acquire("k", "b", mode=SHARED))
        self.successResultOf(self.service.acquire("j", "a"))
        self.assertEqual(self.service.shared_keys, 1)
        one.release()
        self.assertEqual(self.service.shared_keys, 1)
        waiting = self.service.acquire("k", "c")
        self.service.release_all("b")
        self.successResultOf(waiting)
        self.assertEqual(self.service.shared_keys, 0)


class TimeoutTests(WatchTestCase):
    def test_a_timed_out_wait_for_a_new_key(self) -> None:
        """A multi-key wait that times out takes its keys out of the table: they disappear."""
        self.successResultOf(self.service.acquire("x", "a"))
        self.watch("w", "", prefix=True)
        waiting = self.service.acquire_many(["x", "n"], "b", timeout=3)
        self.clock.advance(3)
        failure = self.failureResultOf(waiting, LockTimeout)
        self.assertEqual(failure.value.busy, ["x"])
        self.assertEqual(self.seen("w"), [(APPEARED, "n", None), (DISAPPEARED, "n", None)])

    def test_a_wait_that_does_not_wait(self) -> None:
        """A request refused at once (timeout 0) leaves no trace: no event."""
        self.successResultOf(self.service.acquire("x", "a"))
        self.watch("w", "", prefix=True)
        self.failureResultOf(self.service.acquire_many(["x", "n"], "b", timeout=0), LockTimeout)
        self.assertEqual(self.seen("w"), [])


class GivenBackTests(WatchTestCase):
    def test_an_owner_giving_everything_back_releases_and_keeps_its_watches(self) -> None:
        """C{release_all(owner, RELEASED)} (elock's unlock_all): its grants are released, not lost, and it watches on."""
        self.successResultOf(self.service.acquire("k", "a"))
        self.watch("w", "k")
        self.watch("a", "k")
        self.service.release_all("a", RELEASED)
        self.assertEqual(self.seen("w"), [(RELEASED, "k", "a")])
        self.assertEqual(self.seen("a"), [(RELEASED, "k", "a")])
        self.successResultOf(self.service.acquire("k", "b"))
        self.assertEqual(self.seen("a")[-1], (GRANTED, "k", "b"))
        self.assertEqual(self.service.watches_of("a"), 1)


class SnapshotTests(WatchTestCase):
    def test_the_snapshot_marks_keys_held_shared(self) -> None:
        """A listing's snapshot says which keys were held shared when it was taken (plain rows while none is)."""
        self.successResultOf(self.service.acquire("x", "a"))
        self.assertEqual(self.service.snapshot(), [("x", 1, 0)])
        self.successResultOf(self.service.acquire("s", "a", mode=SHARED))
        self.successResultOf(self.service.acquire("s", "b", mode=SHARED))
        self.assertEqual(self.service.snapshot(), [("s", 2, 0, SHARED), ("x", 1, 0)])
        self.assertEqual(self.service.listing("grants"), [("s", 2, 0), ("x", 1, 0)])
