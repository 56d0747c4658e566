"""
Elections and groups over real HTTP (L{jesync.http.coordination}), with
treq, in the real server (C{twistd jesync}'s service in this process with
C{--http-port}): an election between two HTTP sessions that an observer
watches, and a group's lifecycle that a JESync client sees.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks

from tests.http_client import HttpClient, base_url, start_http
from tests.http_events import open_stream
from tests.server_case import ServerTestCase
from tests.support import wait_until


class CoordinationCase(ServerTestCase):
    @inlineCallbacks
    def serve(self, *argv: str):
        self.server, self.port = yield start_http(self, *argv)
        self.http = HttpClient(self, base_url(self.port))
        return self.server

    @inlineCallbacks
    def session(self):
        created = yield self.http.post("/v1/sessions", {"ttl": 30})
        self.assertEqual(created.status, 201, created)
        return created.json["session"]


class ElectionTests(CoordinationCase):
    @inlineCallbacks
    def test_election(self):
        """
        Two sessions campaign: the first leads, the second long-polls; the
        first resigns and the second leads; an observer sees both.
        """
        yield self.serve()
        first, second = (yield self.session()), (yield self.session())
        observer = yield open_stream(self.http, "/v1/elections/db/observe")
        yield observer.wait_for(1)
        led = yield self.http.post("/v1/elections/db/campaign", {"session": first, "value": "db-1:5432"})
        self.assertEqual((led.status, led.json["leader"]["value"]), (200, "db-1:5432"))
        candidate = HttpClient(self, base_url(self.port))
        campaign = candidate.post("/v1/elections/db/campaign", {"session": second, "value": "db-2:5432", "wait": 10})
        yield wait_until(lambda: self.server.locks.status("election:db").waiting == 1)
        election = yield self.http.get("/v1/elections/db")
        self.assertEqual((election.json["leader"]["value"], election.json["candidates"]), ("db-1:5432", 1))
        refused = yield self.http.post("/v1/elections/db/proclaim", {"session": second, "value": "me"})
        self.assertEqual((refused.status, refused.json["code"]), (409, "not_leader"))
        resigned = yield self.http.post("/v1/elections/db/resign", {"session": first})
        self.assertEqual(resigned.json, {"resigned": True})
        won = yield campaign
        self.assertEqual((won.status, won.json["leader"]["value"]), (200, "db-2:5432"))
        self.assertGreater(won.json["leader"]["token"], led.json["leader"]["token"])
        yield observer.wait_for(4)
        leaders = [data["leader"] and data["leader"]["value"] for name, data in observer.events if name == "leader"]
        self.assertEqual(leaders, [None, "db-1:5432", None, "db-2:5432"])
        observer.check()
        observer.close()
        yield wait_until(lambda: self.server.locks.watch_count == 0)

    @inlineCallbacks
    def test_jesync_client_leads(self):
        """An election led by a JESync client holding election:<name>: GET shows it; an HTTP candidate gets it after."""
        yield self.serve()
        jesync = yield self.server.jesync()
        yield jesync.ask(b"lock election:e 1 0 0 jesync-leader\n")
        election = yield self.http.get("/v1/elections/e")
        self.assertEqual(election.json["leader"]["value"], "jesync-leader")
        session = yield self.session()
        campaign = self.http.post("/v1/elections/e/campaign", {"session": session, "wait": 10})
        yield wait_until(lambda: self.server.locks.status("election:e").waiting == 1)
        yield jesync.ask(b"release election:e\n")
        self.assertEqual((yield campaign).status, 200)


class GroupTests(CoordinationCase):
    @inlineCallbacks
    def test_lifecycle(self):
        """Create, join over HTTP (a JESync client's group-members lists the member), leave, delete."""
        yield self.serve()
        session = yield self.session()
        created = yield self.http.post("/v1/groups/workers")
        self.assertEqual((created.status, created.json), (201, {"group": "workers"}))
        joined = yield self.http.post("/v1/groups/workers/join", {"session": session, "member": "w1", "capabilities": "gpu"})
        self.assertEqual(joined.status, 200)
        token = joined.json["token"]
        jesync = yield self.server.jesync()
        yield jesync.ask(b"group-join workers w2 0\n")
        members = yield self.http.get("/v1/groups/workers")
        self.assertEqual([(m["member"], m["capabilities"]) for m in members.json["members"]], [("w1", "gpu"), ("w2", None)])
        self.assertEqual(members.json["members"][0]["token"], token)
        jesync.send(b"group-members workers\n")
        seen = yield jesync.read_lines(3)
        fields = seen[0].split()
        self.assertEqual(fields[:3] + fields[4:], [b"MEMBER", b"workers", b"w1", str(token).encode(), b"gpu"])
        self.assertTrue(members.json["members"][0]["peer"].startswith(fields[3].decode().split("_")[0]))  # (its address)
        self.assertEqual(seen[2], b"END\n")
        updated = yield self.http.post("/v1/groups/workers/update", {"session": session, "member": "w1", "capabilities": "gpu,ssd"})
        self.assertEqual(updated.json["capabilities"], "gpu,ssd")
        not_empty = yield self.http.call("DELETE", "/v1/groups/workers")
        self.assertEqual((not_empty.status, not_empty.json["code"]), (409, "group_not_empty"))
        left = yield self.http.post("/v1/groups/workers/leave", {"session": session, "member": "w1"})
        self.assertEqual(left.json, {"group": "workers", "member": "w1", "left": True})
        yield jesync.ask(b"group-leave workers w2\n")
        deleted = yield self.http.call("DELETE", "/v1/groups/workers")
        self.assertEqual(deleted.json, {"group": "workers", "deleted": True})
        self.assertEqual((yield self.http.get("/v1/groups")).json, {"groups": []})
        self.assertEqual((yield jesync.ask(b"groups\n")), b"END\n")
