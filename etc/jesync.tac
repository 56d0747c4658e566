"""
jesync as a .tac file: the server `twistd jesync` runs, built by the same
function from the same settings, so an application can start from it (add
its own services to `application`, take locks from `server.locks`).

    twistd -ny etc/jesync.tac

JESYNC_PORT overrides the endpoint (default tcp:11400).
"""

import os

from twisted.application import service
from twisted.internet import reactor

from jesync.server import ServerSettings, build_server

application = service.Application("jesync")

settings = ServerSettings(ports=[os.environ.get("JESYNC_PORT", "tcp:11400")])
server = build_server(reactor, settings)
server.setServiceParent(application)
