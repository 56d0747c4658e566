"""
L{jesync.cluster.etcd.EtcdClient}'s attempts and retries, on a fake clock
and fake TCP (Twisted's L{MemoryReactorClock}): the real client, Agent and
HTTP parser, with connections this test opens, answers and leaves silent.

 - An attempt that gets no answer is abandoned at L{ATTEMPT_TIMEOUT}, its
   connection aborted, and the next goes at once on a new connection; the
   request succeeds as soon as one attempt is answered, within the timeout.
 - How many attempts fit in a certainty window (TTL 3: 2.25 s; TTL 2: 1.5 s).
 - What etcd answered (an error) is not tried again; a refused connection
   is, and so is etcd's "unavailable", after a short pause.
 - A campaign whose create was applied by an earlier copy of its request
   (the retry then fails its compare) is won, not given up
   (L{jesync.cluster.member.ClusterMember._claim}).

tests/etcd/test_flapping_link.py shows the whole of it on a real link.
"""

from __future__ import annotations

import json
from typing import Any, List, Tuple

from twisted.internet.defer import succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from jesync.cluster.etcd import (
    ANSWERS_REMEMBERED,
    ATTEMPT_TIMEOUT,
    RETRY_DELAY,
    Compare,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    Get,
    KeyValue,
    Put,
    TxnResult,
)

ENDPOINT = "http://127.0.0.1:2379"
ANSWER = b'{"header":{"revision":"9"},"kvs":[{"key":"aw==","value":"dg==","mod_revision":"9"}]}'


def http_answer(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


class FakeEtcd:
    """The other end of the client's connections: opened, answered or left silent by the test."""

    def __init__(self, reactor: MemoryReactorClock) -> None:
        self.reactor = reactor
        self.transports: List[StringTransport] = []
        self.protocols: List[Any] = []

    @property
    def connects(self) -> int:
        """How many connections the client has opened (or tried to)."""
        return len(self.reactor.tcpClients)

    def accept(self, index: int) -> StringTransport:
        """Complete the client's connection number C{index}: its request is then written."""
        host, port, factory, _, _ = self.reactor.tcpClients[index]
        self.assertEqual((host, port), ("127.0.0.1", 2379))
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        self.transports.append(transport)
        self.protocols.append(protocol)
        return transport

    def answer(self, index: int, data: bytes) -> None:
        self.protocols[index].dataReceived(data)

    def refuse(self, index: int) -> None:
        _, _, factory, _, _ = self.reactor.tcpClients[index]
        factory.clientConnectionFailed(self.reactor.connectors[index], Failure(ConnectionRefusedError()))

    @staticmethod
    def assertEqual(first: object, second: object) -> None:
        assert first == second, (first, second)


class AttemptTests(SynchronousTestCase):
    def client(self, timeout: float = 2.25, endpoints: Tuple[str, ...] = (ENDPOINT,)) -> Tuple[Any, EtcdClient]:
        reactor = MemoryReactorClock()
        self.reactor = reactor
        self.etcd = FakeEtcd(reactor)
        return reactor, EtcdClient(reactor, list(endpoints), timeout)

    def test_a_silent_attempt_is_abandoned_with_its_connection_and_retried_at_once_on_a_new_one(self) -> None:
        reactor, client = self.client()
        got = client.get(b"k")
        self.assertEqual(self.etcd.connects, 1)
        first = self.etcd.accept(0)
        self.assertIn(b"POST /v3/kv/range HTTP/1.1", first.value())
        self.assertTrue(first.value().endswith(b'{"key":"aw=="}'), first.value())  # the body too, at once
        reactor.advance(ATTEMPT_TIMEOUT - 0.01)
        self.assertEqual((self.etcd.connects, first.disconnected), (1, False))
        reactor.advance(0.01)
        # Abandoned, its connection aborted (never back in the pool), and a new one opened in the same instant.
        self.assertTrue(first.disconnected)
        self.assertEqual(self.etcd.connects, 2)
        second = self.etcd.accept(1)
        self.assertIn(b"POST /v3/kv/range HTTP/1.1", second.value())
        reactor.advance(0.05)
        self.etcd.answer(1, http_answer(ANSWER))
        revision, [kv] = self.successResultOf(got)
        self.assertEqual((revision, kv.key, kv.value), (9, b"k", b"v"))
        self.assertEqual(reactor.seconds(), ATTEMPT_TIMEOUT + 0.05)
        # The next request goes on the connection that answered.
        reactor.advance(0)
        client.get(b"k")
        self.assertEqual(self.etcd.connects, 2)
        self.assertEqual(second.value().count(b"POST /v3/kv/range"), 2)

    def test_a_connection_that_never_opens_is_given_up_at_the_attempt_timeout_too(self) -> None:
        reactor, client = self.client()
        got = client.get(b"k")
        reactor.advance(ATTEMPT_TIMEOUT)
        self.assertTrue(reactor.connectors[0].stoppedConnecting)
        self.assertEqual(self.etcd.connects, 2)
        self.etcd.accept(1)
        self.etcd.answer(0, http_answer(ANSWER))
        self.assertEqual(self.successResultOf(got)[0], 9)

    def attempts_within(self, timeout: float) -> Tuple[List[float], str]:
        """When each attempt of a request nobody answers starts, and the error it ends with."""
        reactor, client = self.client(timeout)
        got = client.txn([Compare(b"c", "MOD", 0)], [Put(b"k", b"v")])
        started: List[float] = []
        while not got.called:
            while len(started) < self.etcd.connects:
                started.append(reactor.seconds())
            reactor.advance(min(call.getTime() for call in reactor.getDelayedCalls()) - reactor.seconds())
        error = self.failureResultOf(got, EtcdUnavailable).value
        self.assertAlmostEqual(reactor.seconds(), timeout, places=6)
        return [round(at, 2) for at in started], str(error)

    def test_attempts_in_a_certainty_window(self) -> None:
        """
        TTL 3 (a window of 2.25 s): five attempts, each 0.4 s but the last
        (0.65 s: what is left); TTL 2 (1.5 s): three, the last 0.7 s.
        Every connection is given up.
        """
        started, error = self.attempts_within(2.25)
        self.assertEqual(started, [0.0, 0.4, 0.8, 1.2, 1.6])
        self.assertIn("no etcd endpoint answered txn within 2.25 s (5 attempts; last:", error)
        self.assertIn("no answer within 0.65 s", error)
        self.assertTrue(all(connector.stoppedConnecting for connector in self.reactor.connectors))
        started, _ = self.attempts_within(1.5)
        self.assertEqual(started, [0.0, 0.4, 0.8])

    def test_the_last_attempt_takes_what_is_left(self) -> None:
        """Rather than leave less than 0.4 s for one more: a timeout of 0.7 s is one attempt of 0.7 s."""
        started, error = self.attempts_within(0.7)
        self.assertEqual(started, [0.0])
        self.assertIn("(1 attempt; last: http://127.0.0.1:2379: no answer within 0.7 s)", error)

    def answered_after(self, client: EtcdClient, seconds: float) -> None:
        """One read on the first connection (opened by the first), answered C{seconds} after it was sent."""
        got = client.get(b"k")
        if not self.etcd.transports:
            self.etcd.accept(0)
        self.reactor.advance(seconds)
        self.etcd.answer(0, http_answer(ANSWER))
        self.assertEqual(self.successResultOf(got)[0], 9)

    def test_an_etcd_slow_on_every_request_gets_longer_attempts(self) -> None:
        """
        Eight answers in a row each 0.3 s late (over a quarter of 0.4 s):
        an attempt may then take four times the fastest of them, at most
        half the timeout (1.125 s), and a read answered after 0.9 s is
        answered on its first attempt.
        """
        reactor, client = self.client()
        for _ in range(ANSWERS_REMEMBERED):
            self.answered_after(client, 0.3)
        got = client.get(b"k")
        reactor.advance(0.9)
        self.assertEqual(self.etcd.connects, 1)  # (not abandoned at 0.4 s)
        self.etcd.answer(0, http_answer(ANSWER))
        self.assertEqual(self.successResultOf(got)[0], 9)
        # Nor longer than half the timeout.
        got = client.get(b"k")
        reactor.advance(2.25 / 2)
        self.assertEqual(self.etcd.connects, 2)
        self.etcd.accept(1)
        self.etcd.answer(1, http_answer(ANSWER))
        self.successResultOf(got)

    def test_one_fast_answer_among_the_last_keeps_the_attempt_timeout(self) -> None:
        """A flapping link's slow answers (retransmitted) come among fast ones: attempts stay at 0.4 s."""
        reactor, client = self.client()
        self.answered_after(client, 0.01)
        for _ in range(ANSWERS_REMEMBERED - 1):
            self.answered_after(client, 0.35)
        client.get(b"k")
        reactor.advance(ATTEMPT_TIMEOUT)
        self.assertEqual(self.etcd.connects, 2)

    def test_a_suddenly_slow_etcd_is_learned_through_last_attempts(self) -> None:
        """
        etcd answering every request after 0.6 s: each request's last
        attempt (0.65 s, of a 2.25 s timeout) gets the answer; after eight
        of them the next is answered on its first attempt.
        """
        reactor, client = self.client()
        accepted = set()

        def attempt_on_newest() -> int:
            newest = self.etcd.connects - 1  # (a new connection, or the one answered last, from the pool)
            if newest not in accepted:
                self.etcd.accept(newest)
                accepted.add(newest)
            return newest

        for _ in range(ANSWERS_REMEMBERED):
            got = client.get(b"k")
            for _ in range(4):  # 0, 0.4, 0.8, 1.2: abandoned at 0.4 s each
                attempt_on_newest()
                reactor.advance(ATTEMPT_TIMEOUT)
            self.assertNoResult(got)
            last = attempt_on_newest()  # 1.6 s: the last, 0.65 s
            reactor.advance(0.6)
            self.etcd.answer(last, http_answer(ANSWER))
            self.assertEqual(self.successResultOf(got)[0], 9)
        opened = self.etcd.connects
        got = client.get(b"k")
        reactor.advance(0.6)
        self.etcd.answer(opened - 1, http_answer(ANSWER))
        self.assertEqual((self.successResultOf(got)[0], self.etcd.connects), (9, opened))

    def test_an_error_etcd_answers_is_not_tried_again(self) -> None:
        reactor, client = self.client()
        got = client.txn([], [Put(b"k", b"1"), Put(b"k", b"2")])
        self.etcd.accept(0)
        error = b'{"error":"etcdserver: duplicate key given in txn request","code":3}'
        self.etcd.answer(0, http_answer(error, b"400 Bad Request"))
        failure = self.failureResultOf(got, EtcdError)
        self.assertNotIsInstance(failure.value, EtcdUnavailable)
        self.assertIn("duplicate key", str(failure.value))
        reactor.advance(3)
        self.assertEqual(self.etcd.connects, 1)

    def test_a_refused_connection_is_tried_again(self) -> None:
        """(Twisted's endpoint reports a refusal once it has tried every address: 0.3 s here.)"""
        reactor, client = self.client()
        got = client.get(b"k")
        self.etcd.refuse(0)
        while self.etcd.connects < 2:
            reactor.advance(0.05)
        self.assertLess(reactor.seconds(), 1.0)
        self.etcd.accept(1)
        self.etcd.answer(0, http_answer(ANSWER))
        self.assertEqual(self.successResultOf(got)[0], 9)

    def test_etcd_unavailable_is_tried_again_after_a_pause(self) -> None:
        """
        etcd's "unavailable" (a member without a leader) is tried again, like
        a refusal, after a pause (RETRY_DELAY: no spinning), unlike a
        silent attempt, which has waited already.
        """
        reactor, client = self.client()
        got = client.get(b"k")
        connection = self.etcd.accept(0)
        self.etcd.answer(0, http_answer(b'{"error":"etcdserver: no leader","code":14}', b"503 Service Unavailable"))
        self.assertNoResult(got)
        reactor.advance(RETRY_DELAY - 0.001)
        self.assertEqual(connection.value().count(b"POST"), 1)
        reactor.advance(0.001)
        # (on the same connection: it was answered, so it is back in the pool)
        self.assertEqual((connection.value().count(b"POST"), self.etcd.connects), (2, 1))
        self.etcd.answer(0, http_answer(ANSWER))
        self.assertEqual(self.successResultOf(got)[0], 9)

    def test_each_endpoint_gets_its_share_and_at_most_the_attempt_timeout(self) -> None:
        """Two endpoints, a timeout of 0.6 s: 0.3 s each."""
        reactor, client = self.client(0.6, (ENDPOINT, "http://127.0.0.1:2380"))
        got = client.get(b"k")
        reactor.advance(0.3)
        reactor.advance(0.3)
        self.assertEqual([port for _, port, *_ in reactor.tcpClients], [2379, 2380])
        self.failureResultOf(got, EtcdUnavailable)

    def test_bad_attempt_timeout(self) -> None:
        with self.assertRaises(ValueError):
            EtcdClient(MemoryReactorClock(), [ENDPOINT], 2.0, attempt_timeout=0)


class StandInEtcd:
    """The campaign's etcd: a lease, then the claim's answer as the test says, and revokes recorded."""

    def __init__(self, applied_before: bool, lease_of_key: int) -> None:
        self.applied_before = applied_before
        self.lease_of_key = lease_of_key
        self.revoked: List[int] = []

    def txn(self, compare: Any, success: Any, failure: Any = ()) -> Any:
        [put] = success
        [get] = failure
        assert isinstance(put, Put) and isinstance(get, Get)
        if not self.applied_before:
            return succeed(TxnResult(True, 17, [None]))
        # An earlier copy created the key (revision 17); this one fails its compare.
        kv = KeyValue(put.key, put.value, 17, 17, self.lease_of_key)
        return succeed(TxnResult(False, 20, [[kv]]))

    def revoke(self, lease: int) -> Any:
        self.revoked.append(lease)
        return succeed(None)


class CampaignRetryTests(SynchronousTestCase):
    def claim(self, etcd: StandInEtcd) -> Tuple[Any, List[Any]]:
        from jesync.cluster.member import ClusterMember
        from jesync.server import ServerSettings, build_lock_server

        clock = MemoryReactorClock()
        member: Any = ClusterMember(clock, ServerSettings(ports=[]), etcd, "c", 3, build_lock_server, lambda: 0.0, "m")
        won: List[Any] = []
        member.won = won.append
        member.running = True
        member._claim((42, 3), 0.0)
        return member, won

    def test_a_claim_won_by_its_first_copy_is_won(self) -> None:
        """The key bound to this member's new lease: it leads, at the key's create revision, the lease kept."""
        etcd = StandInEtcd(applied_before=True, lease_of_key=42)
        _, [term] = self.claim(etcd)
        self.assertEqual((term.lease, term.revision, term.valid_until), (42, 17, 2.25))
        self.assertEqual(etcd.revoked, [])

    def test_a_claim_won_at_once_is_won(self) -> None:
        _, [term] = self.claim(StandInEtcd(applied_before=False, lease_of_key=0))
        self.assertEqual(term.revision, 17)

    def test_a_claim_lost_to_another_lease_is_lost(self) -> None:
        """The key is another member's (another lease): lost, and this lease let go."""
        etcd = StandInEtcd(applied_before=True, lease_of_key=7)
        _, won = self.claim(etcd)
        self.assertEqual((won, etcd.revoked), ([], [42]))

    def test_the_entry_named(self) -> None:
        """(What the claim writes: this member's name.)"""
        etcd = StandInEtcd(applied_before=True, lease_of_key=42)
        recorded: List[Any] = []
        original = etcd.txn

        def txn(compare: Any, success: Any, failure: Any = ()) -> Any:
            recorded.append(success[0].value)
            return original(compare, success, failure)

        etcd.txn = txn  # type: ignore[method-assign]
        self.claim(etcd)
        self.assertEqual(json.loads(recorded[0])["member"], "m")
