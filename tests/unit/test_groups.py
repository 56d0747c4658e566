"""
L{jesync.groups.GroupTable} on a L{LockService} driven by a L{Clock}: every
error reachable, membership ending however its grant ends (a leave, a lease
that lapsed, its owner gone, an elock-style unlock_all, a force-release),
the limits, the listings, the index kept from the table's events, and the
group keys locked by hand.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import (
    GroupAlreadyExists,
    GroupKeyTaken,
    GroupNotCreated,
    GroupNotEmpty,
    LimitReached,
    MemberAlreadyExists,
    MemberNotJoined,
)
from jesync.groups import GroupAnchor, GroupTable
from jesync.interfaces import RELEASED
from jesync.service import LockService
from jesync.wire import election_key, group_key, member_key


class Owner:
    """A member's owner (a connection, on the wire)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<Owner {self.name}>"


class GroupTableCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.table = GroupTable(self.service, max_groups=3, max_members=2)
        self.a, self.b, self.c = Owner("a"), Owner("b"), Owner("c")


class NamesTests(SynchronousTestCase):
    def test_keys(self) -> None:
        self.assertEqual(group_key("g"), "group:g")
        self.assertEqual(member_key("g", "m"), "group:g/m")
        self.assertEqual(election_key("e"), "election:e")


class GroupTests(GroupTableCase):
    def test_create_holds_the_group_key_for_ever(self) -> None:
        self.table.create("g")
        [grant] = self.service.holders("group:g")
        self.assertIsInstance(grant.owner, GroupAnchor)
        self.assertIsNone(grant.expires_at)
        self.assertEqual(self.table.groups(), ["g"])
        self.assertEqual(self.table.members("g"), {})

    def test_create_twice(self) -> None:
        self.table.create("g")
        with self.assertRaises(GroupAlreadyExists) as raised:
            self.table.create("g")
        self.assertEqual(str(raised.exception), "group 'g' exists already")
        self.assertEqual(len(self.service.holders("group:g")), 1)

    def test_bad_names(self) -> None:
        for name, message in [
            ("a/b", "a group name cannot contain '/': 'a/b'"),
            ("", "a group name cannot be empty"),
            ("a b", "a group name cannot contain whitespace or control characters: 'a b'"),
        ]:
            with self.subTest(name=name):
                with self.assertRaises(ValueError) as raised:
                    self.table.create(name)
                self.assertEqual(str(raised.exception), message)
        self.assertEqual(self.table.groups(), [])

    def test_groups_sorted(self) -> None:
        for name in ("b", "c", "a"):
            self.table.create(name)
        self.assertEqual(self.table.groups(), ["a", "b", "c"])

    def test_max_groups(self) -> None:
        for name in ("a", "b", "c"):
            self.table.create(name)
        with self.assertRaises(LimitReached) as raised:
            self.table.create("d")
        self.assertEqual(str(raised.exception), "max-groups exceeded (3)")
        self.assertEqual(self.service.status("group:d").granted, 0)
        self.table.delete("a")
        self.table.create("d")
        self.assertEqual(self.table.groups(), ["b", "c", "d"])

    def test_max_held_does_not_cap_groups(self) -> None:
        service = LockService(self.clock, max_held=1)
        table = GroupTable(service, max_groups=None)
        for number in range(5):
            table.create(f"g{number}")
        self.assertEqual(len(table.groups()), 5)

    def test_delete(self) -> None:
        self.table.create("g")
        self.table.delete("g")
        self.assertEqual(self.table.groups(), [])
        self.assertEqual(self.service.status("group:g").granted, 0)
        with self.assertRaises(GroupNotCreated) as raised:
            self.table.delete("g")
        self.assertEqual(str(raised.exception), "group 'g' does not exist: create it first")
        self.table.create("g")  # (again)
        self.assertEqual(self.table.groups(), ["g"])

    def test_delete_not_empty(self) -> None:
        self.table.create("g")
        self.table.join("g", "m", self.a, None, 0)
        with self.assertRaises(GroupNotEmpty) as raised:
            self.table.delete("g")
        self.assertEqual(str(raised.exception), "group 'g' still has members")
        self.table.leave("g", "m", self.a)
        self.table.delete("g")

    def test_members_of_no_group(self) -> None:
        with self.assertRaises(GroupNotCreated):
            self.table.members("g")

    def test_group_key_locked_by_hand(self) -> None:
        self.service.request("group:g", self.a, 1, 0, 0)
        with self.assertRaises(GroupKeyTaken) as raised:
            self.table.create("g")
        self.assertEqual(
            str(raised.exception),
            "group 'g' cannot be created: its key 'group:g' is locked by a client, not the group table",
        )
        self.assertEqual(self.table.groups(), [])
        with self.assertRaises(GroupNotCreated):
            self.table.join("g", "m", self.b, None, 0)
        # Nothing queued behind the hand-held key: once free, create works.
        self.assertEqual(self.service.status("group:g").waiting, 0)
        self.service.release("group:g", self.a)
        self.table.create("g")
        self.assertEqual(self.table.groups(), ["g"])

    def test_anchor_force_released(self) -> None:
        """Released behind the table's back (an admin's force-release): the group is gone."""
        self.table.create("g")
        self.table.join("g", "m", "owner", None, 0)
        [anchor] = self.service.holders("group:g")
        anchor.release()
        self.assertEqual(self.table.groups(), [])
        with self.assertRaises(GroupNotCreated):
            self.table.members("g")
        # (its members are not stranded: they may still heartbeat and leave)
        self.assertTrue(self.table.heartbeat("g", "m", "owner", 5))
        self.table.leave("g", "m", "owner")
        self.assertEqual(self.service.holders("group:g/m"), [])


class TwoTablesTests(GroupTableCase):
    def test_two_tables_over_one_lock_table_agree(self) -> None:
        other = GroupTable(self.service)
        self.table.create("g")
        self.assertEqual(other.groups(), ["g"])
        with self.assertRaises(GroupAlreadyExists):
            other.create("g")
        other.join("g", "m", self.a, None, 0)
        self.assertEqual(list(self.table.members("g")), ["m"])
        other.leave("g", "m", self.a)
        other.delete("g")
        self.assertEqual(self.table.groups(), [])


class MemberTests(GroupTableCase):
    def setUp(self) -> None:
        super().setUp()
        self.table.create("g")

    def test_join(self) -> None:
        grant = self.table.join("g", "m", self.a, b"caps", 10)
        self.assertEqual(grant.key, "group:g/m")
        self.assertIs(grant.owner, self.a)
        self.assertEqual(grant.seconds_left, 10)
        self.assertEqual(self.table.members("g"), {"m": b"caps"})
        self.assertEqual(self.table.member_grants("g"), {"m": grant})

    def test_join_order(self) -> None:
        self.table.max_members = None
        for member, owner in (("z", self.a), ("a", self.b), ("m", self.c)):
            self.table.join("g", member, owner, None, 0)
        self.assertEqual(list(self.table.members("g")), ["z", "a", "m"])

    def test_join_no_group(self) -> None:
        with self.assertRaises(GroupNotCreated):
            self.table.join("h", "m", self.a, None, 0)
        self.assertEqual(self.service.status("group:h/m").granted, 0)

    def test_member_exists_for_anyone(self) -> None:
        self.table.join("g", "m", self.a, b"first", 0)
        for owner in (self.b, self.a):
            with self.subTest(owner=owner):
                with self.assertRaises(MemberAlreadyExists) as raised:
                    self.table.join("g", "m", owner, b"second", 10)
                self.assertEqual(str(raised.exception), "member 'm' of group 'g' exists already")
        self.assertEqual(self.table.members("g"), {"m": b"first"})
        self.assertIsNone(self.service.grant_of("group:g/m", self.a).expires_at)

    def test_max_members(self) -> None:
        self.table.join("g", "m1", self.a, None, 0)
        self.table.join("g", "m2", self.a, None, 0)
        with self.assertRaises(LimitReached) as raised:
            self.table.join("g", "m3", self.b, None, 0)
        self.assertEqual(str(raised.exception), "max-members exceeded (2)")
        self.table.create("h")  # (per group)
        self.table.join("h", "m3", self.b, None, 0)

    def test_bad_member_and_lease(self) -> None:
        with self.assertRaises(ValueError):
            self.table.join("g", "", self.a, None, 0)
        with self.assertRaises(ValueError):
            self.table.join("g", "m", self.a, None, -1)
        with self.assertRaises(ValueError):
            self.table.join("g", "m", self.a, b"x" * 4097, 0)
        self.assertEqual(self.table.members("g"), {})

    def test_leave(self) -> None:
        self.table.join("g", "m", self.a, None, 0)
        with self.assertRaises(MemberNotJoined) as raised:
            self.table.leave("g", "m", self.b)
        self.assertEqual(str(raised.exception), "'m' is not a member of group 'g' (for this owner)")
        self.table.leave("g", "m", self.a)
        self.assertEqual(self.table.members("g"), {})
        with self.assertRaises(MemberNotJoined):
            self.table.leave("g", "m", self.a)
        with self.assertRaises(MemberNotJoined):
            self.table.leave("h", "m", self.a)

    def test_lease_lapses_without_heartbeat(self) -> None:
        self.table.join("g", "m", self.a, None, 5)
        self.clock.advance(4.9)
        self.assertEqual(list(self.table.members("g")), ["m"])
        self.clock.advance(0.1)
        self.assertEqual(self.table.members("g"), {})
        self.assertFalse(self.table.heartbeat("g", "m", self.a, 5))
        self.table.delete("g")  # (empty again)

    def test_heartbeat_keeps_it(self) -> None:
        grant = self.table.join("g", "m", self.a, b"c", 5)
        for _ in range(4):
            self.clock.advance(4)
            self.assertTrue(self.table.heartbeat("g", "m", self.a, 5))
        self.assertEqual(self.table.members("g"), {"m": b"c"})
        self.assertEqual(grant.seconds_left, 5)
        self.assertEqual(self.service.grant_of("group:g/m", self.a).token, grant.token)
        self.clock.advance(5)
        self.assertEqual(self.table.members("g"), {})

    def test_heartbeat_new_lease_and_none(self) -> None:
        grant = self.table.join("g", "m", self.a, None, 5)
        self.assertTrue(self.table.heartbeat("g", "m", self.a, 0))
        self.assertIsNone(grant.expires_at)
        self.clock.advance(1000)
        self.assertEqual(list(self.table.members("g")), ["m"])

    def test_heartbeat_not_a_member(self) -> None:
        self.table.join("g", "m", self.a, None, 5)
        self.assertFalse(self.table.heartbeat("g", "m", self.b, 5))
        self.assertFalse(self.table.heartbeat("g", "x", self.a, 5))
        self.assertFalse(self.table.heartbeat("h", "m", self.a, 5))

    def test_update(self) -> None:
        grant = self.table.join("g", "m", self.a, b"old", 5)
        self.clock.advance(3)
        self.table.update("g", "m", self.a, b"new")
        self.assertEqual(self.table.members("g"), {"m": b"new"})
        self.assertEqual(grant.seconds_left, 5)  # (a renewal with its lease)
        with self.assertRaises(MemberNotJoined):
            self.table.update("g", "m", self.b, b"theirs")
        with self.assertRaises(ValueError):
            self.table.update("g", "m", self.a, b"x" * 4097)
        self.assertEqual(self.table.members("g"), {"m": b"new"})

    def test_update_keeps_the_last_heartbeat_lease(self) -> None:
        grant = self.table.join("g", "m", self.a, None, 5)
        self.table.heartbeat("g", "m", self.a, 30)
        self.table.update("g", "m", self.a, b"x")
        self.assertEqual(grant.seconds_left, 30)

    def test_owner_gone(self) -> None:
        self.table.join("g", "m1", self.a, None, 0)
        self.table.join("g", "m2", self.b, None, 0)
        self.service.release_all(self.a)
        self.assertEqual(list(self.table.members("g")), ["m2"])
        self.assertIsNone(self.service.grant_of("group:g/m1", self.a))

    def test_unlock_all(self) -> None:
        """An elock unlock_all: everything given back, the owner stays."""
        self.table.join("g", "m", self.a, None, 0)
        self.service.release_all(self.a, RELEASED)
        self.assertEqual(self.table.members("g"), {})
        self.table.join("g", "m", self.a, None, 0)
        self.assertEqual(list(self.table.members("g")), ["m"])

    def test_member_ids_with_separator(self) -> None:
        self.table.join("g", "host/1", self.a, None, 0)
        self.assertEqual(list(self.table.members("g")), ["host/1"])
        self.assertEqual(self.service.holders("group:g/host/1")[0].owner, self.a)

    def test_other_groups_and_keys_apart(self) -> None:
        self.table.max_members = None
        self.table.create("g2")
        self.table.join("g", "m", self.a, None, 0)
        self.table.join("g2", "n", self.a, None, 0)
        self.service.request("group", self.a, 1, 0, 0)  # (not under the prefix)
        self.service.request(election_key("g"), self.a, 1, 0, 0)
        self.assertEqual(list(self.table.members("g")), ["m"])
        self.assertEqual(list(self.table.members("g2")), ["n"])


class ByHandTests(GroupTableCase):
    """Member keys locked by hand are members; the index is right whichever way they end."""

    def test_member_key_locked_before_the_table_is_used(self) -> None:
        self.service.request("group:g/early", self.a, 1, 0, 0, value=b"v")
        self.service.request("group:g", self.b, 1, 0, 0)
        self.service.release("group:g", self.b)
        self.assertEqual(self.service.watches_of(self.table), 0)  # (nothing watched until used)
        self.table.create("g")
        self.assertEqual(self.service.watches_of(self.table), 1)
        self.assertEqual(self.table.members("g"), {"early": b"v"})
        with self.assertRaises(GroupNotEmpty):
            self.table.delete("g")

    def test_member_key_locked_by_hand(self) -> None:
        self.table.create("g")
        self.service.request("group:g/m", self.a, 1, 0, 10, value=b"hand")
        self.assertEqual(self.table.members("g"), {"m": b"hand"})
        with self.assertRaises(MemberAlreadyExists):
            self.table.join("g", "m", self.b, None, 0)
        self.assertTrue(self.table.heartbeat("g", "m", self.a, 10))
        self.clock.advance(4)
        self.table.update("g", "m", self.a, b"new")  # (a renewal with the heartbeat's lease)
        self.assertEqual(self.service.grant_of("group:g/m", self.a).seconds_left, 10)

    def test_hand_update_keeps_expiry(self) -> None:
        self.table.create("g")
        self.service.request("group:g/m", self.a, 1, 0, 10)
        self.clock.advance(4)
        self.table.update("g", "m", self.a, b"new")  # (no lease known: its expiry is kept)
        self.assertEqual(self.service.grant_of("group:g/m", self.a).seconds_left, 6)
        self.assertEqual(self.table.members("g"), {"m": b"new"})

    def test_several_holders_one_member(self) -> None:
        self.table.create("g")
        self.service.request("group:g/m", self.a, 2, 0, 0, value=b"a")
        self.service.request("group:g/m", self.b, 2, 0, 0, value=b"b")
        self.assertEqual(self.table.members("g"), {"m": b"a"})
        self.service.release("group:g/m", self.a)
        self.assertEqual(self.table.members("g"), {"m": b"b"})
        self.service.release_all(self.b)
        self.assertEqual(self.table.members("g"), {})
        self.table.delete("g")

    def test_waiter_granted_on_release_is_the_member_anew(self) -> None:
        self.table.max_members = None
        self.table.create("g")
        self.table.join("g", "first", self.c, None, 0)
        self.table.join("g", "m", self.a, b"a", 0)
        waited = self.service.acquire("group:g/m", self.b, value=b"b")
        self.table.leave("g", "m", self.a)
        self.assertEqual(self.successResultOf(waited).owner, self.b)
        self.assertEqual(self.table.members("g"), {"first": None, "m": b"b"})

    def test_expiry_lost_and_release_keep_the_index(self) -> None:
        self.table.max_members = None
        self.table.create("g")
        self.table.join("g", "expires", self.a, None, 1)
        self.table.join("g", "lost", self.b, None, 0)
        self.table.join("g", "leaves", self.c, None, 0)
        self.table.join("g", "stays", self.c, None, 0)
        self.clock.advance(1)
        self.service.release_all(self.b)
        self.table.leave("g", "leaves", self.c)
        self.assertEqual(list(self.table.members("g")), ["stays"])
        self.table.leave("g", "stays", self.c)
        self.assertEqual(self.table._members, {})
        self.assertEqual(self.table._leases, {})
        self.table.delete("g")
        self.assertEqual(self.service.totals().keys, 0)
