"""
Every client takes its connection settings as one value, C{options=ConnectOptions(...)},
or as the keywords that build it (the older form, still accepted); not both.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any, Callable

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.client.aio import AsyncClient
from jesync.client.blocking import Client
from jesync.client.config import ConnectKeywords, ConnectOptions, client_options
from jesync.client.elock import ELockClient
from jesync.client.txclient import TwistedClient
from tests.servers import free_port, serve_in_thread

# the JESync clients, each made from servers and the rest as keywords
MAKERS: dict[str, Callable[..., Any]] = {
    "Client": Client,
    "AsyncClient": AsyncClient,
    "TwistedClient": lambda servers, **rest: TwistedClient(Clock(), servers, **rest),
}


class ConnectOptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        options = ConnectOptions()
        self.assertEqual((options.connect_timeout, options.read_timeout), (5.0, 10.0))
        self.assertEqual(ConnectOptions.from_environment({}), options)

    def test_bad_values_refused_when_made(self) -> None:
        self.assertRaises(ValueError, ConnectOptions, connect_retries=-1)
        self.assertRaises(ValueError, ConnectOptions, retry_backoff=-0.5)
        self.assertRaises(ValueError, ConnectOptions, retry_backoff_max=True)
        self.assertEqual(ConnectOptions(retry_backoff=1).retry_backoff, 1.0)
        self.assertIsInstance(ConnectOptions(retry_backoff=1).retry_backoff, float)

    def test_keywords_are_the_fields(self) -> None:
        """The keyword form names exactly the fields of ConnectOptions: one list of settings."""
        self.assertEqual(set(ConnectKeywords.__annotations__), set(ConnectOptions.__dataclass_fields__))

    def test_options_given_whole_ignore_the_environment(self) -> None:
        options = ConnectOptions(read_timeout=3.0)
        servers, used = client_options(None, options, {"JESYNC_SERVERS": "a:1", "JESYNC_TLS": "1"}, {})
        self.assertEqual(servers, "a:1")
        self.assertIs(used, options)

    def test_keywords_read_the_environment(self) -> None:
        servers, used = client_options("b:2", None, {"JESYNC_TLS": "1"}, {"read_timeout": 3.0})
        self.assertEqual(servers, "b:2")
        self.assertEqual(used, ConnectOptions(tls=True, read_timeout=3.0))

    def test_given_options_are_checked(self) -> None:
        missing = os.path.join(tempfile.mkdtemp(), "missing")
        with self.assertRaises(ValueError) as caught:
            client_options(None, ConnectOptions(auth_token_file=missing), {}, {})
        self.assertIn("cannot read the auth token file", str(caught.exception))


class EveryClientTests(SynchronousTestCase):
    def test_options(self) -> None:
        options = ConnectOptions(connect_timeout=1.5, read_timeout=None, connect_retries=0)
        for name, make in MAKERS.items():
            client = make("127.0.0.1:1", options=options, environ={"JESYNC_TLS": "1"})
            self.assertIs(client.options, options, name)
            self.assertEqual((client.connect_timeout, client.read_timeout), (1.5, None), name)

    def test_keywords(self) -> None:
        for name, make in MAKERS.items():
            client = make("127.0.0.1:1", connect_timeout=1.5, read_timeout=None, connect_retries=0, environ={})
            self.assertEqual(client.options, ConnectOptions(connect_timeout=1.5, read_timeout=None, connect_retries=0), name)
            self.assertEqual((client.connect_timeout, client.read_timeout), (1.5, None), name)

    def test_both_or_unknown_refused(self) -> None:
        for name, make in MAKERS.items():
            with self.assertRaises(TypeError, msg=name) as caught:
                make("127.0.0.1:1", options=ConnectOptions(), tls=True)
            self.assertIn("not both", str(caught.exception))
            with self.assertRaises(TypeError, msg=name) as caught:
                make("127.0.0.1:1", read_timout=3)
            self.assertIn("read_timout", str(caught.exception))

    def test_elock_refuses_before_connecting(self) -> None:
        self.assertRaises(TypeError, ELockClient, "127.0.0.1:1", options=ConnectOptions(), tls=True)
        self.assertRaises(TypeError, ELockClient, "127.0.0.1:1", read_timout=3)
        for options in (ConnectOptions(read_timeout=None), ConnectOptions(connect_timeout=0)):
            with self.assertRaises(ValueError) as caught:
                ELockClient("127.0.0.1:1", options=options)
            self.assertIn("more than 0", str(caught.exception))


class OverTCPTests(SynchronousTestCase):
    """Both forms reach a real server."""

    def setUp(self) -> None:
        self.elock_port = free_port()
        self.server = serve_in_thread(self, extra_args=["--elock-port", f"tcp:{self.elock_port}:interface=127.0.0.1"])

    def test_blocking(self) -> None:
        for client in (
            Client(self.server.address, options=ConnectOptions(read_timeout=5.0)),
            Client(self.server.address, read_timeout=5.0, environ={}),
        ):
            self.addCleanup(client.close)
            lock = client.lock("options", wait=5)
            self.assertTrue(lock.held)
            self.assertTrue(lock.release())

    def test_asyncio(self) -> None:
        async def cycle(client: AsyncClient) -> bool:
            async with client:
                lock = await client.lock("options", wait=5)
                return await lock.release()

        for make in (
            lambda: AsyncClient(self.server.address, options=ConnectOptions(read_timeout=5.0)),
            lambda: AsyncClient(self.server.address, read_timeout=5.0, environ={}),
        ):
            self.assertTrue(asyncio.run(cycle(make())))

    def test_elock(self) -> None:
        address = f"127.0.0.1:{self.elock_port}"
        for client in (
            ELockClient(address, grace=2, options=ConnectOptions(read_timeout=5.0)),
            ELockClient(address, grace=2, read_timeout=5.0, environ={}),
        ):
            self.addCleanup(client.close)
            self.assertEqual(client.read_timeout, 5.0)
            handle = client.lock("options", wait=5)
            self.assertTrue(handle.held)
            self.assertTrue(handle.release())
