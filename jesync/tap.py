"""
C{twistd jesync}: the command-line options and the service they build.
"""

from __future__ import annotations

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints
from twisted.python import usage

from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.service import LockService

DEFAULT_PORT = "tcp:11400"
# elock's own default, 11400, is JESync's: elock listeners are off unless asked for.
SUGGESTED_ELOCK_PORT = 11401


def endpoint_description(value: str) -> str:
    """A bare port number means TCP on every interface, as in JESync."""
    return f"tcp:{value}" if value.isdigit() else value


class _ParseOnly:
    """A stand-in reactor: parsing a description builds an endpoint but never touches its reactor."""


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run a JESync-compatible lock server.  Clients ask it for named locks "
        "(mutexes and counting semaphores), wait for them in a fair queue, hold "
        "them with a failsafe expiry, and lose them when they disconnect."
    )
    examples = (
        "Examples:\n"
        "  twistd -n jesync                  TCP port 11400 on every interface\n"
        "  twistd -n jesync --port 7777\n"
        "  twistd -n jesync --port tcp:11400:interface=127.0.0.1 --port unix:/run/jesync.sock\n"
        f"  twistd -n jesync --elock-port {SUGGESTED_ELOCK_PORT}      JESync on 11400 and elock on {SUGGESTED_ELOCK_PORT}, one lock table\n"
    )
    optFlags = [
        ["verbose", "v", "Log every command and reply (at debug level)."],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["ports"] = []
        self["elock_ports"] = []

    def _add_endpoint(self, option: str, key: str, value: str) -> None:
        description = endpoint_description(value)
        try:
            endpoints.serverFromString(_ParseOnly(), description)
        except Exception as error:
            raise usage.UsageError(f"--{option} {value}: {error}") from None
        self[key].append(description)

    def opt_port(self, value: str) -> None:
        """
        Where to listen for JESync clients: a port number or a Twisted
        endpoint description (tcp:7777:interface=127.0.0.1,
        unix:/run/jesync.sock, ssl:11443:privateKey=key.pem:certKey=cert.pem).
        May be given more than once. [default: 11400]
        """
        self._add_endpoint("port", "ports", value)

    def opt_elock_port(self, value: str) -> None:
        """
        Where to listen for elock clients (a port number or an endpoint
        description, as for --port); may be given more than once. Off unless
        given; 11401 is suggested (elock's own default is JESync's 11400).
        """
        self._add_endpoint("elock-port", "elock_ports", value)

    opt_p = opt_port

    def getUsage(self, width: int | None = None) -> str:
        return super().getUsage(width) + "\n" + self.examples

    def postOptions(self) -> None:
        if not self["ports"]:
            self["ports"] = [DEFAULT_PORT]


def makeService(options: Options) -> service.IService:
    """One lock service, served over every protocol at every endpoint given."""
    from twisted.internet import reactor

    locks = LockService(reactor)
    verbose = bool(options["verbose"])
    server = service.MultiService()
    for factory, descriptions in [
        (JESyncFactory(locks, verbose), options["ports"]),
        (ELockFactory(locks, verbose), options["elock_ports"]),
    ]:
        for description in descriptions:
            endpoint = endpoints.serverFromString(reactor, description)
            StreamServerEndpointService(endpoint, factory).setServiceParent(server)
    return server
