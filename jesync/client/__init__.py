"""
Clients of JESync lock servers (jesync, or any JESync-compatible one).

 - L{Client}: blocking, for ordinary Python code.
 - L{AsyncClient}: asyncio.
 - L{TwistedClient}: Twisted, returning Deferreds.
 - L{Election}, L{AsyncElection}, L{TwistedElection}: leader elections
   over each of those (L{jesync.client.election}).
 - L{Group}, L{AsyncGroup}, L{TwistedGroup} (C{client.group(name)}):
   groups and their members over each of those (L{jesync.client.group}).
 - L{ELockClient}: the elock protocol, blocking: one session whose locks
   survive a dropped connection and a cluster failover
   (L{jesync.client.elock}).

The first three take the same arguments and offer the same operations: C{lock}
(returning a lock handle with C{release}, C{renew}, automatic renewal, loss
notification and the grant's fencing C{token}; exclusive or C{shared}, with
a C{value} or not), C{lock_many} (several keys,
all or nothing, as one handle with a C{tokens} dict), C{status}, C{holders},
C{watch} (a key's or a prefix's L{WatchEvent}s: an iterator, an async
iterator, a callback), C{listing}
and C{ping}, over one or several servers; a server may be the members of
one jesync cluster (C{"a:11400|b:11400|c:11400"}), reached through
whichever member answers (L{jesync.client.cluster}).  A timed-out wait raises
L{LockTimeout}; every other failed request
raises a L{ClientError} (bad arguments raise ValueError or TypeError before
anything is sent).

Given no servers, they use C{$JESYNC_SERVERS} (else 127.0.0.1:11400), and
they take the auth token file and TLS settings from C{$JESYNC_AUTH_TOKEN_FILE},
C{$JESYNC_TLS}, C{$JESYNC_TLS_CA_FILE} and C{$JESYNC_TLS_SERVER_NAME} when
not given them, as the C{jesync} command does (L{jesync.client.config}).
Those settings are one value, L{jesync.client.config.ConnectOptions}, which
every client (L{ELockClient} too) also takes whole, as C{options=}.
"""

from typing import TYPE_CHECKING, Any

from jesync.client.address import DEFAULT_PORT, DEFAULT_SERVER, ClusterAddress, TCPAddress, UNIXAddress, parse_address
from jesync.client.aio import AsyncClient, AsyncLock, AsyncWatch
from jesync.client.blocking import Client, Lock, Watch
from jesync.client.election import AsyncElection, AsyncObservation, Election, Leader, Leadership, Observation
from jesync.client.elock import ELockClient, ELockHandle
from jesync.client.group import (
    AsyncGroup,
    Group,
    GroupAlreadyExists,
    GroupError,
    GroupNotCreated,
    GroupNotEmpty,
    Member,
    MemberAlreadyExists,
    MemberNotJoined,
    MembershipLost,
)
from jesync.client.errors import (
    AccessRefused,
    AuthFailed,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    KeyBusy,
    LockLost,
    LockManyTimeout,
    LockTimeout,
    ServerError,
    WatchFellBehind,
)
from jesync.client.placement import HashRing, PHPPlacement
from jesync.client.wire import Holder, WatchEvent
from jesync.wire import KeyStatus

if TYPE_CHECKING:
    from jesync.client.txclient import TwistedClient, TwistedElection, TwistedGroup, TwistedLock, TwistedWatch


def __getattr__(name: str) -> Any:
    """
    The Twisted client, imported when first asked for (PEP 562): importing
    C{jesync.client}, the blocking or the asyncio client imports no Twisted
    module at all.
    """
    if name in ("TwistedClient", "TwistedElection", "TwistedGroup", "TwistedLock", "TwistedWatch"):
        from jesync.client import txclient

        value = getattr(txclient, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Holder",
    "DEFAULT_PORT",
    "DEFAULT_SERVER",
    "AsyncClient",
    "AsyncElection",
    "AsyncGroup",
    "AsyncObservation",
    "AsyncLock",
    "AsyncWatch",
    "AccessRefused",
    "AuthFailed",
    "Client",
    "ClientError",
    "ClusterAddress",
    "ELockClient",
    "Election",
    "ELockHandle",
    "Group",
    "GroupAlreadyExists",
    "GroupError",
    "GroupNotCreated",
    "GroupNotEmpty",
    "Member",
    "MemberAlreadyExists",
    "MemberNotJoined",
    "MembershipLost",
    "ConnectFailed",
    "ConnectionLost",
    "HashRing",
    "KeyBusy",
    "KeyStatus",
    "Lock",
    "Leader",
    "Leadership",
    "LockLost",
    "LockManyTimeout",
    "LockTimeout",
    "Observation",
    "PHPPlacement",
    "ServerError",
    "TCPAddress",
    "TwistedClient",
    "TwistedElection",
    "TwistedGroup",
    "TwistedLock",
    "TwistedWatch",
    "UNIXAddress",
    "Watch",
    "WatchEvent",
    "WatchFellBehind",
    "parse_address",
]
