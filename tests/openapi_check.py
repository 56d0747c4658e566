"""
Every HTTP reply a test sees is checked against the OpenAPI document the
server serves (C{jesync/http/openapi.json}, read as the installed package's
data): C{check_response(method, path_with_query, status, headers, body,
request_body=None)} raises C{AssertionError} with openapi-core's message when
the reply does not match, so the document cannot drift from the server.

The rules, and why:
 - The document is matched on the path alone (its one server is C{/}), so a
   test's host and port do not matter; it is loaded once per process.
 - The reply is checked for its status (one the operation lists), its
   content type, its required headers and its body's schema.  A request the
   document has no operation for (an unknown path, or a method the path does
   not take) may only get the errors any request can get: the shared
   C{components/responses} of 401, 403, 404 (C{not_found}), 405
   (C{method_not_allowed}, with C{Allow}), 413, 500 and 503.
 - The request is checked only when the server accepted it (a 2xx reply):
   the document must take every request the server takes, while a test
   that provokes a 400 sends a bad request on purpose.  Its path and query
   parameters are checked always, its body when the test gives it.  Auth
   is not the document's to check here (the auth tests do): the request is
   checked as if it carried a bearer token.
 - A reply to HEAD (which the server answers on every GET route) is
   checked as GET's would be, but for its body, which it has not.
 - A Server-Sent Events body (C{text/event-stream}) may be what a test read
   so far: each complete event (up to a blank line) must be one the
   response's C{x-events} names, with JSON data of that event's schema; a
   trailing partial event is left unchecked, and an empty body is a stream
   that has sent nothing yet.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import parse_qsl, urlsplit

from openapi_core import Config, OpenAPI
from openapi_core.exceptions import OpenAPIError
from openapi_core.testing import MockRequest, MockResponse
from openapi_core.validation.request.validators import V31RequestParametersValidator
from openapi_schema_validator import OAS31Validator
from werkzeug.datastructures import ImmutableMultiDict

# The one server of the document is "/": any scheme and host match.
_HOST_URL = "http://jesync.test"
# What the request is checked with in place of the test's own token.
_ANY_BEARER = {"Authorization": "Bearer openapi-check"}
# A request with no operation in the document can get only these replies.
_ANY_REQUEST_ERRORS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "TooLarge",
    500: "InternalError",
    503: "Unavailable",
}
# ... and with these codes where the shared response allows several.
_NO_OPERATION_CODES = {404: "not_found"}
_EVENT_STREAM = "text/event-stream"


@lru_cache(maxsize=None)
def load_document() -> Dict[str, Any]:
    """The OpenAPI document as the installed package C{jesync.http} holds it (read once; do not change it)."""
    text = resources.files("jesync.http").joinpath("openapi.json").read_text(encoding="utf-8")
    document: Dict[str, Any] = json.loads(text)
    return document


@lru_cache(maxsize=None)
def _api() -> OpenAPI:
    # An event stream's body is text (its schema: a string); openapi-core
    # has no deserializer of its own for that media type.
    config = Config(extra_media_type_deserializers={_EVENT_STREAM: _decode_text})
    return OpenAPI.from_dict(load_document(), config=config)


@lru_cache(maxsize=None)
def _parameters_validator() -> V31RequestParametersValidator:
    return V31RequestParametersValidator(_api().spec)


def _decode_text(body: bytes, **parameters: str) -> str:
    return body.decode(parameters.get("charset", "utf-8"))


def check_response(
    method: str,
    path_with_query: str,
    status: int,
    headers: Mapping[str, Any],
    body: bytes,
    request_body: Optional[bytes] = None,
) -> None:
    """
    Check one reply (and, if the server accepted it, its request's body)
    against the OpenAPI document.

    @param method: the request's method (C{"GET"}, C{"POST"}, ...).
    @param path_with_query: the request's path as sent, percent-encoding and
        query string included (C{"/v1/locks/a%2Fb?limit=5"}).
    @param status: the reply's status code.
    @param headers: the reply's headers (names in any case; a value may be a
        string, bytes, or a list of either, as HTTP clients give them).
    @param body: the reply's body, or what was read of a stream.
    @param request_body: the request's body, or None not to check it (its
        parameters are checked all the same).
    @raise AssertionError: the reply, or an accepted request, does not match.
    """
    reply_headers = _plain_headers(headers)
    content_type = reply_headers.get("content-type", "")
    split = urlsplit(path_with_query)
    query: List[Tuple[str, str]] = parse_qsl(split.query, keep_blank_values=True)
    where = f"{method.upper()} {path_with_query} -> {status}"
    if method.upper() == "HEAD":
        _check_head(where, _operation("GET", split.path), status, reply_headers)
        return
    operation = _operation(method, split.path)
    if operation is None:
        _check_without_operation(where, status, reply_headers, body)
        return

    request = MockRequest(
        _HOST_URL,
        method,
        split.path,
        args=ImmutableMultiDict(query),
        headers=_ANY_BEARER,
        data=request_body,
    )
    is_stream = content_type.split(";")[0].strip().lower() == _EVENT_STREAM
    # A stream that has sent nothing yet is checked as an empty stream.
    checked_body = (body or b"\n") if is_stream else body
    response = MockResponse(checked_body, status_code=status, headers=reply_headers, content_type=content_type)
    try:
        _api().validate_response(request, response)
    except OpenAPIError as error:
        raise AssertionError(f"{where}: the reply does not match the OpenAPI document: {_describe(error)}\n"
                             f"body: {body[:600]!r}") from None
    if is_stream:
        _check_events(where, _stream_events(operation, status), body)
    if 200 <= status < 300:
        try:
            if request_body is None:
                _parameters_validator().validate(request)
            else:
                _api().validate_request(request)
        except OpenAPIError as error:
            raise AssertionError(f"{where}: the server accepted a request the OpenAPI document refuses: "
                                 f"{_describe(error)}\nrequest body: {request_body!r:.600}") from None


def _plain_headers(headers: Mapping[str, Any]) -> Dict[str, str]:
    """Header names in lower case, each with its (first) value as text."""
    plain = {}
    for name, value in headers.items():
        if isinstance(value, (list, tuple)):
            value = value[0] if value else ""
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        plain[(name.decode("latin-1") if isinstance(name, bytes) else name).lower()] = str(value)
    return plain


def _describe(error: BaseException) -> str:
    """openapi-core's message, with its cause's (the schema errors) when it adds to it."""
    text = str(error)
    if not text.startswith(type(error).__name__):
        text = f"{type(error).__name__}: {text}"
    cause = error.__cause__ or getattr(error, "__context__", None)
    if cause is not None and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    for schema_error in getattr(error, "schema_errors", None) or ():
        text += f"\n  {getattr(schema_error, 'message', schema_error)}"
    return text


def _operation(method: str, path: str) -> Optional[Dict[str, Any]]:
    """The document's operation for C{method} on C{path}, or None."""
    segments = path.split("/")
    for template, item in load_document()["paths"].items():
        parts = template.split("/")
        if len(parts) == len(segments) and all(
            part == segment or (part.startswith("{") and part.endswith("}") and segment)
            for part, segment in zip(parts, segments)
        ):
            if method.lower() in item:
                operation: Dict[str, Any] = item[method.lower()]
                return operation
    return None


def _component(kind: str, name: str) -> Dict[str, Any]:
    component: Dict[str, Any] = load_document()["components"][kind][name]
    return component


def _resolve(item: Dict[str, Any]) -> Dict[str, Any]:
    """A response object, its C{$ref} (to components/responses) followed."""
    if "$ref" in item:
        return _component("responses", item["$ref"].rsplit("/", 1)[1])
    return item


def _schema_errors(schema: Dict[str, Any], value: Any) -> List[str]:
    """Why C{value} does not match C{schema} (whose $refs point into the document): none if it does."""
    rooted = dict(schema, components=load_document()["components"])
    validator = OAS31Validator(rooted)
    return [f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
            for error in validator.iter_errors(value)]


def _check_without_operation(where: str, status: int, headers: Dict[str, str], body: Optional[bytes]) -> None:
    """A reply to a request the document has no operation for (C{body} None: a HEAD's, not checked)."""
    if status not in _ANY_REQUEST_ERRORS:
        raise AssertionError(f"{where}: the OpenAPI document has no operation for this request, and "
                             f"{status} is not an error any request can get ({sorted(_ANY_REQUEST_ERRORS)})")
    response = _component("responses", _ANY_REQUEST_ERRORS[status])
    content_type = _check_status_and_headers(where, response, headers)
    if body is None:
        return
    try:
        reply = json.loads(body)
    except ValueError as error:
        raise AssertionError(f"{where}: the body is not JSON ({error}): {body[:600]!r}") from None
    problems = _schema_errors(response["content"][content_type]["schema"], reply)
    code = _NO_OPERATION_CODES.get(status)
    if code is not None and isinstance(reply, dict) and reply.get("code") != code:
        problems.append(f"code: {reply.get('code')!r}, not {code!r} (no such route)")
    if problems:
        raise AssertionError(f"{where}: the reply does not match the OpenAPI document: " + "; ".join(problems))


def _check_head(where: str, operation: Optional[Dict[str, Any]], status: int, headers: Dict[str, str]) -> None:
    """A reply to HEAD: the status, content type and headers GET's would have (the body is not sent)."""
    if operation is None:
        _check_without_operation(where, status, headers, None)
        return
    response = operation["responses"].get(str(status))
    if response is None:
        raise AssertionError(f"{where}: {status} is not a status GET lists ({sorted(operation['responses'])})")
    _check_status_and_headers(where, _resolve(response), headers)


def _check_status_and_headers(where: str, response: Dict[str, Any], headers: Dict[str, str]) -> str:
    """The reply has C{response}'s required headers and one of its media types (returned)."""
    for name, header in response.get("headers", {}).items():
        if header.get("required") and name.lower() not in headers:
            raise AssertionError(f"{where}: missing required header {name}")
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in response["content"]:
        raise AssertionError(f"{where}: content type {content_type!r}, not one of {sorted(response['content'])}")
    return content_type


def _stream_events(operation: Dict[str, Any], status: int) -> Dict[str, Any]:
    response = _resolve(operation["responses"][str(status)])
    events: Dict[str, Any] = response["content"][_EVENT_STREAM].get("x-events", {})
    return events


def parse_events(body: bytes) -> List[Tuple[str, str]]:
    """
    The complete events of a Server-Sent Events body, as (name, data): a
    trailing event with no blank line after it yet is left out, and so are
    comments (C{: ping}) and events with no data (which a browser does not
    dispatch either).
    """
    text = body.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    blocks = text.split("\n\n")[:-1]
    events = []
    for block in blocks:
        name, data = "message", []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        if data:
            events.append((name, "\n".join(data)))
    return events


def _check_events(where: str, schemas: Dict[str, Any], body: bytes) -> None:
    for index, (name, data) in enumerate(parse_events(body)):
        if name not in schemas:
            raise AssertionError(f"{where}: event {index} is {name!r}, not one of {sorted(schemas)}")
        try:
            value = json.loads(data)
        except ValueError as error:
            raise AssertionError(f"{where}: event {index} ({name}): its data is not JSON ({error}): {data[:600]!r}")
        problems = _schema_errors(schemas[name], value)
        if problems:
            raise AssertionError(f"{where}: event {index} ({name}) does not match the OpenAPI document: "
                                 + "; ".join(problems))
