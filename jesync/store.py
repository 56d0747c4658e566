"""
The memcached listener's object store, and the rule that ties its objects to
the lock table.

An object (an L{Item}: value, flags, expiry, CAS unique) is stored under a
key of at most 250 bytes.  The store holds at most C{memory} bytes, counting
each item's key, value and L{ITEM_OVERHEAD}; storing past that evicts the
least recently used items (a read or a write makes an item the most recently
used).  An expired item is removed when it is next looked at, and by
L{ObjectStore.sweep}, which a server calls every second and which does at
most C{SWEEP_BUDGET} items per call, so a mass expiry never holds up the
reactor.

B{Locks.}  The lock table (L{jesync.interfaces.ILockService}) is the one
authority on who locks object C{K}: whoever holds the key C{K} there, through
any protocol.  A memcached C{lock K} is a mutex grant of C{K} to the
connection (no wait, no expiry), refused when anyone else holds C{K}, and when
the object does not exist.  While C{K} is held by anyone:

 - another owner's writes to object C{K} (C{set}, C{add} even of a missing
   object, C{replace}, C{append}, C{prepend}, C{cas}, C{incr}, C{decr},
   C{delete}) are refused with L{Outcome.LOCKED}; the holder's own succeed.
   Reads and C{touch} are never refused.
 - object C{K} is never expired, evicted or flushed.  (An item whose time has
   run out while locked expires once the lock is gone.)

The owner deleting its locked object drops its lock, as the reference server
(yrmcds) does.

The store keeps the set of its locked objects' keys as the two tables change
(the lock table tells it when a key gets its first holder and loses its last,
L{jesync.interfaces.ILockService.watch_holds}; a write or removal of an
object updates it too), so C{locked_items} (C{stats}, metrics) is O(1) and a
flush, an eviction or an expiry asks the set, not the lock table, whether an
object is locked.  Expiration times follow memcached: 0 never, a negative one
at once, up to 30 days relative seconds, beyond that an absolute Unix time
(the clock is the reactor, whose C{seconds()} is Unix time).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict
from typing import Dict, Hashable, List, Optional, Set, Tuple

from twisted.internet.defer import Deferred
from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall

from jesync.interfaces import ILockService
from jesync.wire import RELEASED, decode_key, encode_key

#: memcached's longest key, in bytes.
MAX_KEY_LENGTH = 250
#: The defaults of --memcache-memory and --memcache-max-item.
DEFAULT_MEMORY = 64 * 1024 * 1024
DEFAULT_MAX_ITEM = 1024 * 1024
#: What each item counts besides its key and value: about what it costs the
#: server beyond them (measured: 320 bytes on CPython 3.11, 258 on PyPy;
#: BENCHMARKS.md), so that the memory limit bounds the process's memory and
#: not only the bytes stored.  (memcached counts its 48-56-byte item header.)
ITEM_OVERHEAD = 320
#: Expiration times up to this are relative seconds (memcached's 30 days).
RELATIVE_LIMIT = 60 * 60 * 24 * 30
#: The expiry of an item stored already expired (a negative expiration time).
EXPIRED = -1.0
#: The most items one sweep looks at, and how often the sweep runs (seconds).
SWEEP_BUDGET = 10_000
SWEEP_EVERY = 1.0
#: A counter value is an unsigned 64-bit number.
COUNTER_MODULUS = 2**64
MAX_COUNTER_DIGITS = 20


class Outcome(enum.Enum):
    """What a store command did; the value is memcached's text reply."""

    STORED = b"STORED"
    NOT_STORED = b"NOT_STORED"
    EXISTS = b"EXISTS"
    NOT_FOUND = b"NOT_FOUND"
    DELETED = b"DELETED"
    TOUCHED = b"TOUCHED"
    LOCKED = b"LOCKED"
    OK = b"OK"
    NOT_LOCKED = b"NOT_LOCKED"


class TooLarge(Exception):
    """The value is longer than the largest item the store takes."""


class OutOfMemory(Exception):
    """Only locked items are left to evict, and the new item does not fit."""


class NonNumeric(Exception):
    """C{incr} or C{decr} of a value that is not a decimal number."""


class Item:
    """One stored object."""

    __slots__ = ("value", "flags", "expires_at", "cas")

    def __init__(self, value: bytes, flags: int, expires_at: float, cas: int) -> None:
        self.value = value
        self.flags = flags
        #: Clock time at which it expires; 0 never.
        self.expires_at = expires_at
        self.cas = cas

    def __repr__(self) -> str:
        return f"<Item {len(self.value)} bytes flags={self.flags} cas={self.cas} expires_at={self.expires_at}>"


def encode_key_or_none(name: str) -> Optional[bytes]:
    """
    The bytes of the lock table's key C{name} that name an object, if any:
    those that L{decode_key} makes C{name} of (None if none do).
    """
    try:
        key = encode_key(name)
    except UnicodeEncodeError:
        return None
    return key if decode_key(key) == name else None


def counted(key: bytes, value: bytes) -> int:
    """What an item counts toward the memory limit."""
    return len(key) + len(value) + ITEM_OVERHEAD


class ObjectStore:
    """
    Objects in memory, bounded, least recently used evicted, locked through
    C{service}'s lock table.

    @param service: the lock table (and, through its C{clock}, the time).
    @param memory: the most bytes of items (keys, values, overhead) held.
    @param max_item: the longest value stored.
    @ivar hits, misses, evictions, expired, total_items: counters for C{stats}.
    """

    def __init__(self, service: ILockService, memory: int = DEFAULT_MEMORY, max_item: int = DEFAULT_MAX_ITEM) -> None:
        self.service = service
        self.clock = service.clock
        self.memory = memory
        self.max_item = max_item
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.expired = 0
        self.total_items = 0
        self.flushes = 0
        self._items: OrderedDict[bytes, Item] = OrderedDict()
        self._last_cas = 0
        self._flush_call: Optional[IDelayedCall] = None
        # Keys by the whole second after their expiry, and those seconds in a
        # heap, for the sweep (an entry may be stale: the sweep checks).
        self._expiring: Dict[int, Set[bytes]] = {}
        self._seconds: List[int] = []
        # The keys of the stored objects that are locked (whose key anyone
        # holds in the lock table): kept as both tables change.
        self._locked: Set[bytes] = set()
        service.watch_holds(self._hold_changed)

    def __len__(self) -> int:
        return len(self._items)

    # -- the lock rule -------------------------------------------------------------

    def held(self, key: bytes) -> bool:
        """Whether anyone holds C{key} in the lock table (the object is locked)."""
        if key in self._items:
            return key in self._locked
        return self.service.status(decode_key(key)).granted > 0

    def _hold_changed(self, name: str, held: bool) -> None:
        """
        The lock table's key C{name} got its first holder (C{held}) or lost
        its last one.  On every protocol's lock path: a JESync client's
        lock of a key no object has costs a dict lookup, and nothing more
        while the store is empty or nothing in it is locked.
        """
        if not (self._items if held else self._locked):
            return
        key: Optional[bytes]
        try:
            key = name.encode("utf-8")
        except UnicodeEncodeError:
            # Not valid UTF-8: one of the keys the wire's surrogate escapes
            # make, or one no store key decodes to (an embedder's).
            key = encode_key_or_none(name)
            if key is None:
                return
        if not held:
            self._locked.discard(key)
        elif key in self._items:
            self._locked.add(key)

    def locked_against(self, key: bytes, owner: Hashable) -> bool:
        """Whether someone other than C{owner} holds C{key}: C{owner} may not write object C{key}."""
        return any(grant.owner is not owner for grant in self.service.holders(decode_key(key)))

    def lock(self, key: bytes, owner: Hashable) -> Outcome:
        """
        Lock object C{key} for C{owner}: OK, NOT_FOUND (no such object) or
        LOCKED (anyone holds it, C{owner} too, as yrmcds answers).

        @raise LimitReached: if the grant would pass a lock-table limit.
        """
        if self._live(key) is None:
            return Outcome.NOT_FOUND
        name = decode_key(key)
        if self.service.status(name).granted:
            return Outcome.LOCKED
        result = self.service.request(name, owner, 1, 0, 0)
        if isinstance(result, Deferred):
            # Free, but a multi-key request is first in line for it.
            result.addErrback(lambda failure: None)
            return Outcome.LOCKED
        return Outcome.OK

    def unlock(self, key: bytes, owner: Hashable) -> Outcome:
        """Unlock C{owner}'s lock of object C{key}: OK, NOT_LOCKED, or NOT_FOUND (no such object)."""
        if self.service.release(decode_key(key), owner):
            return Outcome.OK
        return Outcome.NOT_LOCKED if self._live(key) is not None else Outcome.NOT_FOUND

    def unlock_all(self, owner: Hashable, why: str = RELEASED) -> None:
        """
        Unlock every object C{owner} has locked: RELEASED (it asked, and
        stays), or LOST (it went away).
        """
        self.service.release_all(owner, why)

    # -- reads -----------------------------------------------------------------------

    def get(self, key: bytes) -> Optional[Item]:
        """The live item of C{key} (now the most recently used), or None."""
        item = self._live(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item

    def touch(self, key: bytes, exptime: int) -> Optional[Item]:
        """Give the item of C{key} a new expiration time (anyone may: C{touch} is not a write); None if missing."""
        item = self.get(key)
        if item is not None:
            self._forget_expiry(key, item)
            item.expires_at = self.expires_at(exptime)
            self._note_expiry(key, item)
        return item

    def keys(self, prefix: bytes = b"") -> List[bytes]:
        """
        yrmcds's C{Keys}: the keys of the live objects that start with
        C{prefix} (all of them for C{b""}), in no particular order (as
        yrmcds's, whose order is its hash table's), taken at once.  The list
        is a snapshot: later writes do not change it, and it holds only
        references to the store's own keys (a pointer each).  Nothing is
        touched or removed: an expired object is left out (a locked one is
        live until it is unlocked, as L{get} sees it).
        """
        # The plain dict's walk, not the least-recently-used list's: on
        # CPython it is about 20 times faster (10 ms against 200 ms for
        # 1,000,000 keys), and this runs on the reactor thread.
        items = self._items
        if not self._expiring:  # (no object can have expired)
            keys = dict.keys(items)
            return list(keys) if not prefix else [key for key in keys if key.startswith(prefix)]
        now = self.clock.seconds()
        return [
            key
            for key, item in dict.items(items)
            if key.startswith(prefix) and not (item.expires_at and item.expires_at <= now and not self.held(key))
        ]

    def locked_items(self) -> int:
        """How many stored objects are locked (O(1): the set is kept as the tables change)."""
        return len(self._locked)

    # -- writes ------------------------------------------------------------------------

    def store(
        self, mode: str, key: bytes, value: bytes, flags: int, exptime: int, owner: Hashable, cas: int = 0
    ) -> Tuple[Outcome, Optional[Item]]:
        """
        C{set}, C{add}, C{replace}, C{append}, C{prepend} or C{cas} (C{mode}),
        as memcached: STORED with the item stored, or NOT_STORED (C{add} of
        an existing object, the others of a missing one), EXISTS (a CAS that
        does not match), NOT_FOUND (a CAS given for a missing object),
        LOCKED.  A non-zero C{cas} (the binary protocol's, for any mode but
        C{add}) must match the item's.  Appending keeps the item's flags and
        expiry.

        @raise TooLarge: the value is over C{max_item} (an append or prepend
            that would take the item past it is NOT_STORED, as memcached's).
        @raise OutOfMemory: it does not fit, and only locked items are left.
        """
        if len(value) > self.max_item:
            raise TooLarge()
        if self.locked_against(key, owner):
            return Outcome.LOCKED, None
        current = self._live(key)
        if mode == "add":
            if current is not None:
                self._items.move_to_end(key)
                return Outcome.NOT_STORED, None
        elif cas or mode == "cas":
            if current is None:
                return Outcome.NOT_FOUND, None
            if current.cas != cas:
                return Outcome.EXISTS, None
        elif mode != "set" and current is None:
            return Outcome.NOT_STORED, None
        if mode in ("append", "prepend"):
            assert current is not None
            value = current.value + value if mode == "append" else value + current.value
            if len(value) > self.max_item:
                return Outcome.NOT_STORED, None  # (as memcached: the item cannot grow past the limit)
            item = self._put(key, value, current.flags, current.expires_at)
        else:
            item = self._put(key, value, flags, self.expires_at(exptime))
        return Outcome.STORED, item

    def add_delta(
        self,
        key: bytes,
        delta: int,
        owner: Hashable,
        decrement: bool = False,
        initial: Optional[int] = None,
        exptime: int = 0,
        cas: int = 0,
    ) -> Tuple[Outcome, Optional[Item]]:
        """
        C{incr} or C{decr} by C{delta}: (STORED, the item, its value the new
        number), or NOT_FOUND (unless C{initial} is given: then a missing
        object is created with it), EXISTS (a non-zero C{cas}, the binary
        protocol's, that does not match), or LOCKED.  Increments wrap at
        2**64; decrements stop at 0.

        @raise NonNumeric: the value is not a decimal number.
        """
        if self.locked_against(key, owner):
            return Outcome.LOCKED, None
        current = self._live(key)
        if current is None:
            if initial is None:
                return Outcome.NOT_FOUND, None
            return Outcome.STORED, self._put(key, b"%d" % initial, 0, self.expires_at(exptime))
        if cas and current.cas != cas:
            return Outcome.EXISTS, None
        number = current.value.strip(b" ")
        if not number.isdigit() or len(number) > MAX_COUNTER_DIGITS or int(number) >= COUNTER_MODULUS:
            raise NonNumeric()
        result = max(int(number) - delta, 0) if decrement else (int(number) + delta) % COUNTER_MODULUS
        return Outcome.STORED, self._put(key, b"%d" % result, current.flags, current.expires_at)

    def delete(self, key: bytes, owner: Hashable, cas: int = 0) -> Outcome:
        """DELETED (and C{owner}'s lock on it dropped), NOT_FOUND, EXISTS (CAS mismatch) or LOCKED."""
        if self.locked_against(key, owner):
            return Outcome.LOCKED
        current = self._live(key)
        if current is None:
            return Outcome.NOT_FOUND
        if cas and current.cas != cas:
            return Outcome.EXISTS
        self._remove(key)
        self.service.release(decode_key(key), owner)
        return Outcome.DELETED

    def replace_and_unlock(
        self, key: bytes, value: bytes, flags: int, exptime: int, owner: Hashable, cas: int = 0
    ) -> Tuple[Outcome, Optional[Item]]:
        """
        yrmcds's RaU: replace object C{key}, which C{owner} has locked, and
        unlock it, at once: as L{store}'s C{replace}, or NOT_LOCKED if
        C{owner} does not hold C{key}, NOT_FOUND if there is no such object
        (the lock stays if the replace fails).
        """
        if self._live(key) is None:
            return Outcome.NOT_FOUND, None
        if self.service.grant_of(decode_key(key), owner) is None:
            return Outcome.NOT_LOCKED, None
        outcome, item = self.store("replace", key, value, flags, exptime, owner, cas)
        if outcome is Outcome.STORED:
            self.service.release(decode_key(key), owner)
        return outcome, item

    def flush(self) -> None:
        """
        Remove every object no one has locked; a locked one goes once it is
        unlocked (it is marked expired, as yrmcds does).
        """
        self.flushes += 1
        items = self._items
        kept = [(key, items[key]) for key in items if key in self._locked] if self._locked else []
        # (cleared at once rather than removed one by one: a flush of a
        # million objects is a few C-level clears, not a long loop)
        self._items.clear()
        self._expiring.clear()
        self._seconds.clear()
        self.bytes = 0
        for key, item in kept:
            item.expires_at = EXPIRED
            self._items[key] = item
            self.bytes += counted(key, item.value)
            self._note_expiry(key, item)

    def flush_later(self, delay: int) -> None:
        """
        C{flush_all [delay]}: L{flush} now (0), or once C{delay} (a memcached
        expiration time) has come, instead of any flush set for later before.
        """
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if delay <= 0:
            self.flush()
        else:
            wait = max(self.expires_at(delay) - self.clock.seconds(), 0.0)
            self._flush_call = self.clock.callLater(wait, self.flush)

    # -- time ------------------------------------------------------------------------------

    def expires_at(self, exptime: int) -> float:
        """A memcached expiration time as clock time (0: never; in the past: expired)."""
        if exptime == 0:
            return 0.0
        if exptime < 0:
            return EXPIRED
        if exptime <= RELATIVE_LIMIT:
            return self.clock.seconds() + exptime
        return float(exptime)  # (an absolute time in the past: expired)

    def sweep(self, budget: int = SWEEP_BUDGET) -> bool:
        """
        Remove expired objects (not locked ones), looking at C{budget} at
        most; True if more are due (call again soon).
        """
        now = self.clock.seconds()
        while self._seconds and self._seconds[0] <= now:
            second = self._seconds[0]
            bucket = self._expiring.get(second)
            if not bucket:
                heapq.heappop(self._seconds)
                self._expiring.pop(second, None)
                continue
            if budget <= 0:
                return True
            budget -= 1
            key = bucket.pop()
            item = self._items.get(key)
            if item is None or not item.expires_at or item.expires_at > now:
                continue  # (stale: gone, or given another time since)
            if self.held(key):
                # Locked: looked at again later, expired once unlocked.
                self._add_expiry(key, now + 1)
            else:
                self._remove(key)
                self.expired += 1
        return False

    # -- the table -----------------------------------------------------------------

    def _live(self, key: bytes) -> Optional[Item]:
        """The item of C{key} unless it has expired (then it is removed, unless locked)."""
        item = self._items.get(key)
        if item is None:
            return None
        if item.expires_at and item.expires_at <= self.clock.seconds() and not self.held(key):
            self._remove(key)
            self.expired += 1
            return None
        return item

    def _put(self, key: bytes, value: bytes, flags: int, expires_at: float) -> Item:
        size = counted(key, value)
        current = self._items.get(key)
        locked = key in self._locked if current is not None else self.service.status(decode_key(key)).granted > 0
        needed = size - (counted(key, current.value) if current is not None else 0)
        if self.bytes + needed > self.memory:
            self._evict(needed, key)
        if current is not None:
            self._remove(key)
        self._last_cas += 1
        item = Item(value, flags, expires_at, self._last_cas)
        self._items[key] = item
        self.bytes += size
        self.total_items += 1
        if locked:
            self._locked.add(key)
        if expires_at:
            self._note_expiry(key, item)
        return item

    def _evict(self, needed: int, keep: bytes) -> None:
        """
        Evict least recently used unlocked items (never C{keep}) until
        C{needed} more bytes fit.  A locked item (and C{keep}) met on the way
        is moved to the most recently used end, so the next eviction does not
        look at it again first.  If only such items are left, L{OutOfMemory}
        (the unlocked items evicted before finding out stay evicted: a cache
        may always drop them).
        """
        items = self._items
        skipped = 0
        while self.bytes + needed > self.memory:
            if skipped >= len(items):
                raise OutOfMemory()  # (every item left is locked, or C{keep})
            key = next(iter(items))
            if key == keep or self.held(key):
                items.move_to_end(key)  # (locked: in use; looked at last next time)
                skipped += 1
                continue
            item = items[key]
            self._remove(key)
            if item.expires_at and item.expires_at <= self.clock.seconds():
                self.expired += 1
            else:
                self.evictions += 1

    def _remove(self, key: bytes) -> None:
        item = self._items.pop(key)
        self._locked.discard(key)
        self.bytes -= counted(key, item.value)
        self._forget_expiry(key, item)

    def _note_expiry(self, key: bytes, item: Item) -> None:
        if item.expires_at:
            self._add_expiry(key, item.expires_at)

    def _add_expiry(self, key: bytes, at: float) -> None:
        second = math.floor(at) + 1
        bucket = self._expiring.get(second)
        if bucket is None:
            bucket = self._expiring[second] = set()
            heapq.heappush(self._seconds, second)
        bucket.add(key)

    def _forget_expiry(self, key: bytes, item: Item) -> None:
        if not item.expires_at:
            return
        second = math.floor(item.expires_at) + 1
        bucket = self._expiring.get(second)
        if bucket is None:
            return
        bucket.discard(key)
        if not bucket:
            del self._expiring[second]
            # Emptied seconds stay in the heap until due; rebuild it when
            # they outnumber the live ones, so churn cannot grow it.
            if len(self._seconds) > 2 * len(self._expiring) + 64:
                self._seconds = list(self._expiring)
                heapq.heapify(self._seconds)


class SweepService(Service):
    """Runs a store's L{ObjectStore.sweep} every second while it runs (at once again while more are due)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._call: Optional[IDelayedCall] = None

    def startService(self) -> None:
        super().startService()
        self._call = self.store.clock.callLater(SWEEP_EVERY, self._sweep)

    def _sweep(self) -> None:
        more = self.store.sweep()
        self._call = self.store.clock.callLater(0 if more else SWEEP_EVERY, self._sweep)

    def stopService(self) -> None:
        super().stopService()
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


__all__ = ["ObjectStore", "Item", "Outcome", "TooLarge", "OutOfMemory", "NonNumeric", "SweepService"]
