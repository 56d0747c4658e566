"""
Every option of C{twistd jesync}, declared once, in L{OPTIONS}: its name,
short flag, how its value is read, its default and how C{--help} shows it,
its help text and group, and the L{jesync.server.ServerSettings} field it
sets.  Everything else reads the table: L{jesync.tap.Options} (its
C{optParameters}, C{optFlags}, its listener methods, its C{--help} groups),
L{jesync.tap.settings_from} (options to settings) and C{ServerSettings}'
defaults (L{setting_default}).  So adding an option is one entry here, its
settings field, and the code that uses it; C{--help}, the whole-name check,
the error messages and the settings follow.

A value's reader (C{parser}) raises C{ValueError} worded for the user;
C{twistd jesync} shows it after the option and its value (C{--max-keys -1:
must be 0 (no limit) or more}).  This module knows nothing of twistd nor of
the server it configures; it imports only what its defaults are.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from twisted.internet import endpoints

from jesync.connections.listings import DEFAULT_LIMIT as DEFAULT_LISTING_LIMIT
from jesync.listening import DEFAULT_TLS_CIPHERS, TLS_VERSIONS
from jesync.sessions import DEFAULT_MAX_SESSIONS

# Where a server listens for JESync clients unless told.
DEFAULT_PORT = "tcp:11400"

TLS_HINT = "pip install 'jesync[tls]'"


def whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("not a whole number") from None


def limit(value: str) -> int | None:
    """A limit's value: a whole number, 0 meaning no limit."""
    number = whole_number(value)
    if number < 0:
        raise ValueError("must be 0 (no limit) or more")
    return number or None


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size(value: str) -> int:
    """A size in bytes, perhaps with a unit: 65536, 64k, 64m, 1g (powers of 1024)."""
    text = value.strip().lower().removesuffix("b")
    unit = text[-1:] if text[-1:] in ("k", "m", "g") else ""
    try:
        number = int(text[: len(text) - len(unit)])
    except ValueError:
        raise ValueError("not a size (65536, 64k, 64m, 1g)") from None
    if number < 1:
        raise ValueError("must be at least 1")
    return number * _SIZE_UNITS[unit]


def size_text(value: int) -> str:
    """C{value} as L{size} reads it back, in the largest unit that divides it: 67108864 is 64m."""
    for unit in ("g", "m", "k"):
        if value >= _SIZE_UNITS[unit] and value % _SIZE_UNITS[unit] == 0:
            return f"{value // _SIZE_UNITS[unit]}{unit}"
    return str(value)


def on_off(value: str) -> bool:
    """C{on} or C{off}."""
    if value not in ("on", "off"):
        raise ValueError("must be on or off")
    return value == "on"


def tls_version(value: str) -> str:
    """A TLS version jesync's listeners may require at least: C{1.2} or C{1.3}."""
    if value not in TLS_VERSIONS:
        raise ValueError(f"must be {' or '.join(TLS_VERSIONS)}")
    return value


def seconds(value: str) -> float:
    """A number of seconds, perhaps with a fraction."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number of seconds")
    if number < 0:
        raise ValueError("must not be negative")
    return number


def seconds_text(value: float) -> str:
    """C{value} as L{seconds} reads it back: 60.0 is 60, 0.5 is 0.5."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def endpoint_description(value: str) -> str:
    """A bare port number means TCP on every interface, as in JESync."""
    return f"tcp:{value}" if value.isdigit() else value


def endpoint_type(description: str) -> str:
    return description.split(":", 1)[0].strip().lower()


class _ParseOnly:
    """A stand-in reactor: parsing a description builds an endpoint but never touches its reactor."""


def listen_endpoint(value: str) -> str:
    """
    Where to listen: a port number or a Twisted endpoint description,
    which parses (C{ssl:} needs pyOpenSSL, the C{tls} extra).
    """
    description = endpoint_description(value)
    tls = endpoint_type(description) == "ssl"
    if tls:
        try:
            importlib.import_module("OpenSSL.SSL")
        except ImportError:
            raise ValueError(f"TLS needs pyOpenSSL: {TLS_HINT}") from None
    try:
        endpoints.serverFromString(_ParseOnly(), description)
    except ImportError as error:
        raise ValueError(f"{error}" + (f": {TLS_HINT}" if tls else "")) from None
    except Exception as error:
        raise ValueError(str(error)) from None
    return description


def etcd_url(value: str) -> str:
    """An etcd client URL, without a trailing slash."""
    if not value.startswith(("http://", "https://")):
        raise ValueError("an etcd client URL, such as http://127.0.0.1:2379")
    return value.rstrip("/")


def none_if_zero(value: Any) -> Any:
    """0 (or 0.0) as settings hold it: None, "no limit" or "never"."""
    return value or None


def _same(value: Any) -> Any:
    return value


# What an option is on the command line.
VALUE = "value"  # --name VALUE, once (the last one given counts)
FLAG = "flag"  # --name, no value
MANY = "many"  # --name VALUE, as often as wanted: the values make a list
ACTION = "action"  # something Options itself does and exits (--version, --help)


@dataclass(frozen=True)
class Option:
    """
    One option of C{twistd jesync}.

    @ivar name: its long name, C{--name}.
    @ivar group: the C{--help} group it is shown in (groups are shown in
        the order they first appear in L{OPTIONS}, options in theirs).
    @ivar help: its help text, one paragraph (None: an L{ACTION}'s method's
        own docstring).
    @ivar kind: L{VALUE}, L{FLAG}, L{MANY} or L{ACTION}.
    @ivar parser: reads a value as typed (its C{ValueError}s are shown to
        the user); None: the text as it is.
    @ivar default: the value when the option is not given, as the parser
        returns it or as it is typed (a string, which the parser reads);
        for a L{MANY} option, the one value its list holds when it is never
        given (None: an empty list).
    @ivar short: its one-letter flag, if any.
    @ivar shown: how C{--help} shows the default, as it can be typed back.
    @ivar field: the L{jesync.server.ServerSettings} field it sets (None:
        read by L{jesync.tap.Options} into another, as C{--tls-ciphers} is
        into C{tls}).
    @ivar setting: the option's value as that field holds it.
    """

    name: str
    group: str
    help: Optional[str]
    kind: str = VALUE
    parser: Optional[Callable[[str], Any]] = None
    default: Any = None
    short: Optional[str] = None
    shown: Callable[[Any], str] = str
    field: Optional[str] = None
    setting: Callable[[Any], Any] = _same

    @property
    def key(self) -> str:
        """Where L{jesync.tap.Options} keeps its value: a list under its field, anything else under its name."""
        return self.field if self.kind == MANY and self.field is not None else self.name

    def default_value(self) -> Any:
        """Its default as the parser returns it (one typed as text is read)."""
        if isinstance(self.default, str) and self.parser is not None:
            return self.parser(self.default)
        return self.default


OPTIONS: Sequence[Option] = (
    # Listeners
    Option(
        "port",
        "Listeners",
        "Where to listen for JESync clients: a port number or a Twisted endpoint description "
        "(tcp:7777:interface=127.0.0.1, unix:/run/jesync.sock, ssl:11443:privateKey=key.pem:certKey=cert.pem; "
        "ssl: needs pip install 'jesync[tls]'). May be given more than once. [default: 11400]",
        kind=MANY,
        parser=listen_endpoint,
        default=DEFAULT_PORT,
        short="p",
        field="ports",
    ),
    Option(
        "elock-port",
        "Listeners",
        "Where to listen for elock clients (a port number or an endpoint description, as for --port); "
        "may be given more than once. Off unless given; 11401 is suggested (elock's own default is JESync's 11400).",
        kind=MANY,
        parser=listen_endpoint,
        field="elock_ports",
    ),
    Option(
        "dlock-port",
        "Listeners",
        "Where to listen for dlock clients (length-prefixed protocol buffers; a port number or an endpoint "
        "description, as for --port); may be given more than once. Off unless given; 11402 is suggested.",
        kind=MANY,
        parser=listen_endpoint,
        field="dlock_ports",
    ),
    Option(
        "memcache-port",
        "Listeners",
        "Where to listen for memcached clients (text and binary protocols, with yrmcds's object locks; "
        "a port number or an endpoint description, as for --port); may be given more than once. "
        "Off unless given; 11211 is suggested.",
        kind=MANY,
        parser=listen_endpoint,
        field="memcache_ports",
    ),
    Option(
        "admin-port",
        "Listeners",
        "Where to listen for the operator: the JESync protocol plus force-release <key> and end-session <id> "
        "(a port number or an endpoint description, as for --port; e.g. unix:/run/jesync/admin.sock "
        "with mode=600); may be given more than once. Off unless given.",
        kind=MANY,
        parser=listen_endpoint,
        field="admin_ports",
    ),
    Option(
        "metrics",
        "Listeners",
        "Serve Prometheus metrics (/metrics) and a health check (/health) over HTTP, unauthenticated: "
        "a port number or an endpoint description, as for --port (e.g. tcp:9400:interface=127.0.0.1). "
        "Off unless given. Needs pip install 'jesync[metrics]'.",
        kind=MANY,
        parser=listen_endpoint,
        field="metrics_ports",
    ),
    # Limits
    Option(
        "max-connections",
        "Limits",
        "Most client connections open at once, all protocols together.",
        parser=limit,
        default=10_000,
        field="max_connections",
    ),
    Option(
        "max-keys",
        "Limits",
        "Most distinct keys in use (held or waited for) at once.",
        parser=limit,
        default=1_000_000,
        field="max_keys",
    ),
    Option(
        "max-waiters",
        "Limits",
        "Most requests waiting for one key.",
        parser=limit,
        default=10_000,
        field="max_waiters",
    ),
    Option(
        "max-total-waits",
        "Limits",
        "Most requests waiting at once, all keys and connections together.",
        parser=limit,
        default=100_000,
        field="max_total_waits",
    ),
    Option(
        "max-held",
        "Limits",
        "Most grants plus waits one connection (elock: one session) may have.",
        parser=limit,
        default=10_000,
        field="max_held",
    ),
    Option(
        "max-sessions",
        "Limits",
        "Most elock sessions in their grace period (detached) at once; while there are that many, "
        "no new session starts.",
        parser=limit,
        default=DEFAULT_MAX_SESSIONS,
        field="max_sessions",
    ),
    Option(
        "max-session-grace",
        "Limits",
        "Longest grace period, in seconds, an elock session may ask for with set_timeout "
        "(a longer one is cut to it); a session holding nothing ends when its connection goes.",
        parser=seconds,
        default=300.0,
        shown=seconds_text,
        field="max_session_grace",
        setting=none_if_zero,
    ),
    Option(
        "max-key-length",
        "Limits",
        "Longest key accepted, in bytes.",
        parser=limit,
        default=1024,
        field="max_key_length",
    ),
    Option(
        "max-unsent",
        "Limits",
        "Bytes of replies a client that stopped reading may fall behind by before it is disconnected "
        "(counted from the first reactor turn after its transport's buffer passed 64 KiB).",
        parser=limit,
        default=4 * 1024 * 1024,
        field="max_unsent",
    ),
    Option(
        "max-listing-memory",
        "Limits",
        "Most memory the snapshots of listings being sent hold together, in bytes or with a unit (64m, 1g); "
        "past it, a listing that needs a new snapshot is refused (one is always admitted when no other is being sent).",
        parser=size,
        default=DEFAULT_LISTING_LIMIT,
        shown=size_text,
        field="max_listing_memory",
    ),
    Option(
        "idle-timeout",
        "Limits",
        "Seconds after which a connection that has sent nothing, and holds and waits for nothing, "
        "is closed (0: never).",
        parser=seconds,
        default=0.0,
        shown=seconds_text,
        field="idle_timeout",
        setting=none_if_zero,
    ),
    Option(
        "dlock-max-message",
        "Limits",
        "Longest dlock message, in bytes; a longer one closes its connection.",
        parser=whole_number,
        default=16384,
        field="dlock_max_message",
    ),
    Option(
        "dlock-max-keys",
        "Limits",
        "Most keys one dlock request may name (more: TooManyKeys).",
        parser=whole_number,
        default=1000,
        field="dlock_max_keys",
    ),
    Option(
        "dlock-idle-timeout",
        "Limits",
        "Seconds after which a dlock connection that has sent nothing (not even a Ping) is closed, "
        "releasing the locks it holds until disconnect (0: never). Governs dlock connections instead "
        "of --idle-timeout.",
        parser=seconds,
        default=60.0,
        shown=seconds_text,
        field="dlock_idle_timeout",
        setting=none_if_zero,
    ),
    Option(
        "memcache-memory",
        "Limits",
        "Most memory the memcached store's items take (keys, values and 320 bytes each), in bytes or with "
        "a unit (64m, 1g); past it, least recently used unlocked items are evicted.",
        parser=size,
        default=64 * 1024**2,
        shown=size_text,
        field="memcache_memory",
    ),
    Option(
        "memcache-max-item",
        "Limits",
        "Longest value the memcached store takes (bytes, or 512k, 1m...); a longer one is refused "
        "with memcached's 'object too large' error.",
        parser=size,
        default=1024**2,
        shown=size_text,
        field="memcache_max_item",
    ),
    # Security
    Option(
        "auth-token-file",
        "Security",
        "A file holding a token (one line): every connection must send 'auth <token>' first.",
        field="auth_token_file",
    ),
    Option(
        "auth-token-grace",
        "Security",
        "Seconds the previous token is still accepted after the token file is read again (on SIGHUP), "
        "so that clients can be given the new one without a restart.",
        parser=seconds,
        default=300.0,
        shown=seconds_text,
        field="auth_token_grace",
    ),
    Option(
        "admin-token-file",
        "Security",
        "A file holding the admin listener's own token (one line): --admin-port then accepts "
        "'auth <this token>' alone (not --auth-token-file's), and this token opens no other listener. "
        "Read again on SIGHUP, as --auth-token-file is.",
        field="admin_token_file",
    ),
    Option(
        "auth-timeout",
        "Security",
        "Seconds a connection may take to send a valid 'auth <token>' (with --auth-token-file) "
        "before it is closed (0: no limit).",
        parser=seconds,
        default=10.0,
        shown=seconds_text,
        field="auth_timeout",
        setting=none_if_zero,
    ),
    Option(
        "protected-mode",
        "Security",
        "on: while no --auth-token-file is set, only clients on loopback or a UNIX socket are served, "
        "others get an error saying how to let them in; off: serve everyone (a trusted network).",
        parser=on_off,
        default="on",
        field="protected_mode",
    ),
    Option(
        "tls-ciphers",
        "Security",
        "The TLS 1.2 cipher suites ssl: listeners accept, as an OpenSSL cipher string "
        "(forward-secret AEAD suites only by default; TLS 1.3's are OpenSSL's, all of that kind).",
        default=DEFAULT_TLS_CIPHERS,
    ),
    Option(
        "tls-min-version",
        "Security",
        "The oldest TLS version ssl: listeners accept: 1.2 or 1.3.",
        parser=tls_version,
        default="1.2",
    ),
    Option(
        "metrics-public",
        "Security",
        "Serve /metrics to anyone even with --auth-token-file (without it, a scrape must send "
        "'Authorization: Bearer <token>'; /health is always open).",
        kind=FLAG,
        field="metrics_public",
        setting=bool,
    ),
    # Cluster
    Option(
        "etcd",
        "Cluster",
        "Run as a member of a cluster whose state lives in etcd: an etcd client URL (http://127.0.0.1:2379); "
        "give each member of an etcd cluster, one --etcd each. One member of the cluster (--cluster) is "
        "leader and serves every listener; the others stand by, listening on nothing but --metrics, and take "
        "over if it dies. Needs pip install 'jesync[cluster]'.",
        kind=MANY,
        parser=etcd_url,
        field="etcd",
    ),
    Option(
        "cluster",
        "Cluster",
        "With --etcd: the cluster's name; every member of one cluster uses the same name and etcd.",
        default="jesync",
        field="cluster",
    ),
    Option(
        "lease-ttl",
        "Cluster",
        "With --etcd: seconds the leader's election lease lasts without a keep-alive; a standby takes over "
        "within this plus 2 seconds of the leader's death (2 at least: etcd's own minimum).",
        parser=int,
        default=5,
        field="lease_ttl",
    ),
    # Operations
    Option(
        "state-dir",
        "Operations",
        "A directory the server may write to (systemd's StateDirectory=): it keeps a high-water mark of "
        "fencing tokens there, so that tokens keep increasing across restarts even if the clock goes back.",
        field="state_dir",
    ),
    Option(
        "keepalive",
        "Operations",
        "Seconds of silence before TCP keepalive probes a client, and between probes; "
        "4 unanswered probes drop it (0: the system's settings).",
        parser=seconds,
        default=60.0,
        shown=seconds_text,
        field="keepalive",
        setting=none_if_zero,
    ),
    Option(
        "shutdown-grace",
        "Operations",
        "Seconds a stopping server, or a closing connection, waits for clients to take their last replies "
        "before dropping them.",
        parser=seconds,
        default=5.0,
        shown=seconds_text,
        field="shutdown_grace",
    ),
    Option(
        "verbose",
        "Operations",
        "Log every command and reply (at debug level).",
        kind=FLAG,
        short="v",
        field="verbose",
        setting=bool,
    ),
    Option("version", "Operations", None, kind=ACTION),
    Option("help", "Operations", None, kind=ACTION),
)

BY_NAME: Dict[str, Option] = {option.name: option for option in OPTIONS}


def help_groups() -> List[Tuple[str, List[str]]]:
    """The C{--help} groups, each with its options' names, in the table's order."""
    grouped: Dict[str, List[str]] = {}
    for option in OPTIONS:
        grouped.setdefault(option.group, []).append(option.name)
    return list(grouped.items())


def setting_default(name: str) -> Any:
    """
    The default of the L{jesync.server.ServerSettings} field option C{name}
    sets: its default as that field holds it (for a L{MANY} option, a
    dataclass field whose every instance gets a list of its own).
    """
    option = BY_NAME[name]
    if option.kind == MANY:
        initial = [] if option.default is None else [option.default]
        return field(default_factory=lambda: list(initial))
    return option.setting(option.default_value())
