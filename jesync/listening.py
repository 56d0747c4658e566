"""
Listening on endpoints, all of them or none: L{Listeners} starts a
L{Listener} per endpoint and, if one cannot listen, closes the others and
raises (or reports) L{ListenFailed}, in one line naming the endpoint and
why.  A server that listens on some of its endpoints and not others would
serve clients that then find the rest missing; one that does not start at
all is seen and fixed at once.

Every C{ssl:} endpoint is given the server's L{TLSPolicy} before it listens
(Twisted's parser takes neither a cipher list nor a minimum version), and
an endpoint is shown in a log only as L{public_endpoint} shows it (never a
TLS key's path).  This is the lowest serving layer above Twisted: it knows
nothing of locks or protocols (a L{jesync.lock_server.LockServer} and a
cluster member are both L{Listeners}).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints, tcp
from twisted.internet.defer import CancelledError, Deferred, gatherResults, succeed
from twisted.internet.error import CannotListenError, ConnectionDone
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IReactorTime, IStreamServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

# Endpoint types whose every argument may be shown: where they listen, no secrets.
_PLAIN_ENDPOINTS = frozenset({"tcp", "tcp6", "unix", "systemd"})
# The arguments of any other type (ssl: and plugins) that may be: where it
# listens.  Not its other arguments (ssl:'s privateKey, certKey,
# extraCertChain, dhParameters, ...: files an operator may not want in a log).
_SHOWN_ARGUMENTS = frozenset({"port", "interface", "backlog"})


def _split_description(text: str, separator: str, most: int = -1) -> List[str]:
    """C{text} split at each C{separator} that a backslash does not escape (escapes kept)."""
    parts: List[str] = []
    start = index = 0
    while index < len(text) and most != len(parts):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == separator:
            parts.append(text[start:index])
            start = index + 1
        index += 1
    parts.append(text[start:])
    return parts


def public_endpoint(description: str) -> str:
    """
    The endpoint C{description} as the log may show it.  TCP, UNIX and
    systemd endpoints as they are; any other (C{ssl:}, plugins) as its type,
    its first argument (the port) and its C{port}, C{interface} and
    C{backlog} arguments: C{ssl:11443:privateKey=key.pem:certKey=cert.pem}
    is shown as C{ssl:11443}.
    """
    kind, *arguments = _split_description(description, ":")
    if not arguments or kind.lower() in _PLAIN_ENDPOINTS:
        return description
    shown = [kind]
    positional = 0
    for argument in arguments:
        name = _split_description(argument, "=", 1)
        if len(name) == 2:
            if name[0] in _SHOWN_ARGUMENTS:
                shown.append(argument)
        else:
            positional += 1
            if positional == 1:
                shown.append(argument)
    return ":".join(shown)


class ListenFailed(Exception):
    """
    A L{LockServer} did not start: some of its endpoints could not listen.
    Its message says which and why, in one line (C{cannot listen on
    tcp:11400: address already in use}).

    Its public name is C{jesync.server.ListenFailed} (the embedding API
    docs/embedding.md documents, which re-exports it), and that is the name tracebacks
    show: twistd, when it daemonizes, tells the starting process the
    exception's qualified name and message in 100 bytes, so a longer module
    name would cut the reason short.
    """

    __module__ = "jesync.server"


def listen_error(description: str, reason: Failure) -> str:
    """Why the endpoint C{description} could not listen, in a few words."""
    error = reason.value
    cause = error.socketError if isinstance(error, CannotListenError) else error
    if isinstance(cause, OSError) and cause.strerror:
        why = cause.strerror[:1].lower() + cause.strerror[1:]
    else:
        why = str(cause) or type(cause).__name__
    return f"cannot listen on {public_endpoint(description)}: {why}"


def _close_now(port: IListeningPort) -> None:
    """
    Stop listening on C{port} at once, rather than on the reactor's next
    turn (which a process that failed to start never takes): its socket
    closed and, for a UNIX socket, its file removed, so a restart can bind it.
    """
    if isinstance(port, tcp.Port):  # TCP, TLS and UNIX ports of the POSIX reactors
        if port.connected:
            port.stopReading()
            port.connectionLost(Failure(ConnectionDone("another endpoint could not listen")))
    else:
        port.stopListening()


# TLS 1.2's suites a listener accepts by default: forward-secret key
# exchange (ECDHE, or DHE with dhParameters=) and AEAD ciphers only.  TLS
# 1.3's suites are all of that kind; OpenSSL's own list of them is used.
DEFAULT_TLS_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL"
TLS_VERSIONS = ("1.2", "1.3")


@dataclass(frozen=True)
class TLSPolicy:
    """
    What every C{ssl:} listener accepts (C{--tls-ciphers},
    C{--tls-min-version}): by default TLS 1.2 or newer, and, for TLS 1.2,
    forward-secret AEAD suites only (L{DEFAULT_TLS_CIPHERS}).  Twisted's
    C{ssl:} parser takes neither a cipher list nor a minimum version, and
    its own defaults still accept TLS 1.0 and static-RSA CBC suites
    (C{AES128-SHA}), so L{apply} gives each such endpoint new options,
    with this policy, built from the certificate, key, chain and DH
    parameters it parsed.

    @ivar ciphers: an OpenSSL cipher string, for TLS 1.2 (TLS 1.3's suites
        are OpenSSL's).
    @ivar min_version: C{"1.2"} or C{"1.3"}.
    """

    ciphers: str = DEFAULT_TLS_CIPHERS
    min_version: str = "1.2"

    def check(self) -> None:
        """
        @raise ValueError: the cipher string selects no suite OpenSSL has,
            or the version is not one of L{TLS_VERSIONS}.
        """
        if self.min_version not in TLS_VERSIONS:
            raise ValueError(f"{self.min_version}: not one of {', '.join(TLS_VERSIONS)}")
        self.options()

    def options(self, **credentials: Any) -> Any:
        """A L{CertificateOptions} of this policy, for the C{credentials} (its certificate, key, chain, DH)."""
        from twisted.internet.ssl import AcceptableCiphers, CertificateOptions, TLSVersion  # (the tls extra: pyOpenSSL)

        acceptable = AcceptableCiphers.fromOpenSSLCipherString(self.ciphers)
        minimum = TLSVersion.TLSv1_3 if self.min_version == "1.3" else TLSVersion.TLSv1_2
        try:
            return CertificateOptions(acceptableCiphers=acceptable, raiseMinimumTo=minimum, **credentials)
        except ValueError as error:  # Twisted's: "... yielded no usable ciphers on this platform."
            if "cipher" not in str(error):
                raise
            raise ValueError(f"{self.ciphers!r} selects no cipher suite this OpenSSL has") from None

    def apply(self, endpoint: IStreamServerEndpoint) -> None:
        """
        Give an C{ssl:} endpoint this policy's options, before it listens
        (so before its context is made); any other endpoint is left alone.
        The certificate, key and chain go in as C{cryptography}'s objects
        rather than pyOpenSSL's: Twisted's C{ssl:} parser (through 26.10 at
        least) loads them as pyOpenSSL C{X509} and C{PKey}, which pyOpenSSL
        deprecates handing to a context (a DeprecationWarning from 24.3).

        @raise ValueError: the endpoint was given an C{sslmethod}, which
            these options replace (C{--tls-min-version} says the versions).
        """
        parsed = getattr(endpoint, "_sslContextFactory", None)
        if parsed is None:
            return
        from OpenSSL import SSL, crypto  # only for ssl:, which needs it anyway

        if parsed.method != SSL.TLS_METHOD:
            raise ValueError("sslmethod= is not taken: --tls-min-version says which TLS versions are accepted")

        def current(value: Any) -> Any:
            if isinstance(value, crypto.X509):
                return value.to_cryptography()
            if isinstance(value, crypto.PKey):
                return value.to_cryptography_key()
            return value

        endpoint._sslContextFactory = self.options(  # type: ignore[attr-defined]
            certificate=current(parsed.certificate),
            privateKey=current(parsed.privateKey),
            extraCertChain=[current(certificate) for certificate in parsed.extraCertChain or ()] or None,
            dhParameters=parsed.dhParameters,
        )


class Listener(StreamServerEndpointService):
    """
    One endpoint of a L{LockServer}, serving C{factory} while the server
    runs.  Where Twisted's own service logs a failure to listen and carries
    on, this one leaves it to the L{LockServer}, which then does not start.
    """

    def __init__(self, description: str, endpoint: IStreamServerEndpoint, factory: IProtocolFactory) -> None:
        super().__init__(endpoint, factory)
        self.description = description
        self.port: Optional[IListeningPort] = None
        # How the last listen went: fires with the port, or fails with why not.
        self.listening: Optional[Deferred[IListeningPort]] = None

    def privilegedStartService(self) -> None:
        service.Service.privilegedStartService(self)
        outcome: Deferred[IListeningPort] = Deferred()
        self.listening = outcome

        def listened(port: IListeningPort) -> IListeningPort:
            self.port = port
            outcome.callback(port)
            return port

        def failed(reason: Failure) -> None:
            outcome.errback(reason)

        self._waitingForPort = self.endpoint.listen(self.factory).addCallbacks(listened, failed)

    def close_now(self) -> None:
        """Stop listening (or trying to) at once; starting again listens again."""
        if self._waitingForPort is not None:
            self._waitingForPort.cancel()  # a listen still under way
        if self.port is not None:
            _close_now(self.port)
        self.port = None
        self._waitingForPort = None

    def stopService(self) -> Deferred[None]:
        if self._waitingForPort is None:  # never listened, or closed already
            self.running = False
            self.port = None
            return succeed(None)
        stopped: Deferred[None] = super().stopService()
        self.port = None
        return stopped


class Listeners(service.MultiService):
    """
    Endpoints that listen all or not at all: starting listens on every one;
    once every one listens, L{listening_everywhere} is called.  If one
    cannot listen, the others stop listening and it logs why, in one line:
    when that is known at once (as for every endpoint type of Twisted's
    own), C{privilegedStartService} or C{startService} raises
    L{ListenFailed}, which makes C{twistd} exit with status 1; otherwise
    L{when_listening} tells.  (A L{LockServer}; a cluster member's metrics.)
    """

    log = Logger()

    def __init__(self, clock: IReactorTime) -> None:
        super().__init__()
        self.clock = clock
        # Every endpoint's listen, once started: fires with whether every one listens.
        self._listening: Optional[Deferred[Any]] = None
        # How the last start went (None: every endpoint listens), once known.
        self._outcome: Optional[Tuple[Optional[Failure]]] = None
        self._waiters: List[Deferred[None]] = []
        # What its ssl: endpoints accept (set before the first listen).
        self.tls = TLSPolicy()

    def listen(self, description: str, factory: IProtocolFactory) -> None:
        """Serve C{factory} on the endpoint C{description} while this service runs."""
        endpoint = endpoints.serverFromString(self.clock, description)
        self.tls.apply(endpoint)
        Listener(description, endpoint, factory).setServiceParent(self)

    def listeners(self) -> List[Listener]:
        return [child for child in self if isinstance(child, Listener)]

    def when_listening(self) -> Deferred[None]:
        """
        Fires once every endpoint listens (at once if they do), or fails with
        L{ListenFailed} if one cannot.
        """
        waiting: Deferred[None] = Deferred()
        if self._outcome is None:
            self._waiters.append(waiting)
        elif self._outcome[0] is None:
            waiting.callback(None)
        else:
            waiting.errback(self._outcome[0])
        return waiting

    def _settle(self, failure: Optional[Failure]) -> None:
        self._outcome = (failure,)
        waiters, self._waiters = self._waiters, []
        for waiting in waiters:
            if failure is None:
                waiting.callback(None)
            else:
                waiting.errback(failure)

    def privilegedStartService(self) -> None:
        """
        Listen on every endpoint: twistd calls this before it gives up root
        (C{--uid}), so ports below 1024 can be served.  Raises L{ListenFailed}
        if an endpoint cannot listen, once the others have stopped listening.
        """
        if self._listening is not None:
            return
        self._outcome = None
        super().privilegedStartService()
        settled: List[Tuple[Listener, Optional[Failure]]] = []

        def settle(result: object, listener: Listener) -> None:
            settled.append((listener, result if isinstance(result, Failure) else None))

        outcomes = []
        for listener in self.listeners():
            assert listener.listening is not None
            outcomes.append(listener.listening.addBoth(settle, listener))
        every = gatherResults(outcomes)
        if any(failure is not None for _, failure in settled):
            # (Every endpoint type of Twisted's own listens, or fails to, at once.)
            raise self._failed(settled)
        self._listening = every  # (before its callback, which may run at once)
        every.addCallback(lambda _: self._all_settled(settled, every))

    def _all_settled(self, settled: List[Tuple[Listener, Optional[Failure]]], every: Deferred[Any]) -> bool:
        """Whether every endpoint listens, once each one's listen has settled."""
        if self._listening is not every:
            return False  # stopped before every endpoint listened
        if any(failure is not None for _, failure in settled):
            self._failed(settled)
            return False
        return True

    def _failed(self, settled: List[Tuple[Listener, Optional[Failure]]]) -> ListenFailed:
        """Some endpoints could not listen: say why, and stop the others."""
        error = ListenFailed(
            "; ".join(
                listen_error(listener.description, failure)
                for listener, failure in settled
                if failure is not None and not failure.check(CancelledError)
            )
        )
        self.log.critical("jesync not started: {error}", error=error)
        for listener in self.listeners():
            listener.close_now()
        self._listening = None
        self._settle(Failure(error))
        return error

    def startService(self) -> None:
        """Listen on every endpoint (unless listening already); see L{privilegedStartService}."""
        self.privilegedStartService()
        super().startService()
        assert self._listening is not None
        self._listening.addCallback(self._listening_everywhere)

    def _listening_everywhere(self, everywhere: bool) -> None:
        if everywhere:
            self.listening_everywhere()
            self._settle(None)

    def listening_everywhere(self) -> None:
        """Every endpoint listens (for subclasses: say so, start what depends on it)."""

    def stop_listening(self) -> Deferred[None]:
        """Stop every endpoint (and the other children); starting again listens again."""
        self._listening = None
        stopped: Deferred[None] = super().stopService()
        return stopped
