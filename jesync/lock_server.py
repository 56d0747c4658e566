"""
A lock server as a Twisted service: L{LockServer} is the listeners of one
L{LockService} (all of them or none, L{jesync.listening.Listeners}), logs
its summary once every endpoint listens, and stops gracefully: every
connection closed (which releases every lock and cancels every wait), the
clients that do not take their last replies dropped after a grace period,
and what it released logged.  L{TokenFile}, one of its children, takes a
new token from its file on SIGHUP.

It is built from settings by L{jesync.server.build_lock_server} (the
composition root), which gives it its factories and children; this module
builds nothing itself.
"""

from __future__ import annotations

import signal
from typing import Any, List, Optional

from twisted.application import service
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from jesync.connections.connection import LockServerFactory
from jesync.connections.policy import ConnectionPolicy, read_token_file
from jesync.listening import Listeners
from jesync.process import exit_cleanly, ignore_further_stop_signals
from jesync.service import LockService


class LockServer(Listeners):
    """
    The listeners of one lock server (L{Listeners}: all of them or none);
    stopping it closes every connection.  Only once every endpoint listens
    does it log its summary.

    Stopping (twistd's SIGTERM or SIGINT) stops listening, closes every
    connection, which releases every lock and cancels every wait, drops the
    clients that do not take their last replies within C{grace} seconds, and
    logs what it released.  A stop that completes is a normal exit: twistd
    then exits with status 0 rather than re-raising the signal.  Another
    SIGTERM or SIGINT during the stop is logged and changes nothing.
    """

    def __init__(self, locks: LockService, policy: ConnectionPolicy, clock: IReactorTime, grace: float = 5.0) -> None:
        super().__init__(clock)
        self.locks = locks
        self.policy = policy
        self.grace = grace
        self.summary = ""
        # The protocol factories by name (None: a protocol not served).
        self.factories: dict[str, Optional[LockServerFactory]] = {}
        # Every registry of connections to close when stopping.
        self.registries = [policy.connections]
        self._started = False

    def listening_everywhere(self) -> None:
        self._started = True
        self.log.info("jesync starting: {summary}", summary=self.summary)

    def stopService(self) -> Deferred[None]:
        self._ignore_further_stop_signals()
        connections = len(self.policy.connections)
        held = self.locks.totals()
        started, self._started = self._started, False
        stopped = self.stop_listening()
        stopped.addCallback(
            lambda _: gatherResults([registry.close_all(self.clock, self.grace) for registry in self.registries])
        )

        def stopped_cleanly(_: object) -> None:
            left = self.locks.totals()
            if started:  # (one that did not start said why)
                self.log.info(
                    "jesync stopped: closed {connections} connections, released {granted} grants and "
                    "{waiting} waits on {keys} keys ({left_granted} grants left, held by embedders)",
                    connections=connections,
                    granted=held.granted - left.granted,
                    waiting=held.waiting - left.waiting,
                    keys=held.keys - left.keys,
                    left_granted=left.granted,
                )
            exit_cleanly(self.clock)

        return stopped.addCallback(stopped_cleanly)

    def _ignore_further_stop_signals(self) -> None:
        ignore_further_stop_signals(self.clock, self.log)


class TokenFile(service.Service):
    """
    Reads a token file again on SIGHUP: the new token is accepted at once,
    the previous one for C{grace} seconds more (clients can be given the new
    one without a restart); when they are over, the connections still
    authenticated with it are closed.  A file that cannot be read, or holds
    no single token, is logged and changes nothing.  A server may read two
    (the auth token's, and the admin listener's own, C{name}d C{admin
    token}): each one's SIGHUP handler calls the one it replaced, so one
    SIGHUP reads both.
    """

    log = Logger()

    def __init__(
        self, path: str, policy: ConnectionPolicy, clock: IReactorTime, grace: float, name: str = "auth token"
    ) -> None:
        self.path = path
        self.policy = policy
        self.clock = clock
        self.grace = grace
        self.name = name
        self._previous_handler: Any = None
        # The ends of grace periods to come (cancelled when the server stops).
        self._retirements: List[IDelayedCall] = []

    def startService(self) -> None:
        super().startService()
        call_from_thread = getattr(self.clock, "callFromThread", None)
        if call_from_thread is None or not hasattr(signal, "SIGHUP"):
            return  # not a reactor (an embedder's clock), or no SIGHUP here

        def hangup(number: int, frame: Any) -> None:
            call_from_thread(self.reload)
            if callable(self._previous_handler):
                self._previous_handler(number, frame)

        try:
            self._previous_handler = signal.signal(signal.SIGHUP, hangup)
        except ValueError:  # not the main thread: the embedder handles signals
            self._previous_handler = None

    def stopService(self) -> None:
        super().stopService()
        for call in self._retirements:
            if call.active():
                call.cancel()
        self._retirements = []
        if self._previous_handler is not None:
            signal.signal(signal.SIGHUP, self._previous_handler)
            self._previous_handler = None

    def reload(self) -> None:
        """Read the token file again, and take its token."""
        try:
            token = read_token_file(self.path)
        except (OSError, ValueError) as error:
            self.log.error(
                "{name} file not read again, the token stays: {why}",
                name=self.name,
                why=getattr(error, "strerror", None) or error,
            )
            return
        if self.policy.rotate(token, self.clock.seconds(), self.grace):
            self.log.info(
                "new {name} taken; the previous one is accepted for {grace} s more", name=self.name, grace=self.grace
            )
            self._retirements = [call for call in self._retirements if call.active()]
            self._retirements.append(self.clock.callLater(self.grace, self.close_rotated_out))
        else:
            self.log.info("{name} file read again: the token is unchanged", name=self.name)

    def close_rotated_out(self) -> None:
        """A grace period is over: close the connections still on the token it was for."""
        closed = self.policy.close_rotated_out(self.clock.seconds())
        if closed:
            self.log.info("closed {count} connections authenticated with a token rotated out", count=closed)
