"""
The base of the blocking client's tests against a real server
(L{ClientTestCase}): a client closed when the test ends, a function run in
a thread, and a bounded wait for a condition.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import Client

WITHIN = 5.0  # seconds anything that should happen "at once" may take


class ClientTestCase(SynchronousTestCase):
    def client(self, servers: Any, **options: Any) -> Client:
        client = Client(servers, **options)
        self.addCleanup(client.close)
        return client

    def in_thread(self, function: Callable[[], Any]) -> dict[str, Any]:
        """Run C{function} in a thread; the dict gets its C{result} or C{error}, then C{done} is set."""
        outcome: dict[str, Any] = {"done": threading.Event()}

        def run() -> None:
            try:
                outcome["result"] = function()
            except BaseException as error:
                outcome["error"] = error
            outcome["done"].set()

        threading.Thread(target=run, daemon=True).start()
        return outcome

    def wait_for(self, condition: Callable[[], bool], within: float = WITHIN) -> None:
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for a condition")
            time.sleep(0.01)
