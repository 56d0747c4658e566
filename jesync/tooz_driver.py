"""
A U{tooz<https://docs.openstack.org/tooz/>} backend served by jesync: tooz's
distributed locks (exclusive and shared), groups with their members and
capabilities, join and leave watchers, and leader election, all held on
JESync servers as the lock table's own grants (docs/coordination.md).

Install it with C{pip install '.[tooz]'} (from a checkout), which registers this driver
for the C{jesync} scheme (the C{tooz.backends} entry point), then::

    from tooz import coordination

    coordinator = coordination.get_coordinator(
        "jesync://lock1.example.com:11400?lock_expires=30", b"worker-1")
    coordinator.start(start_heart=True)
    with coordinator.get_lock(b"volume-17"):
        ...
    coordinator.stop()

The URL is C{jesync://[HOST[:PORT]][?OPTION=VALUE[&OPTION=VALUE...]]}; the
host (port 11400 by default) is the first server, and the options are:

    servers          more servers, comma-separated (host:port, [v6]:port,
                     unix:/path), after the URL's host; each key lives on
                     one of them (see placement)
    placement        consistent (default) or php: how a key picks its server
    timeout          the lease of each group membership, in seconds (as
                     tooz's other drivers; default: none, the membership
                     ends with the coordinator's connection): a member
                     whose heartbeat() does not come within it stops being
                     one.  (It used to be connect_timeout and read_timeout
                     together: give those by name.)
    connect_timeout  seconds to wait for a connection (client default: 5)
    read_timeout     seconds a server may stay silent while it owes a reply
                     before its connection is given up (client default: 10;
                     a lock that waits owes none, so this never cuts a wait)
    lock_expires     the failsafe of each lock, in whole seconds (default 30;
                     0: never): the server releases a lock this long after
                     it was granted or last renewed, even if its holder hangs
    token_file       a file whose first line is the servers' auth token
    tls              1 or 0: connect with TLS (default: 1 if tls_ca or
                     tls_server_name is given)
    tls_ca           the CA certificates (PEM) that sign the servers' certificates
    tls_server_name  the name the certificates must carry (default: each host)
    prefix           prepended to every lock's key, group's and election's
                     name (default: none); end it with a separator, such
                     as C{nova.} (see below)
    admin            the servers' admin listener (host:port, unix:/path),
                     for break_() (force-release); without it break_() is
                     refused with tooz.NotImplemented
    admin_token_file a file whose first line is the admin listener's token
                     (default: token_file's, which an admin listener
                     without its own --admin-token-file takes)

Options not given fall back as the JESync client's do: no host and no
C{servers} means C{$JESYNC_SERVERS}, else 127.0.0.1:11400, and
C{$JESYNC_AUTH_TOKEN_FILE}, C{$JESYNC_TLS}, C{$JESYNC_TLS_CA_FILE} and
C{$JESYNC_TLS_SERVER_NAME} stand in for the auth and TLS options.

Locks: C{acquire(blocking=True)} waits for ever, C{blocking=False} tries once,
C{blocking=N} (or C{timeout=N}) waits at most N seconds (JESync counts whole
seconds, so the server is asked to wait the whole seconds left, never
longer than asked: C{blocking=0.5} tries once); C{release()} returns False
for a lock not held (or lost); C{heartbeat()} renews every lock the
coordinator holds and every membership with a lease, and returns a third of
the shorter of C{lock_expires} and C{timeout} (so
C{start(start_heart=True)} keeps them alive).  Exclusive locks are not
reentrant; C{acquire(shared=True)} takes a shared (reader) lock, held with
other shared holders, never with an exclusive one, and counted within one
lock object (each shared acquire needs its release).  C{break_()} releases
the lock from whoever holds it, through the admin listener (C{admin=}).

Groups are the server's (jesync's C{group-*} commands, through
L{jesync.client.Group}): C{create_group}, C{delete_group},
C{join_group} (the coordinator's connection is the member, its
capabilities msgpack-encoded as tooz's other drivers store them, at most
4096 bytes), C{leave_group}, C{get_members}, C{get_member_capabilities},
C{get_member_info} (capabilities, the member's C{peer} and fencing
C{token}), C{update_capabilities}, C{get_groups}.  A member is one
coordinator's connection: C{leave_group} of this coordinator's member id
held through another connection (its earlier self) boots it out through
the admin listener when C{admin=} is given, else raises C{MemberNotJoined}.
Join and leave watchers are tooz's polled ones: C{run_watchers} compares
the members with those it saw last.  Elections are
L{jesync.client.Election}s named as the group (the key
C{election:<group>}): a coordinator watching C{watch_elected_as_leader}
campaigns once per C{run_watchers} (a try, not a wait: tooz polls), holds
the leadership (renewed every third of C{lock_expires}) until
C{stand_down_group_leader}, C{unwatch_elected_as_leader} of its last
callback, C{stop()} or its connection's end, and C{get_leader} is the
holder's member id.  A leader that loses the leadership is logged, and
campaigns again at the next C{run_watchers}.  Results are computed when
asked (the C{CoordAsyncResult}s are already done).

A coordinator is one client connection per server: if its process dies or
its connection drops, the server releases every lock it held at once.
Several lock objects (and threads) of one coordinator asking for one name
queue within the coordinator, then on the server.

Lock names map to JESync keys: a name (str, or bytes in UTF-8) that is a
valid JESync key (no whitespace or control characters, at most 1024 bytes)
and does not start with C{tooz:} is its own key, so C{jesync status NAME}
shows it; any other name becomes C{tooz:b64:} and its URL-safe base64
(unpadded), or C{tooz:sha256:} and the hex SHA-256 of the name if that
would be longer than 1024 bytes.  C{prefix} goes before either.  Group
and member ids are named the same way, but never hashed (so that
C{get_groups} and C{get_members} can give the ids back) and, for a group,
never with a C{/} (a group's name has none): such an id is base64-encoded
(C{tooz:b64:...}); one too long for a key is refused (C{ToozError}).
C{get_groups} and C{get_members} give back only names these rules give
(a group's after the prefix): a name made by hand that no id maps to (such
as C{tooz:b64:} and base64 that is not the unpadded URL-safe one) is no
tooz id, so two names never stand for one id.

C{get_groups} lists the groups whose names start with the prefix, and
nothing on the server says where a prefix ends: with C{prefix=app},
the group C{g} of C{prefix=app1:} (named C{app1:g}) looks like C{app}'s
group C{1:g}.  The prefix is
used as given (so that keys never change), and one that ends with a
letter or digit is warned about: end it with a separator (C{app.}), and
give no deployment a prefix that starts with another's (C{app.} and
C{app.x.}).

Only this module imports tooz; C{import jesync} and its clients never do.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional, TypeVar, Union

import tooz
from tooz import coordination, locking, utils

from jesync.client import (
    Client,
    ClientError,
    ConnectionLost,
    Election,
    Group,
    GroupAlreadyExists,
    GroupError,
    GroupNotCreated,
    GroupNotEmpty,
    KeyBusy,
    Leadership,
    LockTimeout,
    MemberAlreadyExists,
    MemberNotJoined,
)
from jesync.client import Lock as ClientLock
from jesync.client.address import DEFAULT_PORT
from jesync.client.config import ConnectKeywords
from jesync.wire import MEMBER_SEPARATOR, key_problem, member_key

LOG = logging.getLogger(__name__)

__all__ = ["JESyncDriver", "JESyncLock", "lock_key"]

#: The default failsafe of a lock, in seconds.
DEFAULT_LOCK_EXPIRES = 30
#: heartbeat() asks to be called again after this fraction of lock_expires.
HEARTBEATS_PER_EXPIRY = 3
#: What heartbeat() returns when locks never expire (it has nothing to renew).
IDLE_HEARTBEAT = 10.0
#: The longest key a jesync server takes by default (its --max-key-length).
MAX_KEY_LENGTH = 1024
#: Names that are not usable as keys as they are are encoded behind this.
ENCODED_MARKER = "tooz:"

# The URL's options, and the Client parameter each one becomes.
_CLIENT_PARAMETERS = {
    "token_file": "auth_token_file",
    "tls": "tls",
    "tls_ca": "tls_ca_file",
    "tls_server_name": "tls_server_name",
}
_OPTIONS = frozenset(
    {
        "servers",
        "placement",
        "timeout",
        "connect_timeout",
        "read_timeout",
        "lock_expires",
        "prefix",
        "admin",
        "admin_token_file",
    }
    | set(_CLIENT_PARAMETERS)
)
#: The prefix of an encoded group or member id (see the module's documentation).
ENCODED_ID = ENCODED_MARKER + "b64:"

_YES = frozenset({"1", "yes", "true", "on"})
_NO = frozenset({"0", "no", "false", "off"})

R = TypeVar("R")


def lock_key(name: Union[str, bytes], prefix: str = "") -> str:
    """
    The JESync key of the tooz lock C{name} (see the module's documentation):
    the name itself when it is a usable key, else an encoding of it that no
    other name shares.
    """
    text: Optional[str]
    if isinstance(name, bytes):
        raw = name
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    elif isinstance(name, str):
        text = name
        try:
            raw = name.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            raw = name.encode("utf-8", "surrogatepass")
            text = None
    else:
        raise TypeError(f"a lock name is bytes or str, not {type(name).__name__}")
    if text is not None and not text.startswith(ENCODED_MARKER):
        key = prefix + text
        if key_problem(key, MAX_KEY_LENGTH) is None:
            return key
    key = prefix + ENCODED_MARKER + "b64:" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
    if len(key.encode("utf-8")) <= MAX_KEY_LENGTH:
        return key
    return prefix + ENCODED_MARKER + "sha256:" + hashlib.sha256(raw).hexdigest()


def id_name(identifier: Union[str, bytes], prefix: str = "", group: bool = False) -> str:
    """
    The name of a tooz group or member id on the server (a group's: no
    C{/}): the id itself when it is a usable key that does not start with
    C{tooz:}, else C{tooz:b64:} and its URL-safe base64; C{prefix} first.
    """
    raw = _id_bytes(identifier)
    try:
        text: Optional[str] = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not text.startswith(ENCODED_MARKER) and not (group and MEMBER_SEPARATOR in text):
        if key_problem(prefix + text, MAX_KEY_LENGTH) is None:
            return prefix + text
    return prefix + ENCODED_ID + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def id_of(name: str, prefix: str = "", group: bool = False) -> Optional[bytes]:
    """
    The tooz id (bytes) whose server name is C{name} (L{id_name}), or None
    if no id has that name: another prefix, or a name made by hand that
    L{id_name} never gives (base64 that is not the canonical, unpadded
    URL-safe one; C{tooz:} and an id that needs no encoding).  So two names
    never give one id, and C{get_members} never folds two members into one.
    """
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    if rest.startswith(ENCODED_ID):
        encoded = rest[len(ENCODED_ID) :]
        try:
            # validate=True: refuse characters outside the alphabet instead of dropping them.
            identifier = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
        except ValueError:
            return None
    else:
        try:
            identifier = rest.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return None
    return identifier if id_name(identifier, prefix, group) == name else None


# jesync's group refusals, and tooz's exception for each (given the group and member ids).
_GROUP_ERRORS: tuple[tuple[type[ClientError], Callable[[bytes, bytes], Exception]], ...] = (
    (GroupNotCreated, lambda group, member: coordination.GroupNotCreated(group)),
    (GroupAlreadyExists, lambda group, member: coordination.GroupAlreadyExist(group)),
    (GroupNotEmpty, lambda group, member: coordination.GroupNotEmpty(group)),
    (MemberAlreadyExists, lambda group, member: coordination.MemberAlreadyExist(group, member)),
    (MemberNotJoined, lambda group, member: coordination.MemberNotJoined(group, member)),
)


def _group_translated(call: Callable[[], R], group_id: bytes, member_id: bytes) -> R:
    """Run C{call}, raising jesync's group refusals as tooz's (and every other client error as L{_translated})."""

    def translated() -> R:
        try:
            return call()
        except GroupError as error:
            for jesync_error, tooz_error in _GROUP_ERRORS:
                if isinstance(error, jesync_error):
                    raise tooz_error(group_id, member_id) from error
            raise

    return _translated(translated)


def _done(call: Callable[[], R]) -> coordination.CoordAsyncResult[R]:
    """tooz's asynchronous result of C{call}, already computed: its value, or the exception it raised."""
    future: Future[R] = Future()
    try:
        future.set_result(call())
    except Exception as error:
        future.set_exception(error)
    return coordination.CoordinatorResult(future)


def _translated(call: Callable[[], R]) -> R:
    """Run C{call}, raising jesync's client errors as tooz's."""
    try:
        return call()
    except KeyBusy:
        # This connection has a request for the key outstanding (left by an
        # interrupted acquire): acquire() answers False.
        raise
    except ConnectionLost as error:
        utils.raise_with_cause(coordination.ToozConnectionError, str(error), cause=error)
    except (ClientError, ValueError) as error:
        utils.raise_with_cause(tooz.ToozError, str(error), cause=error)
    raise AssertionError("unreachable")


class JESyncLock(locking.Lock):
    """
    A tooz lock on one JESync key, held through its coordinator's client:
    exclusive and not reentrant, or shared and counted (each shared acquire
    of a held shared lock counts, and needs its release); any thread may
    release it.
    """

    def __init__(self, coordinator: JESyncDriver, name: Union[str, bytes]) -> None:
        super().__init__(name)  # type: ignore[arg-type]  # tooz takes str names too
        self._coordinator = coordinator
        self.key = lock_key(name, coordinator.prefix)
        # The grant this object holds (None when not held): the client's lock
        # handle, and the token of the coordinator's reservation of the key.
        self._grant: Optional[tuple[ClientLock, object]] = None
        # How many shared acquires the shared grant stands for (0: none, or exclusive).
        self._shared_count = 0
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} (key {self.key!r})>"

    @property
    def _handle(self) -> Optional[ClientLock]:
        grant = self._grant
        return None if grant is None else grant[0]

    @property
    def acquired(self) -> bool:
        """Whether this object holds the lock, as far as the client knows."""
        handle = self._handle
        return handle is not None and handle.held

    def acquire(
        self,
        blocking: Union[bool, float] = True,
        shared: bool = False,
        timeout: Optional[float] = None,
    ) -> bool:
        """
        Take the lock: C{blocking=True} waits for it (for ever, or at most
        C{timeout} seconds), C{blocking=False} tries once, a number waits at
        most that many seconds.  True if it was taken, False if not.
        """
        if shared:
            with self._mutex:
                if self._shared_count and self._handle is not None and self._handle.held:
                    self._shared_count += 1
                    return True
        blocking, timeout = utils.convert_blocking(blocking, timeout)
        deadline = None if not blocking or timeout is None else time.monotonic() + max(0.0, timeout)
        coordinator = self._coordinator
        owner = coordinator._reserve(self.key, blocking, deadline)
        if owner is None:
            return False
        try:
            handle = _translated(lambda: coordinator._client_lock(self.key, _server_wait(blocking, deadline), shared))
        except (LockTimeout, KeyBusy):
            coordinator._unreserve(self.key, owner)
            return False
        except BaseException:
            coordinator._unreserve(self.key, owner)
            raise
        with self._mutex:
            self._grant = (handle, owner)
            self._shared_count = 1 if shared else 0
        coordinator._held(self, handle, owner)
        return True

    def release(self) -> bool:
        """Give the lock back: True if this object held it until now, else False."""
        with self._mutex:
            if self._shared_count > 1 and self._handle is not None and self._handle.held:
                self._shared_count -= 1
                return True
            grant, self._grant = self._grant, None
            self._shared_count = 0
        if grant is None:
            return False
        handle, owner = grant
        try:
            return _translated(handle.release)
        finally:
            self._coordinator._forget(self, handle, owner)

    def heartbeat(self) -> bool:
        """Renew the lock's failsafe expiry: True if it is held (and renewed), else False."""
        handle = self._handle
        if handle is None or not handle.held:
            return False
        try:
            _translated(handle.renew)
        except tooz.ToozError:
            if handle.released:  # released meanwhile, by another thread
                return False
            LOG.warning("Unable to renew the jesync lock %r", self, exc_info=True)
            return False
        return True

    def break_(self) -> bool:
        """
        Release the lock from whoever holds it (the admin listener's
        C{force-release}, given by the URL's C{admin=}): True if anyone held
        it.  Its holders are not told (their C{release()} answers False).
        Without C{admin=}, C{tooz.NotImplemented}.
        """
        return self._coordinator._force_release(self.key) > 0

    def is_still_owner(self) -> bool:
        """Whether this object still holds the lock (False once it is lost or released)."""
        return self.acquired


def _server_wait(blocking: bool, deadline: Optional[float]) -> Optional[float]:
    """
    The wait to ask the server for: None (for ever), or the whole seconds
    left before C{deadline} (JESync counts whole seconds, and tooz's timeout
    is an upper bound), 0 for a single try.
    """
    if not blocking:
        return 0
    if deadline is None:
        return None
    return float(max(0, math.floor(deadline - time.monotonic())))


class JESyncDriver(coordination.CoordinationDriverCachedRunWatchers):
    """
    tooz's coordinator over JESync servers: exclusive and shared locks with
    failsafe expiry, renewed by L{heartbeat}; groups, members and their
    watchers; leader election.  See this module's documentation for the URL
    and its options.
    """

    CHARACTERISTICS = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        # Each key is decided by the one server it lives on, in the order
        # the requests reach it.
        coordination.Characteristics.LINEARIZABLE,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        super().__init__(member_id, parsed_url, options)
        self._options = utils.collapse(options)
        unknown = sorted(set(self._options) - _OPTIONS)
        if unknown:
            LOG.warning("jesync tooz driver: ignoring unknown options %s", ", ".join(unknown))
        self._client_arguments = self._parse(parsed_url, self._options)
        self._admin_arguments = self._parse_admin(self._client_arguments, self._options)
        self.lock_expires = _seconds(self._options, "lock_expires", DEFAULT_LOCK_EXPIRES, allow_zero=True)
        #: The lease of each membership, in seconds (0: none; see the module's documentation).
        self.lease = _seconds(self._options, "timeout", 0)
        self._member_name = id_name(self._member_id)
        self.prefix = str(self._options.get("prefix", ""))
        if self.prefix and key_problem(self.prefix, MAX_KEY_LENGTH) is not None:
            raise ValueError(f"prefix: {key_problem(self.prefix, MAX_KEY_LENGTH)}")
        if self.prefix[-1:].isalnum():
            # Kept as given (every key and name stays the same), but said.
            LOG.warning(
                "jesync tooz driver: prefix %r ends with no separator: get_groups() also lists the groups of "
                "prefixes that start with it (the group g of prefix %r looks like its group '1:g'); end it with "
                "one, such as '.' or ':'",
                self.prefix,
                self.prefix + "1:",
            )
        self._client: Optional[Client] = None
        # Keys this coordinator holds or is asking for, each with the token of
        # the acquire() that reserved it: one connection holds a key at most
        # once, so other lock objects (and threads) of this coordinator wait
        # here for it.
        self._condition = threading.Condition()
        self._reserved: dict[str, object] = {}
        self._acquired: dict[JESyncLock, ClientLock] = {}
        self._admin: Optional[Client] = None
        # The elections this coordinator leads, by group id.
        self._leaderships: dict[bytes, Leadership[ClientLock]] = {}

    @staticmethod
    def _parse(parsed_url: Any, options: dict[str, Any]) -> dict[str, Any]:
        """The L{Client} arguments the URL asks for; raise ValueError for bad ones."""
        servers = []
        if parsed_url.hostname:
            host = parsed_url.hostname
            if ":" in host:
                host = f"[{host}]"
            servers.append(f"{host}:{parsed_url.port or DEFAULT_PORT}")
        servers.extend(part.strip() for part in str(options.get("servers", "")).split(",") if part.strip())
        arguments: dict[str, Any] = {"servers": servers or None}
        if "placement" in options:
            arguments["placement"] = str(options["placement"])
        for name in ("connect_timeout", "read_timeout"):
            if name in options:
                arguments[name] = _seconds(options, name)
        # the client's own parameters and its connection keywords (jesync.client.config)
        accepted = set(inspect.signature(Client).parameters) | set(ConnectKeywords.__annotations__)
        for option, parameter in _CLIENT_PARAMETERS.items():
            if option not in options:
                continue
            if parameter not in accepted:
                raise tooz.ToozError(f"the {option} option needs a newer jesync client (with {parameter})")
            value = options[option]
            arguments[parameter] = _flag(value, option) if option == "tls" else str(value)
        return arguments

    @staticmethod
    def _parse_admin(client_arguments: dict[str, Any], options: dict[str, Any]) -> Optional[dict[str, Any]]:
        """The admin listener's L{Client} arguments (those of the servers, but its address and token), or None."""
        if "admin" not in options:
            if "admin_token_file" in options:
                raise ValueError("admin_token_file is the admin listener's: give admin=HOST:PORT too")
            return None
        arguments = dict(client_arguments, servers=[str(options["admin"])])
        arguments.pop("placement", None)
        if "admin_token_file" in options:
            arguments["auth_token_file"] = str(options["admin_token_file"])
        return arguments

    # -- the connection ------------------------------------------------------

    def _start(self) -> None:
        client = _translated(lambda: Client(**self._client_arguments))
        try:
            # Connect now (to every server), so a coordinator that cannot
            # reach its servers fails to start, as tooz's other drivers do.
            _translated(client.ping)
        except BaseException:
            client.close()
            raise
        self._client = client

    def _stop(self) -> None:
        # Every step is tried, so that the client is closed whatever fails
        # before it (the connection dropped: the server ends what it held).
        for group_id in list(self._leaderships):
            try:
                self.stand_down_group_leader(group_id)
            except tooz.ToozError:
                LOG.warning("Unable to resign the leadership of group %r", group_id, exc_info=True)
        for lock in list(self._acquired):
            try:
                lock.release()
            except tooz.ToozError:
                LOG.warning("Unable to release the jesync lock %r", lock, exc_info=True)
        if self._client is not None:
            # Also ends the waits in progress (ToozConnectionError).
            self._client.close()
            self._client = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def _started_client(self) -> Client:
        client = self._client
        if client is None:
            raise tooz.ToozError("the coordinator is not started")
        return client

    def _client_lock(self, key: str, wait: Optional[float], shared: bool = False) -> ClientLock:
        expires = self.lock_expires or None
        return self._started_client().lock(key, wait=wait, expires=expires, shared=shared)

    def _admin_client(self) -> Client:
        """The client of the admin listener (opened when first needed); tooz.NotImplemented without C{admin=}."""
        if self._admin_arguments is None:
            raise tooz.NotImplemented(
                "break_() needs the servers' admin listener: give the URL admin=HOST:PORT (and admin_token_file=PATH)"
            )
        with self._condition:
            if self._admin is None:
                self._admin = _translated(lambda: Client(**self._admin_arguments))  # type: ignore[arg-type]
            return self._admin

    def _force_release(self, key: str) -> int:
        """Release C{key} from every holder, through the admin listener; how many held it."""
        admin = self._admin_client()
        return _translated(lambda: admin.force_release(key))

    # -- which lock object holds which key -------------------------------------

    def _reserve(self, key: str, blocking: bool, deadline: Optional[float]) -> Optional[object]:
        """
        Wait until no other lock object of this coordinator holds or asks for
        C{key}, and reserve it; return the reservation's token, or None if
        C{blocking} is False or C{deadline} passes first.
        """
        with self._condition:
            while key in self._reserved:
                if not blocking:
                    return None
                if deadline is None:
                    self._condition.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._condition.wait(left)
            owner = object()
            self._reserved[key] = owner
            return owner

    def _unreserve(self, key: str, owner: object) -> None:
        with self._condition:
            if self._reserved.get(key) is owner:
                del self._reserved[key]
                self._condition.notify_all()

    def _held(self, lock: JESyncLock, handle: ClientLock, owner: object) -> None:
        with self._condition:
            self._acquired[lock] = handle
        # Once the grant is lost (expired, connection dropped), the key is free
        # for the coordinator's other lock objects.
        handle.add_lost_callback(lambda _: self._forget(lock, handle, owner))

    def _forget(self, lock: JESyncLock, handle: ClientLock, owner: object) -> None:
        """C{lock}'s grant C{handle} is released or lost: free its key."""
        with self._condition:
            if self._acquired.get(lock) is handle:
                del self._acquired[lock]
        self._unreserve(lock.key, owner)

    # -- tooz's API --------------------------------------------------------------

    def get_lock(self, name: Union[str, bytes]) -> JESyncLock:
        return JESyncLock(self, name)

    def heartbeat(self) -> float:
        """
        Renew every lock this coordinator holds and every membership with a
        lease; return the seconds until the next heartbeat is due.  A
        membership found lapsed is logged once and forgotten (a later
        heartbeat does not renew it, nor say so again).
        """
        with self._condition:
            held = list(self._acquired)
        for lock in held:
            lock.heartbeat()
        if self.lease:
            for group_id in list(self._joined_groups):
                try:
                    if not _translated(lambda: self._group(group_id).heartbeat(self._member_name, self.lease)):
                        # Said once: the coordinator is no member any more (join_group again to be one).
                        self._joined_groups.discard(group_id)
                        LOG.warning(
                            "jesync: member %r of group %r had left (its lease lapsed)", self._member_id, group_id
                        )
                except tooz.ToozError:
                    LOG.warning("Unable to renew the membership of group %r", group_id, exc_info=True)
        periods = [period for period in (self.lock_expires, self.lease) if period]
        if not periods:
            return IDLE_HEARTBEAT
        return min(periods) / HEARTBEATS_PER_EXPIRY

    # -- groups --------------------------------------------------------------

    def _group(self, group_id: Union[str, bytes]) -> Group:
        return self._started_client().group(id_name(group_id, self.prefix, group=True))

    def _on_group(
        self, group_id: Union[str, bytes], call: Callable[[Group], R], member_id: Optional[bytes] = None
    ) -> coordination.CoordAsyncResult[R]:
        """tooz's result of C{call} on group C{group_id}, jesync's refusals raised as tooz's."""
        raw = _id_bytes(group_id)
        member = self._member_id if member_id is None else member_id
        return _done(lambda: _group_translated(lambda: call(self._group(group_id)), raw, member))

    def create_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        return self._on_group(group_id, lambda group: group.create())

    def delete_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        return self._on_group(group_id, lambda group: group.delete())

    def get_groups(self) -> coordination.CoordAsyncResult[list[bytes]]:
        def groups() -> list[bytes]:
            names = _translated(self._started_client().groups)
            return [group for group in (id_of(name, self.prefix, group=True) for name in names) if group is not None]

        return _done(groups)

    def join_group(
        self, group_id: bytes, capabilities: Optional[coordination.Capabilities] = None
    ) -> coordination.CoordAsyncResult[None]:
        def join(group: Group) -> None:
            group.join(self._member_name, utils.dumps(capabilities), self.lease)
            self._joined_groups.add(_id_bytes(group_id))

        return self._on_group(group_id, join)

    def leave_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def leave(group: Group) -> None:
            try:
                group.leave(self._member_name)
            except MemberNotJoined:
                # Not this connection's: the group may be gone, or this
                # member id held through another connection (booted out
                # through the admin listener, if given).
                if self._member_name not in {member.member for member in group.members()}:
                    raise
                if self._admin_arguments is None:
                    raise
                self._force_release(member_key(group.name, self._member_name))
            self._joined_groups.discard(_id_bytes(group_id))

        return self._on_group(group_id, leave)

    def _members(self, group: Group) -> dict[bytes, Any]:
        """The members of C{group}: each one's L{jesync.client.Member}, by member id."""
        found = {}
        for member in group.members():
            member_id = id_of(member.member)
            if member_id is not None:
                found[member_id] = member
        return found

    def get_members(self, group_id: bytes) -> coordination.CoordAsyncResult[set[bytes]]:
        return self._on_group(group_id, lambda group: set(self._members(group)))

    def get_member_capabilities(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordAsyncResult[Optional[coordination.Capabilities]]:
        return self._on_group(group_id, lambda group: self._member_info(group, member_id)["capabilities"], member_id)

    def get_members_with_capabilities(
        self, group_id: bytes
    ) -> coordination.CoordAsyncResult[dict[bytes, Optional[coordination.Capabilities]]]:
        def members(group: Group) -> dict[bytes, Any]:
            return {member_id: _capabilities(member) for member_id, member in self._members(group).items()}

        return self._on_group(group_id, members)

    def get_member_info(self, group_id: bytes, member_id: bytes) -> coordination.CoordAsyncResult[dict[str, Any]]:
        """A member's C{capabilities}, and its connection's C{peer} and its fencing C{token}."""
        return self._on_group(group_id, lambda group: self._member_info(group, member_id), member_id)

    def _member_info(self, group: Group, member_id: bytes) -> dict[str, Any]:
        member = self._members(group).get(_id_bytes(member_id))
        if member is None:
            raise MemberNotJoined("not a member", group.name, str(member_id))
        return {"capabilities": _capabilities(member), "peer": member.peer, "token": member.token}

    def update_capabilities(
        self, group_id: bytes, capabilities: coordination.Capabilities
    ) -> coordination.CoordAsyncResult[None]:
        def update(group: Group) -> None:
            try:
                group.update(self._member_name, utils.dumps(capabilities))
            except MemberNotJoined:
                group.members()  # GroupNotCreated if that is why
                raise

        return self._on_group(group_id, update)

    # -- elections -----------------------------------------------------------

    def _election(self, group_id: Union[str, bytes]) -> Election:
        return Election(self._started_client(), id_name(group_id, self.prefix, group=True))

    def get_leader(self, group_id: bytes) -> coordination.CoordAsyncResult[Optional[bytes]]:  # type: ignore[override]
        """The member id of the election's leader; None if it has none (as tooz's tests expect)."""
        def leader() -> Optional[bytes]:
            found = _translated(self._election(group_id).leader)
            return None if found is None else found.value

        return _done(leader)

    def run_elect_coordinator(self) -> None:
        """Campaign once (a try) in each election watched and not led; tell the callbacks of each one won."""
        for group_id, hooks in list(self._hooks_elected_leader.items()):
            held = self._leaderships.get(group_id)
            if held is not None:
                if held.held:
                    continue
                LOG.warning(
                    "jesync: %r lost the leadership of group %r: %s", self._member_id, group_id, held.lost_reason
                )
                del self._leaderships[group_id]
            election = self._election(group_id)
            try:
                leadership = _translated(
                    lambda: election.campaign(self._member_id, expires=self.lock_expires or None, wait=0)
                )
            except (LockTimeout, KeyBusy):
                continue
            self._leaderships[group_id] = leadership
            hooks.run(coordination.LeaderElected(group_id, self._member_id))

    def run_watchers(self, timeout: Optional[float] = None) -> list[Any]:
        result = super().run_watchers(timeout=timeout)
        self.run_elect_coordinator()
        return result

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        """Resign the leadership of group C{group_id}'s election: True if this coordinator led it until now."""
        leadership = self._leaderships.pop(group_id, None)
        if leadership is None:
            return False
        return bool(_translated(leadership.resign))

    def unwatch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        """As tooz's; when the last callback goes, the leadership (if held) is resigned."""
        super().unwatch_elected_as_leader(group_id, callback)
        if group_id not in self._hooks_elected_leader:
            self.stand_down_group_leader(group_id)


def _id_bytes(identifier: Union[str, bytes]) -> bytes:
    """
    A tooz id as bytes (tooz accepts str ids too, and this driver gives bytes
    back): a str's UTF-8, its lone surrogates kept (as L{lock_key} keeps them)
    rather than refused with a UnicodeEncodeError that is no tooz error.
    """
    if isinstance(identifier, str):
        return identifier.encode("utf-8", "surrogatepass")
    return bytes(identifier)


def _capabilities(member: Any) -> Any:
    """A member's capabilities, as tooz's other drivers store them (msgpack); None if it has none."""
    if member.capabilities is None:
        return None
    try:
        return utils.loads(member.capabilities)
    except Exception:  # joined by hand, with a value that is not msgpack: its bytes
        return member.capabilities


def _seconds(options: dict[str, Any], name: str, default: Optional[float] = None, allow_zero: bool = False) -> Any:
    """Option C{name}, a number of seconds (C{default} if not given)."""
    if name not in options:
        return default
    value = options[name]
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{name} must be a number of seconds{', 0 or more' if allow_zero else ' above 0'}, not {value!r}")
    return int(seconds) if seconds.is_integer() else seconds


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in _YES:
        return True
    if lowered in _NO:
        return False
    raise ValueError(f"{name} must be 1 or 0 (yes or no, true or false, on or off), not {value!r}")
