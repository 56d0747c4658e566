"""
A model-based test of the memcached object store (L{jesync.store}):
hypothesis drives a real L{ObjectStore} over a real L{LockService} on a
L{Clock} with random sequences of storage commands (set, add, replace,
append, prepend, cas, with right and wrong CAS uniques), incr and decr,
deletes, touches, reads, memcached locks (lock, unlock, unlock_all, RaU),
locks taken by JESync clients straight from the lock table (mutexes and
semaphores), flushes (now and later), clock advances and sweeps with small
budgets, and after every step compares it with a plain-Python model written
from the module's documented rules:

- an item is C{(value, flags, expires_at, cas)}, counting
  C{len(key) + len(value) + ITEM_OVERHEAD} bytes; every write gives it a new
  CAS unique, one above the last;
- expiry: C{expires_at} 0 never, a negative expiration time L{EXPIRED}, up to
  L{RELATIVE_LIMIT} seconds relative to the clock, beyond that an absolute
  time.  An item is I{live} unless its time has come (C{expires_at <= now})
  and its key is unlocked; a dead item is still in the table until it is next
  looked at (then removed) or swept.  A sweep removes dead items only, at
  most C{budget} of them, and when it says nothing more is due it has removed
  every dead item whose whole second has passed (but one a sweep saw locked,
  which it looks at again a second later);
- recency: a read, a write and a refused C{add} make an item the most
  recently used (an explicit list here, least recently used first);
- memory: a write that does not fit evicts the least recently used unlocked
  items, never the key written, until it fits (a locked item passed over on
  the way becomes the most recently used: "looked at last next time");
  if it cannot fit even with every unlocked item gone, L{OutOfMemory} is
  raised, the unlocked items staying evicted (as L{ObjectStore._evict} says:
  a cache may always drop them) and the item written unchanged;
- locks: whoever holds key C{K} in the lock table locks object C{K}: a
  memcached C{lock} (a mutex, refused when anyone holds C{K} or the object is
  missing) or a JESync client's grant (semaphores too); another owner's
  writes are refused with C{LOCKED} and change nothing (checked on the whole
  table and the counters); a locked item never expires and is never evicted
  or flushed; the holder deleting it drops its lock; C{flush} removes the
  unlocked items and marks the locked ones L{EXPIRED}, so they go once
  unlocked.

The comparison is white-box where it must be: the store's whole table (its
private C{_items}, in order, dead items included, so C{get} is never called
to look), its live items in order, its byte count against its memory, its
counters and last CAS unique, C{locked_items()}, the lock table's holders of
every key and the flush set for later (the clock's only timer).  At the end,
everything unlocked and flushed, the store and its expiry index are empty.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import LockTimeout
from jesync.service import Grant, LockService
from jesync.store import (
    EXPIRED,
    ITEM_OVERHEAD,
    RELATIVE_LIMIT,
    NonNumeric,
    ObjectStore,
    Outcome,
    OutOfMemory,
    TooLarge,
)
from jesync.wire import decode_key
from tests.model import ModelMachine, model_settings, model_test_case

START = 1_800_000_000.0  # a Unix time (2027), as tests/unit/test_store.py
# Sizes scale with ITEM_OVERHEAD, so that values weigh in the byte count as
# much as keys and overhead do, whatever the overhead is.
SCALE = max(1, ITEM_OVERHEAD // 64)
MAX_ITEM = 64 * SCALE
COUNTER_MODULUS = 2**64
# A decimal number as incr/decr take it: digits, spaces around them, at most 20 digits.
NUMBER = re.compile(rb" *([0-9]{1,20}) *")


class Owner:
    """A connection (or a JESync client): owners are told apart by identity, as the store does."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


A, B, C = Owner("A"), Owner("B"), Owner("C")  # memcached connections
F, G = Owner("F"), Owner("G")  # JESync clients
STORE_OWNERS = [A, B, C]
FOREIGN_OWNERS = [F, G]

# Keys of different lengths (the byte count sees them), one not UTF-8.
KEYS = [b"a", b"bb", b"c", b"\xffd", b"ee", b"f", b"gg", b"h"]
keys = st.sampled_from(KEYS)
store_owners = st.sampled_from(STORE_OWNERS)
foreign_owners = st.sampled_from(FOREIGN_OWNERS)
values = st.sampled_from(
    [
        b"1",
        b"",
        b"42",
        b"abc",
        b" 7 ",  # a number with spaces: incr takes it
        b"18446744073709551615",  # the largest counter
        b"18446744073709551616",  # one past it: not a number
        b"0" * 21,  # too many digits
        b"1 2",
        b"x" * 30 * SCALE,
        b"y" * 50 * SCALE,
        b"z" * MAX_ITEM,
        b"w" * (MAX_ITEM + 1),  # TooLarge
    ]
)
# For plain sets: mostly items that stay, and that take room.
set_values = st.sampled_from([b"x" * 30 * SCALE, b"1", b"y" * 50 * SCALE, b"42", b"z" * MAX_ITEM])
set_exptimes = st.sampled_from([0, 0, 0, 3, 2, -1])
flags = st.sampled_from([0, 3, 2**32 - 1])
# ("abs", d): the absolute Unix time int(now) + d.  RELATIVE_LIMIT is still
# relative (30 days on); RELATIVE_LIMIT + 1 is an absolute time long gone.
# (1 and 2 twice: more items expire while a run lasts.)
exptimes = st.sampled_from([0, 1, 2, 3, -1, ("abs", 2), ("abs", -1), RELATIVE_LIMIT, RELATIVE_LIMIT + 1, 1, 2])
cas_choices = st.sampled_from(["none", "right", "wrong"])
store_modes = st.sampled_from(["set", "add", "replace", "append", "prepend", "cas"])
deltas = st.sampled_from([1, 0, 5, COUNTER_MODULUS - 1])
initials = st.sampled_from([None, None, 0, 7, COUNTER_MODULUS - 1])
advances = st.sampled_from([0.5, 1.0, 0.0, 1.5, 2.0, 2.5, 3.0])
flush_delays = st.sampled_from([1, 2, 3, 0, -1, ("abs", 1), RELATIVE_LIMIT + 1])
budgets = st.sampled_from([1_000, 0, 1, 2, 3])
# About 2 to 7 items' worth (an item counts about 1 to 2 overheads here):
# eviction, and OutOfMemory with a few items locked, are frequent.
memories = st.sampled_from([size * SCALE for size in (330, 260, 400, 480, 560, 200, 640)])


def size_of(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + ITEM_OVERHEAD


@dataclass
class MItem:
    value: bytes
    flags: int
    expires_at: float
    cas: int

    def fields(self) -> Tuple[bytes, int, float, int]:
        return (self.value, self.flags, self.expires_at, self.cas)


Result = Any  # an Outcome, (Outcome, fields or None), fields or None, or an exception class


class Model:
    """The store as the module docstring describes it, written plainly."""

    def __init__(self, clock: Clock, memory: int) -> None:
        self.clock = clock
        self.memory = memory
        self.items: Dict[bytes, MItem] = {}
        self.order: List[bytes] = []  # least recently used first
        self.holders: Dict[bytes, Dict[Owner, int]] = {key: {} for key in KEYS}  # owner -> max_concurrent
        self.last_cas = 0
        self.counters = dict(hits=0, misses=0, evictions=0, expired=0, total_items=0, flushes=0)
        self.flush_at: Optional[float] = None
        # When a sweep may last have seen the key expired but locked (and so
        # put it back to be looked at again a second later).
        self.seen_locked: Dict[bytes, float] = {}

    # -- helpers

    def now(self) -> float:
        return self.clock.seconds()

    def held(self, key: bytes) -> bool:
        return bool(self.holders[key])

    def locked_against(self, key: bytes, owner: Owner) -> bool:
        return any(holder is not owner for holder in self.holders[key])

    def expires_at(self, exptime: int) -> float:
        if exptime == 0:
            return 0.0
        if exptime < 0:
            return EXPIRED
        if exptime <= RELATIVE_LIMIT:
            return self.now() + exptime
        return float(exptime)

    def dead(self, key: bytes) -> bool:
        """Present, its time come, and unlocked: gone as soon as it is looked at."""
        expires_at = self.items[key].expires_at
        return expires_at != 0 and expires_at <= self.now() and not self.held(key)

    def bytes(self) -> int:
        return sum(size_of(key, item.value) for key, item in self.items.items())

    def remove(self, key: bytes) -> None:
        del self.items[key]
        self.order.remove(key)
        self.seen_locked.pop(key, None)

    def bump(self, key: bytes) -> None:
        self.order.remove(key)
        self.order.append(key)

    def live(self, key: bytes) -> Optional[MItem]:
        """Look at C{key}: its item, unless dead (then removed)."""
        if key not in self.items:
            return None
        if self.dead(key):
            self.remove(key)
            self.counters["expired"] += 1
            return None
        return self.items[key]

    def set_expiry(self, key: bytes, expires_at: float) -> None:
        self.items[key].expires_at = expires_at
        self.seen_locked.pop(key, None)

    def put(self, key: bytes, value: bytes, flags: int, expires_at: float) -> MItem:
        current = self.items.get(key)
        needed = size_of(key, value) - (size_of(key, current.value) if current is not None else 0)
        free = self.memory - self.bytes()
        victims: List[bytes] = []
        passed: List[bytes] = []
        for other in self.order:
            if needed <= free:
                break
            if other == key or self.held(other):
                passed.append(other)
            else:
                victims.append(other)
                free += size_of(other, self.items[other].value)
        for victim in victims:
            self.counters["expired" if self.dead(victim) else "evictions"] += 1
            self.remove(victim)
        for other in passed:
            self.bump(other)  # locked: looked at last next time
        if needed > free:
            # Only locked items (and this one) are left: the unlocked ones
            # stay evicted ("a cache may always drop them"), and the others
            # were each passed over once, so their order is as it was.
            raise OutOfMemory()
        if current is not None:
            self.remove(key)
        self.last_cas += 1
        item = self.items[key] = MItem(value, flags, expires_at, self.last_cas)
        self.order.append(key)
        self.counters["total_items"] += 1
        return item

    # -- the commands

    def get(self, key: bytes) -> Optional[MItem]:
        item = self.live(key)
        if item is None:
            self.counters["misses"] += 1
            return None
        self.counters["hits"] += 1
        self.bump(key)
        return item

    def touch(self, key: bytes, exptime: int) -> Optional[MItem]:
        item = self.get(key)
        if item is not None:
            self.set_expiry(key, self.expires_at(exptime))
        return item

    def store(
        self, mode: str, key: bytes, value: bytes, flags: int, exptime: int, owner: Owner, cas: int
    ) -> Tuple[Outcome, Optional[MItem]]:
        if len(value) > MAX_ITEM:
            raise TooLarge()
        if self.locked_against(key, owner):
            return Outcome.LOCKED, None
        current = self.live(key)
        if mode == "add":  # (a CAS means nothing to add)
            if current is not None:
                self.bump(key)
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
            joined = current.value + value if mode == "append" else value + current.value
            if len(joined) > MAX_ITEM:
                return Outcome.NOT_STORED, None  # (as memcached: an item cannot grow past the limit)
            return Outcome.STORED, self.put(key, joined, current.flags, current.expires_at)
        return Outcome.STORED, self.put(key, value, flags, self.expires_at(exptime))

    def add_delta(
        self, key: bytes, delta: int, owner: Owner, decrement: bool, initial: Optional[int], exptime: int, cas: int
    ) -> Tuple[Outcome, Optional[MItem]]:
        if self.locked_against(key, owner):
            return Outcome.LOCKED, None
        current = self.live(key)
        if current is None:
            if initial is None:
                return Outcome.NOT_FOUND, None
            return Outcome.STORED, self.put(key, b"%d" % initial, 0, self.expires_at(exptime))
        if cas and current.cas != cas:
            return Outcome.EXISTS, None
        match = NUMBER.fullmatch(current.value)
        if match is None or int(match.group(1)) >= COUNTER_MODULUS:
            raise NonNumeric()
        number = int(match.group(1))
        result = max(number - delta, 0) if decrement else (number + delta) % COUNTER_MODULUS
        return Outcome.STORED, self.put(key, b"%d" % result, current.flags, current.expires_at)

    def delete(self, key: bytes, owner: Owner, cas: int) -> Outcome:
        if self.locked_against(key, owner):
            return Outcome.LOCKED
        current = self.live(key)
        if current is None:
            return Outcome.NOT_FOUND
        if cas and current.cas != cas:
            return Outcome.EXISTS
        self.remove(key)
        self.holders[key].pop(owner, None)
        return Outcome.DELETED

    def lock(self, key: bytes, owner: Owner) -> Outcome:
        if self.live(key) is None:
            return Outcome.NOT_FOUND
        if self.held(key):
            return Outcome.LOCKED
        self.holders[key][owner] = 1
        return Outcome.OK

    def unlock(self, key: bytes, owner: Owner) -> Outcome:
        if self.holders[key].pop(owner, None) is not None:
            return Outcome.OK
        return Outcome.NOT_LOCKED if self.live(key) is not None else Outcome.NOT_FOUND

    def unlock_all(self, owner: Owner) -> None:
        for holders in self.holders.values():
            holders.pop(owner, None)

    def replace_and_unlock(
        self, key: bytes, value: bytes, flags: int, exptime: int, owner: Owner, cas: int
    ) -> Tuple[Outcome, Optional[MItem]]:
        if self.live(key) is None:
            return Outcome.NOT_FOUND, None
        if owner not in self.holders[key]:
            return Outcome.NOT_LOCKED, None
        outcome, item = self.store("replace", key, value, flags, exptime, owner, cas)
        if outcome is Outcome.STORED:
            del self.holders[key][owner]
        return outcome, item

    def foreign_request(self, key: bytes, owner: Owner, max_concurrent: int) -> bool:
        """A JESync client's request with timeout 0 and no expiry: granted (or renewed), or timed out."""
        holders = self.holders[key]
        if owner in holders:
            return True  # a renewal (its max_concurrent kept)
        granted = len(holders)
        if granted < max_concurrent and all(granted < limit for limit in holders.values()):
            holders[owner] = max_concurrent
            return True
        return False

    def flush(self) -> None:
        self.counters["flushes"] += 1
        for key in list(self.order):
            if self.held(key):
                self.set_expiry(key, EXPIRED)
            else:
                self.remove(key)

    def flush_later(self, delay: int) -> None:
        self.flush_at = None
        if delay <= 0:
            self.flush()
        else:
            self.flush_at = max(self.expires_at(delay), self.now())

    def surely_swept(self, key: bytes) -> bool:
        """Whether a sweep that says nothing more is due must have removed C{key}."""
        expires_at = self.items[key].expires_at
        if not expires_at or self.held(key) or math.floor(expires_at) + 1 > self.now():
            return False
        seen = self.seen_locked.get(key)
        return seen is None or math.floor(seen) + 2 <= self.now()


def fields(item: Any) -> Optional[Tuple[bytes, int, float, int]]:
    return None if item is None else (item.value, item.flags, item.expires_at, item.cas)


def outcome_of(call: Callable[[], Any]) -> Result:
    """What a call returned (items as their fields), or the class of the store's exception it raised."""
    try:
        result = call()
    except (TooLarge, OutOfMemory, NonNumeric) as error:
        return type(error)
    if isinstance(result, tuple):
        return (result[0], fields(result[1]))
    if isinstance(result, Outcome) or result is None:
        return result
    return fields(result)


class ObjectStoreMachine(ModelMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock.advance(START)
        self.service = LockService(self.clock)
        self.store = ObjectStore(self.service, memory=480, max_item=MAX_ITEM)
        self.model = Model(self.clock, 480)
        # The keys locked and present after the last step, and the one its holder deleted in this step.
        self.locked_present: set = set()
        self.deleted_by_holder: Optional[bytes] = None

    @initialize(memory=memories, fill=st.lists(st.tuples(keys, set_values), max_size=10))
    def start(self, memory: int, fill: List[Tuple[bytes, bytes]]) -> None:
        """The store's size for the run, and what it starts with (evicting already, if it is small)."""
        self.store = ObjectStore(self.service, memory=memory, max_item=MAX_ITEM)
        self.model = Model(self.clock, memory)
        for key, value in fill:
            self.plain_set(key, value, 0, A)

    # -- helpers

    def exptime(self, choice: Any) -> int:
        if isinstance(choice, tuple):
            return int(self.clock.seconds()) + choice[1]
        return choice

    def cas(self, key: bytes, choice: str) -> int:
        item = self.model.items.get(key)  # (maybe dead: then the store says NOT_FOUND)
        if choice == "none":
            return 0
        if choice == "right":
            return item.cas if item is not None else 1
        # a CAS unique no version of this item has now: an older one, or one not given yet
        return item.cas - 1 if item is not None and item.cas > 1 else self.model.last_cas + 1

    def both(self, real: Callable[[], Any], model: Callable[[], Any]) -> Result:
        """Run a command on the store and on the model, and check they answer alike."""
        expected = outcome_of(model)
        got = outcome_of(real)
        assert got == expected, f"store answered {got!r}, the model {expected!r}"
        return got

    def refused_write(self, key: bytes, owner: Owner, real: Callable[[], Any]) -> None:
        """A write by C{owner} to a key someone else holds: LOCKED, and nothing at all changes."""
        before = self.state()
        result = outcome_of(real)
        outcome = result[0] if isinstance(result, tuple) else result
        holders = self.model.holders[key]
        assert outcome is Outcome.LOCKED, f"{owner!r}'s write to {key!r}, held by {holders}, answered {result!r}"
        assert self.state() == before, "a refused write changed the store"

    def state(self) -> Tuple[Any, ...]:
        store = self.store
        return (
            [(key, fields(item)) for key, item in store._items.items()],
            store.bytes,
            store._last_cas,
            store.hits,
            store.misses,
            store.evictions,
            store.expired,
            store.total_items,
        )

    def refused(self, key: bytes, owner: Owner, value: bytes = b"") -> bool:
        """Whether the store will refuse this write as LOCKED (it checks the size first)."""
        return len(value) <= MAX_ITEM and self.model.locked_against(key, owner)

    # -- storage

    @rule(mode=store_modes, key=keys, value=values, flags=flags, exptime=exptimes, owner=store_owners, cas=cas_choices)
    def store_command(
        self, mode: str, key: bytes, value: bytes, flags: int, exptime: Any, owner: Owner, cas: str
    ) -> None:
        exptime = self.exptime(exptime)
        unique = self.cas(key, cas)
        real = lambda: self.store.store(mode, key, value, flags, exptime, owner, unique)  # noqa: E731
        if self.refused(key, owner, value):
            self.refused_write(key, owner, real)
            self.model.store(mode, key, value, flags, exptime, owner, unique)
            return
        self.both(real, lambda: self.model.store(mode, key, value, flags, exptime, owner, unique))

    @rule(
        key=keys,
        delta=deltas,
        owner=store_owners,
        decrement=st.booleans(),
        initial=initials,
        exptime=exptimes,
        cas=cas_choices,
    )
    def incr_decr(
        self, key: bytes, delta: int, owner: Owner, decrement: bool, initial: Optional[int], exptime: Any, cas: str
    ) -> None:
        exptime = self.exptime(exptime)
        unique = self.cas(key, cas)
        real = lambda: self.store.add_delta(key, delta, owner, decrement, initial, exptime, unique)  # noqa: E731
        if self.refused(key, owner):
            self.refused_write(key, owner, real)
            self.model.add_delta(key, delta, owner, decrement, initial, exptime, unique)
            return
        self.both(real, lambda: self.model.add_delta(key, delta, owner, decrement, initial, exptime, unique))

    @rule(key=keys, owner=store_owners, cas=cas_choices)
    def delete(self, key: bytes, owner: Owner, cas: str) -> None:
        unique = self.cas(key, cas)
        real = lambda: self.store.delete(key, owner, unique)  # noqa: E731
        if self.refused(key, owner):
            self.refused_write(key, owner, real)
            self.model.delete(key, owner, unique)
            return
        holder = owner in self.model.holders[key]
        if self.both(real, lambda: self.model.delete(key, owner, unique)) is Outcome.DELETED and holder:
            self.deleted_by_holder = key
            assert self.service.grant_of(decode_key(key), owner) is None, "deleting its object kept the lock"

    @rule(key=keys, value=values, flags=flags, exptime=exptimes, owner=store_owners, cas=cas_choices)
    def replace_and_unlock(self, key: bytes, value: bytes, flags: int, exptime: Any, owner: Owner, cas: str) -> None:
        exptime = self.exptime(exptime)
        unique = self.cas(key, cas)
        self.both(
            lambda: self.store.replace_and_unlock(key, value, flags, exptime, owner, unique),
            lambda: self.model.replace_and_unlock(key, value, flags, exptime, owner, unique),
        )

    @rule(key=keys, value=set_values, exptime=set_exptimes, owner=store_owners)
    def plain_set(self, key: bytes, value: bytes, exptime: Any, owner: Owner) -> None:
        """A plain set (the common write: it fills the store, so evictions happen)."""
        self.store_command("set", key, value, 0, exptime, owner, "none")

    def held_by_store_owners(self) -> List[Tuple[bytes, Owner]]:
        return [(key, owner) for key in KEYS for owner in STORE_OWNERS if owner in self.model.holders[key]]

    @precondition(lambda self: self.held_by_store_owners())
    @rule(index=st.integers(0, 7), value=values, flags=flags, exptime=exptimes, cas=cas_choices)
    def replace_and_unlock_held(self, index: int, value: bytes, flags: int, exptime: Any, cas: str) -> None:
        """RaU by a connection that holds the object (else it is refused: this makes it common)."""
        held = self.held_by_store_owners()
        key, owner = held[index % len(held)]
        self.replace_and_unlock(key, value, flags, exptime, owner, cas)

    @precondition(lambda self: self.held_by_store_owners())
    @rule(index=st.integers(0, 7), cas=cas_choices)
    def delete_held(self, index: int, cas: str) -> None:
        """A delete by a connection that holds the object: its lock goes with it."""
        held = self.held_by_store_owners()
        key, owner = held[index % len(held)]
        self.delete(key, owner, cas)

    @precondition(lambda self: self.model.items)
    @rule(
        index=st.integers(0, len(KEYS) - 1),
        mode=st.sampled_from(["append", "prepend"]),
        value=values,
        owner=store_owners,
        cas=cas_choices,
    )
    def append_present(self, index: int, mode: str, value: bytes, owner: Owner, cas: str) -> None:
        """Append to or prepend to a present object (it grows: past the largest item, it is NOT_STORED)."""
        present = sorted(self.model.items)
        self.store_command(mode, present[index % len(present)], value, 0, 0, owner, cas)

    def locked_against_store_owners(self) -> List[Tuple[bytes, Owner]]:
        return [(key, owner) for key in KEYS for owner in STORE_OWNERS if self.model.locked_against(key, owner)]

    @precondition(lambda self: self.locked_against_store_owners())
    @rule(
        index=st.integers(0, 23),
        command=st.sampled_from(["add", "set", "replace", "append", "prepend", "cas", "incr", "decr", "delete"]),
        value=values,
    )
    def write_locked(self, index: int, command: str, value: bytes) -> None:
        """A connection writes an object someone else holds (a missing one too): LOCKED, nothing changes."""
        pairs = self.locked_against_store_owners()
        key, owner = pairs[index % len(pairs)]
        if command in ("incr", "decr"):
            self.incr_decr(key, 1, owner, command == "decr", 0, 0, "none")
        elif command == "delete":
            self.delete(key, owner, "right")
        else:
            self.store_command(command, key, value, 0, 0, owner, "right")

    # -- reads

    @rule(key=keys)
    def get(self, key: bytes) -> None:
        self.both(lambda: self.store.get(key), lambda: self.model.get(key))

    @rule(key=keys, exptime=exptimes)
    def touch(self, key: bytes, exptime: Any) -> None:
        exptime = self.exptime(exptime)
        self.both(lambda: self.store.touch(key, exptime), lambda: self.model.touch(key, exptime))

    # -- locks

    @rule(key=keys, owner=store_owners)
    def lock(self, key: bytes, owner: Owner) -> None:
        self.both(lambda: self.store.lock(key, owner), lambda: self.model.lock(key, owner))

    @precondition(lambda self: self.model.items)
    @rule(index=st.integers(0, len(KEYS) - 1), owner=store_owners)
    def lock_present(self, index: int, owner: Owner) -> None:
        """Lock a present object (locks of missing ones are refused: this makes locked objects common)."""
        present = sorted(self.model.items)
        self.lock(present[index % len(present)], owner)

    @rule(key=keys, owner=store_owners)
    def unlock(self, key: bytes, owner: Owner) -> None:
        self.both(lambda: self.store.unlock(key, owner), lambda: self.model.unlock(key, owner))

    @precondition(lambda self: self.held_by_store_owners())
    @rule(index=st.integers(0, 7))
    def unlock_held(self, index: int) -> None:
        held = self.held_by_store_owners()
        self.unlock(*held[index % len(held)])

    @rule(owner=store_owners)
    def unlock_all(self, owner: Owner) -> None:
        self.store.unlock_all(owner)
        self.model.unlock_all(owner)

    @rule(key=keys, owner=foreign_owners, max_concurrent=st.sampled_from([1, 2, 3]))
    def foreign_lock(self, key: bytes, owner: Owner, max_concurrent: int) -> None:
        """A JESync client asks for key C{key} (no wait, no expiry), as a mutex or a semaphore."""
        result = self.service.request(decode_key(key), owner, max_concurrent, 0, 0)
        if isinstance(result, Deferred):
            failures: list = []
            result.addErrback(failures.append)
            assert len(failures) == 1 and failures[0].check(LockTimeout), failures
            granted = False
        else:
            assert isinstance(result, Grant)
            granted = True
        assert granted == self.model.foreign_request(key, owner, max_concurrent)

    @precondition(lambda self: self.model.items)
    @rule(index=st.integers(0, len(KEYS) - 1), owner=foreign_owners, max_concurrent=st.sampled_from([1, 2, 3]))
    def foreign_lock_present(self, index: int, owner: Owner, max_concurrent: int) -> None:
        """A JESync client asks for the key of a present object."""
        present = sorted(self.model.items)
        self.foreign_lock(present[index % len(present)], owner, max_concurrent)

    @rule(key=keys, owner=foreign_owners)
    def foreign_release(self, key: bytes, owner: Owner) -> None:
        expected = self.model.holders[key].pop(owner, None) is not None
        assert self.service.release(decode_key(key), owner) == expected

    # -- flushes, time, the sweep

    @precondition(lambda self: len(self.model.items) >= 4)
    @rule()
    def flush(self) -> None:
        self.store.flush()
        self.model.flush()

    @precondition(lambda self: len(self.model.items) >= 4)
    @rule(delay=flush_delays)
    def flush_later(self, delay: Any) -> None:
        delay = self.exptime(delay)
        self.store.flush_later(delay)
        self.model.flush_later(delay)

    @rule(seconds=advances, then_sweep=st.booleans())
    def advance(self, seconds: float, then_sweep: bool) -> None:
        """Time passes (and a delayed flush may run); then, maybe, a sweep, as the server's every second."""
        self.clock.advance(seconds)
        model = self.model
        if model.flush_at is not None and model.flush_at <= self.clock.seconds():
            model.flush_at = None
            model.flush()
        if then_sweep:
            self.sweep(1_000)

    @rule(budget=budgets)
    def sweep(self, budget: int) -> None:
        store, model = self.store, self.model
        dead = {key for key in model.items if model.dead(key)}
        more = store.sweep(budget)
        assert set(store._items) <= set(model.items), "the sweep made items"
        removed = [key for key in model.order if key not in store._items]
        assert set(removed) <= dead, f"the sweep removed items that are not dead: {set(removed) - dead}"
        assert len(removed) <= budget, f"the sweep removed {len(removed)} items with budget {budget}"
        for key in removed:
            model.remove(key)
            model.counters["expired"] += 1
        if not more:
            missed = [key for key in model.order if model.surely_swept(key)]
            assert not missed, f"the sweep said nothing more was due, and left dead items {missed}"
        now = self.clock.seconds()
        for key in model.order:
            expires_at = model.items[key].expires_at
            if expires_at and expires_at <= now and model.held(key):
                model.seen_locked[key] = now

    # -- the comparison

    @invariant()
    def agrees_with_model(self) -> None:
        store, model, now = self.store, self.model, self.clock.seconds()
        # The whole table, in recency order, dead items not looked at since included.
        assert list(store._items) == model.order, f"order: store {list(store._items)}, model {model.order}"
        for key in model.order:
            item = store._items[key]
            assert fields(item) == model.items[key].fields(), f"{key!r}: store {item!r}, model {model.items[key]}"
        assert store.bytes == model.bytes(), f"bytes: store {store.bytes}, model {model.bytes()}"
        assert store.bytes <= store.memory
        assert len(store) == len(model.items)
        # Live items (what a get would return), in recency order.
        store_live = [
            key
            for key, item in store._items.items()
            if not (item.expires_at and item.expires_at <= now and not store.held(key))
        ]
        assert store_live == [key for key in model.order if not model.dead(key)]
        # The lock table.
        for key in KEYS:
            holders = {grant.owner for grant in self.service.holders(decode_key(key))}
            assert holders == set(model.holders[key]), f"{key!r} held by {holders}, model {model.holders[key]}"
            assert store.held(key) == model.held(key)
            for owner in STORE_OWNERS:
                assert store.locked_against(key, owner) == model.locked_against(key, owner)
                if owner in model.holders[key]:
                    assert key in store._items, f"{owner!r} locks {key!r}, which is gone"
        # The set of locked objects' keys the store keeps as both tables change (locked_items's count).
        locked = {key for key in model.items if model.held(key)}
        assert store._locked == locked, f"locked: store {store._locked}, model {locked}"
        assert store.locked_items() == len(locked)
        # Locked objects never disappear (but for their holder deleting them).
        for key in self.locked_present:
            assert key in store._items or key == self.deleted_by_holder, f"locked {key!r} disappeared"
        self.locked_present = {key for key in model.items if model.held(key)}
        self.deleted_by_holder = None
        # Counters and CAS uniques.
        counters = {name: getattr(store, name) for name in model.counters}
        assert counters == model.counters, f"counters: store {counters}, model {model.counters}"
        assert store._last_cas == model.last_cas
        # The flush set for later, if any, and no other timer.
        call = store._flush_call
        pending = call is not None and call.active()
        assert pending == (model.flush_at is not None), (call, model.flush_at)
        if pending:
            assert call.getTime() == model.flush_at, (call.getTime(), model.flush_at)
        assert len(self.clock.getDelayedCalls()) == int(pending), self.clock.getDelayedCalls()

    def finish(self) -> None:
        # Unlocked and flushed, the store is empty; once the sweep has caught
        # up, its expiry index holds nothing either.
        store = self.store
        for owner in STORE_OWNERS:
            store.unlock_all(owner)
        for owner in FOREIGN_OWNERS:
            self.service.release_all(owner)
        store.flush_later(0)
        left = (len(store), store.bytes, store.locked_items())
        assert left == (0, 0, 0), f"unlocked and flushed, the store keeps (items, bytes, locked) {left}"
        assert self.clock.getDelayedCalls() == [], self.clock.getDelayedCalls()
        self.clock.advance(3)
        assert not store.sweep(1_000), "an empty store's sweep says more is due"
        assert store._expiring == {}, store._expiring
        assert all(second > self.clock.seconds() for second in store._seconds), store._seconds


SETTINGS = model_settings(300, 60)


class ObjectStoreModelTests(model_test_case(ObjectStoreMachine, SETTINGS, "test_store_agrees_with_model")):
    """The store agrees with the model, run after run."""


# -- examples ----------------------------------------------------------------------


class EvictionExampleTests(SynchronousTestCase):
    """The eviction rule, one example each (the smallest cases the model test found)."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START)
        self.service = LockService(self.clock)

    def test_evicts_as_many_as_it_takes(self) -> None:
        """Nothing locked: a new item that fits once both items there are evicted is stored, not refused."""
        small, large = b"x" * 30 * SCALE, b"y" * 50 * SCALE
        memory = size_of(b"bb", small) + size_of(b"c", small) + 10
        assert size_of(b"a", large) <= memory < size_of(b"c", small) + size_of(b"a", large)  # (both must go)
        store = ObjectStore(self.service, memory=memory, max_item=MAX_ITEM)
        store.store("set", b"bb", small, 0, 0, A)
        store.store("set", b"c", small, 0, 0, A)
        try:
            outcome, _ = store.store("set", b"a", large, 0, 0, A)
        except OutOfMemory:
            self.fail(
                "ObjectStore._evict raises OutOfMemory with unlocked items left: it counts each item it"
                " evicts as one looked at, against a table that shrinks as it evicts"
            )
        self.assertEqual(outcome, Outcome.STORED)
        self.assertEqual((list(store._items), store.evictions), ([b"a"], 2))
