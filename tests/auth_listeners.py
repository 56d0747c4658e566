"""
Every listener as the authentication deadline tests see it (L{listeners}):
how to start a request and not finish it, how to authenticate, and the
limit reply when the auth timeout is up.  For L{tests.unit.test_auth_deadlines}
(on a Clock) and L{tests.tcp.test_auth_deadlines} (over real TCP).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from jesync.connections.policy import ConnectionPolicy
from jesync.protocols.admin import AdminFactory
from jesync.protocols.dlock import DlockFactory
from jesync.protocols.dlock_pb2 import Ping, Request
from jesync.protocols.elock import ELockFactory
from jesync.protocols.jesync import JESyncFactory
from jesync.protocols.memcache import MemcacheFactory
from jesync.service import LockService
from jesync.store import ObjectStore
from tests.support import TOKEN, dlock_frame


def dlock_ping(token: bytes) -> bytes:
    return dlock_frame(Request(id=1, version=2, type=Ping, access_token=token.decode()))


def sasl_plain(token: bytes) -> bytes:
    value = b"\0user\0" + token
    body = b"PLAIN" + value
    return b"\x80\x21\x00\x05" + b"\x00" * 4 + len(body).to_bytes(4, "big") + b"\x00" * 12 + body


class Listener(NamedTuple):
    """One listener, as the tests see it."""

    name: str
    factory: Callable[[LockService, ConnectionPolicy], object]
    #: An unfinished request: a client that sends it, then a byte now and then, completes nothing.
    unfinished: bytes
    #: A byte that does not finish it.
    trickle: bytes
    #: A request with the right token, and the start of its answer.
    authenticate: bytes
    accepted: bytes
    #: The limit reply to a connection whose auth timeout is up (None: a dlock response).
    timed_out: bytes | None


def listeners(reply: bytes) -> list[Listener]:
    """Every listener, as the tests see it, when C{reply} is its timeout's text (C{auth-timeout exceeded (N)})."""
    return [
        Listener(
            "jesync",
            lambda service, policy: JESyncFactory(service, policy=policy),
            b"auth ",
            b"x",
            b"auth " + TOKEN + b"\n",
            b"OK\n",
            b"INVALID_PARAMETER: " + reply + b"\n",
        ),
        Listener(
            "elock",
            lambda service, policy: ELockFactory(service, policy=policy),
            b"auth ",
            b"x",
            b"auth " + TOKEN + b"\r\n",
            b"200 OK\r\n",
            b"503 " + reply + b"\r\n",
        ),
        Listener(
            "dlock",
            lambda service, policy: DlockFactory(service, policy=policy),
            (1000).to_bytes(4, "big"),
            b"\x08",
            dlock_ping(TOKEN),
            b"",
            None,
        ),
        Listener(
            "memcached text",
            lambda service, policy: MemcacheFactory(ObjectStore(service), policy=policy),
            b"set auth 0 0 %d\r\nuser " % (len(TOKEN) + 5),
            b"x",
            b"set auth 0 0 %d\r\nuser %s\r\n" % (len(TOKEN) + 5, TOKEN),
            b"STORED\r\n",
            b"SERVER_ERROR " + reply + b"\r\n",
        ),
        Listener(
            "memcached binary",
            lambda service, policy: MemcacheFactory(ObjectStore(service), policy=policy),
            sasl_plain(TOKEN)[:30],
            b"x",
            sasl_plain(TOKEN),
            b"\x81\x21",
            # (cut short in its first binary request: answered in binary, that request's opcode)
            b"\x81\x21\x00\x00\x00\x00\x00\x86" + len(reply).to_bytes(4, "big") + b"\x00" * 12 + reply,
        ),
        Listener(
            "admin",
            lambda service, policy: AdminFactory(service, policy=policy),
            b"auth ",
            b"x",
            b"auth " + TOKEN + b"\n",
            b"OK\n",
            b"INVALID_PARAMETER: " + reply + b"\n",
        ),
    ]
