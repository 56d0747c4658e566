"""
Elections and groups over HTTP: the same rules and the same keys as the
line protocols' (docs/coordination.md), with an HTTP session as the owner.

B{Elections} are the key C{election:<name>} (L{jesync.wire.election_key}):
its holder leads, its waiters are the candidates.

 - C{campaign}: an exclusive request for the key, at most one holder, the
   session its owner (no expiry: the session is the failsafe; its TTL
   running out, or its end, resigns), the C{value} the leader's (an
   address, a name); C{wait} seconds as a long poll (cancelled when the
   client goes: a candidacy whose client has gone is withdrawn, and a lead
   won in the same turn given back).  The leader campaigning again renews
   its lead (with a new value if it sends one).
 - C{resign}: a release (C{409 not_leader} if the session does not lead:
   a candidate still waiting withdraws by ending its long poll).
 - C{proclaim}: a new value for the leader's grant, kept (the same token,
   the same expiry), only by the session that leads (else C{409
   not_leader}); observers are told (L{jesync.http.streams.proclaimed}).
 - C{GET}: the leader (the key's first holder, or null) and how many
   candidates wait.

B{Groups} are L{jesync.groups.GroupTable}'s (the server's one table, which
the JESync grammar serves too): create (C{201}), delete, list, members;
join, leave and update with the session as the member's owner and its
lease (0: the membership lasts as long as the session), the
C{capabilities} as the member's value.  The table's errors are answered
with the codes of L{jesync.http.api.error_of}.

In cluster mode every reply waits for the journal (L{jesync.http.api}).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from twisted.internet.defer import Deferred

from jesync.http.api import (
    ApiError,
    Call,
    Reply,
    Route,
    grant_document,
    invalid,
    peer_of,
    route,
    tell_renewed,
    value_text,
)
from jesync.http.streams import proclaimed
from jesync.service import renew_grant
from jesync.wire import EXCLUSIVE, election_key, group_key, member_key

ROUTES: List[Route] = []


def not_leader(election: str) -> ApiError:
    return ApiError(409, "not_leader", f"this session does not lead election {election!r}")


def _new_value(call: Call, name: str) -> bytes:
    """
    A value that replaces one (a proclaim's, an update's): required, and
    text (a renewal keeps a value or replaces it, never clears it: C{""}
    is the empty one).
    """
    if call.body.get(name) is None:
        raise invalid(name, "is required (a string: a value is replaced, never cleared)")
    value = call.value(name)
    assert value is not None
    return value


# -- elections ---------------------------------------------------------------------


def _election(call: Call) -> Tuple[str, str]:
    """The election the path names, and its key (C{400 invalid_key} if it cannot be one)."""
    election = call.params["name"]
    return election, call.key("name", election_key(election))


@route(ROUTES, "POST", "/v1/elections/{name}/campaign")
def campaign(call: Call) -> Any:
    election, key = _election(call)
    session = call.session()
    value = call.value()
    wait = call.wait()
    context = call.context
    leading = context.locks.grant_of(key, session)
    result = context.locks.request(key, session, 1, wait, 0, EXCLUSIVE, value)

    def elected(grant: Any) -> Reply:
        if grant is leading:
            tell_renewed(call, session, [key])
            if value is not None:
                proclaimed(context, election)
            undo = None  # (it led already: a client gone is no reason to resign)
        else:
            undo = grant.release
        return Reply({"leader": grant_document(grant, context.clock.seconds())}, undo=undo)

    if isinstance(result, Deferred):
        return result.addCallback(elected)
    return elected(result)


@route(ROUTES, "POST", "/v1/elections/{name}/resign")
def resign(call: Call) -> Dict[str, Any]:
    election, key = _election(call)
    if not call.context.locks.release(key, call.session()):
        raise not_leader(election)
    return {"resigned": True}


@route(ROUTES, "POST", "/v1/elections/{name}/proclaim")
def proclaim(call: Call) -> Dict[str, Any]:
    election, key = _election(call)
    session = call.session()
    value = _new_value(call, "value")
    locks = call.context.locks
    grant = locks.grant_of(key, session)
    if grant is None:
        raise not_leader(election)
    renew_grant(locks, grant, value)  # (its expiry kept: none, as campaign gives it)
    tell_renewed(call, session, [key])
    proclaimed(call.context, election)
    return {"leader": grant_document(grant, call.context.clock.seconds())}


@route(ROUTES, "GET", "/v1/elections/{name}")
def election(call: Call) -> Dict[str, Any]:
    election, key = _election(call)
    locks = call.context.locks
    holders = locks.holders(key)
    leader = grant_document(holders[0], call.context.clock.seconds()) if holders else None
    return {"election": election, "leader": leader, "candidates": locks.status(key).waiting}


# -- groups ------------------------------------------------------------------------


def _group(call: Call) -> str:
    """The group the path names (C{400 invalid_key} if its key cannot be one)."""
    name = call.params["name"]
    call.key("name", group_key(name))
    return name


def _member(call: Call, group: str) -> str:
    """The C{member} field (C{400 invalid_key} if its key cannot be one)."""
    member = call.text("member")
    call.key("member", member_key(group, member))
    return member


@route(ROUTES, "GET", "/v1/groups")
def groups(call: Call) -> Dict[str, Any]:
    return {"groups": call.context.groups.groups()}


@route(ROUTES, "POST", "/v1/groups/{name}")
def create_group(call: Call) -> Reply:
    name = _group(call)
    call.context.groups.create(name)
    return Reply({"group": name}, status=201)


@route(ROUTES, "DELETE", "/v1/groups/{name}")
def delete_group(call: Call) -> Dict[str, Any]:
    name = _group(call)
    call.context.groups.delete(name)
    return {"group": name, "deleted": True}


@route(ROUTES, "GET", "/v1/groups/{name}")
def group(call: Call) -> Dict[str, Any]:
    name = _group(call)
    members = []
    for member, grant in call.context.groups.member_grants(name).items():
        members.append(
            {
                "member": member,
                "peer": peer_of(grant.owner),
                "token": grant.token,
                "capabilities": value_text(grant.value),
            }
        )
    return {"group": name, "members": members}


@route(ROUTES, "POST", "/v1/groups/{name}/join")
def join(call: Call) -> Dict[str, Any]:
    name = _group(call)
    session = call.session()
    member = _member(call, name)
    capabilities: Optional[bytes] = call.value("capabilities")
    grant = call.context.groups.join(name, member, session, capabilities, 0)
    return {"group": name, "member": member, "token": grant.token}


@route(ROUTES, "POST", "/v1/groups/{name}/leave")
def leave(call: Call) -> Dict[str, Any]:
    name = _group(call)
    session = call.session()
    member = _member(call, name)
    call.context.groups.leave(name, member, session)
    return {"group": name, "member": member, "left": True}


@route(ROUTES, "POST", "/v1/groups/{name}/update")
def update(call: Call) -> Dict[str, Any]:
    name = _group(call)
    session = call.session()
    member = _member(call, name)
    capabilities = _new_value(call, "capabilities")
    call.context.groups.update(name, member, session, capabilities)
    tell_renewed(call, session, [member_key(name, member)])
    return {"group": name, "member": member, "capabilities": value_text(capabilities)}
