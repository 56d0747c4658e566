"""
jesync: a lock server speaking the JESync protocol, on Twisted.

The embedding API::

    from jesync import LockService, JESyncFactory
    service = LockService(reactor)
    endpoint.listen(JESyncFactory(service))

The public names (L{_EXPORTS}) are loaded when first used (PEP 562), so
importing a submodule that needs none of them (the clients, C{jesync.wire})
does not import the server.

C{__version__} is the package's version, the one place it is written:
pyproject.toml reads it from here when the package is built.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Each public name, and the module it comes from: the one place to edit when
# a name moves.
_EXPORTS: dict[str, str] = {
    "AlreadyWaiting": "jesync.errors",
    "LockTimeout": "jesync.errors",
    "ModeConflict": "jesync.errors",
    "LockEvent": "jesync.interfaces",
    "IGrant": "jesync.interfaces",
    "ILockService": "jesync.interfaces",
    "KeyStatus": "jesync.wire",
    "LockService": "jesync.service",
    "Grant": "jesync.service",
    "EXCLUSIVE": "jesync.service",
    "SHARED": "jesync.service",
    "JESyncFactory": "jesync.protocols.jesync",
    "JESyncProtocol": "jesync.protocols.jesync",
    "ELockFactory": "jesync.protocols.elock",
    "ELockProtocol": "jesync.protocols.elock",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
