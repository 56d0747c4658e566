"""
Elections and groups over HTTP (L{jesync.http.coordination}) on a Clock,
through twisted.web's channel: each route's replies and every error code
it answers with; long polls withdrawn when their client goes; what a
session's end does to its leadership and memberships; replies that report
a change held until durable in cluster mode.
"""

from __future__ import annotations

from typing import Any, List, Optional

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from jesync.connections.policy import IDurability
from jesync.http import coordination, status, streams
from jesync.wire import election_key, member_key
from tests.http_unit import UnitApi

ROUTES = streams.ROUTES + coordination.ROUTES + status.ROUTES


class ElectionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES, max_wait=30)
        self.first = self.server.session(ttl=300)
        self.second = self.server.session(ttl=300)

    def campaign(self, session: str, **fields: Any):
        return self.server.ask("POST", "/v1/elections/e/campaign", {"session": session, **fields})

    def assertError(self, response, status: int, code: str) -> dict:
        self.assertEqual((response.status, response.json()["code"]), (status, code), response.body)
        return response.json()

    def test_campaign(self) -> None:
        """A free election: led at once, the session's grant of election:<name> (no expiry), its value."""
        response = self.campaign(self.first, value="host-1:80")
        self.assertEqual(response.status, 200)
        leader = response.json()["leader"]
        self.assertEqual(
            (leader["key"], leader["mode"], leader["max_concurrent"], leader["expires_in"], leader["value"]),
            ("election:e", "exclusive", 1, None, "host-1:80"),
        )
        [grant] = self.server.locks.holders(election_key("e"))
        self.assertEqual((grant.owner.id, grant.token), (self.first, leader["token"]))

    def test_not_granted(self) -> None:
        """Led by another, no wait: 409 not_granted, naming the busy key."""
        self.campaign(self.first)
        error = self.assertError(self.campaign(self.second), 409, "not_granted")
        self.assertEqual(error["busy"], ["election:e"])

    def test_long_poll(self) -> None:
        """A candidate waits (GET counts it) until the leader resigns, then leads."""
        self.campaign(self.first)
        candidate = self.server.connect()
        candidate.send("POST", "/v1/elections/e/campaign", {"session": self.second, "value": "b", "wait": 10})
        self.assertIsNone(candidate.response())
        election = self.server.ask("GET", "/v1/elections/e").json()
        self.assertEqual((election["election"], election["candidates"]), ("e", 1))
        self.assertEqual(election["leader"]["peer"], self.server.sessions.find(self.first).peer)
        self.assertEqual(self.server.ask("POST", "/v1/elections/e/resign", {"session": self.first}).json(), {"resigned": True})
        self.assertEqual(candidate.response().json()["leader"]["value"], "b")
        election = self.server.ask("GET", "/v1/elections/e").json()
        self.assertEqual((election["leader"]["value"], election["candidates"]), ("b", 0))

    def test_long_poll_times_out(self) -> None:
        """A wait that runs out: 409 not_granted; -1 or more than --http-max-wait: --http-max-wait."""
        self.campaign(self.first)
        candidate = self.server.connect()
        candidate.send("POST", "/v1/elections/e/campaign", {"session": self.second, "wait": -1})
        self.server.clock.advance(29.9)
        self.assertIsNone(candidate.response())
        self.server.clock.advance(0.1)
        self.assertError(candidate.response(), 409, "not_granted")
        self.assertEqual(self.server.locks.status(election_key("e")).waiting, 0)

    def test_client_gone(self) -> None:
        """A candidate whose client went away is withdrawn: the lead goes to nobody."""
        self.campaign(self.first)
        candidate = self.server.connect()
        candidate.send("POST", "/v1/elections/e/campaign", {"session": self.second, "wait": 10})
        candidate.lose()
        self.assertEqual(self.server.locks.status(election_key("e")).waiting, 0)
        self.server.ask("POST", "/v1/elections/e/resign", {"session": self.first})
        self.assertEqual(self.server.ask("GET", "/v1/elections/e").json()["leader"], None)

    def test_already_waiting(self) -> None:
        """A session with a campaign waiting campaigns again: 409 already_waiting."""
        self.campaign(self.first)
        self.server.connect().send("POST", "/v1/elections/e/campaign", {"session": self.second, "wait": 10})
        self.assertError(self.campaign(self.second, wait=10), 409, "already_waiting")

    def test_campaign_again(self) -> None:
        """The leader campaigning again keeps its lead and token, with a new value if it sends one."""
        token = self.campaign(self.first, value="a").json()["leader"]["token"]
        self.server.clock.advance(1)
        again = self.campaign(self.first).json()["leader"]
        self.assertEqual((again["token"], again["value"], again["held_for"]), (token, "a", 1.0))
        self.assertEqual(self.campaign(self.first, value="b").json()["leader"]["value"], "b")

    def test_resign_not_leader(self) -> None:
        """Resigning what it does not lead: 409 not_leader (a candidate too)."""
        self.assertError(self.server.ask("POST", "/v1/elections/e/resign", {"session": self.first}), 409, "not_leader")
        self.campaign(self.first)
        self.assertError(self.server.ask("POST", "/v1/elections/e/resign", {"session": self.second}), 409, "not_leader")

    def test_proclaim(self) -> None:
        """The leader's new value, same token; anyone else: 409 not_leader; a value is required."""
        token = self.campaign(self.first, value="a").json()["leader"]["token"]
        proclaimed = self.server.ask("POST", "/v1/elections/e/proclaim", {"session": self.first, "value": "b"})
        self.assertEqual((proclaimed.json()["leader"]["value"], proclaimed.json()["leader"]["token"]), ("b", token))
        self.assertEqual(self.server.locks.holders(election_key("e"))[0].value, b"b")
        refused = self.server.ask("POST", "/v1/elections/e/proclaim", {"session": self.second, "value": "c"})
        self.assertError(refused, 409, "not_leader")
        for body in ({"session": self.first}, {"session": self.first, "value": None}, {"session": self.first, "value": 1}):
            error = self.assertError(self.server.ask("POST", "/v1/elections/e/proclaim", body), 400, "invalid_parameter")
            self.assertEqual(error["parameter"], "value")

    def test_bad_input(self) -> None:
        """No such session: 404; a name that is no key: 400 invalid_key; a value too long: 400 value_too_long."""
        self.assertError(self.campaign("nobody"), 404, "no_such_session")
        self.assertError(self.server.ask("POST", "/v1/elections/e/resign", {"session": "nobody"}), 404, "no_such_session")
        self.assertError(self.server.ask("POST", "/v1/elections/a%20b/campaign", {"session": self.first}), 400, "invalid_key")
        self.assertError(self.server.ask("GET", "/v1/elections/" + "e" * 1020), 400, "invalid_key")
        self.assertError(self.campaign(self.first, value="v" * 4097), 400, "value_too_long")
        self.assertError(self.campaign(self.first, wait="soon"), 400, "invalid_parameter")
        self.assertError(self.server.ask("GET", "/v1/elections/e/campaign"), 405, "method_not_allowed")
        self.assertEqual(self.server.locks.totals().keys, 0)

    def test_session_end_resigns(self) -> None:
        """A session that ends (its TTL, or an end) gives up its lead: the candidate leads."""
        self.campaign(self.first)
        candidate = self.server.connect()
        candidate.send("POST", "/v1/elections/e/campaign", {"session": self.second, "wait": 10})
        self.server.sessions.find(self.first).end()
        self.assertEqual(candidate.response().status, 200)


class GroupTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(ROUTES)
        self.session = self.server.session()

    def ask(self, method: str, path: str, body: Optional[dict] = None):
        return self.server.ask(method, path, body)

    def assertError(self, response, status: int, code: str) -> None:
        self.assertEqual((response.status, response.json()["code"]), (status, code), response.body)

    def join(self, member: str, capabilities: Optional[str] = None, session: Optional[str] = None):
        body = {"session": session or self.session, "member": member}
        if capabilities is not None:
            body["capabilities"] = capabilities
        return self.ask("POST", "/v1/groups/g/join", body)

    def test_lifecycle(self) -> None:
        """Create (201), join, members in join order, update, leave, delete; groups listed sorted."""
        created = self.ask("POST", "/v1/groups/g")
        self.assertEqual((created.status, created.json()), (201, {"group": "g"}))
        self.ask("POST", "/v1/groups/a")
        self.assertEqual(self.ask("GET", "/v1/groups").json(), {"groups": ["a", "g"]})
        joined = self.join("m1", "cpu=4").json()
        [grant] = self.server.locks.holders(member_key("g", "m1"))
        self.assertEqual(joined, {"group": "g", "member": "m1", "token": grant.token})
        self.assertEqual((grant.owner.id, grant.expires_at, grant.value), (self.session, None, b"cpu=4"))
        self.join("m0")
        members = self.ask("GET", "/v1/groups/g").json()
        peer = self.server.sessions.find(self.session).peer
        self.assertEqual(
            members,
            {
                "group": "g",
                "members": [
                    {"member": "m1", "peer": peer, "token": grant.token, "capabilities": "cpu=4"},
                    {"member": "m0", "peer": peer, "token": grant.token + 1, "capabilities": None},
                ],
            },
        )
        updated = self.ask("POST", "/v1/groups/g/update", {"session": self.session, "member": "m1", "capabilities": "cpu=8"})
        self.assertEqual(updated.json(), {"group": "g", "member": "m1", "capabilities": "cpu=8"})
        self.assertEqual(self.server.groups.members("g")["m1"], b"cpu=8")
        for member in ("m1", "m0"):
            left = self.ask("POST", "/v1/groups/g/leave", {"session": self.session, "member": member})
            self.assertEqual(left.json(), {"group": "g", "member": member, "left": True})
        self.assertEqual(self.ask("DELETE", "/v1/groups/g").json(), {"group": "g", "deleted": True})
        self.assertEqual(self.ask("GET", "/v1/groups").json(), {"groups": ["a"]})

    def test_group_errors(self) -> None:
        """group_exists, group_key_taken, group_not_found, group_not_empty, and the groups' limit (503)."""
        self.ask("POST", "/v1/groups/g")
        self.assertError(self.ask("POST", "/v1/groups/g"), 409, "group_exists")
        self.server.locks.request("group:taken", "someone", 1, 0, 0)
        self.assertError(self.ask("POST", "/v1/groups/taken"), 409, "group_key_taken")
        for method, path in [("DELETE", "/v1/groups/none"), ("GET", "/v1/groups/none")]:
            self.assertError(self.ask(method, path), 404, "group_not_found")
        self.assertError(self.ask("POST", "/v1/groups/none/join", {"session": self.session, "member": "m"}), 404, "group_not_found")
        self.join("m")
        self.assertError(self.ask("DELETE", "/v1/groups/g"), 409, "group_not_empty")
        self.server.groups.max_groups = 1
        response = self.ask("POST", "/v1/groups/h")
        self.assertError(response, 503, "limit_reached")
        self.assertEqual(response.json()["limit"], "max-groups")
        self.assertError(self.ask("POST", "/v1/groups/a%2Fb"), 400, "invalid_parameter")
        self.assertError(self.ask("POST", "/v1/groups/a%20b"), 400, "invalid_key")

    def test_member_errors(self) -> None:
        """member_exists (another session too), not_member for leave and update, no_such_session, bad input."""
        self.ask("POST", "/v1/groups/g")
        self.join("m")
        self.assertError(self.join("m"), 409, "member_exists")
        other = self.server.session()
        self.assertError(self.join("m", session=other), 409, "member_exists")
        for route in ("leave", "update"):
            body = {"session": other, "member": "m", "capabilities": "x"}
            self.assertError(self.ask("POST", f"/v1/groups/g/{route}", body), 409, "not_member")
            body["session"] = "nobody"
            self.assertError(self.ask("POST", f"/v1/groups/g/{route}", body), 404, "no_such_session")
        self.assertError(self.ask("POST", "/v1/groups/g/update", {"session": self.session, "member": "m"}), 400, "invalid_parameter")
        self.assertError(self.join("a b"), 400, "invalid_key")
        self.assertError(self.join("n", capabilities="c" * 4097), 400, "value_too_long")
        self.assertError(self.ask("POST", "/v1/groups/g/join", {"session": self.session}), 400, "invalid_parameter")
        self.server.groups.max_members = 1
        response = self.join("n")
        self.assertError(response, 503, "limit_reached")
        self.assertEqual(self.server.groups.members("g"), {"m": None})

    def test_session_end_leaves(self) -> None:
        """A session that ends (its TTL run out) leaves every group it joined."""
        self.ask("POST", "/v1/groups/g")
        self.join("m")
        self.server.clock.advance(30)
        self.assertIsNone(self.server.sessions.find(self.session))
        self.assertEqual(self.ask("GET", "/v1/groups/g").json()["members"], [])


@implementer(IDurability)
class Journal:
    """Durable when told (L{settle})."""

    def __init__(self) -> None:
        self.pending: List[Deferred[None]] = []

    def durable(self) -> Optional[Deferred[None]]:
        waiting: Deferred[None] = Deferred()
        self.pending.append(waiting)
        return waiting

    def settle(self) -> None:
        pending, self.pending = self.pending, []
        for waiting in pending:
            waiting.callback(None)


class DurableTests(SynchronousTestCase):
    """In cluster mode the replies that report a change wait for the journal; the others do not."""

    def test_changes_wait(self) -> None:
        server = UnitApi(ROUTES)
        journal = server.policy.durability = Journal()
        session = server.session()
        changes = [
            ("POST", "/v1/elections/e/campaign", {"session": session}),
            ("POST", "/v1/elections/e/proclaim", {"session": session, "value": "v"}),
            ("POST", "/v1/elections/e/resign", {"session": session}),
            ("POST", "/v1/groups/g", None),
            ("POST", "/v1/groups/g/join", {"session": session, "member": "m"}),
            ("POST", "/v1/groups/g/update", {"session": session, "member": "m", "capabilities": "c"}),
            ("POST", "/v1/groups/g/leave", {"session": session, "member": "m"}),
            ("DELETE", "/v1/groups/g", None),
        ]
        for method, path, body in changes:
            client = server.connect()
            client.send(method, path, body)
            self.assertIsNone(client.response(), path)
            journal.settle()
            self.assertIn(client.response().status, (200, 201), path)
        for path in ("/v1/elections/e", "/v1/groups", "/v1/status"):
            self.assertEqual(server.ask("GET", path).status, 200)
        self.assertEqual(journal.pending, [])
