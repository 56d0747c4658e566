"""
C{twistd jesync}: the command-line options and the service they build.
"""

from __future__ import annotations

from twisted.application import service
from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints
from twisted.python import usage

from jesync.protocols.jesync import JESyncFactory
from jesync.service import LockService

DEFAULT_PORT = "tcp:11400"


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
    )
    optFlags = [
        ["verbose", "v", "Log every command and reply (at debug level)."],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["ports"] = []

    def opt_port(self, value: str) -> None:
        """
        Where to listen for JESync clients: a port number or a Twisted
        endpoint description (tcp:7777:interface=127.0.0.1,
        unix:/run/jesync.sock, ssl:11401:privateKey=key.pem:certKey=cert.pem).
        May be given more than once. [default: 11400]
        """
        description = endpoint_description(value)
        try:
            endpoints.serverFromString(_ParseOnly(), description)
        except Exception as error:
            raise usage.UsageError(f"--port {value}: {error}") from None
        self["ports"].append(description)

    opt_p = opt_port

    def getUsage(self, width: int | None = None) -> str:
        return super().getUsage(width) + "\n" + self.examples

    def postOptions(self) -> None:
        if not self["ports"]:
            self["ports"] = [DEFAULT_PORT]


def makeService(options: Options) -> service.IService:
    """One lock service, listened on at every endpoint given."""
    from twisted.internet import reactor

    locks = LockService(reactor)
    factory = JESyncFactory(locks, verbose=bool(options["verbose"]))
    server = service.MultiService()
    for description in options["ports"]:
        endpoint = endpoints.serverFromString(reactor, description)
        StreamServerEndpointService(endpoint, factory).setServiceParent(server)
    return server
