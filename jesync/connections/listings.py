"""
What pending listings hold, server-wide: one budget, and snapshots shared.

A large reply (a JESync listing, C{holders}, memcached's C{keys}) is a
snapshot taken at once and streamed as the client takes it
(L{jesync.connections.connection.LockConnection.write_stream}).  Until its
last byte has gone out, the snapshot stays in memory: a client that asks
for a listing and never reads holds it for as long as it stays connected.
One connection holds at most one, but a thousand such clients would hold a
thousand snapshots (a 300,000-key listing is about 21 MB).  So:

 - B{Shared.}  A listing asked for while the table has not changed since an
   earlier one of the same kind that is still being sent (the same order,
   and the lock service's C{version} unchanged) is streamed from the same
   snapshot.  Each reader has its own cursor; the rows are never copied,
   sorted again, or changed.  Fifty clients that ask for the same listing and
   never read hold one snapshot.
 - B{Counted.}  Every snapshot, and every other large reply held for
   streaming (L{ListingBudget.charge}), is charged its estimated bytes once,
   against one budget per server (C{--max-listing-memory}), until its last
   reader has sent its last byte or its connection has gone.  A listing that
   would take a new snapshot past the budget is refused with the protocol's
   limit reply (C{max-listing-memory exceeded}); reading a shared one is
   never refused, since it costs nothing more, and neither is a charge of
   nothing.  What is being freed (below) is not counted against a new
   listing: it is going, and a client that reads its listing and asks
   again at once must not find its own last one in the way.  While no
   snapshot is being read and no reply is held for streaming, one listing
   is admitted whatever its size, so that a table larger than the budget
   can still be listed, one listing at a time.
 - B{Small replies are not held.}  A reply smaller than one piece of a
   stream (L{jesync.connections.grammar.PIECE}) is written at once, as any
   other reply, and charged nothing (C{holders} of a key few hold, C{keys}
   that match little): a client that holds the budget delays no one's.
 - B{Freed a piece per turn.}  Freeing a million rows at once stalls the
   server for 0.1-0.3 s, so a snapshot whose last reader is done is freed
   L{FREE_ROWS} rows per reactor turn, and its charge goes down as it goes
   (L{ListingBudget.freeing}).  That is faster than any client can read
   one: a connection sends at most 64 KiB a turn, and a row's line is 13
   bytes at least, so about 5,000 rows.

So what pending listings hold together is what is being read (at most the
budget, or one snapshot larger than it) and what is being freed: at most the
budget, plus one snapshot, plus what is being freed.

A snapshot cannot be freed row by row as it is sent (as one read by a single
client could be), since other readers may be behind, or may still join: it
stays whole until its last reader is done.  That is the price of sharing;
the budget bounds it.

The estimate of a status snapshot is L{ROW_BYTES} a row: a C{(key, granted,
waiting)} tuple and its slot in a list, on CPython (measured with
C{tracemalloc}; PyPy's are smaller).  The key is the lock table's own string
and is not counted: it is in the table anyway (a key released while a
snapshot still lists it stays in memory until the snapshot goes).  A
C{keys} snapshot is the store's own keys, L{REFERENCE_BYTES} each, on the
same terms.  A C{keys} snapshot is not shared (the store keeps no version);
it is charged, and refused past the budget, as any other.

How a grammar uses it: L{ListingBudget.share} for a snapshot that can be
shared (it needs a version of what it lists, such as
L{jesync.interfaces.ILockService}'s C{version}), L{ListingBudget.charge} for
any other reply it holds (C{holders}' lines, a store's keys); either returns
something with a C{release()} method, handed to the connection with the
stream (C{write_stream(pieces, held=...)}), which releases it once the
stream has gone out or the connection has closed.
"""

from __future__ import annotations

from typing import Callable, Dict, Hashable, Iterable, List, Optional, Protocol, Sequence

from twisted.internet.interfaces import IReactorTime

from jesync.errors import LimitReached

#: The default of C{--max-listing-memory}: 64 MiB.
DEFAULT_LIMIT = 64 * 1024 * 1024
#: Estimated bytes of one row of a status snapshot (CPython: a 3-tuple, 64
#: bytes, and its list slot, 8).
ROW_BYTES = 72
#: Estimated bytes of one key in a snapshot of keys that another table holds
#: anyway (memcached's C{keys}: the store's): its list slot.
REFERENCE_BYTES = 8
#: Estimated bytes a list of C{bytes} lines takes besides the lines' own
#: bytes, per line (CPython: the C{bytes} object's header, 33, its list slot, 8).
LINE_OVERHEAD = 41
#: Rows of a finished snapshot freed per reactor turn.
FREE_ROWS = 16384


class Held(Protocol):
    """What a stream holds until it has gone out: a L{Charge}, a L{SnapshotRead}."""

    def release(self) -> None:
        """Give it back (once; a second call does nothing)."""


def lines_bytes(lines: Iterable[bytes]) -> int:
    """The estimated bytes a list of formatted lines holds."""
    return sum(len(line) + LINE_OVERHEAD for line in lines)


class Charge:
    """
    Bytes charged to a L{ListingBudget}, until L{release}d (once; a second
    release does nothing).
    """

    __slots__ = ("_budget", "size")

    def __init__(self, budget: ListingBudget, size: int) -> None:
        self._budget = budget
        self.size = size

    def release(self) -> None:
        size, self.size = self.size, 0
        if size:
            self._budget._give_back(size)

    def release_part(self, size: int) -> None:
        """Give back C{size} of the bytes (a snapshot being freed a piece at a time)."""
        size = min(size, self.size)
        self.size -= size
        if size:
            self._budget._give_back(size)


class Snapshot:
    """
    Rows taken at once, shared by the streams that send them.

    @ivar what: what it lists (its key among the budget's shared snapshots).
    @ivar version: the version of the table it was taken at.
    @ivar rows: the rows; never changed while anyone reads them.
    @ivar readers: the streams reading it now.
    """

    __slots__ = ("what", "version", "rows", "readers", "charge")

    def __init__(self, what: Hashable, version: object, rows: List, charge: Charge) -> None:
        self.what = what
        self.version = version
        self.rows = rows
        self.readers = 0
        self.charge = charge


class SnapshotRead:
    """
    One stream's hold on a shared L{Snapshot}: C{rows} to send (from the
    start, with a cursor of its own), and L{release} once they have gone out
    or the connection has closed.
    """

    __slots__ = ("_budget", "_snapshot", "rows")

    def __init__(self, budget: ListingBudget, snapshot: Snapshot) -> None:
        self._budget = budget
        self._snapshot: Optional[Snapshot] = snapshot
        self.rows: Sequence = snapshot.rows
        snapshot.readers += 1

    @property
    def snapshot(self) -> Optional[Snapshot]:
        """The snapshot read (None once released)."""
        return self._snapshot

    def release(self) -> None:
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return
        self.rows = ()
        snapshot.readers -= 1
        if not snapshot.readers:
            self._budget._retire(snapshot)


class ListingBudget:
    """
    The bytes all pending listings of one server may hold together, and the
    snapshots they share.

    @param limit: the budget, in bytes (C{--max-listing-memory}).
    @param clock: what a finished snapshot is freed a piece per turn on (None:
        at once).
    @ivar held: bytes charged now (snapshots being sent or freed, other
        replies held for streaming).
    @ivar freeing: of those, the bytes of snapshots whose last reader is
        done, being freed a piece per turn (not counted against a new
        listing).
    @ivar refused: listings refused since the server started.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT, clock: Optional[IReactorTime] = None) -> None:
        self.limit = limit
        self.clock = clock
        self.held = 0
        self.freeing = 0
        self.refused = 0
        # The snapshot being sent of each kind of listing, while it has readers.
        self._shared: Dict[Hashable, Snapshot] = {}

    def __repr__(self) -> str:
        return f"<ListingBudget {self.held} of {self.limit} bytes held, {len(self._shared)} shared>"

    def charge(self, size: int) -> Charge:
        """
        Charge C{size} bytes, to be released with the L{Charge}.

        @raise LimitReached: (C{max-listing-memory}) if that would take what
            is held, less what is being freed, past the limit; never for
            nothing, nor while nothing is held but what is being freed.
        """
        live = self.held - self.freeing
        if size and live and live + size > self.limit:
            self.refused += 1
            raise LimitReached("max-listing-memory", self.limit)
        self.held += size
        return Charge(self, size)

    def share(self, what: Hashable, version: object, size: int, take: Callable[[], List]) -> SnapshotRead:
        """
        A hold on the snapshot of C{what} (a kind of listing: say, a status
        listing and its order) at C{version}: the one being sent already if
        it was taken at that version, otherwise a new one, C{take()}, charged
        C{size} bytes (checked before it is taken).  A C{version} of None is
        never shared.

        @raise LimitReached: as L{charge}, for a new snapshot.
        """
        shared = self._shared.get(what)
        if shared is not None and version is not None and shared.version == version:
            return SnapshotRead(self, shared)
        charge = self.charge(size)
        snapshot = Snapshot(what, version, take(), charge)
        if version is not None:
            # (one taken earlier at another version stays with its readers)
            self._shared[what] = snapshot
        return SnapshotRead(self, snapshot)

    def shared(self, what: Hashable) -> Optional[Snapshot]:
        """The snapshot of C{what} that a listing at its version would share, if any."""
        return self._shared.get(what)

    # -- giving back ---------------------------------------------------------

    def _give_back(self, size: int) -> None:
        self.held -= size

    def _retire(self, snapshot: Snapshot) -> None:
        """Its last reader is done: share it no more, and free it a piece per turn."""
        if self._shared.get(snapshot.what) is snapshot:
            del self._shared[snapshot.what]
        rows, snapshot.rows = snapshot.rows, []
        self.freeing += snapshot.charge.size
        self._free(rows, snapshot.charge)

    def _free(self, rows: List, charge: Charge) -> None:
        left = len(rows)
        if self.clock is None or left <= FREE_ROWS:
            del rows[:]
            self.freeing -= charge.size
            charge.release()
            return
        # The bytes of FREE_ROWS rows (what is left of the charge goes with the last).
        part = charge.size * FREE_ROWS // left
        del rows[left - FREE_ROWS :]
        self.freeing -= part
        charge.release_part(part)
        self.clock.callLater(0, self._free, rows, charge)
