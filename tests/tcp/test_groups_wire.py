"""
JESync's groups over real TCP, against a server listening in this process
(L{tests.support.TCPServer}: C{JESyncFactory(LockService(reactor))} and its
own group table): membership that ends when the member's connection goes,
a heartbeat lease lapsing in real time (1 s), a prefix watch on
C{group:<G>/} told of joins and leaves in order, and the group limits.

Nothing sleeps: every step waits for the line it expects (a watcher's
event included) with a bounded timeout.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from tests.support import TCPServer, peer_of


class GroupsOverTCPTestCase(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self):
        self.server = yield TCPServer.start(self)
        self.service = self.server.service
        self.groups = self.server.factory.groups

    def tearDown(self) -> None:
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def watcher_of(self, group: bytes):
        """A connection that created C{group} and watches its members (the test deletes it: L{reply})."""
        watcher = yield self.server.connect()
        self.assertEqual((yield watcher.ask(b"group-create %s\n" % group)), b"GROUP-CREATED %s\n" % group)
        self.assertEqual(
            (yield watcher.ask(b"watch-prefix group:%s/\n" % group)), b"WATCHING-PREFIX group:%s/\n" % group
        )
        return watcher

    @inlineCallbacks
    def reply(self, client, request: bytes, count: int = 1):
        """Send C{request}; its C{count} reply lines, joined, any watch event before them skipped."""
        client.send(request)
        lines = []
        while len(lines) < count:
            line = yield client.read_line()
            if not line.startswith(b"EVENT "):
                lines.append(line)
        return b"".join(lines)

    @inlineCallbacks
    def next_event(self, watcher):
        """The next C{EVENT} line of a kind that says a member came or went (APPEARED/DISAPPEARED skipped)."""
        while True:
            line = yield watcher.read_line()
            fields = line.split()
            if fields[1] not in (b"APPEARED", b"DISAPPEARED"):
                return fields


class MembershipTests(GroupsOverTCPTestCase):
    @inlineCallbacks
    def test_membership_ends_on_disconnect(self):
        watcher = yield self.watcher_of(b"g")
        member = yield self.server.connect()
        self.assertEqual((yield member.ask(b"group-join g m 0 caps\n")), b"JOINED g m 0\n")
        joined = yield self.next_event(watcher)
        self.assertEqual(joined[:4], [b"EVENT", b"GRANTED", b"group:g/m", peer_of(member)])
        self.assertEqual(joined[5:], [b"exclusive", b"caps"])
        yield member.disconnect()
        self.assertEqual((yield self.next_event(watcher)), [b"EVENT", b"LOST", b"group:g/m", *joined[3:5]])
        members = yield self.reply(watcher, b"group-members g\ngroup-delete g\n", 2)
        self.assertEqual(members, b"END\nGROUP-DELETED g\n")

    @inlineCallbacks
    def test_heartbeat_lease_lapses_in_real_time(self):
        """A member with a 1 s lease expires; one that heartbeats with a long lease (it joined with 5 s, so a stalled
        test machine cannot expire it first) stays."""
        watcher = yield self.watcher_of(b"g")
        quiet, beating = yield self.server.connect_many(2)
        self.assertEqual((yield quiet.ask(b"group-join g quiet 1\n")), b"JOINED g quiet 1\n")
        self.assertEqual((yield beating.ask(b"group-join g beating 5\n")), b"JOINED g beating 5\n")
        self.assertEqual((yield beating.ask(b"group-heartbeat g beating 30\n")), b"JOINED g beating 30\n")
        self.assertEqual((yield self.next_event(watcher))[:3], [b"EVENT", b"GRANTED", b"group:g/quiet"])
        self.assertEqual((yield self.next_event(watcher))[:3], [b"EVENT", b"GRANTED", b"group:g/beating"])
        expired = yield self.next_event(watcher)  # (within a read's timeout: the lease is 1 s)
        self.assertEqual(expired[:4], [b"EVENT", b"EXPIRED", b"group:g/quiet", peer_of(quiet)])
        self.assertEqual((yield quiet.ask(b"group-heartbeat g quiet 1\n")), b"NOT_JOINED g quiet\n")
        members = yield self.reply(watcher, b"group-members g\n", 2)
        self.assertEqual(members.split(b"\n")[0].split()[:4], [b"MEMBER", b"g", b"beating", peer_of(beating)])
        self.assertTrue(members.endswith(b"\nEND\n"))
        self.assertEqual((yield beating.ask(b"group-leave g beating\n")), b"LEFT g beating\n")
        self.assertEqual((yield self.reply(watcher, b"group-delete g\n")), b"GROUP-DELETED g\n")

    @inlineCallbacks
    def test_watch_sees_joins_and_leaves_in_order(self):
        watcher = yield self.watcher_of(b"g")
        clients = yield self.server.connect_many(3)
        expected = []
        for number, client in enumerate(clients):
            name = b"m%d" % number
            self.assertEqual((yield client.ask(b"group-join g %s 0\n" % name)), b"JOINED g %s 0\n" % name)
            expected.append([b"GRANTED", b"group:g/" + name])
        self.assertEqual((yield clients[1].ask(b"group-leave g m1\n")), b"LEFT g m1\n")
        expected.append([b"RELEASED", b"group:g/m1"])
        self.assertEqual((yield clients[1].ask(b"group-join g m1 0\n")), b"JOINED g m1 0\n")
        expected.append([b"GRANTED", b"group:g/m1"])
        yield clients[0].disconnect()
        expected.append([b"LOST", b"group:g/m0"])
        self.assertEqual((yield clients[2].ask(b"group-leave g m2\n")), b"LEFT g m2\n")
        expected.append([b"RELEASED", b"group:g/m2"])
        seen = []
        for _ in expected:
            seen.append((yield self.next_event(watcher))[1:3])
        self.assertEqual(seen, expected)
        members = yield self.reply(watcher, b"group-members g\n", 2)
        self.assertEqual(members.split(b"\n")[0].split()[:4], [b"MEMBER", b"g", b"m1", peer_of(clients[1])])
        yield clients[1].disconnect()
        self.assertEqual((yield self.next_event(watcher))[1:3], [b"LOST", b"group:g/m1"])
        self.assertEqual((yield self.reply(watcher, b"group-delete g\n")), b"GROUP-DELETED g\n")


class LimitTests(GroupsOverTCPTestCase):
    @inlineCallbacks
    def test_group_limits(self):
        self.groups.max_groups = 1
        self.groups.max_members = 1
        client, other = yield self.server.connect_many(2)
        self.assertEqual(
            (yield client.ask(b"group-create a\ngroup-create b\n", count=2)),
            b"GROUP-CREATED a\nINVALID_PARAMETER: max-groups exceeded (1)\n",
        )
        self.assertEqual(
            (yield other.ask(b"group-join a m 0\ngroup-join a n 0\n", count=2)),
            b"JOINED a m 0\nINVALID_PARAMETER: max-members exceeded (1)\n",
        )
        self.assertEqual(
            (yield other.ask(b"group-leave a m\ngroup-join a n 0\n", count=2)), b"LEFT a m\nJOINED a n 0\n"
        )
        # (the connection still answers: a limit reply closes nothing)
        self.assertEqual((yield client.ask(b"groups\n", count=2)), b"GROUP a\nEND\n")
        self.assertEqual(
            (yield other.ask(b"group-leave a n\ngroup-delete a\n", count=2)), b"LEFT a n\nGROUP-DELETED a\n"
        )
