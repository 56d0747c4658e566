"""
The HTTP API's OpenAPI 3.1 document (C{jesync/http/openapi.json}, package
data of C{jesync.http}) is valid by openapi-spec-validator, has every route
and every error code of the API, and C{tests.openapi_check.check_response}
(what every HTTP test's replies go through) passes replies that match it and
fails those that do not.  The replies here are made by hand: the server's
own are checked by the HTTP tests.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Set

from openapi_spec_validator import validate
from twisted.trial.unittest import SynchronousTestCase

from tests.openapi_check import check_response, load_document, parse_events

ROOT = Path(__file__).resolve().parents[2]

# Every route of the API (the agreed design's), as (method, path template).
ROUTES = [
    ("get", "/"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/status"),
    ("get", "/v1/status/stream"),
    ("post", "/v1/sessions"),
    ("get", "/v1/sessions"),
    ("post", "/v1/sessions/keepalive"),
    ("post", "/v1/sessions/end"),
    ("post", "/v1/sessions/info"),
    ("post", "/v1/acquire"),
    ("post", "/v1/release"),
    ("post", "/v1/renew"),
    ("get", "/v1/locks"),
    ("get", "/v1/locks/{key}"),
    ("get", "/v1/elections/{name}"),
    ("post", "/v1/elections/{name}/campaign"),
    ("post", "/v1/elections/{name}/resign"),
    ("post", "/v1/elections/{name}/proclaim"),
    ("get", "/v1/elections/{name}/observe"),
    ("get", "/v1/groups"),
    ("post", "/v1/groups/{name}"),
    ("delete", "/v1/groups/{name}"),
    ("get", "/v1/groups/{name}"),
    ("post", "/v1/groups/{name}/join"),
    ("post", "/v1/groups/{name}/leave"),
    ("post", "/v1/groups/{name}/update"),
    ("get", "/v1/watch"),
]
# The routes anyone may read, token or not.
PUBLIC = {("get", "/"), ("get", "/v1/openapi.json")}
# Every error code, with the status it comes with.
ERROR_CODES = {
    "invalid_json": 400,
    "invalid_parameter": 400,
    "invalid_key": 400,
    "value_too_long": 400,
    "unauthorized": 401,
    "protected_mode": 403,
    "no_such_session": 404,
    "not_found": 404,
    "group_not_found": 404,
    "method_not_allowed": 405,
    "not_granted": 409,
    "already_waiting": 409,
    "mode_conflict": 409,
    "not_held": 409,
    "not_leader": 409,
    "group_exists": 409,
    "group_key_taken": 409,
    "group_not_empty": 409,
    "member_exists": 409,
    "not_member": 409,
    "request_too_large": 413,
    "limit_reached": 429,
    "unavailable": 503,
    "internal_error": 500,
}
# The shared error replies (components/responses), by status.
ERROR_REPLIES = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "TooLarge",
    429: "TooManyRequests",
    500: "InternalError",
    503: "Unavailable",
}
TAGS = {"sessions", "locks", "elections", "groups", "watches", "status"}
# The event streams, and the events each sends (each ends with `end` when the server ends it).
SSE_ROUTES = {
    ("get", "/v1/status/stream"): {"status", "end"},
    ("get", "/v1/elections/{name}/observe"): {"leader", "end"},
    ("get", "/v1/watch"): {"snapshot", "granted", "released", "expired", "lost", "appeared", "disappeared", "end"},
}
# The routes that create something answer 201; the others 200.
CREATED = {("post", "/v1/sessions"), ("post", "/v1/groups/{name}")}

JSON = {"Content-Type": "application/json"}
STREAM = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def grant(**changes: Any) -> Dict[str, Any]:
    """A grant as the API writes it."""
    fields: Dict[str, Any] = {
        "key": "orders",
        "token": 1700000000250000,
        "mode": "exclusive",
        "max_concurrent": 1,
        "held_for": 0.25,
        "expires_in": None,
        "value": None,
        "peer": "127.0.0.1:40000",
    }
    fields.update(changes)
    return fields


def encode(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


def error(code: str, **extra: Any) -> bytes:
    return encode(dict({"code": code, "message": code.replace("_", " ")}, **extra))


class DocumentTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.document = load_document()

    def operations(self) -> Dict[Any, Dict[str, Any]]:
        return {
            (method, path): operation
            for path, item in self.document["paths"].items()
            for method, operation in item.items()
            if method in ("get", "post", "put", "delete", "patch", "head", "options")
        }

    def test_valid_openapi_3_1(self) -> None:
        """openapi-spec-validator finds nothing wrong, and it is 3.1 (nullable as a type list, not 3.0's keyword)."""
        validate(self.document)
        self.assertEqual(self.document["openapi"], "3.1.0")
        self.assertNotIn('"nullable"', json.dumps(self.document))

    def test_package_data(self) -> None:
        """The document is package data of jesync.http, the very file of the checkout."""
        text = resources.files("jesync.http").joinpath("openapi.json").read_text(encoding="utf-8")
        self.assertEqual(json.loads(text), self.document)
        self.assertEqual(text, (ROOT / "jesync" / "http" / "openapi.json").read_text(encoding="utf-8"))

    def test_every_route(self) -> None:
        """Every route of the API, and no other, each with a tag of the six and its own operationId."""
        self.assertEqual(sorted(self.operations()), sorted(ROUTES))
        self.assertEqual(len(ROUTES), len(set(ROUTES)))
        operation_ids = [operation["operationId"] for operation in self.operations().values()]
        self.assertEqual(len(operation_ids), len(set(operation_ids)))
        for route, operation in self.operations().items():
            self.assertEqual(len(operation["tags"]), 1, route)
            self.assertIn(operation["tags"][0], TAGS, route)
        self.assertEqual({tag["name"] for tag in self.document["tags"]}, TAGS)

    def test_every_error_code(self) -> None:
        """The Error schema's code enum is every code, and each shared error reply allows its status's codes."""
        components = self.document["components"]
        self.assertEqual(set(components["schemas"]["Error"]["properties"]["code"]["enum"]), set(ERROR_CODES))
        self.assertEqual(components["schemas"]["Error"]["required"], ["code", "message"])
        self.assertEqual(set(components["responses"]), set(ERROR_REPLIES.values()))
        allowed: Dict[int, Set[str]] = {}
        for status, name in ERROR_REPLIES.items():
            (schema,) = [media["schema"] for media in components["responses"][name]["content"].values()]
            self.assertEqual(schema["allOf"][0], {"$ref": "#/components/schemas/Error"}, name)
            allowed[status] = set(schema["allOf"][1]["properties"]["code"]["enum"])
        # Each operation's error replies are the shared one of their status.
        for route, operation in self.operations().items():
            for status, reply in operation["responses"].items():
                if int(status) >= 400:
                    self.assertEqual(reply, {"$ref": f"#/components/responses/{ERROR_REPLIES[int(status)]}"}, route)
        for code, status in ERROR_CODES.items():
            self.assertIn(code, allowed[status], code)
        # Server-wide limits answer 503 limit_reached.
        self.assertIn("limit_reached", allowed[503])
        self.assertEqual(set().union(*allowed.values()), set(ERROR_CODES))
        self.assertTrue(components["responses"]["Unauthorized"]["headers"]["WWW-Authenticate"]["required"])
        self.assertTrue(components["responses"]["MethodNotAllowed"]["headers"]["Allow"]["required"])

    def test_bearer_everywhere_but_the_page_and_this_document(self) -> None:
        """A bearer token is asked for globally; the page and the document are open (security: [])."""
        scheme = self.document["components"]["securitySchemes"]["bearer"]
        self.assertEqual((scheme["type"], scheme["scheme"]), ("http", "bearer"))
        self.assertEqual(self.document["security"], [{"bearer": []}])
        for route, operation in self.operations().items():
            if route in PUBLIC:
                self.assertEqual(operation["security"], [], route)
                self.assertNotIn("401", operation["responses"], route)
            else:
                self.assertNotIn("security", operation, route)
                self.assertIn("401", operation["responses"], route)
            for status in ("403", "500", "503"):
                self.assertIn(status, operation["responses"], route)

    def test_success_and_media_types(self) -> None:
        """
        One success each (201 for a creation), JSON but for the page
        (text/html) and the event streams (text/event-stream, naming their
        events' data schemas in x-events).
        """
        for route, operation in self.operations().items():
            ok = [status for status in operation["responses"] if status.startswith("2")]
            self.assertEqual(ok, ["201" if route in CREATED else "200"], route)
            (media,) = operation["responses"][ok[0]]["content"]
            if route in SSE_ROUTES:
                self.assertEqual(media, "text/event-stream", route)
                events = operation["responses"][ok[0]]["content"][media]["x-events"]
                self.assertEqual(set(events), SSE_ROUTES[route], route)
                for schema in events.values():
                    self.assertIn(schema["$ref"].rsplit("/", 1)[1], self.document["components"]["schemas"])
            else:
                self.assertEqual(media, "text/html" if route == ("get", "/") else "application/json", route)


class CheckResponseTests(SynchronousTestCase):
    def assertRefused(self, *args: Any, mentions: str, **kwargs: Any) -> str:
        """check_response refuses the reply, and says why (C{mentions} is in its message)."""
        with self.assertRaises(AssertionError) as caught:
            check_response(*args, **kwargs)
        message = str(caught.exception)
        self.assertIn(mentions, message)
        return message

    def test_matching_replies_pass(self) -> None:
        check_response("POST", "/v1/sessions", 201, JSON, encode({"session": "s1", "ttl": 30.0}), b'{"ttl": 30}')
        check_response("POST", "/v1/sessions", 201, JSON, encode({"session": "s1", "ttl": 30.0}), b"")
        check_response("POST", "/v1/acquire", 200, {"content-type": "application/json; charset=utf-8"},
                       encode({"grants": [grant(), grant(key="b", mode="shared", max_concurrent=3, expires_in=4.5, value="v")]}),
                       encode({"session": "s1", "keys": ["orders", "b"], "wait": -1, "unknown": "ignored"}))
        check_response("POST", "/v1/acquire", 409, JSON, error("not_granted", busy=["orders"]))
        check_response("POST", "/v1/acquire", 503, JSON, error("limit_reached", limit="max-keys", value=10))
        check_response("GET", "/v1/locks/a%2Fb?limit=5", 200, JSON, encode({
            "key": "a/b", "held": True, "mode": "exclusive", "holders": [grant(key="a/b")],
            "waiters": [{"peer": "p", "mode": "exclusive", "max_concurrent": 1, "waited": 2}], "waiters_total": 1}))
        check_response("GET", "/v1/locks?order=waiters&limit=2", 200, JSON, encode({
            "locks": [{"key": "k", "mode": None, "holders": 0, "waiters": 2}], "next": "2", "keys": 1000000}))
        check_response("GET", "/v1/elections/e", 200, JSON, encode({"election": "e", "leader": None, "candidates": 0}))
        check_response("GET", "/v1/elections/e", 200, JSON, encode({"election": "e", "leader": grant(), "candidates": 2}))
        check_response("GET", "/v1/status", 401, dict(JSON, **{"WWW-Authenticate": 'Bearer realm="jesync"'}),
                       error("unauthorized"))
        check_response("GET", "/", 200, {b"Content-Type": [b"text/html; charset=utf-8"]}, b"<!doctype html><title>jesync</title>")
        check_response("GET", "/v1/openapi.json", 200, JSON, encode(load_document()))

    def test_no_operation(self) -> None:
        """An unknown path gets 404 not_found, a method a path does not take 405 with Allow; nothing else passes."""
        check_response("GET", "/v1/nothing", 404, JSON, error("not_found"))
        check_response("PUT", "/v1/acquire", 405, dict(JSON, Allow="POST"), error("method_not_allowed"))
        check_response("GET", "/v1/nothing", 403, JSON, error("protected_mode"))
        self.assertRefused("GET", "/v1/nothing", 200, JSON, b"{}", mentions="no operation")
        self.assertRefused("GET", "/v1/nothing", 404, JSON, error("no_such_session"), mentions="not_found")
        self.assertRefused("PUT", "/v1/acquire", 405, JSON, error("method_not_allowed"), mentions="Allow")
        self.assertRefused("GET", "/v1/locks/", 404, JSON, b"not json", mentions="not JSON")

    def test_head(self) -> None:
        """A HEAD is checked as its GET, but for the body it does not have."""
        check_response("HEAD", "/v1/status", 200, JSON, b"")
        check_response("HEAD", "/v1/watch?key=k", 200, STREAM, b"")
        check_response("HEAD", "/v1/nothing", 404, JSON, b"")
        self.assertRefused("HEAD", "/v1/status", 201, JSON, b"", mentions="201")
        self.assertRefused("HEAD", "/v1/status", 200, STREAM, b"", mentions="text/event-stream")
        self.assertRefused("HEAD", "/v1/sessions/end", 405, JSON, b"", mentions="Allow")

    def test_missing_required_field(self) -> None:
        reply = grant()
        del reply["token"]
        self.assertRefused("POST", "/v1/acquire", 200, JSON, encode({"grants": [reply]}), mentions="'token' is a required property")
        self.assertRefused("POST", "/v1/sessions/info", 404, JSON, encode({"code": "no_such_session"}),
                           mentions="'message' is a required property")

    def test_wrong_type(self) -> None:
        self.assertRefused("POST", "/v1/acquire", 200, JSON, encode({"grants": [grant(token="1")]}),
                           mentions="'1' is not of type 'integer'")
        self.assertRefused("POST", "/v1/renew", 200, JSON, encode({"grants": [grant(expires_in="never")]}),
                           mentions="is not of type")
        self.assertRefused("GET", "/v1/status", 200, JSON, b"[]", mentions="not of type 'object'")

    def test_unknown_status_code_or_content_type(self) -> None:
        self.assertRefused("POST", "/v1/acquire", 418, JSON, error("not_granted"), mentions="418")
        # A status the operation does not list: creating a session is never 409.
        self.assertRefused("POST", "/v1/sessions", 409, JSON, error("not_granted"), mentions="409")
        # A code of another status.
        self.assertRefused("POST", "/v1/acquire", 409, JSON, error("unauthorized"), mentions="'unauthorized' is not one of")
        self.assertRefused("POST", "/v1/acquire", 401, JSON, error("unauthorized"), mentions="WWW-Authenticate")
        self.assertRefused("GET", "/v1/status", 200, {"Content-Type": "text/plain"}, b"up", mentions="text/plain")
        self.assertRefused("GET", "/v1/status", 200, {}, b"{}", mentions="Valid mimetypes")
        self.assertRefused("POST", "/v1/sessions/end", 200, JSON, b"", mentions="MissingData")

    def test_request_body_when_accepted(self) -> None:
        """A request the server accepted must be one the document takes; a refused one is not checked."""
        ok = encode({"grants": [grant()]})
        self.assertRefused("POST", "/v1/acquire", 200, JSON, ok, encode({"key": "orders"}),
                           mentions="'session' is a required property")
        self.assertRefused("POST", "/v1/acquire", 200, JSON, ok, encode({"session": "s", "key": "k", "wait": "long"}),
                           mentions="accepted a request")
        self.assertRefused("GET", "/v1/locks?limit=5000", 200, JSON,
                           encode({"locks": [], "next": None, "keys": 0}), mentions="limit")
        self.assertRefused("GET", "/v1/locks?order=size", 200, JSON,
                           encode({"locks": [], "next": None, "keys": 0}), mentions="'size' is not one of")
        check_response("POST", "/v1/acquire", 400, JSON, error("invalid_parameter", parameter="wait"),
                       encode({"session": "s", "key": "k", "wait": "long"}))
        check_response("POST", "/v1/acquire", 400, JSON, error("invalid_json"), b"[1, 2]")

    def test_event_streams(self) -> None:
        """Each complete event is one the route sends, with its schema's data; a partial last one waits."""
        snapshot = b'event: snapshot\ndata: ' + encode({"key": "orders", "holders": [grant()]}) + b"\n\n"
        granted = b"event: granted\r\ndata: " + encode({"key": "orders", "holder": grant()}) + b"\r\n\r\n"
        released = b"event: released\ndata: " + encode({"key": "orders", "holder": None}) + b"\n\n"
        check_response("GET", "/v1/watch?key=orders", 200, STREAM, snapshot + b": ping\n\n" + granted + released + b"event: lo")
        check_response("GET", "/v1/watch?key=orders", 200, STREAM, snapshot + b'event: end\ndata: {"reason": "stopping"}\n\n')
        check_response("GET", "/v1/watch?prefix=ord", 200, STREAM, b"")
        check_response("GET", "/v1/elections/e/observe", 200, STREAM,
                       b"event: leader\ndata: " + encode({"election": "e", "leader": None}) + b"\n\n")
        self.assertRefused("GET", "/v1/watch?key=orders", 200, STREAM, b"event: leader\ndata: {}\n\n", mentions="'leader'")
        self.assertRefused("GET", "/v1/watch?key=orders", 200, STREAM,
                           b"event: granted\ndata: " + encode({"key": "orders", "holder": grant(mode="both")}) + b"\n\n",
                           mentions="granted")
        self.assertRefused("GET", "/v1/status/stream", 200, STREAM, b"event: status\ndata: {not json\n\n", mentions="not JSON")
        self.assertRefused("GET", "/v1/status/stream", 200, STREAM, b"event: status\ndata: {}\n\n",
                           mentions="'server' is a required property")
        self.assertRefused("GET", "/v1/watch?key=orders", 429, STREAM, b"", mentions="429")

    def test_parse_events(self) -> None:
        body = b": ping\n\nevent: a\ndata: 1\ndata: 2\n\ndata: x\r\n\r\nevent: b\n\nevent: c\ndata: partial\n"
        self.assertEqual(parse_events(body), [("a", "1\n2"), ("message", "x")])
