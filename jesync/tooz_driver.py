"""
A U{tooz<https://docs.openstack.org/tooz/>} backend served by jesync: tooz's
distributed locks, held on JESync servers.

Install it with C{pip install 'jesync[tooz]'}, which registers this driver
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
    timeout          seconds for both connect_timeout and read_timeout
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
    prefix           prepended to every lock's key (default: none)

Options not given fall back as the JESync client's do: no host and no
C{servers} means C{$JESYNC_SERVERS}, else 127.0.0.1:11400, and
C{$JESYNC_AUTH_TOKEN_FILE}, C{$JESYNC_TLS}, C{$JESYNC_TLS_CA_FILE} and
C{$JESYNC_TLS_SERVER_NAME} stand in for the auth and TLS options.

Locks: C{acquire(blocking=True)} waits for ever, C{blocking=False} tries once,
C{blocking=N} (or C{timeout=N}) waits at most N seconds (JESync counts whole
seconds, so the server is asked to wait the whole seconds left, never
longer than asked: C{blocking=0.5} tries once); C{release()} returns False
for a lock not held (or lost); C{heartbeat()} renews every lock the
coordinator holds and returns a third of C{lock_expires} (so
C{start(start_heart=True)} keeps held locks alive).  Locks are exclusive and
not reentrant: shared locks, C{break_()}, groups, members, watchers and
leader election raise C{tooz.NotImplemented}.

A coordinator is one client connection per server: if its process dies or
its connection drops, the server releases every lock it held at once.
Several lock objects (and threads) of one coordinator asking for one name
queue within the coordinator, then on the server.

Lock names map to JESync keys: a name (str, or bytes in UTF-8) that is a
valid JESync key (no whitespace or control characters, at most 1024 bytes)
and does not start with C{tooz:} is its own key, so C{jesync status NAME}
shows it; any other name becomes C{tooz:b64:} and its URL-safe base64
(unpadded), or C{tooz:sha256:} and the hex SHA-256 of the name if that
would be longer than 1024 bytes.  C{prefix} goes before either.

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
from typing import Any, Callable, Optional, TypeVar, Union

import tooz
from tooz import coordination, locking, utils

from jesync.client import (
    Client,
    ClientError,
    ConnectionLost,
    KeyBusy,
    LockLost,
    LockTimeout,
    ServerError,
)
from jesync.client import Lock as ClientLock
from jesync.client.address import DEFAULT_PORT
from jesync.client.config import ConnectKeywords
from jesync.wire import key_problem

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
    {"servers", "placement", "timeout", "connect_timeout", "read_timeout", "lock_expires", "prefix"}
    | set(_CLIENT_PARAMETERS)
)

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
    A tooz lock on one JESync key, held through its coordinator's client.
    Exclusive, not reentrant; any thread may release it.
    """

    def __init__(self, coordinator: JESyncDriver, name: Union[str, bytes]) -> None:
        super().__init__(name)  # type: ignore[arg-type]  # tooz takes str names too
        self._coordinator = coordinator
        self.key = lock_key(name, coordinator.prefix)
        # The grant this object holds (None when not held): the client's lock
        # handle, and the token of the coordinator's reservation of the key.
        self._grant: Optional[tuple[ClientLock, object]] = None
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
            raise tooz.NotImplemented("jesync has no shared (reader) locks")
        blocking, timeout = utils.convert_blocking(blocking, timeout)
        deadline = None if not blocking or timeout is None else time.monotonic() + max(0.0, timeout)
        coordinator = self._coordinator
        owner = coordinator._reserve(self.key, blocking, deadline)
        if owner is None:
            return False
        try:
            handle = _translated(lambda: coordinator._client_lock(self.key, _server_wait(blocking, deadline)))
        except (LockTimeout, KeyBusy):
            coordinator._unreserve(self.key, owner)
            return False
        except BaseException:
            coordinator._unreserve(self.key, owner)
            raise
        with self._mutex:
            self._grant = (handle, owner)
        coordinator._held(self, handle, owner)
        return True

    def release(self) -> bool:
        """Give the lock back: True if this object held it until now, else False."""
        with self._mutex:
            grant, self._grant = self._grant, None
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
        """Not available: jesync's clients cannot release another connection's lock."""
        raise tooz.NotImplemented("jesync's clients cannot break another holder's lock")

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


class JESyncDriver(coordination.CoordinationDriver):
    """
    tooz's coordinator over JESync servers: exclusive locks with failsafe
    expiry, renewed by L{heartbeat}.  See this module's documentation for
    the URL and its options.
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
        self.lock_expires = _seconds(self._options, "lock_expires", DEFAULT_LOCK_EXPIRES, allow_zero=True)
        self.prefix = str(self._options.get("prefix", ""))
        if self.prefix and key_problem(self.prefix, MAX_KEY_LENGTH) is not None:
            raise ValueError(f"prefix: {key_problem(self.prefix, MAX_KEY_LENGTH)}")
        self._client: Optional[Client] = None
        # Keys this coordinator holds or is asking for, each with the token of
        # the acquire() that reserved it: one connection holds a key at most
        # once, so other lock objects (and threads) of this coordinator wait
        # here for it.
        self._condition = threading.Condition()
        self._reserved: dict[str, object] = {}
        self._acquired: dict[JESyncLock, ClientLock] = {}

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
        if "timeout" in options:
            arguments["connect_timeout"] = arguments["read_timeout"] = _seconds(options, "timeout")
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
        for lock in list(self._acquired):
            try:
                lock.release()
            except tooz.ToozError:
                LOG.warning("Unable to release the jesync lock %r", lock, exc_info=True)
        if self._client is not None:
            # Also ends the waits in progress (ToozConnectionError).
            self._client.close()
            self._client = None

    def _client_lock(self, key: str, wait: Optional[float]) -> ClientLock:
        client = self._client
        if client is None:
            raise tooz.ToozError("the coordinator is not started")
        expires = self.lock_expires or None
        return client.lock(key, wait=wait, expires=expires)

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
        """Renew every lock this coordinator holds; return the seconds until the next heartbeat is due."""
        with self._condition:
            held = list(self._acquired)
        for lock in held:
            lock.heartbeat()
        if not self.lock_expires:
            return IDLE_HEARTBEAT
        return self.lock_expires / HEARTBEATS_PER_EXPIRY


def _unsupported(name: str, what: str) -> Callable[..., Any]:
    def method(self: JESyncDriver, *args: Any, **kwargs: Any) -> Any:
        raise tooz.NotImplemented(f"jesync has no {what}: the tooz driver does not implement {name}()")

    method.__name__ = method.__qualname__ = name
    return method


# Groups, members and leader election: tooz.NotImplemented, said here rather
# than left to the base class, which would accept watchers it never calls, and
# whose bare "raise tooz.NotImplemented" is a TypeError in tooz 8 and older.
for _name, _what in (
    ("create_group", "groups"),
    ("get_groups", "groups"),
    ("join_group", "groups"),
    ("leave_group", "groups"),
    ("delete_group", "groups"),
    ("get_members", "groups"),
    ("get_member_capabilities", "groups"),
    ("get_members_with_capabilities", "groups"),
    ("get_member_info", "groups"),
    ("update_capabilities", "groups"),
    ("watch_join_group", "groups"),
    ("watch_leave_group", "groups"),
    ("run_watchers", "groups"),
    ("get_leader", "leader election"),
    ("watch_elected_as_leader", "leader election"),
    ("stand_down_group_leader", "leader election"),
    ("run_elect_coordinator", "leader election"),
):
    setattr(JESyncDriver, _name, _unsupported(_name, _what))
del _name, _what


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
