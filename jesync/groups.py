"""
Groups and their members, as rules over the lock table (as L{jesync.store}
is for memcached's objects): no second store, every fact a holder of a key.

B{Names} (L{jesync.wire}'s, which the clients share; docs/coordination.md):

 - A group C{G} is the key C{group:G}, held exclusive and never expiring by
   the group table's own anchor (an owner of its own, one per group, so
   C{--max-held} never caps the groups) while the group exists.  A group
   name is a key without C{/}, so no group's key is another's member key.
 - A member C{M} of C{G} is a holder of C{group:G/M} (exclusive: one holder),
   its capabilities the grant's value, its heartbeat lease the grant's
   failsafe expiry (0: none, then only its owner going away ends it).  A
   heartbeat is a renewal; an update of capabilities is a renewal with a
   value (with the member's last lease: an update proves it alive too).
   A member id may contain C{/} (the group's name ends at the first one).
 - So membership ends however a grant ends: a leave (a release), a lease
   that lapsed without a heartbeat (an expiry), the owner's connection
   closing (LOST), an elock C{unlock_all}, an admin's force-release.
   Watching C{group:G/} with a prefix watch sees joins (GRANTED) and leaves
   (RELEASED, EXPIRED, LOST) in the table's order.

Anyone may lock these keys by hand too: they are keys like any other.  A
hand-held C{group:G/M} is member C{M} of C{G} (while C{G} exists); a
hand-held C{group:G} is not a group, and creating C{G} is then refused
(L{GroupKeyTaken}) rather than queued behind it.

B{The index.}  Which groups exist and which members each has (in join
order) is kept from the table's own events: the table watches the prefix
C{group:} as its own owner, so whatever ends a grant updates it, and a
listing costs what it lists, not the table's size.  The watch starts at
the table's first use (with one pass over the keys held then, for any
locked by hand before it), so a server whose clients never use groups
pays nothing on its plain lock path; once started, every change of the
lock table costs the prefix test of L{jesync.service}'s watches.

B{Limits}: C{max_groups} groups, C{max_members} members per group (hand-held
member keys count); past them L{LimitReached} (C{max-groups},
C{max-members}), nothing changed.  The lock table's own limits
(C{max-keys}, C{max-held} for a member's owner) apply as to any grant.

B{Cluster mode}: groups live in the leader's lock table and are not in its
journal: like a connection's locks, they end with a failover (the new
leader starts with none), and the clients create and join them again.
"""

from __future__ import annotations

from typing import Dict, Hashable, List, Optional

from twisted.internet.defer import Deferred

from jesync.errors import (
    GroupAlreadyExists,
    GroupKeyTaken,
    GroupNotCreated,
    GroupNotEmpty,
    LimitReached,
    MemberAlreadyExists,
    MemberNotJoined,
)
from jesync.interfaces import GRANTED, IGrant, ILockService, LockEvent
from jesync.service import renew_grant
from jesync.wire import EXCLUSIVE, GROUP_PREFIX, MEMBER_SEPARATOR, group_key, key_problem, member_key

#: The defaults of --max-groups and --max-members.
DEFAULT_MAX_GROUPS = 10_000
DEFAULT_MAX_MEMBERS = 10_000
#: No length limit of its own: a protocol checks its keys' (max-key-length).
_ANY_LENGTH = 2**31


class GroupAnchor:
    """The owner that holds one group's key for the group table while the group exists."""

    __slots__ = ("table", "group")
    #: How a listing names it (C{holders group:G}, a watch's events).
    peer = "group-table"

    def __init__(self, table: GroupTable, group: str) -> None:
        self.table = table
        self.group = group

    def __repr__(self) -> str:
        return f"<GroupAnchor {self.group!r}>"


def check_group_name(name: str) -> None:
    """Raise ValueError unless C{name} can name a group: a key without C{/}."""
    if MEMBER_SEPARATOR in name:
        raise ValueError(f"a group name cannot contain {MEMBER_SEPARATOR!r}: {name!r}")
    problem = key_problem(name, _ANY_LENGTH)
    if problem is not None:
        raise ValueError(problem.replace("a key", "a group name", 1))


def check_member_id(member: str) -> None:
    """Raise ValueError unless C{member} can be a member's id: any key."""
    problem = key_problem(member, _ANY_LENGTH)
    if problem is not None:
        raise ValueError(problem.replace("a key", "a member id", 1))


def split_group_key(key: str) -> tuple[str, Optional[str]]:
    """A key under C{group:} as its group's name and member id (None: the group's own key)."""
    name, separator, member = key[len(GROUP_PREFIX) :].partition(MEMBER_SEPARATOR)
    return name, (member if separator else None)


class GroupTable:
    """
    Groups over C{service}'s lock table (the module's rules).

    @param service: the lock table, shared with every protocol.
    @param max_groups: the most groups at once (None: no limit).
    @param max_members: the most members one group may have (None: no limit).
    """

    def __init__(
        self,
        service: ILockService,
        max_groups: Optional[int] = DEFAULT_MAX_GROUPS,
        max_members: Optional[int] = DEFAULT_MAX_MEMBERS,
    ) -> None:
        self.service = service
        self.max_groups = max_groups
        self.max_members = max_members
        self._watching = False
        # Groups that exist (their key held by their anchor), in creation order.
        self._groups: Dict[str, None] = {}
        # Group name -> its member ids in join order: every held member key,
        # whether its group exists or not (so a group created after a member
        # key was locked by hand lists it).
        self._members: Dict[str, Dict[str, None]] = {}
        # The lease each member joined or last heartbeat with (what an update renews with).
        self._leases: Dict[IGrant, float] = {}

    # -- groups ------------------------------------------------------------------

    def create(self, name: str) -> None:
        """
        Create group C{name}.

        @raise ValueError: C{name} cannot name a group.
        @raise GroupAlreadyExists: it exists.
        @raise GroupKeyTaken: its key is held by a client (locked by hand).
        @raise LimitReached: C{max-groups} (or a lock-table limit: C{max-keys}).
        """
        check_group_name(name)
        self._start()
        if name in self._groups:
            raise GroupAlreadyExists(name)
        key = group_key(name)
        if self.max_groups is not None and len(self._groups) >= self.max_groups:
            raise LimitReached("max-groups", self.max_groups)
        result = self.service.request(key, GroupAnchor(self, name), 1, 0, 0)
        if isinstance(result, Deferred):
            result.addErrback(lambda failure: None)  # (a LockTimeout: held by someone else)
            raise GroupKeyTaken(name, key)

    def delete(self, name: str) -> None:
        """
        Delete group C{name}.

        @raise GroupNotCreated: it does not exist.
        @raise GroupNotEmpty: it has members.
        """
        self._start()
        if name not in self._groups:
            raise GroupNotCreated(name)
        if self._members.get(name):
            raise GroupNotEmpty(name)
        key = group_key(name)
        for grant in self.service.holders(key):
            if self._is_anchor(grant):
                grant.release()  # (the index forgets the group as the table tells it)

    def groups(self) -> List[str]:
        """The names of the groups that exist, sorted."""
        self._start()
        return sorted(self._groups)

    # -- members -----------------------------------------------------------------

    def join(
        self, name: str, member: str, owner: Hashable, capabilities: Optional[bytes], lease: float
    ) -> IGrant:
        """
        Make C{owner} member C{member} of group C{name}, with C{capabilities}
        (bytes, at most 4096, or None) and a heartbeat C{lease} in seconds
        (0: until C{owner} goes away).

        @raise ValueError: C{member} cannot be an id, or the lease or the
            capabilities are out of range.
        @raise GroupNotCreated: the group does not exist.
        @raise MemberAlreadyExists: someone (C{owner} too) holds the member's key.
        @raise LimitReached: C{max-members}, or a lock-table limit.
        @return: the member's grant (its token, its lease as its expiry).
        """
        check_member_id(member)
        self._start()
        if name not in self._groups:
            raise GroupNotCreated(name)
        key = member_key(name, member)
        if self.service.status(key).granted:
            raise MemberAlreadyExists(name, member)
        members = self._members.get(name)
        if self.max_members is not None and members is not None and len(members) >= self.max_members:
            raise LimitReached("max-members", self.max_members)
        result = self.service.request(key, owner, 1, 0, lease, EXCLUSIVE, capabilities)
        if isinstance(result, Deferred):
            # Free of holders but promised to a waiting multi-key request (by hand).
            result.addErrback(lambda failure: None)
            raise MemberAlreadyExists(name, member)
        self._leases[result] = lease
        return result

    def heartbeat(self, name: str, member: str, owner: Hashable, lease: float) -> bool:
        """
        Renew C{owner}'s membership with a new C{lease} (seconds from now; 0:
        until it goes away).

        @raise ValueError: a negative lease.
        @return: False if C{owner} is not that member (nothing changed).
        """
        grant = self.member_grant(name, member, owner)
        if grant is None:
            return False
        renew_grant(self.service, grant, None, lease)
        self._leases[grant] = lease
        return True

    def update(self, name: str, member: str, owner: Hashable, capabilities: bytes) -> None:
        """
        Replace C{owner}'s capabilities as member C{member} of C{name}: a
        renewal with its last lease (a member key locked by hand keeps its
        expiry).

        @raise MemberNotJoined: C{owner} is not that member.
        @raise ValueError: capabilities over 4096 bytes.
        """
        grant = self.member_grant(name, member, owner)
        if grant is None:
            raise MemberNotJoined(name, member)
        renew_grant(self.service, grant, capabilities, self._leases.get(grant))

    def leave(self, name: str, member: str, owner: Hashable) -> None:
        """
        End C{owner}'s membership (a release of its key).

        @raise MemberNotJoined: C{owner} is not that member.
        """
        grant = self.member_grant(name, member, owner)
        if grant is None:
            raise MemberNotJoined(name, member)
        self.service.release(grant.key, owner)

    def member_grant(self, name: str, member: str, owner: Hashable) -> Optional[IGrant]:
        """
        C{owner}'s grant as member C{member} of group C{name}, or None if it
        is not that member: whether the group still exists or not (an
        admin's force-release of its key ends the group, not its members,
        who may still heartbeat, update and leave).
        """
        self._start()
        return self.service.grant_of(member_key(name, member), owner)

    def members(self, name: str) -> Dict[str, Optional[bytes]]:
        """
        The members of group C{name} and their capabilities (None: none), in join order.

        @raise GroupNotCreated: it does not exist.
        """
        return {member: grant.value for member, grant in self.member_grants(name).items()}

    def member_grants(self, name: str) -> Dict[str, IGrant]:
        """
        The members of group C{name}, each with its grant (its first holder's,
        for a member key locked by hand by several), in join order.

        @raise GroupNotCreated: it does not exist.
        """
        self._start()
        if name not in self._groups:
            raise GroupNotCreated(name)
        holders = self.service.holders
        found: Dict[str, IGrant] = {}
        for member in self._members.get(name, ()):
            grants = holders(member_key(name, member))
            if grants:
                found[member] = grants[0]
        return found

    # -- the index, kept from the table's events ---------------------------------

    @staticmethod
    def _is_anchor(grant: IGrant) -> bool:
        """
        Whether C{grant} is a group's anchor: any group table's, so that two
        tables over one lock table (an embedder's) see the same groups.
        """
        return isinstance(grant.owner, GroupAnchor)

    def _start(self) -> None:
        """
        Watch C{group:} (once: a watch of the table's own, which no client
        cap counts), and index what is held under it already (one pass over
        the keys, unsorted).
        """
        if self._watching:
            return
        self.service.watch(self, GROUP_PREFIX, self._changed, prefix=True, counted=False)
        self._watching = True
        held = []
        for key in self.service.keys_with_prefix(GROUP_PREFIX):
            held.extend(self.service.holders(key))
        for grant in sorted(held, key=lambda grant: grant.token):
            self._changed(LockEvent(GRANTED, grant.key, grant))

    def _changed(self, event: LockEvent) -> None:
        """One change under C{group:}: a group made or ended, a member joined or left."""
        grant = event.grant
        if grant is None:
            return  # (a key appeared or disappeared: its grants tell the rest)
        name, member = split_group_key(event.key)
        joined = event.kind == GRANTED
        if member is None:
            if self._is_anchor(grant):
                if joined:
                    self._groups[name] = None
                else:
                    self._groups.pop(name, None)
            return
        if not name or not member:
            return
        if joined:
            self._members.setdefault(name, {})[member] = None
            return
        self._leases.pop(grant, None)
        if self.service.status(event.key).granted:
            return  # (a member key locked by hand by several: one of them is left)
        members = self._members.get(name)
        if members is not None:
            members.pop(member, None)
            if not members:
                del self._members[name]


__all__ = [
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_MAX_MEMBERS",
    "GroupAnchor",
    "GroupTable",
    "check_group_name",
    "check_member_id",
]
