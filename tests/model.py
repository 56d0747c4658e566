"""
The harness of the model-based tests (C{tests/unit/test_*_model.py}), written once.

Each of those tests lets hypothesis drive a real object (the lock service,
the memcached object store) on a L{Clock} with random sequences of
operations, and after every step compares it with a plain-Python model
written from the documented rules.  A harness keeps only its own model, its
rules and its checks; what they all need is here:

 - L{ModelMachine}: the clock; the problems seen inside callbacks the clock
   or the service runs (they cannot raise there, so they are kept and raised
   at the end of the step); a log observer, so that an error the code under
   test only logs fails the run; and C{broken}, set by L{step} when a rule
   or a check fails, so that teardown then only cleans up instead of
   reporting a second failure over the first.
 - L{ServiceModelMachine}: a machine over an L{ObservedLockService}, whose
   expiries and wait timeouts are seen as they fire: each is checked against
   the model's deadline for it and applied to the model in the order the
   clock runs them (L{ServiceModelMachine.timer_fired}); the clock is
   advanced in steps that stop just before the model's next deadline and
   again one tick after it, so a deadline that fires early, or more than a
   tick late, is caught (L{ServiceModelMachine.advance_clock}); each
   request's Deferred is tracked, what it fired with recorded in order
   (L{ServiceModelMachine.track}); and one invariant raises the problems
   seen, fails on logged errors and runs the harness's own C{check}.
 - L{WatchModel} and L{WatchRules}: the service's watches and the events
   each watching owner is due, modelled once for the service's models: the
   model of the lock table says what happened in each change
   (L{WatchModel.tell}), the rules watch and unwatch, and
   L{WatchRules.check_events} compares what every listener was told with
   what the model says it is due.
 - L{model_settings} and L{model_test_case}: how a model test runs (the same
   examples every time) and the test case that runs a machine.

A harness that models more (the service's lock modes, say) subclasses the
harness it extends: its model class (C{model_class}), the service it
observes (C{service_class}), and the hooks C{timer_entry}, C{apply_timer},
C{on_answer}, C{on_grant} and C{check}.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.errors import LimitReached
from jesync.service import APPEARED, DISAPPEARED, Grant, LockEvent, LockService

# Deadlines fire on 10 ms ticks: at most one tick after they are due.
TICK = 0.01
# Slack for float arithmetic in clock times (which stay below ~500 s here).
EPS = 1e-9
# How far before a deadline the clock stops, to see that nothing fired early.
BEFORE = 1e-4

#: The owners the service models draw from (watches included).
OWNERS = ["p", "q", "r", "s"]
#: What key watches watch: the models' keys, a key never used, and "" (refused: only a prefix may be empty).
WATCHED_KEYS = ["a", "b", "c", "d", "never-used", ""]
#: What prefix watches watch: every key, one key, and prefixes no key in use has.
PREFIXES = ["", "a", "b", "ab", "n"]
#: A watch made as a run starts, so that most runs have one: (owner, key or prefix, is it a prefix), or none.
first_watches = st.sampled_from([("s", "", True), ("r", "a", False), ("q", "a", True), None])


def step(method: Callable) -> Callable:
    """Mark the machine broken if a rule or invariant fails (teardown then only cleans up)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.broken = True
            raise

    return run


class ModelMachine(RuleBasedStateMachine):
    """
    A state machine on a L{Clock} that fails on problems seen in callbacks
    and on logged errors.  A subclass's C{finish} drives a run to its end and
    checks it (it is skipped when the run is broken already).
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        # problems seen inside the clock's or the service's callbacks, raised once the step returns
        self.problems: list[str] = []
        self.logged: list[dict] = []
        self.broken = False
        globalLogPublisher.addObserver(self._log_observer)

    def _log_observer(self, event: dict) -> None:
        if event.get("log_failure") is not None or event.get("log_level") in (LogLevel.error, LogLevel.critical):
            self.logged.append(event)

    def now(self) -> float:
        return self.clock.seconds()

    def raise_problems(self) -> None:
        if self.problems:
            raise AssertionError("\n".join(self.problems))

    def check_nothing_logged(self) -> None:
        assert not self.logged, f"errors were logged: {self.logged!r}"

    def finish(self) -> None:
        """The end of a run that did not break: drive it to its end and check what is left."""

    def teardown(self) -> None:
        try:
            if self.broken:
                return
            self.finish()
            self.raise_problems()
            self.check_nothing_logged()
        finally:
            globalLogPublisher.removeObserver(self._log_observer)


class ObservedLockService(LockService):
    """
    A L{LockService} that reports each expiry and wait timeout its timers
    fire to its machine (L{ServiceModelMachine.timer_fired}), as it fires:
    the clock runs several in one C{advance}, in an order the model must
    follow.
    """

    machine: Any = None

    def _expire(self, grant: Grant) -> None:
        self.machine.timer_fired("expiry", grant, lambda: LockService._expire(self, grant))

    def _time_out(self, waiter) -> None:
        self.machine.timer_fired("timeout", waiter, lambda: LockService._time_out(self, waiter))


class ServiceModelMachine(ModelMachine):
    """
    A machine that compares an L{ObservedLockService} with a model.

    A subclass gives its C{model_class} (whose instances say the deadlines
    due, C{deadlines()}), and the hooks: C{timer_entry} (the model's entry
    for a timer that fired, and its deadline), C{apply_timer} (the event, on
    the model), C{on_answer} and C{on_grant} (a request's Deferred fired),
    C{check} (the comparison, after every step and every timer).
    """

    model_class: Callable[[], Any]
    service_class: Callable[..., ObservedLockService] = ObservedLockService

    def __init__(self) -> None:
        super().__init__()
        self.model = self.model_class()
        self.make_service()
        self.requests: list[Any] = []  # every request made, its index its rid
        self.handles: list[Grant] = []  # every grant handed out, current and stale, in order

    def make_service(self, **options: Any) -> None:
        """A new service (with C{options}: its limits) for the run, observed by this machine."""
        self.service = self.service_class(self.clock, **options)
        self.service.machine = self

    # -- requests

    def track(self, request: Any, result: Any) -> None:
        """
        Record in C{request.outcomes}, in order, what C{result} (a Deferred,
        or an answer given at once) fires with: C{("grant", value)} or
        C{("error", exception)}.
        """

        def granted(value: Any) -> Any:
            self.on_answer(request)
            request.outcomes.append(("grant", value))
            self.on_grant(request, value)
            return value

        def failed(failure: Failure) -> None:
            self.on_answer(request)
            request.outcomes.append(("error", failure.value))

        if isinstance(result, Deferred):
            result.addCallbacks(granted, failed)
        else:
            granted(result)

    def on_answer(self, request: Any) -> None:
        """C{request}'s answer is being told (before it is recorded)."""

    def on_grant(self, request: Any, value: Any) -> None:
        """C{request} was granted C{value} (after it is recorded)."""

    # -- time

    def advance_clock(self, amount: float) -> None:
        """
        Advance the clock by C{amount}, stopping first just before the
        model's next deadline (nothing may fire early), then just over a
        tick after it (it must have fired).
        """
        target = self.now() + amount
        for _ in range(10_000):
            now = self.now()
            if now >= target:
                return
            stop = target
            deadlines = self.model.deadlines()
            if deadlines:
                due = min(deadlines)
                stop = min(stop, due - BEFORE if due - BEFORE > now else due + TICK + EPS / 2)
            self.clock.advance(stop - now)
            self.raise_problems()
            self.check_not_late()
        raise AssertionError(f"the clock did not reach {target} from {self.now()}")

    def check_not_late(self) -> None:
        now = self.now()
        late = [d for d in self.model.deadlines() if d + TICK + EPS < now]
        assert not late, f"at {now!r}, deadlines {late!r} have not fired"

    def timer_fired(self, kind: str, item: Any, fire: Callable[[], None]) -> None:
        """
        Called by the service for each expiry (C{item} the grant) or wait
        timeout (C{item} the waiter), in the order they run: check it against
        the model's deadline, apply it to the model, let it run, and check.
        """
        now = self.now()
        found = self.timer_entry(kind, item)
        problem = None
        if found is None:
            problem = f"at {now!r}: {kind} of {item!r} fired, but the model has no such grant or wait"
        else:
            entry, deadline = found
            if deadline is None:
                problem = f"at {now!r}: {kind} of {item.owner!r} on {item.key!r} fired but it has no deadline"
            elif not (deadline - EPS <= now <= deadline + TICK + EPS):
                problem = f"{kind} of {item.owner!r} on {item.key!r} due at {deadline!r} fired at {now!r}"
        if problem is not None:
            self.problems.append(problem)
        else:
            # the model first: callbacks run by fire() act on the state after the event
            self.apply_timer(kind, item, entry, now)
        try:
            fire()
        except BaseException as error:  # the service's Deadlines would only log it
            self.problems.append(f"{kind} of {item.owner!r} on {item.key!r} raised {error!r}")
            raise
        if not self.problems:
            try:
                self.check()
            except AssertionError as error:
                self.problems.append(f"after the {kind} of {item.owner!r} on {item.key!r} at {now!r}: {error}")

    def timer_entry(self, kind: str, item: Any) -> Optional[tuple[Any, Optional[float]]]:
        """The model's grant (C{kind} "expiry") or wait ("timeout") for C{item}, and its deadline; None if none."""
        raise NotImplementedError

    def apply_timer(self, kind: str, item: Any, entry: Any, now: float) -> None:
        """The expiry or the wait timeout of the model's C{entry}, on the model."""
        raise NotImplementedError

    # -- checks

    @invariant()
    @step
    def check_all(self) -> None:
        self.raise_problems()
        self.check_nothing_logged()
        self.check()

    def check(self) -> None:
        """The service agrees with the model (raises AssertionError if not)."""
        raise NotImplementedError


def model_settings(max_examples: int, steps: int) -> settings:
    """
    How a model test runs: the same examples every time (derandomized, no
    example database), no deadline, and no health check for slow or
    heavily filtered steps.
    """
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def model_test_case(
    machine: type[RuleBasedStateMachine], run_settings: settings, name: str = "test_service_agrees_with_model"
) -> type[SynchronousTestCase]:
    """
    A test case whose test C{name} runs C{machine} with C{run_settings}, and
    fails if it leaves errors logged.
    """

    def run(self: SynchronousTestCase) -> None:
        run_state_machine_as_test(machine, settings=run_settings)

    def tearDown(self: SynchronousTestCase) -> None:
        self.assertEqual(self.flushLoggedErrors(), [])

    run.__name__ = name
    run.__doc__ = f"{machine.__name__} agrees with its model ({run_settings.max_examples} examples)."
    return type("ModelTestCase", (SynchronousTestCase,), {name: run, "tearDown": tearDown})


# -- watches -------------------------------------------------------------------------


class WatchModel:
    """
    The watches of a service's owners and the events each is due, as the
    documentation (L{jesync.service}'s "Watches", L{ILockService.watch})
    says, in plain Python.

    An owner watches keys and prefixes (C{""}: every key).  Watching what it
    watches returns False and changes nothing but its listener (the latest
    one given is the one told); an empty key raises ValueError; a new watch
    past C{max_watches} (the owner's) or C{max_total_watches} raises
    L{LimitReached} and changes nothing.  An owner going away
    (C{release_all}) ends its watches first: it is told nothing of its own
    going.

    The model of the table numbers its changes (L{begin}: each operation
    that may change the table) and says what happens in each
    (L{tell}): every owner that watches the key (holder events: GRANTED,
    RELEASED, EXPIRED, LOST) or a prefix of it (those and APPEARED,
    DISAPPEARED) is due the event, once however many of its watches match,
    in the order it happened.  A change is I{loose} when the documentation
    leaves the order of its events across keys open (an owner's going,
    several keys granted at once): its events are compared key by key.
    """

    def __init__(self) -> None:
        # owner -> what it watches: (key or prefix, is it a prefix)
        self.watches: dict[str, set[tuple[str, bool]]] = {}
        # owner -> its latest listener (a number)
        self.listeners: dict[str, int] = {}
        self.max_watches: Optional[int] = None
        self.max_total_watches: Optional[int] = None
        self.change = 0
        # owner -> the events due since the last check: (change, kind, key,
        # holder), holder None for APPEARED and DISAPPEARED, else the grant's
        # (owner, mode, value)
        self.events: dict[str, list[tuple]] = {}
        self.loose: set[int] = set()

    def begin(self, loose: bool = False) -> None:
        """A change begins (C{loose}: its events of different keys come in an order of their own)."""
        self.change += 1
        if loose:
            self.loose.add(self.change)

    def tell(self, kind: str, key: str, holder: Optional[tuple] = None) -> None:
        """An event of this change (C{holder}: the grant's (owner, mode, value); None: a key appeared or left)."""
        for owner, watched in self.watches.items():
            if (holder is not None and (key, False) in watched) or any(
                prefix and key.startswith(target) for target, prefix in watched
            ):
                self.events.setdefault(owner, []).append((self.change, kind, key, holder))

    def tell_keys(self, before: set, after: set) -> None:
        """DISAPPEARED for the keys that were in the table (C{before}) and are not (C{after})."""
        for key in sorted(before - after):
            self.tell(DISAPPEARED, key)

    def watch(self, owner: str, target: str, prefix: bool, listener: int) -> Any:
        """
        What C{watch(owner, target, prefix=prefix)} does: True (a new watch)
        or False (the owner had it), else what it raises: "ValueError" or
        the set of caps it passes.
        """
        watched = self.watches.get(owner, set())
        if (target, prefix) in watched:
            self.listeners[owner] = listener
            return False
        if not target and not prefix:
            return "ValueError"
        passed = set()
        if self.max_watches is not None and len(watched) >= self.max_watches:
            passed.add("max-watches")
        if self.max_total_watches is not None and self.watch_count() >= self.max_total_watches:
            passed.add("max-total-watches")
        if passed:
            return passed
        self.watches.setdefault(owner, set()).add((target, prefix))
        self.listeners[owner] = listener
        return True

    def unwatch(self, owner: str, target: str, prefix: bool) -> bool:
        watched = self.watches.get(owner)
        if watched is None or (target, prefix) not in watched:
            return False
        watched.remove((target, prefix))
        if not watched:
            del self.watches[owner]
            del self.listeners[owner]
        return True

    def end(self, owner: str) -> None:
        """The owner went away: its watches end."""
        self.watches.pop(owner, None)
        self.listeners.pop(owner, None)

    def watch_count(self) -> int:
        return sum(len(watched) for watched in self.watches.values())


class WatchRules:
    """
    The rules that watch and unwatch, and the checks of watches and events,
    for a L{ServiceModelMachine} whose model keeps a L{WatchModel} as
    C{watching}.  Each listener records what it is told, tagged with the
    model's change under way: the machine applies each change to the model
    first and then makes it on the service, so an event told late, early,
    twice or not at all is seen by L{check_events}.
    """

    model: Any
    service: Any
    problems: list

    def __init__(self) -> None:
        super().__init__()
        # owner -> what the service told it since the last check
        self.told: dict[str, list[tuple]] = {}
        self.listeners_given = 0

    def listener(self, owner: str, number: int) -> Callable[[LockEvent], None]:
        """A listener for C{owner} (the C{number}th given): it records what it is told, and that it was the latest."""

        def told(event: LockEvent) -> None:
            watching = self.model.watching
            if watching.listeners.get(owner) != number:
                self.problems.append(f"{event!r} was told to listener {number} of {owner!r}, not its latest one")
            grant = event.grant
            if (grant is None) != (event.kind in (APPEARED, DISAPPEARED)) or (grant and grant.key != event.key):
                self.problems.append(f"{event!r} told to {owner!r}: the wrong grant for the event")
            holder = None if grant is None else (grant.owner, grant.mode, grant.value)
            self.told.setdefault(owner, []).append((watching.change, event.kind, event.key, holder))

        return told

    def watch_limits(self, max_watches: Optional[int], max_total_watches: Optional[int]) -> dict:
        """The caps of the run, on the model; returns them as the service's options."""
        self.model.watching.max_watches, self.model.watching.max_total_watches = max_watches, max_total_watches
        return {"max_watches": max_watches, "max_total_watches": max_total_watches}

    def watch_first(self, first: Optional[tuple]) -> None:
        """The watch a run starts with (one of L{first_watches}), made once its service is made."""
        if first is not None:
            self._watch(*first)

    def _watch(self, owner: str, target: str, prefix: bool) -> None:
        self.listeners_given += 1
        number = self.listeners_given
        expected = self.model.watching.watch(owner, target, prefix, number)
        call = f"watch({owner!r}, {target!r}, prefix={prefix})"
        try:
            actual = self.service.watch(owner, target, self.listener(owner, number), prefix=prefix)
        except ValueError:
            assert expected == "ValueError", f"{call} raised ValueError, the model says {expected!r}"
        except LimitReached as error:
            assert isinstance(expected, set) and error.limit in expected, (
                f"{call} refused for {error.limit}, the model says {expected!r}"
            )
        else:
            assert actual is expected, f"{call} returned {actual!r}, the model says {expected!r}"

    @rule(owner=st.sampled_from(OWNERS), key=st.sampled_from(WATCHED_KEYS))
    @step
    def watch_key(self, owner, key) -> None:
        self._watch(owner, key, False)

    @rule(owner=st.sampled_from(OWNERS), prefix=st.sampled_from(PREFIXES))
    @step
    def watch_prefix(self, owner, prefix) -> None:
        self._watch(owner, prefix, True)

    @rule(owner=st.sampled_from(OWNERS), watched=st.sampled_from([*WATCHED_KEYS, *PREFIXES]), prefix=st.booleans())
    @step
    def unwatch(self, owner, watched, prefix) -> None:
        expected = self.model.watching.unwatch(owner, watched, prefix)
        actual = self.service.unwatch(owner, watched, prefix=prefix)
        assert actual is expected, f"unwatch({owner!r}, {watched!r}, prefix={prefix}): {actual!r}, model {expected!r}"

    def check_events(self) -> None:
        """
        Each owner was told the events the model says it is due, change by
        change: in their order, or key by key in a loose change (then both
        records start again); and the watches are the model's.
        """
        watching = self.model.watching
        for owner in sorted(set(self.told) | set(watching.events)):
            actual = self.told.get(owner, [])
            expected = watching.events.get(owner, [])
            for change in sorted({event[0] for event in actual + expected}):
                told = [event[1:] for event in actual if event[0] == change]
                due = [event[1:] for event in expected if event[0] == change]
                if change in watching.loose:
                    told.sort(key=lambda event: event[1])  # (stable: each key's events stay in their order)
                    due.sort(key=lambda event: event[1])
                assert told == due, f"{owner!r} was told {told}, the model says {due} (change {change})"
        self.told.clear()
        watching.events.clear()
        watching.loose.clear()
        for owner in OWNERS:
            count = self.service.watches_of(owner)
            assert count == len(watching.watches.get(owner, ())), f"watches_of({owner!r}): {count}"
        assert self.service.watch_count == watching.watch_count(), f"watch_count: {self.service.watch_count}"

    def check_watches_ended(self) -> None:
        """Every owner went away: no watch is left, nor any trace of one."""
        service = self.service
        assert service.watch_count == 0, f"watch_count: {service.watch_count}"
        assert not (service._watchers or service._key_watchers or service._prefix_watchers), "watches left"
        assert not service._prefix_lengths, f"_prefix_lengths: {service._prefix_lengths}"
