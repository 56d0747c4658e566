"""
The servers a client talks to, and which of them each key lives on.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from jesync.client.address import Address, parse_servers
from jesync.client.placement import make_placement
from jesync.client.wire import check_key


class Fleet:
    """
    @param servers: one address, several in one string (separated by commas
        or whitespace), or a list (see L{jesync.client.address}).
    @param placement: C{"consistent"} or C{"php"} (see L{jesync.client.placement}).
    """

    def __init__(self, servers: Union[str, Address, Sequence[Union[str, Address]]], placement: str) -> None:
        self.servers: list[Address] = parse_servers(servers)
        self._placement = make_placement(placement, self.servers)

    def index_for(self, key: str) -> int:
        """The index of C{key}'s server; raise ValueError for a key the protocol cannot carry."""
        check_key(key)
        return self._placement.server_for(key)

    def index_for_all(self, keys: Sequence[str]) -> int:
        """
        The index of the one server all of C{keys} live on; raise ValueError
        if they live on several (a multi-key lock is granted by one server).
        """
        indexes = {key: self.index_for(key) for key in keys}
        if len(set(indexes.values())) > 1:
            where = ", ".join(f"{key!r} on {self.servers[index]}" for key, index in indexes.items())
            raise ValueError(f"the keys of one lock_many must live on one server: {where}")
        return indexes[keys[0]]

    def watched(self, what: str, is_prefix: bool, route_by: Optional[str] = None) -> list[int]:
        """
        The indexes of the servers a watch of C{what} subscribes on: every
        server for a prefix; else the server of C{route_by} if given (a key
        held on another key's server: a group's member), else of C{what}.
        """
        if is_prefix:
            if route_by is not None:
                raise TypeError("route_by is for a watch of one key, not of a prefix")
            return list(range(len(self.servers)))
        return [self.index_for(what if route_by is None else route_by)]

    def server_for(self, key: str) -> Address:
        return self.servers[self.index_for(key)]
