"""
The reactor the suite runs on.  pytest-twisted installs Twisted's default
reactor when pytest configures itself, unless one is installed already and
is of the default's type (on Linux L{EPollReactor}, or a subclass).  With
C{JESYNC_REACTOR=NAME} in the environment this file, read before that,
installs the reactor twistd knows as NAME (C{twistd --help-reactors}), so
that the in-process tiers run on it:

    JESYNC_REACTOR=jesync-epoll python -m pytest tests

(pytest-xdist's workers inherit the variable.)  A reactor that is not the
default's type is refused by pytest-twisted, loudly.  The servers the
process tests start run as their commands say (the docs', the systemd
unit's), whatever the variable.
"""

from __future__ import annotations

import os

from twisted.application.reactors import installReactor

_REACTOR = os.environ.get("JESYNC_REACTOR")
if _REACTOR:
    installReactor(_REACTOR)
