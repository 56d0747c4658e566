"""
jesync as a .tac file: the same server as `twistd jesync`, written out so an
application can start from it (add its own services to `application`).

    twistd -ny etc/jesync.tac

JESYNC_PORT overrides the endpoint (default tcp:11400).
"""

import os

from twisted.application import internet, service
from twisted.internet import endpoints, reactor

from jesync import JESyncFactory, LockService

application = service.Application("jesync")

locks = LockService(reactor)
endpoint = endpoints.serverFromString(reactor, os.environ.get("JESYNC_PORT", "tcp:11400"))
internet.StreamServerEndpointService(endpoint, JESyncFactory(locks)).setServiceParent(application)
