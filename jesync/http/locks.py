"""
The HTTP API's sessions, locks, holders and listings.

B{The owner of an HTTP lock is a session}, because an HTTP request cannot
own a lock the way a connection does: C{POST /v1/sessions} opens one
(L{jesync.sessions.SessionTable.open}: the elock session table's, so one
id space and one C{--max-sessions}), whose TTL runs until a keep-alive
starts it again; when it runs out, the session ends and its locks are
released, as an elock session's grace period's end releases them.  Session
ids travel only in request bodies, never in URLs (which end up in logs),
and no listing shows them: a session's id is what lets its holder act for
it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from jesync.http.api import ApiError, Call, Reply, Route, grant_document, route
from jesync.interfaces import IOwnerChanges

ROUTES: List[Route] = []

# A session's TTL when the client names none, in seconds.
DEFAULT_TTL = 30.0


def _ttl_of(session: Any) -> float:
    return session.grace_ms / 1000


def _owner_changes(call: Call) -> Optional[Any]:
    """The lock table's observer if it records sessions (cluster mode: the journal)."""
    return IOwnerChanges(call.context.locks.observer, None)


def _grants(call: Call, session: Any) -> List[Dict[str, Any]]:
    now = call.context.clock.seconds()
    return [grant_document(grant, now) for grant in call.context.locks.grants_of(session)]


# -- sessions -------------------------------------------------------------


@route(ROUTES, "POST", "/v1/sessions", changes=True)
def create_session(call: Call) -> Reply:
    """
    A new session whose TTL is C{ttl} seconds (default L{DEFAULT_TTL}; a
    longer one than C{--max-session-grace} is cut to it).
    """
    ttl = call.number("ttl", DEFAULT_TTL)
    if ttl <= 0:
        raise ApiError(400, "invalid_parameter", "ttl must be more than 0 seconds", parameter="ttl")
    session = call.context.sessions.open(max(1, round(ttl * 1000)), call.peer)
    changes = _owner_changes(call)
    if changes is not None:
        changes.session_changed(session)
    return Reply({"session": session.id, "ttl": _ttl_of(session)}, status=201)


@route(ROUTES, "POST", "/v1/sessions/keepalive", changes=True)
def keep_alive(call: Call) -> Dict[str, Any]:
    """The session's TTL starts again (attached to an elock connection: nothing runs, nothing to do)."""
    session = call.session()
    session.keep_alive()
    return {"session": session.id, "ttl": _ttl_of(session), "expires_in": session.seconds_left()}


@route(ROUTES, "POST", "/v1/sessions/end", changes=True)
def end_session(call: Call) -> Dict[str, Any]:
    """The session ends now, and its locks are released."""
    session = call.session()
    released = call.context.locks.owned(session)
    session.end()
    return {"session": session.id, "released": released}


@route(ROUTES, "POST", "/v1/sessions/info")
def session_info(call: Call) -> Dict[str, Any]:
    session = call.session()
    return {
        "session": session.id,
        "ttl": _ttl_of(session),
        "expires_in": session.seconds_left(),
        "attached": session.connection is not None,
        "peer": session.peer,
        "grants": _grants(call, session),
    }


@route(ROUTES, "GET", "/v1/sessions")
def list_sessions(call: Call) -> Dict[str, Any]:
    """The first C{limit} sessions in the order they started (never their ids)."""
    limit = call.query_integer("limit", 100, 1, 1000)
    table = call.context.sessions
    shown = []
    for session in table.sessions()[:limit]:
        shown.append(
            {
                "peer": session.peer,
                "attached": session.connection is not None,
                "ttl": _ttl_of(session),
                "expires_in": session.seconds_left(),
                "locks": call.context.locks.owned(session),
            }
        )
    return {"sessions": shown, "total": len(table), "detached": table.detached_count()}
