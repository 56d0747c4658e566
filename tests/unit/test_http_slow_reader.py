"""
The HTTP API's connections held to the line protocols' rule for a client
that does not read its replies (L{jesync.http.listener.ApiChannel}), over
a L{StringTransport} on a Clock: while the transport is paused no further
pipelined request is processed (until it resumes), and what is written
once it has been paused a whole turn counts toward C{--max-unsent}: past
it, the connection is aborted and the drop logged.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.http import locks
from jesync.http.listener import ApiSite
from tests.http_unit import HttpConnection, UnitApi
from tests.support import capture_log


class SlowReaderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.server = UnitApi(locks.ROUTES)
        self.site = ApiSite(self.server.api, reactor=self.server.clock, max_unsent=100)
        self.site.timeOut = None

    def connect(self) -> HttpConnection:
        return HttpConnection(self.site)

    def answered(self, client: HttpConnection) -> int:
        return client.transport.value().count(b"HTTP/1.1 200 OK")

    def test_pipelined_requests_wait_while_paused(self) -> None:
        """Three pipelined GETs while the client is not reading: one answered; the others once it reads."""
        client = self.connect()
        client.pause()
        request = b"GET /v1/sessions HTTP/1.1\r\nHost: jesync\r\n\r\n"
        client.channel.dataReceived(request * 3)
        self.assertEqual(self.answered(client), 1)
        self.server.clock.advance(1)
        self.assertEqual(self.answered(client), 1)
        client.resume()
        self.assertEqual(self.answered(client), 3)
        self.assertFalse(client.aborted)
        self.assertEqual(self.server.clock.getDelayedCalls(), [])

    def test_gone_while_held(self) -> None:
        """A client that goes while its next request is held: nothing more is answered, nothing kept."""
        client = self.connect()
        client.pause()
        client.channel.dataReceived(b"GET /v1/sessions HTTP/1.1\r\nHost: jesync\r\n\r\n" * 2)
        client.lose()
        self.assertEqual(self.answered(client), 1)
        self.server.clock.advance(0)
        self.assertEqual(self.server.clock.getDelayedCalls(), [])

    def test_past_max_unsent_dropped(self) -> None:
        """
        A long poll answered once the transport has been paused a whole
        turn: its reply counts; past --max-unsent the connection is aborted
        (logged); what one turn writes is not counted.
        """
        log = capture_log(self)
        holder = self.server.session()
        waiter = self.server.session()
        self.server.ask("POST", "/v1/acquire", {"session": holder, "key": "k"})
        client = self.connect()
        client.send("POST", "/v1/acquire", {"session": waiter, "key": "k", "wait": 30})
        client.pause()
        self.server.clock.advance(0)
        self.server.ask("POST", "/v1/release", {"session": holder, "key": "k"})
        self.assertTrue(client.aborted)
        [dropped] = [line for line in log if "dropped" in line]
        self.assertTrue(dropped.startswith("127.0.0.1:40000 dropped: not reading its replies ("), dropped)

    def test_one_turn_not_counted(self) -> None:
        """A reply written in the turn the transport paused is not counted, however large."""
        for index in range(20):
            self.server.locks.request(f"key-{index}", "owner", 1, 0, 0)
        client = self.connect()
        client.pause()
        client.channel.dataReceived(b"GET /v1/locks?limit=1000 HTTP/1.1\r\nHost: jesync\r\n\r\n")
        self.assertEqual(self.answered(client), 1)
        self.assertGreater(len(client.transport.value()), 1000)
        self.server.clock.advance(0)
        self.assertFalse(client.aborted)
