"""
The HTTP API's connections: Twisted's own web server (L{ApiSite}) for the
one L{HttpApi} resource, its connections held to the rules every
listener's are, by the wrapper the metrics endpoint uses too
(L{jesync.metrics_connections.CountedFactory}):

 - B{counted in the server's one registry} (C{--max-connections} counts
   HTTP connections with every protocol's; over it, a plain C{503}), and
   closed with every other connection when the server stops (its calls
   still waiting answered first: L{jesync.http.api.HttpApi.close});
 - B{protected mode}: a client that is not local is refused at connect with
   C{403} and the API's JSON error C{{"code": "protected_mode"}};
 - B{the auth deadline}: with C{--auth-token-file}, a connection is closed
   unless one of its requests carried an accepted token within
   C{--auth-timeout} (L{authorized}, the API's C{on_authorized}, lifts it);
   and it is closed when the token it was authorized with is rotated out
   (SIGHUP), as every listener's connections are;
 - B{a request body is at most L{MAX_BODY} bytes} (L{CappedRequest}): a
   C{Content-Length} over it is refused before the body is read, a chunked
   body once it passes it: C{413 request_too_large}, and the connection
   closes: its write side at once (the reply, then a FIN), the rest when
   the client has closed, or L{REFUSED_LINGER} seconds later; what the
   client sends meanwhile is read and thrown away, never kept (a socket
   closed with bytes unread is reset, which could lose the reply).

The site logs no line per request (a client polling would flood the log)
unless the server is verbose.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.application import service
from twisted.internet.interfaces import IDelayedCall, IProtocolFactory, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.server import Request, Site

from jesync.connections.policy import ConnectionPolicy, Connections, describe_peer
from jesync.errors import ProtectedMode
from jesync.http.api import ApiError, HttpApi, encode_json
from jesync.metrics_connections import CountedFactory, Refusal, refusal_response, scraper_authorized
from jesync.sessions import SessionTable

log = Logger()

# The largest request body read, in bytes: every API request is a small JSON object.
MAX_BODY = 64 * 1024
# Seconds a client refused for its body's size is given to take the reply
# and close before its connection is aborted.
REFUSED_LINGER = 2.0

PROTECTED_REFUSAL = Refusal(
    b"403 Forbidden",
    b"application/json",
    encode_json({"code": "protected_mode", "message": ProtectedMode.MESSAGE}),
)
TOO_LARGE = ApiError(413, "request_too_large", f"the request body is longer than {MAX_BODY} bytes")
TOO_LARGE_REFUSAL = Refusal(b"413 Content Too Large", b"application/json", encode_json(TOO_LARGE.document()))


def authorized(request: Any, generation: int) -> None:
    """
    A request carried an accepted token (of C{generation}): its connection
    is authorized (no auth deadline; closed when that token is rotated out).
    """
    scraper_authorized(request, generation)


class _Discard:
    """Where the rest of a refused body goes."""

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args: Any) -> int:
        return 0

    def read(self, *args: Any) -> bytes:
        return b""

    def close(self) -> None:
        pass


class CappedRequest(Request):
    """
    A request whose body may be at most L{MAX_BODY} bytes: over it, C{413
    request_too_large} is written at once, then a FIN; the rest of the body
    is read and thrown away until the client closes, or is aborted
    L{REFUSED_LINGER} seconds later.  The request is never rendered.
    """

    refused = False
    _received = 0
    _linger: Optional[IDelayedCall] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: Optional[int]) -> None:
        if length is not None and length > MAX_BODY:
            # (no "100 Continue" for a body that will not be read)
            self.requestHeaders.removeHeader(b"expect")
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self._received += len(data)
        if self._received > MAX_BODY:
            self._refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self.refused:
            return
        super().requestReceived(command, path, version)

    def connectionLost(self, reason: Failure) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        super().connectionLost(reason)

    def _refuse(self) -> None:
        self.refused = True
        self.content = _Discard()
        transport: Any = self.channel.transport
        transport.write(refusal_response(TOO_LARGE_REFUSAL))
        # (reading on, so that the reply is not lost to a reset)
        getattr(transport, "loseWriteConnection", transport.loseConnection)()
        self._linger = self.channel.callLater(REFUSED_LINGER, transport.abortConnection)


class ApiChannel(http.HTTPChannel):
    """
    An HTTP connection held to the line protocols' rule for a client that
    does not read its replies (L{jesync.connections.connection}):

     - while the transport is paused (its buffer full), no further
       pipelined request is processed: the one that finished is done, the
       next waits, and reading stops, until the transport resumes.
       (twisted.web's own channel goes on to the next request already
       received even while paused, so a client that pipelines requests for
       a large reply and never reads could make the server buffer replies
       without bound);
     - once the transport has been paused for a whole reactor turn, what
       is written counts toward C{max_unsent} (what one turn writes is
       never counted: a client that reads as fast as it can is never cut
       off); past it the connection is aborted, logged as "not reading its
       replies".  (Response heads, written by twisted.web straight to the
       transport, are not counted: they are small.)

    It relies on these private attributes of twisted.web's HTTPChannel
    (Twisted 25.5 and 26.10 alike): C{_waitingForTransport} (the transport
    paused it), C{_networkProducer} (the transport, to stop reading) and
    C{requestDone}'s replay of the data buffered meanwhile
    (C{_handlingRequest}, C{_dataBuffer}: left to it, called later).
    """

    max_unsent: Optional[int] = None
    _held: Optional[http.Request] = None
    _paused_long = False
    _behind = 0
    _dropped = False

    def requestDone(self, request: http.Request) -> None:
        if self._waitingForTransport and self.persistent:
            # (still "handling a request": what arrives is buffered, and
            # played back when it is done, on resumeProducing)
            self._held = request
            if not self._dropped:
                self._networkProducer.pauseProducing()
            return
        super().requestDone(request)

    def pauseProducing(self) -> None:
        if not self._waitingForTransport:
            self._behind = 0
            self.callLater(0, self._pause_lasted)
        super().pauseProducing()

    def _pause_lasted(self) -> None:
        if self._waitingForTransport:
            self._paused_long = True

    def resumeProducing(self) -> None:
        self._paused_long = False
        self._behind = 0
        super().resumeProducing()
        held, self._held = self._held, None
        if held is not None and not self._waitingForTransport:
            super().requestDone(held)

    def write(self, data: bytes) -> None:
        super().write(data)
        self._count_behind(len(data))

    def writeSequence(self, iovec: Any) -> None:
        super().writeSequence(iovec)
        self._count_behind(sum(len(data) for data in iovec))

    def _count_behind(self, size: int) -> None:
        if not self._paused_long or self.max_unsent is None or self._dropped:
            return
        self._behind += size
        if self._behind > self.max_unsent:
            transport: Any = self.transport
            log.info(
                "{peer} dropped: not reading its replies ({behind} bytes behind)",
                peer=describe_peer(transport.getPeer()),
                behind=self._behind,
            )
            self._paused_long = False
            self._dropped = True
            transport.abortConnection()


class ApiSite(Site):
    """
    The API's site: its requests capped (L{CappedRequest}), its connections
    held to C{max_unsent} (L{ApiChannel}) and closed after C{idle_timeout}
    seconds between requests (C{--idle-timeout}, as every listener's: none
    while a request is answered, a long poll or an event stream included;
    None: never); no access log line per request unless C{verbose}.
    """

    noisy = False
    requestFactory = CappedRequest
    # (the channel itself, not twisted.web's wrapper that would offer HTTP/2
    # by ALPN: the API speaks HTTP/1.1)
    protocol = ApiChannel  # type: ignore[assignment]

    def __init__(
        self,
        api: HttpApi,
        verbose: bool = False,
        reactor: Optional[IReactorTime] = None,
        max_unsent: Optional[int] = None,
        idle_timeout: Optional[float] = None,
    ) -> None:
        super().__init__(api, reactor=reactor, timeout=idle_timeout)
        self.verbose = verbose
        self.max_unsent = max_unsent

    def buildProtocol(self, addr: Any) -> Any:
        channel = super().buildProtocol(addr)
        channel.max_unsent = self.max_unsent
        return channel

    def log(self, request: http.Request) -> None:
        if self.verbose:
            super().log(request)


def http_factory(
    api: HttpApi,
    policy: ConnectionPolicy,
    clock: IReactorTime,
    registry: Optional[Connections] = None,
    verbose: bool = False,
) -> IProtocolFactory:
    """
    The factory to listen with for C{api}: its site, its connections counted
    in C{registry} (the policy's: the server's one registry), refused in
    protected mode, closed at the auth deadline unless authorized
    (L{authorized}; give it to the L{HttpApi} as C{on_authorized}).
    """
    return CountedFactory(
        ApiSite(api, verbose, reactor=clock, max_unsent=policy.max_unsent, idle_timeout=policy.idle_timeout),
        policy.connections if registry is None else registry,
        protected=policy.protected,
        auth_timeout=policy.auth_timeout if policy.auth_token is not None else None,
        clock=clock,
        policy=policy,
        protected_refusal=PROTECTED_REFUSAL,
        answers_when_deposed=True,
    )


class ApiClosing(service.Service):
    """
    A child of the lock server: when the server stops (in cluster mode: its
    term ends), the API answers every call still waiting (C{409
    not_granted}, saying why) and ends its streams, before the server closes
    the connections; the listing snapshots it kept are released; and the
    HTTP sessions end (their locks released), as elock's detached sessions
    do when its listeners stop.
    """

    def __init__(self, api: HttpApi, sessions: SessionTable) -> None:
        self.api = api
        self.sessions = sessions

    def startService(self) -> None:
        super().startService()
        self.api.closed = None  # (a server started again serves again)

    def stopService(self) -> None:
        super().stopService()
        self.api.close("the server is stopping")
        self.api.context.listing_snapshots.drop_all()
        self.sessions.end_detached()
