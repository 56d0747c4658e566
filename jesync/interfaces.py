"""The lock service's contract, which every wire protocol is written against."""

from __future__ import annotations

from typing import Any, Hashable, NamedTuple, Optional

from zope.interface import Attribute, Interface

from jesync.wire import (  # noqa: F401 (the kinds of LockEvent, for the service's users)
    APPEARED,
    DISAPPEARED,
    EXPIRED,
    GRANTED,
    LOST,
    RELEASED,
    KeyStatus,
    ListingOrder,
)


class Totals(NamedTuple):
    """The whole table at a glance: keys in use, grants held, requests waiting."""

    keys: int
    granted: int
    waiting: int


class Waiting(NamedTuple):
    """
    One request waiting for a key (L{ILockService.waiters}): its C{owner},
    its C{mode} (C{"exclusive"} or C{"shared"}), its C{max_concurrent}, and
    C{since}, the clock time it started waiting.
    """

    owner: Hashable
    mode: str
    max_concurrent: int
    since: float



class LockEvent(NamedTuple):
    """
    One change a watch reports (L{ILockService.watch}): C{kind} (one of
    the six above), the C{key}, and the holder's L{IGrant} (None for
    APPEARED and DISAPPEARED).
    """

    kind: str  # GRANTED, RELEASED, EXPIRED, LOST, APPEARED or DISAPPEARED (jesync.wire)
    key: str
    grant: Optional[Any]


class IGrant(Interface):
    """A lock held by one owner, as handed out by L{ILockService.acquire}."""

    key = Attribute("The key held.")
    owner = Attribute("Who holds it.")
    granted_at = Attribute("Clock time at which it was granted (renewals do not change it).")
    max_concurrent = Attribute("The concurrency this holder admitted the key under.")
    expires_at = Attribute(
        "Clock time at which the failsafe releases this grant, or None if it never expires."
    )
    seconds_left = Attribute(
        "Seconds until the failsafe releases this grant (a float), or None if it never expires."
    )
    token = Attribute(
        "Its fencing token: an int larger than every token the service gave before it"
        " (across restarts too, under the clock assumption of jesync.service); a renewal keeps it."
    )
    mode = Attribute(
        '"exclusive" or "shared" (jesync.service.EXCLUSIVE, SHARED); a shared grant\'s max_concurrent is 1.'
    )
    value = Attribute(
        "The bytes its holder set with its request (at most jesync.service.MAX_VALUE, 4096), or None;"
        " a renewal with a value replaces it, one without keeps it."
    )

    def release() -> bool:
        """
        Give the lock back.

        @return: True if this grant was still held, False if it had already
            been released, had expired, or its owner had gone away.
        """


class ILockService(Interface):
    """
    A table of named counting locks, shared by every protocol and embedder.

    An owner is any hashable object (a protocol connection, usually).  A key is
    held exclusively by at most as many owners as every holder's
    C{max_concurrent} allows, or shared by any number of owners, never both;
    other requests wait in arrival order, and a waiting request of one mode
    holds back later requests of the other (the rule is
    L{jesync.service}'s).
    """

    clock = Attribute("The IReactorTime that wait timeouts and expiries run on.")
    observer = Attribute("The ILockObserver told of every grant, timeout, release and expiry, or None.")
    last_token = Attribute("The largest fencing token given so far.")
    shared_keys = Attribute("How many keys are held shared now (so a listing can skip looking when none is).")
    version = Attribute(
        "A number that changes whenever something a listing shows changes (a grant, a release, a wait"
        " starting or ending): two snapshots taken at the same version are the same."
    )

    def acquire(
        key: str,
        owner: Hashable,
        max_concurrent: int = 1,
        timeout: float = -1,
        expires: float = 120,
        mode: str = "exclusive",
        value=None,
    ):
        """
        Ask for C{key} on behalf of C{owner}.

        @param max_concurrent: how many holders (this one included) the
            requester accepts; at least 1 (exactly 1 for a shared request).
        @param timeout: seconds to wait; -1 waits for ever, 0 does not wait.
        @param expires: seconds after the grant at which it is released
            automatically (the failsafe); 0 means never.
        @param mode: C{"exclusive"} or C{"shared"}: shared holders admit each
            other and nothing exclusive.
        @param value: bytes (at most 4096) its grant carries, or None.
        @raise ValueError: if a parameter is out of range (nothing changes).
        @raise jesync.errors.LimitReached: if the request would pass one of
            the service's limits (nothing changes).
        @return: a Deferred firing with an L{IGrant}.  If C{owner} already
            holds C{key}, the grant is renewed (its expiry restarts with
            C{expires}) and the same grant is returned.  It fails with
            L{jesync.errors.LockTimeout} when the wait times out, with
            L{jesync.errors.AlreadyWaiting} at once if C{owner} already waits
            for C{key} (the first request still stands), with
            L{jesync.errors.ModeConflict} at once if C{owner} holds C{key} in
            the other mode (no upgrade, no downgrade; its grant stays), and with
            L{twisted.internet.defer.CancelledError} if it is cancelled or the
            owner goes away first.
        """

    def request(
        key: str,
        owner: Hashable,
        max_concurrent: int = 1,
        timeout: float = -1,
        expires: float = 120,
        mode: str = "exclusive",
        value=None,
    ):
        """
        L{acquire}, without a Deferred for a grant made (or renewed) at once:
        the protocols' fast path.

        @return: the L{IGrant} if C{owner} holds C{key} now; otherwise the
            Deferred L{acquire} would return.  Raises as L{acquire} does.
        """

    def acquire_many(
        keys, owner: Hashable, timeout: float = -1, expires: float = 120, mode: str = "exclusive", value=None
    ):
        """
        Ask for several keys at once, all or nothing, each one in C{mode}: a
        mutex on each, or shared on each (with C{value} on each grant).

        The request waits in the queue of every key it does not hold yet, in
        the one arrival order of all requests, and is granted when it is the
        first request the grant rule admits in each of those queues (see
        L{jesync.service}); no request of equal C{max_concurrent} that came
        later passes it.  Keys C{owner} holds already are part of the
        answer, renewed with C{expires} when the request is granted (one that
        times out or is refused leaves them as they were); a key given twice
        counts once.  A key held already in the other mode refuses the
        request with L{jesync.errors.ModeConflict}; a shared request is
        granted when each of its keys admits it, and shared requests never
        hold each other back.

        @param keys: a non-empty sequence of keys.
        @raise ValueError: for no keys, or a parameter out of range.
        @raise jesync.errors.LimitReached: as L{acquire} (a multi-key wait
            counts once toward C{max-held} and C{max-total-waits}, and once
            per key toward C{max-waiters}).
        @return: a Deferred firing with the L{IGrant}s, one per distinct key
            in the order asked.  It fails as L{acquire}'s does; a
            L{jesync.errors.LockTimeout} names the keys still in the way in
            C{busy}.
        """

    def request_many(
        keys, owner: Hashable, timeout: float = -1, expires: float = 120, mode: str = "exclusive", value=None
    ):
        """
        L{acquire_many} without a Deferred when every key is granted (or
        renewed) at once: the list of grants then, the Deferred otherwise.
        """

    def reassign(key: str, owner: Hashable, new_owner: Hashable, expires: float):
        """
        Hand C{owner}'s grant of C{key} to C{new_owner}, renewed with
        C{expires}, its token kept.

        @return: the grant, or None if C{owner} does not hold C{key}.
        @raise ValueError: if C{new_owner} already holds or waits for C{key}.
        """

    def release(key: str, owner: Hashable) -> bool:
        """
        Release C{owner}'s grant of C{key}, handing it to the next waiters.

        @return: True if C{owner} held C{key}.
        """

    def release_all(owner: Hashable, why: str = "lost") -> None:
        """
        Release everything C{owner} holds and cancel its waits.  C{why}:
        LOST (the default), the owner went away: each grant's event is
        LOST, and its watches end too; RELEASED, it gave everything back
        (an elock C{unlock_all}) and stays: each grant's event is
        RELEASED, and its watches stay.
        """

    def watch(owner: Hashable, key: str, listener, prefix: bool = False, counted: bool = True) -> bool:
        """
        From now on, tell C{owner}'s C{listener} (one per owner: the one its
        latest watch gave) of every change of C{key}'s holders, or (C{prefix})
        of every key that starts with C{key}, keys entering and leaving the
        table included: C{listener(event)}, a L{LockEvent}, synchronously
        as the table changes and in the order of the changes; it must not
        change the table.  An owner is told of a change once, however many
        of its watches match it.

        C{counted=False}: an owner whose watches are not a client's (a
        table built on this one, such as the group table's) is not held to
        the caps, nor counted in C{watch_count}; an owner's first watch
        decides it for all of them.

        @return: True if this is a new watch, False if C{owner} had it already.
        @raise jesync.errors.LimitReached: past C{max-watches} (one owner's)
            or C{max-total-watches} (the service's).
        @raise ValueError: an empty key (an empty prefix is every key).
        """

    def unwatch(owner: Hashable, key: str, prefix: bool = False) -> bool:
        """End C{owner}'s watch of C{key} (or of the prefix); False if it had none."""

    def watches_of(owner: Hashable) -> int:
        """How many watches C{owner} has."""

    def status(key: str) -> KeyStatus:
        """The holder and waiter counts of C{key} (0, 0 for an unused key)."""

    def grants_of(owner: Hashable) -> list:
        """C{owner}'s grants (not its waits)."""

    def grant_of(key: str, owner: Hashable):
        """C{owner}'s L{IGrant} of C{key}, or None if it does not hold it."""

    def owned(owner: Hashable) -> int:
        """How many grants plus waits C{owner} has (0 for an owner it does not know)."""

    def watch_holds(watcher) -> None:
        """
        Call C{watcher(key, True)} whenever C{key} gets its first holder, and
        C{watcher(key, False)} whenever its last holder goes, from then on
        (for counts kept as the table changes; the watcher must not change it).
        """

    def totals() -> Totals:
        """How many keys are in use, grants held and requests waiting (in O(1))."""

    def holders(key: str) -> list:
        """The L{IGrant}s of C{key}, in the order they were granted."""

    def waiters(key: str, limit: Optional[int] = None) -> list:
        """
        The requests waiting for C{key} (L{Waiting}s), in queue order: the
        first C{limit} of them (None: all).  A multi-key request is in the
        queue of every key it waits for.
        """

    def listing(order: ListingOrder = "key") -> list[KeyStatus]:
        """
        Every key in use, sorted by key, by waiting count ("requests",
        descending) or by holder count ("grants", descending); ties by key.
        """

    def keys_with_prefix(prefix: str) -> list:
        """The keys in use (held or waited for) that start with C{prefix}, in no order: one pass over the table."""

    def snapshot(order: ListingOrder = "key") -> list:
        """
        L{listing} as plain C{(key, granted, waiting)} tuples, for a
        protocol's listing of a large table (faster to make); a key held
        shared has a fourth item, C{"shared"} (made only while one is:
        C{shared_keys}).
        """


class ITokenMark(Interface):
    """
    Keeps a lock service's fencing tokens at or below a durable mark (see
    L{jesync.fencing}): the service hands it every token above its
    C{token_check} before giving it.
    """

    def reached(token: int) -> int:
        """The token to give instead of C{token} (never above the durable mark while there is room below it)."""


class ILockObserver(Interface):
    """
    Told what happens in a lock service, for metrics.  Called synchronously:
    implementations must be quick and must not call back into the service.
    """

    def granted(grant: IGrant, waited: float) -> None:
        """A grant was made, after its request waited C{waited} seconds (0: at once)."""

    def timed_out(key: str) -> None:
        """A wait for C{key} timed out."""

    def released(grant: IGrant) -> None:
        """A grant was given back: released, or its owner went away."""

    def expired(grant: IGrant) -> None:
        """A grant's failsafe expiry released it."""


class IOwnerChanges(Interface):
    """
    Told when an owner whose grants outlive its connection changes in a way
    that is no grant event: a session's grace period or a grant of it
    renewed, a timed grant begun, renewed or switched to or from a time
    (L{jesync.sessions}).  A lock service's observer that provides it
    (cluster mode: the journal, which writes such owners to etcd) hears of
    them from the grammars that make these changes; the grammars know it
    only as the service's observer.
    """

    def session_changed(session) -> None:  # (untyped: jesync.sessions imports this module)
        """C{session}'s (a L{jesync.sessions.Session}) grace period changed."""

    def timed_changed(key: str) -> None:
        """C{key}'s timed grant (a L{jesync.sessions.TimedGrants}) may have begun, been renewed or ended."""

    def held_changed(session, key: str) -> None:
        """
        C{session}'s grant of C{key} was renewed with an expiry or a value
        (the lock service tells its observer of grants, releases and
        expiries, not of renewals): whoever renews one tells this before
        its durable reply.
        """


__all__ = [
    "APPEARED",
    "DISAPPEARED",
    "EXPIRED",
    "GRANTED",
    "LOST",
    "LockEvent",
    "RELEASED",
    "IGrant",
    "ILockObserver",
    "ILockService",
    "IOwnerChanges",
    "ITokenMark",
    "KeyStatus",
    "ListingOrder",
    "Totals",
    "Waiting",
]
