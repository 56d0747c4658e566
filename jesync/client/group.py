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

from typing import Any, Callable, NamedTuple, Optional, Protocol

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
    "AsyncGroup",
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


Reply = tuple[str, list[bytes], list[list[bytes]]]


class Command(NamedTuple):
    """One group command: the line to send, and what makes its reply a result (or raises its L{GroupError})."""

    line: bytes
    interpret: Callable[[Reply], Any]


class GroupOver:
    """
    What the three clients' groups share (no I/O here): the group's name
    (checked at once) and key, each command's line, and each reply read
    into a result or a L{GroupError}.  A subclass brings C{_run(command)}
    in its client's style (the result itself, an awaitable of it, a
    Deferred of it) and C{watch}; every operation below returns what
    C{_run} does.  The object holds no state of its own: a member is the
    client's connection to the group's server.
    """

    def __init__(self, client: Any, name: str) -> None:
        self._raw = check_group_name(name)
        self.client = client
        self.name = name
        self.key = group_key(name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def _run(self, command: Command) -> Any:
        raise NotImplementedError

    def _command(self, interpret: Callable[[Reply], Any], *fields: bytes) -> Any:
        def checked(reply: Reply) -> Any:
            if reply[0] == "NO_GROUP":
                raise GroupNotCreated(f"group {self.name!r} does not exist", self.name, line=_text(reply[1]))
            return interpret(reply)

        return self._run(Command(_line(*fields), checked))

    def _member(self, member: str) -> bytes:
        raw = check_key(member)
        check_key(member_key(self.name, member))
        return raw

    def _expect(self, reply: Reply, *words: str) -> str:
        word, fields, _ = reply
        if word not in words:
            raise UnexpectedReply(f"{_text(fields)!r} does not answer a command of group {self.name!r}")
        return word

    def create(self) -> Any:
        """Create the group; L{GroupAlreadyExists} if it exists."""

        def created(reply: Reply) -> None:
            if self._expect(reply, "GROUP-CREATED", "GROUP-EXISTS") == "GROUP-EXISTS":
                raise GroupAlreadyExists(f"group {self.name!r} already exists", self.name, line=_text(reply[1]))

        return self._command(created, b"group-create", self._raw)

    def delete(self) -> Any:
        """Delete the group; L{GroupNotCreated}, or L{GroupNotEmpty} while it has members."""

        def deleted(reply: Reply) -> None:
            if self._expect(reply, "GROUP-DELETED", "GROUP-NOT-EMPTY") == "GROUP-NOT-EMPTY":
                raise GroupNotEmpty(f"group {self.name!r} has members", self.name, line=_text(reply[1]))

        return self._command(deleted, b"group-delete", self._raw)

    def join(self, member: str, capabilities: bytes | str | None = None, lease: float = 0) -> Any:
        """
        Become member C{member} (this client's connection is it), with
        C{capabilities} (at most 4096 bytes) and a C{lease} in seconds
        (rounded up; 0: none, the membership ends with the connection or
        L{leave}); the seconds the lease has left (0: none).
        L{GroupNotCreated}; L{MemberAlreadyExists} if anyone is that member.
        """
        fields = [b"group-join", self._raw, self._member(member), b"%d" % whole_seconds(lease, "lease")]
        value = check_value(capabilities)
        if value is not None:
            fields.append(encode_value(value))

        def joined(reply: Reply) -> int:
            if self._expect(reply, "JOINED", "MEMBER-EXISTS") == "MEMBER-EXISTS":
                raise MemberAlreadyExists(
                    f"member {member!r} of group {self.name!r} already exists", self.name, member, _text(reply[1])
                )
            return int(reply[1][3])

        return self._command(joined, *fields)

    def heartbeat(self, member: str, lease: float) -> Any:
        """Start member C{member}'s lease again, C{lease} seconds from now: False if this connection is not it."""
        return self._command(
            lambda reply: self._expect(reply, "JOINED", "NOT_JOINED") == "JOINED",
            b"group-heartbeat",
            self._raw,
            self._member(member),
            b"%d" % whole_seconds(lease, "lease"),
        )

    def update(self, member: str, capabilities: bytes | str | None) -> Any:
        """Set member C{member}'s capabilities (and start its lease again); L{MemberNotJoined}."""
        value = check_value(capabilities)
        fields = [b"group-update", self._raw, self._member(member)]
        if value is not None:
            fields.append(encode_value(value))
        return self._command(self._joined(member, "UPDATED"), *fields)

    def leave(self, member: str) -> Any:
        """Stop being member C{member}; L{MemberNotJoined} if this connection is not it."""
        return self._command(self._joined(member, "LEFT"), b"group-leave", self._raw, self._member(member))

    def _joined(self, member: str, done: str) -> Callable[[Reply], None]:
        def interpret(reply: Reply) -> None:
            if self._expect(reply, done, "NOT_JOINED") == "NOT_JOINED":
                raise MemberNotJoined(
                    f"this client is not member {member!r} of group {self.name!r}", self.name, member, _text(reply[1])
                )

        return interpret

    def members(self) -> Any:
        """The members (L{Member}s), in the order they joined; L{GroupNotCreated}."""

        def listed(reply: Reply) -> list[Member]:
            self._expect(reply, "END")
            return [_member_row(row) for row in reply[2]]

        return self._command(listed, b"group-members", self._raw)

    def _watched_prefix(self) -> str:
        """The prefix whose events are this group's joins and leaves."""
        return member_key(self.name, "")


class Group(GroupOver):
    """
    Group C{name} on a blocking L{jesync.client.Client} (L{Client.group}
    makes one): L{create}, L{delete}, L{join}, L{heartbeat}, L{update},
    L{leave}, L{members}, L{watch}, each returning its result.
    """

    client: GroupClient

    def _run(self, command: Command) -> Any:
        return command.interpret(
            self.client._extension_request(self.key, command.line, GROUP_ANSWERS, GROUP_ROWS)
        )

    def watch(self, max_events: int = MAX_EVENTS) -> Any:
        """
        The joins and leaves of this group's members from now on: a watch of
        the prefix C{group:G/} (L{Client.watch}); L{member_of} names each
        event's member.  To start consistently, watch, then ask L{members}.
        (A L{jesync.client.Watch}.)
        """
        return self.client.watch(prefix=self._watched_prefix(), max_events=max_events)


class AsyncGroup(GroupOver):
    """
    Group C{name} on an L{jesync.client.AsyncClient} (C{client.group(name)}):
    L{Group}'s operations, awaited (C{await group.join("w1")}).
    """

    async def _run(self, command: Command) -> Any:
        return command.interpret(
            await self.client._extension_request(self.key, command.line, GROUP_ANSWERS, GROUP_ROWS)
        )

    def watch(self, max_events: int = MAX_EVENTS) -> Any:
        """
        As L{Group.watch}: C{async with group.watch() as events} (or
        C{events = await group.watch()}, then C{await events.close()}).
        """
        return self.client.watch(prefix=self._watched_prefix(), max_events=max_events)


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


#: The C{groups} command's line (asked of every server).
GROUPS_LINE = b"groups\r\n"


def listed_groups(reply: Reply) -> list[str]:
    """The groups one server's reply to L{GROUPS_LINE} lists (UnexpectedReply for anything but a listing)."""
    word, fields, rows = reply
    if word != "END":
        raise UnexpectedReply(f"{b' '.join(fields)!r} does not answer groups")
    return group_names(rows)


def _text(fields: list[bytes]) -> str:
    return b" ".join(fields).decode("utf-8", "replace")
