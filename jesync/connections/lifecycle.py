"""
The lifecycle every connection goes through, whatever protocol it speaks.

::

    accepted --admit--> authenticating --authenticated--> ready
        |          \\--------------------admit (no token)---^  |
        |                                                      | input_ended (FIN)
      refuse        authenticating --input_ended---+           v
        |                                          |      half-closed
        v                                          v           | answered
     closing <--close-- (authenticating, ready, half-closed)   v
        |                                                   closing
        +--lost--> closed   (lost: from any state)

 - B{accepted}: the connection exists but is not counted yet.
 - B{authenticating}: the server has a token and this connection has not
   sent it; only C{auth} is read.
 - B{ready}: requests are read and answered.
 - B{half-closed}: the peer sent FIN (it half-closed, or closed: the server
   cannot tell which).  Its waits have ended with the protocol's not-granted
   reply; requests still buffered are answered, and any that would wait is
   answered not-granted at once.  Once everything is answered: closing.
 - B{closing}: no more requests are read, waits are cancelled without a
   reply, and what the connection held is given back; the replies already
   owed are flushed, then the transport closes.
 - B{closed}: the transport is gone.

The connection (L{jesync.connections.connection.LockConnection}) feeds the
inputs and does what entering each state means (C{entered_<state>}).
"""

from __future__ import annotations

from typing import Protocol

ACCEPTED = "accepted"
AUTHENTICATING = "authenticating"
READY = "ready"
HALF_CLOSED = "half-closed"
CLOSING = "closing"
CLOSED = "closed"

# (state, input) -> next state.  An input missing for a state changes nothing.
TRANSITIONS: dict[tuple[str, str], str] = {
    (ACCEPTED, "admit"): READY,
    (ACCEPTED, "admit_with_auth"): AUTHENTICATING,
    (ACCEPTED, "refuse"): CLOSING,
    (AUTHENTICATING, "authenticated"): READY,
    (AUTHENTICATING, "input_ended"): CLOSING,
    (AUTHENTICATING, "close"): CLOSING,
    (READY, "input_ended"): HALF_CLOSED,
    (READY, "close"): CLOSING,
    (HALF_CLOSED, "answered"): CLOSING,
    (HALF_CLOSED, "close"): CLOSING,
}
for _state in (ACCEPTED, AUTHENTICATING, READY, HALF_CLOSED, CLOSING):
    TRANSITIONS[(_state, "lost")] = CLOSED

# States in which requests are read.
READING = frozenset({AUTHENTICATING, READY, HALF_CLOSED})
# States in which replies are written (once closing, only those already
# owed, and a last one).
ANSWERING = frozenset({AUTHENTICATING, READY, HALF_CLOSED})


class Machine(Protocol):
    """What the lifecycle drives: one method per state it can enter."""

    state: str

    def entered(self, state: str, previous: str) -> None: ...


def feed(machine: Machine, event: str) -> bool:
    """Apply C{event} to C{machine}; True if its state changed (and it was told)."""
    previous = machine.state
    state = TRANSITIONS.get((previous, event))
    if state is None:
        return False
    machine.state = state
    machine.entered(state, previous)
    return True
