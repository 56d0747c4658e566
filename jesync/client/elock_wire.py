"""
The elock protocol from the client's side, without I/O: the servers an
elock client talks to, requests as bytes, replies parsed, and the rule that
settles a request a failover interrupted.

elock's locks belong to a session that outlives its connection for a grace
period; a client that reconnects takes its session back with C{conn_id <id>}.
But on jesync C{conn_id <unknown id>} starts a new, empty session under that
id, so a resumed session proves nothing about its locks: the client asks
C{owned <key>} (a jesync extension) for every key it held, and reports the
others lost.  Every request is safe to send again once the client knows what
the session holds: C{lock} of a key the session holds is granted at once, and
an C{unlock} of a key it no longer holds has nothing left to do.  So
L{after_resume} decides, from C{owned}'s answers alone, whether an
interrupted request is done or is sent again.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple, Optional, Sequence, Union

from jesync.client.address import Address, ClusterAddress, Member, TCPAddress, UNIXAddress, parse_address
from jesync.client.errors import PROTECTED_MODE, AccessRefused, AuthFailed, ServerError
from jesync.client.wire import UnexpectedReply, check_key, whole_seconds
from jesync.errors import LockTimeout
from jesync.wire import LARGEST_NUMBER, MAX_TOKEN

#: The conventional elock port on jesync (C{--elock-port 11401}): elock's own
#: default, 11400, is JESync's.
DEFAULT_ELOCK_PORT = 11401

# host:port, [v6]:port: an explicit port (a bare IPv6 address has none).
_EXPLICIT_PORT = re.compile(r"^(\[[^\]]*\]|[^:\[\]]*):\d+$")


# -- servers ---------------------------------------------------------------


def parse_members(servers: Union[str, Address, Sequence[Union[str, Member]]]) -> tuple[Member, ...]:
    """
    The members to try, in order, from one server or one cluster: an address
    (C{"host"}, C{"host:port"}, C{"[::1]:port"}, C{"unix:/path"}), a
    cluster's members separated by C{|} (C{"a:11401|b:11401"}), an address
    object, or a list of the members of one cluster.  A host without a port
    gets the elock port, 11401.  Raise ValueError for anything else: an elock
    client speaks for one session, on one server or cluster, so it takes no
    list of independent servers (C{"a,b"}).
    """
    if isinstance(servers, ClusterAddress):
        members: list[Member] = list(servers.members)
    elif isinstance(servers, (TCPAddress, UNIXAddress)):
        members = [servers]
    elif isinstance(servers, str):
        if "," in servers or len(servers.split()) > 1:
            raise ValueError(
                f"{servers!r}: an elock client talks to one server or one cluster; separate a cluster's members with |"
            )
        members = [_member(part) for part in servers.split("|")]
    else:
        members = [member if isinstance(member, (TCPAddress, UNIXAddress)) else _member(member) for member in servers]
    if not members:
        raise ValueError("no server address given")
    if len(set(members)) != len(members):
        raise ValueError("a cluster member is listed twice")
    return tuple(members)


def _member(text: str) -> Member:
    if not isinstance(text, str):
        raise TypeError(f"a server address is a str, not {type(text).__name__}")
    text = text.strip()
    if not text:
        raise ValueError("an empty cluster member (two | in a row, or one at an end)")
    address = parse_address(text)
    if isinstance(address, ClusterAddress):  # cannot happen: no | left
        raise ValueError(f"{text!r} is not one address")
    if isinstance(address, TCPAddress) and not _EXPLICIT_PORT.match(text):
        return TCPAddress(address.host, DEFAULT_ELOCK_PORT)
    return address


# -- arguments -------------------------------------------------------------


def wait_seconds(wait: float) -> int:
    """elock waits whole seconds: round up (0.2 waits up to 1 s, never less than asked)."""
    return whole_seconds(wait, "wait")


def grace_milliseconds(grace: float) -> int:
    """A session's grace period as C{set_timeout}'s milliseconds; ValueError if the protocol cannot carry it."""
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace != grace:
        raise TypeError(f"grace must be a number of seconds, not {grace!r}")
    if grace < 0:
        raise ValueError("grace cannot be negative")
    milliseconds = int(round(grace * 1000))
    if milliseconds > LARGEST_NUMBER:
        raise ValueError(f"grace is at most {LARGEST_NUMBER // 1000} seconds")
    return milliseconds


# -- requests --------------------------------------------------------------


def lock_request(key: str, wait: int) -> bytes:
    return b"lock %s %d\r\n" % (check_key(key), wait)


def unlock_request(key: str) -> bytes:
    return b"unlock %s\r\n" % check_key(key)


def owned_request(key: str) -> bytes:
    """C{owned <key>}: whether this session holds the key (C{200 owned [<token>]} or C{404 not_owned})."""
    return b"owned %s\r\n" % check_key(key)


UNLOCK_ALL = b"unlock_all\r\n"
#: asks this session's id (C{200 <id>}); the client's heartbeat, too
CONN_ID = b"conn_id\r\n"
FENCING_ON = b"fencing on\r\n"
QUIT = b"quit\r\n"


def resume_request(session_id: str) -> bytes:
    return b"conn_id %s\r\n" % session_id.encode("utf-8", "surrogateescape")


def set_timeout_request(milliseconds: int) -> bytes:
    return b"set_timeout %d\r\n" % milliseconds


def auth_request(token: bytes) -> bytes:
    if not token or len(token.split()) != 1:
        raise ValueError("an auth token is one word, without whitespace")
    return b"auth %s\r\n" % token


# -- replies ---------------------------------------------------------------


class ELockReply(NamedTuple):
    """A reply line: its status (C{200}, C{403}, ...) and the text after it."""

    status: int
    text: str

    def __str__(self) -> str:
        return f"{self.status} {self.text}"


def parse_reply(line: bytes) -> ELockReply:
    """One reply line (without its C{\\n}); raise L{UnexpectedReply} if it is not C{<3 digits> <text>}."""
    if line.endswith(b"\r"):
        line = line[:-1]
    status, _, text = line.partition(b" ")
    if len(status) != 3 or not status.isdigit():
        raise UnexpectedReply(f"not an elock reply: {line.decode('utf-8', 'replace')!r}")
    return ELockReply(int(status), text.decode("utf-8", "surrogateescape"))


#: The server's answer to a wrong token, or to a request before C{auth} when it wants one.
AUTH_REFUSED = ELockReply(403, "auth failed")


def refuses_connection(reply: ELockReply) -> bool:
    """
    Whether C{reply} is the server refusing this client the connection,
    which it closes next, whatever was asked: a token refused or missing
    (C{403 auth failed}), or protected mode (C{503 protected mode: ...}).
    """
    return reply == AUTH_REFUSED or (reply.status == 503 and reply.text.startswith(PROTECTED_MODE))


def connection_refused(address: str, reply: ELockReply, sent_token: bool) -> AccessRefused:
    """The error for a reply that L{refuses_connection}: L{AuthFailed} for the token, else L{AccessRefused}."""
    if reply == AUTH_REFUSED:
        return AuthFailed(address, str(reply), sent_token)
    return AccessRefused(address, str(reply))


def is_unknown_command(reply: ELockReply) -> bool:
    """Whether the server does not know the command (an older jesync, or elock itself)."""
    return reply.status == 400 and reply.text.startswith("Unknown command")


def refused(reply: ELockReply) -> ServerError:
    """The error for a reply that refuses a request (C{400 ...}, C{503 ...}), word for word."""
    return ServerError(str(reply))


def acquired(reply: ELockReply, key: str, wait: int) -> Optional[int]:
    """
    A C{lock}'s outcome: the grant's fencing token (None without C{fencing
    on}); raise L{LockTimeout} for C{409} (held by someone else, and still
    after C{wait} seconds), L{ServerError} for a refusal.
    """
    if reply.status == 200 and (reply.text == "Acquired" or reply.text.startswith("Acquired ")):
        return _token(reply.text[len("Acquired") :], reply)
    if reply.status == 409:
        error = LockTimeout(key)
        error.args = (
            f"{key!r} is held by another session" if wait == 0 else f"{key!r} was not granted within {wait} s",
        )
        raise error
    raise refused(reply)


def unlocked(reply: ELockReply) -> bool:
    """An C{unlock}'s outcome: True for C{200 Unlocked}, False for C{403} (not this session's)."""
    if reply.status == 200:
        return True
    if reply.status == 403:
        return False
    raise refused(reply)


class Owned(NamedTuple):
    """C{owned}'s answer: whether the session holds the key, and the grant's token (with fencing on)."""

    held: bool
    token: Optional[int] = None


def owned(reply: ELockReply) -> Owned:
    """
    C{owned}'s answer; raise L{ServerError} for a refusal (one for which
    L{is_unknown_command} is true comes from a server without C{owned}).
    """
    if reply.status == 200 and (reply.text == "owned" or reply.text.startswith("owned ")):
        return Owned(True, _token(reply.text[len("owned") :], reply))
    if reply.status == 404:
        return Owned(False)
    raise refused(reply)


def session_id(reply: ELockReply) -> str:
    """C{conn_id}'s answer: the session's id."""
    if reply.status != 200 or not reply.text or len(reply.text.split()) != 1:
        raise UnexpectedReply(f"not a session id: {reply}")
    return reply.text


def _token(rest: str, reply: ELockReply) -> Optional[int]:
    rest = rest.strip()
    if not rest:
        return None
    if not rest.isdigit() or int(rest) > MAX_TOKEN:
        raise UnexpectedReply(f"not a fencing token: {reply}")
    return int(rest)


# -- after a failover --------------------------------------------------------


class Request(NamedTuple):
    """
    A request the client sends for its caller: C{kind} is C{"lock"},
    C{"unlock"}, C{"unlock_all"}, C{"owned"}, C{"ping"} (C{conn_id}, the
    heartbeat) or C{"quit"}; C{key} its key (None for the others).
    """

    kind: str
    key: Optional[str] = None

    def line(self, wait: int = 0) -> bytes:
        """The request on the wire (a C{lock} waits C{wait} seconds)."""
        if self.kind == "lock":
            assert self.key is not None
            return lock_request(self.key, wait)
        if self.kind == "unlock":
            assert self.key is not None
            return unlock_request(self.key)
        if self.kind == "owned":
            assert self.key is not None
            return owned_request(self.key)
        return {"unlock_all": UNLOCK_ALL, "ping": CONN_ID, "quit": QUIT}[self.kind]


#: L{after_resume}'s verdict: send the request again.
AGAIN = object()


def after_resume(request: Request, held: Optional[dict[str, Optional[int]]]) -> object:
    """
    What becomes of a request whose connection failed before its reply came,
    now that the session is back: L{AGAIN} to send it again, or its result.
    C{held} maps each key the resumed session holds (of those asked about)
    to its token; None if the server could not say (no C{owned}: the client
    then gave up every lock, so nothing is held).

     - C{lock}: held, so it was granted: its token; else send it again.
     - C{unlock}: no longer held, so it is done: True; else send it again.
     - C{owned}: answered by the resume: whether it is held.
     - C{ping}: nothing more to do.
     - C{unlock_all} and C{quit}: sending them again is harmless.
    """
    holds = held if held is not None else {}
    if request.kind == "lock":
        return holds[request.key] if request.key in holds else AGAIN
    if request.kind == "unlock":
        return AGAIN if request.key in holds else True
    if request.kind == "owned":
        return Owned(request.key in holds, holds.get(request.key or ""))
    if request.kind == "ping":
        return None
    return AGAIN


def keys_to_check(held: Iterable[str], request: Optional[Request]) -> list[str]:
    """The keys to ask C{owned} about after a resume: those held, and an interrupted request's key."""
    keys = list(dict.fromkeys(held))
    if request is not None and request.key is not None and request.key not in keys:
        keys.append(request.key)
    return keys
