"""
The dlock listener (L{jesync.protocols.dlock}): length-prefixed protocol
buffers (L{jesync.protocols.dlock_pb2}), requests answered in request order,
all-or-nothing multi-key locks held until disconnect or for a time, fencing
tokens, and the operating options (--dlock-port, --dlock-max-message,
--dlock-max-keys, --dlock-idle-timeout, the shared --auth-token-file and
--max-key-length).

Most tests run C{twistd jesync}'s service in this process
(L{tests.tcp.test_operations.Server}, started with C{dlock=True}) and talk to it
over real TCP with L{tests.support.DlockClient}, alongside JESync and elock
clients on the same lock table.  Where time is the point (wait_micro,
release_micro, the idle timeout) the factory runs on a L{Clock} over a
L{StringTransport} instead.

Nothing sleeps: every step waits for a response, a close, or the server
having read what was sent, with a bounded timeout.
"""

from __future__ import annotations

import random
import socket
import time
import warnings
from collections import Counter

from google.protobuf.message import DecodeError
from twisted.internet import reactor, task
from twisted.internet.address import IPv4Address
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase

from jesync import tap
from jesync.connections.policy import ConnectionPolicy
from jesync.protocols import dlock_pb2
from jesync.protocols.dlock import DlockFactory
from jesync.metrics_connections import CountedFactory
from jesync.service import LockService
from tests.process import test_twistd
from tests.servers import free_port, start_server
from tests.support import TIMEOUT, DlockClient, dlock_frame
from tests.tcp.test_operations import TOKEN, Server, ServerTestCase, listening_port, write_file

Request = dlock_pb2.Request
Response = dlock_pb2.Response
RequestLock = dlock_pb2.RequestLock

MAX_UINT64 = 2**64 - 1
#: The fields the reference server's responses carry (temoto/dlock,
#: dlock-server/handler.go): everything but jesync's fencing_tokens.
REFERENCE_FIELDS = {"version", "request_id", "status", "error_text", "keys", "server_unix_time"}
SECOND_NS = 10**9
# Wait timeouts and expiries fire at most one tick (10 ms) after their time, never before it.
TICK = 0.01


# -- messages ---------------------------------------------------------------------


def ping(id: int = 1, **fields) -> Request:
    fields.setdefault("version", 2)
    return Request(id=id, type=dlock_pb2.Ping, **fields)


def lock(
    keys, id: int = 1, wait_micro: int = 0, release_micro: int = 0, fencing_tokens: bool = False, **fields
) -> Request:
    """
    A Lock request (C{wait_micro} 0: wait without limit; C{release_micro} 0:
    held until disconnect; C{fencing_tokens}: ask for the keys' tokens, which
    the reference's clients never do).
    """
    fields.setdefault("version", 2)
    body = RequestLock(
        keys=list(keys), wait_micro=wait_micro, release_micro=release_micro, fencing_tokens=fencing_tokens
    )
    return Request(id=id, type=dlock_pb2.Lock, lock=body, **fields)


def unlock(keys, id: int = 1, **fields) -> Request:
    fields.setdefault("version", 2)
    return Request(id=id, type=dlock_pb2.Unlock, lock=RequestLock(keys=list(keys)), **fields)


def status_name(response: Response) -> str:
    return dlock_pb2.ResponseStatus.Name(response.status)


def outcome(response: Response) -> tuple:
    """What a test compares first: (status, request_id, keys)."""
    return (status_name(response), response.request_id, list(response.keys))


def parse_responses(data: bytes) -> list[Response]:
    """Every response in C{data}, which must be whole frames."""
    responses = []
    while data:
        assert len(data) >= 4, data
        end = 4 + int.from_bytes(data[:4], "big")
        assert len(data) >= end, data
        responses.append(Response.FromString(data[4:end]))
        data = data[end:]
    return responses


def junk() -> bytes:
    """Random bytes (always the same) that are no Request."""
    for seed in range(100):
        data = random.Random(seed).randbytes(64)
        try:
            Request.FromString(data)
        except DecodeError:
            return data
    raise AssertionError("every random string parsed")


def dlock_frame_of(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def sized_ping(size: int) -> bytes:
    """A framed Ping whose body is exactly C{size} bytes (padded with its access token)."""
    for padding in range(max(0, size - 32), size):
        body = ping(id=7, access_token="x" * padding).SerializeToString()
        if len(body) == size:
            return len(body).to_bytes(4, "big") + body
    raise AssertionError(f"no ping of {size} bytes")


# -- unit: the factory on a Clock -------------------------------------------------


class UnitDlockClient:
    """One dlock connection to a L{UnitDlock}, driven by hand."""

    def __init__(self, protocol, transport: StringTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, *requests: Request) -> None:
        self.protocol.dataReceived(b"".join(dlock_frame(request) for request in requests))

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


def field_names(response: Response) -> set:
    """The fields set in C{response} (a field at its default, as proto3 sends it, is not)."""
    return {field.name for field, _ in response.ListFields()}


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
        server = tap.makeService(test_twistd.parse("--dlock-port", "tcp:0", *argv))
        factory = server.factories["dlock"]
        self.assertIsInstance(factory, DlockFactory)
        return factory

    def test_defaults(self) -> None:
        factory = self.dlock_factory()
        self.assertEqual((factory.max_message, factory.max_keys, factory.idle_timeout), (16384, 1000, 60.0))
        self.assertIsNone(factory.policy.auth_token)
        self.assertIsNone(tap.makeService(test_twistd.parse()).factories["dlock"])

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
                test_twistd.parse("--dlock-port", "tcp:0", *argv)


# -- integration: real TCP ------------------------------------------------------------


class DlockTestCase(ServerTestCase):
    timeout = 20

    def start(self, *argv: str, elock: bool = False):
        return Server.start(self, *argv, elock=elock, dlock=True)

    @inlineCallbacks
    def assertStatus(self, jesync, key: bytes, granted: int, waiting: int):
        """JESync's C{status key} says so."""
        self.assertEqual((yield jesync.ask(b"status %s\n" % key)), b"STATUS %d %d %s\n" % (granted, waiting, key))

    @inlineCallbacks
    def assertClosedWith(self, client: DlockClient, expected: tuple) -> Response:
        """C{client} is closed, having been sent one last response (checked against C{expected}, an outcome)."""
        reason = yield client.wait_closed()
        self.assertIsInstance(reason, ConnectionDone)
        responses = client.unread()
        self.assertEqual([outcome(response) for response in responses], [expected])
        return responses[0]

    def release_timed(self, server: Server, key: str) -> None:
        """Let go of a grant with release_micro (it outlives its connection), for the cleanup's check."""
        for grant in server.locks.holders(key):
            grant.release()


class FramingTests(DlockTestCase):
    @inlineCallbacks
    def test_ping_echoes_ids_with_version_2_and_the_time_in_nanoseconds(self):
        server = yield self.start()
        client = yield server.dlock()
        before = time.time_ns()
        responses = yield client.ask(ping(id=0), ping(id=1), ping(id=MAX_UINT64), ping(id=42, version=0))
        after = time.time_ns()
        self.assertEqual([outcome(r) for r in responses], [("Ok", i, []) for i in (0, 1, MAX_UINT64, 42)])
        for response in responses:
            self.assertEqual((response.version, response.error_text, list(response.fencing_tokens)), (2, "", []))
            self.assertGreater(response.server_unix_time, before - 5 * SECOND_NS)
            self.assertLess(response.server_unix_time, after + 5 * SECOND_NS)

    @inlineCallbacks
    def test_a_request_in_pieces_and_requests_in_one_write(self):
        server = yield self.start()
        client = yield server.dlock()
        frame = dlock_frame(ping(id=3))
        for piece in (frame[:2], frame[2:5], frame[5:-1]):
            yield server.send(client, piece)
        self.assertEqual(client.unread(), [])
        client.send(frame[-1:])
        self.assertEqual(outcome((yield client.read_line())), ("Ok", 3, []))
        responses = yield client.ask(lock(["a"], id=4), unlock(["a"], id=5), ping(id=6))
        self.assertEqual([outcome(r) for r in responses], [("Ok", 4, []), ("Ok", 5, []), ("Ok", 6, [])])

    @inlineCallbacks
    def test_a_message_over_max_message_closes_only_its_connection(self):
        server = yield self.start()
        holder = yield server.dlock()
        jesync = yield server.jesync()
        self.assertEqual(status_name((yield holder.ask(lock(["held"])))), "Ok")
        self.assertEqual((yield jesync.ask(b"lock mine\n")), b"GRANTED 1 0 mine 120\n")
        # At the limit (16 KiB): served.
        client = yield server.dlock()
        client.send(sized_ping(16384))
        self.assertEqual(outcome((yield client.read_line())), ("Ok", 7, []))
        # One byte over: the length alone is enough.
        client.send((16385).to_bytes(4, "big") + b"\x08")
        last = yield self.assertClosedWith(client, ("General", 0, []))
        self.assertIn("16384", last.error_text)
        yield server.wait_lost(client)
        # Nothing else is lost, and the server serves on.
        yield self.assertStatus(jesync, b"held", 1, 0)
        yield self.assertStatus(jesync, b"mine", 1, 0)
        self.assertEqual(outcome((yield holder.ask(ping(id=8)))), ("Ok", 8, []))
        fresh = yield server.dlock()
        self.assertEqual(outcome((yield fresh.ask(lock(["held"], id=9, wait_micro=1)))), ("AcquireTimeout", 9, ["held"]))

    @inlineCallbacks
    def test_max_message_option(self):
        server = yield self.start("--dlock-max-message", "64")
        client = yield server.dlock()
        client.send(sized_ping(64))
        self.assertEqual(outcome((yield client.read_line())), ("Ok", 7, []))
        client.send(sized_ping(65))
        last = yield self.assertClosedWith(client, ("General", 0, []))
        self.assertIn("64", last.error_text)

    @inlineCallbacks
    def test_a_malformed_body_is_answered_then_closes_only_its_connection(self):
        server = yield self.start()
        holder = yield server.dlock()
        jesync = yield server.jesync()
        yield holder.ask(lock(["held"]))
        client = yield server.dlock()
        self.assertEqual(outcome((yield client.ask(ping(id=1)))), ("Ok", 1, []))
        client.send(dlock_frame_of(junk()))
        last = yield self.assertClosedWith(client, ("General", 0, []))
        self.assertTrue(last.error_text.startswith("malformed request"), last.error_text)
        yield server.wait_lost(client)
        yield self.assertStatus(jesync, b"held", 1, 0)
        self.assertEqual(outcome((yield holder.ask(ping(id=2)))), ("Ok", 2, []))
        self.assertEqual(server.factories["dlock"].requests["malformed"], 1)

    @inlineCallbacks
    def test_an_empty_body_is_a_request_of_type_0(self):
        server = yield self.start()
        client = yield server.dlock()
        client.send(b"\x00\x00\x00\x00")
        response = yield client.read_line()
        self.assertEqual(outcome(response), ("InvalidType", 0, []))
        self.assertEqual(response.version, 2)
        # The connection goes on.
        self.assertEqual(outcome((yield client.ask(ping(id=2)))), ("Ok", 2, []))


class OrderTests(DlockTestCase):
    @inlineCallbacks
    def test_a_ping_behind_a_waiting_lock_waits_its_turn(self):
        server = yield self.start()
        holder = yield server.dlock()
        client = yield server.dlock()
        yield holder.ask(lock(["k"]))
        # Both arrive together; the server has read them before the holder lets go.
        yield server.send(client, dlock_frame(lock(["k"], id=10, fencing_tokens=True)) + dlock_frame(ping(id=11)))
        self.assertEqual(outcome((yield holder.ask(unlock(["k"], id=1)))), ("Ok", 1, []))
        responses = yield client.read_lines(2)
        self.assertEqual([outcome(r) for r in responses], [("Ok", 10, []), ("Ok", 11, [])])
        self.assertEqual(len(responses[0].fencing_tokens), 1)

    @inlineCallbacks
    def test_a_ping_behind_a_lock_that_times_out(self):
        server = yield self.start()
        holder = yield server.dlock()
        client = yield server.dlock()
        yield holder.ask(lock(["k"]))
        sent = time.time_ns()
        responses = yield client.ask(lock(["k"], id=20, wait_micro=200_000, fencing_tokens=True), ping(id=21))
        self.assertEqual([outcome(r) for r in responses], [("AcquireTimeout", 20, ["k"]), ("Ok", 21, [])])
        self.assertEqual((responses[0].error_text, list(responses[0].fencing_tokens)), ("", []))
        # The Ping was answered once the Lock's wait was over, not when it arrived.
        self.assertGreaterEqual(responses[1].server_unix_time - sent, 150_000_000)
        self.assertEqual(server.factories["dlock"].timeouts, 1)


class LockTests(DlockTestCase):
    @inlineCallbacks
    def test_all_or_nothing_across_protocols(self):
        """
        A JESync holder of K: a dlock Lock of [L, K, M] takes nothing (L and M
        have no holder; as documented, it keeps its place in their queues
        while it waits), times out naming K only, and then L and M are free:
        a JESync waiter queued behind it for L gets L at once.
        """
        server = yield self.start()
        jesync, other = yield server.connect_many(2)
        client = yield server.dlock()
        self.assertEqual((yield jesync.ask(b"lock K\n")), b"GRANTED 1 0 K 120\n")
        yield server.send(client, dlock_frame(lock(["L", "K", "M"], id=1, wait_micro=500_000, fencing_tokens=True)))
        yield self.assertStatus(other, b"L", 0, 1)
        yield self.assertStatus(other, b"K", 1, 1)
        other.send(b"lock L 1 5\n")
        response = yield client.read_line()
        self.assertEqual(outcome(response), ("AcquireTimeout", 1, ["K"]))
        self.assertEqual(list(response.fencing_tokens), [])
        self.assertEqual((yield other.read_line()), b"GRANTED 1 0 L 120\n")
        yield self.assertStatus(other, b"M", 0, 0)
        yield self.assertStatus(other, b"K", 1, 0)

    @inlineCallbacks
    def test_wait_micro_0_is_granted_when_the_holder_disconnects(self):
        server = yield self.start()
        holder = yield server.dlock()
        client = yield server.dlock()
        first = yield holder.ask(lock(["k", "j"], fencing_tokens=True))
        yield server.send(client, dlock_frame(lock(["j"], id=3, wait_micro=0, fencing_tokens=True)))
        yield server.drop(holder)
        granted = yield client.read_line()
        self.assertEqual(outcome(granted), ("Ok", 3, []))
        self.assertGreater(granted.fencing_tokens[0], max(first.fencing_tokens))

    @inlineCallbacks
    def test_release_micro_grant_outlives_its_connection(self):
        server = yield self.start()
        jesync = yield server.jesync()
        holder = yield server.dlock()
        granted_at = time.monotonic()
        self.assertEqual(outcome((yield holder.ask(lock(["k"], release_micro=500_000)))), ("Ok", 1, []))
        yield server.drop(holder)
        yield self.assertStatus(jesync, b"k", 1, 0)
        holders = yield jesync.ask(b"holders k\n", 2)
        self.assertRegex(holders, rb"^HOLDER k 127\.0\.0\.1:\d+\(timed\) 0 0 \d+\nEND\n$")
        waiter = yield server.dlock()
        self.assertEqual(outcome((yield waiter.ask(lock(["k"], id=2, wait_micro=5_000_000)))), ("Ok", 2, []))
        self.assertGreaterEqual(time.monotonic() - granted_at, 0.45)

    @inlineCallbacks
    def test_relock_switches_between_timed_and_until_disconnect(self):
        server = yield self.start()
        jesync = yield server.jesync()
        # Timed, then until disconnect: the close frees it.
        client = yield server.dlock()
        timed = yield client.ask(lock(["k"], release_micro=60_000_000, fencing_tokens=True))
        bound = yield client.ask(lock(["k"], id=2, fencing_tokens=True))
        self.assertEqual(outcome(bound), ("Ok", 2, []))
        self.assertEqual(list(bound.fencing_tokens), list(timed.fencing_tokens))
        yield server.drop(client)
        yield self.assertStatus(jesync, b"k", 0, 0)
        # Until disconnect, then timed: it outlives the close, until its time runs out.
        client = yield server.dlock()
        bound = yield client.ask(lock(["k"], fencing_tokens=True))
        timed = yield client.ask(lock(["k"], id=2, release_micro=500_000, fencing_tokens=True))
        self.assertEqual(list(timed.fencing_tokens), list(bound.fencing_tokens))
        yield server.drop(client)
        self.assertEqual((yield jesync.ask(b"lock k 1 0\n")), b"TIMEOUT 1 0 k\n")
        self.assertEqual((yield jesync.ask(b"lock k 1 5\n")), b"GRANTED 1 0 k 120\n")

    @inlineCallbacks
    def test_keys_refused(self):
        server = yield self.start("--max-key-length", "8", "--dlock-max-keys", "3")
        jesync = yield server.jesync()
        client = yield server.dlock()
        bad = [[], [""], ["a b"], ["a\tb"], ["a\x00b"], ["a\nb"], ["a\u2028b"], ["123456789"], ["é" * 5]]
        for number, keys in enumerate(bad, 1):
            response = yield client.ask(lock(keys, id=number))
            self.assertEqual(outcome(response), ("General", number, []), keys)
            self.assertNotEqual(response.error_text, "", keys)
        response = yield client.ask(lock(["a", "b", "c", "d"], id=20))
        self.assertEqual(outcome(response), ("TooManyKeys", 20, []))
        # Refused means nothing taken, even the good keys.
        self.assertEqual(outcome((yield client.ask(lock(["good", "a b"], id=21)))), ("General", 21, []))
        yield self.assertStatus(jesync, b"good", 0, 0)
        # Three distinct keys (one given twice), and keys of 8 bytes, are fine.
        response = yield client.ask(lock(["a", "b", "a", "c", "b"], id=22, fencing_tokens=True))
        self.assertEqual((outcome(response), len(response.fencing_tokens)), (("Ok", 22, []), 3))
        self.assertEqual(outcome((yield client.ask(lock(["12345678", "é" * 4], id=23)))), ("Ok", 23, []))
        self.assertEqual(outcome((yield client.ask(unlock([], id=24)))), ("General", 24, []))
        self.assertEqual(outcome((yield client.ask(unlock(["a b"], id=25)))), ("General", 25, []))
        self.assertEqual(outcome((yield client.ask(unlock(["a", "b", "c", "d"], id=26)))), ("TooManyKeys", 26, []))
        yield self.assertStatus(jesync, b"a", 1, 0)

    @inlineCallbacks
    def test_a_server_limit_is_general_and_takes_nothing(self):
        server = yield self.start("--max-held", "2")
        jesync = yield server.jesync()
        client = yield server.dlock()
        self.assertEqual(outcome((yield client.ask(lock(["a", "b"])))), ("Ok", 1, []))
        response = yield client.ask(lock(["c", "d"], id=2))
        self.assertEqual((outcome(response), response.error_text), (("General", 2, []), "max-held exceeded (2)"))
        yield self.assertStatus(jesync, b"c", 0, 0)
        # Renewing what it holds is no new grant.
        self.assertEqual(outcome((yield client.ask(lock(["b", "a"], id=3)))), ("Ok", 3, []))

    @inlineCallbacks
    def test_max_connections(self):
        server = yield self.start("--max-connections", "1")
        jesync = yield server.jesync()
        client = yield server.dlock()
        last = yield self.assertClosedWith(client, ("General", 0, []))
        self.assertEqual(last.error_text, "max-connections exceeded (1)")
        yield jesync.disconnect()

    @inlineCallbacks
    def test_half_close_after_a_lock_of_free_keys(self):
        """Like C{printf ... | nc -N}: the free keys are granted, then the close releases them."""
        server = yield self.start()
        jesync = yield server.jesync()
        client = yield server.dlock()
        client.send_requests(lock(["k", "j"], id=4), ping(id=5))
        client.transport.loseWriteConnection()
        self.assertEqual([outcome(r) for r in (yield client.read_lines(2))], [("Ok", 4, []), ("Ok", 5, [])])
        self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
        yield server.wait_lost(client)
        yield self.assertStatus(jesync, b"k", 0, 0)

    @inlineCallbacks
    def test_unlock(self):
        server = yield self.start()
        jesync = yield server.jesync()
        client = yield server.dlock()
        other = yield server.dlock()
        yield other.ask(lock(["theirs"]))
        yield client.ask(lock(["bound"]), lock(["timed"], id=2, release_micro=60_000_000))
        response = yield client.ask(unlock(["bound", "timed", "never", "theirs"], id=3))
        self.assertEqual((outcome(response), response.error_text), (("Ok", 3, []), ""))
        yield self.assertStatus(jesync, b"bound", 0, 0)
        yield self.assertStatus(jesync, b"timed", 0, 0)
        yield self.assertStatus(jesync, b"theirs", 1, 0)
        response = yield client.ask(unlock([], id=4))
        self.assertEqual(outcome(response), ("General", 4, []))
        self.assertNotEqual(response.error_text, "")

    @inlineCallbacks
    def test_types_and_versions(self):
        server = yield self.start()
        client = yield server.dlock()
        responses = yield client.ask(
            ping(id=1),
            Request(version=2, id=2, type=7),
            Request(version=2, id=3, type=dlock_pb2.Invalid),
            ping(id=4, version=3),
            ping(id=5, version=1),
            lock(["k"], id=6, version=0, fencing_tokens=True),
            unlock(["k"], id=7, version=0),
            lock(["k"], id=8, version=99),
        )
        self.assertEqual(
            [outcome(r) for r in responses],
            [
                ("Ok", 1, []),
                ("InvalidType", 2, []),
                ("InvalidType", 3, []),
                ("Version", 4, []),
                ("Version", 5, []),
                ("Ok", 6, []),
                ("Ok", 7, []),
                ("Version", 8, []),
            ],
        )
        self.assertEqual({response.version for response in responses}, {2})
        self.assertEqual(len(responses[5].fencing_tokens), 1)
        self.assertEqual(server.locks.totals(), (0, 0, 0))  # the version-99 Lock took nothing


class AccessTokenTests(DlockTestCase):
    @inlineCallbacks
    def test_right_wrong_and_missing_token(self):
        path = write_file(self, TOKEN + b"\n")
        server = yield self.start("--auth-token-file", path)
        jesync = yield server.jesync()
        self.assertEqual((yield jesync.ask(b"auth %s\n" % TOKEN)), b"OK\n")
        token = TOKEN.decode()
        good = yield server.dlock()
        self.assertEqual(outcome((yield good.ask(lock(["k"], access_token=token)))), ("Ok", 1, []))
        for wrong in (token + "x", "", token[:-1]):
            client = yield server.dlock()
            response = yield client.ask(lock(["mine"], id=2, access_token=token))
            self.assertEqual(outcome(response), ("Ok", 2, []))
            client.send_requests(ping(id=3, access_token=wrong), ping(id=4, access_token=token))
            last = yield self.assertClosedWith(client, ("General", 3, []))
            self.assertEqual(last.error_text, "access token refused")
            yield server.wait_lost(client)
            # Its locks are released; the others' are not.
            yield self.assertStatus(jesync, b"mine", 0, 0)
        yield self.assertStatus(jesync, b"k", 1, 0)
        self.assertEqual(outcome((yield good.ask(ping(id=5, access_token=token)))), ("Ok", 5, []))

    @inlineCallbacks
    def test_a_trickling_client_without_the_token_is_closed_after_the_auth_timeout(self):
        """
        Connections that send a length prefix, then a byte now and then,
        never complete a request: they are closed after --auth-timeout and
        give back their connection slots; one that sent a request with the
        token is not closed.
        """
        path = write_file(self, TOKEN + b"\n")
        server = yield self.start("--auth-token-file", path, "--auth-timeout", "1", "--max-connections", "3")
        good = yield server.dlock()
        self.assertEqual(outcome((yield good.ask(ping(id=9, access_token=TOKEN.decode())))), ("Ok", 9, []))
        trickling = []
        for _ in range(2):
            trickling.append((yield server.dlock()))
        full = yield server.jesync()
        self.assertEqual((yield full.read_line()), b"INVALID_PARAMETER: max-connections exceeded (3)\n")
        for client in trickling:
            client.send((1000).to_bytes(4, "big"))

        def trickle() -> None:
            for client in trickling:
                if client.lost_reason is None:
                    client.send(b"\x08")

        ticker = task.LoopingCall(trickle)
        ticker.start(0.2, now=False)
        self.addCleanup(lambda: ticker.running and ticker.stop())
        for client in trickling:
            self.assertIsInstance((yield client.wait_closed()), ConnectionDone)
            (last,) = client.unread()
            self.assertEqual((outcome(last), last.error_text), (("General", 0, []), "auth-timeout exceeded (1)"))
            yield server.wait_lost(client)
        # Their slots are free: a JESync client connects and is served.
        jesync = yield server.jesync()
        self.assertEqual((yield jesync.ask(b"auth %s\nstatus k\n" % TOKEN, count=2)), b"OK\nSTATUS 0 0 k\n")
        self.assertIsNone(good.lost_reason)
        self.assertEqual(outcome((yield good.ask(ping(id=10, access_token=TOKEN.decode())))), ("Ok", 10, []))

    @inlineCallbacks
    def test_without_a_token_file_any_token_is_accepted(self):
        server = yield self.start()
        client = yield server.dlock()
        responses = yield client.ask(ping(access_token="anything"), lock(["k"], id=2, access_token="\u00e9t\u00e9"))
        self.assertEqual([outcome(r) for r in responses], [("Ok", 1, []), ("Ok", 2, [])])


class IdleTimeoutTests(DlockTestCase):
    @inlineCallbacks
    def test_a_silent_holder_is_closed_and_its_bound_locks_released(self):
        server = yield self.start("--dlock-idle-timeout", "0.5")
        jesync = yield server.jesync()
        client = yield server.dlock()
        yield client.ask(lock(["bound"]), lock(["timed"], id=2, release_micro=60_000_000))
        last = yield self.assertClosedWith(client, ("General", 0, []))
        self.assertEqual(last.error_text, "idle-timeout exceeded (0.5)")
        yield server.wait_lost(client)
        yield self.assertStatus(jesync, b"bound", 0, 0)
        yield self.assertStatus(jesync, b"timed", 1, 0)
        self.release_timed(server, "timed")

    @inlineCallbacks
    def test_a_waiting_lock_is_answered_before_the_close(self):
        server = yield self.start("--dlock-idle-timeout", "0.5")
        jesync = yield server.jesync()
        self.assertEqual((yield jesync.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        client = yield server.dlock()
        client.send_requests(lock(["k"], id=31), ping(id=32))
        last = yield self.assertClosedWith(client, ("General", 31, []))
        self.assertIn("idle-timeout", last.error_text)
        yield server.wait_lost(client)
        yield self.assertStatus(jesync, b"k", 1, 0)

    @inlineCallbacks
    def test_the_general_idle_timeout_does_not_govern_dlock(self):
        server = yield self.start("--idle-timeout", "0.2", "--dlock-idle-timeout", "0")
        client = yield server.dlock()
        jesync = yield server.jesync()
        self.assertIsInstance((yield jesync.wait_closed()), ConnectionDone)
        self.assertEqual(jesync.unread(), b"INVALID_PARAMETER: idle-timeout exceeded (0.2)\n")
        self.assertIsNone(client.lost_reason)
        self.assertEqual(outcome((yield client.ask(ping(id=3)))), ("Ok", 3, []))


class CrossProtocolTests(DlockTestCase):
    @inlineCallbacks
    def test_a_dlock_holder_and_jesync(self):
        server = yield self.start()
        jesync, waiter = yield server.connect_many(2)
        client = yield server.dlock()
        granted = yield client.ask(lock(["K"], fencing_tokens=True))
        (token,) = granted.fencing_tokens
        self.assertEqual((yield jesync.ask(b"lock K 1 0\n")), b"TIMEOUT 1 0 K\n")
        yield self.assertStatus(jesync, b"K", 1, 0)
        holders = yield jesync.ask(b"holders K\n", 2)
        peer = b"127.0.0.1:%d" % client.transport.getHost().port
        self.assertEqual(holders, b"HOLDER K %s 0 0 %d\nEND\n" % (peer, token))
        yield server.send(waiter, b"lock K\n")
        yield self.assertStatus(jesync, b"K", 1, 1)
        yield server.drop(client)
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 K 120\n")

    @inlineCallbacks
    def test_elock(self):
        server = yield self.start(elock=True)
        elock = yield server.elock()
        client = yield server.dlock()
        yield client.ask(lock(["d"]))
        self.assertEqual((yield elock.ask(b"lock d\r\n")), b"409 Unavailable\r\n")
        self.assertEqual((yield elock.ask(b"lock e\r\n")), b"200 Acquired\r\n")
        response = yield client.ask(lock(["e", "f"], id=2, wait_micro=50_000))
        self.assertEqual(outcome(response), ("AcquireTimeout", 2, ["e"]))
        self.assertEqual((yield elock.ask(b"unlock e\r\n")), b"200 Unlocked\r\n")
        self.assertEqual(outcome((yield client.ask(lock(["e", "f"], id=3, wait_micro=50_000)))), ("Ok", 3, []))


class FencingTests(DlockTestCase):
    @inlineCallbacks
    def test_tokens_per_distinct_key_increasing_kept_on_renewal(self):
        server = yield self.start()
        jesync = yield server.jesync()
        client = yield server.dlock()
        first = yield client.ask(lock(["a", "b", "a", "c"], fencing_tokens=True))
        tokens = list(first.fencing_tokens)
        self.assertEqual(len(tokens), 3)
        self.assertEqual(tokens, sorted(set(tokens)))  # distinct, in the request's order of keys
        second = yield client.ask(lock(["d"], id=2, fencing_tokens=True))
        self.assertGreater(second.fencing_tokens[0], tokens[-1])
        # Renewals keep their tokens; a new key in the same request gets a new one.
        renewed = yield client.ask(lock(["c", "e", "a"], id=3, release_micro=60_000_000, fencing_tokens=True))
        c, e, a = renewed.fencing_tokens
        self.assertEqual((c, a), (tokens[2], tokens[0]))
        self.assertGreater(e, second.fencing_tokens[0])
        for key, token in ((b"a", a), (b"e", e), (b"d", second.fencing_tokens[0])):
            listing = yield jesync.ask(b"holders %s\n" % key, 2)
            self.assertRegex(listing, rb"^HOLDER %s \S+ \d+ \d+ %d\nEND\n$" % (key, token))
        yield client.ask(unlock(["a", "b", "c", "d", "e"], id=4))
        # Granted again: a new, larger token.
        again = yield client.ask(lock(["a"], id=5, fencing_tokens=True))
        self.assertGreater(again.fencing_tokens[0], e)

    @inlineCallbacks
    def test_a_lock_of_max_keys_that_asks_gets_a_token_per_key(self):
        server = yield self.start()
        client = yield server.dlock()
        keys = [f"many.{n}" for n in range(1000)]
        plain = yield client.ask(lock(keys[:500], id=1))
        self.assertEqual((outcome(plain), field_names(plain) <= REFERENCE_FIELDS), (("Ok", 1, []), True))
        asked = yield client.ask(lock(keys, id=2, fencing_tokens=True))
        self.assertEqual(outcome(asked), ("Ok", 2, []))
        tokens = list(asked.fencing_tokens)
        self.assertEqual(len(tokens), 1000)
        self.assertEqual(len(set(tokens)), 1000)
        # The first 500 were held (renewed, their tokens kept), the others new and larger.
        self.assertLess(max(tokens[:500]), min(tokens[500:]))
        holders = yield (yield server.jesync()).ask(b"holders many.999\n", 2)
        self.assertTrue(holders.endswith(b" %d\nEND\n" % tokens[-1]), holders)


class CountTests(DlockTestCase):
    @inlineCallbacks
    def test_requests_and_timeouts_counted_and_in_metrics(self):
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            skip_metrics = True
        else:
            skip_metrics = False
        argv = () if skip_metrics else ("--metrics", "tcp:0:interface=127.0.0.1")
        server = yield self.start(*argv)
        holder = yield server.dlock()
        client = yield server.dlock()
        yield holder.ask(lock(["k"]))
        yield client.ask(
            ping(),
            lock(["k"], id=2, wait_micro=1_000),
            unlock(["k"], id=3),
            Request(id=4, type=9),
        )
        client.send(b"\x00\x00\x00\x01\x0f")
        yield client.wait_closed()
        factory = server.factories["dlock"]
        self.assertEqual(factory.requests, Counter(ping=1, lock=2, unlock=1, invalid=1, malformed=1))
        self.assertEqual(factory.timeouts, 1)
        if skip_metrics:
            return
        yield server.wait_lost(client)
        (child,) = [child for child in server.service.listeners() if isinstance(child.factory, CountedFactory)]
        port = yield listening_port(child)
        body = yield self.scrape(b"http://127.0.0.1:%d/metrics" % port.getHost().port)
        lines = body.decode().split("\n")
        for sample in (
            'jesync_dlock_requests_total{type="lock"} 2.0',
            'jesync_dlock_requests_total{type="ping"} 1.0',
            'jesync_dlock_requests_total{type="malformed"} 1.0',
            "jesync_dlock_timeouts_total 1.0",
            "jesync_dlock_connections 1.0",
        ):
            self.assertIn(sample, lines, body.decode())

    @inlineCallbacks
    def scrape(self, url: bytes):
        from twisted.web.client import Agent, HTTPConnectionPool, readBody

        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        agent = Agent(reactor, connectTimeout=TIMEOUT, pool=pool)
        response = yield agent.request(b"GET", url).addTimeout(TIMEOUT, reactor)
        self.assertEqual(response.code, 200)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Using readBody", DeprecationWarning)
            body = readBody(response)
        return (yield body.addTimeout(TIMEOUT, reactor))


class GoClientReader:
    """
    Reads responses as temoto/dlock's Go client does (dlock-client/client.go,
    dlock/io.go): a C{bufio.Reader} of 4096 bytes over the socket, and
    C{ReadMessage}'s two C{Read} calls, one for the 4-byte length and one for
    the body, each taking what the buffer holds or else at most one C{recv}.
    A body cut short is used as it is, zero-padded, as the client does; what
    was left unread is then taken as the start of the next response.
    """

    BUFFER = 4096
    MAX_MESSAGE = 16 << 10  # the client's -max-message default

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffered = b""
        self.short_reads = 0

    def read(self, size: int) -> bytes:
        """Go's C{bufio.Reader.Read} of C{size} bytes."""
        if size == 0:
            return b""
        if not self.buffered:
            if size >= self.BUFFER:
                return self.sock.recv(size)
            self.buffered = self.sock.recv(self.BUFFER)
            if not self.buffered:
                raise EOFError("the server closed the connection")
        data, self.buffered = self.buffered[:size], self.buffered[size:]
        return data

    def read_message(self) -> Response:
        """C{dlock.ReadMessage}."""
        head = self.read(4)
        size = int.from_bytes(head.ljust(4, b"\0"), "big")
        if size > self.MAX_MESSAGE:
            raise AssertionError(f"Advertised message size exceeds configured limit ({size})")
        body = self.read(size)
        if len(head) < 4 or len(body) < size:
            self.short_reads += 1
        return Response.FromString(body.ljust(size, b"\0"))


class OldClientTests(SynchronousTestCase):
    """
    A client of the reference that reads each response with one C{Read} (as
    temoto/dlock's Go client does), against C{twistd jesync} over real TCP,
    on a connection that delivers small segments: a C{Lock} of
    C{--dlock-max-keys} keys is answered the reference's few bytes, so a
    C{Ping} behind it reads its own response.

    Small segments: the client sets C{TCP_MAXSEG} 1400 before it connects,
    so its SYN announces that MSS and the server sends it segments of at most
    1400 bytes (1388 with timestamps), as across an Ethernet path, not
    loopback's 64 KiB; and a small C{SO_RCVBUF} (2048, the kernel doubles
    it; the Go client's C{-read-buffer} sets the same), so the receive window
    lets about one segment in before the client reads, as a real network's
    spacing of segments does.  Against the server that sent every Lock its
    tokens, this client failed at 175 keys here (the issue's "from ~175-200
    keys"), and at 510 keys with neither option (its "above ~510 keys on
    loopback"): C{Ping} read the Lock's leftover bytes as its length,
    "Advertised message size exceeds configured limit".  Both are plain
    socket options: no root, unlike a network namespace with a 1500-byte MTU.
    """

    def connect(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(sock.close)
        sock.settimeout(TIMEOUT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        maxseg = getattr(socket, "TCP_MAXSEG", None)
        if maxseg is not None:
            sock.setsockopt(socket.IPPROTO_TCP, maxseg, 1400)
        sock.connect(("127.0.0.1", port))
        if maxseg is not None:
            self.assertLessEqual(sock.getsockopt(socket.IPPROTO_TCP, maxseg), 1400)
        return sock

    def test_a_lock_of_max_keys_then_a_ping_on_one_connection(self) -> None:
        port = free_port()
        start_server(self, extra_args=["--dlock-port", f"tcp:{port}:interface=127.0.0.1", "--dlock-max-keys", "1000"])
        sock = self.connect(port)
        reader = GoClientReader(sock)
        keys = [f"old.{n}" for n in range(1000)]  # (1000 keys in a request under 16 KiB)
        # As the Go client sends them: version 2, no id.
        for count in (175, 510, 1000):
            sock.sendall(dlock_frame(lock(keys[:count], id=0)))
            locked = reader.read_message()
            self.assertEqual((outcome(locked), list(locked.fencing_tokens)), (("Ok", 0, []), []), count)
            reference = Response(version=2, server_unix_time=locked.server_unix_time)
            self.assertEqual(locked.ByteSize(), reference.ByteSize(), count)
            sock.sendall(dlock_frame(ping(id=0)))
            self.assertEqual(outcome(reader.read_message()), ("Ok", 0, []), count)
        sock.sendall(dlock_frame(unlock(keys, id=0)))
        self.assertEqual(outcome(reader.read_message()), ("Ok", 0, []))
        self.assertEqual((reader.short_reads, reader.buffered), (0, b""))


class TwistdTests(TestCase):
    """C{twistd -n jesync --dlock-port ...} as a subprocess (L{tests.process.test_twistd}'s helpers)."""

    timeout = 60
    spawn = test_twistd.TwistdTests.spawn
    run_server = test_twistd.TwistdTests.run_server
    terminate = test_twistd.TwistdTests.terminate

    @inlineCallbacks
    def test_twistd_dlock_port(self):
        local = "tcp:0:interface=127.0.0.1"
        process = self.run_server("--port", local, "--dlock-port", local)
        summary = yield process.wait_for(rb"\] jesync starting: ([^\n]*)\n")
        self.assertIn(b"; dlock on tcp:0:interface=127.0.0.1;", summary.group(1))
        match = yield process.wait_for(rb"DlockFactory starting on (\d+)\n")
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1)), timeout=int(TIMEOUT))
        client = yield connectProtocol(endpoint, DlockClient()).addTimeout(TIMEOUT, reactor)
        self.addCleanup(lambda: client.abort() if client.lost_reason is None else None)
        responses = yield client.ask(lock(["k"], id=1), ping(id=2), unlock(["k"], id=3))
        self.assertEqual([outcome(r) for r in responses], [("Ok", 1, []), ("Ok", 2, []), ("Ok", 3, [])])
        yield client.disconnect()
        yield process.wait_for(rb"DlockProtocol#info\] [^\n]* disconnected\n")
        yield self.terminate(process)
        self.assertEqual(len(process.log_lines(rb"DlockProtocol#info\] .* connected$")), 1, process.text())
