"""
The HTTP API in cluster mode, over real HTTP: two cluster members in this
process (L{ClusterMember}, as C{twistd jesync --etcd --http-port} runs one)
on a real etcd.  Only the leader serves C{--http-port}; an HTTP session and
its grant (expiry, value, token) are durable before they are reported and
survive a failover, an empty session too; a long poll pending at the
step-down is answered 409 not_granted and granted nothing; the status's
term is the cluster's and grows with each leader.
"""

from __future__ import annotations

from typing import List

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from jesync.cluster.member import ClusterMember
from jesync.server import ServerSettings
from tests.cluster import TAKEOVER_WITHIN
from tests.cluster_members import InProcessMembers
from tests.http_client import HttpClient, base_url, http_listener
from tests.server_case import listening_port
from tests.support import LOCAL, wait_until


# The members' lease TTL: longer than the tests' usual (etcd's smallest, 2 s),
# since these members share the test's own process (and, under PyPy, its
# JIT's warm-up) with its HTTP clients: on a loaded machine a 2 s lease now
# and then lapsed before the failover the test makes (the leader stepped
# down by itself between two requests).  A resignation hands over at once
# whatever the TTL.
TTL = 5


class HttpFailoverTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.members = InProcessMembers(self, ServerSettings(ports=[], http_ports=[LOCAL]), TTL)

    @inlineCallbacks
    def http_of(self, member: ClusterMember):
        """The leader's API: a client of its --http-port, and the API itself."""
        child = http_listener(member.server)
        port = yield listening_port(child)
        return HttpClient(self, base_url(port)), child.factory.wrappedFactory.resource

    @inlineCallbacks
    def test_sessions_and_grants_survive_a_failover(self):
        first = self.members.member("first")
        yield first.when_leading().addTimeout(TAKEOVER_WITHIN * 3, reactor)
        second = self.members.member("second")
        http, api = yield self.http_of(first)
        first_term = api.context.describe()["server"]
        self.assertEqual(first_term["role"], "leader")
        self.assertIsInstance(first_term["term"], int)

        holding = (yield http.post("/v1/sessions", {"ttl": 20})).json["session"]
        empty = (yield http.post("/v1/sessions", {"ttl": 20})).json["session"]
        waiting = (yield http.post("/v1/sessions", {"ttl": 20})).json["session"]
        granted = yield http.post("/v1/acquire", {"session": holding, "key": "k", "expires": 30, "value": "v1"})
        (grant,) = granted.json["grants"]
        self.assertIsNone(first.term.journal.durable())  # (reported only once durable)
        poll = HttpClient(self, http.base).post("/v1/acquire", {"session": waiting, "key": "k", "wait": 30})
        outcome: List[object] = []
        poll.addBoth(outcome.append)
        yield wait_until(lambda: first.server.locks.status("k").waiting == 1)

        yield self.members.stop(first)
        yield wait_until(lambda: bool(outcome))
        # (a deposed leader's last words: not granted, which reports no change)
        refused = outcome[0]
        self.assertFalse(isinstance(refused, Failure), outcome)
        self.assertEqual((refused.status, refused.json["code"]), (409, "not_granted"))
        self.assertIn("stepped down", refused.json["message"])
        yield second.when_leading().addTimeout(TAKEOVER_WITHIN * 3, reactor)
        http, api = yield self.http_of(second)
        self.assertGreater(api.context.describe()["server"]["term"], first_term["term"])

        detail = yield http.get("/v1/locks/k")
        (holder,) = detail.json["holders"]
        self.assertEqual((holder["token"], holder["value"]), (grant["token"], "v1"))
        self.assertTrue(0 < holder["expires_in"] <= 30)
        self.assertEqual(detail.json["waiters"], [])
        info = yield http.post("/v1/sessions/info", {"session": holding})
        self.assertEqual([each["key"] for each in info.json["grants"]], ["k"])
        kept = yield http.post("/v1/sessions/keepalive", {"session": empty})
        self.assertEqual(kept.status, 200)
        ended = yield http.post("/v1/sessions/end", {"session": holding})
        self.assertEqual(ended.json["released"], 1)
