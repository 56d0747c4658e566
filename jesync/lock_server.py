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

import hmac
import signal
from typing import Any, Callable, List, Optional

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
        # Told when its cluster term ends, before its connections are
        # dropped: what may still be said (the HTTP API answers its long
        # polls not-granted; see jesync.cluster.member).
        self.term_ending: list[Callable[[], None]] = []
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
        self,
        path: str,
        policy: ConnectionPolicy,
        clock: IReactorTime,
        grace: float,
        name: str = "auth token",
        distinct_from: Optional[ConnectionPolicy] = None,
        following: Callable[[], List[ConnectionPolicy]] = list,
    ) -> None:
        self.path = path
        # Policies that take C{policy}'s tokens after each rotation, and
        # whose connections a grace period's end closes too (cluster mode:
        # the current term's).
        self.following = following
        # The other credential's policy (the admin token's and the lock
        # token's each name the other's): a new token equal to its token is
        # refused, as at startup, or one token would open both again.
        self.distinct_from = distinct_from
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
        other = self.distinct_from
        if other is not None and other.auth_token is not None and hmac.compare_digest(token, other.auth_token):
            self.log.error(
                "{name} file not taken, the token stays: the admin token and the auth token must differ",
                name=self.name,
            )
            return
        if self.policy.rotate(token, self.clock.seconds(), self.grace):
            for policy in self.following():
                self.policy.copy_to(policy)
            self.log.info(
                "new {name} taken; the previous one is accepted for {grace} s more", name=self.name, grace=self.grace
            )
            self._retirements = [call for call in self._retirements if call.active()]
            self._retirements.append(self.clock.callLater(self.grace, self.close_rotated_out))
        else:
            self.log.info("{name} file read again: the token is unchanged", name=self.name)

    def close_rotated_out(self) -> None:
        """A grace period is over: close the connections still on the token it was for."""
        now = self.clock.seconds()
        closed = self.policy.close_rotated_out(now)
        for policy in self.following():
            closed += policy.close_rotated_out(now)
        if closed:
            self.log.info("closed {count} connections authenticated with a token rotated out", count=closed)


class MemberTokens:
    """
    Cluster mode: a member's tokens as rotated so far (each the current
    token, the previous one and the end of its grace, the generation), kept
    across its terms.  A member builds a new lock server each term, whose
    policies start from these; SIGHUP is handled by the member (a standby
    too), which rotates these and the current term's policies; a standby's
    /metrics asks for these.  So a token rotated out stays out after a
    change of leader, and a new one stays in.
    """

    def __init__(self, auth_token: Optional[bytes], admin_token: Optional[bytes]) -> None:
        self.lock = ConnectionPolicy(auth_token=auth_token)
        self.admin: Optional[ConnectionPolicy] = None
        if admin_token is not None:
            self.admin = ConnectionPolicy(auth_token=admin_token)

    def read_again_on_sighup(
        self,
        member: service.MultiService,
        clock: IReactorTime,
        auth_token_file: Optional[str],
        admin_token_file: Optional[str],
        grace: float,
    ) -> None:
        """The token files' L{TokenFile}s, services of C{member}, following its current term's policies."""

        def term_server() -> Any:
            term = getattr(member, "term", None)
            return getattr(term, "server", None)

        def lock_policies() -> List[ConnectionPolicy]:
            server = term_server()
            return [server.policy] if server is not None else []

        def admin_policies() -> List[ConnectionPolicy]:
            server = term_server()
            admin = server.factories.get("admin") if server is not None else None
            return [admin.policy] if admin is not None and admin.policy is not server.policy else []

        if auth_token_file is not None:
            TokenFile(
                auth_token_file, self.lock, clock, grace, distinct_from=self.admin, following=lock_policies
            ).setServiceParent(member)
        if admin_token_file is not None and self.admin is not None:
            TokenFile(
                admin_token_file,
                self.admin,
                clock,
                grace,
                name="admin token",
                distinct_from=self.lock,
                following=admin_policies,
            ).setServiceParent(member)
