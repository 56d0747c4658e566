"""
What the three clients read from their arguments or, when an argument is not
given, from the environment, as the C{jesync} command does: the servers, the
auth token file, TLS, and how connection attempts are retried.

    JESYNC_SERVERS          the servers, when none are given ("db1,db2:7777", "unix:/run/jesync.sock";
                            a cluster's members: "a:11400|b:11400|c:11400")
    JESYNC_AUTH_TOKEN_FILE  a file whose first line is the token sent as C{auth <token>}
    JESYNC_TLS              "1" (yes, true, on) to connect with TLS, "0" (no, false, off) not to
    JESYNC_TLS_CA_FILE      the CA certificates (PEM) that sign the servers' certificates (implies TLS)
    JESYNC_TLS_SERVER_NAME  the name the servers' certificates must carry (implies TLS) [default: each server's host]

The token itself is never an argument or a variable: only the path of a file
holding it (so it shows in no process listing and no shell history).  It is
read when the client is made, to fail early, and again on every connection,
so a client reconnecting after the token file changed sends the new token.

TLS applies to TCP servers; a C{unix:} server is connected to without it.
Without a CA file, TLS trusts the system's certificate authorities.

All of it is one value, L{ConnectOptions}, which every client takes as
C{options=}; the servers and the placement stay arguments of their own.  The
keyword form (C{Client(servers, tls=True, read_timeout=3)}) is a
convenience that builds that value, and its keywords are written once, here
(L{ConnectKeywords}, L{client_options}): a new connection setting is a
field of L{ConnectOptions} and a key of L{ConnectKeywords}, and every client
takes it.  Keywords not given are read from the environment; an
L{ConnectOptions} given whole is used as it is (only the servers, when not
given, still come from C{$JESYNC_SERVERS}).

Nothing here does I/O beyond reading the token file, nor imports Twisted.
"""

from __future__ import annotations

import os
import random
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TypedDict, Union

from jesync.client.address import DEFAULT_SERVER, Address, TCPAddress

if TYPE_CHECKING:
    from typing_extensions import Unpack

SERVERS_VARIABLE = "JESYNC_SERVERS"
AUTH_TOKEN_FILE_VARIABLE = "JESYNC_AUTH_TOKEN_FILE"
TLS_VARIABLE = "JESYNC_TLS"
TLS_CA_FILE_VARIABLE = "JESYNC_TLS_CA_FILE"
TLS_SERVER_NAME_VARIABLE = "JESYNC_TLS_SERVER_NAME"

#: The default number of times a failed connection attempt is retried.
CONNECT_RETRIES = 3
#: The default pause before the first retry, in seconds; it doubles for each next one ...
RETRY_BACKOFF = 0.1
#: ... up to this many seconds.
RETRY_BACKOFF_MAX = 2.0
#: The default number of seconds to wait for a connection.
CONNECT_TIMEOUT = 5.0
#: The default number of seconds a server may stay silent while it owes a reply.
READ_TIMEOUT = 10.0

Servers = Union[str, Address, Sequence[Union[str, Address]]]

_YES = frozenset({"1", "yes", "true", "on"})
_NO = frozenset({"", "0", "no", "false", "off"})


def read_token(path: str) -> bytes:
    """
    The token in C{path}: its first line, without surrounding whitespace (as
    the server reads its C{--auth-token-file}).  Raise ValueError (naming the
    file, never showing the token) if it cannot be read or is not one token.
    """
    try:
        with open(path, "rb") as file:
            token = file.readline().strip()
    except OSError as error:
        raise ValueError(f"cannot read the auth token file {path}: {error.strerror or error}") from None
    if not token or len(token.split()) != 1:
        raise ValueError(f"the auth token file {path} must hold one token, without spaces")
    return token


def _variable(environ: Mapping[str, str], name: str) -> Optional[str]:
    value = environ.get(name, "").strip()
    return value or None


def _flag(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _YES:
        return True
    if lowered in _NO:
        return False
    raise ValueError(f"{name} must be 1 or 0 (yes or no, true or false, on or off), not {value!r}")


@dataclass(frozen=True)
class ConnectOptions:
    """
    How a client connects to each of its servers (see the module's
    documentation, and L{jesync.client.Client} for what each one means).
    Made directly, it is used as it is; L{from_environment} fills what is not
    given from C{$JESYNC_...} as the keyword form does.  Bad retry or backoff
    values raise ValueError when it is made.
    """

    auth_token_file: Optional[str] = None
    tls: bool = False
    tls_ca_file: Optional[str] = None
    tls_server_name: Optional[str] = None
    connect_retries: int = CONNECT_RETRIES
    retry_backoff: float = RETRY_BACKOFF
    retry_backoff_max: float = RETRY_BACKOFF_MAX
    connect_timeout: Optional[float] = CONNECT_TIMEOUT
    read_timeout: Optional[float] = READ_TIMEOUT

    def __post_init__(self) -> None:
        connect_retries = self.connect_retries
        if isinstance(connect_retries, bool) or not isinstance(connect_retries, int) or connect_retries < 0:
            raise ValueError(f"connect_retries must be a whole number, 0 or more, not {connect_retries!r}")
        for name in ("retry_backoff", "retry_backoff_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds, 0 or more, not {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_environment(
        cls,
        environ: Optional[Mapping[str, str]] = None,
        *,
        auth_token_file: Optional[str] = None,
        tls: Optional[bool] = None,
        tls_ca_file: Optional[str] = None,
        tls_server_name: Optional[str] = None,
        connect_retries: int = CONNECT_RETRIES,
        retry_backoff: float = RETRY_BACKOFF,
        retry_backoff_max: float = RETRY_BACKOFF_MAX,
        connect_timeout: Optional[float] = CONNECT_TIMEOUT,
        read_timeout: Optional[float] = READ_TIMEOUT,
    ) -> ConnectOptions:
        """
        The options from a client's keywords, each one not given (None)
        taken from its variable in C{environ} (None: C{os.environ}); the
        token file and CA file are checked now (L{check}).  Raise ValueError
        for bad ones.
        """
        env = os.environ if environ is None else environ
        if auth_token_file is None:
            auth_token_file = _variable(env, AUTH_TOKEN_FILE_VARIABLE)
        if tls_ca_file is None:
            tls_ca_file = _variable(env, TLS_CA_FILE_VARIABLE)
        if tls_server_name is None:
            tls_server_name = _variable(env, TLS_SERVER_NAME_VARIABLE)
        if tls is None:
            setting = _variable(env, TLS_VARIABLE)
            if setting is not None:
                tls = _flag(setting, TLS_VARIABLE)
            else:
                tls = tls_ca_file is not None or tls_server_name is not None
        options = cls(
            auth_token_file=auth_token_file,
            tls=bool(tls),
            tls_ca_file=tls_ca_file if tls else None,
            tls_server_name=tls_server_name if tls else None,
            connect_retries=connect_retries,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        options.check()
        return options

    @classmethod
    def resolve(
        cls,
        servers: Optional[Servers],
        *,
        environ: Optional[Mapping[str, str]],
        **keywords: Unpack[ConnectKeywords],
    ) -> tuple[Servers, ConnectOptions]:
        """
        The servers (None: C{$JESYNC_SERVERS}, else 127.0.0.1:11400) and
        L{from_environment}'s options.
        """
        return servers_from(servers, environ), cls.from_environment(environ, **keywords)

    def check(self) -> None:
        """Raise ValueError now, not on the first request, if the token file or the CA file is unusable."""
        self.token()
        if self.tls_ca_file is not None and not os.access(self.tls_ca_file, os.R_OK):
            raise ValueError(f"cannot read the TLS CA file {self.tls_ca_file}")

    def token(self) -> Optional[bytes]:
        """The token to send (read from its file now), or None; ValueError if the file is unusable."""
        return None if self.auth_token_file is None else read_token(self.auth_token_file)

    def uses_tls(self, address: Address) -> bool:
        """Whether to connect to C{address} with TLS (never over a Unix socket)."""
        return self.tls and isinstance(address, TCPAddress)

    def server_name(self, address: TCPAddress) -> str:
        """The name the server's certificate must carry."""
        return self.tls_server_name or address.host

    def ssl_context(self) -> ssl.SSLContext:
        """For the blocking and asyncio clients: verify the server's certificate and name."""
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def backoff(self, wait: Optional[float] = None, now: float = 0.0) -> Backoff:
        """The retry schedule of one call that may wait C{wait} seconds (None: no limit) from C{now}."""
        return Backoff(self.connect_retries, self.retry_backoff, self.retry_backoff_max, wait, now)


class ConnectKeywords(TypedDict, total=False):
    """The keyword form of L{ConnectOptions} that every client takes (besides C{environ})."""

    auth_token_file: Optional[str]
    tls: Optional[bool]
    tls_ca_file: Optional[str]
    tls_server_name: Optional[str]
    connect_retries: int
    retry_backoff: float
    retry_backoff_max: float
    connect_timeout: Optional[float]
    read_timeout: Optional[float]


def servers_from(servers: Optional[Servers], environ: Optional[Mapping[str, str]]) -> Servers:
    """C{servers}, or when None, C{$JESYNC_SERVERS} from C{environ} (None: C{os.environ}), else 127.0.0.1:11400."""
    if servers is not None:
        return servers
    return _variable(os.environ if environ is None else environ, SERVERS_VARIABLE) or DEFAULT_SERVER


def client_options(
    servers: Optional[Servers],
    options: Optional[ConnectOptions],
    environ: Optional[Mapping[str, str]],
    keywords: Mapping[str, Any],
) -> tuple[Servers, ConnectOptions]:
    """
    What a client's C{servers}, C{options}, C{environ} and connection
    keywords come to: the servers (L{servers_from}) and one L{ConnectOptions}
    -- C{options} as given (checked), or built from the keywords and the
    environment.  Both at once, or a keyword no client takes, is a TypeError.
    """
    unknown = sorted(set(keywords) - set(ConnectKeywords.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    if options is None:
        options = ConnectOptions.from_environment(environ, **keywords)
    elif keywords:
        raise TypeError(f"give the connection settings as options= or as keywords, not both ({', '.join(sorted(keywords))})")
    else:
        options.check()
    return servers_from(servers, environ), options


class Backoff:
    """
    When to retry a failed connection attempt: after C{initial} seconds,
    doubling for each next retry up to C{cap}, each pause drawn between half
    and all of that (jitter, so that many clients do not retry in step); at
    most C{retries} times, and never past the call's own C{wait} (counted
    from C{start}): so never for C{wait=0}.  No clock of its own: the caller
    says what time it is.
    """

    def __init__(
        self,
        retries: int,
        initial: float,
        cap: float,
        wait: Optional[float],
        start: float,
        random: Callable[[], float] = random.random,
    ) -> None:
        self._left = retries
        self._next = initial
        self._cap = cap
        self._deadline = None if wait is None else start + wait
        self._random = random

    def next_pause(self, now: float) -> Optional[float]:
        """How long to pause before the next attempt, or None to give up."""
        if self._left <= 0:
            return None
        pause = min(self._next, self._cap) * (0.5 + self._random() / 2)
        if self._deadline is not None and now + pause >= self._deadline:
            return None
        self._left -= 1
        self._next = min(self._next * 2, self._cap)
        return pause
