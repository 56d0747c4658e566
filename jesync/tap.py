"""
C{twistd jesync}: the command-line options and the service they build.

An option is taken by its whole name only (getopt would take C{--por} for
C{--port}, and read a mistyped C{--prot 7777} as C{--protected-mode}); a
refusal names the options that were probably meant.  C{--help} shows the
options in the groups the README uses, listeners first, each default written
as it can be typed back (C{64m}, not C{67108864}).
"""

from __future__ import annotations

import difflib
import functools
import hmac
import importlib
import math
import os
import platform
import sys
import textwrap
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import twisted
from twisted.application import service
from twisted.application.app import ServerOptions
from twisted.internet import endpoints
from twisted.python import usage

from jesync import __version__
from jesync.connections.policy import read_token_file
from jesync.listening import DEFAULT_TLS_CIPHERS, TLS_VERSIONS, TLSPolicy, public_endpoint
from jesync.process import exit_if_not_listening
from jesync.server import DEFAULT_PORT, ServerSettings, build_server

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


# How help shows a default that a coercion reads, so that it can be typed
# back as it is shown (64m, not 67108864; 60, not 60.0); any other default is
# shown as str() shows it.
_DEFAULT_TEXT: Dict[Callable[[str], Any], Callable[[Any], str]] = {size: size_text, seconds: seconds_text}


def named(option: str, coerce: Callable[[str], Any]) -> Callable[[str], Any]:
    """C{coerce}, whose errors name C{option} (usage.Options' own say only "Parameter type enforcement failed")."""

    @functools.wraps(coerce)
    def coerced(value: str) -> Any:
        try:
            return coerce(value)
        except ValueError as error:
            raise usage.UsageError(f"--{option} {value}: {error}") from None

    return coerced


def endpoint_type(description: str) -> str:
    return description.split(":", 1)[0].strip().lower()


def under_twistd(options: usage.Options) -> bool:
    """Whether C{options} are twistd's subcommand's (rather than parsed by other code, such as tests)."""
    return isinstance(options.parent, ServerOptions)


def unknown_option(name: str, names: Sequence[str]) -> str:
    """
    Why C{--name} is refused, and, on a line of its own, the options that
    begin with it or look much like it (difflib's close matches, at a cutoff
    above its default: options share words, and --max-conections should
    suggest --max-connections alone), if any.
    """
    beginning = sorted(option for option in names if name and option.startswith(name))
    similar = difflib.get_close_matches(name, names, n=3, cutoff=0.75)
    suggestions = list(dict.fromkeys(beginning + similar))[:3]
    message = f"unknown option --{name}"
    if beginning:
        message += " (options are given by their whole names)"
    if suggestions:
        spelled = [f"--{option}" for option in suggestions]
        message += "\nDid you mean " + (", ".join(spelled[:-1]) + " or " if len(spelled) > 1 else "") + spelled[-1] + "?"
    return message


def version_text() -> str:
    """What C{twistd jesync --version} prints: jesync's version, and what it runs on."""
    return (
        f"jesync {__version__} "
        f"(Twisted {twisted.__version__}, {platform.python_implementation()} {platform.python_version()})"
    )


class _ParseOnly:
    """A stand-in reactor: parsing a description builds an endpoint but never touches its reactor."""


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run a JESync-compatible lock server.  Clients ask it for named locks "
        "(mutexes and counting semaphores), wait for them in a fair queue, hold "
        "them with a failsafe expiry, and lose them when they disconnect.  "
        "The --max-* limits take 0 to mean no limit, except --max-listing-memory (a size)."
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
        [
            "metrics-public",
            None,
            "Serve /metrics to anyone even with --auth-token-file (without it, a scrape must send "
            "'Authorization: Bearer <token>'; /health is always open).",
        ],
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
        [
            "max-session-grace",
            None,
            300.0,
            "Longest grace period, in seconds, an elock session may ask for with set_timeout "
            "(a longer one is cut to it); a session holding nothing ends when its connection goes.",
            seconds,
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
            "past it, a listing that needs a new snapshot is refused (one is always admitted when no other is being sent).",
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
            "admin-token-file",
            None,
            None,
            "A file holding the admin listener's own token (one line): --admin-port then accepts "
            "'auth <this token>' alone (not --auth-token-file's), and this token opens no other listener. "
            "Read again on SIGHUP, as --auth-token-file is.",
        ],
        [
            "tls-ciphers",
            None,
            DEFAULT_TLS_CIPHERS,
            "The TLS 1.2 cipher suites ssl: listeners accept, as an OpenSSL cipher string "
            "(forward-secret AEAD suites only by default; TLS 1.3's are OpenSSL's, all of that kind).",
        ],
        [
            "tls-min-version",
            None,
            "1.2",
            "The oldest TLS version ssl: listeners accept: 1.2 or 1.3.",
            tls_version,
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

    # --help shows the options in these groups, in this order (README's), each
    # option in one group: the only place an option's name is written again.
    groups: Sequence[Tuple[str, Sequence[str]]] = (
        ("Listeners", ("port", "elock-port", "dlock-port", "memcache-port", "admin-port", "metrics")),
        (
            "Limits",
            (
                "max-connections",
                "max-keys",
                "max-waiters",
                "max-total-waits",
                "max-held",
                "max-sessions",
                "max-session-grace",
                "max-key-length",
                "max-unsent",
                "max-listing-memory",
                "idle-timeout",
                "dlock-max-message",
                "dlock-max-keys",
                "dlock-idle-timeout",
                "memcache-memory",
                "memcache-max-item",
            ),
        ),
        (
            "Security",
            (
                "auth-token-file",
                "auth-token-grace",
                "admin-token-file",
                "auth-timeout",
                "protected-mode",
                "tls-ciphers",
                "tls-min-version",
                "metrics-public",
            ),
        ),
        ("Cluster", ("etcd", "cluster", "lease-ttl")),
        ("Operations", ("state-dir", "keepalive", "shutdown-grace", "verbose", "version", "help")),
    )

    def __init__(self) -> None:
        super().__init__()
        # (A mistake here is the code's, not the user's: every Options() fails.)
        names = self.whole_names()
        grouped = [name for _, group in self.groups for name in group]
        ungrouped = sorted(set(names) - set(grouped))
        misgrouped = sorted({name for name in grouped if grouped.count(name) > 1 or name not in names})
        if ungrouped or misgrouped:
            raise TypeError(f"Options.groups: options in no group: {ungrouped}; unknown or in two: {misgrouped}")
        # usage.Options keeps a default as it is written; one written as it is
        # typed ("on") is read as a typed value is (True).
        for name, default in self.defaults.items():
            dispatch = self._dispatch.get(name)
            if isinstance(default, str) and isinstance(dispatch, usage.CoerceParameter):
                self[name] = dispatch.coerce(default)
        self["ports"] = []
        self["tls"] = TLSPolicy()
        self["elock_ports"] = []
        self["dlock_ports"] = []
        self["memcache_ports"] = []
        self["metrics_ports"] = []
        self["admin_ports"] = []
        self["etcd"] = []
        self["auth_token"] = None
        self["admin_token"] = None

    def parseOptions(self, options: Optional[List[str]] = None) -> None:
        """
        Parse C{options}.  Under twistd, an error ends the process with status
        1 after the error and L{HELP_HINT} (twistd itself would print the
        whole --help before the error, and exit 0 before Twisted 26.10);
        otherwise it raises L{usage.UsageError}.
        """
        arguments = sys.argv[1:] if options is None else options
        try:
            if arguments[-2:-1] != ["--_shell-completion"]:
                self._refuse_abbreviations(arguments)
            super().parseOptions(arguments)
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

    def whole_names(self) -> Dict[str, bool]:
        """Every long option's whole name, and whether it takes a value."""
        return {name.rstrip("="): name.endswith("=") for name in self.longOpt}

    def _refuse_abbreviations(self, arguments: Sequence[str]) -> None:
        """
        Refuse a long option that is not given by its whole name.  getopt
        takes any unambiguous prefix for the option (C{--por 7777} for
        C{--port}), so an option added later changes what a command line
        means, and a mistyped one becomes another (C{--prot 7777} was
        C{--protected-mode}).  This walks C{arguments} as getopt will, up to
        the first that is not an option, skipping the values of options that
        take one.
        """
        takes_value = self.whole_names()
        letters = self.shortOpt.replace(":", "")
        short_takes_value = {letter: f"{letter}:" in self.shortOpt for letter in letters}
        remaining = iter(arguments)
        for argument in remaining:
            if argument == "--" or argument == "-" or not argument.startswith("-"):
                return
            if argument.startswith("--"):
                name, equals, _ = argument[2:].partition("=")
                if name not in takes_value:
                    raise usage.UsageError(unknown_option(name, list(takes_value)))
                if takes_value[name] and not equals:
                    next(remaining, None)
            else:
                cluster = argument[1:]
                for position, letter in enumerate(cluster):
                    if short_takes_value.get(letter):
                        if position == len(cluster) - 1:
                            next(remaining, None)
                        break

    def opt_version(self) -> None:
        """
        Show jesync's version (and Twisted's and Python's) and exit.
        """
        print(version_text())
        sys.exit(0)

    def __str__(self) -> str:
        return self.getSynopsis() + "\n\n" + self.getUsage()

    def getUsage(self, width: int | None = None) -> str:
        """
        The description, then the options in their L{groups}, each with its
        default as it can be typed back, then the examples.
        """
        width = width or int(os.environ.get("COLUMNS", "80"))
        takes_value = self.whole_names()
        shorts = {long: short for short, long in self.synonyms.items() if len(short) == 1}
        labels = {
            name: (f"-{shorts[name]}, " if name in shorts else "    ") + f"--{name}" + ("=" if takes_value[name] else "")
            for name in takes_value
        }
        column = 2 + max(len(label) for label in labels.values()) + 2
        sections = ["\n".join(textwrap.wrap(" ".join(self.longdesc.split()), width))]
        for title, names in self.groups:
            lines = [f"{title}:"]
            for name in names:
                text = self._wrap(self._help_text(name, takes_value[name]), max(width - column, 20))
                lines.append(f"  {labels[name]:<{column - 2}}{text[0]}")
                lines.extend(" " * column + line for line in text[1:])
            sections.append("\n".join(lines))
        sections.append(self.examples.rstrip("\n"))
        return "\n\n".join(sections) + "\n"

    @staticmethod
    def _wrap(text: str, width: int) -> List[str]:
        """C{text}'s lines, never breaking an option's name or an endpoint description (so both can be copied)."""
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False) or [""]

    def _help_text(self, name: str, takes_value: bool) -> str:
        """C{name}'s description in one paragraph, and its default as it can be typed back."""
        text = " ".join((self.docs.get(name) or "").split())
        default = self.defaults.get(name)
        if not takes_value or default is None:
            return text
        # (usage.CoerceParameter keeps the coercion, which named() wraps.)
        coerce: Any = getattr(self._dispatch.get(name), "coerce", None)
        shown = _DEFAULT_TEXT.get(getattr(coerce, "__wrapped__", coerce), str)
        return f"{text} [default: {shown(default)}]"

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
        if self["admin-token-file"] is not None:
            if not self["admin_ports"]:
                raise usage.UsageError("--admin-token-file has no use without --admin-port")
            self["admin_token"] = read_token(self["admin-token-file"], "admin-token-file")
            if self["auth_token"] is not None and hmac.compare_digest(self["admin_token"], self["auth_token"]):
                raise usage.UsageError("--admin-token-file must hold a token other than --auth-token-file's")
        self["tls"] = self._tls_policy()
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

    def _tls_policy(self) -> TLSPolicy:
        """What the ssl: listeners accept, checked against every ssl: endpoint given (if any)."""
        tls = TLSPolicy(self["tls-ciphers"], self["tls-min-version"])
        listeners = {
            "port": "ports",
            "elock-port": "elock_ports",
            "dlock-port": "dlock_ports",
            "memcache-port": "memcache_ports",
            "metrics": "metrics_ports",
            "admin-port": "admin_ports",
        }
        checked = False
        for option, key in listeners.items():
            for description in self[key]:
                if endpoint_type(description) != "ssl":
                    continue
                if not checked:
                    try:
                        tls.check()
                    except ValueError as error:
                        raise usage.UsageError(f"--tls-ciphers: {error}") from None
                    checked = True
                try:
                    tls.apply(endpoints.serverFromString(_ParseOnly(), description))
                except ValueError as error:
                    raise usage.UsageError(f"--{option} {public_endpoint(description)}: {error}") from None
        return tls


# Errors in a parameter's value name it.
for _parameter in cast(List[List[Any]], Options.optParameters):
    if len(_parameter) > 4 and _parameter[4] is not None:
        _parameter[4] = named(_parameter[0], _parameter[4])


def read_token(path: str, option: str = "auth-token-file") -> bytes:
    """
    The token in C{path}, given as C{--option}: its first line, without
    surrounding whitespace (L{read_token_file}).
    """
    try:
        return read_token_file(path)
    except OSError as error:
        raise usage.UsageError(f"--{option}: cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        # (The token itself is never shown.)
        raise usage.UsageError(f"--{option}: {error}") from None


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
        max_session_grace=options["max-session-grace"] or None,
        max_key_length=options["max-key-length"],
        max_unsent=options["max-unsent"],
        max_listing_memory=options["max-listing-memory"],
        keepalive=options["keepalive"] or None,
        auth_token=options["auth_token"],
        auth_token_file=options["auth-token-file"],
        auth_token_grace=options["auth-token-grace"],
        admin_token=options["admin_token"],
        admin_token_file=options["admin-token-file"],
        metrics_public=bool(options["metrics-public"]),
        protected_mode=options["protected-mode"],
        tls=options["tls"],
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
        exit_if_not_listening(server, reactor)
    return server
