"""
A whole jesync server in memory, for tests: L{MemoryServer} is the real
server (L{jesync.server.build_lock_server}: the same factories, policies and
limits as C{twistd jesync} builds from the same settings) listening on a
L{MemoryReactorClock}, and what connects to it is paired with it in memory
over L{twisted.test.iosim}: no socket, no thread, and time moves only when
the test says.  As C{treq.testing} does for HTTP.

    server = MemoryServer()                    # or MemoryServer(elock_ports=["tcp:11401"]),
                                               # or MemoryServer.from_args(["--elock-port", "11401"])
    client = server.client()                   # a real TwistedClient, on the server's reactor
    granted = client.lock("report")            # a Deferred...
    server.flush()                             # ...that fires once the bytes have moved
    server.advance(30)                         # 30 s later (then flushed)
    peer = server.connect("jesync")            # raw bytes to one listener
    peer.send(b"status report\\n"); server.flush(); peer.received()

Why a harness of its own, and not the in-memory pieces one by one: the
client connects through its own endpoint (C{HostnameEndpoint} ->
C{connectTCP}), the server listens through its own (C{serverFromString} ->
C{listenTCP}), and both are real; only the reactor under them is memory.
Each connection's two ends are L{iosim.FakeTransport}s with the addresses a
loopback socket would have, so protected mode, peer names and C{sessions}
listings read as over TCP.  What memory cannot show stays in the TCP tests:
a full kernel buffer (memory never pushes back), half-close (a FIN alone),
UNIX sockets and TLS.

This module sits at the top of jesync, beside the composition root: it
imports the server and the client, and nothing in jesync imports it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, List, Optional, Sequence, Tuple

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionAborted, ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import IConnector, IListeningPort, IProtocol, IProtocolFactory
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test import iosim
from zope.interface import implementer

from jesync.client.txclient import TwistedClient
from jesync.lock_server import LockServer
from jesync.server import ServerSettings, build_lock_server
from jesync.service import LockService

__all__ = ["MemoryPeer", "MemoryServer", "NeverSettles"]

# Each listener of the default settings, on its suggested port.
LISTENER_FIELDS = {
    "jesync": "ports",
    "elock": "elock_ports",
    "dlock": "dlock_ports",
    "memcache": "memcache_ports",
    "admin": "admin_ports",
}

# Rounds of pumping after which a flush gives up: replies that keep coming
# (a loop between two protocols) would otherwise never end the test.
MOST_ROUNDS = 100_000


class NeverSettles(AssertionError):
    """Bytes kept moving for L{MOST_ROUNDS} rounds: two ends answer each other for ever."""


class _Transport(iosim.FakeTransport):
    """
    One end of a connection in memory: iosim's transport, which delivers
    nothing itself (the L{MemoryServer} pumps it), with what it lacks of a
    TCP socket's.  Aborting drops what was not sent yet, and each end then
    sees what it would over TCP: the aborting end
    L{ConnectionAborted}, the other L{ConnectionLost} (a reset).
    """

    other: Optional[_Transport] = None
    # (iosim types it as ConnectionDone: an abort's reasons are not)
    disconnectReason: Any = ConnectionDone("Connection done")

    def abortConnection(self) -> None:
        if self.disconnecting:
            return
        self.stream = []
        self.disconnectReason = ConnectionAborted()
        if self.other is not None and not self.other.disconnecting:
            self.other.disconnectReason = ConnectionLost("Connection reset by peer")
        self.disconnecting = True


@implementer(IListeningPort)
class _Port:
    """
    A listening port of the memory reactor: as a real one, it starts its
    factory when it listens and stops it when it stops listening (elock
    then ends the sessions nobody can resume), and takes no connection
    once stopped.
    """

    def __init__(self, reactor: _Reactor, number: int, factory: IProtocolFactory, interface: str) -> None:
        self.reactor = reactor
        self.number = number
        self.factory = factory
        self.interface = interface or "0.0.0.0"
        self.listening = False

    def startListening(self) -> None:
        if not self.listening:
            self.listening = True
            self.reactor.ports.append(self)
            self.factory.doStart()

    def stopListening(self) -> None:
        if self.listening:
            self.listening = False
            self.reactor.ports.remove(self)
            self.factory.doStop()

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", self.interface, self.number)


class _Reactor(MemoryReactorClock):
    """
    The server's and its clients' reactor: Twisted's memory reactor (and
    clock), whose C{listenTCP} returns a port that can be stopped, and
    whose port 0 is a port of its own.  Each C{connectTCP} is kept with
    its own connector in L{attempts} until the server pairs it (the
    reactor's C{connectors} also holds C{connectSSL}'s and C{connectUNIX}'s).
    """

    def __init__(self) -> None:
        super().__init__()
        self.ports: List[_Port] = []
        self._numbers = itertools.count(49152)
        #: each C{connectTCP} not paired yet: host, port, factory and its connector
        self.attempts: List[Tuple[str, int, ClientFactory, IConnector]] = []

    def listenTCP(self, port: int, factory: IProtocolFactory, backlog: int = 50, interface: str = "") -> _Port:
        super().listenTCP(port, factory, backlog, interface)
        listening = _Port(self, port or next(self._numbers), factory, interface)
        listening.startListening()
        return listening

    def connectTCP(
        self, host: str, port: int, factory: ClientFactory, timeout: float = 30, bindAddress: Any = None
    ) -> IConnector:
        connector = super().connectTCP(host, port, factory, timeout, bindAddress)
        self.attempts.append((host, port, factory, connector))
        return connector

    def port_for(self, number: int) -> Optional[_Port]:
        return next((port for port in self.ports if port.number == number), None)


class MemoryPeer(Protocol):
    """
    A raw connection to one listener: bytes in (L{send}), bytes out
    (L{received}), as a client's socket would see them.
    """

    transport: _Transport

    def __init__(self, server: MemoryServer) -> None:
        self.server = server
        self._received: List[bytes] = []
        #: why the connection closed (a Failure), once it has
        self.lost: Optional[Failure] = None

    def dataReceived(self, data: bytes) -> None:
        self._received.append(data)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:
        self.lost = reason

    @property
    def closed(self) -> bool:
        """Whether the connection has closed (the server closed it, or this end did and it was flushed)."""
        return self.lost is not None

    def send(self, data: bytes) -> None:
        """Write C{data}; it arrives at the next L{MemoryServer.flush}."""
        self.transport.write(data)

    def received(self) -> bytes:
        """Every byte received since the last call."""
        data, self._received = b"".join(self._received), []
        return data

    def ask(self, data: bytes) -> bytes:
        """Send C{data}, flush, and return every byte received since the last call."""
        self.send(data)
        self.server.flush()
        return self.received()

    def close(self) -> None:
        """Close the connection (as C{close()} on a socket), and flush."""
        self.transport.loseConnection()
        self.server.flush()

    def abort(self) -> None:
        """Reset the connection (unsent bytes are dropped), and flush."""
        self.transport.abortConnection()
        self.server.flush()


class MemoryServer:
    """
    A jesync server on a memory reactor: C{settings} (L{ServerSettings}; by
    default its defaults, with C{fields} set), built by
    L{build_lock_server} and started.  Only TCP listeners
    (C{tcp:<port>}) can be reached in memory.

    L{client} and L{connect} connect to it; nothing moves until L{flush}
    (or L{advance}, which flushes) pumps every connection until no byte,
    connection or close is left to deliver.  L{service} is its lock
    service; L{stop} stops it as twistd would.
    """

    def __init__(self, settings: Optional[ServerSettings] = None, **fields: Any) -> None:
        if settings is None:
            settings = ServerSettings(ports=["tcp:11400:interface=127.0.0.1"])
        self.settings = replace(settings, **fields) if fields else settings
        self.reactor = _Reactor()
        self.server: LockServer = build_lock_server(self.reactor, self.settings)
        self._pumps: List[iosim.IOPump] = []
        self._client_ports = itertools.count(40000)
        self.server.privilegedStartService()
        self.server.startService()

    @classmethod
    def from_args(cls, args: Sequence[str]) -> MemoryServer:
        """The server C{twistd jesync <args>} would run (as the tap reads them, token files and all)."""
        from jesync.tap import Options, settings_from

        options = Options()
        options.parseOptions(list(args))
        return cls(settings_from(options))

    @property
    def service(self) -> LockService:
        """The lock service: its table is every protocol's."""
        return self.server.locks

    # -- connecting ------------------------------------------------------

    def address(self, listener: str = "jesync") -> str:
        """C{host:port} of C{listener} (C{"jesync"}, C{"elock"}, C{"dlock"}, C{"memcache"}, C{"admin"})."""
        port = self._port(listener)
        host = port.interface if port.interface != "0.0.0.0" else "127.0.0.1"
        return f"{host}:{port.number}"

    def client(self, **options: Any) -> TwistedClient:
        """
        A real L{TwistedClient} of the JESync listener, on this server's
        reactor (C{options}: the client's own, as C{read_timeout=}; its
        C{environ} is empty unless given, so no C{JESYNC_*} variable of
        the test's process reaches it).
        """
        options.setdefault("environ", {})
        return TwistedClient(self.reactor, options.pop("servers", self.address()), **options)

    def connect(self, listener: str = "jesync", host: str = "127.0.0.1") -> MemoryPeer:
        """
        A raw connection to C{listener}, connected (flushed) before this
        returns; C{host} is the address it comes from (the server sees
        a remote client for one that is not loopback).
        """
        port = self._port(listener)
        peer = MemoryPeer(self)
        self._pair(peer, port, host)
        self.flush()
        return peer

    def _port(self, listener: str) -> _Port:
        field = LISTENER_FIELDS.get(listener)
        factory = self.server.factories.get(listener)
        if field is None or factory is None:
            raise ValueError(f"no {listener} listener: the settings' {field or listener} is empty")
        for port in self.reactor.ports:
            if port.factory is factory:
                return port
        raise ValueError(f"the {listener} listener is not on TCP (only tcp: endpoints are reachable in memory)")

    def _pair(self, client: IProtocol, port: _Port, host: str) -> iosim.IOPump:
        """
        Connect C{client} (from C{host}) to C{port}'s factory: each end a
        transport with the addresses its socket would have.  A factory that
        builds no protocol closes the connection at once, as a real port
        does (the client sees it connect, then close).
        """
        client_address = IPv4Address("TCP", host, next(self._client_ports))
        server_host = port.interface if port.interface != "0.0.0.0" else "127.0.0.1"
        server_address = IPv4Address("TCP", server_host, port.number)
        built = port.factory.buildProtocol(client_address)
        refused = built is None
        server = Protocol() if built is None else built
        server_transport = _Transport(server, isServer=True, hostAddress=server_address, peerAddress=client_address)
        client_transport = _Transport(client, isServer=False, hostAddress=client_address, peerAddress=server_address)
        server_transport.other, client_transport.other = client_transport, server_transport
        pump = iosim.connect(
            server, server_transport, client, client_transport, greet=False, clock=self.reactor
        )
        if refused:
            server_transport.loseConnection()
        self._pumps.append(pump)
        return pump

    def _accept(self) -> bool:
        """
        Pair every C{connectTCP} made so far with its listener; refuse those
        with none.  A client factory that builds no protocol is told its
        connection was lost, as a real connector's is.  Whether there was any.
        """
        attempts, self.reactor.attempts = self.reactor.attempts, []
        for host, number, factory, connector in attempts:
            port = self.reactor.port_for(number)
            if port is None or port.interface not in ("0.0.0.0", host):
                factory.clientConnectionFailed(connector, Failure(ConnectionRefusedError()))
                continue
            protocol = factory.buildProtocol(IPv4Address("TCP", host, number))
            if protocol is None:
                factory.clientConnectionLost(connector, Failure(ConnectionDone()))
                continue
            self._pair(protocol, port, "127.0.0.1")
        return bool(attempts)

    # -- moving bytes and time -------------------------------------------

    def flush(self) -> None:
        """
        Deliver everything: connections made, bytes written, closes, and
        what they cause, until nothing moves (at the current time: calls
        due now run, none later).
        """
        for _ in range(MOST_ROUNDS):
            self.reactor.advance(0)
            moved = self._accept()
            for pump in list(self._pumps):
                if pump.pump(advanceClock=False):
                    moved = True
                if pump.clientIO.disconnected and pump.serverIO.disconnected:
                    self._pumps.remove(pump)
            if not moved:
                return
        raise NeverSettles(f"bytes still moving after {MOST_ROUNDS} rounds")

    def advance(self, seconds: float) -> None:
        """
        Let C{seconds} pass, flushing at every timer due on the way (so
        that what one timer causes is delivered before the next one runs).
        """
        self.flush()
        end = self.reactor.seconds() + seconds
        while True:
            due = [call.getTime() for call in self.reactor.getDelayedCalls() if call.getTime() <= end]
            if not due:
                break
            self.reactor.advance(max(0.0, min(due) - self.reactor.seconds()))
            self.flush()
        self.reactor.advance(end - self.reactor.seconds())
        self.flush()

    def drop_connections(self) -> None:
        """Abort every connection (as a crashed server would: the peers see a reset), and flush."""
        for connection in list(self.server.policy.connections):
            connection.transport.abortConnection()
        self.flush()

    def stop(self) -> None:
        """Stop the server as twistd would (every connection closed, the grace period run out), and flush."""
        self.flush()
        self.server.stopService()
        self.advance(self.settings.shutdown_grace)

    @property
    def connections(self) -> int:
        """How many connections the server has open (all protocols)."""
        return len(self.server.policy.connections)

