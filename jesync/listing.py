"""
The three orders of a status listing (docs/protocols/jesync.md), in one place for the
server that sorts its listing and the clients that merge several servers'.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Tuple

from jesync.wire import KeyStatus, ListingOrder, encode_key

LISTING_ORDERS: tuple[ListingOrder, ...] = ("key", "requests", "grants")


# A row is a KeyStatus, or any (key, granted, waiting) tuple: the server's
# snapshot is plain tuples (LockService.snapshot), and the rules read fields by
# position so that one sort order serves both.
Row = Tuple[Any, ...]  # (key, granted, waiting), and "shared" for a key held shared


def _by_key(row: Row) -> bytes:
    """Keys sort by their bytes on the wire (for UTF-8 keys, code point order)."""
    return encode_key(row[0])


def listing_sort_key(order: ListingOrder) -> Callable[[Row], Any]:
    """By key; or by waiting, or granted, count, largest first, ties by key."""
    if order == "key":
        return _by_key
    if order == "requests":
        return lambda row: (-row[2], _by_key(row))
    if order == "grants":
        return lambda row: (-row[1], _by_key(row))
    raise ValueError(f"unknown listing order {order!r}: choose one of {', '.join(LISTING_ORDERS)}")


def sort_listing(rows: Iterable[KeyStatus], order: ListingOrder) -> list[KeyStatus]:
    return sorted(rows, key=listing_sort_key(order))
