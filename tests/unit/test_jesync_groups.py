"""
JESync's group commands against the real server in memory
(L{jesync.testing.MemoryServer}, built from the settings as C{twistd jesync}
builds it, so C{--max-groups} and C{--max-members} are the server's): every
reply and error of docs/protocols/jesync.md's "Groups", membership ending
with its connection and with its lease, and a prefix watch on a group's
members.  Each test ends with every connection closed and the table empty.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.protocols.jesync import describe_owner
from jesync.testing import MemoryPeer, MemoryServer
from tests.doc_pages import page_blocks, replay_transcript
from tests.support import UnitServer


class GroupWireCase(SynchronousTestCase):
    settings: dict = {}

    def setUp(self) -> None:
        self.server = MemoryServer(**self.settings)
        self.service = self.server.service
        self.peers: list[MemoryPeer] = []
        self.addCleanup(self.shutdown)

    def tearDown(self) -> None:
        self.assertEqual(self.flushLoggedErrors(), [])

    def connect(self) -> MemoryPeer:
        peer = self.server.connect("jesync")
        self.peers.append(peer)
        return peer

    def shutdown(self) -> None:
        for peer in self.peers:
            if not peer.closed:
                peer.close()
        self.server.flush()
        self.assertEqual(self.server.connections, 0)
        # (groups outlive connections: each test deletes the ones it made)
        self.assertEqual(self.service.listing(), [])

    def member_line(self, group: bytes, member: bytes, value: bytes = b"") -> bytes:
        """The C{MEMBER} line the server writes for the holder of C{group:<group>/<member>}."""
        [grant] = self.service.holders(f"group:{group.decode()}/{member.decode()}")
        line = b"MEMBER %s %s %s %d" % (group, member, describe_owner(grant.owner), grant.token)
        return line + (b" " + value if value else b"") + b"\n"


class GroupCommandTests(GroupWireCase):
    def test_create_list_delete(self) -> None:
        client = self.connect()
        self.assertEqual(
            client.ask(b"groups\ngroup-create b\ngroup-create a\ngroup-create a\ngroups\n"),
            b"END\nGROUP-CREATED b\nGROUP-CREATED a\nGROUP-EXISTS a\nGROUP a\nGROUP b\nEND\n",
        )
        self.assertEqual(client.ask(b"group-members a\n"), b"END\n")
        self.assertEqual(
            client.ask(b"group-delete a\ngroup-delete a\ngroup-members a\ngroup-delete b\ngroups\n"),
            b"GROUP-DELETED a\nNO_GROUP a\nNO_GROUP a\nGROUP-DELETED b\nEND\n",
        )

    def test_no_cost_until_used(self) -> None:
        """The group table watches nothing until a group command: the plain lock path pays nothing for it."""
        client = self.connect()
        self.assertEqual(client.ask(b"lock k\nrelease k\n"), b"GRANTED 1 0 k 120\nRELEASED 0 0 k\n")
        self.assertEqual(self.service._prefix_lengths, {})
        self.assertEqual(client.ask(b"groups\n"), b"END\n")
        self.assertEqual(self.service._prefix_lengths, {len("group:"): 1})
        self.assertEqual(self.service.watch_count, 0)  # (the table's own watch counts toward no client cap)

    def test_the_tables_watch_takes_no_client_slot(self) -> None:
        """With --max-total-watches reached by clients, group commands still work, and the clients' slots stay theirs."""
        self.service.max_total_watches = 1
        watcher, other = self.connect(), self.connect()
        self.assertEqual(watcher.ask(b"watch k\n"), b"WATCHING k\n")
        self.assertEqual(other.ask(b"group-create g\ngroups\n"), b"GROUP-CREATED g\nGROUP g\nEND\n")
        self.assertEqual(watcher.ask(b"unwatch k\n"), b"UNWATCHED k\n")
        self.assertEqual(other.ask(b"watch j\n"), b"WATCHING j\n")
        self.assertEqual(other.ask(b"group-delete g\n"), b"GROUP-DELETED g\n")

    def test_groups_outlive_their_creator(self) -> None:
        creator, other = self.connect(), self.connect()
        creator.ask(b"group-create g\n")
        creator.close()
        self.assertEqual(other.ask(b"groups\ngroup-delete g\n"), b"GROUP g\nEND\nGROUP-DELETED g\n")

    def test_join_members_leave(self) -> None:
        first, second = self.connect(), self.connect()
        first.ask(b"group-create g\n")
        self.assertEqual(first.ask(b"group-join g m1 30 web%20node\n"), b"JOINED g m1 30\n")
        self.assertEqual(second.ask(b"group-join g m2 0\n"), b"JOINED g m2 0\n")
        self.assertEqual(
            second.ask(b"group-members g\n"),
            self.member_line(b"g", b"m1", b"web%20node") + self.member_line(b"g", b"m2") + b"END\n",
        )
        self.assertEqual(
            second.ask(b"group-join g m1 30\ngroup-join g m2 30\ngroup-delete g\n"),
            b"MEMBER-EXISTS g m1\nMEMBER-EXISTS g m2\nGROUP-NOT-EMPTY g\n",
        )
        self.assertEqual(
            second.ask(b"group-leave g m1\ngroup-leave g m2\ngroup-leave g m2\n"),
            b"NOT_JOINED g m1\nLEFT g m2\nNOT_JOINED g m2\n",
        )
        self.assertEqual(first.ask(b"group-leave g m1\ngroup-delete g\n"), b"LEFT g m1\nGROUP-DELETED g\n")

    def test_no_group(self) -> None:
        client = self.connect()
        self.assertEqual(
            client.ask(b"group-join g m 0\ngroup-heartbeat g m 5\ngroup-update g m x\ngroup-leave g m\n"),
            b"NO_GROUP g\nNOT_JOINED g m\nNOT_JOINED g m\nNOT_JOINED g m\n",
        )

    def test_heartbeat_and_update(self) -> None:
        client, other = self.connect(), self.connect()
        client.ask(b"group-create g\ngroup-join g m 10 old\n")
        self.server.advance(6)
        self.assertEqual(client.ask(b"group-heartbeat g m 20\n"), b"JOINED g m 20\n")
        self.assertEqual(other.ask(b"group-heartbeat g m 20\ngroup-update g m x\n"), b"NOT_JOINED g m\n" * 2)
        self.server.advance(15)
        self.assertEqual(client.ask(b"group-update g m new%0A\n"), b"UPDATED g m\n")
        self.assertEqual(client.ask(b"owned group:g/m\n"), b"OWNED 20000 group:g/m\n")  # (renewed)
        self.assertEqual(other.ask(b"group-members g\n"), self.member_line(b"g", b"m", b"new%0A") + b"END\n")
        client.ask(b"group-leave g m\ngroup-delete g\n")

    def test_lease_lapses(self) -> None:
        client = self.connect()
        client.ask(b"group-create g\ngroup-join g m 5\n")
        self.server.advance(5)
        self.assertEqual(client.ask(b"group-members g\ngroup-heartbeat g m 5\n"), b"END\nNOT_JOINED g m\n")
        client.ask(b"group-delete g\n")

    def test_membership_ends_with_the_connection(self) -> None:
        member, other = self.connect(), self.connect()
        member.ask(b"group-create g\ngroup-join g m 0\n")
        member.close()
        self.server.flush()
        self.assertEqual(other.ask(b"group-members g\ngroup-delete g\n"), b"END\nGROUP-DELETED g\n")

    def test_watch_joins_and_leaves(self) -> None:
        watcher, member = self.connect(), self.connect()
        self.assertEqual(
            watcher.ask(b"group-create g\nwatch-prefix group:g/\n"), b"GROUP-CREATED g\nWATCHING-PREFIX group:g/\n"
        )
        member.ask(b"group-join g a 0 caps\ngroup-join g b 5\ngroup-leave g a\n")
        self.server.advance(5)
        lines = watcher.received().splitlines()
        self.assertEqual(
            [line.split()[:3] for line in lines],
            [
                [b"EVENT", b"APPEARED", b"group:g/a"],
                [b"EVENT", b"GRANTED", b"group:g/a"],
                [b"EVENT", b"APPEARED", b"group:g/b"],
                [b"EVENT", b"GRANTED", b"group:g/b"],
                [b"EVENT", b"RELEASED", b"group:g/a"],
                [b"EVENT", b"DISAPPEARED", b"group:g/a"],
                [b"EVENT", b"EXPIRED", b"group:g/b"],
                [b"EVENT", b"DISAPPEARED", b"group:g/b"],
            ],
        )
        self.assertTrue(lines[1].endswith(b" exclusive caps"))
        watcher.ask(b"group-delete g\n")

    def test_bad_requests(self) -> None:
        client = self.connect()
        client.ask(b"group-create g\n")
        for line, reply in [
            (b"group-create a/b", b"INVALID_PARAMETER: a group name cannot contain '/'"),
            (b"group-create", b"INVALID_PARAMETER: missing group"),
            (b"group-create a b", b"INVALID_PARAMETER: too many arguments"),
            (b"group-join g m", b"INVALID_PARAMETER: group-join takes a group, a member and a lease"),
            (b"group-join g m x", b"INVALID_PARAMETER: lease is not an integer"),
            (b"group-join g m -1", b"INVALID_PARAMETER: Expire timeout should be greater or equal than 0"),
            (b"group-join g m 0 %zz", b"INVALID_PARAMETER: value is not percent-encoded"),
            (b"group-join g m 0 a b", b"INVALID_PARAMETER: too many arguments"),
            (b"group-heartbeat g m", b"INVALID_PARAMETER: group-heartbeat takes a group, a member and a lease"),
            (b"group-update g m", b"INVALID_PARAMETER: group-update takes a group, a member and capabilities"),
            (b"group-leave g", b"INVALID_PARAMETER: group-leave takes a group and a member"),
            (b"group-leave g m x", b"INVALID_PARAMETER: too many arguments"),
            (b"groups x", b"INVALID_PARAMETER: too many arguments"),
        ]:
            with self.subTest(line=line):
                self.assertEqual(client.ask(line + b"\n"), reply + b"\n")
        client.ask(b"group-delete g\n")

    def test_group_key_locked_by_hand(self) -> None:
        holder, other = self.connect(), self.connect()
        holder.ask(b"lock group:g\n")
        self.assertEqual(
            other.ask(b"group-create g\n"),
            b"INVALID_PARAMETER: group 'g' cannot be created: its key 'group:g' is locked by a client,"
            b" not the group table\n",
        )
        holder.ask(b"release group:g\n")
        created, holder_line, end = other.ask(b"group-create g\nholders group:g\n").splitlines()
        self.assertEqual((created, end), (b"GROUP-CREATED g", b"END"))
        self.assertTrue(holder_line.startswith(b"HOLDER group:g group-table 0 0 "), holder_line)
        other.ask(b"group-delete g\n")

    def test_member_key_within_max_key_length(self) -> None:
        client = self.connect()
        client.ask(b"group-create g\n")
        limit = self.server.settings.max_key_length
        member = b"m" * (limit - len(b"group:g/"))
        self.assertEqual(client.ask(b"group-join g %s 0\n" % member), b"JOINED g %s 0\n" % member)
        self.assertEqual(
            client.ask(b"group-join g %sm 0\n" % member), b"INVALID_PARAMETER: max-key-length exceeded (%d)\n" % limit
        )
        client.ask(b"group-leave g %s\ngroup-delete g\n" % member)


class AdminListenerTests(GroupWireCase):
    settings = {"admin_ports": ["tcp:11409"]}

    def test_the_same_groups_and_force_release(self) -> None:
        client, admin = self.connect(), self.server.connect("admin")
        self.peers.append(admin)
        client.ask(b"group-create g\ngroup-create h\ngroup-join g m 0\n")
        self.assertEqual(admin.ask(b"groups\n"), b"GROUP g\nGROUP h\nEND\n")
        self.assertEqual(admin.ask(b"force-release group:g/m\n"), b"FORCE-RELEASED 1 group:g/m\n")
        self.assertEqual(admin.ask(b"force-release group:h\n"), b"FORCE-RELEASED 1 group:h\n")
        self.assertEqual(client.ask(b"group-members g\ngroups\n"), b"END\nGROUP g\nEND\n")
        self.assertEqual(client.ask(b"group-leave g m\n"), b"NOT_JOINED g m\n")
        self.assertEqual(admin.ask(b"group-delete g\n"), b"GROUP-DELETED g\n")


class GroupLimitTests(GroupWireCase):
    settings = {"max_groups": 2, "max_members": 1}

    def test_limits(self) -> None:
        client = self.connect()
        self.assertEqual(
            client.ask(b"group-create a\ngroup-create b\ngroup-create c\n"),
            b"GROUP-CREATED a\nGROUP-CREATED b\nINVALID_PARAMETER: max-groups exceeded (2)\n",
        )
        self.assertEqual(
            client.ask(b"group-join a m 0\ngroup-join a n 0\ngroup-join b n 0\n"),
            b"JOINED a m 0\nINVALID_PARAMETER: max-members exceeded (1)\nJOINED b n 0\n",
        )
        client.close()
        other = self.connect()
        self.server.flush()
        self.assertEqual(other.ask(b"group-delete a\ngroup-delete b\n"), b"GROUP-DELETED a\nGROUP-DELETED b\n")

    def test_options(self) -> None:
        settings = MemoryServer.from_args(["--max-groups", "7", "--max-members", "0"]).settings
        self.assertEqual((settings.max_groups, settings.max_members), (7, None))


class DocsTranscriptTests(SynchronousTestCase):
    """The transcript of docs/protocols/jesync.md's "Groups" is what the server sends."""

    def test_transcript(self) -> None:
        [transcript] = page_blocks("docs/protocols/jesync.md", "", "Groups")
        server = UnitServer()
        replay_transcript(self, server, transcript)
        self.assertEqual(server.service.listing(), [])
