"""
The blocking client's groups (L{jesync.client.group}) over real TCP to the
real server in a thread: each refusal is its own L{GroupError}; members are
listed in join order with their capabilities and tokens; a member ends when
it leaves, when its connection closes, and when its lease lapses unrenewed
(a heartbeat renews it); a group watch tells joins and leaves in order; the
server's caps are refused as any request is (L{ServerError}); the admin
listener's C{force-release} (L{Client.force_release}) ends a membership.
"""

from __future__ import annotations

import time

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import (
    Client,
    GroupAlreadyExists,
    GroupNotCreated,
    GroupNotEmpty,
    MemberAlreadyExists,
    MemberNotJoined,
    ServerError,
)
from jesync.client.group import member_of
from tests.servers import free_port, serve_in_thread

WITHIN = 5.0


class ClientGroupTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = serve_in_thread(self, extra_args=["--max-members", "2"])

    def client(self) -> Client:
        client = Client(self.server.address)
        self.addCleanup(client.close)
        return client

    def test_create_join_members_leave_delete(self) -> None:
        """The whole life of a group, each refusal its own error."""
        one, two = self.client(), self.client()
        workers = one.group("workers")
        self.assertRaises(GroupNotCreated, workers.members)
        self.assertRaises(GroupNotCreated, workers.join, "w1")
        self.assertRaises(GroupNotCreated, workers.delete)
        workers.create()
        self.assertRaises(GroupAlreadyExists, workers.create)
        self.assertEqual(one.groups(), ["workers"])
        self.assertEqual(workers.join("w1", b"role=web 1%", lease=10), 10)
        self.assertEqual(two.group("workers").join("w2"), 0)
        self.assertRaises(MemberAlreadyExists, two.group("workers").join, "w1")
        members = workers.members()
        self.assertEqual([(m.member, m.capabilities) for m in members], [("w1", b"role=web 1%"), ("w2", None)])
        self.assertLess(members[0].token, members[1].token)
        self.assertRaises(GroupNotEmpty, workers.delete)
        self.assertRaises(MemberNotJoined, workers.leave, "w2")  # two's, not one's
        self.assertRaises(MemberNotJoined, workers.update, "w2", b"x")
        workers.update("w1", "role=db")
        self.assertEqual(workers.members()[0].capabilities, b"role=db")
        self.assertTrue(workers.heartbeat("w1", 10))
        self.assertFalse(workers.heartbeat("w2", 10))
        workers.leave("w1")
        two.close()  # w2 ends with its connection
        self.assertEqual(self.wait_for(workers.members, []), [])
        workers.delete()
        self.assertEqual(one.groups(), [])

    def test_bad_names_are_refused_before_sending(self) -> None:
        client = self.client()
        self.assertRaises(ValueError, client.group, "a/b")
        self.assertRaises(ValueError, client.group, "a b")
        client.group("g").create()
        self.assertRaises(ValueError, client.group("g").join, "m m")

    def test_member_limit(self) -> None:
        """A join over --max-members is the server's refusal."""
        clients = [self.client() for _ in range(3)]
        clients[0].group("g").create()
        clients[0].group("g").join("a")
        clients[1].group("g").join("b")
        with self.assertRaises(ServerError) as caught:
            clients[2].group("g").join("c")
        self.assertIn("max-members exceeded (2)", str(caught.exception))

    def test_lease_lapses_without_heartbeat(self) -> None:
        """A member with a lease that stops heartbeating stops being one, though its connection stays open."""
        one = self.client()
        group = one.group("g")
        group.create()
        group.join("kept", lease=1)
        group.join("lapsing", lease=1)
        with group.watch() as events:
            deadline = time.monotonic() + WITHIN
            while time.monotonic() < deadline:
                self.assertTrue(group.heartbeat("kept", 1))
                event = events.get(0.3)
                if event is not None and event.kind == "expired":
                    break
            else:
                self.fail("the lapsing member never expired")
        self.assertEqual(member_of("g", event.key), "lapsing")
        self.assertEqual([m.member for m in group.members()], ["kept"])
        self.assertFalse(group.heartbeat("lapsing", 1))

    def test_watch_tells_joins_and_leaves_in_order(self) -> None:
        one, two = self.client(), self.client()
        group = one.group("g")
        group.create()
        with group.watch() as events:
            two.group("g").join("m1", b"caps")
            one.group("g").join("m2")
            two.group("g").leave("m1")
            two.close()
            seen = []
            while len(seen) < 3:
                event = events.get(WITHIN)
                self.assertIsNotNone(event, f"only {seen}")
                if event.kind in ("granted", "released", "expired", "lost"):
                    seen.append((event.kind, member_of("g", event.key), event.value))
        self.assertEqual(seen, [("granted", "m1", b"caps"), ("granted", "m2", None), ("released", "m1", None)])

    def test_force_release_on_the_admin_listener(self) -> None:
        """Client.force_release (an extension request, as the group commands are) frees a member's key."""
        admin_port = free_port()
        server = serve_in_thread(self, extra_args=["--admin-port", f"tcp:{admin_port}:interface=127.0.0.1"])
        member = Client(server.address)
        self.addCleanup(member.close)
        member.group("g").create()
        member.group("g").join("m")
        with Client(f"127.0.0.1:{admin_port}") as admin:
            self.assertEqual(admin.force_release("group:g/m"), 1)
            self.assertEqual(admin.force_release("group:g/m"), 0)
        self.assertEqual(member.group("g").members(), [])
        self.assertRaises(MemberNotJoined, member.group("g").leave, "m")
        self.assertRaises(ServerError, member.force_release, "group:g/m")  # not the admin listener

    def wait_for(self, read, expected):
        deadline = time.monotonic() + WITHIN
        while True:
            found = read()
            if found == expected or time.monotonic() > deadline:
                return found
            time.sleep(0.02)
