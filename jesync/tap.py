"""
C{twistd jesync}: the command-line options and the service they build.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Any, Callable, List, Optional, cast

from twisted.application import service
from twisted.internet import endpoints
from twisted.internet.error import ReactorNotRunning
from twisted.python import usage
from twisted.python.failure import Failure

from jesync.connections.policy import read_token_file
from jesync.server import DEFAULT_PORT, ListenFailed, ServerSettings, build_server

# elock's own default, 11400, is JESync's: elock listeners are off unless asked for.
SUGGESTED_ELOCK_PORT = 11401
# dlock has no default port at all.
SUGGESTED_DLOCK_PORT = 11402
# memcached's own.
SUGGESTED_MEMCACHE_PORT = 11211


def endpoint_description(value: str) -> str:
    """A bare port number means TCP on every interface, as in JESync."""
    return f"tcp:{value}" if value.isdigit() else value


# What twistd jesync says after an option error (rather than the whole --help).
HELP_HINT = "Run 'twistd jesync --help' for the options."
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


def on_off(value: str) -> bool:
    """C{on} or C{off}."""
    if value not in ("on", "off"):
        raise ValueError("must be on or off")
    return value == "on"


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if number < 0:
        raise ValueError("must not be negative")
    return number


def named(option: str, coerce: Callable[[str], Any]) -> Callable[[str], Any]:
    """C{coerce}, whose errors name C{option} (usage.Options' own say only "Parameter type enforcement failed")."""

    def coerced(value: str) -> Any:
        try:
            return coerce(value)
        except ValueError as error:
            raise usage.UsageError(f"--{option} {value}: {error}") from None

    coerced.__name__ = getattr(coerce, "__name__", "coerced")
    if hasattr(coerce, "coerceDoc"):
        setattr(coerced, "coerceDoc", getattr(coerce, "coerceDoc"))
    return coerced


def endpoint_type(description: str) -> str:
    return description.split(":", 1)[0].strip().lower()


def under_twistd(options: usage.Options) -> bool:
    """Whether C{options} are twistd's subcommand's (rather than parsed by other code, such as tests)."""
    from twisted.application.app import ServerOptions

    return isinstance(options.parent, ServerOptions)


class _ParseOnly:
    """A stand-in reactor: parsing a description builds an endpoint but never touches its reactor."""


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run a JESync-compatible lock server.  Clients ask it for named locks "
        "(mutexes and counting semaphores), wait for them in a fair queue, hold "
        "them with a failsafe expiry, and lose them when they disconnect.  "
        "Limits take 0 to mean no limit."
    )
    examples = (
        "Examples:\n"
        "  twistd -n jesync                  TCP port 11400 on every interface\n"
        "  twistd -n jesync --port 7777\n"
        "  twistd -n jesync --port tcp:11400:interface=127.0.0.1 --port unix:/run/jesync.sock\n"
        f"  twistd -n jesync --elock-port {SUGGESTED_ELOCK_PORT}      JESync on 11400 and elock on {SUGGESTED_ELOCK_PORT}, one lock table\n"
        f"  twistd -n jesync --dlock-port {SUGGESTED_DLOCK_PORT}      and dlock (protocol buffers) on {SUGGESTED_DLOCK_PORT}\n"
        f"  twistd -n jesync --memcache-port {SUGGESTED_MEMCACHE_PORT}   and a memcached store with yrmcds's object locks\n"
        "  twistd -n jesync --port ssl:11443:privateKey=key.pem:certKey=cert.pem --auth-token-file /etc/jesync/token\n"
        "  twistd -n jesync --metrics tcp:9400:interface=127.0.0.1\n"
        "  twistd -n jesync --etcd http://127.0.0.1:2379 --cluster locks   a cluster member (one of several)\n"
    )
    optFlags = [
        ["verbose", "v", "Log every command and reply (at debug level)."],
    ]
    optParameters = [
        ["max-connections", None, 10_000, "Most client connections open at once, all protocols together.", limit],
        ["max-keys", None, 1_000_000, "Most distinct keys in use (held or waited for) at once.", limit],
        ["max-waiters", None, 10_000, "Most requests waiting for one key.", limit],
        ["max-total-waits", None, 100_000, "Most requests waiting at once, all keys and connections together.", limit],
        ["max-held", None, 10_000, "Most grants plus waits one connection (elock: one session) may have.", limit],
        [
            "max-sessions",
            None,
            10_000,
            "Most elock sessions in their grace period (detached) at once; while there are that many, "
            "no new session starts.",
            limit,
        ],
        ["max-key-length", None, 1024, "Longest key accepted, in bytes.", limit],
        [
            "max-unsent",
            None,
            4 * 1024 * 1024,
            "Bytes of replies a client that stopped reading may fall behind by before it is disconnected "
            "(counted from the first reactor turn after its transport's buffer passed 64 KiB).",
            limit,
        ],
        [
            "max-listing-memory",
            None,
            64 * 1024**2,
            "Most memory the snapshots of listings being sent hold together, in bytes or with a unit (64m, 1g); "
            "past it, a listing that needs a new snapshot is refused (one is always admitted when none is held).",
            size,
        ],
        [
            "keepalive",
            None,
            60.0,
            "Seconds of silence before TCP keepalive probes a client, and between probes; "
            "4 unanswered probes drop it (0: the system's settings).",
            seconds,
        ],
        [
            "auth-token-file",
            None,
            None,
            "A file holding a token (one line): every connection must send 'auth <token>' first.",
        ],
        [
            "auth-token-grace",
            None,
            300.0,
            "Seconds the previous token is still accepted after the token file is read again (on SIGHUP), "
            "so that clients can be given the new one without a restart.",
            seconds,
        ],
        [
            "protected-mode",
            None,
            "on",
            "on: while no --auth-token-file is set, only clients on loopback or a UNIX socket are served, "
            "others get an error saying how to let them in; off: serve everyone (a trusted network).",
            on_off,
        ],
        [
            "auth-timeout",
            None,
            10.0,
            "Seconds a connection may take to send a valid 'auth <token>' (with --auth-token-file) "
            "before it is closed (0: no limit).",
            seconds,
        ],
        [
            "idle-timeout",
            None,
            0.0,
            "Seconds after which a connection that has sent nothing, and holds and waits for nothing, "
            "is closed (0: never).",
            seconds,
        ],
        [
            "dlock-max-message",
            None,
            16384,
            "Longest dlock message, in bytes; a longer one closes its connection.",
            whole_number,
        ],
        ["dlock-max-keys", None, 1000, "Most keys one dlock request may name (more: TooManyKeys).", whole_number],
        [
            "dlock-idle-timeout",
            None,
            60.0,
            "Seconds after which a dlock connection that has sent nothing (not even a Ping) is closed, "
            "releasing the locks it holds until disconnect (0: never). Governs dlock connections instead "
            "of --idle-timeout.",
            seconds,
        ],
        [
            "memcache-memory",
            None,
            64 * 1024**2,
            "Most memory the memcached store's items take (keys, values and 320 bytes each), in bytes or with "
            "a unit (64m, 1g); past it, least recently used unlocked items are evicted.",
            size,
        ],
        [
            "memcache-max-item",
            None,
            1024**2,
            "Longest value the memcached store takes (bytes, or 512k, 1m...); a longer one is refused "
            "with memcached's 'object too large' error.",
            size,
        ],
        [
            "state-dir",
            None,
            None,
            "A directory the server may write to (systemd's StateDirectory=): it keeps a high-water mark of "
            "fencing tokens there, so that tokens keep increasing across restarts even if the clock goes back.",
        ],
        [
            "cluster",
            None,
            "jesync",
            "With --etcd: the cluster's name; every member of one cluster uses the same name and etcd.",
        ],
        [
            "lease-ttl",
            None,
            5,
            "With --etcd: seconds the leader's election lease lasts without a keep-alive; a standby takes over "
            "within this plus 2 seconds of the leader's death (2 at least: etcd's own minimum).",
            int,
        ],
        [
            "shutdown-grace",
            None,
            5.0,
            "Seconds a stopping server, or a closing connection, waits for clients to take their last replies "
            "before dropping them.",
            seconds,
        ],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["ports"] = []
        self["elock_ports"] = []
        self["dlock_ports"] = []
        self["memcache_ports"] = []
        self["metrics_ports"] = []
        self["admin_ports"] = []
        self["etcd"] = []
        self["auth_token"] = None

    def parseOptions(self, options: Optional[List[str]] = None) -> None:
        """
        Parse C{options}.  Under twistd, an error ends the process with status
        1 after two lines, the error and L{HELP_HINT} (twistd itself would
        print the whole --help before the error, and exit 0 before Twisted
        26.10); otherwise it raises L{usage.UsageError}.
        """
        try:
            super().parseOptions(options)
        except usage.UsageError as error:
            if not under_twistd(self):
                raise
            raise SystemExit(f"twistd jesync: {error}\n{HELP_HINT}") from None

    def _add_endpoint(self, option: str, key: str, value: str) -> None:
        description = endpoint_description(value)
        tls = endpoint_type(description) == "ssl"
        if tls:
            try:
                importlib.import_module("OpenSSL.SSL")
            except ImportError:
                raise usage.UsageError(f"--{option} {value}: TLS needs pyOpenSSL: {TLS_HINT}") from None
        try:
            endpoints.serverFromString(_ParseOnly(), description)
        except ImportError as error:
            raise usage.UsageError(f"--{option} {value}: {error}" + (f": {TLS_HINT}" if tls else "")) from None
        except Exception as error:
            raise usage.UsageError(f"--{option} {value}: {error}") from None
        self[key].append(description)

    def opt_port(self, value: str) -> None:
        """
        Where to listen for JESync clients: a port number or a Twisted
        endpoint description (tcp:7777:interface=127.0.0.1,
        unix:/run/jesync.sock, ssl:11443:privateKey=key.pem:certKey=cert.pem;
        ssl: needs pip install 'jesync[tls]'). May be given more than once.
        [default: 11400]
        """
        self._add_endpoint("port", "ports", value)

    opt_p = opt_port

    def opt_elock_port(self, value: str) -> None:
        """
        Where to listen for elock clients (a port number or an endpoint
        description, as for --port); may be given more than once. Off unless
        given; 11401 is suggested (elock's own default is JESync's 11400).
        """
        self._add_endpoint("elock-port", "elock_ports", value)

    def opt_dlock_port(self, value: str) -> None:
        """
        Where to listen for dlock clients (length-prefixed protocol buffers;
        a port number or an endpoint description, as for --port); may be
        given more than once. Off unless given; 11402 is suggested.
        """
        self._add_endpoint("dlock-port", "dlock_ports", value)

    def opt_memcache_port(self, value: str) -> None:
        """
        Where to listen for memcached clients (text and binary protocols,
        with yrmcds's object locks; a port number or an endpoint
        description, as for --port); may be given more than once. Off
        unless given; 11211 is suggested.
        """
        self._add_endpoint("memcache-port", "memcache_ports", value)

    def opt_admin_port(self, value: str) -> None:
        """
        Where to listen for the operator: the JESync protocol plus
        force-release <key> and end-session <id> (a port number or an
        endpoint description, as for --port; e.g. unix:/run/jesync/admin.sock
        with mode=600); may be given more than once. Off unless given.
        """
        self._add_endpoint("admin-port", "admin_ports", value)

    def opt_metrics(self, value: str) -> None:
        """
        Serve Prometheus metrics (/metrics) and a health check (/health) over
        HTTP, unauthenticated: a port number or an endpoint description, as
        for --port (e.g. tcp:9400:interface=127.0.0.1). Off unless given.
        Needs pip install 'jesync[metrics]'.
        """
        self._add_endpoint("metrics", "metrics_ports", value)

    def opt_etcd(self, value: str) -> None:
        """
        Run as a member of a cluster whose state lives in etcd: an etcd
        client URL (http://127.0.0.1:2379); give each member of an etcd
        cluster, one --etcd each. One member of the cluster (--cluster) is
        leader and serves every listener; the others stand by, listening on
        nothing but --metrics, and take over if it dies. Needs pip install
        'jesync[cluster]'.
        """
        if not value.startswith(("http://", "https://")):
            raise usage.UsageError(f"--etcd {value}: an etcd client URL, such as http://127.0.0.1:2379")
        self["etcd"].append(value.rstrip("/"))

    def getUsage(self, width: int | None = None) -> str:
        return super().getUsage(width) + "\n" + self.examples

    def postOptions(self) -> None:
        if not self["ports"]:
            self["ports"] = [DEFAULT_PORT]
        if self["metrics_ports"]:
            try:
                importlib.import_module("jesync.metrics")
            except ImportError as error:
                raise usage.UsageError(str(error)) from None
        if self["auth-token-file"] is not None:
            self["auth_token"] = read_token(self["auth-token-file"])
        if self["dlock-max-message"] < 4:
            raise usage.UsageError("--dlock-max-message must be at least 4 bytes")
        if self["dlock-max-keys"] < 1:
            raise usage.UsageError("--dlock-max-keys must be at least 1")
        if self["memcache-max-item"] > self["memcache-memory"]:
            raise usage.UsageError("--memcache-max-item must not be more than --memcache-memory")
        if self["state-dir"] is not None:
            self["state-dir"] = check_state_dir(self["state-dir"])
        if self["etcd"]:
            if self["state-dir"] is not None:
                raise usage.UsageError("--state-dir has no use with --etcd: a cluster keeps its fencing-token mark in etcd")
            if self["lease-ttl"] < 2:
                raise usage.UsageError("--lease-ttl must be at least 2 seconds (etcd's minimum lease)")
            if not self["cluster"] or any(c in self["cluster"] for c in "/ \t\n"):
                raise usage.UsageError("--cluster: a name without slashes or spaces")
            try:
                importlib.import_module("treq")
            except ImportError:
                raise usage.UsageError("--etcd needs treq: pip install 'jesync[cluster]'") from None
        elif self["cluster"] != "jesync" or self["lease-ttl"] != 5:
            raise usage.UsageError("--cluster and --lease-ttl need --etcd")


# Errors in a parameter's value name it.
for _parameter in cast(List[List[Any]], Options.optParameters):
    if len(_parameter) > 4 and _parameter[4] is not None:
        _parameter[4] = named(_parameter[0], _parameter[4])

# usage.Options shows these docstrings as they are: fold each into one paragraph.
for _option in (
    Options.opt_port,
    Options.opt_elock_port,
    Options.opt_dlock_port,
    Options.opt_memcache_port,
    Options.opt_admin_port,
    Options.opt_metrics,
    Options.opt_etcd,
):
    _option.__doc__ = " ".join((_option.__doc__ or "").split())


def read_token(path: str) -> bytes:
    """The token in C{path}: its first line, without surrounding whitespace (L{read_token_file})."""
    try:
        return read_token_file(path)
    except OSError as error:
        raise usage.UsageError(f"--auth-token-file: cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        # (The token itself is never shown.)
        raise usage.UsageError(f"--auth-token-file: {error}") from None


def check_state_dir(path: str) -> str:
    """C{path}, if it is a directory the server can write its fencing mark to, and the mark in it is readable."""
    from jesync.fencing import TokenMark

    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise usage.UsageError(f"--state-dir: {path} is not a directory the server can write to")
    try:
        TokenMark(path).read()
    except (OSError, ValueError) as error:
        raise usage.UsageError(f"--state-dir: {error}") from None
    return path


def settings_from(options: Options) -> ServerSettings:
    """The server that C{options} describe."""
    return ServerSettings(
        ports=options["ports"],
        elock_ports=options["elock_ports"],
        dlock_ports=options["dlock_ports"],
        memcache_ports=options["memcache_ports"],
        metrics_ports=options["metrics_ports"],
        admin_ports=options["admin_ports"],
        max_connections=options["max-connections"],
        max_keys=options["max-keys"],
        max_waiters=options["max-waiters"],
        max_total_waits=options["max-total-waits"],
        max_held=options["max-held"],
        max_sessions=options["max-sessions"],
        max_key_length=options["max-key-length"],
        max_unsent=options["max-unsent"],
        max_listing_memory=options["max-listing-memory"],
        keepalive=options["keepalive"] or None,
        auth_token=options["auth_token"],
        auth_token_file=options["auth-token-file"],
        auth_token_grace=options["auth-token-grace"],
        protected_mode=options["protected-mode"],
        auth_timeout=options["auth-timeout"] or None,
        idle_timeout=options["idle-timeout"] or None,
        shutdown_grace=options["shutdown-grace"],
        dlock_max_message=options["dlock-max-message"],
        dlock_max_keys=options["dlock-max-keys"],
        dlock_idle_timeout=options["dlock-idle-timeout"] or None,
        memcache_memory=options["memcache-memory"],
        memcache_max_item=options["memcache-max-item"],
        state_dir=options["state-dir"],
        etcd=options["etcd"],
        cluster=options["cluster"],
        lease_ttl=options["lease-ttl"],
        verbose=bool(options["verbose"]),
    )


def makeService(options: Options) -> service.Service:
    """
    One lock service, served over every protocol at every endpoint given.
    Under twistd, one that cannot listen ends the process with status 1.
    """
    from twisted.internet import reactor

    server = build_server(reactor, settings_from(options))
    if under_twistd(options):
        atexit.register(_exit_status)
        server.when_listening().addErrback(_not_listening, reactor)
    return server


# Why twistd's process is to end with status 1 (not 0) once it has run, if it is.
_failed: Optional[ListenFailed] = None


def _not_listening(reason: Failure, reactor: Any) -> None:
    """
    Under twistd: the server could not listen, and said why in the log.
    Usually it knows that at once, before the reactor runs, and raises
    L{ListenFailed} to twistd, which then exits with status 1 (and, when it
    has daemonized, tells the process that started it): show it on stderr as
    one line rather than a traceback.  If it is known only once the reactor
    runs (an endpoint type that listens in its own time), stop the reactor
    and exit with status 1.
    """
    global _failed
    reason.trap(ListenFailed)
    if not reactor.running:
        _show_listen_failed_briefly()
        return
    _failed = cast(ListenFailed, reason.value)
    try:
        reactor.stop()
    except ReactorNotRunning:
        pass  # stopping already


def _show_listen_failed_briefly() -> None:
    previous = sys.excepthook
    if getattr(previous, "jesync", False):
        return

    def show(kind: Any, value: BaseException, traceback: Any) -> None:
        if isinstance(value, ListenFailed):
            _tell(value)
        else:
            previous(kind, value, traceback)

    setattr(show, "jesync", True)
    sys.excepthook = show


def _tell(error: ListenFailed) -> None:
    """Say why the server did not start on twistd's own stderr (twistd has redirected C{sys.stderr} to its log)."""
    if sys.__stderr__ is not None:
        try:
            sys.__stderr__.write(f"twistd jesync: not started: {error}\n")
            sys.__stderr__.flush()
        except (OSError, ValueError):
            pass


def _exit_status() -> None:
    """
    At exit, after twistd has stopped the reactor and removed its pid file:
    status 1 if the server could not listen.  (twistd has no exit status of
    its own to set: its process ends with 0 unless an exception or a signal
    ends it.)
    """
    if _failed is None:
        return
    _tell(_failed)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    os._exit(1)
