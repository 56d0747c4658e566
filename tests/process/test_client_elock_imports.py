"""
The elock client's imports, seen from a fresh interpreter (a process of
its own: what a program that imports it loads).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase


class ImportTests(SynchronousTestCase):
    def test_no_server_and_no_twisted(self) -> None:
        """The elock client, like the others, loads neither the server's modules nor Twisted."""
        from tests.unit.test_imports import SERVER_MODULES, loaded_after

        self.assertEqual(loaded_after("import jesync.client.elock", SERVER_MODULES + ("twisted",))["loaded"], [])
