"""
L{jesync.reactor}: its C{doPoll} dispatches each ready descriptor without
the legacy logging context, and keeps C{log.callWithLogger}'s safety: an
exception from C{doRead}, or one that escapes the dispatch, is logged with
the selectable's prefix and the next descriptor is still served.  Each case
runs under Twisted's L{EPollReactor} too, for what must be the same.  The
poller is a fake (a unit test opens no socket): it returns the events given.
"""

from __future__ import annotations

import errno
from select import EPOLLHUP, EPOLLIN
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from twisted.internet.epollreactor import EPollReactor
from twisted.logger import globalLogPublisher
from twisted.python import log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync import reactor as jesync_reactor
from jesync.reactor import JESyncEPollReactor


class FakePoller:
    """An epoll object that reports C{events}, once, then nothing."""

    def __init__(self, events: List[Tuple[int, int]], error: Optional[OSError] = None) -> None:
        self.events = events
        self.error = error

    def poll(self, timeout: float, maxevents: int) -> List[Tuple[int, int]]:
        if self.error is not None:
            raise self.error
        events, self.events = self.events, []
        return events

    def register(self, fd: int, flags: int) -> None:
        pass

    def modify(self, fd: int, flags: int) -> None:
        pass

    def unregister(self, fd: int) -> None:
        pass


class Selectable:
    """A selectable whose C{doRead} runs C{read}, and which records its loss."""

    def __init__(self, fd: int, read: Callable[[], Any] = lambda: None, lost: Callable[[], Any] = lambda: None) -> None:
        self.fd = fd
        self.read = read
        self.lost = lost
        self.reads = 0
        self.lost_reasons: List[Failure] = []

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return f"Selectable,{self.fd},127.0.0.1"

    def doRead(self) -> Any:
        self.reads += 1
        return self.read()

    def doWrite(self) -> None:
        raise AssertionError("no write event was given")

    def connectionLost(self, reason: Failure) -> None:
        self.lost_reasons.append(reason)
        self.lost()


class DoPollTests(SynchronousTestCase):
    def poll(
        self, reactor_type: Type[EPollReactor], selectables: List[Selectable], events: List[Tuple[int, int]]
    ) -> List[Dict[str, Any]]:
        """
        Run one C{doPoll} of a C{reactor_type} over C{events}; the log events
        it emitted (the errors among them are flushed: expected).
        """
        reactor = reactor_type()
        real_poller = reactor._poller
        self.addCleanup(real_poller.close)
        self.addCleanup(reactor.waker.connectionLost, None)
        reactor._poller = FakePoller(events)
        for selectable in selectables:
            reactor._selectables[selectable.fd] = selectable
        logged: List[Dict[str, Any]] = []
        globalLogPublisher.addObserver(logged.append)
        try:
            reactor.doPoll(0)
        finally:
            globalLogPublisher.removeObserver(logged.append)
            self.flushLoggedErrors()
        return logged

    def both(
        self, make: Callable[[], List[Selectable]], events: List[Tuple[int, int]]
    ) -> List[Tuple[List[Selectable], List[Dict[str, Any]]]]:
        """The same poll under Twisted's reactor, then under jesync's."""
        runs = []
        for reactor_type in (EPollReactor, JESyncEPollReactor):
            selectables = make()
            runs.append((selectables, self.poll(reactor_type, selectables, events)))
        return runs

    def test_error_in_doRead_is_logged_and_the_next_is_served(self) -> None:
        """
        An exception from C{doRead} is logged as an error with the
        selectable's prefix as its system, disconnects that selectable, and
        the next ready descriptor is still read: as under Twisted's reactor.
        """

        def make() -> List[Selectable]:
            return [Selectable(101, read=lambda: 1 / 0), Selectable(102)]

        for (failing, next_one), logged in self.both(make, [(101, EPOLLIN), (102, EPOLLIN)]):
            errors = [event for event in logged if event.get("isError")]
            self.assertEqual([event["log_system"] for event in errors], ["Selectable,101,127.0.0.1"])
            self.assertIsInstance(errors[0]["failure"].value, ZeroDivisionError)
            self.assertTrue(errors[0]["log_text"].startswith("Unhandled Error\n"), errors[0]["log_text"])
            self.assertEqual([reason.type for reason in failing.lost_reasons], [ZeroDivisionError])
            self.assertEqual((next_one.reads, next_one.lost_reasons), (1, []))

    def test_error_escaping_the_dispatch_is_logged_and_the_next_is_served(self) -> None:
        """
        What escapes C{_doReadOrWrite} (here a C{connectionLost} that raises)
        is caught and logged with the selectable's prefix, as
        C{log.callWithLogger} did, and the loop goes on.
        """

        def make() -> List[Selectable]:
            return [Selectable(101, lost=lambda: {}["missing"]), Selectable(102)]

        for (failing, next_one), logged in self.both(make, [(101, EPOLLHUP), (102, EPOLLIN)]):
            errors = [event for event in logged if event.get("isError")]
            self.assertEqual([event["log_system"] for event in errors], ["Selectable,101,127.0.0.1"])
            self.assertIsInstance(errors[0]["failure"].value, KeyError)
            self.assertTrue(errors[0]["log_text"].startswith("Unhandled Error\n"), errors[0]["log_text"])
            self.assertEqual(len(failing.lost_reasons), 1)
            self.assertEqual((next_one.reads, next_one.lost_reasons), (1, []))

    def test_buggy_logPrefix(self) -> None:
        """A C{logPrefix} that raises is logged too, and the error is logged under C{callWithLogger}'s placeholder."""

        def make() -> List[Selectable]:
            selectable = Selectable(101, read=lambda: 1 / 0)
            selectable.logPrefix = lambda: [][0]  # type: ignore[method-assign]
            return [selectable, Selectable(102)]

        for (failing, next_one), logged in self.both(make, [(101, EPOLLIN), (102, EPOLLIN)]):
            errors = [event for event in logged if event.get("isError")]
            self.assertEqual(
                sorted(event["failure"].type.__name__ for event in errors), ["IndexError", "ZeroDivisionError"]
            )
            self.assertEqual({event["log_system"] for event in errors}, {"(buggy logPrefix method)"})
            self.assertEqual(next_one.reads, 1)

    def test_keyboard_interrupt_propagates(self) -> None:
        """C{KeyboardInterrupt} escaping the dispatch stops the loop, as under C{callWithLogger}."""
        for reactor_type in (EPollReactor, JESyncEPollReactor):

            def interrupt() -> None:
                raise KeyboardInterrupt()

            selectables = [Selectable(101, lost=interrupt), Selectable(102)]
            self.assertRaises(
                KeyboardInterrupt, self.poll, reactor_type, selectables, [(101, EPOLLHUP), (102, EPOLLIN)]
            )
            self.assertEqual(selectables[1].reads, 0)

    def test_the_dropped_context(self) -> None:
        """
        What the reactor changes, and only that: a legacy C{log.msg} inside
        C{doRead} carries the system C{-} rather than the selectable's prefix.
        """
        systems = []
        for _, logged in self.both(lambda: [Selectable(101, read=lambda: log.msg("inside doRead"))], [(101, EPOLLIN)]):
            systems.append([event["log_system"] for event in logged if event.get("log_format") == "{log_text}"])
        self.assertEqual(systems, [["Selectable,101,127.0.0.1"], ["-"]])

    def test_interrupted_poll(self) -> None:
        """An C{EINTR} from C{epoll_wait} ends the iteration quietly; any other error is raised."""
        reactor = JESyncEPollReactor()
        real_poller = reactor._poller
        self.addCleanup(real_poller.close)
        self.addCleanup(reactor.waker.connectionLost, None)
        reactor._poller = FakePoller([], OSError(errno.EINTR, "interrupted"))
        reactor.doPoll(None)
        reactor._poller = FakePoller([], OSError(errno.EBADF, "bad"))
        self.assertRaises(OSError, reactor.doPoll, 0)

    def test_install_and_dropin(self) -> None:
        """The dropin names the module whose C{install} the reactor is."""
        from twisted.plugins import jesync_reactor as dropin

        self.assertEqual(dropin.jesync_epoll.shortName, "jesync-epoll")
        self.assertEqual(dropin.jesync_epoll.moduleName, "jesync.reactor")
        self.assertIs(jesync_reactor.install, __import__(dropin.jesync_epoll.moduleName, fromlist=["install"]).install)
