"""
A model-based test of L{LockService}'s all-or-nothing multi-key requests
(C{request_many}/C{acquire_many}) mixed with single-key counting-semaphore
requests, and a few example-based tests that pin the key behaviours.

The reference (L{Model}) is plain Python written from the documented rule (the
module docstring of L{jesync.service} and the docstrings of C{acquire_many} and
C{request_many} in L{jesync.interfaces}), recomputed naively from scratch after
every change:

- with C{g} holders, an exclusive request R may join them when none is
  shared, C{g + 1 <= R.max_concurrent} and C{g + 1 <= H.max_concurrent} for
  every holder H; a shared request may join shared holders (or none); a
  multi-key request asks for a mutex (C{max_concurrent} 1) on each key it
  does not hold yet, or for each shared;
- every waiting request is in one arrival order; in each key's queue an
  exclusive waiter is I{admitted} when no shared waiter is before it and it
  is the first waiter the grant rule admits (the I{candidate}); a shared
  waiter is admitted when the key's holders are shared (or none) and no
  exclusive waiter is before it; a request (one key or several) is granted
  when every key it waits for admits it; the model grants such requests one
  at a time until none is left;
- a new request is granted at once only when it would be admitted by every
  key it asks for; otherwise it waits (or, with timeout 0, fails with
  L{LockTimeout} naming in C{busy} the keys in the way); a key its owner holds
  in the other mode refuses it with L{ModeConflict}, nothing changed;
- keys the owner holds already are part of the answer, renewed with the
  request's C{expires} when it is granted (a request that times out, fails at
  once or is refused leaves them as they were); the answer is made when the
  request is told, once the table is final: the grants its owner then holds of
  the keys it asked for, in the order asked (a key given up since is left
  out); a key given twice counts once; an owner waiting for one of the keys
  gets L{AlreadyWaiting} and nothing changes;
- the limits: C{max-held} (grants plus waits, a multi-key wait once),
  C{max-keys}, C{max-waiters} (per key) and C{max-total-waits} (a multi-key
  wait once);
- watches and their events (L{tests.model.WatchModel}): each key granted,
  released, expired or lost is told to the owners watching it or a prefix
  of it; a key APPEARED when a request puts it in the table, granted or
  waiting (here a multi-key wait alone may keep a key there), and
  DISAPPEARED when nothing holds or waits for it any more (a wait timed out
  or cancelled, the grants of a multi-key answer given back); every change
  is compared key by key, since the documentation leaves the order of one
  change's events across keys open (one multi-key grant tells several).

After every step the service is compared with the model: holders per key (in
grant order, with their handles, C{max_concurrent}, grant times and expiries),
waiters per key (in arrival order, the same waiter object in each queue of a
multi-key wait), what every Deferred fired with, C{status()}, C{totals()},
C{owned()}, C{grants_of()}, C{holders()}, the private C{_owners}/C{_spread}
bookkeeping and the two deadline sets.  Invariants are also checked straight
from the service's state: no key has more holders than its rule allows, no
waiter is left that could be granted, the first waiter always has a holder in
its way (so nothing can deadlock), and fencing tokens strictly increase across
all grants (one per key of a multi-key grant; a renewal keeps its token).

Some callbacks give back one of their grants as soon as they are told, so the
service's "tell once the table is final" delivery is exercised re-entrantly.

Teardown drives every run to its end: time runs on past every deadline, then
holders give back what they hold until every remaining wait is granted (none
may wait for ever), then every owner goes away; the table must then be empty
(C{_locks}, C{_owners}, C{_spread}, C{totals()}), and no timer may be left
once the clock has run on.

Timers are stepped by the harness all model tests share (L{tests.model}): the
clock stops just before the model's next deadline and again one tick (10 ms)
after it, and every expiry or wait timeout is observed as the service fires
it, checked against the model's deadline and applied to the model in the
same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import AlreadyWaiting, LimitReached, LockTimeout, ModeConflict
from jesync.interfaces import KeyStatus, Totals
from jesync.service import (
    APPEARED,
    DISAPPEARED,
    EXCLUSIVE,
    EXPIRED,
    GRANTED,
    LOST,
    RELEASED,
    SHARED,
    Grant,
    LockService,
)
from tests.model import (
    OWNERS,
    TICK,
    ObservedLockService,
    ServiceModelMachine,
    WatchModel,
    WatchRules,
    first_watches,
    model_settings,
    model_test_case,
    step,
)

KEYS = ["a", "b", "c", "d"]
UNUSED_KEY = "never-used"

keys = st.sampled_from(KEYS)
owners = st.sampled_from(OWNERS)
max_concurrents = st.integers(min_value=1, max_value=3)
# (hypothesis shrinks towards the first choice)
timeouts = st.sampled_from([-1, 0, 0.5, 1, 3])
expiries = st.sampled_from([0, 1, 2, 5])
# 2-3 distinct keys of 4, sometimes with a key given twice
key_lists = st.lists(keys, min_size=2, max_size=4).filter(lambda ks: 2 <= len(set(ks)) <= 3)
advances = st.sampled_from([1.0, 0.5, 0.25, 0.999, 2.0, 5.0, 0.001, 0.004, 0.0099, 0.01, 0.013])


# -- the model -------------------------------------------------------------------


@dataclass(eq=False)
class Holder:
    """One owner's hold on one key."""

    rid: int  # the request that was granted (a renewal keeps it)
    key: str
    owner: str
    max_concurrent: int
    granted_at: float
    expires_at: Optional[float]
    # the service's handle for it, and its token, once seen
    grant: Optional[Grant] = None
    token: Optional[int] = None
    shared: bool = False


@dataclass(eq=False)
class Wait:
    """A waiting request: for one key, or (C{multi}) for several, a mutex on each."""

    rid: int
    owner: str
    keys: tuple  # the keys it waits for (a multi-key request: those not held when asked)
    max_concurrent: int
    expires: float
    timeout_at: Optional[float]
    multi: bool
    asked: tuple  # every distinct key asked for, in order
    shared: bool = False


@dataclass(eq=False)
class Request:
    """One call of request/acquire/request_many/acquire_many, and what came of it."""

    rid: int
    api: str
    asked: tuple
    owner: str
    max_concurrent: int
    timeout: float
    expires: float
    at: float
    deferred: Optional[Deferred]
    # ("grant", Grant or list of Grants) or ("error", exception), in the order fired
    outcomes: list = field(default_factory=list)
    shared: bool = False

    @property
    def multi(self) -> bool:
        return self.api.endswith("_many")


class Model:
    """The lock table as the documentation describes it, recomputed naively."""

    def __init__(self) -> None:
        self.holders: dict[str, list[Holder]] = {key: [] for key in KEYS}
        self.queue: list[Wait] = []  # every waiting request, in arrival order
        # rid -> ("grant", [Holder, ...]) | ("timeout", busy) | ("already", key) | ("cancelled",);
        # ("grant", None) for a multi-key request granted but not told yet
        self.verdicts: dict[int, tuple] = {}
        # rid -> (its wait, its new holders): multi-key requests granted, not told yet
        self.untold: dict[int, tuple[Wait, list[Holder]]] = {}
        self.holders_made = 0
        self.max_keys: Optional[int] = None
        self.max_waiters: Optional[int] = None
        self.max_held: Optional[int] = None
        self.max_total_waits: Optional[int] = None
        # the watches, and the events due (each public operation begins a change)
        self.watching = WatchModel()

    # -- events

    def begin(self) -> None:
        """
        A change begins.  The documentation leaves the order of one change's
        events across keys open (a multi-key grant, a release that hands
        keys on to a multi-key waiter): every change here is loose, its
        events compared key by key.
        """
        self.watching.begin(loose=True)

    def tell_event(self, kind: str, key: str, held: Optional[Holder] = None) -> None:
        holder = None if held is None else (held.owner, SHARED if held.shared else EXCLUSIVE, None)
        self.watching.tell(kind, key, holder)

    def tell_appeared(self, keys: tuple) -> None:
        """A wait enters the queues of C{keys}: those not in the table appear (a wait alone puts a key there)."""
        active = self.active_keys()
        for key in keys:
            if key not in active:
                self.tell_event(APPEARED, key)

    # -- reading

    def holder(self, key: str, owner: str) -> Optional[Holder]:
        return next((h for h in self.holders[key] if h.owner == owner), None)

    def waits_for(self, key: str) -> list[Wait]:
        return [w for w in self.queue if key in w.keys]

    def wait_of(self, key: str, owner: str) -> Optional[Wait]:
        return next((w for w in self.waits_for(key) if w.owner == owner), None)

    def admits(self, key: str, max_concurrent: int, shared: bool = False) -> bool:
        """The grant rule: may a request with C{max_concurrent} (or shared) join C{key}'s holders?"""
        if shared:
            return all(h.shared for h in self.holders[key])
        joining = len(self.holders[key]) + 1
        return (
            not any(h.shared for h in self.holders[key])
            and joining <= max_concurrent
            and all(joining <= h.max_concurrent for h in self.holders[key])
        )

    def candidate(self, key: str, new: Optional[Wait] = None) -> Optional[Wait]:
        """The first waiter for C{key} (C{new} last, if given) that the grant rule admits."""
        for wait in [*self.queue, *([new] if new is not None else [])]:
            if key in wait.keys and self.admits(key, wait.max_concurrent, wait.shared):
                return wait
        return None

    def admitted(self, key: str, wait: Wait, new: Optional[Wait] = None) -> bool:
        """Whether C{key} admits C{wait} (C{new} last in the queue, if given)."""
        queue = [w for w in [*self.queue, *([new] if new is not None else [])] if key in w.keys]
        earlier = queue[: queue.index(wait)]
        if any(w.shared != wait.shared for w in earlier):
            return False
        if wait.shared:
            return self.admits(key, 1, True)
        return self.candidate(key, new) is wait

    def entries(self, owner: str) -> int:
        """What counts toward max-held: grants, plus waits (a multi-key wait once)."""
        held = sum(h.owner == owner for key in KEYS for h in self.holders[key])
        return held + sum(w.owner == owner for w in self.queue)

    def active_keys(self) -> set[str]:
        return {key for key in KEYS if self.holders[key] or self.waits_for(key)}

    def deadlines(self) -> list[float]:
        found = [h.expires_at for key in KEYS for h in self.holders[key] if h.expires_at is not None]
        return found + [w.timeout_at for w in self.queue if w.timeout_at is not None]

    def all_holders(self) -> list[Holder]:
        return [h for key in KEYS for h in self.holders[key]]

    # -- the rule

    def settle(self, now: float) -> None:
        """Grant any request that is the candidate of every key it waits for, until none is."""
        while True:
            for wait in self.queue:
                if all(self.admitted(key, wait) for key in wait.keys):
                    self._grant(wait, now)
                    break
            else:
                return

    def _grant(self, wait: Wait, now: float) -> None:
        self.queue.remove(wait)
        new = []
        for key in wait.keys:
            expires_at = now + wait.expires if wait.expires else None
            new.append(Holder(wait.rid, key, wait.owner, wait.max_concurrent, now, expires_at, shared=wait.shared))
            self.holders[key].append(new[-1])
            self.holders_made += 1
            self.tell_event(GRANTED, key, new[-1])
        if wait.multi:
            self.verdicts[wait.rid] = ("grant", None)
            self.untold[wait.rid] = (wait, new)
        else:
            self.verdicts[wait.rid] = ("grant", new)

    def tell(self, rid: int, now: float) -> None:
        """
        A multi-key request granted is told, once the table is final: its
        answer is the grants its owner holds of the keys it asked for, those
        it held already renewed now -- or, if one of those was given up while
        it waited, it fails as timed out naming them, its new grants given
        back.  (Part of the change under way: the service gives them back as
        it answers.)
        """
        before = self.active_keys()
        wait, new = self.untold.pop(rid)
        holders = [self.holder(key, wait.owner) for key in wait.asked]
        lost = [key for key, held in zip(wait.asked, holders) if held is None]
        if lost:
            # All or nothing: a key held when asked and given up while the
            # request waited fails it; its new grants are given back.
            for held in new:
                if held in self.holders[held.key]:
                    self.release(held, now)
            self.verdicts[rid] = ("timeout", lost)
            self.watching.tell_keys(before, self.active_keys())
            return
        answer = [held for held in holders if held is not None]
        for held in answer:
            if held not in new:
                self._renew(held, wait.expires, now)
        self.verdicts[rid] = ("grant", answer)

    @staticmethod
    def _renew(held: Holder, expires: float, now: float) -> None:
        held.expires_at = now + expires if expires else None

    # -- operations (each returns the limit a request passes, and then changes nothing)

    def request(self, rid, key, owner, max_concurrent, timeout, expires, now, shared=False) -> Optional[str]:
        self.begin()
        held = self.holder(key, owner)
        if held is not None:
            if held.shared != shared:
                self.verdicts[rid] = ("conflict", key)
                return None
            self._renew(held, expires, now)
            self.verdicts[rid] = ("grant", [held])
            return None
        if self.wait_of(key, owner) is not None:
            self.verdicts[rid] = ("already", key)
            return None
        if self.max_held is not None and self.entries(owner) >= self.max_held:
            return "max-held"
        active = self.active_keys()
        if self.max_keys is not None and key not in active and len(active) >= self.max_keys:
            return "max-keys"
        timeout_at = None if timeout == -1 else now + timeout
        wait = Wait(rid, owner, (key,), max_concurrent, expires, timeout_at, False, (key,), shared)
        if not self.admitted(key, wait, wait):
            if timeout == 0:
                self.verdicts[rid] = ("timeout", [key])
                return None
            if self.max_waiters is not None and len(self.waits_for(key)) >= self.max_waiters:
                return "max-waiters"
            if self.max_total_waits is not None and len(self.queue) >= self.max_total_waits:
                return "max-total-waits"
        self.tell_appeared(wait.keys)
        self.queue.append(wait)
        self.settle(now)
        return None

    def request_many(self, rid, keys, owner, timeout, expires, now, shared=False) -> Optional[str]:
        self.begin()
        asked = tuple(dict.fromkeys(keys))
        for key in asked:
            if self.wait_of(key, owner) is not None:
                self.verdicts[rid] = ("already", key)
                return None
            held = self.holder(key, owner)
            if held is not None and held.shared != shared:
                self.verdicts[rid] = ("conflict", key)
                return None
        renewed = [self.holder(key, owner) for key in asked if self.holder(key, owner) is not None]
        wanted = tuple(key for key in asked if self.holder(key, owner) is None)
        if wanted and self.max_held is not None and self.entries(owner) >= self.max_held:
            return "max-held"
        active = self.active_keys()
        new_keys = [key for key in wanted if key not in active]
        if new_keys and self.max_keys is not None and len(active) + len(new_keys) > self.max_keys:
            return "max-keys"
        timeout_at = None if timeout == -1 else now + timeout
        wait = Wait(rid, owner, wanted, 1, expires, timeout_at, True, asked, shared)
        in_the_way = [key for key in wanted if not self.admitted(key, wait, wait)]
        if in_the_way:
            if timeout == 0:
                self.verdicts[rid] = ("timeout", in_the_way)
                return None
            if self.max_waiters is not None and any(len(self.waits_for(k)) >= self.max_waiters for k in wanted):
                return "max-waiters"
            if self.max_total_waits is not None and len(self.queue) >= self.max_total_waits:
                return "max-total-waits"
        if not in_the_way:
            # granted at once: renewed now (a wait renews them when it is granted)
            for held in renewed:
                self._renew(held, expires, now)
        if not wanted:
            self.verdicts[rid] = ("grant", renewed)
            return None
        self.tell_appeared(wait.keys)
        self.queue.append(wait)
        self.settle(now)
        return None

    def release(self, held: Holder, now: float, kind: str = RELEASED) -> None:
        """Take C{held} from its key's holders (C{kind}: RELEASED or EXPIRED) and hand on what it frees."""
        self.holders[held.key].remove(held)
        self.tell_event(kind, held.key, held)
        self.settle(now)

    def release_key(self, key: str, owner: str, now: float) -> bool:
        self.begin()
        held = self.holder(key, owner)
        if held is None:
            return False
        self._release_one(held, now)
        return True

    def release_grant(self, grant: Grant, now: float) -> bool:
        """C{grant.release()}: only a grant that is still its owner's hold."""
        self.begin()
        held = next((h for h in self.all_holders() if h.grant is grant), None)
        if held is None:
            return False
        self._release_one(held, now)
        return True

    def expire(self, held: Holder, now: float) -> None:
        self.begin()
        self._release_one(held, now, EXPIRED)

    def _release_one(self, held: Holder, now: float, kind: str = RELEASED) -> None:
        before = self.active_keys()
        self.release(held, now, kind)
        self.watching.tell_keys(before, self.active_keys())

    def release_all(self, owner: str, now: float) -> None:
        """The owner goes away: its watches end first, its grants are LOST, its waits cancelled."""
        self.begin()
        self.watching.end(owner)
        before = self.active_keys()
        for key in KEYS:
            for held in [h for h in self.holders[key] if h.owner == owner]:
                self.holders[key].remove(held)
                self.tell_event(LOST, key, held)
        for wait in [w for w in self.queue if w.owner == owner]:
            self.queue.remove(wait)
            self.verdicts[wait.rid] = ("cancelled",)
        self.settle(now)
        self.watching.tell_keys(before, self.active_keys())

    def cancel(self, rid: int, now: float) -> None:
        self.begin()
        before = self.active_keys()
        for wait in self.queue:
            if wait.rid == rid:
                self.queue.remove(wait)
                self.verdicts[rid] = ("cancelled",)
                self.settle(now)
                self.watching.tell_keys(before, self.active_keys())
                return

    def time_out(self, wait: Wait, now: float) -> None:
        self.begin()
        before = self.active_keys()
        # busy: the keys where it is not the candidate, when the time runs out
        busy = [key for key in wait.keys if not self.admitted(key, wait)]
        self.queue.remove(wait)
        self.verdicts[wait.rid] = ("timeout", busy)
        self.settle(now)
        self.watching.tell_keys(before, self.active_keys())


# -- the service, observed -------------------------------------------------------


class Recorder:
    """An L{ILockObserver}: every grant made (in order, with its token then), timeout and expiry."""

    def __init__(self) -> None:
        self.grants: list[tuple[Grant, int]] = []
        self.waited: dict[int, float] = {}  # id(grant) -> how long its request waited
        self.timeouts: list[str] = []
        self.expiries: list[Grant] = []

    def granted(self, grant: Grant, waited: float) -> None:
        self.grants.append((grant, grant.token))
        self.waited[id(grant)] = waited

    def timed_out(self, key: str) -> None:
        self.timeouts.append(key)

    def released(self, grant: Grant) -> None:
        pass

    def expired(self, grant: Grant) -> None:
        self.expiries.append(grant)


class MultiKeyMachine(WatchRules, ServiceModelMachine):
    model_class = Model

    def __init__(self) -> None:
        self.recorder = Recorder()
        super().__init__()
        self.tokens_checked = 0  # how many of recorder.grants have been checked
        # the expiries and the wait timeouts (their keys) the timers fired, for the observer's counts
        self.expiries = 0
        self.timeout_keys: list[str] = []

    def make_service(self, **limits: Any) -> None:
        super().make_service(observer=self.recorder, **limits)

    def holding(self) -> list[Holder]:
        return self.model.all_holders()

    @initialize(
        max_keys=st.sampled_from([None, None, None, 2, 3]),
        max_waiters=st.sampled_from([None, None, None, 1, 2]),
        max_held=st.sampled_from([None, None, None, 1, 2, 3]),
        max_total_waits=st.sampled_from([None, None, None, 1, 3]),
        first=first_watches,
    )
    @step
    def limits(self, max_keys, max_waiters, max_held, max_total_waits, first) -> None:
        """The service's limits, for the whole run."""
        self.make_service(
            max_keys=max_keys, max_waiters=max_waiters, max_held=max_held, max_total_waits=max_total_waits
        )
        model = self.model
        model.max_keys, model.max_waiters, model.max_held = max_keys, max_waiters, max_held
        model.max_total_waits = max_total_waits
        self.watch_first(first)

    # -- requests

    def on_answer(self, request: Request) -> None:
        if request.rid in self.model.untold:
            self.model.tell(request.rid, self.now())

    def on_grant(self, request: Request, value: Any) -> None:
        """Tie the model's holders to the service's handles as they are told."""
        verdict = self.model.verdicts.get(request.rid)
        grants = value if isinstance(value, list) else [value]
        for grant in grants:
            if isinstance(grant, Grant) and all(grant is not g for g in self.handles):
                self.handles.append(grant)
        if verdict is None or verdict[0] != "grant" or verdict[1] is None or len(verdict[1]) != len(grants):
            return  # (the checks report the mismatch)
        for held, grant in zip(verdict[1], grants):
            if held.grant is None and isinstance(grant, Grant):
                held.grant, held.token = grant, grant.token

    def _request(
        self, api: str, asked: tuple, owner: str, max_concurrent: int, timeout, expires, mode: str = EXCLUSIVE
    ) -> Optional[Request]:
        """One request through C{api}, on the model first and then on the service."""
        rid = len(self.requests)
        now = self.now()
        shared = mode == SHARED
        if api in ("request", "acquire"):
            (key,) = asked
            passed = self.model.request(rid, key, owner, max_concurrent, timeout, expires, now, shared)
            call = f"{api}{(key, owner, max_concurrent, timeout, expires, mode)!r}"
        else:
            passed = self.model.request_many(rid, asked, owner, timeout, expires, now, shared)
            call = f"{api}({list(asked)!r}, {owner!r}, {timeout!r}, {expires!r}, {mode!r})"
        method = getattr(self.service, api)
        try:
            if api in ("request", "acquire"):
                if shared:
                    result = method(key, owner, max_concurrent, timeout, expires, mode)
                else:
                    result = method(key, owner, max_concurrent, timeout, expires)
            elif shared:
                result = method(list(asked), owner, timeout, expires, mode)
            else:
                result = method(list(asked), owner, timeout, expires)
        except LimitReached as error:
            assert error.limit == passed, f"{call} refused for {error.limit}, the model says {passed or 'no limit'}"
            return None
        assert passed is None, f"{call} was not refused, the model says it passes {passed}"
        request = Request(
            rid, api, tuple(dict.fromkeys(asked)), owner, max_concurrent, timeout, expires, now,
            result if isinstance(result, Deferred) else None, shared=shared,
        )
        self.requests.append(request)
        self.track(request, result)
        verdict = self.model.verdicts.get(rid)
        at_once = verdict is not None and verdict[0] == "grant"
        if api == "request":
            assert isinstance(result, Grant) == at_once, f"{call} returned {result!r}, the model says {verdict!r}"
        elif api == "request_many":
            assert isinstance(result, list) == at_once, f"{call} returned {result!r}, the model says {verdict!r}"
        else:
            assert isinstance(result, Deferred), f"{call} returned {result!r}"
        return request

    @rule(
        key=keys,
        owner=owners,
        max_concurrent=max_concurrents,
        timeout=timeouts,
        expires=expiries,
        api=st.sampled_from(["request", "acquire"]),
    )
    @step
    def request_one(self, key, owner, max_concurrent, timeout, expires, api) -> None:
        """A single-key counting-semaphore request."""
        self._request(api, (key,), owner, max_concurrent, timeout, expires)

    @rule(owner=owners, max_concurrent=max_concurrents, timeout=timeouts, expires=expiries)
    @step
    def request_contended(self, owner, max_concurrent, timeout, expires) -> None:
        """A single-key request for the key the multi-key requests below all want."""
        self._request("request", ("a",), owner, max_concurrent, timeout, expires)

    @rule(key=keys, owner=owners, timeout=timeouts, expires=expiries, api=st.sampled_from(["request", "acquire"]))
    @step
    def request_one_shared(self, key, owner, timeout, expires, api) -> None:
        """A single-key shared request."""
        self._request(api, (key,), owner, 1, timeout, expires, SHARED)

    @rule(owner=owners, timeout=timeouts, expires=expiries)
    @step
    def request_contended_shared(self, owner, timeout, expires) -> None:
        """A shared request for the key the multi-key requests all want."""
        self._request("request", ("a",), owner, 1, timeout, expires, SHARED)

    @rule(
        asked=key_lists,
        owner=owners,
        timeout=timeouts,
        expires=expiries,
        api=st.sampled_from(["request_many", "acquire_many"]),
    )
    @step
    def request_many_shared(self, asked, owner, timeout, expires, api) -> None:
        """Several keys at once, shared."""
        self._request(api, tuple(asked), owner, 1, timeout, expires, SHARED)

    @rule(
        others=st.lists(st.sampled_from(KEYS[1:]), min_size=1, max_size=2, unique=True),
        owner=owners,
        timeout=timeouts,
        expires=expiries,
    )
    @step
    def request_many_contended_shared(self, others, owner, timeout, expires) -> None:
        """Shared multi-key requests overlapping on "a"."""
        self._request("request_many", ("a", *others), owner, 1, timeout, expires, SHARED)

    @precondition(lambda self: self.holding())
    @rule(index=st.integers(min_value=0), mode=st.sampled_from([EXCLUSIVE, SHARED]), many=st.booleans())
    @step
    def ask_again_in_a_mode(self, index, mode, many) -> None:
        """A holder asks again in either mode: a renewal, or a ModeConflict that changes nothing."""
        held = self.holding()[index % len(self.holding())]
        if many:
            other = KEYS[(KEYS.index(held.key) + 1) % len(KEYS)]
            self._request("request_many", (held.key, other), held.owner, 1, 1, 1, mode)
        else:
            self._request("request", (held.key,), held.owner, 1, 1, 1, mode)

    @rule(
        asked=key_lists,
        owner=owners,
        timeout=timeouts,
        expires=expiries,
        api=st.sampled_from(["request_many", "acquire_many"]),
    )
    @step
    def request_many(self, asked, owner, timeout, expires, api) -> None:
        """Several keys at once (2-3 of 4, a key sometimes given twice)."""
        self._request(api, tuple(asked), owner, 1, timeout, expires)

    @rule(
        others=st.lists(st.sampled_from(KEYS[1:]), min_size=1, max_size=2, unique=True),
        owner=owners,
        reverse=st.booleans(),
        timeout=timeouts,
        expires=expiries,
    )
    @step
    def request_many_contended(self, others, owner, reverse, timeout, expires) -> None:
        """Multi-key requests overlapping on "a", in both key orders."""
        asked = ["a", *others]
        if reverse:
            asked.reverse()
        self._request("request_many", tuple(asked), owner, 1, timeout, expires)

    @rule(
        order=st.permutations(OWNERS),
        pair=st.permutations(KEYS).map(lambda ks: ks[:2]),
        max_concurrent=max_concurrents,
        timeout=timeouts,
        expires=expiries,
    )
    @step
    def reserve_behind_holder(self, order, pair, max_concurrent, timeout, expires) -> None:
        """
        One owner holds a key; a second asks for it and a free key together;
        a third asks for the free key alone, and waits behind the reservation.
        (Later steps release, disconnect, cancel or time out around it.)
        """
        first, second, third = order[:3]
        held, free = pair
        self._request("request", (held,), first, 1, -1, expires)
        self._request("acquire_many", (held, free), second, 1, timeout, expires)
        self._request("acquire", (free,), third, max_concurrent, timeout, expires)

    @precondition(lambda self: self.holding())
    @rule(
        index=st.integers(min_value=0),
        extra=st.lists(keys, min_size=0, max_size=2),
        all_held=st.booleans(),
        first=st.booleans(),
        timeout=timeouts,
        expires=expiries,
    )
    @step
    def renew_many(self, index, extra, all_held, first, timeout, expires) -> None:
        """A holder asks for several keys, some (or all) of them held: those are renewed."""
        held = self.holding()[index % len(self.holding())]
        mine = [h.key for h in self.holding() if h.owner == held.owner] if all_held else [held.key]
        asked = [*mine, *extra] if first else [*extra, *mine]
        self._request("request_many", tuple(asked), held.owner, 1, timeout, expires)

    @precondition(lambda self: self.model.queue)
    @rule(index=st.integers(min_value=0), which=st.integers(min_value=0), many=st.booleans())
    @step
    def ask_again_while_waiting(self, index, which, many) -> None:
        """An owner asks again for a key it waits for: AlreadyWaiting, and nothing changes."""
        wait = self.model.queue[index % len(self.model.queue)]
        key = wait.keys[which % len(wait.keys)]
        if many:
            self._request("request_many", (key, KEYS[(KEYS.index(key) + 1) % len(KEYS)]), wait.owner, 1, 1, 1)
        else:
            self._request("request", (key,), wait.owner, 1, 1, 1)

    @rule(
        owner=owners,
        bad=st.sampled_from([((), -1, 1), (("a", "b"), -2, 1), (("a", "b"), -0.5, 1), (("a", "b"), 1, -1)]),
    )
    @step
    def request_many_invalid(self, owner, bad) -> None:
        """No keys, or a parameter out of range: ValueError, and nothing changes."""
        asked, timeout, expires = bad
        try:
            self.service.request_many(list(asked), owner, timeout, expires)
        except ValueError:
            pass
        else:
            raise AssertionError(f"request_many{bad!r} did not raise ValueError")

    # -- giving back

    @rule(key=keys, owner=owners)
    @step
    def release(self, key, owner) -> None:
        expected = self.model.release_key(key, owner, self.now())
        actual = self.service.release(key, owner)
        assert actual == expected, f"release({key!r}, {owner!r}) returned {actual}, the model says {expected}"

    def _release_handle(self, grant: Grant) -> None:
        expected = self.model.release_grant(grant, self.now())
        actual = grant.release()
        assert actual == expected, f"{grant!r}.release() returned {actual}, the model says {expected}"

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(min_value=0))
    @step
    def release_handle(self, index) -> None:
        """Grant.release() on any handle ever handed out (current or stale)."""
        self._release_handle(self.handles[index % len(self.handles)])

    @precondition(lambda self: self.holding())
    @rule(index=st.integers(min_value=0))
    @step
    def release_current_handle(self, index) -> None:
        held = self.holding()[index % len(self.holding())]
        assert held.grant is not None, f"the grant of request {held.rid} for {held.key!r} was never told"
        self._release_handle(held.grant)

    @rule(owner=owners)
    @step
    def release_all(self, owner) -> None:
        """The owner disconnects: its grants are released and its waits cancelled."""
        self.model.release_all(owner, self.now())
        self.service.release_all(owner)

    @precondition(lambda self: self.model.queue)
    @rule(index=st.integers(min_value=0))
    @step
    def cancel_waiting(self, index) -> None:
        self._cancel(self.model.queue[index % len(self.model.queue)].rid)

    @precondition(lambda self: any(r.deferred is not None for r in self.requests))
    @rule(index=st.integers(min_value=0))
    @step
    def cancel_any(self, index) -> None:
        """Cancelling any request: a pending one is withdrawn, one answered already is left as it was."""
        pending = [r for r in self.requests if r.deferred is not None]
        self._cancel(pending[index % len(pending)].rid)

    def _cancel(self, rid: int) -> None:
        self.model.cancel(rid, self.now())
        deferred = self.requests[rid].deferred
        assert deferred is not None
        deferred.cancel()

    @precondition(lambda self: self.model.queue)
    @rule(index=st.integers(min_value=0), which=st.integers(min_value=0))
    @step
    def release_when_granted(self, index, which) -> None:
        """
        A waiting request's callback gives back one of its grants as soon as
        it is told (while the service may still be telling others of the same
        change).
        """
        request = self.requests[self.model.queue[index % len(self.model.queue)].rid]
        assert request.deferred is not None

        def react(value):
            grants = value if isinstance(value, list) else [value]
            grants = [g for g in grants if isinstance(g, Grant)]
            if grants:
                try:
                    self._release_handle(grants[which % len(grants)])
                except BaseException as error:
                    self.problems.append(f"releasing a grant of request {request.rid} when told: {error!r}")
            return value

        request.deferred.addCallback(react)

    # -- time

    @rule(amount=advances)
    @step
    def advance(self, amount) -> None:
        self.advance_clock(amount)

    def timer_entry(self, kind: str, item: Any) -> Optional[tuple[Any, Optional[float]]]:
        if kind == "expiry":
            held = self.model.holder(item.key, item.owner)
            if held is None or held.grant is not item:
                return None
            return held, held.expires_at
        wait = self.model.wait_of(item.key, item.owner)
        if wait is None or wait.keys != (item.keys or (item.key,)):
            return None
        return wait, wait.timeout_at

    def apply_timer(self, kind: str, item: Any, entry: Any, now: float) -> None:
        if kind == "expiry":
            self.expiries += 1
            self.model.expire(entry, now)
        else:
            self.timeout_keys.append(item.key)
            self.model.time_out(entry, now)

    # -- checks

    def check(self) -> None:
        self._check_requests()
        self._check_table()
        self._check_bookkeeping()
        self._check_rule_on_service()
        self._check_tokens()
        self._check_public_views()
        self.check_events()

    def _check_requests(self) -> None:
        """Every Deferred fires at most once, and with the model's outcome."""
        assert not self.model.untold, f"requests {sorted(self.model.untold)} were granted but never told"
        for request in self.requests:
            outcomes = request.outcomes
            label = f"request {request.rid}: {request.api}({list(request.asked)!r}, {request.owner!r})"
            assert len(outcomes) <= 1, f"{label} fired more than once: {outcomes!r}"
            verdict = self.model.verdicts.get(request.rid)
            if verdict is None:
                assert not outcomes, f"{label} fired with {outcomes!r}, the model says it still waits"
                continue
            assert outcomes, f"{label} has not fired, the model says {verdict!r}"
            kind, value = outcomes[0]
            if verdict[0] == "grant":
                assert kind == "grant", f"{label}: {outcomes!r}, expected a grant"
                expected = verdict[1]
                assert expected is not None, f"{label} was granted but never told"
                if request.multi:
                    assert isinstance(value, list), f"{label}: {value!r} is not a list of grants"
                    grants = value
                else:
                    assert isinstance(value, Grant), f"{label}: {value!r} is not a grant"
                    grants = [value]
                shown = [(g.key, g.owner) for g in grants]
                wanted = [(h.key, h.owner) for h in expected]
                assert shown == wanted, f"{label}: granted {shown}, the model says {wanted}"
                for grant, held in zip(grants, expected):
                    assert grant is held.grant, f"{label}: {grant!r} is not the handle of the model's holder"
                assert len({g.token for g in grants}) == len(grants), f"{label}: tokens {[g.token for g in grants]}"
                continue
            expected_type = {
                "timeout": LockTimeout,
                "already": AlreadyWaiting,
                "conflict": ModeConflict,
                "cancelled": CancelledError,
            }
            assert kind == "error" and type(value) is expected_type[verdict[0]], (
                f"{label}: {outcomes!r}, expected {verdict[0]}"
            )
            if verdict[0] in ("already", "conflict"):
                assert value.key == verdict[1], f"{label}: {value!r} names {value.key!r}, not {verdict[1]!r}"
            elif verdict[0] == "timeout":
                assert value.key in request.asked, f"{label}: LockTimeout names {value.key!r}"
                assert value.busy == verdict[1], (
                    f"{label}: LockTimeout.busy is {value.busy!r}; the keys in the way were {verdict[1]!r}"
                )

    def _check_table(self) -> None:
        """Holders and waiters of every key, entry by entry."""
        service, model = self.service, self.model
        assert set(service._locks) == model.active_keys(), (
            f"keys in use: service {sorted(service._locks)}, model {sorted(model.active_keys())}"
        )
        waiter_objects: dict[int, Any] = {}
        for key in KEYS:
            lock = service._locks.get(key)
            holders = list(lock.holders) if lock is not None else []
            actual = [(g.owner, g.max_concurrent, g.granted_at, g.expires_at, g.mode) for g in holders]
            expected = [
                (h.owner, h.max_concurrent, h.granted_at, h.expires_at, SHARED if h.shared else EXCLUSIVE)
                for h in model.holders[key]
            ]
            assert actual == expected, f"holders of {key!r}: service {actual}, model {expected}"
            for grant, held in zip(holders, model.holders[key]):
                assert held.grant is grant, f"{grant!r} is not the handle told to request {held.rid}"
                assert grant.key == key, f"{grant!r} held under {key!r}"
            live = [w for w in (lock.waiters or ()) if w.deferred is not None] if lock is not None else []
            actual_waits = [(w.owner, w.max_concurrent, w.expires, w.timeout_at, w.keys, w.shared) for w in live]
            expected_waits = [
                (w.owner, w.max_concurrent, w.expires, w.timeout_at, w.keys if w.multi else None, w.shared)
                for w in model.waits_for(key)
            ]
            assert actual_waits == expected_waits, (
                f"waiters for {key!r}: service {actual_waits}, model {expected_waits}"
            )
            for waiter, wait in zip(live, model.waits_for(key)):
                seen = waiter_objects.setdefault(wait.rid, waiter)
                assert seen is waiter, f"request {wait.rid} waits as two objects"
                if wait.multi:
                    assert waiter.asked == wait.asked, f"request {wait.rid} asked {waiter.asked}, not {wait.asked}"
            if lock is not None:
                assert lock.waiting == len(live), f"{key!r}: waiting count {lock.waiting}, {len(live)} live"
                assert lock.multi == sum(w.keys is not None for w in live), f"{key!r}: multi count {lock.multi}"
                assert lock.shared == sum(w.shared for w in live), f"{key!r}: shared count {lock.shared}"
        expiring = sum(h.expires_at is not None for h in model.all_holders())
        timing_out = sum(w.timeout_at is not None for w in model.queue)
        assert len(service._expiries) == expiring, f"{len(service._expiries)} expiries, {expiring} grants expire"
        assert len(service._wait_timeouts) == timing_out, (
            f"{len(service._wait_timeouts)} wait timeouts, {timing_out} waits time out"
        )
        assert len(self.recorder.expiries) == self.expiries, f"observer: {len(self.recorder.expiries)} expiries"
        assert self.recorder.timeouts == self.timeout_keys, f"observer timeouts: {self.recorder.timeouts}"

    def _check_bookkeeping(self) -> None:
        """C{_owners} (each grant or wait under its key) and C{_spread}."""
        service, model = self.service, self.model
        expected: dict[str, dict[str, Any]] = {}
        for held in model.all_holders():
            expected.setdefault(held.owner, {})[held.key] = held.grant
        for wait in model.queue:
            for key in wait.keys:
                expected.setdefault(wait.owner, {})[key] = wait
        actual_keys = {owner: set(entries) for owner, entries in service._owners.items()}
        expected_keys = {owner: set(entries) for owner, entries in expected.items()}
        assert actual_keys == expected_keys, f"_owners: service {actual_keys}, model {expected_keys}"
        for owner, entries in expected.items():
            for key, entry in entries.items():
                actual = service._owners[owner][key]
                if isinstance(entry, Wait):
                    assert not isinstance(actual, Grant), f"{owner!r} holds {key!r}, the model says it waits"
                else:
                    assert actual is entry, f"{owner!r}'s entry for {key!r} is {actual!r}, not its grant"
        spread = {owner: n for owner, n in service._spread.items() if n}
        expected_spread: dict[str, int] = {}
        for wait in model.queue:
            if wait.multi and len(wait.keys) > 1:
                expected_spread[wait.owner] = expected_spread.get(wait.owner, 0) + len(wait.keys) - 1
        assert spread == expected_spread, f"_spread: service {service._spread}, model {expected_spread}"
        assert all(n >= 0 for n in service._spread.values()), f"_spread: {service._spread}"
        assert set(service._spread) <= set(service._owners), f"_spread {service._spread} for unknown owners"

    def _check_rule_on_service(self) -> None:
        """The invariants, straight from the service's own state."""
        locks = self.service._locks

        def admitted(key, waiter):
            lock = locks[key]
            live = [w for w in lock.waiters or () if w.deferred is not None]
            if any(w.shared != waiter.shared for w in live[: live.index(waiter)]):
                return False
            if waiter.shared:
                return all(h.mode == SHARED for h in lock.holders)
            joining = len(lock.holders) + 1
            if any(joining > h.max_concurrent or h.mode == SHARED for h in lock.holders):
                return False
            return next((w for w in live if w.max_concurrent >= joining), None) is waiter

        for key, lock in locks.items():
            count = len(lock.holders)
            assert len({h.mode for h in lock.holders}) <= 1, f"{key!r} has holders of both modes: {lock.holders!r}"
            assert all(count <= h.max_concurrent or h.mode == SHARED for h in lock.holders), (
                f"{key!r} has {count} holders, more than one of them allows: {lock.holders!r}"
            )
            for waiter in lock.waiters or ():
                if waiter.deferred is not None:
                    assert not all(admitted(k, waiter) for k in waiter.keys or (waiter.key,)), (
                        f"{waiter.owner!r}, waiting for {waiter.keys or waiter.key!r}, could be granted but waits"
                    )
        if self.model.queue:
            # nothing can deadlock: the first waiter has a holder in its way
            first = self.model.queue[0]
            assert any(locks[key].holders for key in first.keys), (
                f"request {first.rid} of {first.owner!r} waits first for {first.keys} with no holder in its way"
            )

    def _check_tokens(self) -> None:
        """Every grant's token is above every token before it; a renewal keeps it."""
        grants = self.recorder.grants
        assert len(grants) == self.model.holders_made, (
            f"the service made {len(grants)} grants, the model {self.model.holders_made}"
        )
        last = grants[self.tokens_checked - 1][1] if self.tokens_checked else 0
        for grant, token in grants[self.tokens_checked :]:
            # (the documented formula: max(last + 1, now in microseconds))
            assert token == max(last + 1, int(grant.granted_at * 1000000)), (
                f"{grant!r} has token {token} after {last} at {grant.granted_at}"
            )
            last = token
        self.tokens_checked = len(grants)
        assert self.service.last_token == last, f"last_token {self.service.last_token}, last given {last}"
        for held in self.model.all_holders():
            grant = held.grant
            assert grant is not None, f"request {held.rid}'s grant of {held.key!r} was never told"
            assert grant.token == held.token, f"{grant!r}: token {grant.token}, was {held.token}"
            waited = held.granted_at - self.requests[held.rid].at
            assert self.recorder.waited.get(id(grant)) == waited, (
                f"{grant!r}: observer says it waited {self.recorder.waited.get(id(grant))}, not {waited}"
            )

    def _check_public_views(self) -> None:
        service, model = self.service, self.model
        for key in [*KEYS, UNUSED_KEY]:
            expected = KeyStatus(key, len(model.holders.get(key, [])), len(model.waits_for(key)))
            assert service.status(key) == expected, f"status({key!r}): {service.status(key)}, model {expected}"
            assert service.holders(key) == [h.grant for h in model.holders.get(key, [])], f"holders({key!r})"
        totals = Totals(len(model.active_keys()), len(model.all_holders()), len(model.queue))
        assert service.totals() == totals, f"totals: {service.totals()}, model {totals}"
        for owner in OWNERS:
            held = [h.grant for h in model.all_holders() if h.owner == owner]
            entries = len(held) + sum(len(w.keys) for w in model.queue if w.owner == owner)
            assert service.owned(owner) == entries, f"owned({owner!r}): {service.owned(owner)}, model {entries}"
            actual = service.grants_of(owner)
            assert sorted(map(id, actual)) == sorted(map(id, held)), f"grants_of({owner!r}): {actual}"

    # -- the end

    def finish(self) -> None:
        # Time runs on past every deadline (and those of the grants they lead to).
        for _ in range(len(self.requests) + 5):
            deadlines = self.model.deadlines()
            if not deadlines:
                break
            self.advance_clock(max(deadlines) - self.now() + 2 * TICK)
            self.check_all()
        else:
            raise AssertionError(f"deadlines keep coming: {self.model.deadlines()}")
        # Holders give back what they hold: every wait left is granted in the end.
        left = [w.rid for w in self.model.queue]
        for _ in range(len(self.requests) + 2):
            if not self.model.queue:
                break
            for held in self.holding():
                if held in self.holding():
                    assert self.model.release_key(held.key, held.owner, self.now())
                    assert self.service.release(held.key, held.owner), f"{held.grant!r} was not released"
                    self.check_all()
        else:
            raise AssertionError(f"requests {[w.rid for w in self.model.queue]} are never granted")
        for rid in left:
            verdict = self.model.verdicts[rid]
            if verdict[0] == "timeout" and self.requests[rid].api.endswith("_many"):
                # All or nothing: a key it held when it asked was given
                # back (above) while it waited.
                assert set(verdict[1]) <= set(self.requests[rid].asked), f"request {rid}: {verdict}"
            else:
                assert verdict[0] == "grant", f"request {rid} waited for ever and ended {verdict[0]}"
        # Everyone goes away: nothing is left, nothing is pending.
        for owner in OWNERS:
            self.release_all(owner)
        self.check_all()
        for request in self.requests:
            assert len(request.outcomes) == 1, f"request {request.rid}: {request.outcomes!r}"
        service = self.service
        assert service._locks == {}, service._locks
        assert service._owners == {}, service._owners
        assert service._spread == {}, service._spread
        assert service.totals() == (0, 0, 0), service.totals()
        self.check_watches_ended()
        # No timer outlives the clock running past every deadline.  (One may
        # be pending until then: see test_idle_service_keeps_no_timer.)
        self.clock.advance(10)
        assert self.clock.getDelayedCalls() == [], self.clock.getDelayedCalls()
        assert service.totals() == (0, 0, 0), service.totals()


SETTINGS = model_settings(300, 50)


class MultiKeyModelTests(model_test_case(MultiKeyMachine, SETTINGS)):
    """The service agrees with the model, run after run."""


class SilentTimeoutService(ObservedLockService):
    """Broken: a wait that times out takes the keys only it kept in the table away untold (no DISAPPEARED)."""

    timing_out = False

    def _time_out(self, waiter):
        self.timing_out = True
        try:
            super()._time_out(waiter)
        finally:
            self.timing_out = False

    def _tell(self, kind, key, grant):
        if not (self.timing_out and kind == DISAPPEARED):
            super()._tell(kind, key, grant)


class BrokenServiceTests(SynchronousTestCase):
    """The model test fails against a service that breaks a rule only several keys at once reach."""

    def test_a_key_left_by_a_wait_untold(self) -> None:
        machine = type("SilentTimeoutMachine", (MultiKeyMachine,), {"service_class": SilentTimeoutService})
        # (stopping at the first failure; as generous as the single-key model's broken services)
        run_settings = settings(model_settings(1000, 50), phases=[Phase.generate], report_multiple_bugs=False)
        error = self.assertRaises(AssertionError, run_state_machine_as_test, machine, settings=run_settings)
        self.assertIn("('disappeared'", str(error))

    def tearDown(self) -> None:
        self.flushLoggedErrors()


# -- examples ----------------------------------------------------------------------


class MultiKeyExampleTests(SynchronousTestCase):
    """The key behaviours of multi-key requests, one example each."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)

    def pending(self, deferred: Deferred) -> Deferred:
        self.assertNoResult(deferred)
        return deferred

    def test_multi_key_waiter_reserves_a_free_key(self) -> None:
        """
        A multi-key request waiting for one key keeps its place in the others:
        a later request for a free key it wants waits behind it.
        """
        service = self.service
        held = service.request("b", "q")
        many = self.pending(service.acquire_many(["a", "b"], "p"))
        self.assertEqual(service.status("a"), KeyStatus("a", 0, 1))
        mutex = self.pending(service.acquire("a", "r"))
        # (no holder is in the way of a looser request either: the candidate is)
        shared = self.pending(service.acquire("a", "s", max_concurrent=3))
        self.assertEqual(service.status("a"), KeyStatus("a", 0, 3))

        self.assertTrue(held.release())
        grants = self.successResultOf(many)
        self.assertEqual([(g.key, g.owner, g.max_concurrent) for g in grants], [("a", "p", 1), ("b", "p", 1)])
        self.assertNoResult(mutex)
        self.assertNoResult(shared)

        service.release_all("p")
        self.assertEqual(self.successResultOf(mutex).owner, "r")
        self.assertNoResult(shared)  # r holds "a" as a mutex

    def test_timeout_frees_the_reservation(self) -> None:
        """When a multi-key wait times out, the keys it reserved go to the requests behind it."""
        service = self.service
        service.request("b", "q")
        many = self.pending(service.acquire_many(["a", "b"], "p", timeout=1))
        later = self.pending(service.acquire("a", "r"))
        self.clock.advance(0.99)
        self.assertNoResult(many)
        self.clock.advance(0.02)  # (a deadline fires at most one 10 ms tick late)
        self.assertEqual(self.failureResultOf(many, LockTimeout).value.busy, ["b"])
        self.assertEqual(service.holders("a"), [self.successResultOf(later)])
        self.assertEqual(service.totals(), Totals(2, 2, 0))
        self.assertEqual(service._spread, {})

    def test_overlapping_requests_in_opposite_key_orders_do_not_deadlock(self) -> None:
        """Two multi-key requests asking for the same keys in opposite orders: first come, first served."""
        service = self.service
        service.request("a", "h")
        first = self.pending(service.acquire_many(["a", "b"], "p"))
        second = self.pending(service.acquire_many(["b", "a"], "q"))
        # "b" is free, but reserved for p: q holds nothing while it waits
        self.assertEqual(service.status("b"), KeyStatus("b", 0, 2))
        self.assertEqual(service.grants_of("q"), [])

        self.assertTrue(service.release("a", "h"))
        granted = self.successResultOf(first)
        self.assertEqual([g.owner for g in granted], ["p", "p"])
        self.assertNoResult(second)

        service.release_all("p")
        answer = self.successResultOf(second)
        self.assertEqual([(g.key, g.owner) for g in answer], [("b", "q"), ("a", "q")])
        # one fencing token per key, above every earlier one
        tokens = [g.token for g in granted + answer]
        self.assertEqual(tokens, sorted(set(tokens)))

    def test_release_all_of_a_multi_key_waiter(self) -> None:
        """Its owner going away cancels a multi-key wait and hands on the keys it reserved."""
        service = self.service
        service.request("a", "q")
        many = self.pending(service.acquire_many(["a", "b", "c"], "p"))
        later_b = self.pending(service.acquire("b", "r"))
        later_c = self.pending(service.acquire("c", "s", max_concurrent=2))
        self.assertEqual(service.owned("p"), 3)
        self.assertEqual(service._spread, {"p": 2})
        self.assertEqual(service.totals(), Totals(3, 1, 3))

        service.release_all("p")
        self.failureResultOf(many, CancelledError)
        self.assertEqual(self.successResultOf(later_b).owner, "r")
        self.assertEqual(self.successResultOf(later_c).owner, "s")
        self.assertEqual(service.owned("p"), 0)
        self.assertNotIn("p", service._owners)
        self.assertEqual(service._spread, {})
        self.assertEqual(service.totals(), Totals(3, 3, 0))

    def test_limits_count_a_multi_key_wait_per_key_or_once(self) -> None:
        """A multi-key wait counts per key toward max-waiters, once toward max-total-waits and max-held."""
        # max-waiters: one waiter in each key's queue
        service = LockService(self.clock, max_waiters=1)
        service.request("a", "q")
        self.pending(service.acquire_many(["a", "b"], "p"))
        with self.assertRaises(LimitReached) as caught:
            service.request("b", "r")
        self.assertEqual(caught.exception.limit, "max-waiters")
        self.assertEqual(service.status("b"), KeyStatus("b", 0, 1))
        self.assertIsInstance(service.request_many(["c", "d"], "r"), list)  # free keys: no wait

        # max-total-waits: the multi-key wait is one wait
        service = LockService(self.clock, max_total_waits=2)
        service.request("a", "q")
        self.pending(service.acquire_many(["a", "b", "c"], "p"))
        self.pending(service.acquire("a", "r"))
        self.assertEqual(service.totals().waiting, 2)
        with self.assertRaises(LimitReached) as caught:
            service.request("a", "s")
        self.assertEqual(caught.exception.limit, "max-total-waits")

        # max-held: the multi-key wait is one entry of its owner's
        service = LockService(self.clock, max_held=2)
        service.request("a", "q")
        self.pending(service.acquire_many(["a", "b", "c"], "p"))
        self.assertEqual(service.owned("p"), 3)
        self.assertIsInstance(service.request("d", "p"), Grant)
        with self.assertRaises(LimitReached) as caught:
            service.request_many(["e", "f"], "p")
        self.assertEqual(caught.exception.limit, "max-held")
        self.assertEqual(service.status("e"), KeyStatus("e", 0, 0))

    def test_idle_service_keeps_no_timer(self) -> None:
        """
        Once nothing is held or waited for, the service keeps no timer (an
        idle server sleeps), even when the grant an expiry handed on was given
        back by its callback while that expiry ran.
        """
        service = self.service
        service.request("a", "q", expires=1)
        many = self.pending(service.acquire_many(["a", "b"], "p", expires=1))
        many.addCallback(lambda grants: [grant.release() for grant in grants])
        self.clock.advance(1.0)
        self.assertEqual(self.successResultOf(many), [True, True])
        self.assertEqual(service.totals(), Totals(0, 0, 0))
        self.assertEqual(
            self.clock.getDelayedCalls(),
            [],
            "jesync.deadlines.Deadlines._run leaves the timer that add() scheduled from inside fire() (the"
            " expiry of the grant handed on) when a discard() from inside the same fire() (its release)"
            " empties every bucket: an idle service wakes up once more for nothing",
        )

    def _busy_setup(self) -> None:
        """p holds "a"; q holds "b" and "e"; r waits for "c" and "e" (so "c" is reserved); "d" is free."""
        service = self.service
        service.request("a", "p")
        service.request("b", "q")
        service.request("e", "q")
        self.pending(service.acquire_many(["c", "e"], "r"))

    def test_lock_timeout_busy_names_the_keys_in_the_way(self) -> None:
        """
        A multi-key wait timing out names in C{busy} the keys held by others or
        reserved by an earlier request; not the keys its owner holds, nor the
        free ones it had reserved.
        """
        self._busy_setup()
        many = self.pending(self.service.acquire_many(["a", "b", "c", "d"], "p", timeout=1))
        self.clock.advance(1.01)
        error = self.failureResultOf(many, LockTimeout).value
        self.assertEqual(error.busy, ["b", "c"])
        self.assertIn(error.key, ["a", "b", "c", "d"])
        self.assertEqual(self.service.status("d"), KeyStatus("d", 0, 0))

    def test_lock_timeout_at_once_busy_names_the_keys_in_the_way(self) -> None:
        """The same with timeout 0: the request fails at once, naming the same keys, and changes nothing."""
        self._busy_setup()
        many = self.service.acquire_many(["a", "b", "c", "d"], "p", timeout=0)
        error = self.failureResultOf(many, LockTimeout).value
        self.assertEqual(
            error.busy,
            ["b", "c"],
            "LockTimeout.busy of a multi-key request with timeout 0 should name the keys in the way;"
            " request_many puts only its first asked key there (LockTimeout(asked[0])), here \"a\","
            " which its own owner holds",
        )
        self.assertEqual(self.service.totals(), Totals(4, 3, 1))
