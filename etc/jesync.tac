"""
jesync as a .tac file: a JESync server on one endpoint, with the graceful
stop of `twistd jesync`, written out so an application can start from it
(add its own services to `application`, take locks from `locks`).

    twistd -ny etc/jesync.tac

JESYNC_PORT overrides the endpoint (default tcp:11400).
"""

import os

from twisted.application import service
from twisted.internet import reactor

from jesync import JESyncFactory, LockService
from jesync.protocols.connections import ConnectionPolicy
from jesync.server import LockServer

application = service.Application("jesync")

locks = LockService(reactor)
policy = ConnectionPolicy()
server = LockServer(locks, policy, reactor)
server.summary = "the example .tac"
server.listen(os.environ.get("JESYNC_PORT", "tcp:11400"), JESyncFactory(locks, policy=policy))
server.setServiceParent(application)
