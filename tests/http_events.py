"""
The HTTP API's Server-Sent Events as the TCP tests read them: a stream
opened with treq (C{unbuffered}) and read as it arrives (C{treq.collect}),
its events parsed as they complete (L{EventReader}); a test waits for the
Nth event with a bounded timeout, never a sleep.  What was read is checked
against the OpenAPI document (C{tests.openapi_check}) when the test is
done with it (L{EventReader.check}).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.web.client import HTTPConnectionPool

from tests.http_client import TIMEOUT, HttpClient

try:
    import treq
except ImportError:  # pragma: no cover - the test extra has it
    treq = None

from tests.http_unit import parse_events
from tests.openapi_check import check_response


class EventReader:
    """
    One event stream: C{status}, C{headers}, C{events} so far (C{(name,
    data)}; a C{: ping} is C{("ping", None)}), C{done} (fires when the
    server ends the response or the connection goes).
    """

    def __init__(self, path: str, response: Any) -> None:
        self.path = path
        self.response = response
        self.status = response.code
        self.headers = response.headers
        self.raw = b""
        self.events: List[Tuple[str, Any]] = []
        self.ended = False
        self._waiting: List[Tuple[int, Deferred]] = []
        self.done: Deferred = treq.collect(response, self._received)
        self.done.addBoth(self._finished)

    def header(self, name: str) -> Optional[str]:
        values = self.headers.getRawHeaders(name)
        return values[0] if values else None

    def _received(self, data: bytes) -> None:
        self.raw += data
        self.events[len(self.events) :] = parse_events(self.raw.decode("utf-8"))[len(self.events) :]
        self._tell()

    def _finished(self, result: Any) -> Any:
        self.ended = True
        self._tell()
        return None

    def _tell(self) -> None:
        for waiting in list(self._waiting):
            count, deferred = waiting
            if len(self.events) >= count or self.ended:
                self._waiting.remove(waiting)
                deferred.callback(self.events[:])

    def wait_for(self, count: int, timeout: float = TIMEOUT) -> Deferred:
        """Fires with the events once there are C{count} (or the stream ended); fails after C{timeout}."""
        deferred: Deferred = Deferred()
        self._waiting.append((count, deferred))
        timer = reactor.callLater(timeout, lambda: deferred.called or deferred.errback(
            AssertionError(f"{self.path}: not {count} events within {timeout} s: {self.events}")
        ))
        deferred.addBoth(lambda result: (timer.active() and timer.cancel(), result)[1])
        self._tell()
        return deferred

    def names(self) -> List[str]:
        return [name for name, _ in self.events if name != "ping"]

    def check(self) -> None:
        """What was read matches the OpenAPI document."""
        headers = {name.decode(): [value.decode() for value in values] for name, values in self.headers.getAllRawHeaders()}
        check_response("GET", self.path, self.status, headers, self.raw)

    def close(self) -> None:
        """
        The client goes away: its connection closed (treq's response wraps
        Twisted's, whose transport is a producer: stopping it closes it).
        """
        self.response.original._transport.stopProducing()


@inlineCallbacks
def open_stream(client: HttpClient, path: str, token: Any = Ellipsis):
    """
    GET C{path} as an event stream with C{client}'s token, on a connection
    of its own (not kept once the stream ends): fires with its
    L{EventReader} once its headers are in.
    """
    headers = {"Accept": "text/event-stream"}
    token = client.token if token is Ellipsis else token
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    response = yield treq.request("GET", client.base + path, headers=headers, pool=HTTPConnectionPool(reactor, persistent=False), unbuffered=True, timeout=TIMEOUT)
    return EventReader(path, response)
