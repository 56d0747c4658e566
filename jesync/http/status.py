"""
The server at a glance: C{GET /v1/status} (the status document, which the
status stream of L{jesync.http.streams} sends too), and the two files
served without a token: the status page (C{GET /}, which asks for the
token itself) and the OpenAPI document (C{GET /v1/openapi.json}).

The document is the server's own part (C{context.describe()}: role, term,
uptime, listeners, limits) with the lock table's: its C{totals}, the
C{sessions} (live, and detached: in their grace period or TTL), the open
C{connections} of every listener, and the C{top}: the 20 keys with the most
waiters, then the most holders.

B{The top at 1,000,000 keys.}  Finding it is one pass over the table
(L{jesync.service.LockService.busiest}: C{heapq.nlargest}, no sort and no
row per key; about 75 ms at a million keys on CPython, 20 ms on PyPy), so
it is not redone for every request (the server's C{busiest_keys}, a
L{jesync.http.state.BusiestKeys}):

 - it is kept with the table's C{version} it was found at, and a request
   while the table has not changed (renewals and expiry times do not count)
   costs nothing;
 - a pass that took more than L{jesync.http.state.CHEAP_PASS} is not redone
   within L{jesync.http.state.PASS_SHARE} times what it took, however the table changes (so the
   passes take at most a twentieth of the server's time, whatever the
   rate of requests, streams and changes: at a million keys on CPython, a
   top at most about 1.5 s old).  Meanwhile the keys of the last top are
   shown with their counts of now (20 look-ups), so only which keys are in
   it lags, never what it says of them.  A smaller table's top is found
   again whenever the table has changed.

The two files are package data (C{jesync/http/status.html},
C{jesync/http/openapi.json}), read once, at their first request, and served
from memory from then on.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Dict, List, Optional

from jesync.http.api import ApiContext, Call, Reply, Route, route

ROUTES: List[Route] = []


def status_document(context: ApiContext) -> Dict[str, Any]:
    """The status document of the server C{context} serves (the module's rules)."""
    totals = context.locks.totals()
    document = dict(context.describe())
    document["totals"] = {"keys": totals.keys, "holders": totals.granted, "waiters": totals.waiting}
    document["sessions"] = {"total": len(context.sessions), "detached": context.sessions.detached_count()}
    document["connections"] = len(context.policy.connections)
    document["top"] = context.busiest_keys.summaries()
    return document


@route(ROUTES, "GET", "/v1/status")
def status(call: Call) -> Dict[str, Any]:
    return status_document(call.context)


class PackageFile:
    """A file of this package's data, read at its first use and kept."""

    def __init__(self, name: str, content_type: str) -> None:
        self.name = name
        self.content_type = content_type
        self._body: Optional[bytes] = None

    def reply(self) -> Reply:
        if self._body is None:
            self._body = resources.files(__package__).joinpath(self.name).read_bytes()
        return Reply(body=self._body, content_type=self.content_type)


STATUS_PAGE = PackageFile("status.html", "text/html; charset=utf-8")
OPENAPI_DOCUMENT = PackageFile("openapi.json", "application/json")


@route(ROUTES, "GET", "/", auth=False)
def status_page(call: Call) -> Reply:
    return STATUS_PAGE.reply()


@route(ROUTES, "GET", "/v1/openapi.json", auth=False)
def openapi_document(call: Call) -> Reply:
    return OPENAPI_DOCUMENT.reply()
