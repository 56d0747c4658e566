"""
C{twistd jesync}: the command-line options and the service they build.

An option is taken by its whole name only (getopt would take C{--por} for
C{--port}, and read a mistyped C{--prot 7777} as C{--protected-mode}); a
refusal names the options that were probably meant.  C{--help} shows the
options in the groups docs/operating.md uses, listeners first, each default written
as it can be typed back (C{64m}, not C{67108864}).

Every option is declared once, as the L{ServerSettings} field it sets
(L{jesync.options}), and L{OPTIONS} is that table: L{Options}
and L{settings_from} are read from that table, and hold only what concerns
options together (the checks across options in C{postOptions}, the token
files, the TLS policy).  Then L{makeService} builds the server the settings
describe (L{jesync.server.build_server}).
"""

from __future__ import annotations

import difflib
import functools
import hmac
import importlib
import os
import platform
import sys
import textwrap
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import twisted
from twisted.application import service
from twisted.application.app import ServerOptions
from twisted.internet import endpoints
from twisted.python import usage

from jesync import __version__
from jesync.connections.policy import read_token_file
from jesync.fencing import TokenMark
from jesync.listening import TLSPolicy, public_endpoint
from jesync.options import (
    FLAG,
    MANY,
    VALUE,
    Option,
    _ParseOnly,
    endpoint_type,
    help_groups,
    listeners,
    options_of,
)
from jesync.options import limit, seconds, seconds_text, size, size_text  # noqa: F401 (tap.size etc., as before)
from jesync.process import exit_if_not_listening
from jesync.server import ServerSettings, build_server

# Every option, declared as the ServerSettings field it sets (jesync.options).
OPTIONS: Sequence[Option] = options_of(ServerSettings)
BY_NAME: Dict[str, Option] = {option.name: option for option in OPTIONS}

# elock's own default, 11400, is JESync's: elock listeners are off unless asked for.
SUGGESTED_ELOCK_PORT = 11401
# dlock has no default port at all.
SUGGESTED_DLOCK_PORT = 11402
# memcached's own.
SUGGESTED_MEMCACHE_PORT = 11211

# What twistd jesync says after an option error (rather than the whole --help).
HELP_HINT = "Run 'twistd jesync --help' for the options."


def named(option: str, coerce: Callable[[str], Any]) -> Callable[[str], Any]:
    """C{coerce}, whose errors name C{option} (usage.Options' own say only "Parameter type enforcement failed")."""

    @functools.wraps(coerce)
    def coerced(value: str) -> Any:
        try:
            return coerce(value)
        except ValueError as error:
            raise usage.UsageError(f"--{option} {value}: {error}") from None

    return coerced


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
    # From the table (OPTIONS, above): usage.Options' own rows, and a
    # method for each option given more than once (below the class).  A
    # parameter's errors name it (usage.Options' own say only "Parameter
    # type enforcement failed").
    optFlags = [[option.name, option.short, option.help] for option in OPTIONS if option.kind == FLAG]
    optParameters = [
        [option.name, option.short, option.default, option.help, option.parser and named(option.name, option.parser)]
        for option in OPTIONS
        if option.kind == VALUE
    ]
    # --help shows the options in these groups, in this order (docs/operating.md's).
    groups: Sequence[Tuple[str, Sequence[str]]] = help_groups(OPTIONS)

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
        for option in OPTIONS:
            if option.kind == MANY:
                self[option.key] = []
        # What postOptions reads from other options (the token files, the TLS options).
        self["tls"] = TLSPolicy()
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
        option = BY_NAME.get(name)  # (a subclass's own option is shown as str() shows it)
        return f"{text} [default: {(option.shown if option is not None else str)(default)}]"

    def postOptions(self) -> None:
        for option in OPTIONS:
            if option.kind == MANY and option.default is not None and not self[option.key]:
                self[option.key] = [option.default]
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
        elif any(self[name] != BY_NAME[name].default_value() for name in ("cluster", "lease-ttl")):
            raise usage.UsageError("--cluster and --lease-ttl need --etcd")

    def _tls_policy(self) -> TLSPolicy:
        """What the ssl: listeners accept, checked against every ssl: endpoint given (if any)."""
        tls = TLSPolicy(self["tls-ciphers"], self["tls-min-version"])
        checked = False
        for listener in listeners(OPTIONS):
            option = listener.name
            for description in self[listener.key]:
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


def _add_to_list(option: Option) -> Callable[[Options, str], None]:
    """The C{opt_} method of an option given as often as wanted: each value read, then added to its list."""
    read = named(option.name, option.parser or str)

    def add(self: Options, value: str) -> None:
        self[option.key].append(read(value))

    add.__doc__ = option.help
    return add


for _option in OPTIONS:
    if _option.kind == MANY:
        _method = _add_to_list(_option)
        setattr(Options, "opt_" + _option.name.replace("-", "_"), _method)
        if _option.short:
            setattr(Options, "opt_" + _option.short, _method)


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
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise usage.UsageError(f"--state-dir: {path} is not a directory the server can write to")
    try:
        TokenMark(path).read()
    except (OSError, ValueError) as error:
        raise usage.UsageError(f"--state-dir: {error}") from None
    return path


def settings_from(options: Options) -> ServerSettings:
    """The server that C{options} describe: each option's value in its settings field, and what postOptions read."""
    fields = {option.field: option.setting(options[option.key]) for option in OPTIONS if option.field is not None}
    return ServerSettings(
        **fields,
        auth_token=options["auth_token"],
        admin_token=options["admin_token"],
        tls=options["tls"],
    )


def makeService(options: Options) -> service.Service:
    """
    One lock service, served over every protocol at every endpoint given.
    Under twistd, one that cannot listen ends the process with status 1.
    """
    from twisted.internet import reactor  # (twistd's, installed by now: importing it earlier would install the default)

    server = build_server(reactor, settings_from(options))
    if under_twistd(options):
        exit_if_not_listening(server, reactor)
    return server
