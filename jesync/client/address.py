"""
Server addresses: what C{--server}, C{JESYNC_SERVERS} and the clients'
C{servers} argument accept.

    host:port          example.com:11400, 127.0.0.1:7777
    host               the JESync port, 11400
    [IPv6]:port        [::1]:11400 (a bare IPv6 address without a port, ::1, works too)
    unix:/path         a Unix socket
    a:11400|b:11400    the members of one jesync cluster (C{--etcd}): one
                       server, reached through whichever member answers

Members of a cluster are separated by C{|}; servers by commas or whitespace.
Several servers are independent lock servers among which keys are sharded;
the members of one cluster serve one lock table, one at a time (the
leader), so a client fails over between them rather than placing keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Union

DEFAULT_PORT = 11400
#: Where the clients and the command line look when given no server.
DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"

_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class TCPAddress:
    """A server reached over TCP (IPv4, IPv6 or a host name)."""

    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class UNIXAddress:
    """A server reached over a Unix socket."""

    path: str

    def __str__(self) -> str:
        return f"unix:{self.path}"


Member = Union[TCPAddress, UNIXAddress]


@dataclass(frozen=True)
class ClusterAddress:
    """The members of one jesync cluster, in the order they are tried."""

    members: tuple[Member, ...]

    def __str__(self) -> str:
        return "|".join(str(member) for member in self.members)


Address = Union[TCPAddress, UNIXAddress, ClusterAddress]


def parse_address(text: str) -> Address:
    """Parse one server address (or a cluster's members); raise ValueError saying what is wrong with it."""
    text = text.strip()
    if "|" in text:
        return _parse_cluster(text)
    return _parse_member(text)


def _parse_cluster(text: str) -> ClusterAddress:
    members = [_parse_member(part) for part in text.split("|")]
    if len(set(members)) != len(members):
        raise ValueError(f"{text!r}: a cluster member is listed twice")
    return ClusterAddress(tuple(members))


def _parse_member(text: str) -> Member:
    text = text.strip()
    if not text:
        raise ValueError("an empty cluster member (two | in a row, or one at an end)")
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise ValueError(f"{text!r}: a unix: address needs a socket path")
        return UNIXAddress(path)
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not host:
            raise ValueError(f"{text!r}: an IPv6 address is written [address]:port")
        if not rest:
            return TCPAddress(host)
        if not rest.startswith(":"):
            raise ValueError(f"{text!r}: expected :port after ]")
        return TCPAddress(host, _port(rest[1:], text))
    if text.count(":") > 1:
        # A bare IPv6 address: it cannot carry a port without brackets.
        return TCPAddress(text)
    host, colon, port = text.partition(":")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"{text!r}: missing host")
    return TCPAddress(host, _port(port, text) if colon else DEFAULT_PORT)


def _port(value: str, text: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return int(value)


def parse_servers(servers: str | Address | Iterable[str | Address]) -> list[Address]:
    """
    A list of server addresses, in order, from one address, a list of them, or
    one string of several separated by commas or whitespace (the
    C{JESYNC_SERVERS} form).  The order matters to the PHP-compatible
    placement.  Raise ValueError if there are none or one is repeated.
    """
    if isinstance(servers, (TCPAddress, UNIXAddress, ClusterAddress)):
        items: list[str | Address] = [servers]
    elif isinstance(servers, str):
        items = [part for part in _SEPARATORS.split(servers) if part]
    else:
        items = list(servers)
    addresses = [item if isinstance(item, (TCPAddress, UNIXAddress, ClusterAddress)) else parse_address(item) for item in items]
    if not addresses:
        raise ValueError("no server address given")
    seen = set()
    for address in addresses:
        if address in seen:
            raise ValueError(f"server {address} is listed twice")
        seen.add(address)
    return addresses
