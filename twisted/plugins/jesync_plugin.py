"""The twistd dropin: C{twistd jesync} runs L{jesync.tap}."""

from twisted.application.service import ServiceMaker

jesync = ServiceMaker(
    "jesync",
    "jesync.tap",
    "A JESync-compatible lock server (mutexes and counting semaphores).",
    "jesync",
)
