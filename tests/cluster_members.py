"""
Cluster members in the test's own process (L{ClusterMember}, as C{twistd
jesync --etcd ...} runs one), on the shared etcd: the etcd-tier tests that
look inside a member (its lock table, its journal, its HTTP API) start
them with L{InProcessMembers.member}; each resigns, once, when the test
ends, or when the test stops it first.
"""

from __future__ import annotations

from typing import List

from twisted.internet import reactor
from twisted.internet.defer import Deferred

from jesync.cluster.etcd import EtcdClient
from jesync.cluster.member import ClusterMember
from jesync.server import ServerSettings, build_lock_server
from tests.cluster import TTL
from tests.etcd_server import shared_etcd


class InProcessMembers:
    """
    The members of C{testcase}'s cluster (named by the test's id), each
    serving C{settings} while it leads, with leases of C{ttl} seconds.
    """

    def __init__(self, testcase, settings: ServerSettings, ttl: int = TTL) -> None:
        self.testcase = testcase
        self.settings = settings
        self.ttl = ttl
        self.stopped: List[ClusterMember] = []

    def member(self, name: str) -> ClusterMember:
        """A new member, started (it listens on nothing of its own: it joins the election at once)."""
        etcd = EtcdClient(reactor, [shared_etcd().endpoint], 2.0)
        self.testcase.addCleanup(etcd.close)
        member = ClusterMember(
            reactor, self.settings, etcd, self.testcase.id(), self.ttl, build_lock_server, name=name
        )
        member.startService()
        self.testcase.addCleanup(self.stop, member)
        return member

    def stop(self, member: ClusterMember) -> Deferred[None]:
        """Resign if leading, as stopService does, without exiting the process (once: a cleanup too)."""
        if member in self.stopped:
            return member.stop_listening()
        self.stopped.append(member)
        return member.stop().addBoth(lambda _: member.stop_listening())
