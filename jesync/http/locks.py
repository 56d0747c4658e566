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

B{Locks}: a grant is the session's, so one session asking again for a key
it holds renews its grant (its token kept), as on every protocol.  A long
poll (C{wait}) that its client leaves is withdrawn from the queue, and a
grant made in the turn its client went is released (the L{Reply}'s
C{undo}): a client that has gone is granted nothing.  Only what a request
newly granted is undone, never a grant the session held before it.

B{Listings} never send the whole table: C{GET /v1/locks} is a page of at
most 1,000 keys.  A table whose snapshot takes at most half the server's
C{--max-listing-memory} (L{jesync.http.state.ListingSnapshots.largest_kept}:
the line protocols' listing of the same table, once it has changed, must
still fit beside it) is read from a snapshot in that order taken under that
budget (L{jesync.connections.listings}), as the line protocols' listings
are, and the last snapshot of each order is kept while the table does not
change (at most L{jesync.http.state.SNAPSHOT_KEPT} seconds after its last
page; the server's C{listing_snapshots}, released when it stops), so that
paging through a quiet table sorts it once; a table that changes between
pages is sorted again for the next one.  In key order the page starts after
the cursor (a binary search: the cursor is the last key shown); in waiters
order (most waiters first, then key order) the cursor is an offset into the
listing as it is at the time of each page.

A larger table is never kept in a snapshot.  In key order each page is one
bounded pass over the table (L{jesync.service.LockService.first_keys}: the
C{limit + 1} smallest keys after the cursor, C{heapq.nsmallest}), which at
1,000,000 keys takes about 290 ms a page on CPython and 100 ms on PyPy,
where a snapshot takes 1.0 s (CPython) and 1.4 s (PyPy) and 72 MB; in
waiters order the page is read from a snapshot given back at once (the
status page's top keys come from the status document, not from this).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from twisted.internet.defer import Deferred

from jesync.connections.listings import ROW_BYTES
from jesync.http.api import (
    ApiError,
    Call,
    Reply,
    Route,
    grant_document,
    invalid,
    owner_changes,
    peer_of,
    route,
    tell_renewed,
)
from jesync.service import renew_grant
from jesync.wire import EXCLUSIVE, SHARED, encode_key

ROUTES: List[Route] = []

# A session's TTL when the client names none, in seconds.
DEFAULT_TTL = 30.0


def _ttl_of(session: Any) -> float:
    return session.grace_ms / 1000


def _grants(call: Call, session: Any) -> List[Dict[str, Any]]:
    now = call.context.clock.seconds()
    return [grant_document(grant, now) for grant in call.context.locks.grants_of(session)]


# -- sessions -------------------------------------------------------------


@route(ROUTES, "POST", "/v1/sessions")
def create_session(call: Call) -> Reply:
    """
    A new session whose TTL is C{ttl} seconds (default L{DEFAULT_TTL}; a
    longer one than C{--max-session-grace} is cut to it).
    """
    ttl = call.number("ttl", DEFAULT_TTL)
    if ttl <= 0:
        raise invalid("ttl", "must be more than 0 seconds")
    session = call.context.sessions.open(max(1, round(ttl * 1000)), call.peer)
    changes = owner_changes(call.context)
    if changes is not None:
        changes.session_changed(session)
    return Reply({"session": session.id, "ttl": _ttl_of(session)}, status=201)


@route(ROUTES, "POST", "/v1/sessions/keepalive")
def keep_alive(call: Call) -> Dict[str, Any]:
    """The session's TTL starts again (attached to an elock connection: nothing runs, nothing to do)."""
    session = call.session()
    session.keep_alive()
    return {"session": session.id, "ttl": _ttl_of(session), "expires_in": session.seconds_left()}


@route(ROUTES, "POST", "/v1/sessions/end")
def end_session(call: Call) -> Dict[str, Any]:
    """The session ends now, and its locks are released."""
    session = call.session()
    released = len(call.context.locks.grants_of(session))
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


# -- locks ------------------------------------------------------------------


def _mode(call: Call) -> str:
    return SHARED if call.boolean("shared", False) else EXCLUSIVE


@route(ROUTES, "POST", "/v1/acquire")
def acquire(call: Call) -> Any:
    """
    C{key}, or C{keys} all or nothing, for the session: at once, or within
    C{wait} seconds (a long poll); C{409 not_granted} with the keys in the
    way otherwise.
    """
    session = call.session()
    keys = call.keys()
    wait = call.wait()
    expires = call.number("expires", 0, minimum=0)
    max_concurrent = call.integer("max_concurrent", 1, minimum=1)
    mode = _mode(call)
    value = call.value()
    locks = call.context.locks
    held_before = {key for key in keys if locks.grant_of(key, session) is not None}
    if "keys" in call.body:
        if max_concurrent != 1:
            raise invalid("max_concurrent", "must be 1 with keys (several keys are each taken exclusively or shared)")
        result: Any = locks.request_many(keys, session, wait, expires, mode, value)
    else:
        result = locks.request(keys[0], session, max_concurrent, wait, expires, mode, value)

    def granted(grants: Any) -> Reply:
        grants = grants if isinstance(grants, list) else [grants]
        new = [grant for grant in grants if grant.key not in held_before]
        tell_renewed(call, session, [grant.key for grant in grants if grant.key in held_before])

        def undo() -> None:
            for grant in new:
                grant.release()

        now = call.context.clock.seconds()
        return Reply({"grants": [grant_document(grant, now) for grant in grants]}, undo=undo)

    if isinstance(result, Deferred):
        return result.addCallback(granted)
    return granted(result)


@route(ROUTES, "POST", "/v1/release")
def release(call: Call) -> Dict[str, Any]:
    """C{key} or C{keys} the session holds, released; C{409 not_held} if it held none of them."""
    session = call.session()
    keys = call.keys()
    locks = call.context.locks
    released = [key for key in dict.fromkeys(keys) if locks.release(key, session)]
    if not released:
        raise ApiError(409, "not_held", "the session holds none of these keys")
    return {"released": released}


@route(ROUTES, "POST", "/v1/renew")
def renew(call: Call) -> Dict[str, Any]:
    """
    The session's grant of C{key}: its expiry starts again (C{expires}
    seconds; 0: none), its value replaced if one is given; never a new
    grant (C{409 not_held}).
    """
    session = call.session()
    key = call.key()
    expires = call.number("expires", minimum=0)
    value = call.value()
    locks = call.context.locks
    grant = locks.grant_of(key, session)
    if grant is None:
        raise ApiError(409, "not_held", f"the session does not hold {key}")
    renewed = renew_grant(locks, grant, value, expires)
    tell_renewed(call, session, [key])
    return {"grants": [grant_document(renewed, call.context.clock.seconds())]}


@route(ROUTES, "GET", "/v1/locks/{key}")
def lock_detail(call: Call) -> Dict[str, Any]:
    """One key: its holders (with their tokens) and the first C{limit} of its waiters, in queue order."""
    key = call.key("key", call.params["key"])
    limit = call.query_integer("limit", 100, 1, 1000)
    locks = call.context.locks
    now = call.context.clock.seconds()
    holders = locks.holders(key)
    waiters = locks.waiters(key, limit)
    return {
        "key": key,
        "held": bool(holders),
        "mode": holders[0].mode if holders else None,
        "holders": [grant_document(grant, now) for grant in holders],
        "waiters": [
            {
                "peer": peer_of(waiting.owner),
                "mode": waiting.mode,
                "max_concurrent": waiting.max_concurrent,
                "waited": max(0.0, now - waiting.since),
            }
            for waiting in waiters
        ],
        "waiters_total": locks.status(key).waiting,
    }


# A listing's orders, and the lock table's names for them.
_ORDERS = {"key": "key", "waiters": "requests"}


def _first_at_or_after(rows: Sequence[Any], encoded: bytes, strictly_after: bool) -> int:
    """The index of the first row (sorted by encoded key) whose key is after (or at) C{encoded}."""
    low, high = 0, len(rows)
    while low < high:
        middle = (low + high) // 2
        key = encode_key(rows[middle][0])
        if key < encoded or (strictly_after and key == encoded):
            low = middle + 1
        else:
            high = middle
    return low


def _prefix_end(rows: Sequence[Any], start: int, encoded_prefix: bytes) -> int:
    """The index after the last row from C{start} on whose key starts with the prefix (they are contiguous)."""
    low, high = start, len(rows)
    while low < high:
        middle = (low + high) // 2
        if encode_key(rows[middle][0]).startswith(encoded_prefix):
            low = middle + 1
        else:
            high = middle
    return low


def _summary(row: Any) -> Dict[str, Any]:
    held = row[1]
    mode = (SHARED if len(row) > 3 else EXCLUSIVE) if held else None
    return {"key": row[0], "mode": mode, "holders": held, "waiters": row[2]}


@route(ROUTES, "GET", "/v1/locks")
def list_locks(call: Call) -> Dict[str, Any]:
    """
    A page of the keys in use (C{limit}, at most 1,000): in key order after
    the cursor C{after}, or most waiters first (C{order=waiters}); only keys
    with C{prefix} if one is given.  C{next}: the cursor of the next page
    (null: this one is the last); C{keys}: how many keys the listing has.
    """
    order = call.query("order", "key")
    if order not in _ORDERS:
        raise invalid("order", "must be key or waiters")
    prefix = call.query("prefix", "") or ""
    after = call.query("after")
    limit = call.query_integer("limit", 100, 1, 1000)
    if order == "key":
        snapshots = call.context.listing_snapshots
        if call.context.locks.totals().keys * ROW_BYTES > snapshots.largest_kept:
            return _scanned_page(call, prefix, after, limit)
        rows, _ = snapshots.rows("key")
        encoded_prefix = encode_key(prefix)
        start = _first_at_or_after(rows, encoded_prefix, False)
        end = len(rows)
        if prefix:
            end = _prefix_end(rows, start, encoded_prefix)
        first = start
        if after is not None:
            first = max(start, _first_at_or_after(rows, encode_key(after), True))
        page = rows[first : min(end, first + limit)]
        more = first + limit < end
        return {
            "locks": [_summary(row) for row in page],
            "next": page[-1][0] if more and page else None,
            "keys": end - start,
        }
    offset = 0
    if after is not None:
        try:
            offset = int(after)
        except ValueError:
            raise invalid("after", "must be a cursor this listing gave")
        if offset < 0:
            raise invalid("after", "must be a cursor this listing gave")
    rows, read = call.context.listing_snapshots.rows(_ORDERS[order])
    try:
        return _waiters_page(rows, prefix, offset, limit)
    finally:
        if read is not None:
            read.release()


def _scanned_page(call: Call, prefix: str, after: Optional[str], limit: int) -> Dict[str, Any]:
    """A page in key order of a table too large to keep a snapshot of: one bounded pass over it."""
    rows, matching = call.context.locks.first_keys(
        limit + 1, None if after is None else encode_key(after), encode_key(prefix)
    )
    page = rows[:limit]
    return {
        "locks": [_summary(row) for row in page],
        "next": page[-1][0] if len(rows) > limit else None,
        "keys": matching,
    }


def _waiters_page(rows: Sequence[Any], prefix: str, offset: int, limit: int) -> Dict[str, Any]:
    """A page of the listing by waiters from C{offset} (only the keys with C{prefix})."""
    matching: Callable[[Any], bool] = (lambda row: row[0].startswith(prefix)) if prefix else (lambda row: True)
    page: List[Any] = []
    index = offset
    while index < len(rows) and len(page) < limit:
        if matching(rows[index]):
            page.append(rows[index])
        index += 1
    while index < len(rows) and not matching(rows[index]):
        index += 1
    total = sum(1 for row in rows if matching(row)) if prefix else len(rows)
    return {
        "locks": [_summary(row) for row in page],
        "next": str(index) if index < len(rows) else None,
        "keys": total,
    }
