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
"""

from __future__ import annotations

import os
import sys

from twisted.application.reactors import installReactor

_REACTOR = os.environ.get("JESYNC_REACTOR") or ("jesync-epoll" if sys.platform.startswith("linux") else "default")
if _REACTOR != "default":
    installReactor(_REACTOR)
