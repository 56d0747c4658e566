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
from hypothesis.stateful import RuleBasedStateMachine, invariant, run_state_machine_as_test
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.service import Grant, LockService

# Deadlines fire on 10 ms ticks: at most one tick after they are due.
TICK = 0.01
# Slack for float arithmetic in clock times (which stay below ~500 s here).
EPS = 1e-9
# How far before a deadline the clock stops, to see that nothing fired early.
BEFORE = 1e-4


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
