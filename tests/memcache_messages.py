"""
memcached binary requests and responses as the unit tests build and read
them (L{binary}, L{responses}), and a memcached listener on a Clock
(L{Unit}): for L{tests.unit.test_memcache_protocol} and
L{tests.unit.test_listing_budget}.
"""

from __future__ import annotations

import struct

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from jesync.connections.policy import ConnectionPolicy
from jesync.protocols.memcache import MemcacheFactory
from jesync.service import LockService
from jesync.store import ObjectStore
from tests.support import UnitClient

HEADER = struct.Struct(">BBHBBHIIQ")


def binary(
    opcode: int, key: bytes = b"", extras: bytes = b"", value: bytes = b"", opaque: int = 0, cas: int = 0
) -> bytes:
    body = extras + key + value
    return HEADER.pack(0x80, opcode, len(key), len(extras), 0, 0, len(body), opaque, cas) + body


def responses(data: bytes) -> list[tuple[int, int, int, bytes, bytes, bytes]]:
    """(opcode, status, opaque, extras, key, value) of each binary response in C{data}."""
    found = []
    while data:
        magic, opcode, key_length, extras_length, _, status, body_length, opaque, _ = HEADER.unpack_from(data)
        assert magic == 0x81, data
        body = data[24 : 24 + body_length]
        found.append(
            (
                opcode,
                status,
                opaque,
                body[:extras_length],
                body[extras_length : extras_length + key_length],
                body[extras_length + key_length :],
            )
        )
        data = data[24 + body_length :]
    return found


class Unit:
    def __init__(self, **policy) -> None:
        self.clock = Clock()
        self.clock.advance(1_800_000_000)
        self.service = LockService(self.clock)
        self.store = ObjectStore(self.service, memory=1 << 20, max_item=1000)
        self.factory = MemcacheFactory(self.store, policy=ConnectionPolicy(**policy))
        self._port = 40000

    def connect(self) -> UnitClient:
        self._port += 1
        peer = IPv4Address("TCP", "127.0.0.1", self._port)
        transport = StringTransport(peerAddress=peer)
        protocol = self.factory.buildProtocol(peer)
        protocol.makeConnection(transport)
        return UnitClient(protocol, transport)
