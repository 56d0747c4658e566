"""
Tests for the HTTP API's sessions and locks (L{jesync.http.locks}) over
real HTTP, with treq, in the real server (C{twistd jesync}'s service in
this process with C{--http-port}): the whole lifecycle, every error code
of these routes, long polls (answered, cancelled by a client that goes,
answered C{not_granted} when the server stops), a session's TTL running
out, HTTP and JESync (and elock) on one key, and TLS.
"""

from __future__ import annotations

from unittest import mock
from urllib.parse import quote

from twisted.internet.defer import CancelledError, inlineCallbacks, succeed
from twisted.web.client import ResponseNeverReceived
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

from jesync.http.listener import MAX_BODY
from tests.http_client import HttpClient, base_url, start_http
from tests.server_case import ServerTestCase
from tests.support import wait_until, write_file
from tests.tls_certificates import make_certificate, skip_without_tls, ssl_port


@implementer(IBodyProducer)
class ChunkedBody:
    """A request body of unknown length (sent chunked), in C{pieces}."""

    length = UNKNOWN_LENGTH

    def __init__(self, pieces) -> None:
        self.pieces = pieces

    def startProducing(self, consumer):
        for piece in self.pieces:
            consumer.write(piece)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class HttpCase(ServerTestCase):
    @inlineCallbacks
    def serve(self, *argv: str, elock: bool = True, **options):
        self.server, self.port = yield start_http(self, *argv, elock=elock)
        self.http = HttpClient(self, base_url(self.port), **options)
        return self.server

    @inlineCallbacks
    def session(self, ttl: float = 30, client=None):
        created = yield (client or self.http).post("/v1/sessions", {"ttl": ttl})
        self.assertEqual(created.status, 201, created)
        return created.json["session"]

    @inlineCallbacks
    def assertError(self, calling, status: int, code: str, **extra):
        """C{calling} (a Deferred of a response) fires with the error C{status} and C{code} (and C{extra} fields)."""
        response = yield calling
        self.assertEqual((response.status, response.json and response.json.get("code")), (status, code), response)
        self.assertEqual(response.header("content-type"), "application/json")
        self.assertIsInstance(response.json["message"], str)
        for name, value in extra.items():
            self.assertEqual(response.json[name], value)
        return response


class LifecycleTests(HttpCase):
    @inlineCallbacks
    def test_lifecycle(self):
        """Create, acquire (a token), info, the key's detail and listing, renew, release, end."""
        yield self.serve()
        session = yield self.session(ttl=20)
        acquired = yield self.http.post("/v1/acquire", {"session": session, "key": "k", "value": "me"})
        self.assertEqual(acquired.status, 200)
        (grant,) = acquired.json["grants"]
        self.assertEqual(
            {name: grant[name] for name in ("key", "mode", "max_concurrent", "expires_in", "value")},
            {"key": "k", "mode": "exclusive", "max_concurrent": 1, "expires_in": None, "value": "me"},
        )
        self.assertIsInstance(grant["token"], int)
        self.assertRegex(grant["peer"], r"^127\.0\.0\.1:\d+ \(http\)$")

        info = yield self.http.post("/v1/sessions/info", {"session": session})
        self.assertEqual(info.json["attached"], False)
        self.assertEqual(info.json["ttl"], 20.0)
        self.assertEqual([each["token"] for each in info.json["grants"]], [grant["token"]])

        detail = yield self.http.get("/v1/locks/k")
        self.assertEqual((detail.json["held"], detail.json["mode"], detail.json["waiters_total"]), (True, "exclusive", 0))
        self.assertEqual([each["token"] for each in detail.json["holders"]], [grant["token"]])

        listing = yield self.http.get("/v1/locks")
        self.assertEqual(
            listing.json, {"locks": [{"key": "k", "mode": "exclusive", "holders": 1, "waiters": 0}], "next": None, "keys": 1}
        )
        sessions = yield self.http.get("/v1/sessions")
        self.assertEqual((sessions.json["total"], sessions.json["detached"]), (1, 1))
        self.assertEqual(sessions.json["sessions"][0]["locks"], 1)
        self.assertNotIn(session, sessions.body.decode())

        renewed = yield self.http.post("/v1/renew", {"session": session, "key": "k", "expires": 50, "value": "again"})
        (again,) = renewed.json["grants"]
        self.assertEqual((again["token"], again["value"]), (grant["token"], "again"))
        self.assertTrue(0 < again["expires_in"] <= 50)

        kept = yield self.http.post("/v1/sessions/keepalive", {"session": session})
        self.assertEqual((kept.status, kept.json["ttl"]), (200, 20.0))
        self.assertTrue(19 < kept.json["expires_in"] <= 20)

        released = yield self.http.post("/v1/release", {"session": session, "key": "k"})
        self.assertEqual(released.json, {"released": ["k"]})
        detail = yield self.http.get("/v1/locks/k")
        self.assertEqual(
            detail.json, {"key": "k", "held": False, "mode": None, "holders": [], "waiters": [], "waiters_total": 0}
        )
        yield self.http.post("/v1/acquire", {"session": session, "key": "k2"})
        ended = yield self.http.post("/v1/sessions/end", {"session": session})
        self.assertEqual(ended.json, {"session": session, "released": 1})
        self.assertEqual(self.server.locks.listing(), [])

    @inlineCallbacks
    def test_keys_all_or_nothing(self):
        """Several keys: none granted while one is busy (409 lists it), all in the order asked once free."""
        yield self.serve()
        jesync = yield self.server.jesync()
        self.assertEqual((yield jesync.ask(b"lock b\n")), b"GRANTED 1 0 b 120\n")
        session = yield self.session()
        refused = yield self.assertError(
            self.http.post("/v1/acquire", {"session": session, "keys": ["c", "b", "a"]}), 409, "not_granted"
        )
        self.assertEqual(refused.json["busy"], ["b"])
        self.assertEqual(self.server.locks.status("a").granted, 0)
        yield jesync.ask(b"release b\n")
        granted = yield self.http.post("/v1/acquire", {"session": session, "keys": ["c", "b", "a", "b"]})
        self.assertEqual([grant["key"] for grant in granted.json["grants"]], ["c", "b", "a"])
        released = yield self.http.post("/v1/release", {"session": session, "keys": ["a", "x", "b"]})
        self.assertEqual(released.json["released"], ["a", "b"])

    @inlineCallbacks
    def test_shared_max_concurrent_and_expiry(self):
        """Shared holders together, an exclusive one refused; a semaphore of 2; an expiry shown."""
        yield self.serve()
        one, two, three = (yield self.session()), (yield self.session()), (yield self.session())
        for session in (one, two):
            granted = yield self.http.post("/v1/acquire", {"session": session, "key": "s", "shared": True})
            self.assertEqual(granted.json["grants"][0]["mode"], "shared")
        yield self.assertError(self.http.post("/v1/acquire", {"session": three, "key": "s"}), 409, "not_granted")
        detail = yield self.http.get("/v1/locks/s")
        self.assertEqual((detail.json["mode"], len(detail.json["holders"])), ("shared", 2))
        for session in (one, two):
            yield self.http.post("/v1/acquire", {"session": session, "key": "m", "max_concurrent": 2, "expires": 30})
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": three, "key": "m", "max_concurrent": 2}), 409, "not_granted"
        )
        detail = yield self.http.get("/v1/locks/m")
        self.assertTrue(all(0 < holder["expires_in"] <= 30 for holder in detail.json["holders"]))

    @inlineCallbacks
    def test_key_in_the_path_is_percent_encoded(self):
        """GET /v1/locks/{key}: a key with a slash and non-ASCII text, percent-encoded as one segment."""
        yield self.serve()
        session = yield self.session()
        key = "jobs/été"
        yield self.http.post("/v1/acquire", {"session": session, "key": key})
        detail = yield self.http.get("/v1/locks/" + quote(key, safe=""))
        self.assertEqual((detail.json["key"], detail.json["held"]), (key, True))
        yield self.assertError(self.http.get("/v1/locks/" + quote("a b", safe="")), 400, "invalid_key")

    @inlineCallbacks
    def test_listing_pages(self):
        """GET /v1/locks: pages in key order after a cursor, a prefix, most waiters first."""
        yield self.serve()
        session = yield self.session()
        yield self.http.post("/v1/acquire", {"session": session, "keys": ["a1", "a2", "a3", "b1", "b2"]})
        waiter = yield self.server.jesync()
        waiter.send(b"lock b2\n")
        yield wait_until(lambda: self.server.locks.status("b2").waiting == 1)
        first = yield self.http.get("/v1/locks?limit=2")
        self.assertEqual(([row["key"] for row in first.json["locks"]], first.json["next"], first.json["keys"]), (["a1", "a2"], "a2", 5))
        second = yield self.http.get("/v1/locks?limit=2&after=a2")
        self.assertEqual([row["key"] for row in second.json["locks"]], ["a3", "b1"])
        last = yield self.http.get("/v1/locks?limit=2&after=b1")
        self.assertEqual(([row["key"] for row in last.json["locks"]], last.json["next"]), (["b2"], None))
        prefixed = yield self.http.get("/v1/locks?prefix=b")
        self.assertEqual(([row["key"] for row in prefixed.json["locks"]], prefixed.json["keys"]), (["b1", "b2"], 2))
        top = yield self.http.get("/v1/locks?order=waiters&limit=1")
        self.assertEqual(top.json["locks"], [{"key": "b2", "mode": "exclusive", "holders": 1, "waiters": 1}])
        following = yield self.http.get("/v1/locks?order=waiters&limit=1&after=" + top.json["next"])
        self.assertEqual([row["key"] for row in following.json["locks"]], ["a1"])
        detail = yield self.http.get("/v1/locks/b2")
        (waiting,) = detail.json["waiters"]
        self.assertEqual((waiting["mode"], waiting["max_concurrent"]), ("exclusive", 1))
        self.assertEqual(waiting["peer"], waiter.served.peer)
        yield self.http.post("/v1/sessions/end", {"session": session})
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 b2 120\n")


class ErrorTests(HttpCase):
    @inlineCallbacks
    def test_bad_input(self):
        """400: not JSON, not an object, a bad field, a bad key, a value too long."""
        yield self.serve()
        session = yield self.session()
        yield self.assertError(self.http.call("POST", "/v1/acquire", data=b"{nope"), 400, "invalid_json")
        yield self.assertError(self.http.call("POST", "/v1/acquire", data=b"[1]"), 400, "invalid_json")
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": session, "key": "k", "wait": "soon"}),
            400,
            "invalid_parameter",
            parameter="wait",
        )
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": session}), 400, "invalid_parameter", parameter="key"
        )
        yield self.assertError(self.http.post("/v1/sessions", {"ttl": 0}), 400, "invalid_parameter", parameter="ttl")
        yield self.assertError(self.http.post("/v1/acquire", {"session": session, "key": "a b"}), 400, "invalid_key")
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": session, "key": "k", "value": "v" * 4097}), 400, "value_too_long"
        )
        yield self.assertError(self.http.post("/v1/renew", {"session": session, "key": "k"}), 400, "invalid_parameter")
        yield self.assertError(self.http.get("/v1/locks?order=sideways"), 400, "invalid_parameter")

    @inlineCallbacks
    def test_not_found_and_method(self):
        """404 for a session that is not (or no longer) there and for no route; 405 with Allow."""
        yield self.serve()
        for path in ("/v1/acquire", "/v1/release", "/v1/renew", "/v1/sessions/keepalive", "/v1/sessions/end", "/v1/sessions/info"):
            yield self.assertError(
                self.http.post(path, {"session": "nobody", "key": "k", "expires": 0}), 404, "no_such_session"
            )
        yield self.assertError(self.http.get("/v1/nothing"), 404, "not_found")
        refused = yield self.assertError(self.http.get("/v1/acquire"), 405, "method_not_allowed")
        self.assertEqual(refused.header("allow"), "POST")

    @inlineCallbacks
    def test_conflicts(self):
        """409: already waiting, a mode conflict, releasing or renewing what is not held."""
        yield self.serve()
        session = yield self.session()
        other = yield self.session()
        yield self.http.post("/v1/acquire", {"session": other, "key": "k"})
        waiting = self.http.post("/v1/acquire", {"session": session, "key": "k", "wait": 30})
        yield wait_until(lambda: self.server.locks.status("k").waiting == 1)
        second = HttpClient(self, base_url(self.port))
        yield self.assertError(second.post("/v1/acquire", {"session": session, "key": "k", "wait": 1}), 409, "already_waiting")
        yield second.post("/v1/acquire", {"session": session, "key": "s", "shared": True})
        yield self.assertError(second.post("/v1/acquire", {"session": session, "key": "s"}), 409, "mode_conflict")
        yield self.assertError(second.post("/v1/release", {"session": session, "key": "k"}), 409, "not_held")
        yield self.assertError(
            second.post("/v1/renew", {"session": session, "key": "k", "expires": 0}), 409, "not_held"
        )
        self.assertEqual(self.server.locks.grant_of("k", self.server.factories["elock"].sessions.find(session)), None)
        yield second.post("/v1/release", {"session": other, "key": "k"})
        granted = yield waiting
        self.assertEqual(granted.json["grants"][0]["key"], "k")

    @inlineCallbacks
    def test_limits(self):
        """429 for a per-client limit (max-held), 503 for the server's (max-keys, max-sessions)."""
        yield self.serve("--max-held", "1", "--max-keys", "2", "--max-sessions", "2")
        one, two = (yield self.session()), (yield self.session())
        yield self.http.post("/v1/acquire", {"session": one, "key": "a"})
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": one, "key": "b"}), 429, "limit_reached", limit="max-held", value=1
        )
        yield self.http.post("/v1/acquire", {"session": two, "key": "b"})
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": two, "key": "c"}), 429, "limit_reached", limit="max-held"
        )
        three = self.server.factories["elock"].sessions.find(two)
        self.assertIsNotNone(three)
        yield self.assertError(self.http.post("/v1/sessions", {}), 503, "limit_reached", limit="max-sessions", value=2)
        yield self.http.post("/v1/sessions/end", {"session": two})
        third = yield self.session()
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": third, "keys": ["x", "y"]}), 503, "limit_reached", limit="max-keys"
        )

    @inlineCallbacks
    def test_request_too_large(self):
        """413 for a Content-Length over 64 KiB (refused unread), and for a chunked body that grows past it."""
        yield self.serve()
        body = b'{"pad": "' + b"x" * MAX_BODY + b'"}'
        yield self.assertError(self.http.call("POST", "/v1/sessions", data=body), 413, "request_too_large")

        chunked = HttpClient(self, base_url(self.port))
        response = yield chunked.call("POST", "/v1/sessions", data=ChunkedBody([body[:1000], body[1000:]]))
        self.assertEqual((response.status, response.json["code"]), (413, "request_too_large"))
        small = yield self.http.post("/v1/sessions", {"ttl": 5})
        self.assertEqual(small.status, 201)


class AuthTests(HttpCase):
    @inlineCallbacks
    def test_bearer_token(self):
        """With --auth-token-file: 401 (WWW-Authenticate) without the token or with a wrong one; the token works."""
        path = write_file(self, b"sesame\n")
        yield self.serve("--auth-token-file", path)
        refused = yield self.assertError(self.http.post("/v1/sessions", {}), 401, "unauthorized")
        self.assertEqual(refused.header("www-authenticate"), 'Bearer realm="jesync"')
        yield self.assertError(self.http.get("/v1/locks", token="wrong"), 401, "unauthorized")
        created = yield self.http.post("/v1/sessions", {}, token="sesame")
        self.assertEqual(created.status, 201)
        granted = yield self.http.post("/v1/acquire", {"session": created.json["session"], "key": "k"}, token="sesame")
        self.assertEqual(granted.status, 200)

    @inlineCallbacks
    def test_protected_mode(self):
        """A client that is not local is refused at connect: 403 protected_mode (and not counted)."""
        yield self.serve()
        with mock.patch("jesync.metrics_connections.is_local", return_value=False):
            yield self.assertError(self.http.post("/v1/sessions", {}), 403, "protected_mode")
        self.assertEqual(len(self.server.policy.connections), 0)


class LongPollTests(HttpCase):
    @inlineCallbacks
    def test_client_gone_is_granted_nothing(self):
        """A long poll whose client disconnects is withdrawn: the key goes to the next JESync client at once."""
        yield self.serve()
        holder, later = (yield self.server.jesync()), (yield self.server.jesync())
        yield holder.ask(b"lock k\n")
        session = yield self.session()
        polling = HttpClient(self, base_url(self.port))
        poll = polling.post("/v1/acquire", {"session": session, "key": "k", "wait": 30})
        poll.addErrback(lambda failure: failure.trap(CancelledError, ResponseNeverReceived))
        yield wait_until(lambda: self.server.locks.status("k").waiting == 1)
        poll.cancel()  # (treq aborts the connection)
        yield wait_until(lambda: self.server.locks.status("k").waiting == 0)
        yield holder.ask(b"release k\n")
        self.assertEqual((yield later.ask(b"lock k 1 0\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual(self.server.locks.grants_of(self.server.factories["elock"].sessions.find(session)), [])

    @inlineCallbacks
    def test_http_then_jesync(self):
        """An HTTP session holds K, a JESync client waits, HTTP releases: JESync gets it."""
        yield self.serve()
        session = yield self.session()
        yield self.http.post("/v1/acquire", {"session": session, "key": "k"})
        waiter = yield self.server.jesync()
        waiter.send(b"lock k 1 -1\n")
        yield wait_until(lambda: self.server.locks.status("k").waiting == 1)
        yield self.http.post("/v1/release", {"session": session, "key": "k"})
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")

    @inlineCallbacks
    def test_jesync_then_http_long_poll(self):
        """A JESync client holds K, an HTTP long poll waits, JESync releases: the poll answers with the grant."""
        yield self.serve()
        holder = yield self.server.jesync()
        yield holder.ask(b"lock k\n")
        session = yield self.session()
        poll = self.http.post("/v1/acquire", {"session": session, "key": "k", "wait": -1})
        yield wait_until(lambda: self.server.locks.status("k").waiting == 1)
        yield holder.ask(b"release k\n")
        granted = yield poll
        self.assertEqual((granted.status, granted.json["grants"][0]["key"]), (200, "k"))

    @inlineCallbacks
    def test_long_poll_times_out(self):
        """A wait that runs out: 409 not_granted with the key in the way."""
        yield self.serve()
        holder = yield self.server.jesync()
        yield holder.ask(b"lock k\n")
        session = yield self.session()
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": session, "key": "k", "wait": 0.2}), 409, "not_granted", busy=["k"]
        )

    @inlineCallbacks
    def test_wait_is_capped(self):
        """--http-max-wait caps a long poll (and -1 means it)."""
        yield self.serve("--http-max-wait", "0.2")
        holder = yield self.server.jesync()
        yield holder.ask(b"lock k\n")
        session = yield self.session()
        yield self.assertError(
            self.http.post("/v1/acquire", {"session": session, "key": "k", "wait": 3600}), 409, "not_granted"
        )

    @inlineCallbacks
    def test_server_stopping_answers_long_polls(self):
        """The server stopping answers a pending long poll: 409 not_granted saying why."""
        yield self.serve()
        holder = yield self.server.jesync()
        yield holder.ask(b"lock k\n")
        session = yield self.session()
        poll = self.http.post("/v1/acquire", {"session": session, "key": "k", "wait": 30})
        yield wait_until(lambda: self.server.locks.status("k").waiting == 1)
        stopped = self.server.service.stopService()
        answer = yield self.assertError(poll, 409, "not_granted")
        self.assertIn("stopping", answer.json["message"])
        yield stopped


class SessionLifeTests(HttpCase):
    @inlineCallbacks
    def test_ttl_running_out_releases_locks(self):
        """A session whose TTL runs out ends: its locks go to the JESync client waiting."""
        yield self.serve()
        session = yield self.session(ttl=0.3)
        yield self.http.post("/v1/acquire", {"session": session, "key": "k"})
        waiter = yield self.server.jesync()
        self.assertEqual((yield waiter.ask(b"lock k 1 10\n")), b"GRANTED 1 0 k 120\n")
        yield self.assertError(self.http.post("/v1/sessions/keepalive", {"session": session}), 404, "no_such_session")

    @inlineCallbacks
    def test_elock_attaches_to_an_http_session(self):
        """An elock connection takes an HTTP session with conn_id: attached; detached (TTL running) when it goes."""
        yield self.serve()
        session = yield self.session(ttl=30)
        yield self.http.post("/v1/acquire", {"session": session, "key": "k"})
        elock = yield self.server.elock()
        self.assertEqual((yield elock.ask(b"conn_id " + session.encode() + b"\r\n")), b"200 conn id set\r\n")
        info = yield self.http.post("/v1/sessions/info", {"session": session})
        self.assertEqual((info.json["attached"], info.json["expires_in"]), (True, None))
        self.assertEqual(info.json["peer"], elock.served.peer)
        self.assertEqual([grant["key"] for grant in info.json["grants"]], ["k"])
        # (elock's unlock releases what the HTTP call took: one owner)
        self.assertEqual((yield elock.ask(b"unlock k\r\n")), b"200 Unlocked\r\n")
        yield self.server.drop(elock)
        info = yield self.http.post("/v1/sessions/info", {"session": session})
        self.assertEqual(info.json["attached"], False)
        self.assertRegex(info.json["peer"], r"\(http\)$")
        self.assertTrue(0 < info.json["expires_in"] <= 30)


class TLSTests(HttpCase):
    skip = skip_without_tls

    @inlineCallbacks
    def test_over_tls(self):
        """An ssl: --http-port serves the API over HTTPS: a session, a grant, a release."""
        key_path, certificate_path, pem = make_certificate(self)
        self.server, self.port = yield start_http(self, http_port=ssl_port(key_path, certificate_path))
        self.http = HttpClient(self, base_url(self.port, "https"), trust=pem)
        session = yield self.session()
        granted = yield self.http.post("/v1/acquire", {"session": session, "key": "k"})
        self.assertEqual(granted.json["grants"][0]["key"], "k")
        released = yield self.http.post("/v1/release", {"session": session, "key": "k"})
        self.assertEqual(released.json, {"released": ["k"]})
