"""
How a jesync process ends under C{twistd}, which has no exit status of its
own to give: twistd exits with status 0 unless an exception or a signal
ends it, re-raises the signal that stopped its reactor, and, on a second
SIGTERM while stopping, stops the reactor again (a traceback).  So:

 - a stop that completes is a clean exit, status 0 (L{exit_cleanly});
 - another SIGTERM or SIGINT during the stop is logged and changes nothing
   (L{ignore_further_stop_signals});
 - a server that cannot listen ends the process with status 1 and one line
   on stderr, not a traceback (L{exit_if_not_listening}).

These lean on twistd's internals (its reactor's C{_exitSignal}, its
redirected C{sys.stderr}), so they live here, in one place, for the lock
server, a cluster member and C{twistd jesync}'s L{jesync.tap} alike.
Everything else is built as though any process embedded it.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import Any, Optional, cast

from twisted.internet.error import ReactorNotRunning
from twisted.logger import Logger
from twisted.python.failure import Failure

from jesync.listening import Listeners, ListenFailed


def exit_cleanly(clock: object) -> None:
    """
    twistd re-raises the signal that stopped the reactor once it has run
    (twisted.application.app._exitWithSignal): a shutdown that completed
    is a clean exit (status 0).
    """
    if getattr(clock, "_exitSignal", None) is not None:
        # (a private attribute of twistd's reactor, unknown to IReactorTime)
        setattr(clock, "_exitSignal", None)


def ignore_further_stop_signals(clock: object, log: Logger) -> None:
    """
    The reactor's own SIGTERM handler would stop it again, which fails
    (with a traceback) while it is stopping, and would make twistd
    re-raise the signal at exit: take the signals over for the rest of
    the stop.
    """
    call_from_thread = getattr(clock, "callFromThread", None)
    stopping = getattr(clock, "running", False) and getattr(clock, "_stopped", False)
    if call_from_thread is None or not stopping:
        return  # not a reactor that is shutting down (an embedder stopping this service)

    def already_stopping(number: int, frame: object) -> None:
        call_from_thread(log.info, "received signal {number} while stopping: already stopping", number=number)

    for name in ("SIGTERM", "SIGINT"):
        try:
            signal.signal(getattr(signal, name), already_stopping)
        except (ValueError, OSError):  # not the main thread
            pass


def exit_if_not_listening(server: Listeners, reactor: Any) -> None:
    """
    Under twistd: end the process with status 1 if C{server} cannot listen
    (L{_not_listening}), once twistd has stopped the reactor and removed its
    pid file (L{_exit_status}).
    """
    atexit.register(_exit_status)
    server.when_listening().addErrback(_not_listening, reactor)


# Why twistd's process is to end with status 1 (not 0) once it has run, if it is.
_failed: Optional[ListenFailed] = None


def _not_listening(reason: Failure, reactor: Any) -> None:
    """
    Under twistd: the server could not listen, and said why in the log.
    Usually it knows that at once, before the reactor runs, and raises
    L{ListenFailed} to twistd, which then exits with status 1 (and, when it
    has daemonized, tells the process that started it): show it on stderr as
    one line rather than a traceback.  If it is known only once the reactor
    runs (an endpoint type that listens in its own time), stop the reactor
    and exit with status 1.
    """
    global _failed
    reason.trap(ListenFailed)
    if not reactor.running:
        _show_listen_failed_briefly()
        return
    _failed = cast(ListenFailed, reason.value)
    try:
        reactor.stop()
    except ReactorNotRunning:
        pass  # stopping already


def _show_listen_failed_briefly() -> None:
    previous = sys.excepthook
    if getattr(previous, "jesync", False):
        return

    def show(kind: Any, value: BaseException, traceback: Any) -> None:
        if isinstance(value, ListenFailed):
            _tell(value)
        else:
            previous(kind, value, traceback)

    setattr(show, "jesync", True)
    sys.excepthook = show


def _tell(error: ListenFailed) -> None:
    """Say why the server did not start on twistd's own stderr (twistd has redirected C{sys.stderr} to its log)."""
    if sys.__stderr__ is not None:
        try:
            sys.__stderr__.write(f"twistd jesync: not started: {error}\n")
            sys.__stderr__.flush()
        except (OSError, ValueError):
            pass


def _exit_status() -> None:
    """
    At exit, after twistd has stopped the reactor and removed its pid file:
    status 1 if the server could not listen.  (twistd has no exit status of
    its own to set: its process ends with 0 unless an exception or a signal
    ends it.)
    """
    if _failed is None:
        return
    _tell(_failed)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    os._exit(1)
