"""
Which server a key lives on, when a client is given several.

Every process that shares a fleet must agree on where each key lives, so both
placements depend only on the key's bytes and the list of servers, never on
Python's (randomised) C{hash}:

- C{"consistent"} (the default), L{HashRing}: consistent hashing, so adding
  or removing one of N servers moves only about 1/N of the keys.  The order
  of the list does not matter.
- C{"php"}, L{PHPPlacement}: the placement of the JESync PHP driver, so
  Python and PHP processes sharing servers agree.  The order of the list
  matters (it must match the PHP C{addServer} calls), and changing the number
  of servers moves most keys.

MD5 is used here only to spread keys, never for security, so every call
says C{usedforsecurity=False}: a Python whose OpenSSL runs in FIPS mode
(which refuses MD5 for security) computes it all the same.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Protocol, Sequence

from jesync.client.address import Address
from jesync.wire import encode_key

PLACEMENTS = ("consistent", "php")


def md5(data: bytes) -> bytes:
    """The MD5 digest of C{data}, for placing keys only (so allowed under FIPS)."""
    return hashlib.md5(data, usedforsecurity=False).digest()


class Placement(Protocol):
    """Maps a key to the index of its server in the client's list."""

    def server_for(self, key: str) -> int: ...


class HashRing:
    """
    Consistent hashing in the style of ketama (memcached's): each server is
    160 points on a circle of 2**32; point 4i+j is bytes 4j..4j+3
    (little-endian) of C{md5(f"{server}-{i}")} for i < 40, where C{server}
    is the address as written by C{str()} (C{host:port}, C{[v6]:port},
    C{unix:/path}).  A key goes to the server of the first point at or after
    the first 4 bytes (little-endian) of C{md5(key)}, wrapping around.
    """

    POINTS_PER_SERVER = 160

    def __init__(self, servers: Sequence[Address]) -> None:
        ring: list[tuple[int, str, int]] = []
        for index, server in enumerate(servers):
            name = str(server)
            for i in range(self.POINTS_PER_SERVER // 4):
                digest = md5(f"{name}-{i}".encode())
                for j in range(4):
                    ring.append((int.from_bytes(digest[4 * j : 4 * j + 4], "little"), name, index))
        ring.sort()  # ties (improbable) are broken by the server's name, the same everywhere
        self._points = [point for point, _, _ in ring]
        self._servers = [index for _, _, index in ring]

    def server_for(self, key: str) -> int:
        point = int.from_bytes(md5(encode_key(key))[:4], "little")
        position = bisect.bisect_left(self._points, point)
        return self._servers[position % len(self._servers)]


class PHPPlacement:
    """
    The JESync PHP driver's placement: the first 3 hex digits of
    C{md5(key)} as an integer (0 to 4095), modulo the number of servers, as
    an index into the list in the order given.
    """

    def __init__(self, servers: Sequence[Address]) -> None:
        self._count = len(servers)

    def server_for(self, key: str) -> int:
        return int(md5(encode_key(key)).hex()[:3], 16) % self._count


def make_placement(name: str, servers: Sequence[Address]) -> Placement:
    """The placement called C{name} (one of L{PLACEMENTS}) over C{servers}."""
    if name == "consistent":
        return HashRing(servers)
    if name == "php":
        return PHPPlacement(servers)
    raise ValueError(f"unknown placement {name!r}: choose one of {', '.join(PLACEMENTS)}")
