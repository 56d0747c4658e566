"""
Whether the peer of a connection the server has stopped reading is gone.

A connection stops reading from its socket while more than C{HOLD_BUFFER}
bytes of requests are held behind a wait, or while its client does not take
its replies (L{jesync.connections.connection}).  The transport then stops
watching the descriptor for input, and with it goes the only way the reactor
learns of a FIN, an RST or a failed keepalive: on every reactor (epoll, poll,
select) these are reported as the descriptor becoming readable.  Left alone,
a dead client's waits would last until they end (up to 2**31 s), and a lock
released meanwhile could be granted to it.

So while reading is paused, the connection asks the kernel itself, every
L{PEER_CHECK} seconds: one C{poll()} on that one descriptor, for no input
event, with a zero timeout.  C{poll()} always reports C{POLLHUP} and
C{POLLERR} (the connection was reset, or keepalive gave up: the peer is
I{gone}); C{POLLRDHUP} (Linux) reports a FIN even while unread requests are
still queued before it (the peer's I{input ended}).  Nothing is read, so the
requests held stay for when reading resumes.  This is the same system call
whatever reactor serves the descriptor, and works under TLS (the check is on
the TLS layer's socket).  Where C{poll()} is missing (Windows), nothing is
checked; where C{POLLRDHUP} is (not Linux), a FIN is seen once reading
resumes, a reset or keepalive failure within L{PEER_CHECK}.

A timer per paused connection, not a watch on the descriptor: a reactor
offers no way to watch a descriptor for hang-up only, and paused connections
are few (the 64-connection lock path never pauses, so it pays nothing).
"""

from __future__ import annotations

import select
import socket
import sys
from typing import Optional

# Seconds between two checks of a paused connection's socket.
PEER_CHECK = 1.0

# What a check found (None: the peer is still there, or it cannot be told).
GONE = "gone"
INPUT_ENDED = "input ended"

_POLL = getattr(select, "poll", None)
# (PyPy does not name it; Linux's value since 2.6.17)
_POLLRDHUP: int = getattr(select, "POLLRDHUP", 0x2000 if sys.platform.startswith("linux") else 0)
_POLLNVAL: int = getattr(select, "POLLNVAL", 0)
_GONE_EVENTS = getattr(select, "POLLHUP", 0) | getattr(select, "POLLERR", 0) | _POLLNVAL


def peer_state(sock: Optional[socket.socket]) -> Optional[str]:
    """
    Whether C{sock}'s peer is gone (L{GONE}), has sent FIN with perhaps data
    still unread before it (L{INPUT_ENDED}), or neither (None).  Reads nothing.
    """
    if _POLL is None or sock is None:
        return None
    descriptor = sock.fileno()
    if descriptor < 0:
        return None
    poller = _POLL()
    poller.register(descriptor, _POLLRDHUP)
    events = 0
    for _, found in poller.poll(0):
        events |= found
    if events & _GONE_EVENTS:
        return GONE
    if events & _POLLRDHUP:
        return INPUT_ENDED
    return None
