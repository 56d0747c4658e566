"""
Every option of C{twistd jesync} is declared once, as the settings field
it sets: C{max_keys: Optional[int] = option("max-keys", "Limits", "...",
parser=limit, default=1_000_000)} in L{jesync.server.ServerSettings}.
L{option} returns a dataclass field whose default is the option's (as the
field holds it) and whose metadata carries the L{Option}: its name, short
flag, how its value is read, its default and how C{--help} shows it, its
help text and group.  L{options_of} reads the table back from the
settings' fields, in their order, and everything else reads that table:
L{jesync.tap.Options} (its C{optParameters}, C{optFlags}, its listener
methods, its C{--help} groups), L{jesync.tap.settings_from} (options to
settings), and C{ServerSettings.summary} (the listeners, the limits it
logs).  So adding an option is one declaration plus the code that uses
it; C{--help}, the whole-name check, the error messages and the settings
follow.

Why the declaration is the field rather than a table entry beside it: a
table and a dataclass are two lists to keep in step, and the dataclass
cannot be built from the table without losing mypy's check of every
C{settings.max_keys} (a generated class has no declared fields).  A field
whose annotation is its type and whose value is its option keeps both
in one place.  Options that set no field of their own are declared where
they are read: C{--tls-ciphers} and C{--tls-min-version} in the C{tls}
field (L{read_into}), C{--version} and C{--help} in L{ACTIONS}.

A value's reader (C{parser}) raises C{ValueError} worded for the user;
C{twistd jesync} shows it after the option and its value (C{--max-keys -1:
must be 0 (no limit) or more}).  This module knows nothing of twistd nor of
the server it configures.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from twisted.internet import endpoints

from jesync.listening import TLS_VERSIONS

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
        the order they first appear in the table, options in theirs).
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
    @ivar field: the L{jesync.server.ServerSettings} field it sets, the one
        L{option} declares it in (None: read by L{jesync.tap.Options} into
        another, as C{--tls-ciphers} is into C{tls}, or an L{ACTION}).
    @ivar setting: the option's value as that field holds it.
    @ivar logged: its place among the limits the startup line shows
        (L{jesync.server.ServerSettings.summary}; 0: not shown there).
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
    logged: int = 0

    @property
    def key(self) -> str:
        """Where L{jesync.tap.Options} keeps its value: a list under its field, anything else under its name."""
        return self.field if self.kind == MANY and self.field is not None else self.name

    def default_value(self) -> Any:
        """Its default as the parser returns it (one typed as text is read)."""
        if isinstance(self.default, str) and self.parser is not None:
            return self.parser(self.default)
        return self.default


# The options that set no settings field: what Options itself does and exits.
ACTIONS: Sequence[Option] = (
    Option("version", "Operations", None, kind=ACTION),
    Option("help", "Operations", None, kind=ACTION),
)


def option(
    name: str,
    group: str,
    help: str,
    *,
    kind: str = VALUE,
    parser: Optional[Callable[[str], Any]] = None,
    default: Any = None,
    short: Optional[str] = None,
    shown: Callable[[Any], str] = str,
    setting: Callable[[Any], Any] = _same,
    logged: int = 0,
) -> Any:
    """
    A settings field that option C{--name} sets (L{Option}'s attributes;
    its C{field} is the field's name): the field's default is the
    option's, as the field holds it, and the option rides in the field's
    metadata, where L{options_of} finds it.  (Typed C{Any}, as
    C{dataclasses.field} is, so that the field's annotation is its type.)
    """
    declared = Option(name, group, help, kind, parser, default, short, shown, None, setting, logged)
    metadata = {_OPTION: declared}
    if kind == MANY:
        initial = [] if default is None else [default]
        return field(default_factory=lambda: list(initial), metadata=metadata)
    return field(default=setting(declared.default_value()), metadata=metadata)


def read_into(*options: Option, default_factory: Callable[[], Any]) -> Any:
    """
    A settings field that L{jesync.tap.Options} reads from C{options}
    together (as C{tls} is from C{--tls-ciphers} and C{--tls-min-version}):
    they are declared here, in the table's order, and set no field of
    their own.
    """
    return field(default_factory=default_factory, metadata={_READ_INTO: options})


_OPTION = "jesync.option"
_READ_INTO = "jesync.options read into"


@lru_cache(maxsize=None)
def options_of(settings: type) -> Tuple[Option, ...]:
    """
    The table: every option of C{settings}' fields (a dataclass, such as
    L{jesync.server.ServerSettings}), in the fields' order, then the
    L{ACTIONS}.
    """
    table: List[Option] = []
    for declared in fields(settings):
        if _OPTION in declared.metadata:
            table.append(replace(declared.metadata[_OPTION], field=declared.name))
        table.extend(declared.metadata.get(_READ_INTO, ()))
    return (*table, *ACTIONS)


def help_groups(options: Sequence[Option]) -> List[Tuple[str, List[str]]]:
    """The C{--help} groups, each with its options' names, in the table's order."""
    grouped: Dict[str, List[str]] = {}
    for each in options:
        grouped.setdefault(each.group, []).append(each.name)
    return list(grouped.items())


def listeners(options: Sequence[Option]) -> List[Option]:
    """The options that say where to listen (each a list of endpoint descriptions), in the table's order."""
    return [each for each in options if each.kind == MANY and each.parser is listen_endpoint]
