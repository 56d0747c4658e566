"""
jesync: a lock server speaking the JESync protocol, on Twisted.

The embedding API::

    from jesync import LockService, JESyncFactory
    service = LockService(reactor)
    endpoint.listen(JESyncFactory(service))
"""

from jesync.errors import AlreadyWaiting, LockTimeout
from jesync.interfaces import IGrant, ILockService, KeyStatus
from jesync.protocols.elock import ELockFactory, ELockProtocol
from jesync.protocols.jesync import JESyncFactory, JESyncProtocol
from jesync.service import Grant, LockService

__all__ = [
    "AlreadyWaiting",
    "ELockFactory",
    "ELockProtocol",
    "Grant",
    "IGrant",
    "ILockService",
    "JESyncFactory",
    "JESyncProtocol",
    "KeyStatus",
    "LockService",
    "LockTimeout",
]
