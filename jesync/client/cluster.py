"""
Which member of a server to connect to, and when to give up: the one rule
the three clients share for reaching a jesync cluster (a L{ClusterAddress},
C{a:11400|b:11400|c:11400}) and, trivially, a server of one member.

In a cluster only the leader listens; standbys refuse connections, and a
paused leader's socket still accepts them (the kernel's backlog) but never
answers.  So a member counts as answering only once it has answered a
request on the connection (the clients wait for the reply to their
C{fencing on} within the connect timeout before they hand the connection to
anyone), and a refused connection, a connect timeout and a reply timeout all
send the client on to the next member.

The order: first the member that answered last (L{Members.answered}: the
choice is sticky, so a client does not knock on every standby before each
connection), then the others in the order given.  One pass over all the
members is one connection attempt: only after every member has failed does
the client pause and start again, as L{jesync.client.config.Backoff} says
(C{connect_retries}, C{retry_backoff}, within the call's C{wait}).  The
first pass is always made in full, even for C{wait=0}: trying another member
is not retrying.

A failure that trying again cannot mend (a certificate that does not check
out, an unreadable token file: C{ConnectFailed.retryable} false) ends it at
once, without trying the other members; so does the server refusing the
client the connection, which is not a L{ConnectFailed} at all but an
L{jesync.client.errors.AccessRefused}: protected mode (the client is not on
the server's host), or a refused or missing auth token (L{jesync.client.errors.AuthFailed}, an
C{AccessRefused}).  Every member would say the same.

No I/O and no clock of its own: the clients say what time it is.
"""

from __future__ import annotations

from typing import Optional

from jesync.client.address import Address, ClusterAddress, Member
from jesync.client.config import Backoff
from jesync.client.errors import ConnectFailed


class Members:
    """
    The members of one server (one, unless it is a L{ClusterAddress}), and
    which of them answered last.  One per server per client, for the
    client's lifetime.
    """

    def __init__(self, address: Address) -> None:
        self.address = address
        self.members: tuple[Member, ...] = address.members if isinstance(address, ClusterAddress) else (address,)
        self._last = 0

    @property
    def is_cluster(self) -> bool:
        """Whether the server is a cluster, whose members must answer before a connection is used."""
        return isinstance(self.address, ClusterAddress)

    def order(self) -> list[Member]:
        """The members in the order to try them: the one that answered last, then the others as given."""
        last = self.members[self._last]
        return [last] + [member for member in self.members if member != last]

    def answered(self, member: Member) -> None:
        """A connection to C{member} answered: try it first from now on."""
        self._last = self.members.index(member)

    def attempts(self, backoff: Backoff) -> ConnectAttempts:
        """The connection attempts of one call, paused between passes as C{backoff} says."""
        return ConnectAttempts(self, backoff)


class ConnectAttempts:
    """
    The attempts of one call that needs a connection: connect to L{member};
    on a L{ConnectFailed}, ask L{failed} what next.
    """

    def __init__(self, members: Members, backoff: Backoff) -> None:
        self._members = members
        self._backoff = backoff
        self._order = members.order()
        self._next = 0
        self._failures: list[ConnectFailed] = []
        #: the member to connect to now
        self.member: Member = self._order[0]

    def failed(self, error: ConnectFailed, now: float) -> Optional[float]:
        """
        Connecting to L{member} failed with C{error} at C{now}: the pause
        before connecting to the (new) L{member}, or None to give up and
        raise L{error}.
        """
        self._failures.append(error)
        if not error.retryable:
            return None
        self._next += 1
        if self._next < len(self._order):
            self.member = self._order[self._next]
            return 0.0
        pause = self._backoff.next_pause(now)
        if pause is None:
            return None
        self._order = self._members.order()
        self._next = 0
        self._failures.clear()
        self.member = self._order[0]
        return pause

    def error(self) -> ConnectFailed:
        """
        What to raise on giving up: the failure itself for a server of one
        member (or one that cannot be mended); for a cluster, one naming
        every member tried in the last pass and why it did not answer.
        """
        last = self._failures[-1]
        if not self._members.is_cluster or not last.retryable:
            return last
        reasons = "; ".join(f"{failure.address}: {failure.reason}" for failure in self._failures)
        return ConnectFailed(str(self._members.address), f"no member of the cluster answered ({reasons})")
