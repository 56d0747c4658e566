"""
A twistd log observer for systemd's journal:
C{twistd --logger jesync.journal.observer ...}, as C{etc/jesync.service} runs it.

Under systemd a service's standard output goes to the journal, which stamps
each line with its own time.  twistd's C{--logfile=-} stamps every line too,
so each would carry two timestamps.  This observer writes each event to
standard output as C{<N>[system] text}: the text twistd would write, without
the timestamp, after the C{<N>} prefix of sd-daemon(3), which journald takes
as the line's priority (N is its syslog level), so that C{journalctl -p
warning -u jesync} shows the warnings and errors alone.  As in twistd's
format, the lines after an event's first (a traceback's) are indented by a
tab; each carries the prefix too, since journald files each line as an entry
of its own.
"""

from __future__ import annotations

import sys
from typing import IO, Optional

from twisted.logger import FileLogObserver, LogEvent, LogLevel, eventAsText

__all__ = ["observer", "format_event", "PRIORITIES"]

#: syslog levels (sd-daemon(3)'s prefixes) for Twisted's log levels.
PRIORITIES = {
    LogLevel.debug: 7,
    LogLevel.info: 6,
    LogLevel.warn: 4,
    LogLevel.error: 3,
    LogLevel.critical: 2,
}

#: An event without a level: Twisted's own default (info), or error if it
#: carries a failure.
_INFO = 6
_ERROR = 3


def format_event(event: LogEvent) -> Optional[str]:
    """
    C{event} as journal lines: C{eventAsText} without its timestamp, its
    lines after the first indented by a tab, each line prefixed with the
    event's priority; None for an event with no text.
    """
    text = eventAsText(event, includeTimestamp=False)
    if not text:
        return None
    level = event.get("log_level")
    if level in PRIORITIES:
        priority = PRIORITIES[level]
    else:
        priority = _ERROR if "log_failure" in event else _INFO
    first, *rest = text.splitlines()
    return "".join([f"<{priority}>{first}\n", *(f"<{priority}>\t{line}\n" for line in rest)])


def observer(output: Optional[IO[str]] = None) -> FileLogObserver:
    """
    The observer for C{twistd --logger}: it writes to C{output}, standard
    output by default (taken now, before twistd redirects C{sys.stdout} to the
    log), and flushes after each event.
    """
    return FileLogObserver(output if output is not None else sys.stdout, format_event)
