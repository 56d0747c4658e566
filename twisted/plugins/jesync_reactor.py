"""
The reactor dropin: C{twistd --reactor jesync-epoll jesync ...} installs
L{jesync.reactor}, Twisted's epoll reactor without the per-event logging
context (C{twistd --help-reactors} lists it).  A module of its own beside
C{jesync_plugin.py}, so that it imports nothing of jesync's until chosen.
"""

from twisted.application.reactors import Reactor

jesync_epoll = Reactor(
    "jesync-epoll",
    "jesync.reactor",
    "epoll(4) based, without the per-event logging context (jesync.reactor).",
)
