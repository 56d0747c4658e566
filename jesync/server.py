"""
A lock server as a Twisted service: its listeners, and a graceful stop.
"""

from __future__ import annotations

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from jesync.protocols.connections import ConnectionPolicy
from jesync.service import LockService


class LockServer(service.MultiService):
    """
    The listeners of one lock server; stopping it closes every connection.

    Stopping (twistd's SIGTERM or SIGINT) stops listening, closes every
    connection, which releases every lock and cancels every wait, drops the
    clients that do not take their last replies within C{grace} seconds, and
    logs what it released.  A stop that completes is a normal exit: twistd
    then exits with status 0 rather than re-raising the signal.
    """

    log = Logger()

    def __init__(
        self, locks: LockService, policy: ConnectionPolicy, clock: IReactorTime, grace: float = 5.0
    ) -> None:
        super().__init__()
        self.locks = locks
        self.policy = policy
        self.clock = clock
        self.grace = grace
        self.summary = ""

    def listen(self, description: str, factory: object) -> None:
        """Serve C{factory} on the endpoint C{description} while this service runs."""
        endpoint = endpoints.serverFromString(self.clock, description)
        StreamServerEndpointService(endpoint, factory).setServiceParent(self)

    def startService(self) -> None:
        super().startService()
        self.log.info("jesync starting: {summary}", summary=self.summary)

    def stopService(self) -> Deferred[None]:
        connections = len(self.policy.connections)
        held = self.locks.totals()
        stopped = super().stopService()
        stopped.addCallback(lambda _: self.policy.connections.close_all(self.clock, self.grace))

        def stopped_cleanly(_: object) -> None:
            left = self.locks.totals()
            self.log.info(
                "jesync stopped: closed {connections} connections, released {granted} grants and "
                "{waiting} waits on {keys} keys ({left_granted} grants left, held by embedders)",
                connections=connections,
                granted=held.granted - left.granted,
                waiting=held.waiting - left.waiting,
                keys=held.keys - left.keys,
                left_granted=left.granted,
            )
            # twistd re-raises the signal that stopped the reactor once it
            # has run (twisted.application.app._exitWithSignal); a shutdown
            # that completed is a clean exit.
            if getattr(self.clock, "_exitSignal", None) is not None:
                self.clock._exitSignal = None

        return stopped.addCallback(stopped_cleanly)
