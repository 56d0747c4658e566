"""
Groups and their members over the three clients: the JESync C{group-*}
commands (docs/protocols/jesync.md, "Groups"), read into Python values and
errors.  What is the same for all three is here, with no I/O
(L{GroupOver}: each command's line, each reply read into a result or a
L{GroupError}; L{MemberTracker}; L{Membership}'s rules); L{Group} and
L{AsyncGroup} run the commands over the blocking and the asyncio client,
L{jesync.client.txclient}'s C{TwistedGroup} over the Twisted one.

The rules are the server's (L{jesync.groups}; docs/coordination.md says
them to users): group C{G} is the key C{group:G} while it exists, member
C{M} of it the one holder of C{group:G/M}, its capabilities the grant's
value and its lease the grant's failsafe expiry.  A member is the
connection that joined: it stays one until it leaves, its connection
closes, or (with a lease) it sends no heartbeat within its lease.

Every command about group C{G} goes to the server C{group:G} lives on (with
several servers, a group and its members are that server's), so
C{client.groups()} asks every server.  A member's joins and leaves are
watched as the prefix C{group:G/} (L{Group.watch}): a C{granted} event is a
join (with the capabilities as its value), C{released}, C{expired} and
C{lost} are leaves; L{member_of} names the member of such an event.

A membership bound to one connection ends with it; C{keep_joined} keeps one
across reconnects and failovers, in the style of etcd's concurrency
package (the session owns liveness, the application is told): the loss is
told (C{on_lost}, L{MembershipLost}) before the member joins again
(L{Membership}).  Argument errors (a bad member id, capabilities too long)
raise ValueError at once, in every client, before anything is sent.

Refusals are L{GroupError}s, one class per reply, so that a caller (the
tooz driver) can tell them apart; any other refusal is a
L{jesync.client.ServerError}, and a dropped connection a
L{jesync.client.ConnectionLost}, as for every request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, NamedTuple, Optional, Protocol

from jesync.client.errors import ClientError, describe
from jesync.client.keeping import Kept, KeptInThread
from jesync.client.watch import MAX_EVENTS
from jesync.client.wire import UnexpectedReply, check_key, check_value, whole_seconds
from jesync.client.wire import HOLDER_EVENTS, WatchEvent
from jesync.wire import GRANTED, MEMBER_SEPARATOR, decode_key, decode_value, encode_value, group_key, member_key

log = logging.getLogger("jesync.client")

#: How long a membership that keeps joining waits, by default, before it
#: tries again when joining failed (no server answered; the member id was
#: still taken), in seconds.
RETRY_JOIN = 1.0



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
    "MembershipLost",
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


class MembershipLost(GroupError):
    """
    A membership kept by L{Group.keep_joined} ended without a L{Membership.stop}:
    its connection dropped, its lease lapsed, or it was force-released.
    """


class Stopped(GroupError):
    """(Within a kept membership) it was stopped between the steps of a join: the join is not sent."""


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

    def _keep(
        self,
        kind: Callable[..., Any],
        member: str,
        capabilities: bytes | str | None,
        lease: float,
        on_joined: Optional[Callable[[Any], object]],
        on_lost: Optional[Callable[[MembershipLost], object]],
        retry: float,
    ) -> Any:
        """
        The membership of class C{kind} that keep_joined returns, started;
        its arguments are checked at once (what could never be sent is
        never retried: ValueError).
        """
        self._member(member)
        whole_seconds(lease, "lease")
        return kind(self, member, check_value(capabilities), lease, on_joined, on_lost, retry).start()


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

    def keep_joined(
        self,
        member: str,
        capabilities: bytes | str | None = None,
        lease: float = 0,
        on_joined: Optional[Callable[[BlockingMembership], object]] = None,
        on_lost: Optional[Callable[[MembershipLost], object]] = None,
        retry: float = RETRY_JOIN,
    ) -> BlockingMembership:
        """
        Be member C{member} (with C{capabilities} and C{lease}, as L{join})
        and stay one: a L{BlockingMembership} (the rules: L{Membership})
        that joins in a background thread, heartbeats, tells
        C{on_lost(MembershipLost)} when the membership is lost and joins
        again, telling C{on_joined(membership)} each time it is a member.
        """
        membership: BlockingMembership = self._keep(
            BlockingMembership, member, capabilities, lease, on_joined, on_lost, retry
        )
        return membership


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

    def keep_joined(
        self,
        member: str,
        capabilities: bytes | str | None = None,
        lease: float = 0,
        on_joined: Optional[Callable[[AsyncMembership], object]] = None,
        on_lost: Optional[Callable[[MembershipLost], object]] = None,
        retry: float = RETRY_JOIN,
    ) -> AsyncMembership:
        """As L{Group.keep_joined}, in a task of the running loop (call it from a coroutine): an L{AsyncMembership}."""
        membership: AsyncMembership = self._keep(AsyncMembership, member, capabilities, lease, on_joined, on_lost, retry)
        return membership


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


class MemberTracker:
    """
    Whether a kept membership still is one, from the events of a watch of
    its own key (C{group:G/M}) started before it joined: its join's
    C{granted} (events before it are a former member's: ignored), then a
    C{released}, C{expired} or C{lost} is its end (the key is exclusive:
    no one else holds it meanwhile).
    """

    def __init__(self) -> None:
        self.granted = False

    def ended(self, event: WatchEvent) -> bool:
        """Apply C{event}; whether the membership ended with it."""
        if event.kind not in HOLDER_EVENTS:
            return False
        if event.kind == GRANTED:
            self.granted = True
            return False
        return self.granted


class Membership(Kept):
    """
    What L{Group.keep_joined} (and its asyncio and Twisted counterparts)
    return: member C{member} of a group, kept: it joins (creating the group
    if it is not there, as after a restart), heartbeats every third of its
    C{lease} (0: no lease, no heartbeat), and, when the membership ends
    without L{stop} (its connection dropped, the server failed over or
    restarted, its lease lapsed, an admin force-released it), tells the
    loss and joins again on a new connection, for as long as it is not
    stopped.

    The application hears of each turn through two callbacks, in order and
    one at a time: C{on_joined(membership)} once it is a member, then
    C{on_lost(MembershipLost)} when that ends; only then does it join
    again, so the loss is always told before the re-join, never silence
    (without C{on_lost}, the loss is logged as a warning).  C{joined} says
    whether it is a member now; L{update} while it is not raises
    L{MembershipLost} (the new capabilities are kept for the re-join).  A
    failed join (no server answers, the member id still taken) is retried
    every C{retry} seconds, logged.  The membership is watched through its
    own key (L{MemberTracker}): one watch of the client's, on the member's
    connection.  An exception a callback raises is logged.
    """

    def __init__(
        self,
        group: Any,
        member: str,
        capabilities: Optional[bytes],
        lease: float,
        on_joined: Optional[Callable[[Any], object]],
        on_lost: Optional[Callable[[MembershipLost], object]],
        retry: float,
    ) -> None:
        self.group = group
        self.member = member
        self.capabilities = capabilities
        self.lease = lease
        self.retry = retry
        self._on_joined = on_joined
        self._on_lost = on_lost
        #: whether it is a member now
        self.joined = False
        #: whether L{stop} was called
        self.stopped = False
        #: how many times it joined
        self.joins = 0
        self.key = member_key(group.name, member)

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "joined" if self.joined else "joining"
        return f"<{type(self).__name__} {self.group.name!r} {self.member!r} {state}>"

    @property
    def heartbeat_interval(self) -> Optional[float]:
        """Seconds between heartbeats (a third of the lease), or None without a lease."""
        return self.lease / 3 if self.lease > 0 else None

    def _joined(self) -> None:
        self.joined = True
        self.joins += 1
        if self._on_joined is not None:
            self._tell(self._on_joined, self)

    def _lost(self, why: str) -> None:
        self.joined = False
        error = MembershipLost(
            f"member {self.member!r} of group {self.group.name!r} was lost: {why}", self.group.name, self.member
        )
        if self._on_lost is None:
            log.warning("%s; joining again", error)
        else:
            self._tell(self._on_lost, error)

    def _not_joined(self) -> MembershipLost:
        return MembershipLost(
            f"member {self.member!r} of group {self.group.name!r} is not joined now (it joins again)",
            self.group.name,
            self.member,
        )

    def _failed(self, error: Exception) -> None:
        log.warning(
            "joining group %r as %r: %s; again in %ss", self.group.name, self.member, describe(error), self.retry
        )

    def _broke(self, error: BaseException) -> None:
        """An error no retry can mend (not a L{ClientError}): logged, and the membership stops."""
        log.error("joining group %r as %r: %s; stopped", self.group.name, self.member, describe(error), exc_info=error)
        self.stopped = True

    def _watch_arguments(self) -> dict[str, Any]:
        """
        The watch of its own key: on the group's server, where it joins
        (with several servers, the member's key would be routed elsewhere).
        """
        return {"key": self.key, "route_by": self.group.key}

    @property
    def client(self) -> Any:
        return self.group.client

    async def _join_steps(self) -> None:
        """
        Join (creating the group if it is not there, as after a restart),
        in a coroutine: the asyncio and Twisted memberships' (the blocking
        one's C{_join} is these steps, called); stopped between the steps,
        it sends no more (L{Stopped}).
        """
        self._going_on()
        try:
            await self.group.create()
        except GroupAlreadyExists:
            pass
        self._going_on()
        await self.group.join(self.member, self.capabilities, self.lease)

    def _going_on(self) -> None:
        """Between the steps of a join: raise L{Stopped} if it was stopped (the client closing) meanwhile."""
        if self.stopped:
            what = f"member {self.member!r} of group {self.group.name!r} was stopped"
            raise Stopped(what, self.group.name, self.member)

    def _halt(self) -> None:
        """As L{Kept._halt}: the server ends the membership with the connection."""
        super()._halt()
        self.joined = False


#: What ends a kept membership's turn, and how it is told.
DROPPED = "its connection dropped"
ENDED = "its lease lapsed, or it was released by someone else"


class BlockingMembership(KeptInThread, Membership):
    """
    L{Membership} over a blocking client: it joins, heartbeats and watches
    in a background thread of its own, where its callbacks are called; a
    loss is noticed as it happens (the watch of its key ends), and the
    re-join is tried at once, then every C{retry} seconds.  L{stop} leaves.
    """

    group: Group

    def start(self) -> BlockingMembership:
        self._watch: Any = None
        self._start_thread(f"jesync member {self.group.name}/{self.member}")
        return self

    def _join(self) -> Any:
        watch = self.group.client.watch(**self._watch_arguments())
        try:
            self._going_on()
            try:
                self.group.create()
            except GroupAlreadyExists:
                pass
            self._going_on()
            self.group.join(self.member, self.capabilities, self.lease)
        except BaseException:
            watch.close()
            raise
        return watch

    def _run(self) -> None:
        while not self.stopped:
            watch = self._attempt(self._join)
            if watch is None:
                continue  # (failed, and retried after a pause; or stopped)
            with self._turn:
                if self.stopped:
                    self._leave_quietly()
                    watch.close()
                    return
                self._watch = watch
                self._joined()
            why = self._until_ended(watch)
            watch.close()
            with self._turn:
                if self.stopped:
                    return
                self._lost(why)

    def _until_ended(self, watch: Any) -> str:
        tracker = MemberTracker()
        while not self.stopped:
            try:
                event = watch.get(self.heartbeat_interval)
                if event is None:  # (the heartbeat's time, or stopped)
                    if self.lease > 0 and not self.stopped and not self.group.heartbeat(self.member, self.lease):
                        return ENDED
                elif tracker.ended(event):
                    return ENDED
            except ClientError:
                return DROPPED
        return ""

    def _leave_quietly(self) -> bool:
        try:
            self.group.leave(self.member)
            return True
        except ClientError:
            return False

    def update(self, capabilities: bytes | str | None) -> None:
        """Set this member's capabilities (kept for every re-join); L{MembershipLost} if it is not a member now."""
        self.capabilities = check_value(capabilities)
        if not self.joined:
            raise self._not_joined()
        try:
            self.group.update(self.member, self.capabilities)
        except ClientError as error:
            raise self._not_joined() from error

    def stop(self) -> bool:
        """Stop keeping the membership and leave the group; whether it was a member until now."""
        with self._turn:
            self.stopped = True
            self._wake.set()
            watch, self._watch = self._watch, None
            was_joined, self.joined = self.joined, False
        if watch is not None:
            watch.close()
        return was_joined and self._leave_quietly()


class AsyncMembership(Membership):
    """
    L{Membership} over an asyncio client: a task of its own in the client's
    loop (the re-join is tried once the loss is told, then every C{retry}
    seconds); C{await update(...)}, C{await stop()}.
    """

    group: AsyncGroup

    def start(self) -> AsyncMembership:
        # whether a join may be on its way to the server (then stop() must not cancel it: see stop)
        self._joining = False
        self._task = asyncio.ensure_future(self._run())
        self._kept()
        return self

    def _halt(self) -> None:
        super()._halt()
        self._task.cancel()

    async def _join(self) -> Any:
        watch = await self.group.client.watch(**self._watch_arguments())
        try:
            await self._join_steps()
        except BaseException:
            await watch.close()
            raise
        return watch

    async def _run(self) -> None:
        while not self.stopped:
            self._joining = True
            try:
                watch = await self._join()
            except ClientError as error:
                if self.stopped:
                    return
                self._failed(error)
                await asyncio.sleep(self.retry)
                continue
            except Exception as error:
                self._broke(error)
                return
            finally:
                self._joining = False
            if self.stopped:  # (stopped while the join was on its way: it landed, so leave)
                await self._leave_quietly()
                await watch.close()
                return
            try:
                self._joined()
                why = await self._until_ended(watch)
            finally:
                await watch.close()
            self._lost(why)

    async def _leave_quietly(self) -> bool:
        try:
            await self.group.leave(self.member)
            return True
        except ClientError:
            return False

    async def _until_ended(self, watch: Any) -> str:
        tracker = MemberTracker()
        while True:
            try:
                event = await watch.get(self.heartbeat_interval)
                if event is None:  # (the heartbeat's time; without a lease, the watch closed)
                    if self.lease <= 0:
                        return DROPPED
                    if not await self.group.heartbeat(self.member, self.lease):
                        return ENDED
                elif tracker.ended(event):
                    return ENDED
            except ClientError:
                return DROPPED

    async def update(self, capabilities: bytes | str | None) -> None:
        """As L{BlockingMembership.update}, awaited."""
        self.capabilities = check_value(capabilities)
        if not self.joined:
            raise self._not_joined()
        try:
            await self.group.update(self.member, self.capabilities)
        except ClientError as error:
            raise self._not_joined() from error

    async def stop(self) -> bool:
        """
        Stop keeping the membership and leave the group; whether it was a
        member until now.  A join on its way to the server is not cancelled
        (it could land all the same, and leave a member behind): it is
        awaited, and left if it landed.
        """
        self.stopped = True
        was_joined, self.joined = self.joined, False
        if self._joining:
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            return False
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        return was_joined and await self._leave_quietly()
