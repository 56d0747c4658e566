"""
The JESync wire protocol (JESync 0.8.1, with the changes docs/protocols/jesync.md lists):
its grammar, served by L{JESyncFactory}.

One command per line; every reply is one line (listings: several, then END)
and names its key.  A C{lock} that has to wait does not hold up the
connection: later commands are answered meanwhile, and the C{lock} is answered
when it is granted or does not get the lock (it timed out, or the client
sent FIN while it waited).

The coordination extensions (docs/protocols/jesync.md) add, without
changing a byte of what a client that does not use them reads: a value on
a grant, shared locks, and watches.  The one line nobody asked for is a
watch's C{EVENT}, only ever to a connection that watches, written from
inside the table change it reports, so it goes out before the reply to any
later request that could observe that change.

Groups (C{group-create}, C{group-join}, ...) are the factory's
L{jesync.groups.GroupTable}'s rules, this grammar only their words: a
member is the connection that joined, so its close ends its memberships.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from jesync.connections.connection import LockServerFactory
from jesync.connections.grammar import PIECE, CommandGrammar
from jesync.connections.listings import ROW_BYTES
from jesync.connections.policy import ConnectionPolicy
from jesync.errors import (
    AlreadyWaiting,
    GroupAlreadyExists,
    GroupKeyTaken,
    GroupNotCreated,
    GroupNotEmpty,
    LockTimeout,
    MemberAlreadyExists,
    MemberNotJoined,
    ModeConflict,
)
from jesync.groups import GroupTable
from jesync.interfaces import GRANTED, IGrant, ILockService, LockEvent
from jesync.service import EXCLUSIVE, SHARED
from jesync.wire import (
    DEFAULT_EXPIRES,
    WAIT_FOREVER,
    GROUP_PREFIX,
    MEMBER_SEPARATOR,
    BadRequest,
    ListingOrder,
    decode_key,
    encode_key,
    granted_reply,
    no_arguments,
    only_argument,
    decode_value,
    encode_value,
    parse_integer,
    status_reply,
)


def whole_seconds_left(grant: IGrant) -> int:
    """Seconds until C{grant} expires, to the nearest second; 0 if it never does."""
    seconds_left = grant.seconds_left
    return 0 if seconds_left is None else round(seconds_left)


def describe_owner(owner: object) -> bytes:
    """One field naming a holder: a connection's peer address, or what an embedder's owner calls itself."""
    return name_field(getattr(owner, "peer", None) or repr(owner))


def holder_line(raw_key: bytes, grant: IGrant, now: float) -> bytes:
    """
    C{HOLDER <key> <peer> <held_seconds> <seconds_left> <token>}, as ever
    for an exclusive holder without a value; a shared one's line ends with
    C{ shared}, and one with a value with C{ <mode> <value>} (percent-encoded).
    """
    line = b"HOLDER %s %s %d %d %d" % (
        raw_key,
        describe_owner(grant.owner),
        int(now - grant.granted_at),
        whole_seconds_left(grant),
        grant.token,
    )
    value = grant.value
    if value:  # (an embedder's b"" is shown as no value: a field is never empty)
        return b"%s %s %s" % (line, grant.mode.encode(), encode_value(value))
    if grant.mode == SHARED:
        return line + b" shared"
    return line


@lru_cache(maxsize=1)
def event_line(event: LockEvent) -> bytes:
    """
    A watch's event line, with its end: C{EVENT GRANTED <key> <peer>
    <token> <mode>[ <value>]}; C{EVENT RELEASED|EXPIRED|LOST <key> <peer>
    <token>}; C{EVENT APPEARED|DISAPPEARED <key>}.  Made once for all the
    watchers of a change (the service tells each the same event; making it
    once per watcher was a fifth of the server's time, telling 1,000).
    """
    kind = event.kind.upper().encode()
    grant = event.grant
    if grant is None:
        return b"EVENT %s %s\n" % (kind, encode_key(event.key))
    line = b"EVENT %s %s %s %d" % (kind, encode_key(event.key), describe_owner(grant.owner), grant.token)
    if event.kind != GRANTED:
        return line + b"\n"
    value = grant.value
    if not value:
        return b"%s %s\n" % (line, grant.mode.encode())
    return b"%s %s %s\n" % (line, grant.mode.encode(), encode_value(value))


def member_line(raw_name: bytes, member: str, grant: IGrant) -> bytes:
    """C{MEMBER <G> <M> <peer> <token>}, then C{ <capabilities>} (percent-encoded) if it has any."""
    line = b"MEMBER %s %s %s %d" % (raw_name, encode_key(member), describe_owner(grant.owner), grant.token)
    value = grant.value
    return b"%s %s" % (line, encode_value(value)) if value else line


def name_field(name: str) -> bytes:
    """A name (an address, say) as one field of a listing's line: its whitespace made C{_}."""
    return "_".join(name.split()).encode("utf-8", "backslashreplace")


class JESyncProtocol(CommandGrammar):
    """
    The JESync grammar; its connection is the owner of the locks it takes.

    @ivar fencing: whether grants carry their fencing token (C{fencing on}).
    """

    fencing = False

    def unknown_command(self, word: bytes) -> bytes:
        return b"INVALID_COMMAND"

    def bad_request(self, message: str) -> bytes:
        return b"INVALID_PARAMETER: " + message.encode()

    limit_reached = bad_request

    def auth_accepted(self) -> bytes:
        return b"OK"

    def auth_refused(self) -> bytes:
        return b"INVALID_PARAMETER: auth failed\n"

    def _reply_status(self, word: bytes, key: str, raw_key: bytes) -> None:
        status = self.service.status(key)
        self.reply(status_reply(word, status.granted, status.waiting, raw_key))

    # -- commands ---------------------------------------------------------

    def do_lock(self, args: List[bytes]) -> None:
        """C{lock <key>[ <max_concurrent>[ <timeout>[ <expires>[ <value>]]]]}: exclusive (a counting lock)."""
        if not args:
            raise BadRequest("missing key")
        if len(args) > 5:
            raise BadRequest("too many arguments")
        max_concurrent = parse_integer(args[1], "max_concurrent") if len(args) > 1 else 1
        self._lock(args[0], max_concurrent, args[2:], EXCLUSIVE)

    def do_lock_shared(self, args: List[bytes]) -> None:
        """An extension: C{lock-shared <key>[ <timeout>[ <expires>[ <value>]]]}: a shared (read) lock."""
        if not args:
            raise BadRequest("missing key")
        if len(args) > 4:
            raise BadRequest("too many arguments")
        self._lock(args[0], 1, args[1:], SHARED)

    def _lock(self, raw_key: bytes, max_concurrent: int, rest: List[bytes], mode: str) -> None:
        """A lock request: C{rest} is its optional C{<timeout> <expires> <value>}."""
        key = self.key(raw_key)
        timeout = parse_integer(rest[0], "timeout") if rest else WAIT_FOREVER
        expires = parse_integer(rest[1], "expires") if len(rest) > 1 else DEFAULT_EXPIRES
        value = decode_value(rest[2]) if len(rest) > 2 else None
        if not self.connection.may_wait and timeout >= WAIT_FOREVER:
            timeout = 0  # after a FIN: granted now, or not at all
        try:
            result = self.service.request(key, self.connection, max_concurrent, timeout, expires, mode, value)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        if isinstance(result, Deferred):
            result.addCallbacks(self._granted, self._not_granted, callbackArgs=(raw_key,), errbackArgs=(raw_key,))
            self.connection.await_reply(result)
        else:
            self._granted(result, raw_key)

    def _granted(self, grant: IGrant, raw_key: bytes) -> None:
        status = self.service.status(grant.key)
        line = granted_reply(status.granted, status.waiting, raw_key, whole_seconds_left(grant))
        if self.fencing:
            line += b" %d" % grant.token
        self.reply(line)

    def _not_granted(self, failure: Failure, raw_key: bytes) -> None:
        # LockTimeout: the wait timed out.  CancelledError: the client sent
        # FIN while it waited (once the connection is closing, nothing is sent).
        if failure.check(LockTimeout, CancelledError):
            self._reply_status(b"TIMEOUT", self.key(raw_key), raw_key)
        elif failure.check(ModeConflict):
            # (an upgrade or a downgrade: refused at once, its grant kept)
            self.reply(self.bad_request(str(failure.value)))
        elif not failure.check(AlreadyWaiting):
            # AlreadyWaiting: the first request will be answered.
            self.log.failure("lock request failed", failure)

    def do_lock_many(self, args: List[bytes]) -> None:
        """An extension: C{lock-many <timeout> <expires> <key>...}, all or nothing, a mutex on each."""
        self._lock_many(args, EXCLUSIVE)

    def do_lock_many_shared(self, args: List[bytes]) -> None:
        """An extension: C{lock-many-shared <timeout> <expires> <key>...}, all or nothing, shared on each."""
        self._lock_many(args, SHARED)

    def _lock_many(self, args: List[bytes], mode: str) -> None:
        if len(args) < 3:
            raise BadRequest("lock-many takes a timeout, an expiry and at least one key")
        timeout = parse_integer(args[0], "timeout")
        expires = parse_integer(args[1], "expires")
        raw_keys = list(dict.fromkeys(args[2:]))
        keys = [self.key(raw_key) for raw_key in raw_keys]
        if not self.connection.may_wait and timeout >= WAIT_FOREVER:
            timeout = 0
        try:
            result = self.service.request_many(keys, self.connection, timeout, expires, mode)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        if isinstance(result, Deferred):
            result.addCallbacks(self._granted_many, self._not_granted_many, (raw_keys,), errbackArgs=(raw_keys,))
            self.connection.await_reply(result)
        else:
            self._granted_many(result, raw_keys)

    def _granted_many(self, grants: List[IGrant], raw_keys: List[bytes]) -> None:
        line = b"GRANTED-MANY %d %d %s" % (len(raw_keys), whole_seconds_left(grants[0]), b" ".join(raw_keys))
        if self.fencing:
            line += b"".join(b" %d" % grant.token for grant in grants)
        self.reply(line)

    def _not_granted_many(self, failure: Failure, raw_keys: Sequence[bytes]) -> None:
        if failure.check(LockTimeout, CancelledError):
            self.reply(b"TIMEOUT-MANY %d %s" % (len(raw_keys), b" ".join(raw_keys)))
        elif failure.check(AlreadyWaiting, ModeConflict):
            # (unlike a second `lock`, no earlier request will answer it)
            self.reply(self.bad_request(str(failure.value)))
        else:
            self.log.failure("lock request failed", failure)

    def do_fencing(self, args: List[bytes]) -> None:
        """An extension: C{fencing on|off}: whether GRANTED carries the grant's fencing token."""
        self.fencing = self.switch(args, "fencing")
        self.reply(b"FENCING ON" if self.fencing else b"FENCING OFF")

    def do_release(self, args: List[bytes]) -> None:
        raw_key = only_argument(args, "key")
        key = self.key(raw_key)
        word = b"RELEASED" if self.service.release(key, self.connection) else b"NOT_RELEASED"
        self._reply_status(word, key, raw_key)

    def do_status(self, args: List[bytes]) -> None:
        """C{status <key>}: C{STATUS <granted> <waiting> <key>}, then C{ shared} if its holders hold it shared."""
        raw_key = only_argument(args, "key")
        key = self.key(raw_key)
        status = self.service.status(key)
        line = status_reply(b"STATUS", status.granted, status.waiting, raw_key)
        if status.granted and self.service.shared_keys and self._held_shared(key):
            line += b" shared"
        self.reply(line)

    def _held_shared(self, key: str) -> bool:
        """Whether C{key}'s holders (it has some) hold it shared."""
        holders = self.service.holders(key)
        return bool(holders) and holders[0].mode == SHARED

    def do_owned(self, args: List[bytes]) -> None:
        """
        An extension: whether this connection holds a key, and for how long
        yet (milliseconds; -1: no failsafe expiry), as redis-py's C{owned()}.
        """
        raw_key = only_argument(args, "key")
        grant = self.service.grant_of(self.key(raw_key), self.connection)
        if grant is None:
            self.reply(b"NOT_OWNED " + raw_key)
            return
        seconds_left = grant.seconds_left
        self.reply(b"OWNED %d %s" % (-1 if seconds_left is None else int(seconds_left * 1000), raw_key))

    def do_holders(self, args: List[bytes]) -> None:
        """
        An extension: who holds a key, for how long so far, for how long yet,
        and its fencing token; then C{shared} for a shared holder without a
        value, C{<mode> <value>} for a holder with one.
        """
        raw_key = only_argument(args, "key")
        now = self.service.clock.seconds()
        grants = self.service.holders(self.key(raw_key))
        lines = [holder_line(raw_key, grant, now) for grant in grants]
        lines.append(b"END")
        self.reply_listing(lines)

    def _listing(self, order: ListingOrder, args: List[bytes]) -> None:
        """
        A status listing: from the snapshot of the table in C{order} that
        another listing is sending, if the table has not changed since it
        was taken; otherwise from a new one (sorted once), within the
        server's C{--max-listing-memory} (L{jesync.connections.listings}).
        A table too small to fill a piece of a stream is listed at once,
        shared and charged nothing.  A key held shared when the snapshot
        was taken is marked C{shared} (its row says so; while no key is
        held shared, no row does, and the listing costs what it did).
        """
        no_arguments(args)
        service = self.service
        size = service.totals().keys * ROW_BYTES
        # (a snapshot of this version was taken with this many keys held shared)
        shared = bool(service.shared_keys)
        if size < PIECE:
            # (a small table: its listing is most likely less than a piece, written at once)
            lines = list(_status_lines(service.snapshot(order), shared))
            lines.append(b"END")
            self.reply_listing(lines)
            return
        snapshot = self.connection.policy.listings.share(
            ("status", order), service.version, size, lambda: service.snapshot(order)
        )
        self.reply_stream(ended_listing(_status_lines(snapshot.rows, shared)), snapshot)

    def do_status_by_key(self, args: List[bytes]) -> None:
        self._listing("key", args)

    def do_status_by_requests(self, args: List[bytes]) -> None:
        self._listing("requests", args)

    def do_status_by_grants(self, args: List[bytes]) -> None:
        self._listing("grants", args)

    # -- watches ------------------------------------------------------------

    def do_watch(self, args: List[bytes]) -> None:
        """An extension: C{watch <key>}: events for the key's holders (L{event_line}) from now on."""
        raw_key = only_argument(args, "key")
        self._watch(self.key(raw_key), False)
        self.reply(b"WATCHING " + raw_key)

    def do_watch_prefix(self, args: List[bytes]) -> None:
        """An extension: C{watch-prefix [<prefix>]}: events for every key with the prefix (without one: every key)."""
        raw_prefix = self._prefix_argument(args)
        self._watch(self.key(raw_prefix) if raw_prefix else "", True)
        self.reply(b"WATCHING-PREFIX " + raw_prefix if raw_prefix else b"WATCHING-PREFIX")

    def do_unwatch(self, args: List[bytes]) -> None:
        raw_key = only_argument(args, "key")
        watched = self.service.unwatch(self.connection, self.key(raw_key), False)
        self.reply((b"UNWATCHED " if watched else b"NOT_WATCHING ") + raw_key)

    def do_unwatch_prefix(self, args: List[bytes]) -> None:
        raw_prefix = self._prefix_argument(args)
        watched = self.service.unwatch(self.connection, self.key(raw_prefix) if raw_prefix else "", True)
        word = b"UNWATCHED-PREFIX" if watched else b"NOT_WATCHING-PREFIX"
        self.reply(word + b" " + raw_prefix if raw_prefix else word)

    @staticmethod
    def _prefix_argument(args: List[bytes]) -> bytes:
        if len(args) > 1:
            raise BadRequest("too many arguments")
        return args[0] if args else b""

    def _watch(self, key: str, prefix: bool) -> None:
        """Watch C{key} (or the prefix); L{LimitReached} past a cap (the grammar's limit reply)."""
        try:
            self.service.watch(self.connection, key, self._event, prefix)
        except ValueError as error:
            raise BadRequest(str(error)) from None

    def _event(self, event: LockEvent) -> None:
        """
        A change of a watched key, told while the lock table changes: its
        line is written now, so it goes out before the reply to any later
        request (L{jesync.connections.connection.LockConnection.write_event}
        never closes the connection from here).
        """
        line = event_line(event)
        connection = self.connection
        if connection.verbose:
            self.log.debug("{peer} was sent {line!r}", peer=connection.peer, line=line)
        connection.write_event(line)

    # -- groups ------------------------------------------------------------------

    @property
    def groups(self) -> GroupTable:
        return self.connection.factory.groups

    def _group_name(self, raw_name: bytes) -> str:
        """A group name argument: its key within max-key-length, without C{\\r} or C{/}."""
        self.key(GROUP_PREFIX.encode() + raw_name)
        if MEMBER_SEPARATOR.encode() in raw_name:
            raise BadRequest(f"a group name cannot contain {MEMBER_SEPARATOR!r}")
        return decode_key(raw_name)

    def _member_names(self, raw_name: bytes, raw_member: bytes) -> Tuple[str, str]:
        """A group name and a member id: the member's key within max-key-length."""
        name = self._group_name(raw_name)
        self.key(GROUP_PREFIX.encode() + raw_name + MEMBER_SEPARATOR.encode() + raw_member)
        return name, decode_key(raw_member)

    def do_group_create(self, args: List[bytes]) -> None:
        """An extension: C{group-create <G>}: C{GROUP-CREATED <G>}, or C{GROUP-EXISTS <G>}."""
        raw_name = only_argument(args, "group")
        try:
            self.groups.create(self._group_name(raw_name))
        except GroupAlreadyExists:
            self.reply(b"GROUP-EXISTS " + raw_name)
        except (GroupKeyTaken, ValueError) as error:
            raise BadRequest(str(error)) from None
        else:
            self.reply(b"GROUP-CREATED " + raw_name)

    def do_group_delete(self, args: List[bytes]) -> None:
        """An extension: C{group-delete <G>}: C{GROUP-DELETED}, C{NO_GROUP} or C{GROUP-NOT-EMPTY}, and C{<G>}."""
        raw_name = only_argument(args, "group")
        try:
            self.groups.delete(self._group_name(raw_name))
        except GroupNotCreated:
            self.reply(b"NO_GROUP " + raw_name)
        except GroupNotEmpty:
            self.reply(b"GROUP-NOT-EMPTY " + raw_name)
        else:
            self.reply(b"GROUP-DELETED " + raw_name)

    def do_group_join(self, args: List[bytes]) -> None:
        """
        An extension: C{group-join <G> <M> <lease>[ <capabilities>]}:
        C{JOINED <G> <M> <seconds_left>}, C{NO_GROUP <G>} or C{MEMBER-EXISTS <G> <M>}.
        """
        if len(args) < 3:
            raise BadRequest("group-join takes a group, a member and a lease")
        if len(args) > 4:
            raise BadRequest("too many arguments")
        name, member = self._member_names(args[0], args[1])
        lease = parse_integer(args[2], "lease")
        capabilities = decode_value(args[3]) if len(args) > 3 else None
        try:
            grant = self.groups.join(name, member, self.connection, capabilities, lease)
        except GroupNotCreated:
            self.reply(b"NO_GROUP " + args[0])
        except MemberAlreadyExists:
            self.reply(b"MEMBER-EXISTS %s %s" % (args[0], args[1]))
        except ValueError as error:
            raise BadRequest(str(error)) from None
        else:
            self._joined(grant, args[0], args[1])

    def _joined(self, grant: IGrant, raw_name: bytes, raw_member: bytes) -> None:
        self.reply(b"JOINED %s %s %d" % (raw_name, raw_member, whole_seconds_left(grant)))

    def _member_arguments(self, args: List[bytes], count: int, usage: str) -> Tuple[str, str]:
        if len(args) < count:
            raise BadRequest(usage)
        if len(args) > count:
            raise BadRequest("too many arguments")
        return self._member_names(args[0], args[1])

    def do_group_heartbeat(self, args: List[bytes]) -> None:
        """An extension: C{group-heartbeat <G> <M> <lease>}: C{JOINED <G> <M> <seconds_left>} or C{NOT_JOINED}."""
        name, member = self._member_arguments(args, 3, "group-heartbeat takes a group, a member and a lease")
        lease = parse_integer(args[2], "lease")
        try:
            renewed = self.groups.heartbeat(name, member, self.connection, lease)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        grant = self.groups.member_grant(name, member, self.connection) if renewed else None
        if grant is None:
            self.reply(b"NOT_JOINED %s %s" % (args[0], args[1]))
        else:
            self._joined(grant, args[0], args[1])

    def do_group_update(self, args: List[bytes]) -> None:
        """An extension: C{group-update <G> <M> <capabilities>}: C{UPDATED <G> <M>} or C{NOT_JOINED <G> <M>}."""
        name, member = self._member_arguments(args, 3, "group-update takes a group, a member and capabilities")
        capabilities = decode_value(args[2])
        try:
            self.groups.update(name, member, self.connection, capabilities)
        except MemberNotJoined:
            self.reply(b"NOT_JOINED %s %s" % (args[0], args[1]))
        except ValueError as error:
            raise BadRequest(str(error)) from None
        else:
            self.reply(b"UPDATED %s %s" % (args[0], args[1]))

    def do_group_leave(self, args: List[bytes]) -> None:
        """An extension: C{group-leave <G> <M>}: C{LEFT <G> <M>} or C{NOT_JOINED <G> <M>}."""
        name, member = self._member_arguments(args, 2, "group-leave takes a group and a member")
        try:
            self.groups.leave(name, member, self.connection)
        except MemberNotJoined:
            self.reply(b"NOT_JOINED %s %s" % (args[0], args[1]))
        else:
            self.reply(b"LEFT %s %s" % (args[0], args[1]))

    def do_group_members(self, args: List[bytes]) -> None:
        """
        An extension: C{group-members <G>}: C{MEMBER <G> <M> <peer> <token>[
        <capabilities>]} for each member in join order, then C{END}; or C{NO_GROUP <G>}.
        """
        raw_name = only_argument(args, "group")
        try:
            members = self.groups.member_grants(self._group_name(raw_name))
        except GroupNotCreated:
            self.reply(b"NO_GROUP " + raw_name)
            return
        lines = [member_line(raw_name, member, grant) for member, grant in members.items()]
        lines.append(b"END")
        self.reply_listing(lines)

    def do_groups(self, args: List[bytes]) -> None:
        """An extension: C{groups}: C{GROUP <G>} for each group, sorted, then C{END}."""
        no_arguments(args)
        lines = [b"GROUP " + encode_key(name) for name in self.groups.groups()]
        lines.append(b"END")
        self.reply_listing(lines)

    def holds_nothing(self) -> bool:
        """Whether the connection holds, waits for and watches nothing (a watcher waits for events: not idle)."""
        return super().holds_nothing() and not self.service.watches_of(self.connection)

    def do_quit(self, args: List[bytes]) -> None:
        no_arguments(args)
        self.connection.close()


def _status_lines(rows: Sequence[tuple], shared: bool = False) -> Iterator[bytes]:
    """
    A listing's lines, from its snapshot (shared: read, never changed); if
    any key was held C{shared} when it was taken, the line of each such key
    (a row of four) ends with C{ shared}.
    """
    if not shared:
        for key, granted, waiting in rows:
            yield status_reply(b"STATUS", granted, waiting, encode_key(key))
        return
    for row in rows:
        line = status_reply(b"STATUS", row[1], row[2], encode_key(row[0]))
        yield line + b" shared" if len(row) > 3 else line


def ended_listing(lines: Iterable[bytes]) -> Iterator[bytes]:
    """A listing's lines, then its C{END}."""
    yield from lines
    yield b"END"


JESyncProtocol.commands = {
    b"lock": JESyncProtocol.do_lock,
    b"lock-many": JESyncProtocol.do_lock_many,
    b"lock-shared": JESyncProtocol.do_lock_shared,
    b"lock-many-shared": JESyncProtocol.do_lock_many_shared,
    b"fencing": JESyncProtocol.do_fencing,
    b"release": JESyncProtocol.do_release,
    b"status": JESyncProtocol.do_status,
    b"holders": JESyncProtocol.do_holders,
    b"owned": JESyncProtocol.do_owned,
    b"status-by-key": JESyncProtocol.do_status_by_key,
    b"status-by-requests": JESyncProtocol.do_status_by_requests,
    b"status-by-grants": JESyncProtocol.do_status_by_grants,
    b"watch": JESyncProtocol.do_watch,
    b"watch-prefix": JESyncProtocol.do_watch_prefix,
    b"unwatch": JESyncProtocol.do_unwatch,
    b"unwatch-prefix": JESyncProtocol.do_unwatch_prefix,
    b"group-create": JESyncProtocol.do_group_create,
    b"group-delete": JESyncProtocol.do_group_delete,
    b"group-join": JESyncProtocol.do_group_join,
    b"group-heartbeat": JESyncProtocol.do_group_heartbeat,
    b"group-update": JESyncProtocol.do_group_update,
    b"group-leave": JESyncProtocol.do_group_leave,
    b"group-members": JESyncProtocol.do_group_members,
    b"groups": JESyncProtocol.do_groups,
    b"quit": JESyncProtocol.do_quit,
}


class JESyncFactory(LockServerFactory):
    """
    Serves the JESync protocol over a lock service; listen on it with any
    stream endpoint.  See L{LockServerFactory} for the parameters.

    @param groups: the groups its C{group-*} commands serve: the server's
        one L{GroupTable} over C{service} (the composition root makes it);
        without one, a table of its own with the default limits.
    """

    grammar = JESyncProtocol

    def __init__(
        self,
        service: ILockService,
        verbose: bool = False,
        policy: Optional[ConnectionPolicy] = None,
        groups: Optional[GroupTable] = None,
    ) -> None:
        super().__init__(service, verbose, policy)
        self.groups = groups if groups is not None else GroupTable(service)
