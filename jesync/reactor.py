"""
C{jesync-epoll}: Twisted's epoll reactor without the per-event logging
context, for C{twistd --reactor jesync-epoll jesync ...}.

Twisted's L{EPollReactor.doPoll} hands every ready descriptor to
C{log.callWithLogger(selectable, ...)}, which asks the selectable for its
C{logPrefix()}, pushes C{{"system": prefix}} on the legacy context stack
(C{twisted.python.context.call}: a thread-local lookup, a dict and a list
append and pop) and only then calls C{_doReadOrWrite}.  On CPython, at 64
connections, that wrapping is a large share of a lock server's whole CPU per
request (BENCHMARKS.md).  L{JESyncEPollReactor} is the same reactor (the
same poller, registration, timeouts, threads, signals, shutdown) whose
C{doPoll} calls C{_doReadOrWrite} directly.  On PyPy it also listens
with L{ReadIntoPort}, whose connections read into one reused buffer: what
a protocol receives is the same, and a read no longer costs the GC 64 KiB
(L{ReadIntoServer} says why; CPython's C{recv} has no such cost, so there
it listens as Twisted does).

What the dispatch changes, precisely: the legacy log context.  An event emitted by
C{twisted.python.log.msg} or C{log.err} while a selectable's C{doRead} or
C{doWrite} (or the C{connectionLost} they lead to) runs, without an explicit
C{system=}, no longer carries that selectable's C{logPrefix()} as its
C{system} (its C{[...]} in twistd's log line): it carries C{"-"}.  Nothing
else: events from L{twisted.logger.Logger} never read that context (their
C{[...]} is C{namespace#level}, under either reactor), and neither does
anything outside the dispatch of an event (timed calls, threads, startup).

Why nothing jesync logs depends on it: jesync logs only through
L{twisted.logger.Logger} (C{jesync.lock_server}, C{jesync.listening},
C{jesync.fencing}, C{jesync.deadlines}, C{jesync.process}); no module of
jesync imports C{twisted.python.log} or reads a C{system} key; its journal
observer (L{jesync.journal}) and twistd's file observer print whatever
system an event has; and no test reads a logged system.  What is left on the
legacy path is Twisted's own few messages (e.g. a client factory's
C{Stopping factory} when a connection to etcd closes), whose C{[...]}
becomes C{[-]}.

The safety is kept, and so is the prefix where it matters most:
C{callWithLogger} also caught and logged whatever escaped C{_doReadOrWrite}
(e.g. a C{connectionLost} that raised), as C{Unhandled Error} under the
selectable's prefix, so that no application error stops the reactor; the
loop body here does the same (C{KeyboardInterrupt} still propagates, as
there).  And C{_doReadOrWrite} (Twisted's, unchanged otherwise) logs an
exception from C{doRead} or C{doWrite} with the selectable's prefix as its
C{system} explicitly, so those tracebacks read exactly as under Twisted's
reactor; the prefix is computed only then, never per event.
"""

from __future__ import annotations

import errno
import platform
import sys
from typing import Any, Optional

from twisted.internet import main, tcp
from twisted.internet.epollreactor import EPollReactor
from twisted.internet.posixbase import _NO_FILEDESC
from twisted.python import log

__all__ = ["JESyncEPollReactor", "install"]

_CONNECTION_DONE = main.CONNECTION_DONE
_CONNECTION_LOST = main.CONNECTION_LOST


def _log_prefix(selectable: Any) -> str:
    """C{selectable.logPrefix()}, or what C{log.callWithLogger} logs when that raises."""
    try:
        return str(selectable.logPrefix())
    except KeyboardInterrupt:
        raise
    except BaseException:
        prefix = "(buggy logPrefix method)"
        log.err(system=prefix)
        return prefix


class ReadIntoServer(tcp.Server):
    """
    A TCP server connection reading into one buffer kept for every
    connection, rather than asking C{socket.recv} for a new one each time:
    Twisted's C{doRead} with C{recv_into}, whatever it reads handed on as
    the same C{bytes} (copied out of the buffer before C{dataReceived}
    runs, so no protocol ever sees the buffer).

    Why (PyPy): C{recv(65536)} allocates its whole 64 KiB in the GC's
    nursery (about half a megabyte here) however few bytes arrive, so a
    lock server reading 20-byte requests ran a minor collection every
    seven or eight reads.
    """

    _buffer = bytearray(tcp.Server.bufferSize)
    _view = memoryview(_buffer)

    def doRead(self) -> Any:
        try:
            size = self.socket.recv_into(self._buffer)
        except OSError as se:
            if se.args[0] == errno.EWOULDBLOCK:
                return None
            return _CONNECTION_LOST
        return self._dataReceived(self._view[:size].tobytes())


class ReadIntoPort(tcp.Port):
    """A TCP port whose connections are L{ReadIntoServer}s."""

    transport = ReadIntoServer


class JESyncEPollReactor(EPollReactor):
    """
    L{EPollReactor} dispatching each ready descriptor without
    C{log.callWithLogger} (see the module's docstring), and on PyPy
    listening with L{ReadIntoPort}.
    """

    if platform.python_implementation() == "PyPy":

        def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
            """Twisted's C{listenTCP}, with a L{ReadIntoPort}."""
            listening = ReadIntoPort(port, factory, backlog, interface, self)
            listening.startListening()
            return listening

    def doPoll(self, timeout: Optional[float]) -> None:
        """Poll for events and dispatch each: Twisted's C{doPoll}, without the logging context."""
        if timeout is None:
            timeout = -1  # Wait indefinitely.
        try:
            events = self._poller.poll(timeout, len(self._selectables))
        except OSError as err:
            if err.errno == errno.EINTR:
                return
            raise
        selectables = self._selectables
        dispatch = self._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            try:
                dispatch(selectable, fd, event)
            except KeyboardInterrupt:
                raise
            except BaseException:
                log.err(system=_log_prefix(selectable))

    doIteration = doPoll

    def _doReadOrWrite(self, selectable: Any, fd: int, event: int) -> None:
        """
        Twisted's C{_PollLikeMixin._doReadOrWrite} (26.10 and 25.5 alike),
        except that an exception from C{doRead} or C{doWrite} is logged
        with the selectable's prefix as its C{system}, as it was under the
        context this reactor no longer sets.
        """
        why: Any = None
        inRead = False
        if event & self._POLL_DISCONNECTED and not (event & self._POLL_IN):
            # Disconnected, with no input left to read: a clean close (or a
            # half-close) if we were reading, otherwise an error.
            if fd in self._reads:
                inRead = True
                why = _CONNECTION_DONE
            else:
                why = _CONNECTION_LOST
        else:
            try:
                if selectable.fileno() == -1:
                    why = _NO_FILEDESC
                else:
                    if event & self._POLL_IN:
                        why = selectable.doRead()
                        inRead = True
                    if not why and event & self._POLL_OUT:
                        why = selectable.doWrite()
                        inRead = False
            except BaseException:
                # Any exception from application code is logged and
                # disconnects the selectable.
                why = sys.exc_info()[1]
                log.err(system=_log_prefix(selectable))
        if why:
            self._disconnectSelectable(selectable, why, inRead)


def install() -> JESyncEPollReactor:
    """Install L{JESyncEPollReactor} as C{twisted.internet.reactor}."""
    reactor = JESyncEPollReactor()
    from twisted.internet.main import installReactor

    installReactor(reactor)
    return reactor
