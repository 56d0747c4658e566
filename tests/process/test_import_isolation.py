"""
What importing a part of jesync drags in, each in a fresh interpreter: the
clients and the command line never import the server (nor install a
reactor), L{jesync.wire} imports nothing from Twisted, and the package's
embedding API (C{from jesync import LockService, ...}) still works, loaded
lazily.  (How the modules import each other, read from their source, is
L{tests.unit.test_imports}.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

import jesync
from tests.fresh_python import ROOT, loaded_after, run_python

# The server's modules, and the reactor (installed by importing it).
SERVER_MODULES = (
    "jesync.protocols",
    "jesync.service",
    "jesync.connections",
    "jesync.server",
    # (what jesync.server held before it was split)
    "jesync.listening",
    "jesync.lock_server",
    "jesync.metrics_connections",
    "jesync.process",
    "jesync.options",
    "jesync.http",
    "twisted.internet.reactor",
)


class ImportTests(SynchronousTestCase):
    def assertFromCheckout(self, found: dict[str, Any]) -> None:
        self.assertEqual(Path(found["jesync"]).resolve(), ROOT / "jesync" / "__init__.py")

    def test_clients_do_not_import_the_server(self) -> None:
        """The clients and the command line load none of the server's modules, nor the reactor."""
        found = loaded_after("import jesync.client, jesync.cli", SERVER_MODULES)
        self.assertFromCheckout(found)
        self.assertEqual(found["loaded"], [])

    def test_clients_import_no_twisted(self) -> None:
        """
        C{jesync.client}, the blocking and asyncio clients and the command
        line load no Twisted module at all; the Twisted client loads Twisted
        when it is asked for.
        """
        found = loaded_after("import jesync.client, jesync.client.blocking, jesync.client.aio, jesync.cli", ("twisted",))
        self.assertFromCheckout(found)
        self.assertEqual(found["loaded"], [])
        twisted = loaded_after("from jesync.client import TwistedClient", ("twisted",))
        self.assertIn("twisted.internet.defer", twisted["loaded"])

    def test_elock_client_imports_no_server_and_no_twisted(self) -> None:
        """The elock client, like the others, loads neither the server's modules nor Twisted."""
        self.assertEqual(loaded_after("import jesync.client.elock", SERVER_MODULES + ("twisted",))["loaded"], [])

    def test_wire_imports_no_twisted(self) -> None:
        """L{jesync.wire}, the rules shared with the clients, loads no Twisted module at all."""
        found = loaded_after("import jesync.wire", ("twisted",))
        self.assertFromCheckout(found)
        self.assertEqual(found["loaded"], [])

    def test_embedding_api(self) -> None:
        """C{from jesync import ...} still gives the server's classes, importing them when asked."""
        found = run_python(
            "import json, sys\n"
            "import jesync\n"
            "before = 'jesync.service' in sys.modules\n"
            "from jesync import LockService, JESyncFactory\n"
            "print(json.dumps([before, LockService.__module__, LockService.__name__,\n"
            "                  JESyncFactory.__module__, JESyncFactory.__name__]))\n"
        )
        before, service_module, service_name, factory_module, factory_name = found
        self.assertFalse(before, "importing jesync imported the server")
        self.assertEqual(service_name, "LockService")
        self.assertTrue(service_module.startswith("jesync."), service_module)
        self.assertEqual(factory_name, "JESyncFactory")
        self.assertTrue(factory_module.startswith("jesync."), factory_module)

    def test_every_public_name_resolves(self) -> None:
        """Every name in C{jesync.__all__} loads, is listed by C{dir()}, and nothing else is invented."""
        for name in jesync.__all__:
            self.assertIsNotNone(getattr(jesync, name))
        self.assertTrue(set(jesync.__all__) <= set(dir(jesync)))
        self.assertRaises(AttributeError, getattr, jesync, "NoSuchName")
        self.assertEqual(
            sorted(jesync.__all__),
            sorted(
                [
                    "AlreadyWaiting",
                    "EXCLUSIVE",
                    "ELockFactory",
                    "ELockProtocol",
                    "Grant",
                    "IGrant",
                    "ILockService",
                    "JESyncFactory",
                    "JESyncProtocol",
                    "KeyStatus",
                    "LockEvent",
                    "LockService",
                    "LockTimeout",
                    "ModeConflict",
                    "SHARED",
                ]
            ),
        )

    def test_single_process_needs_no_cluster_code(self) -> None:
        """
        A server without --etcd (every listener, metrics included) starts,
        serves and stops without loading cluster mode, its etcd client or
        treq: single-process mode needs neither etcd nor the cluster extra.
        """
        found = loaded_after(
            "from twisted.internet import reactor\n"
            "from jesync.server import ServerSettings, build_server\n"
            "settings = ServerSettings(ports=['tcp:0:interface=127.0.0.1'], elock_ports=['tcp:0:interface=127.0.0.1'],\n"
            "                          dlock_ports=['tcp:0:interface=127.0.0.1'], metrics_ports=['tcp:0:interface=127.0.0.1'])\n"
            "server = build_server(reactor, settings)\n"
            "server.startService()\n"
            "assert server.listeners() and all(listener.port for listener in server.listeners())\n"
            "server.stopService()",
            ("jesync.cluster", "treq"),
        )
        self.assertEqual(found["loaded"], [])


# -- the import graph, read from the source ------------------------------------

#: The modules the lock service and the connection layer are built under:
#: what they may never import, directly or through another module.
