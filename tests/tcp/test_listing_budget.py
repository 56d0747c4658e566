"""
What pending listings hold, server-wide (L{jesync.connections.listings}),
through a real server (as twistd builds it) and real TCP clients that do not
read: listings asked for while the table has not changed share one snapshot,
charged once against C{--max-listing-memory}; a listing that needs a new
snapshot past it gets the limit reply; what they hold is given back when
their connections have gone.  Asserted through the server's own accounting,
never through RSS.  The budget's rules on a L{Clock} over StringTransport are
in L{tests.unit.test_listing_budget}.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks

from jesync.connections.listings import FREE_ROWS, ROW_BYTES
from tests.server_case import Server, ServerTestCase
from tests.support import hold_keys, wait_until


class ListingBudgetTCPTests(ServerTestCase):
    """The same, through a real server (as twistd builds it) and real TCP clients."""

    KEYS = 20_000

    @inlineCallbacks
    def test_non_readers_share_a_reader_gets_it_all(self):
        """
        Ten clients ask for the listing and never read: one snapshot, charged
        once.  A client that reads gets the whole listing meanwhile.  Once the
        table has changed, a new listing would pass --max-listing-memory: the
        limit reply.  When the non-readers go, everything is given back.
        """
        budget_bytes = 2 * 1024 * 1024
        server = yield Server.start(self, "--max-held", "0", "--max-listing-memory", "2m", elock=False)
        budget = server.policy.listings
        self.assertEqual(budget.limit, budget_bytes)
        holder, reader = yield server.connect_many(2)
        keys = [b"key-%06d" % n for n in range(self.KEYS)]
        yield hold_keys(holder, keys, 5000)
        snapshot_bytes = self.KEYS * ROW_BYTES
        self.assertLess(snapshot_bytes, budget_bytes)
        self.assertGreater(2 * snapshot_bytes, budget_bytes)
        slow = yield server.connect_many(10)
        for client in slow:
            yield server.fill(client, b"status-by-key\n")
        shared = budget.shared(("status", "key"))
        self.assertIsNotNone(shared)
        self.assertEqual((shared.readers, budget.held), (10, snapshot_bytes))

        listing = [b"STATUS 1 0 %s\n" % key for key in keys] + [b"END\n"]
        reader.send(b"status-by-key\n")
        self.assertEqual((yield reader.read_lines(len(listing), timeout=20)), listing)
        self.assertEqual(budget.held, snapshot_bytes)

        self.assertEqual((yield holder.ask(b"lock one-more 1 -1 0\n")), b"GRANTED 1 0 one-more 0\n")
        self.assertEqual(
            (yield reader.ask(b"status-by-key\n")), b"INVALID_PARAMETER: max-listing-memory exceeded (2097152)\n"
        )
        self.assertEqual(budget.refused, 1)

        for client in slow:
            yield server.drop(client, abort=True)
        yield wait_until(lambda: budget.held == 0)
        self.assertIsNone(budget.shared(("status", "key")))
        reader.send(b"status-by-key\n")
        replies = yield reader.read_lines(len(listing) + 1, timeout=20)
        self.assertEqual(replies[-2:], [b"STATUS 1 0 one-more\n", b"END\n"])
        yield wait_until(lambda: budget.held == 0)


    @inlineCallbacks
    def test_listed_again_at_once(self):
        """
        One client, no other: a table whose snapshot is larger than the
        budget is listed again and again, each listing asked for as soon as
        the last has gone out (pipelined: read by the server the turn the
        last one is done, while its snapshot is still being freed).  Every
        one is served in full.
        """
        keys_count = 3 * FREE_ROWS
        server = yield Server.start(self, "--max-held", "0", "--max-listing-memory", "1m", elock=False)
        budget = server.policy.listings
        holder, reader = yield server.connect_many(2)
        keys = [b"key-%06d" % n for n in range(keys_count)]
        yield hold_keys(holder, keys, 5000)
        self.assertGreater(keys_count * ROW_BYTES, budget.limit)
        listing = [b"STATUS 1 0 %s\n" % key for key in keys] + [b"END\n"]
        freeing_seen = []
        real_free = budget._free
        self.patch(budget, "_free", lambda rows, charge: freeing_seen.append(budget.freeing) or real_free(rows, charge))
        reader.send(b"status-by-key\n" * 4)
        for _ in range(4):
            self.assertEqual((yield reader.read_lines(len(listing), timeout=30)), listing)
        self.assertEqual(budget.refused, 0)
        self.assertGreater(max(freeing_seen), 0)
        yield wait_until(lambda: budget.held == 0)
