"""The ways a lock request can fail."""

from __future__ import annotations

from typing import Sequence


class LockTimeout(Exception):
    """
    A wait for a lock ran out of time before the lock could be granted.

    @ivar key: the key (a multi-key request's first key).
    @ivar busy: the keys that stood in the way when the time ran out: those
        held, or reserved by an earlier request (for one key: that key).
    """

    def __init__(self, key: str, busy: Sequence[str] | None = None) -> None:
        super().__init__(f"timed out waiting for {key!r}")
        self.key = key
        self.busy = [key] if busy is None else list(busy)


class AlreadyWaiting(Exception):
    """
    The owner is already waiting for this key.

    The earlier request stays queued and will be answered; this one changes
    nothing.
    """

    def __init__(self, key: str) -> None:
        super().__init__(f"already waiting for {key!r}")
        self.key = key


class ModeConflict(Exception):
    """
    The owner holds the key in the other mode: a shared holder asked for it
    exclusive (an upgrade) or an exclusive holder asked for it shared (a
    downgrade).  Neither exists: it is refused at once, nothing changes, and
    the owner keeps its grant (so no two upgrading readers can deadlock).
    Release it and ask again in the mode wanted.

    @ivar key: the key.
    @ivar held: the mode the owner holds it in (C{"shared"} or C{"exclusive"}).
    """

    def __init__(self, key: str, held: str) -> None:
        wanted = "exclusive" if held == "shared" else "shared"
        super().__init__(
            f"{key!r} is held {held} by this owner: no upgrade or downgrade to {wanted}; release it first"
        )
        self.key = key
        self.held = held


def show_number(value: float) -> str:
    """A count or a number of seconds as people write it: 10, not 10.0; 0.2 as 0.2."""
    return str(int(value)) if value == int(value) else str(value)


class LimitReached(Exception):
    """
    A request would exceed one of the server's limits; nothing changed.

    @ivar limit: the limit's name, as its command-line option says it
        (C{"max-keys"}, C{"max-waiters"}, C{"max-total-waits"}, C{"max-held"},
        C{"max-key-length"}, C{"max-connections"}, C{"max-sessions"},
        C{"max-watches"}, C{"max-total-watches"},
        C{"auth-timeout"}, C{"idle-timeout"}).
    @ivar value: the limit (a count, or seconds for a timeout).
    """

    def __init__(self, limit: str, value: float) -> None:
        super().__init__(f"{limit} exceeded ({show_number(value)})")
        self.limit = limit
        self.value = value


class ProtectedMode(LimitReached):
    """
    The server has no auth token and runs in protected mode, and the client
    is neither on loopback nor on a UNIX socket: it is refused, with a line
    that says how to let it in.
    """

    MESSAGE = (
        "protected mode: the server has no auth token and this client is not local; "
        "set --auth-token-file, or run with --protected-mode off on a trusted network"
    )

    def __init__(self) -> None:
        Exception.__init__(self, self.MESSAGE)
        self.limit = "protected-mode"
        self.value = 0


class GroupError(Exception):
    """
    A group request (L{jesync.groups.GroupTable}) that the groups as they
    are refuse; nothing changed.

    @ivar group: the group's name.
    """

    def __init__(self, message: str, group: str) -> None:
        super().__init__(message)
        self.group = group


class GroupNotCreated(GroupError):
    """No group of that name exists (never created, or deleted)."""

    def __init__(self, group: str) -> None:
        super().__init__(f"group {group!r} does not exist: create it first", group)


class GroupAlreadyExists(GroupError):
    """A group of that name exists already."""

    def __init__(self, group: str) -> None:
        super().__init__(f"group {group!r} exists already", group)


class GroupKeyTaken(GroupError):
    """
    The group's key is held (or waited for) by someone who locked it by hand,
    not by the group table: no group can be created under it until it is free.
    """

    def __init__(self, group: str, key: str) -> None:
        super().__init__(
            f"group {group!r} cannot be created: its key {key!r} is locked by a client, not the group table",
            group,
        )
        self.key = key


class GroupNotEmpty(GroupError):
    """The group still has members: they leave (or are lost) before it can be deleted."""

    def __init__(self, group: str) -> None:
        super().__init__(f"group {group!r} still has members", group)


class MemberAlreadyExists(GroupError):
    """The member id is taken in the group: someone (the asker too) holds its key."""

    def __init__(self, group: str, member: str) -> None:
        super().__init__(f"member {member!r} of group {group!r} exists already", group)
        self.member = member


class MemberNotJoined(GroupError):
    """The asker is not that member of the group (it never joined, left, or its lease lapsed)."""

    def __init__(self, group: str, member: str) -> None:
        super().__init__(f"{member!r} is not a member of group {group!r} (for this owner)", group)
        self.member = member
