"""
What pending listings hold, server-wide (L{jesync.connections.listings}):
listings asked for while the table has not changed share one snapshot,
charged once against C{--max-listing-memory}; a listing that needs a new
snapshot past it gets the limit reply; what a stream holds is given back
when it has gone out or its connection has gone, a finished snapshot a
piece per reactor turn.  Asserted through the server's own accounting
(the budget's bytes held, its shared snapshots), on a L{Clock} over
StringTransport, never through RSS; the same over real TCP is
L{tests.tcp.test_listing_budget}.
"""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from jesync.connections import listings
from jesync.connections.listings import FREE_ROWS, LINE_OVERHEAD, REFERENCE_BYTES, ROW_BYTES, ListingBudget
from jesync.errors import LimitReached
from tests.support import UnitServer


def drain(clock: Clock) -> None:
    """Run every reactor turn due now (streams and freeing), however many; not the timers."""
    for _ in range(100_000):
        if not any(call.getTime() <= clock.seconds() for call in clock.getDelayedCalls()):
            return
        clock.advance(0)
    raise AssertionError("the clock never ran out of calls")


class FullTransport(StringTransport):
    """
    A transport whose client does not read: once it holds more than
    C{high_water} bytes it pauses its producer, as a TCP transport's full
    buffer does.
    """

    high_water = 1024

    def write(self, data: bytes) -> None:
        super().write(data)
        if len(self.value()) > self.high_water and self.producer is not None:
            self.producer.pauseProducing()


class BudgetTests(SynchronousTestCase):
    """The budget on its own."""

    def test_charge_release_refuse(self) -> None:
        budget = ListingBudget(1000)
        first = budget.charge(600)
        self.assertEqual(budget.held, 600)
        with self.assertRaises(LimitReached) as raised:
            budget.charge(401)
        self.assertEqual((raised.exception.limit, raised.exception.value), ("max-listing-memory", 1000))
        self.assertEqual(str(raised.exception), "max-listing-memory exceeded (1000)")
        self.assertEqual((budget.held, budget.refused), (600, 1))
        second = budget.charge(400)
        self.assertEqual(budget.held, 1000)
        first.release()
        first.release()  # once only
        second.release()
        self.assertEqual(budget.held, 0)

    def test_one_is_admitted_whatever_its_size(self) -> None:
        """While nothing is held, one listing is admitted even past the budget; a second is not."""
        budget = ListingBudget(1000)
        big = budget.charge(5000)
        self.assertEqual(budget.held, 5000)
        self.assertRaises(LimitReached, budget.charge, 1)
        big.release()
        self.assertEqual(budget.held, 0)

    def test_shared_at_one_version(self) -> None:
        """The same listing at the same version is one snapshot, taken and charged once."""
        budget = ListingBudget(10_000)
        taken: list[int] = []

        def take() -> list:
            taken.append(1)
            return [("k", 1, 0)]

        first = budget.share(("status", "key"), 7, 100, take)
        second = budget.share(("status", "key"), 7, 100, take)
        self.assertIs(first.snapshot, second.snapshot)
        self.assertEqual((len(taken), budget.held, first.snapshot.readers), (1, 100, 2))
        # Another order, or another version, is another snapshot.
        other_order = budget.share(("status", "grants"), 7, 100, take)
        newer = budget.share(("status", "key"), 8, 100, take)
        self.assertEqual((len(taken), budget.held), (3, 300))
        self.assertIsNot(newer.snapshot, first.snapshot)
        self.assertIs(budget.shared(("status", "key")), newer.snapshot)
        # The older one stays with its readers until they are done.
        old = first.snapshot
        first.release()
        self.assertEqual((old.readers, budget.held), (1, 300))
        second.release()
        self.assertEqual((old.readers, old.rows, budget.held), (0, [], 200))
        newer.release()
        other_order.release()
        self.assertEqual(budget.held, 0)
        self.assertIsNone(budget.shared(("status", "key")))

    def test_unversioned_is_never_shared(self) -> None:
        budget = ListingBudget(10_000)
        first = budget.share("keys", None, 10, list)
        second = budget.share("keys", None, 10, list)
        self.assertIsNot(first.snapshot, second.snapshot)
        self.assertEqual(budget.held, 20)

    def test_refused_before_it_is_taken(self) -> None:
        budget = ListingBudget(100)
        held = budget.charge(60)

        def take() -> list:
            raise AssertionError("taken although refused")

        self.assertRaises(LimitReached, budget.share, "x", 1, 50, take)
        held.release()

    def test_freed_a_piece_per_turn(self) -> None:
        """A finished snapshot of many rows is freed FREE_ROWS a turn, its charge going down as it goes."""
        clock = Clock()
        budget = ListingBudget(10**9, clock)
        count = 3 * FREE_ROWS + 5
        rows = [("k%d" % n, 1, 0) for n in range(count)]
        read = budget.share("status", 1, count * ROW_BYTES, lambda: rows)
        read.release()
        left = [len(rows)]
        held = [budget.held]
        # One turn at a time (Clock.advance(0) would run the turns scheduled meanwhile too).
        while clock.calls:
            self.assertEqual(len(clock.calls), 1)
            turn = clock.calls.pop(0)
            turn.func(*turn.args, **turn.kw)
            left.append(len(rows))
            held.append(budget.held)
        self.assertEqual(left, [count - FREE_ROWS, count - 2 * FREE_ROWS, count - 3 * FREE_ROWS, 0])
        self.assertEqual(held, [(n * ROW_BYTES) for n in left])


    def test_what_is_being_freed_does_not_count_against_a_new_listing(self) -> None:
        """
        A snapshot whose last reader is done is freed a piece per turn; until
        it is gone it is held (and counted as freeing), but a new listing is
        admitted as if it were gone: one at a time, whatever its size.
        """
        clock = Clock()
        budget = ListingBudget(1000, clock)
        count = 3 * FREE_ROWS
        rows = [("k", 1, 0)] * count
        first = budget.share("status", 1, 5000, lambda: list(rows))
        first.release()
        left = 5000 - 5000 * FREE_ROWS // count
        self.assertEqual((budget.held, budget.freeing), (left, left))
        # Nothing is read nor held for streaming: admitted, past the budget.
        second = budget.share("status", 2, 5000, lambda: list(rows))
        self.assertEqual((budget.held - budget.freeing, budget.refused), (5000, 0))
        # Not a second one while that one is read, freeing or not.
        self.assertRaises(LimitReached, budget.share, "status", 3, 5000, list)
        self.assertRaises(LimitReached, budget.charge, 1)
        self.assertEqual(budget.refused, 2)
        drain(clock)
        self.assertEqual((budget.held, budget.freeing), (5000, 0))
        second.release()
        drain(clock)
        self.assertEqual((budget.held, budget.freeing), (0, 0))

    def test_freeing_is_not_counted_within_the_budget_either(self) -> None:
        """With something read already, a listing that fits beside it is admitted, whatever is being freed."""
        clock = Clock()
        budget = ListingBudget(1000, clock)
        budget.share("status", 1, 900, lambda: [("k", 1, 0)] * (2 * FREE_ROWS)).release()
        self.assertGreater(budget.freeing, 0)
        small = budget.charge(100)
        other = budget.charge(900)
        self.assertRaises(LimitReached, budget.charge, 1)
        small.release()
        other.release()
        drain(clock)
        self.assertEqual((budget.held, budget.freeing), (0, 0))

    def test_nothing_is_never_refused(self) -> None:
        budget = ListingBudget(100)
        big = budget.charge(5000)
        nothing = budget.charge(0)
        self.assertEqual((budget.held, budget.refused), (5000, 0))
        nothing.release()
        big.release()
        self.assertEqual(budget.held, 0)


class ListingUnitTests(SynchronousTestCase):
    """Listings served by the JESync grammar, on a L{Clock}: clients that do not read are paused by hand."""

    # (enough for the listing to take several pieces)
    KEYS = 3000

    def setUp(self) -> None:
        self.server = UnitServer()
        self.clock = self.server.clock
        self.snapshot_bytes = (self.KEYS) * ROW_BYTES
        # Room for one snapshot of the table, not two.
        self.budget = self.server.policy.listings = ListingBudget(self.snapshot_bytes * 3 // 2, self.clock)
        self.server.service.max_held = None
        self.holder = self.server.connect()
        self.keys = [b"key-%04d" % n for n in range(self.KEYS)]
        self.holder.ask(b"".join(b"lock %s 1 -1 0\n" % key for key in self.keys))
        self.listing = b"".join(b"STATUS 1 0 %s\n" % key for key in self.keys) + b"END\n"

    def not_reading(self, high_water: int = FullTransport.high_water):
        """A client that does not read: its transport pauses the connection once the first piece is written."""
        transport = FullTransport()
        transport.high_water = high_water
        return self.server.connect(transport)

    def test_shared_charged_once_then_limit_then_given_back(self) -> None:
        slow = [self.not_reading() for _ in range(5)]
        for client in slow:
            self.assertTrue(client.ask(b"status-by-key\n").startswith(b"STATUS 1 0 key-0000\n"))
        shared = self.budget.shared(("status", "key"))
        self.assertIsNotNone(shared)
        self.assertEqual((shared.readers, self.budget.held), (5, self.snapshot_bytes))
        # A client that reads gets the whole listing from the same snapshot.
        reader = self.server.connect()
        reader.send(b"status-by-key\n")
        drain(self.clock)
        self.assertEqual(reader.take(), self.listing)
        self.assertEqual((shared.readers, self.budget.held), (5, self.snapshot_bytes))
        # Once the table has changed, a listing needs a new snapshot: past the budget.
        self.holder.ask(b"lock one-more 1 -1 0\n")
        self.assertEqual(
            reader.ask(b"status-by-key\n"),
            b"INVALID_PARAMETER: max-listing-memory exceeded (%d)\n" % self.budget.limit,
        )
        self.assertEqual((self.budget.held, self.budget.refused), (self.snapshot_bytes, 1))
        # The clients that do not read go away: the snapshot is given back.
        for client in slow[:-1]:
            client.lose()
        self.assertEqual((shared.readers, self.budget.held), (1, self.snapshot_bytes))
        slow[-1].lose()
        drain(self.clock)
        self.assertEqual((shared.readers, self.budget.held), (0, 0))
        self.assertIsNone(self.budget.shared(("status", "key")))
        reader.send(b"status-by-key\n")
        drain(self.clock)
        self.assertEqual(reader.take(), self.listing[: -len(b"END\n")] + b"STATUS 1 0 one-more\nEND\n")
        self.assertEqual(self.budget.held, 0)

    def test_each_order_is_its_own_snapshot(self) -> None:
        """Orders do not share: each is a snapshot, charged; past the budget, the limit reply."""
        self.server.policy.listings = budget = ListingBudget(self.snapshot_bytes * 5 // 2, self.clock)
        by_key, by_grants = self.not_reading(), self.not_reading()
        by_key.send(b"status-by-key\n")
        by_grants.send(b"status-by-grants\n")
        self.assertEqual(budget.held, 2 * self.snapshot_bytes)
        self.assertIsNot(budget.shared(("status", "key")), budget.shared(("status", "grants")))
        self.assertEqual(
            self.not_reading().ask(b"status-by-requests\n"),
            b"INVALID_PARAMETER: max-listing-memory exceeded (%d)\n" % budget.limit,
        )
        by_key.lose()
        by_grants.lose()
        drain(self.clock)
        self.assertEqual(budget.held, 0)

    def test_one_listing_whatever_the_budget(self) -> None:
        """A table bigger than the budget can still be listed, one listing at a time."""
        self.server.policy.listings = budget = ListingBudget(1, self.clock)
        first, second = self.not_reading(), self.server.connect()
        first.send(b"status-by-key\n")
        self.assertEqual(budget.held, self.snapshot_bytes)
        self.holder.ask(b"lock one-more 1 -1 0\n")
        self.assertEqual(second.ask(b"status-by-key\n"), b"INVALID_PARAMETER: max-listing-memory exceeded (1)\n")
        first.lose()
        drain(self.clock)
        second.send(b"status-by-key\n")
        drain(self.clock)
        self.assertTrue(second.take().endswith(b"STATUS 1 0 one-more\nEND\n"))
        self.assertEqual(budget.held, 0)

    def test_dropped_for_max_unsent_gives_back(self) -> None:
        """A connection dropped with its listing unsent (here: past --max-unsent) gives its snapshot back."""
        slow = self.not_reading()
        slow.send(b"status-by-key\n")
        self.assertEqual(self.budget.held, self.snapshot_bytes)
        slow.protocol.drop("not reading")
        drain(self.clock)
        self.assertEqual(self.budget.held, 0)

    def test_listed_again_at_once(self) -> None:
        """
        A client that reads its listing and asks again at once is admitted,
        though its last snapshot is still being freed, whatever the budget.
        """
        self.patch(listings, "FREE_ROWS", self.KEYS // 4)
        self.server.policy.listings = budget = ListingBudget(1, self.clock)
        reader = self.server.connect()
        for attempt in range(4):
            self.holder.ask(b"lock again-%d 1 -1 0\n" % attempt)  # (a new snapshot each time)
            # (the last one is still being freed, and more than the budget)
            self.assertEqual(budget.freeing > 1, attempt > 0)
            reader.send(b"status-by-key\n")
            got = reader.take()
            self.assertTrue(got.startswith(b"STATUS 1 0 again-0\n"))
            # Turn by turn, until the last of the listing has gone out (not until its snapshot is freed).
            while not got.endswith(b"END\n"):
                self.clock.advance(0)
                got += reader.take()
            self.assertEqual(got.count(b"\n"), self.KEYS + attempt + 2)
            self.assertEqual((budget.held - budget.freeing, budget.refused), (0, 0))
            self.assertGreater(budget.freeing, 0)
        drain(self.clock)
        self.assertEqual((budget.held, budget.freeing), (0, 0))

    def test_small_replies_are_not_held(self) -> None:
        """
        While a client that does not read holds the whole budget, C{holders}
        of a key nobody or few hold is answered at once, charged nothing.
        """
        self.server.policy.listings = budget = ListingBudget(1, self.clock)
        slow = self.not_reading()
        slow.send(b"status-by-key\n")
        self.assertEqual(budget.held, self.snapshot_bytes)
        client = self.server.connect()
        self.assertEqual(client.ask(b"holders nobody-holds-this\n"), b"END\n")
        self.assertRegex(client.ask(b"holders key-0001\n"), rb"^HOLDER key-0001 127\.0\.0\.1:\d+ 0 0 2\nEND\n$")
        self.assertEqual((budget.held, budget.refused), (self.snapshot_bytes, 0))

    def test_large_holders_charged_until_sent(self) -> None:
        """C{holders}' lines past a piece are charged until they have gone out, and refused when the budget is spent."""
        key = b"h" * 1000
        for _ in range(20):
            self.server.connect().ask(b"lock %s 20 -1 0\n" % key)
        slow = self.not_reading(high_water=0)
        slow.send(b"holders %s\n" % key)
        line_bytes = self.budget.held
        self.assertGreater(line_bytes, 20 * (1000 + LINE_OVERHEAD))
        other = self.not_reading()
        other.send(b"status-by-key\n")
        snapshot_bytes = (self.KEYS + 1) * ROW_BYTES
        self.assertEqual(self.budget.held, line_bytes + snapshot_bytes)
        self.holder.ask(b"lock one-more 1 -1 0\n")
        reader = self.server.connect()
        self.assertEqual(
            reader.ask(b"status-by-key\n"), b"INVALID_PARAMETER: max-listing-memory exceeded (%d)\n" % self.budget.limit
        )
        rest = self.budget.charge(self.budget.limit - self.budget.held)  # (the budget spent)
        self.assertEqual(
            reader.ask(b"holders %s\n" % key),
            b"INVALID_PARAMETER: max-listing-memory exceeded (%d)\n" % self.budget.limit,
        )
        rest.release()
        slow.transport.high_water = 10**9
        slow.protocol.resumeProducing()
        drain(self.clock)
        self.assertEqual(slow.take().count(b"HOLDER %s " % key), 20)
        self.assertEqual(self.budget.held, snapshot_bytes)
        other.lose()
        drain(self.clock)
        self.assertEqual(self.budget.held, 0)

    def test_admin_listener_shares_the_budget(self) -> None:
        """The admin listener's listings are served by the same policy, so the same budget and snapshots."""
        from jesync.protocols.admin import AdminFactory

        admin = AdminFactory(self.server.service, policy=self.server.policy)
        client = self.server._connect(admin, FullTransport(), None)
        client.send(b"status-by-key\n")
        self.not_reading().send(b"status-by-key\n")
        self.assertEqual(self.budget.shared(("status", "key")).readers, 2)
        self.assertEqual(self.budget.held, self.snapshot_bytes)


    def test_small_table_and_sessions_are_not_held(self) -> None:
        """
        With the budget spent, the listing of a table too small to fill a
        piece, and the admin listener's C{sessions}, are answered at once,
        charged nothing.
        """
        from jesync.protocols.admin import AdminFactory

        server = UnitServer()
        budget = server.policy.listings = ListingBudget(1, server.clock)
        spent = budget.charge(10**6)  # (as a client that does not read its listing would)
        client = server.connect()
        client.ask(b"lock a 1 -1 0\nlock b 1 -1 0\n")
        self.assertEqual(client.ask(b"status-by-key\n"), b"STATUS 1 0 a\nSTATUS 1 0 b\nEND\n")
        admin = server._connect(AdminFactory(server.service, policy=server.policy), None, None)
        self.assertTrue(admin.ask(b"sessions\n").endswith(b"END\n"))
        self.assertEqual((budget.held, budget.refused), (10**6, 0))
        spent.release()


class KeysTests(SynchronousTestCase):
    """memcached's C{keys} (yrmcds's), text and binary: charged until sent, refused past the budget."""

    KEYS = 3000

    def setUp(self) -> None:
        from tests.memcache_messages import Unit

        self.unit = Unit()
        budget = ListingBudget(self.KEYS * REFERENCE_BYTES * 3 // 2, self.unit.clock)
        self.budget = self.unit.factory.policy.listings = budget
        self.keys = [b"key.%06d" % n for n in range(self.KEYS)]
        for key in self.keys:
            self.unit.store.store("set", key, b"v", 0, 0, None)

    def not_reading(self):
        from tests.support import UnitClient

        peer = IPv4Address("TCP", "127.0.0.1", 41000 + len(self.unit.factory.policy.connections))
        transport = FullTransport(peerAddress=peer)
        protocol = self.unit.factory.buildProtocol(peer)
        protocol.makeConnection(transport)
        return UnitClient(protocol, transport)

    def test_text(self) -> None:
        slow = self.not_reading()
        self.assertTrue(slow.ask(b"keys key.\r\n").startswith(b"VALUE key."))
        self.assertEqual(self.budget.held, self.KEYS * REFERENCE_BYTES)
        other = self.unit.connect()
        self.assertEqual(
            other.ask(b"keys\r\n"), b"SERVER_ERROR max-listing-memory exceeded (%d)\r\n" % self.budget.limit
        )
        slow.lose()
        self.assertEqual(self.budget.held, 0)
        other.send(b"keys key.00000\r\n")
        drain(self.unit.clock)
        self.assertEqual(other.take().count(b"VALUE key.00000"), 10)
        self.assertEqual(self.budget.held, 0)

    def test_binary(self) -> None:
        from tests.memcache_messages import binary, responses

        slow = self.not_reading()
        slow.send(binary(0x50, b"key.", opaque=1))
        self.assertEqual(self.budget.held, self.KEYS * REFERENCE_BYTES)
        other = self.unit.connect()
        refused = responses(other.ask(binary(0x50, b"key.", opaque=2)))
        self.assertEqual(
            refused, [(0x50, 0x86, 2, b"", b"", b"max-listing-memory exceeded (%d)" % self.budget.limit)]
        )
        slow.transport.high_water = 10**9  # (it reads at last)
        slow.protocol.resumeProducing()
        drain(self.unit.clock)
        self.assertEqual(len(responses(slow.take())), self.KEYS + 1)
        self.assertEqual(self.budget.held, 0)


    def test_refused_before_the_store_is_walked(self) -> None:
        """The budget is checked by the most a C{keys} could list (every object), before the store is walked."""
        from tests.memcache_messages import binary, responses

        slow = self.not_reading()
        slow.send(b"keys\r\n")
        walked: list[bytes] = []
        real_keys = self.unit.store.keys
        self.patch(self.unit.store, "keys", lambda prefix=b"": walked.append(prefix) or real_keys(prefix))
        other = self.unit.connect()
        refusal = b"max-listing-memory exceeded (%d)" % self.budget.limit
        self.assertEqual(other.ask(b"keys key.\r\n"), b"SERVER_ERROR " + refusal + b"\r\n")
        self.assertEqual(responses(other.ask(binary(0x50, b"key.", opaque=3))), [(0x50, 0x86, 3, b"", b"", refusal)])
        self.assertEqual((walked, self.budget.refused, self.budget.held), ([], 2, self.KEYS * REFERENCE_BYTES))
        slow.lose()
        self.assertEqual(self.budget.held, 0)

    def test_charged_what_it_lists(self) -> None:
        """
        Once walked, a C{keys} is charged what it lists, not the most it
        could have; one that lists less than a piece is written at once,
        charged nothing.
        """
        slow = self.not_reading()
        self.assertTrue(slow.ask(b"keys key.001\r\n").startswith(b"VALUE key.001"))
        self.assertEqual(self.budget.held, 1000 * REFERENCE_BYTES)
        other = self.unit.connect()
        hundred = b"".join(b"VALUE key.%06d\r\n" % n for n in range(100)) + b"END\r\n"
        self.assertEqual(other.ask(b"keys key.0000\r\n"), hundred)
        self.assertEqual(other.ask(b"keys nothing\r\n"), b"END\r\n")
        self.assertEqual((self.budget.held, self.budget.refused), (1000 * REFERENCE_BYTES, 0))
        slow.lose()
        self.assertEqual(self.budget.held, 0)

    def test_small_store_answered_with_the_budget_spent(self) -> None:
        """A store too small to fill a piece is walked first: what lists little is answered, charged nothing."""
        from tests.memcache_messages import binary, responses

        self.unit.store.flush()
        for key in self.keys[:100]:
            self.unit.store.store("set", key, b"v", 0, 0, None)
        spent = self.budget.charge(10**9)  # (as a client that does not read its listing would)
        other = self.unit.connect()
        ten = b"".join(b"VALUE key.%06d\r\n" % n for n in range(10)) + b"END\r\n"
        self.assertEqual(other.ask(b"keys key.00000\r\n"), ten)
        got = responses(other.ask(binary(0x50, b"key.00009", opaque=4)))
        self.assertEqual(
            [(opcode, status, opaque, key) for opcode, status, opaque, _, key, _ in got],
            [(0x50, 0, 4, b"key.%06d" % n) for n in range(90, 100)] + [(0x50, 0, 4, b"")],
        )
        self.assertEqual((self.budget.held, self.budget.refused), (10**9, 0))
        spent.release()


class MetricsTests(SynchronousTestCase):
    def test_bytes_held_and_refusals(self) -> None:
        """The metrics show the bytes the budget holds and the listings it refused, read at scrape time."""
        from prometheus_client import generate_latest

        from jesync.metrics import LockMetrics
        from jesync.service import LockService

        budget = ListingBudget(100)
        metrics = LockMetrics(LockService(Clock()), [], listings=budget)
        held = budget.charge(60)
        self.assertRaises(LimitReached, budget.charge, 50)
        text = generate_latest(metrics.registry).decode()
        self.assertIn("\njesync_listing_bytes 60.0\n", text)
        self.assertIn("\njesync_listing_refusals_total 1.0\n", text)
        held.release()
        self.assertIn("\njesync_listing_bytes 0.0\n", generate_latest(metrics.registry).decode())
