"""
A session grant's durable record (L{jesync.cluster.journal.HeldRecord}) and
its restore on a fake clock and a stand-in etcd: the token alone for a grant
with the defaults (as every record written before grants had more), a JSON
object otherwise; and a new leader restores a session grant with its mode,
C{max_concurrent}, value, token and the time left of its expiry, which then
runs out as any expiry does.  tests/etcd/test_cluster_journal.py takes the
same records through a real etcd and a real failover.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.cluster.etcd import Delete, KeyValue, Put, TxnResult
from jesync.cluster.journal import DurableState, HeldRecord, Layout, SessionRecord
from jesync.cluster.member import ClusterMember, Term, abandon
from jesync.interfaces import EXPIRED
from jesync.server import ServerSettings, build_lock_server
from jesync.wire import EXCLUSIVE, SHARED

#: A wall time the fake clocks start at (tokens and expiries are wall-time microseconds).
START = 1_700_000_000


class HeldRecordTests(SynchronousTestCase):
    def test_a_grant_with_the_defaults_is_its_token_alone(self) -> None:
        record = HeldRecord(1_700_000_000_000_001)
        self.assertTrue(record.plain)
        self.assertEqual(record.encode(), b"1700000000000001")
        self.assertEqual(HeldRecord.decode(b"1700000000000001"), record)

    def test_a_record_written_before_grants_had_more_loads_with_the_defaults(self) -> None:
        record = HeldRecord.decode(b"42")
        self.assertEqual(
            (record.token, record.mode, record.max_concurrent, record.value, record.expires_at_us),
            (42, EXCLUSIVE, 1, None, None),
        )

    def test_anything_else_is_a_json_object_of_what_is_not_a_default(self) -> None:
        cases = [
            (HeldRecord(7, mode=SHARED), {"token": 7, "mode": "shared"}),
            (HeldRecord(7, max_concurrent=3), {"token": 7, "max_concurrent": 3}),
            (HeldRecord(7, value=b"10.0.0.7:80"), {"token": 7, "value": "MTAuMC4wLjc6ODA="}),
            (HeldRecord(7, expires_at_us=1_700_000_060_000_000), {"token": 7, "expires_at_us": 1_700_000_060_000_000}),
            (
                HeldRecord(7, SHARED, 1, b"", 1_700_000_060_000_000),
                {"token": 7, "mode": "shared", "value": "", "expires_at_us": 1_700_000_060_000_000},
            ),
        ]
        for record, expected in cases:
            self.assertFalse(record.plain)
            encoded = record.encode()
            self.assertEqual(json.loads(encoded), expected)
            self.assertEqual(HeldRecord.decode(encoded), record)
            self.assertIs(HeldRecord.decode(encoded).mode, record.mode)

    def test_a_value_of_any_bytes_round_trips(self) -> None:
        value = bytes(range(256)) * 16  # 4096 bytes, most of them no UTF-8
        record = HeldRecord(9, value=value)
        self.assertEqual(HeldRecord.decode(record.encode()).value, value)

    def test_fields_it_does_not_know_are_ignored(self) -> None:
        self.assertEqual(HeldRecord.decode(b'{"token": 5, "mode": "shared", "later": 1}'), HeldRecord(5, SHARED))

    def test_a_record_that_is_neither_form_is_refused(self) -> None:
        for raw in (
            b"",
            b"x",
            b"{}",
            b'{"token": "5"}',
            b'{"token": 5.0}',
            b'{"token": true}',
            b'{"token": 5, "mode": "upgrade"}',
            b'{"token": 5, "max_concurrent": "3"}',
            b'{"token": 5, "value": "not base64!"}',
            b'{"token": 5, "value": 7}',
            b'{"token": 5, "expires_at_us": 1.5}',
            b"[5]",
        ):
            with self.assertRaises((ValueError, KeyError, TypeError, AttributeError), msg=raw):
                HeldRecord.decode(raw)

    def test_the_layout_loads_both_forms_and_sets_aside_what_it_cannot_read(self) -> None:
        layout = Layout("c")
        shared = HeldRecord(8, SHARED, 1, b"v", 1_700_000_060_000_000)
        kvs = [
            KeyValue(layout.session("s"), b'{"grace_ms": 20000}', 1, 1, 0),
            KeyValue(layout.held_key("s", "old"), b"7", 1, 1, 0),
            KeyValue(layout.held_key("s", "cfg"), shared.encode(), 1, 1, 0),
            KeyValue(layout.held_key("s", "bad"), b'{"token": 9, "mode": "upgrade"}', 1, 1, 0),
        ]
        state = layout.load(kvs)
        [record] = state.sessions
        self.assertEqual((record.session_id, record.grace_ms), ("s", 20000))
        self.assertEqual(record.keys, {"old": 7, "cfg": 8})
        self.assertEqual(record.grant("old"), HeldRecord(7))
        self.assertEqual(record.grant("cfg"), shared)
        self.assertEqual(state.unreadable, [layout.held_key("s", "bad")])
        # A record made with tokens alone (as before) has the defaults.
        self.assertEqual(SessionRecord("t", 1000, {"k": 3}).grant("k"), HeldRecord(3))


class DocumentedRecordTests(SynchronousTestCase):
    def test_the_example_in_the_cluster_page_is_what_a_grant_writes(self) -> None:
        """docs/cluster.md's example record is a shared grant with a value and an expiry, as encoded."""
        page = (Path(__file__).parents[2] / "docs" / "cluster.md").read_text(encoding="utf-8")
        [example] = re.findall(r"`(\{\"token\":[^`]*\})`", page)
        record = HeldRecord(1_700_000_000_000_001, SHARED, 1, b"10.0.0.7:80", 1_700_000_060_000_000)
        self.assertEqual(example.encode("utf-8"), record.encode())
        self.assertEqual(HeldRecord.decode(example.encode("utf-8")), record)
        self.assertIn("`1700000000000001`", page)
        self.assertEqual(HeldRecord(1_700_000_000_000_001).encode(), b"1700000000000001")


class StandInEtcd:
    """An etcd that commits every transaction at once, keeping what each wrote."""

    def __init__(self) -> None:
        self.transactions: List[list] = []

    def txn(self, compare: Any, success: Any, failure: Any = ()) -> Deferred:
        self.transactions.append(list(success))
        return succeed(TxnResult(True, len(self.transactions), []))

    def written(self) -> dict:
        """Every key's last write (None: deleted), the commit key's aside."""
        last: dict = {}
        for operations in self.transactions:
            for operation in operations:
                if isinstance(operation, Put):
                    last[operation.key] = operation.value
                elif isinstance(operation, Delete):
                    last[operation.key] = None
        return last


class RestoreTests(SynchronousTestCase):
    """A new leader's restore of session grants, on a fake clock and a stand-in etcd."""

    def take_over(self, state: DurableState) -> Any:
        self.clock = Clock()
        self.clock.advance(START)
        self.etcd: Any = StandInEtcd()
        member = ClusterMember(
            self.clock, ServerSettings(ports=[]), self.etcd, "c", 5, build_lock_server, lambda: 0.0, "m"
        )
        term = member.term = Term(lease=1, ttl=5, revision=7, valid_until=1e9, monotonic=lambda: 0.0)
        listened: List[Term] = []
        member._listen = listened.append  # type: ignore[method-assign]
        member._start_serving(term, state)
        self.clock.advance(0)  # (the journal commits on the next turn)
        self.assertEqual(listened, [term])
        self.addCleanup(abandon, term.server)
        self.assertIsNone(term.journal.failed)
        return term

    def test_a_session_grant_keeps_its_mode_value_token_and_the_time_left_of_its_expiry(self) -> None:
        layout = Layout("c")
        due = (START + 5) * 1_000_000
        shared = HeldRecord(START * 1_000_000 - 10, SHARED, 1, b"10.0.0.7:80", due)
        pool = HeldRecord(START * 1_000_000 - 9, EXCLUSIVE, 3)
        plain = HeldRecord(START * 1_000_000 - 8)
        state = Layout("c").load(
            [
                KeyValue(layout.session("s"), b'{"grace_ms": 60000}', 1, 1, 0),
                KeyValue(layout.held_key("s", "cfg"), shared.encode(), 1, 1, 0),
                KeyValue(layout.held_key("s", "pool"), pool.encode(), 1, 1, 0),
                KeyValue(layout.held_key("s", "old"), plain.encode(), 1, 1, 0),
            ]
        )
        term = self.take_over(state)
        locks = term.server.locks
        [session] = term.server.factories["elock"].sessions.sessions()
        self.assertEqual(session.id, "s")
        cfg, kept_pool, old = (locks.grant_of(key, session) for key in ("cfg", "pool", "old"))
        self.assertEqual(
            (cfg.mode, cfg.max_concurrent, cfg.value, cfg.token, cfg.seconds_left),
            (SHARED, 1, b"10.0.0.7:80", shared.token, 5.0),
        )
        self.assertEqual((kept_pool.mode, kept_pool.max_concurrent, kept_pool.value), (EXCLUSIVE, 3, None))
        self.assertEqual((kept_pool.token, kept_pool.expires_at), (pool.token, None))
        self.assertEqual((old.mode, old.max_concurrent, old.token, old.expires_at), (EXCLUSIVE, 1, plain.token, None))
        # Two more may join the pool; a shared request joins cfg.
        self.assertTrue(hasattr(locks.request("pool", "a", 3, 0, 0), "token"))
        self.assertTrue(hasattr(locks.request("cfg", "b", 1, 0, 0, SHARED), "token"))
        locks.release_all("a")
        locks.release_all("b")

        events: List[Any] = []
        locks.watch("watcher", "cfg", events.append)
        self.clock.advance(4.9)
        self.assertEqual(events, [])
        self.clock.advance(0.1)
        self.assertEqual([(event.kind, event.key) for event in events], [(EXPIRED, "cfg")])
        self.assertIsNone(locks.grant_of("cfg", session))
        self.clock.advance(0)
        self.assertIsNone(self.etcd.written()[layout.held_key("s", "cfg")])  # its record went with it
        locks.unwatch("watcher", "cfg")

    def test_a_session_grant_past_its_expiry_is_not_restored_and_its_record_goes(self) -> None:
        """As a dlock timed grant past its time: the key is free, and nobody is told of an expiry."""
        layout = Layout("c")
        past = HeldRecord(START * 1_000_000 - 10, SHARED, 1, b"v", START * 1_000_000)
        state = layout.load(
            [
                KeyValue(layout.held_key("s", "gone"), past.encode(), 1, 1, 0),
                KeyValue(layout.held_key("s", "kept"), b"5", 1, 1, 0),
            ]
        )
        term = self.take_over(state)
        locks = term.server.locks
        [session] = term.server.factories["elock"].sessions.sessions()
        self.assertIsNone(locks.grant_of("gone", session))
        self.assertEqual(locks.holders("gone"), [])
        self.assertEqual(locks.grant_of("kept", session).token, 5)
        written = self.etcd.written()
        self.assertIsNone(written[layout.held_key("s", "gone")])
        self.assertEqual(written[layout.held_key("s", "kept")], b"5")

    def test_a_renewal_told_to_the_journal_rewrites_the_record_before_its_reply(self) -> None:
        layout = Layout("c")
        term = self.take_over(DurableState())
        locks, journal = term.server.locks, term.journal
        session = term.server.factories["elock"].sessions.start(object())
        grant = locks.request("cfg", session, 1, 0, 10, SHARED, b"one")
        self.assertIsInstance(journal.durable(), Deferred)
        self.clock.advance(0)
        self.assertIsNone(journal.durable())
        record = HeldRecord.decode(self.etcd.written()[layout.held_key(session.id, "cfg")])
        self.assertEqual(record, HeldRecord(grant.token, SHARED, 1, b"one", (START + 10) * 1_000_000))

        self.clock.advance(2)
        self.assertIs(locks.request("cfg", session, 1, 0, 30, SHARED, b"two"), grant)  # a renewal
        self.assertIsNone(journal.durable())  # (no grant event: the journal has not heard of it)
        journal.held_changed(session, "cfg")  # (IOwnerChanges: what a renewing grammar tells it)
        waiting = journal.durable()
        self.assertIsInstance(waiting, Deferred)
        self.assertFalse(waiting.called)
        self.clock.advance(0)
        self.assertTrue(waiting.called)
        record = HeldRecord.decode(self.etcd.written()[layout.held_key(session.id, "cfg")])
        self.assertEqual(record, HeldRecord(grant.token, SHARED, 1, b"two", (START + 32) * 1_000_000))

        # Renewed to never expire, without a value: the value stays, the expiry goes.
        locks.request("cfg", session, 1, 0, 0, SHARED)
        journal.held_changed(session, "cfg")
        self.clock.advance(0)
        record = HeldRecord.decode(self.etcd.written()[layout.held_key(session.id, "cfg")])
        self.assertEqual(record, HeldRecord(grant.token, SHARED, 1, b"two", None))
        locks.release("cfg", session)
        self.clock.advance(0)
        self.assertIsNone(self.etcd.written()[layout.held_key(session.id, "cfg")])
        session.end()
        self.clock.advance(0)

    def test_elock_grants_write_the_token_alone(self) -> None:
        layout = Layout("c")
        term = self.take_over(DurableState())
        locks = term.server.locks
        session = term.server.factories["elock"].sessions.start(object())
        grant = locks.request("k", session, 1, 0, 0)  # as elock's lock asks
        self.clock.advance(0)
        self.assertEqual(self.etcd.written()[layout.held_key(session.id, "k")], b"%d" % grant.token)
        locks.release_all(session)
        session.end()
        self.clock.advance(0)

