"""
The reactor the suite runs on: the one the README recommends,
C{jesync-epoll} (L{jesync.reactor}), on Linux.  pytest-twisted installs
Twisted's default reactor when pytest configures itself, unless one is
installed already and is of the default's type (on Linux L{EPollReactor},
or a subclass); this file, read before that, installs the recommended one,
or with C{JESYNC_REACTOR=NAME} in the environment the reactor twistd knows
as NAME (C{twistd --help-reactors}; C{default}: Twisted's own), so that the
in-process tiers run on it:

    JESYNC_REACTOR=default python -m pytest tests

(pytest-xdist's workers inherit the variable.)  A reactor that is not the
default's type is refused by pytest-twisted, loudly.  The servers the
process tests start run as their commands say (the docs', the systemd
unit's), whatever the variable.

It also undoes one thing a test run may inherit: started in the background
by a non-interactive shell (C{sh -c 'python -m pytest &'}, as a CI script
may), a process ignores SIGINT, pytest-xdist's workers too, and so would
every command the process tests start (an ignored signal stays ignored
across C{exec}).  The tests that interrupt C{jesync watch} or C{jesync
elect --observe} with SIGINT, as a person at a terminal does, need it
delivered: the suite takes SIGINT back as Python's default.
"""

from __future__ import annotations

import os
import signal
import sys

from twisted.application.reactors import installReactor

_REACTOR = os.environ.get("JESYNC_REACTOR") or ("jesync-epoll" if sys.platform.startswith("linux") else "default")
if _REACTOR != "default":
    installReactor(_REACTOR)

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
