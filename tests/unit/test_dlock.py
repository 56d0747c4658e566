"""
The dlock listener (L{jesync.protocols.dlock}) where time is the point, and
its options: the factory on a L{Clock} over a L{StringTransport} (wait_micro,
release_micro, the idle timeout: never before their time, at most one tick
after it), the reference's reply fields (fencing tokens only to a C{Lock}
that asks), and --dlock-max-message, --dlock-max-keys, --dlock-idle-timeout
as makeService builds them.  And the server twistd builds from its options
(L{build_server}) on a L{Clock}, JESync and dlock clients on one lock table,
where a real-TCP test would wait real time: a lock that times out, a timed
grant that outlives its connection, the idle and auth timeouts.  The
messages and their parsing are L{tests.tcp.test_dlock}'s, where the
listener is spoken to over real TCP.
"""

from __future__ import annotations

from collections import Counter

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from jesync import tap
from jesync.connections.policy import ConnectionPolicy
from jesync.protocols import dlock_pb2
from jesync.protocols.dlock import DlockFactory
from jesync.server import build_server
from jesync.service import LockService
from tests.dlock_messages import (
    MAX_UINT64,
    REFERENCE_FIELDS,
    Request,
    Response,
    field_names,
    lock,
    outcome,
    parse_responses,
    ping,
    status_name,
    unlock,
)
from tests.support import TOKEN, UnitClient, connect_unit, dlock_frame, parse, write_file

# Wait timeouts and expiries fire at most one tick (10 ms) after their time, never before it.
TICK = 0.01


# -- the factory on a Clock ------------------------------------------------------


class UnitDlockClient:
    """One dlock connection to a L{UnitDlock}, driven by hand."""

    def __init__(self, protocol, transport: StringTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, *requests: Request) -> None:
        self.protocol.dataReceived(b"".join(dlock_frame(request) for request in requests))

    def send_bytes(self, data: bytes) -> None:
        """Bytes as they come, whole frames or not."""
        self.protocol.dataReceived(data)

    def take(self) -> list[Response]:
        """The responses written since the last take."""
        data = self.transport.value()
        self.transport.clear()
        return parse_responses(data)

    def ask(self, *requests: Request) -> list[Response]:
        self.send(*requests)
        return self.take()

    @property
    def closing(self) -> bool:
        return bool(self.transport.disconnecting)

    def lose(self) -> None:
        """The connection went away (as the reactor reports it)."""
        self.protocol.connectionLost(None)


class UnitDlock:
    """A lock service on a L{Clock} and a L{DlockFactory} serving it."""

    def __init__(self, dlock_idle_timeout: float | None = 60.0, **policy) -> None:
        self.clock = Clock()
        self.service = LockService(self.clock)
        self.factory = DlockFactory(self.service, policy=ConnectionPolicy(**policy), idle_timeout=dlock_idle_timeout)
        self._port = 50000

    def connect(self) -> UnitDlockClient:
        self._port += 1
        peer = IPv4Address("TCP", "127.0.0.1", self._port)
        transport = StringTransport(peerAddress=peer)
        protocol = self.factory.buildProtocol(peer)
        protocol.makeConnection(transport)
        return UnitDlockClient(protocol, transport)

    def holders(self, key: str) -> int:
        return self.service.status(key).granted


class ClockTests(SynchronousTestCase):
    """
    wait_micro, release_micro and the idle timeout on a L{Clock}: never
    before their time, and at most one L{TICK} after it (the idle timeout:
    exactly).
    """

    def test_wait_micro_times_out_then_acquire_timeout(self) -> None:
        unit = UnitDlock()
        holder, waiter = unit.connect(), unit.connect()
        self.assertEqual(outcome(holder.ask(lock(["k"]))[0]), ("Ok", 1, []))
        self.assertEqual(waiter.ask(lock(["k"], id=5, wait_micro=1_234_567, fencing_tokens=True)), [])
        unit.clock.advance(1.234566)
        self.assertEqual(waiter.take(), [])
        unit.clock.advance(TICK + 0.000001)
        (response,) = waiter.take()
        self.assertEqual(outcome(response), ("AcquireTimeout", 5, ["k"]))
        self.assertEqual(list(response.fencing_tokens), [])
        self.assertEqual(unit.factory.timeouts, 1)
        self.assertEqual(unit.service.status("k"), ("k", 1, 0))

    def test_multi_key_timeout_names_only_the_busy_keys_and_takes_nothing(self) -> None:
        unit = UnitDlock()
        holder, waiter, other = unit.connect(), unit.connect(), unit.connect()
        holder.ask(lock(["b", "d"]))
        self.assertEqual(waiter.ask(lock(["a", "b", "c", "d"], id=2, wait_micro=2_000_000)), [])
        # Nothing taken while it waits: a and c have no holder.
        self.assertEqual((unit.holders("a"), unit.holders("c")), (0, 0))
        unit.clock.advance(2)
        self.assertEqual(outcome(waiter.take()[0]), ("AcquireTimeout", 2, ["b", "d"]))
        self.assertEqual(unit.service.owned(waiter.protocol), 0)
        # The free keys are free: another client takes them at once.
        (response,) = other.ask(lock(["c", "a"], id=3, wait_micro=1, fencing_tokens=True))
        self.assertEqual(outcome(response), ("Ok", 3, []))
        self.assertEqual(len(response.fencing_tokens), 2)

    def test_a_timed_key_that_runs_out_while_switching_fails_the_lock(self) -> None:
        """
        All or nothing: a key held for a time, asked for again until
        disconnect together with a busy key, runs out while the request
        waits: the request fails naming it, and takes nothing.
        """
        unit = UnitDlock(dlock_idle_timeout=None)
        client, holder, other = unit.connect(), unit.connect(), unit.connect()
        self.assertEqual(outcome(client.ask(lock(["t"], release_micro=1_000_000))[0]), ("Ok", 1, []))
        holder.ask(lock(["busy"]))
        self.assertEqual(client.ask(lock(["t", "busy"], id=4)), [])
        unit.clock.advance(1.5)  # t ran out
        self.assertEqual(outcome(other.ask(lock(["t"], id=5))[0]), ("Ok", 5, []))
        holder.lose()  # busy is free: the request could be granted, but t is gone
        self.assertEqual(outcome(client.take()[0]), ("AcquireTimeout", 4, ["t"]))
        self.assertEqual((unit.holders("busy"), unit.service.owned(client.protocol)), (0, 0))

    def test_wait_micro_zero_waits_without_limit(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        holder, waiter = unit.connect(), unit.connect()
        (held,) = holder.ask(lock(["k"], fencing_tokens=True))
        self.assertEqual(waiter.ask(lock(["k"], id=9, wait_micro=0, fencing_tokens=True)), [])
        unit.clock.advance(10**6)
        self.assertEqual(waiter.take(), [])
        holder.lose()
        (granted,) = waiter.take()
        self.assertEqual(outcome(granted), ("Ok", 9, []))
        self.assertGreater(granted.fencing_tokens[0], held.fencing_tokens[0])

    def test_release_micro_grant_survives_the_close_and_ends_on_time(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        holder, waiter = unit.connect(), unit.connect()
        (held,) = holder.ask(lock(["k"], release_micro=5_000_000, fencing_tokens=True))
        self.assertEqual(status_name(held), "Ok")
        holder.lose()
        self.assertEqual(unit.holders("k"), 1)
        self.assertEqual(waiter.ask(lock(["k"], id=4, fencing_tokens=True)), [])
        unit.clock.advance(4.999999)
        self.assertEqual(waiter.take(), [])
        self.assertEqual(unit.holders("k"), 1)
        unit.clock.advance(TICK + 0.000001)
        (granted,) = waiter.take()
        self.assertEqual(outcome(granted), ("Ok", 4, []))
        self.assertGreater(granted.fencing_tokens[0], held.fencing_tokens[0])

    def test_release_micro_of_a_waiting_lock_counts_from_its_grant(self) -> None:
        """(The reference counted it from when it read the request: a long wait left a shorter hold, or none.)"""
        unit = UnitDlock(dlock_idle_timeout=None)
        holder, waiter = unit.connect(), unit.connect()
        holder.ask(lock(["k"]))
        self.assertEqual(waiter.ask(lock(["k"], id=2, release_micro=2_000_000)), [])
        unit.clock.advance(5)
        holder.lose()
        self.assertEqual(outcome(waiter.take()[0]), ("Ok", 2, []))
        unit.clock.advance(1.999)
        self.assertEqual(unit.holders("k"), 1)
        unit.clock.advance(TICK + 0.001)
        self.assertEqual(unit.holders("k"), 0)

    def test_release_micro_grant_ends_on_time_while_connected_too(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        holder = unit.connect()
        holder.ask(lock(["k"], release_micro=1_000))
        unit.clock.advance(0.000999)
        self.assertEqual(unit.holders("k"), 1)
        unit.clock.advance(TICK + 0.000001)
        self.assertEqual(unit.holders("k"), 0)

    def test_relock_timed_then_until_disconnect(self) -> None:
        """A re-lock takes the latest request's release_micro (0: until disconnect), and keeps its token."""
        unit = UnitDlock(dlock_idle_timeout=None)
        holder = unit.connect()
        (timed,) = holder.ask(lock(["k"], release_micro=10_000_000, fencing_tokens=True))
        (bound,) = holder.ask(lock(["k"], id=2, release_micro=0, fencing_tokens=True))
        self.assertEqual(outcome(bound), ("Ok", 2, []))
        self.assertEqual(list(bound.fencing_tokens), list(timed.fencing_tokens))
        self.assertEqual(unit.service.holders("k")[0].expires_at, None)
        unit.clock.advance(20)
        self.assertEqual(unit.holders("k"), 1)  # no longer timed
        holder.lose()
        self.assertEqual(unit.service.totals(), (0, 0, 0))

    def test_relock_until_disconnect_then_timed(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        holder = unit.connect()
        (bound,) = holder.ask(lock(["k"], fencing_tokens=True))
        (timed,) = holder.ask(lock(["k"], id=2, release_micro=3_000_000, fencing_tokens=True))
        self.assertEqual(outcome(timed), ("Ok", 2, []))
        self.assertEqual(list(timed.fencing_tokens), list(bound.fencing_tokens))
        holder.lose()
        self.assertEqual(unit.holders("k"), 1)
        unit.clock.advance(2.999999)
        self.assertEqual(unit.holders("k"), 1)
        unit.clock.advance(TICK + 0.000001)
        self.assertEqual(unit.service.totals(), (0, 0, 0))

    def test_unlock_releases_either_kind_and_only_its_own(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        client, other = unit.connect(), unit.connect()
        other.ask(lock(["theirs"]))
        client.ask(lock(["bound"]), lock(["timed"], id=2, release_micro=60_000_000))
        (response,) = client.ask(unlock(["bound", "timed", "never-held", "theirs"], id=3))
        self.assertEqual(outcome(response), ("Ok", 3, []))
        self.assertEqual([unit.holders(key) for key in ("bound", "timed", "theirs")], [0, 0, 1])
        self.assertEqual(unit.service.owned(other.protocol), 1)

    def test_the_largest_wait_micro_and_release_micro(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        holder, waiter = unit.connect(), unit.connect()
        self.assertEqual(outcome(holder.ask(lock(["k"], release_micro=MAX_UINT64))[0]), ("Ok", 1, []))
        self.assertEqual(waiter.ask(lock(["k"], id=2, wait_micro=MAX_UINT64)), [])
        holder.lose()
        unit.clock.advance(10**9)
        self.assertEqual((waiter.take(), unit.service.status("k")), ([], ("k", 1, 1)))
        holder2 = unit.connect()
        holder2.ask(unlock(["k"]))  # not its key: nothing changes
        self.assertEqual(unit.service.status("k"), ("k", 1, 1))

    def test_a_lock_that_times_out_leaves_the_keys_it_held_as_they_were(self) -> None:
        """
        All or nothing: a Lock that is not granted changes nothing, not even
        how the keys its connection already holds are held.
        """
        unit = UnitDlock(dlock_idle_timeout=None)
        client, other = unit.connect(), unit.connect()
        other.ask(lock(["busy"]))
        client.ask(lock(["mine"]))
        client.send(lock(["mine", "busy"], id=2, wait_micro=1_000, release_micro=600_000_000))
        unit.clock.advance(1)
        self.assertEqual(outcome(client.take()[0]), ("AcquireTimeout", 2, ["busy"]))
        client.lose()
        self.assertEqual(
            unit.service.status("mine"),
            ("mine", 0, 0),
            "BUG: the timed-out Lock (release_micro 600 s) still made 'mine', held until disconnect, a timed "
            "grant that outlives the connection (DlockProtocol._lock reassigns before request_many)",
        )

    def test_a_lock_refused_for_a_limit_leaves_the_keys_it_held_as_they_were(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        unit.service.max_keys = 2
        client = unit.connect()
        client.ask(lock(["mine"]))
        (response,) = client.ask(lock(["mine", "new1", "new2"], id=2, release_micro=600_000_000))
        self.assertEqual((outcome(response), response.error_text), (("General", 2, []), "max-keys exceeded (2)"))
        client.lose()
        self.assertEqual(
            unit.service.status("mine"),
            ("mine", 0, 0),
            "BUG: the refused Lock (General, max-keys; 'nothing taken') still made 'mine', held until "
            "disconnect, a timed grant that outlives the connection (DlockProtocol._lock reassigns first)",
        )

    def test_server_unix_time_is_the_clock_in_nanoseconds(self) -> None:
        unit = UnitDlock()
        unit.clock.advance(1234.5)
        (response,) = unit.connect().ask(ping())
        self.assertEqual(response.server_unix_time, 1234_500_000_000)

    def test_idle_timeout_pings_keep_it_alive(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=60)
        client = unit.connect()
        for _ in range(5):
            unit.clock.advance(59.9)
            self.assertFalse(client.closing)
            self.assertEqual(status_name(client.ask(ping())[0]), "Ok")
        unit.clock.advance(59.9)
        self.assertFalse(client.closing)
        unit.clock.advance(0.1)
        self.assertTrue(client.closing)

    def test_idle_timeout_closes_a_holder_releasing_only_its_bound_locks(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=60)
        client = unit.connect()
        client.ask(lock(["bound"]), lock(["timed"], id=2, release_micro=600_000_000))
        unit.clock.advance(59.999)
        self.assertFalse(client.closing)
        unit.clock.advance(0.001)
        self.assertTrue(client.closing)
        (last,) = client.take()
        self.assertEqual(outcome(last), ("General", 0, []))
        self.assertIn("idle-timeout", last.error_text)
        self.assertEqual((unit.holders("bound"), unit.holders("timed")), (0, 1))
        client.lose()
        self.assertEqual(unit.holders("timed"), 1)

    def test_idle_timeout_answers_the_waiting_lock(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=60)
        holder, waiter = unit.connect(), unit.connect()
        holder.ask(lock(["k"], release_micro=600_000_000))
        unit.clock.advance(1)
        self.assertEqual(waiter.ask(lock(["k"], id=77), ping(id=78)), [])
        unit.clock.advance(59.999)
        self.assertFalse(waiter.closing)
        unit.clock.advance(0.001)
        self.assertTrue(waiter.closing)
        (last,) = waiter.take()
        self.assertEqual(outcome(last), ("General", 77, []))
        self.assertEqual(last.error_text, "idle-timeout exceeded (60)")
        self.assertEqual(unit.service.status("k"), ("k", 1, 0))

    def test_a_client_that_never_completes_a_request_is_closed_at_the_auth_timeout(self) -> None:
        """
        With a token, --auth-timeout applies to dlock as to every listener: a
        client that sends a length prefix, then one byte now and then, never
        completes a request, so no token is checked; it is closed when the
        auth timeout is up, however recently it sent a byte.
        """
        unit = UnitDlock(auth_token=TOKEN, auth_timeout=1)
        client = unit.connect()
        client.protocol.dataReceived((100).to_bytes(4, "big"))
        for _ in range(3):
            unit.clock.advance(0.25)
            client.protocol.dataReceived(b"\x08")
        unit.clock.advance(0.24)  # (0.99 s)
        client.protocol.dataReceived(b"\x08")
        self.assertFalse(client.closing)
        unit.clock.advance(0.01)
        self.assertTrue(client.closing)
        (last,) = client.take()
        self.assertEqual((outcome(last), last.error_text), (("General", 0, []), "auth-timeout exceeded (1)"))
        client.lose()
        self.assertEqual(len(unit.factory.policy.connections), 0)

    def test_the_first_request_with_the_right_token_meets_the_auth_timeout(self) -> None:
        """Then neither --auth-timeout nor --idle-timeout applies: --dlock-idle-timeout does (None: never)."""
        unit = UnitDlock(dlock_idle_timeout=None, auth_token=TOKEN, auth_timeout=1, idle_timeout=1)
        client = unit.connect()
        unit.clock.advance(0.999)
        self.assertEqual(outcome(client.ask(ping(access_token=TOKEN.decode()))[0]), ("Ok", 1, []))
        unit.clock.advance(1000)
        self.assertFalse(client.closing)
        self.assertEqual(outcome(client.ask(ping(id=2, access_token=TOKEN.decode()))[0]), ("Ok", 2, []))

    def test_a_wrong_token_does_not_meet_the_auth_timeout(self) -> None:
        """It closes the connection at once, answered with its request's id."""
        unit = UnitDlock(auth_token=TOKEN, auth_timeout=1)
        client = unit.connect()
        (last,) = client.ask(lock(["k"], id=7, access_token="wrong"))
        self.assertEqual((outcome(last), last.error_text), (("General", 7, []), "access token refused"))
        self.assertTrue(client.closing)
        self.assertEqual(unit.holders("k"), 0)

    def test_the_idle_timeout_starts_once_authenticated(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=60, auth_token=TOKEN, auth_timeout=10)
        client = unit.connect()
        unit.clock.advance(5)
        client.ask(lock(["k"], access_token=TOKEN.decode()))
        unit.clock.advance(59.999)
        self.assertFalse(client.closing)
        unit.clock.advance(0.001)
        self.assertTrue(client.closing)
        self.assertIn("idle-timeout exceeded (60)", client.take()[0].error_text)

    def test_half_close_answers_the_waiting_lock_and_what_follows(self) -> None:
        """
        A FIN while a Lock waits ends the wait with the protocol's not-granted
        reply (AcquireTimeout, docs/protocols/index.md "Half-close"), and the requests
        behind it are answered in order; then the connection closes.
        """
        unit = UnitDlock()
        holder, client = unit.connect(), unit.connect()
        holder.ask(lock(["k"]))
        self.assertEqual(client.ask(lock(["k"], id=5), ping(id=6)), [])
        client.protocol.readConnectionLost()
        unit.clock.advance(0)
        responses = [(status_name(response), response.request_id) for response in client.take()]
        self.assertEqual(
            responses,
            [("AcquireTimeout", 5), ("Ok", 6)],
            "BUG: after a FIN the waiting dlock Lock gets no AcquireTimeout "
            "(DlockProtocol._not_granted drops CancelledError), so the peer gets the Ping's answer "
            "with no answer to the Lock before it",
        )
        self.assertTrue(client.closing)

    def test_after_half_close_a_lock_that_would_wait_names_its_busy_keys(self) -> None:
        unit = UnitDlock()
        holder, client = unit.connect(), unit.connect()
        holder.ask(lock(["busy"]))
        # The second Lock is read after the FIN: it may not wait.
        client.send(lock(["busy"], id=1), lock(["free", "busy"], id=2))
        client.protocol.readConnectionLost()
        unit.clock.advance(0)
        responses = client.take()
        # (the keys in the way, not the request's first key)
        self.assertEqual(outcome(responses[-1]), ("AcquireTimeout", 2, ["busy"]))
        self.assertEqual(unit.holders("free"), 0)

    def test_requests_counted_by_type(self) -> None:
        unit = UnitDlock()
        holder, client = unit.connect(), unit.connect()
        holder.ask(lock(["k"]))
        client.ask(ping(), ping(id=2), unlock(["x"], id=3), Request(id=4, type=7), Request(id=5, type=dlock_pb2.Invalid))
        client.ask(lock(["k"], id=6, wait_micro=10))
        unit.clock.advance(1)
        client.protocol.dataReceived(b"\x00\x00\x00\x01\x0f")
        self.assertEqual(unit.factory.requests, Counter(ping=2, lock=2, unlock=1, invalid=2, malformed=1))
        self.assertEqual(unit.factory.timeouts, 1)


class ReplyFieldsTests(SynchronousTestCase):
    """
    Fencing tokens go only to a C{Lock} that asks for them (its
    C{fencing_tokens}, a field the reference's clients never set); every
    other response is made of the reference's fields only, so a client of the
    reference reads a response of the reference's size.
    """

    def test_only_a_granted_lock_that_asks_gets_tokens(self) -> None:
        unit = UnitDlock(dlock_idle_timeout=None)
        unit.factory.max_keys = 2
        holder, client = unit.connect(), unit.connect()
        holder.ask(lock(["busy"]))
        client.send(
            ping(id=1),
            lock(["a", "b"], id=2),
            lock(["a", "c"], id=3, fencing_tokens=True),
            lock(["busy"], id=4, wait_micro=1, fencing_tokens=True),
            unlock(["a"], id=5),
            lock([], id=6, fencing_tokens=True),
            lock(["x", "y", "z"], id=7, fencing_tokens=True),
            lock(["d"], id=8, version=9, fencing_tokens=True),
            Request(version=2, id=9, type=7),
            lock(["e"], id=10, release_micro=60_000_000),
            lock(["e", "c"], id=11, release_micro=60_000_000, fencing_tokens=True),
            lock(["e"], id=12),
        )
        unit.clock.advance(1)
        responses = client.take()
        self.assertEqual(
            [(status_name(response), response.request_id) for response in responses],
            [
                ("Ok", 1),
                ("Ok", 2),
                ("Ok", 3),
                ("AcquireTimeout", 4),
                ("Ok", 5),
                ("General", 6),
                ("TooManyKeys", 7),
                ("Version", 8),
                ("InvalidType", 9),
                ("Ok", 10),
                ("Ok", 11),
                ("Ok", 12),
            ],
        )
        with_tokens = {r.request_id: list(r.fencing_tokens) for r in responses if r.fencing_tokens}
        self.assertEqual(sorted(with_tokens), [3, 11])
        self.assertEqual(len(with_tokens[3]), 2)
        # e, taken by request 10, and c, held since request 3 (its token kept).
        self.assertEqual(with_tokens[11][1], with_tokens[3][1])
        self.assertEqual([grant.token for grant in unit.service.holders("e")], [with_tokens[11][0]])
        for response in responses:
            if response.request_id not in with_tokens:
                self.assertLessEqual(field_names(response), REFERENCE_FIELDS, response)

    def test_a_lock_that_does_not_ask_is_answered_the_references_bytes(self) -> None:
        """Whatever the number of keys: version, request_id and server_unix_time, nothing more."""
        unit = UnitDlock(dlock_idle_timeout=None)
        client = unit.connect()
        for id, count in ((0, 1), (1, 200), (2, 1000)):
            client.send(lock([f"k{n}" for n in range(count)], id=id))
            data = client.transport.value()
            client.transport.clear()
            (response,) = parse_responses(data)
            reference = Response(version=2, request_id=id, server_unix_time=response.server_unix_time)
            self.assertEqual(data, dlock_frame(reference))
            self.assertLessEqual(len(data), 4 + 20)


class OptionsTests(SynchronousTestCase):
    """The dlock options, as far as the service makeService builds."""

    def dlock_factory(self, *argv: str) -> DlockFactory:
        server = tap.makeService(parse("--dlock-port", "tcp:0", *argv))
        factory = server.factories["dlock"]
        self.assertIsInstance(factory, DlockFactory)
        return factory

    def test_defaults(self) -> None:
        factory = self.dlock_factory()
        self.assertEqual((factory.max_message, factory.max_keys, factory.idle_timeout), (16384, 1000, 60.0))
        self.assertIsNone(factory.policy.auth_token)
        self.assertIsNone(tap.makeService(parse()).factories["dlock"])

    def test_given(self) -> None:
        factory = self.dlock_factory(
            "--dlock-max-message", "100", "--dlock-max-keys", "5", "--dlock-idle-timeout", "2.5", "--idle-timeout", "9"
        )
        self.assertEqual((factory.max_message, factory.max_keys, factory.idle_timeout), (100, 5, 2.5))
        self.assertEqual(factory.policy.idle_timeout, 9)  # (JESync's and elock's)
        self.assertIsNone(self.dlock_factory("--dlock-idle-timeout", "0").idle_timeout)

    def test_bad_values(self) -> None:
        for argv in (["--dlock-max-message", "3"], ["--dlock-max-keys", "0"], ["--dlock-idle-timeout", "-1"]):
            with self.assertRaises(usage.UsageError, msg=argv):
                parse("--dlock-port", "tcp:0", *argv)


# -- the server twistd builds, on a Clock ----------------------------------------------


class BuiltServer:
    """
    C{twistd jesync}'s server as L{build_server} makes it from these options
    (and C{--dlock-port}), on a L{Clock}: its own factories, served over
    StringTransport (nothing listens), to JESync and dlock connections from
    127.0.0.1 ports of their own.  What the TCP tests of
    L{tests.tcp.test_dlock} wait for in real time, it advances.
    """

    def __init__(self, *argv: str) -> None:
        self.clock = Clock()
        options = parse("--dlock-port", "tcp:0:interface=127.0.0.1", *argv)
        self.server = build_server(self.clock, tap.settings_from(options))
        self.factories = self.server.factories
        self._port = 50000

    def _peer(self) -> IPv4Address:
        self._port += 1
        return IPv4Address("TCP", "127.0.0.1", self._port)

    def dlock(self) -> UnitDlockClient:
        client = connect_unit(self.factories["dlock"], self._peer())
        return UnitDlockClient(client.protocol, client.transport)

    def jesync(self) -> UnitClient:
        return connect_unit(self.factories["jesync"], self._peer())


class BuiltServerTestCase(SynchronousTestCase):
    """The assertions of L{tests.tcp.test_dlock.DlockTestCase}, over StringTransport."""

    def assertStatus(self, jesync: UnitClient, key: bytes, granted: int, waiting: int) -> None:
        """JESync's C{status key} says so."""
        self.assertEqual(jesync.ask(b"status %s\n" % key), b"STATUS %d %d %s\n" % (granted, waiting, key))

    def assertClosedWith(self, client: UnitDlockClient, expected: tuple) -> Response:
        """
        C{client} is being closed (cleanly: not aborted), having been sent one
        last response (checked against C{expected}, an outcome).
        """
        self.assertTrue(client.closing)
        self.assertFalse(client.transport.disconnected)  # (abortConnection sets it)
        responses = client.take()
        self.assertEqual([outcome(response) for response in responses], [expected])
        return responses[0]


class OrderTests(BuiltServerTestCase):
    def test_a_ping_behind_a_lock_that_times_out(self):
        server = BuiltServer()
        holder = server.dlock()
        client = server.dlock()
        holder.ask(lock(["k"]))
        sent = int(server.clock.seconds() * 10**9)
        self.assertEqual(client.ask(lock(["k"], id=20, wait_micro=200_000, fencing_tokens=True), ping(id=21)), [])
        server.clock.advance(0.2 + TICK)
        responses = client.take()
        self.assertEqual([outcome(r) for r in responses], [("AcquireTimeout", 20, ["k"]), ("Ok", 21, [])])
        self.assertEqual((responses[0].error_text, list(responses[0].fencing_tokens)), ("", []))
        # The Ping was answered once the Lock's wait was over, not when it arrived.
        self.assertGreaterEqual(responses[1].server_unix_time - sent, 150_000_000)
        self.assertEqual(server.factories["dlock"].timeouts, 1)


class LockTests(BuiltServerTestCase):
    def test_all_or_nothing_across_protocols(self):
        """
        A JESync holder of K: a dlock Lock of [L, K, M] takes nothing (L and M
        have no holder; as documented, it keeps its place in their queues
        while it waits), times out naming K only, and then L and M are free:
        a JESync waiter queued behind it for L gets L at once.
        """
        server = BuiltServer()
        jesync, other = server.jesync(), server.jesync()
        client = server.dlock()
        self.assertEqual(jesync.ask(b"lock K\n"), b"GRANTED 1 0 K 120\n")
        self.assertEqual(client.ask(lock(["L", "K", "M"], id=1, wait_micro=500_000, fencing_tokens=True)), [])
        self.assertStatus(other, b"L", 0, 1)
        self.assertStatus(other, b"K", 1, 1)
        other.send(b"lock L 1 5\n")
        self.assertEqual(other.take(), b"")
        server.clock.advance(0.5 + TICK)
        [response] = client.take()
        self.assertEqual(outcome(response), ("AcquireTimeout", 1, ["K"]))
        self.assertEqual(list(response.fencing_tokens), [])
        self.assertEqual(other.take(), b"GRANTED 1 0 L 120\n")
        self.assertStatus(other, b"M", 0, 0)
        self.assertStatus(other, b"K", 1, 0)

    def test_release_micro_grant_outlives_its_connection(self):
        server = BuiltServer()
        jesync = server.jesync()
        holder = server.dlock()
        granted_at = server.clock.seconds()
        [granted] = holder.ask(lock(["k"], release_micro=500_000))
        self.assertEqual(outcome(granted), ("Ok", 1, []))
        holder.lose()
        self.assertStatus(jesync, b"k", 1, 0)
        holders = jesync.ask(b"holders k\n")
        self.assertRegex(holders, rb"^HOLDER k 127\.0\.0\.1:\d+\(timed\) 0 0 \d+\nEND\n$")
        waiter = server.dlock()
        self.assertEqual(waiter.ask(lock(["k"], id=2, wait_micro=5_000_000)), [])
        server.clock.advance(0.45)
        self.assertEqual(waiter.take(), [])
        server.clock.advance(0.05 + TICK)
        [granted] = waiter.take()
        self.assertEqual(outcome(granted), ("Ok", 2, []))
        self.assertGreaterEqual(server.clock.seconds() - granted_at, 0.45)

    def test_relock_switches_between_timed_and_until_disconnect(self):
        server = BuiltServer()
        jesync = server.jesync()
        # Timed, then until disconnect: the close frees it.
        client = server.dlock()
        [timed] = client.ask(lock(["k"], release_micro=60_000_000, fencing_tokens=True))
        [bound] = client.ask(lock(["k"], id=2, fencing_tokens=True))
        self.assertEqual(outcome(bound), ("Ok", 2, []))
        self.assertEqual(list(bound.fencing_tokens), list(timed.fencing_tokens))
        client.lose()
        self.assertStatus(jesync, b"k", 0, 0)
        # Until disconnect, then timed: it outlives the close, until its time runs out.
        client = server.dlock()
        [bound] = client.ask(lock(["k"], fencing_tokens=True))
        [timed] = client.ask(lock(["k"], id=2, release_micro=500_000, fencing_tokens=True))
        self.assertEqual(list(timed.fencing_tokens), list(bound.fencing_tokens))
        client.lose()
        self.assertEqual(jesync.ask(b"lock k 1 0\n"), b"TIMEOUT 1 0 k\n")
        self.assertEqual(jesync.ask(b"lock k 1 5\n"), b"")
        server.clock.advance(0.5 + TICK)
        self.assertEqual(jesync.take(), b"GRANTED 1 0 k 120\n")


class AccessTokenTests(BuiltServerTestCase):
    def test_a_trickling_client_without_the_token_is_closed_after_the_auth_timeout(self):
        """
        Connections that send a length prefix, then a byte now and then,
        never complete a request: they are closed after --auth-timeout and
        give back their connection slots; one that sent a request with the
        token is not closed.
        """
        path = write_file(self, TOKEN + b"\n")
        server = BuiltServer("--auth-token-file", path, "--auth-timeout", "1", "--max-connections", "3")
        good = server.dlock()
        [pong] = good.ask(ping(id=9, access_token=TOKEN.decode()))
        self.assertEqual(outcome(pong), ("Ok", 9, []))
        trickling = [server.dlock() for _ in range(2)]
        full = server.jesync()
        self.assertEqual(full.take(), b"INVALID_PARAMETER: max-connections exceeded (3)\n")
        full.lose()
        for client in trickling:
            client.send_bytes((1000).to_bytes(4, "big"))
        # A byte every 0.2 s, from each client not yet being closed.
        for _ in range(25):
            if all(client.closing for client in trickling):
                break
            server.clock.advance(0.2)
            for client in trickling:
                if not client.closing:
                    client.send_bytes(b"\x08")
        for client in trickling:
            last = self.assertClosedWith(client, ("General", 0, []))
            self.assertEqual(last.error_text, "auth-timeout exceeded (1)")
            client.lose()
        # Their slots are free: a JESync client connects and is served.
        jesync = server.jesync()
        self.assertEqual(jesync.ask(b"auth %s\nstatus k\n" % TOKEN), b"OK\nSTATUS 0 0 k\n")
        self.assertFalse(good.closing)
        [pong] = good.ask(ping(id=10, access_token=TOKEN.decode()))
        self.assertEqual(outcome(pong), ("Ok", 10, []))


class IdleTimeoutTests(BuiltServerTestCase):
    """--dlock-idle-timeout (and --idle-timeout), as build_server makes them from the options."""

    def test_a_silent_holder_is_closed_and_its_bound_locks_released(self):
        server = BuiltServer("--dlock-idle-timeout", "0.5")
        jesync = server.jesync()
        client = server.dlock()
        client.ask(lock(["bound"]), lock(["timed"], id=2, release_micro=60_000_000))
        server.clock.advance(0.5)
        last = self.assertClosedWith(client, ("General", 0, []))
        self.assertEqual(last.error_text, "idle-timeout exceeded (0.5)")
        client.lose()
        self.assertStatus(jesync, b"bound", 0, 0)
        self.assertStatus(jesync, b"timed", 1, 0)

    def test_a_waiting_lock_is_answered_before_the_close(self):
        server = BuiltServer("--dlock-idle-timeout", "0.5")
        jesync = server.jesync()
        self.assertEqual(jesync.ask(b"lock k\n"), b"GRANTED 1 0 k 120\n")
        client = server.dlock()
        client.send(lock(["k"], id=31), ping(id=32))
        server.clock.advance(0.5)
        last = self.assertClosedWith(client, ("General", 31, []))
        self.assertIn("idle-timeout", last.error_text)
        client.lose()
        self.assertStatus(jesync, b"k", 1, 0)

    def test_the_general_idle_timeout_does_not_govern_dlock(self):
        server = BuiltServer("--idle-timeout", "0.2", "--dlock-idle-timeout", "0")
        client = server.dlock()
        jesync = server.jesync()
        server.clock.advance(0.2)
        self.assertTrue(jesync.closing)
        self.assertFalse(jesync.transport.disconnected)  # (closed, not aborted)
        self.assertEqual(jesync.take(), b"INVALID_PARAMETER: idle-timeout exceeded (0.2)\n")
        self.assertFalse(client.closing)
        [pong] = client.ask(ping(id=3))
        self.assertEqual(outcome(pong), ("Ok", 3, []))
