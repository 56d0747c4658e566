"""
Groups and their members over a blocking L{jesync.client.Client}: the
JESync C{group-*} commands (docs/protocols/jesync.md, "Groups"), read into
Python values and errors.

The rules are the server's (L{jesync.groups}; docs/coordination.md says
them to users): group C{G} is the key C{group:G} while it exists, member
C{M} of it the one holder of C{group:G/M}, its capabilities the grant's
value and its lease the grant's failsafe expiry.  A member is the
connection that joined: it stays one until it leaves, its connection
closes, or (with a lease) it sends no heartbeat within its lease.

Every command about group C{G} goes to the server C{group:G} lives on (with
several servers, a group and its members are that server's), so
L{Client.groups} asks every server.  A member's joins and leaves are
watched as the prefix C{group:G/} (L{Group.watch}): a C{granted} event is a
join (with the capabilities as its value), C{released}, C{expired} and
C{lost} are leaves; L{member_of} names the member of such an event.

Refusals are L{GroupError}s, one class per reply, so that a caller (the
tooz driver) can tell them apart; any other refusal is a
L{jesync.client.ServerError}, and a dropped connection a
L{jesync.client.ConnectionLost}, as for every request.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol

from jesync.client.errors import ClientError
from jesync.client.watch import MAX_EVENTS
from jesync.client.wire import UnexpectedReply, check_key, check_value, whole_seconds
from jesync.wire import MEMBER_SEPARATOR, decode_key, decode_value, encode_value, group_key, member_key



class GroupClient(Protocol):
    """What a L{Group} needs of its client (L{jesync.client.Client} is one; it imports this module)."""

    def _extension_request(
        self, key: str, line: bytes, answers: frozenset[str], rows: frozenset[str]
    ) -> tuple[str, list[bytes], list[list[bytes]]]: ...

    def watch(
        self, key: Optional[str] = None, *, prefix: Optional[str] = None, max_events: int = MAX_EVENTS
    ) -> Any: ...

__all__ = [
    "Group",
    "GroupAlreadyExists",
    "GroupError",
    "GroupNotCreated",
    "GroupNotEmpty",
    "Member",
    "MemberAlreadyExists",
    "MemberNotJoined",
    "member_of",
]


#: The replies that end a group command (a listing's rows come before its C{END})
GROUP_ANSWERS = frozenset(
    {
        "GROUP-CREATED",
        "GROUP-EXISTS",
        "GROUP-DELETED",
        "GROUP-NOT-EMPTY",
        "NO_GROUP",
        "JOINED",
        "MEMBER-EXISTS",
        "NOT_JOINED",
        "UPDATED",
        "LEFT",
        "END",
    }
)
#: The row lines of C{group-members} and C{groups}.
GROUP_ROWS = frozenset({"MEMBER", "GROUP"})


class GroupError(ClientError):
    """A group command was refused because of the group's or member's state (the server's line is C{line})."""

    def __init__(self, message: str, group: str, member: Optional[str] = None, line: str = "") -> None:
        super().__init__(message)
        self.group = group
        self.member = member
        self.line = line


class GroupNotCreated(GroupError):
    """The group does not exist (C{NO_GROUP})."""


class GroupAlreadyExists(GroupError):
    """C{create()} of a group that exists (C{GROUP-EXISTS})."""


class GroupNotEmpty(GroupError):
    """C{delete()} of a group that still has members (C{GROUP-NOT-EMPTY})."""


class MemberAlreadyExists(GroupError):
    """C{join()} of a member id someone (this client too) is already (C{MEMBER-EXISTS})."""


class MemberNotJoined(GroupError):
    """This connection is not that member (C{NOT_JOINED}): it never joined, it left, or its lease lapsed."""


class Member(NamedTuple):
    """One member of a group (L{Group.members}): its id, its connection's peer, its fencing token, its capabilities."""

    member: str
    peer: str
    token: Optional[int]
    capabilities: Optional[bytes]


def check_group_name(name: str) -> bytes:
    """A group's name on the wire; ValueError for one that cannot be a group (a C{/}, whitespace, empty)."""
    raw = check_key(name)
    if MEMBER_SEPARATOR in name:
        raise ValueError(f"a group name cannot contain {MEMBER_SEPARATOR!r}: {name!r}")
    return raw


def member_of(group: str, key: str) -> Optional[str]:
    """The member id whose key is C{key} in C{group} (a watch event's key), or None if it is not a member's key."""
    prefix = member_key(group, "")
    if not key.startswith(prefix) or len(key) == len(prefix):
        return None
    return key[len(prefix) :]


def _line(*fields: bytes) -> bytes:
    return b" ".join(fields) + b"\r\n"


class Group:
    """
    Group C{name} on a L{jesync.client.Client} (L{Client.group} makes one):
    L{create}, L{delete}, L{join}, L{heartbeat}, L{update}, L{leave},
    L{members}, L{watch}.  The object holds no state of its own: a member
    is the client's connection to the group's server.
    """

    def __init__(self, client: GroupClient, name: str) -> None:
        self._raw = check_group_name(name)
        self.client = client
        self.name = name
        self.key = group_key(name)

    def __repr__(self) -> str:
        return f"<Group {self.name!r}>"

    def _call(self, *fields: bytes) -> tuple[str, list[bytes], list[list[bytes]]]:
        word, reply, rows = self.client._extension_request(self.key, _line(*fields), GROUP_ANSWERS, GROUP_ROWS)
        if word == "NO_GROUP":
            raise GroupNotCreated(f"group {self.name!r} does not exist", self.name, line=_text(reply))
        return word, reply, rows

    def _member(self, member: str) -> bytes:
        raw = check_key(member)
        check_key(member_key(self.name, member))
        return raw

    def _expect(self, reply: tuple[str, list[bytes], list[list[bytes]]], *words: str) -> str:
        word, fields, _ = reply
        if word not in words:
            raise UnexpectedReply(f"{_text(fields)!r} does not answer a command of group {self.name!r}")
        return word

    def create(self) -> None:
        """Create the group; L{GroupAlreadyExists} if it exists."""
        reply = self._call(b"group-create", self._raw)
        if self._expect(reply, "GROUP-CREATED", "GROUP-EXISTS") == "GROUP-EXISTS":
            raise GroupAlreadyExists(f"group {self.name!r} already exists", self.name, line=_text(reply[1]))

    def delete(self) -> None:
        """Delete the group; L{GroupNotCreated}, or L{GroupNotEmpty} while it has members."""
        reply = self._call(b"group-delete", self._raw)
        if self._expect(reply, "GROUP-DELETED", "GROUP-NOT-EMPTY") == "GROUP-NOT-EMPTY":
            raise GroupNotEmpty(f"group {self.name!r} has members", self.name, line=_text(reply[1]))

    def join(self, member: str, capabilities: bytes | str | None = None, lease: float = 0) -> int:
        """
        Become member C{member} (this client's connection is it), with
        C{capabilities} (at most 4096 bytes) and a C{lease} in seconds
        (rounded up; 0: none, the membership ends with the connection or
        L{leave}); return the seconds the lease has left (0: none).
        L{GroupNotCreated}; L{MemberAlreadyExists} if anyone is that member.
        """
        fields = [b"group-join", self._raw, self._member(member), b"%d" % whole_seconds(lease, "lease")]
        value = check_value(capabilities)
        if value is not None:
            fields.append(encode_value(value))
        reply = self._call(*fields)
        if self._expect(reply, "JOINED", "MEMBER-EXISTS") == "MEMBER-EXISTS":
            raise MemberAlreadyExists(
                f"member {member!r} of group {self.name!r} already exists", self.name, member, _text(reply[1])
            )
        return int(reply[1][3])

    def heartbeat(self, member: str, lease: float) -> bool:
        """Start member C{member}'s lease again, C{lease} seconds from now: False if this connection is not it."""
        reply = self._call(b"group-heartbeat", self._raw, self._member(member), b"%d" % whole_seconds(lease, "lease"))
        return self._expect(reply, "JOINED", "NOT_JOINED") == "JOINED"

    def update(self, member: str, capabilities: bytes | str | None) -> None:
        """Set member C{member}'s capabilities (and start its lease again); L{MemberNotJoined}."""
        value = check_value(capabilities)
        fields = [b"group-update", self._raw, self._member(member)]
        if value is not None:
            fields.append(encode_value(value))
        reply = self._call(*fields)
        if self._expect(reply, "UPDATED", "NOT_JOINED") == "NOT_JOINED":
            raise self._not_joined(member, reply[1])

    def leave(self, member: str) -> None:
        """Stop being member C{member}; L{MemberNotJoined} if this connection is not it."""
        reply = self._call(b"group-leave", self._raw, self._member(member))
        if self._expect(reply, "LEFT", "NOT_JOINED") == "NOT_JOINED":
            raise self._not_joined(member, reply[1])

    def _not_joined(self, member: str, fields: list[bytes]) -> MemberNotJoined:
        return MemberNotJoined(
            f"this client is not member {member!r} of group {self.name!r}", self.name, member, _text(fields)
        )

    def members(self) -> list[Member]:
        """The members, in the order they joined; L{GroupNotCreated}."""
        reply = self._call(b"group-members", self._raw)
        self._expect(reply, "END")
        return [_member_row(row) for row in reply[2]]

    def watch(self, max_events: int = MAX_EVENTS) -> Any:
        """
        The joins and leaves of this group's members from now on: a watch of
        the prefix C{group:G/} (L{Client.watch}); L{member_of} names each
        event's member.  To start consistently, watch, then ask L{members}.
        (A L{jesync.client.Watch}.)
        """
        return self.client.watch(prefix=member_key(self.name, ""), max_events=max_events)


def _member_row(fields: list[bytes]) -> Member:
    """C{MEMBER <G> <M> <peer> <token>[ <capabilities>]} as a L{Member}."""
    try:
        if len(fields) not in (5, 6):
            raise ValueError(len(fields))
        token = None if fields[4] == b"-" else int(fields[4])
        capabilities = decode_value(fields[5]) if len(fields) == 6 else None
    except Exception:
        raise UnexpectedReply(f"not a member line: {_text(fields)!r}") from None
    return Member(decode_key(fields[2]), fields[3].decode("utf-8", "replace"), token, capabilities)


def group_names(rows: list[list[bytes]]) -> list[str]:
    """The groups of C{groups}'s C{GROUP <G>} rows."""
    return [decode_key(row[1]) for row in rows if len(row) == 2]


def _text(fields: list[bytes]) -> str:
    return b" ".join(fields).decode("utf-8", "replace")
