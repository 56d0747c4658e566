"""
L{jesync.journal}: twistd's log lines for systemd's journal, without
timestamps and with sd-daemon priority prefixes.  (tests/process/test_systemd_unit.py
runs it under twistd, as the unit does.)
"""

from __future__ import annotations

import io
import sys
from typing import List

from twisted.logger import Logger, LogLevel, LogPublisher
from twisted.python import log as legacy_log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync import journal


def journal_output(emit) -> str:
    """What the journal observer writes for the events C{emit(logger)} logs."""
    output = io.StringIO()
    publisher = LogPublisher(journal.observer(output))
    emit(Logger(namespace="jesync.test", observer=publisher))
    return output.getvalue()


class FormatTests(SynchronousTestCase):
    def test_info(self) -> None:
        """An event is its system, then its text, after its priority: no timestamp."""
        self.assertEqual(
            journal_output(lambda log: log.info("jesync starting: {what}", what="JESync on tcp:11400")),
            "<6>[jesync.test#info] jesync starting: JESync on tcp:11400\n",
        )

    def test_levels(self) -> None:
        """Twisted's levels map to syslog's (sd-daemon(3) prefixes)."""
        expected = {
            LogLevel.debug: "<7>[jesync.test#debug] x\n",
            LogLevel.info: "<6>[jesync.test#info] x\n",
            LogLevel.warn: "<4>[jesync.test#warn] x\n",
            LogLevel.error: "<3>[jesync.test#error] x\n",
            LogLevel.critical: "<2>[jesync.test#critical] x\n",
        }
        for level, line in expected.items():
            self.assertEqual(journal_output(lambda log: log.emit(level, "x")), line)
        self.assertEqual(set(journal.PRIORITIES), set(LogLevel.iterconstants()))

    def test_failure(self) -> None:
        """
        A traceback's lines follow the event's first line, each indented by
        a tab (as twistd writes them) and each with the event's priority.
        """
        text = journal_output(lambda log: log.failure("lost {key}", self.failure(), key="k"))
        lines = text.splitlines()
        self.assertEqual(lines[0], "<2>[jesync.test#critical] lost k")
        self.assertGreater(len(lines), 2)
        for line in lines[1:]:
            self.assertTrue(line.startswith("<2>\t"), line)
        self.assertIn("<2>\tTraceback (most recent call last):", lines)
        self.assertIn("ZeroDivisionError", lines[-1])
        self.assertTrue(text.endswith("\n"))

    def test_multiline_text(self) -> None:
        self.assertEqual(
            journal_output(lambda log: log.warn("one\ntwo")),
            "<4>[jesync.test#warn] one\n<4>\ttwo\n",
        )

    def test_no_level(self) -> None:
        """An event without a level is info, or error if it carries a failure."""
        self.assertEqual(journal.format_event({"log_format": "x", "log_system": "s"}), "<6>[s] x\n")
        text = journal.format_event({"log_format": "x", "log_system": "s", "log_failure": self.failure()})
        assert text is not None
        self.assertTrue(text.startswith("<3>[s] x\n<3>\tTraceback"), text)

    def test_nothing_to_write(self) -> None:
        self.assertIsNone(journal.format_event({}))
        self.assertEqual(journal_output(lambda log: log.info("")), "")

    def test_legacy_events(self) -> None:
        """twisted.python.log's messages (twistd's, Twisted's own) get the same treatment: errors are critical."""
        output = io.StringIO()
        publisher = LogPublisher(journal.observer(output))
        legacy = legacy_log.LogPublisher(observerPublisher=publisher, publishPublisher=publisher)
        legacy.msg("Unable to write to plugin cache", system="-")
        legacy.msg(failure=self.failure(), isError=1, why="Unhandled Error", system="-")
        lines = output.getvalue().splitlines()
        self.assertEqual(
            lines[:3],
            ["<6>[-] Unable to write to plugin cache", "<2>[-] Unhandled Error", "<2>\tTraceback (most recent call last):"],
        )

    def failure(self) -> Failure:
        try:
            1 / 0
        except ZeroDivisionError:
            return Failure()
        raise AssertionError("1 / 0 did not raise")


class ObserverTests(SynchronousTestCase):
    def test_standard_output_by_default(self) -> None:
        """
        C{twistd --logger jesync.journal.observer} calls it with no argument:
        it writes to standard output, as it was when called (twistd then
        redirects C{sys.stdout} into the log), and flushes each event.
        """
        written: List[str] = []

        class Output(io.StringIO):
            def flush(self) -> None:
                written.append(self.getvalue())

        output = Output()
        self.patch(sys, "stdout", output)
        observer = journal.observer()
        self.patch(sys, "stdout", io.StringIO())
        Logger(namespace="n", observer=observer).info("hello")
        self.assertEqual(written, ["<6>[n#info] hello\n"])
