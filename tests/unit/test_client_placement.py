"""
Which server a key lives on: the JESync PHP driver's placement, checked
against values worked out by hand, and the consistent-hash ring.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync.client.address import TCPAddress, parse_servers
from jesync.client.fleet import Fleet
from jesync.client.placement import HashRing, PHPPlacement, make_placement


def servers(count: int) -> list[TCPAddress]:
    return [TCPAddress(f"10.0.0.{n}") for n in range(1, count + 1)]


class PHPPlacementTests(SynchronousTestCase):
    def test_known_values(self) -> None:
        """
        int(md5(key)[:3], 16) % count, worked out with md5sum:

            nightly-report  c38a6c3a...  0xc38 = 3128
            deploy          078f40fa...  0x078 =  120
            backup          402051f4...  0x402 = 1026
            user:42         56dadf18...  0x56d = 1389
        """
        expected = {
            # key: (index among 2, among 3, among 5)
            "nightly-report": (0, 2, 3),
            "deploy": (0, 0, 0),
            "backup": (0, 0, 1),
            "user:42": (1, 0, 4),
        }
        for key, indexes in expected.items():
            for count, index in zip((2, 3, 5), indexes):
                self.assertEqual(PHPPlacement(servers(count)).server_for(key), index, (key, count))

    def test_order_of_servers_matters(self) -> None:
        """The index is into the list as given, as with the PHP driver's addServer calls."""
        fleet = Fleet("c,b,a", "php")
        self.assertEqual(fleet.server_for("nightly-report"), TCPAddress("a"))  # 3128 % 3 == 2
        self.assertEqual(Fleet("a,b,c", "php").server_for("nightly-report"), TCPAddress("c"))


class HashRingTests(SynchronousTestCase):
    keys = [f"key-{n}" for n in range(2000)]

    def test_spreads_keys(self) -> None:
        ring = HashRing(servers(4))
        counts = [0] * 4
        for key in self.keys:
            counts[ring.server_for(key)] += 1
        for count in counts:
            self.assertTrue(300 < count < 700, counts)

    def test_order_does_not_matter(self) -> None:
        forward, backward = HashRing(servers(3)), HashRing(servers(3)[::-1])
        for key in self.keys[:200]:
            self.assertEqual(servers(3)[forward.server_for(key)], servers(3)[::-1][backward.server_for(key)])

    def test_adding_a_server_moves_few_keys(self) -> None:
        """From 4 servers to 5, about a fifth of the keys move (PHP placement: most do)."""
        before, after = HashRing(servers(4)), HashRing(servers(5))
        moved = sum(before.server_for(key) != after.server_for(key) for key in self.keys)
        self.assertTrue(moved < len(self.keys) * 0.3, moved)
        php_moved = sum(
            PHPPlacement(servers(4)).server_for(key) != PHPPlacement(servers(5)).server_for(key) for key in self.keys
        )
        self.assertTrue(php_moved > len(self.keys) * 0.6, php_moved)
        # Every key that moved went to the new server.
        for key in self.keys:
            if before.server_for(key) != after.server_for(key):
                self.assertEqual(after.server_for(key), 4)

    def test_stable_across_processes(self) -> None:
        """The ring depends on md5 only, never on Python's randomised hash: pinned values."""
        ring = HashRing(parse_servers("db1:11400,db2:11400,db3:11400"))
        self.assertEqual(
            [ring.server_for(key) for key in ["nightly-report", "deploy", "backup", "user:42"]],
            PINNED_RING_INDEXES,
        )

    def test_as_specified(self) -> None:
        """
        The documented rule, checked the slow way: the first of the 480
        points at or after the key's hash, wrapping round to the smallest.
        """
        addresses = parse_servers("db1:11400,db2:11400,db3:11400")
        points = []
        for index, address in enumerate(addresses):
            for i in range(40):
                digest = hashlib.md5(f"{address}-{i}".encode()).digest()
                points.extend((int.from_bytes(digest[j : j + 4], "little"), index) for j in (0, 4, 8, 12))
        ring = HashRing(addresses)
        for key in self.keys[:300]:
            point = int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "little")
            after = [p for p in points if p[0] >= point]
            self.assertEqual(ring.server_for(key), min(after or points)[1], key)

    def test_one_server(self) -> None:
        for name in ("consistent", "php"):
            self.assertEqual(make_placement(name, servers(1)).server_for("anything"), 0)

    def test_unknown_placement(self) -> None:
        self.assertRaises(ValueError, make_placement, "random", servers(2))


class FIPSTests(SynchronousTestCase):
    """
    Under FIPS mode, OpenSSL refuses MD5 unless it is asked for as not for
    security (C{usedforsecurity=False}, Python 3.9+): placement still works.
    """

    keys = ["nightly-report", "deploy", "backup", "user:42"]

    def test_md5_not_for_security(self) -> None:
        addresses = parse_servers("db1:11400,db2:11400,db3:11400")
        php_before = [PHPPlacement(addresses).server_for(key) for key in self.keys]
        real_md5 = hashlib.md5
        calls = []

        def fips_md5(data: bytes = b"", **kwargs: object) -> Any:
            # What a FIPS-mode hashlib does with MD5 asked for security.
            if kwargs.get("usedforsecurity", True) is not False:
                raise ValueError("[digital envelope routines] unsupported: MD5 is not allowed in FIPS mode")
            calls.append(data)
            return real_md5(data, usedforsecurity=False)

        self.patch(hashlib, "md5", fips_md5)
        ring = HashRing(addresses)
        self.assertEqual([ring.server_for(key) for key in self.keys], PINNED_RING_INDEXES)
        self.assertEqual([PHPPlacement(addresses).server_for(key) for key in self.keys], php_before)
        self.assertEqual(Fleet("db1,db2,db3", "consistent").server_for("nightly-report"), addresses[1])
        # 40 digests a server for the ring, then one a key for each look-up.
        self.assertTrue(len(calls) >= 3 * 40 + 2 * len(self.keys), len(calls))


# Pinned: changing them would move keys between servers for every user.
PINNED_RING_INDEXES = [1, 0, 2, 2]


class WatchedServersTests(SynchronousTestCase):
    """L{Fleet.watched}: which servers a watch subscribes on."""

    def test_a_key_on_its_server_or_on_route_by_s(self) -> None:
        fleet = Fleet("a,b,c", "consistent")
        group = "group:workers"
        keys = (f"{group}/w{n}" for n in range(100))
        elsewhere = next(key for key in keys if fleet.index_for(key) != fleet.index_for(group))
        self.assertEqual(fleet.watched(elsewhere, False), [fleet.index_for(elsewhere)])
        self.assertEqual(fleet.watched(elsewhere, False, route_by=group), [fleet.index_for(group)])

    def test_a_prefix_on_every_server(self) -> None:
        fleet = Fleet("a,b,c", "consistent")
        self.assertEqual(fleet.watched("group:workers/", True), [0, 1, 2])
        self.assertRaises(TypeError, fleet.watched, "group:workers/", True, "group:workers")
