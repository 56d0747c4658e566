"""
The clients' security and connection settings, against the real server in a
thread of this process (L{tests.servers.serve_in_thread}), over real TCP and
TLS: the auth token (from a file, given or named by
C{JESYNC_AUTH_TOKEN_FILE}), TLS with a CA file and a server-name check, the
blocking, asyncio and Twisted clients alike; C{Client()} reading its servers
from C{JESYNC_SERVERS}; retrying a connection with backoff.  The C{jesync}
command using them all through the environment is
L{tests.process.test_client_security_cli}.

The certificates are made with C{cryptography} (L{tests.client_pki}): a
test CA signing the server's certificate (for localhost and 127.0.0.1), and
another CA that signs nothing the server shows.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Optional

from twisted.internet import defer, reactor, task, threads
from twisted.trial.unittest import SynchronousTestCase, TestCase

from jesync.client import AsyncClient, Client, ConnectFailed, KeyStatus, TwistedClient
from jesync.client.config import Backoff, ConnectOptions, read_token
from jesync.client import AuthFailed
from jesync.client.pipeline import discard
from jesync.client.session import Session
from jesync.client.wire import auth_request, parse_reply
from tests.client_pki import TOKEN, secured_server, temp_dir, write
from tests.servers import ServerThread, free_port

WITHIN = 5.0


# -- the shared parts, without I/O --------------------------------------------


class SansIOTests(SynchronousTestCase):
    def test_auth_request_and_ok(self) -> None:
        self.assertEqual(auth_request(b"abc"), b"auth abc\n")
        self.assertRaises(ValueError, auth_request, b"two words")
        self.assertRaises(ValueError, auth_request, b"")
        self.assertEqual(parse_reply(b"OK").word, "OK")

    def handshake(self, token: Optional[bytes]) -> tuple[Session, list[bytes], list[Any]]:
        sent: list[bytes] = []
        outcome: list[Any] = []
        session = Session("server:1", sent.append, lambda *args: None)  # type: ignore[arg-type,return-value]
        session.handshake(token, outcome.append, outcome.append)
        return session, sent, outcome

    def test_auth_first_then_fencing(self) -> None:
        """With a token, C{auth} goes first, then C{fencing on}; ready once the server says OK."""
        session, sent, outcome = self.handshake(TOKEN)
        self.assertEqual(sent, [b"auth " + TOKEN + b"\n", b"fencing on\n"])
        self.assertEqual(outcome, [])
        session.line_received(b"OK")
        self.assertEqual(outcome, [None])
        session.line_received(b"FENCING ON")
        self.assertTrue(session.fencing)

    def test_refused_token(self) -> None:
        """A refused token fails the handshake and the session with L{AuthFailed}."""
        session, sent, outcome = self.handshake(TOKEN)
        errors: list[Exception] = []
        session.status("k", discard, errors.append)
        session.line_received(b"INVALID_PARAMETER: auth failed")
        [error] = outcome
        self.assertIsInstance(error, AuthFailed)
        self.assertEqual(error.message, "INVALID_PARAMETER: auth failed")
        self.assertIn("refused the auth token", str(error))
        self.assertNotIn(TOKEN.decode(), str(error))
        self.assertTrue(session.closed)
        self.assertIsInstance(errors[0], AuthFailed)
        self.assertRaises(AuthFailed, session.status, "k", discard, discard)

    def test_token_wanted(self) -> None:
        """Without a token: ready at once; a server wanting one fails the session with L{AuthFailed}."""
        session, sent, outcome = self.handshake(None)
        self.assertEqual((sent, outcome), ([b"fencing on\n"], [None]))
        errors: list[Exception] = []
        session.status("k", discard, errors.append)
        session.line_received(b"INVALID_PARAMETER: auth failed")
        self.assertIsInstance(errors[0], AuthFailed)
        self.assertIn("JESYNC_AUTH_TOKEN_FILE", str(errors[0]))

    def test_older_server_without_fencing(self) -> None:
        """A server without fencing still refuses C{fencing on} harmlessly."""
        session, _, _ = self.handshake(None)
        session.line_received(b"INVALID_COMMAND")
        self.assertFalse(session.closed)
        self.assertIs(session.fencing, False)


class BackoffTests(SynchronousTestCase):
    def test_doubling_capped_and_counted(self) -> None:
        backoff = Backoff(5, 0.1, 0.3, None, 0.0, random=lambda: 1.0)
        pauses = [backoff.next_pause(0.0) for _ in range(6)]
        self.assertEqual(pauses, [0.1, 0.2, 0.3, 0.3, 0.3, None])

    def test_jitter(self) -> None:
        backoff = Backoff(1, 1.0, 10.0, None, 0.0, random=lambda: 0.0)
        self.assertEqual(backoff.next_pause(0.0), 0.5)

    def test_within_the_wait(self) -> None:
        backoff = Backoff(10, 0.4, 10.0, 1.0, 100.0, random=lambda: 1.0)
        self.assertEqual(backoff.next_pause(100.0), 0.4)
        self.assertIsNone(backoff.next_pause(100.5))  # 0.8 more would pass the wait

    def test_never_for_wait_zero(self) -> None:
        self.assertIsNone(Backoff(10, 0.001, 1.0, 0, 5.0).next_pause(5.0))


class OptionsTests(SynchronousTestCase):
    def resolve(self, servers: Any = None, environ: Optional[dict[str, str]] = None, **given: Any) -> Any:
        arguments: dict[str, Any] = dict(
            auth_token_file=None,
            tls=None,
            tls_ca_file=None,
            tls_server_name=None,
            connect_retries=3,
            retry_backoff=0.1,
            retry_backoff_max=2.0,
        )
        arguments.update(given)
        return ConnectOptions.resolve(servers, environ=environ or {}, **arguments)

    def test_defaults(self) -> None:
        servers, options = self.resolve()
        self.assertEqual(servers, "127.0.0.1:11400")
        self.assertEqual(options, ConnectOptions())

    def test_environment(self) -> None:
        directory = temp_dir(self)
        token_file = write(directory, "token", b"  tok \nsecond line\n")
        ca_file = write(directory, "ca.pem", b"")
        servers, options = self.resolve(
            environ={
                "JESYNC_SERVERS": "a:1,b:2",
                "JESYNC_AUTH_TOKEN_FILE": token_file,
                "JESYNC_TLS_CA_FILE": ca_file,
                "JESYNC_TLS_SERVER_NAME": "locks.example",
            }
        )
        self.assertEqual(servers, "a:1,b:2")
        self.assertEqual(options.token(), b"tok")
        self.assertTrue(options.tls)
        self.assertEqual((options.tls_ca_file, options.tls_server_name), (ca_file, "locks.example"))

    def test_arguments_before_environment(self) -> None:
        environ = {"JESYNC_SERVERS": "a:1", "JESYNC_TLS": "yes", "JESYNC_AUTH_TOKEN_FILE": "/nonexistent"}
        directory = temp_dir(self)
        token_file = write(directory, "token", b"tok\n")
        servers, options = self.resolve("b:2", environ, tls=False, auth_token_file=token_file)
        self.assertEqual(servers, "b:2")
        self.assertFalse(options.tls)
        self.assertEqual(options.token(), b"tok")

    def test_tls_variable(self) -> None:
        self.assertTrue(self.resolve(environ={"JESYNC_TLS": "on"})[1].tls)
        self.assertFalse(self.resolve(environ={"JESYNC_TLS": "0", "JESYNC_TLS_SERVER_NAME": "x"})[1].tls)
        self.assertRaises(ValueError, self.resolve, environ={"JESYNC_TLS": "maybe"})

    def test_bad_files(self) -> None:
        """An unusable token file or CA file is refused when the client is made, never showing the token."""
        directory = temp_dir(self)
        with self.assertRaises(ValueError) as caught:
            self.resolve(auth_token_file=os.path.join(directory, "missing"))
        self.assertIn("cannot read the auth token file", str(caught.exception))
        spaced = write(directory, "spaced", b"two words\n")
        with self.assertRaises(ValueError) as caught:
            Client("127.0.0.1:1", auth_token_file=spaced, environ={})
        self.assertNotIn("words", str(caught.exception))
        self.assertRaises(ValueError, read_token, write(directory, "empty", b"\n"))
        self.assertRaises(ValueError, self.resolve, tls_ca_file=os.path.join(directory, "missing.pem"))

    def test_bad_retry_settings(self) -> None:
        self.assertRaises(ValueError, self.resolve, connect_retries=-1)
        self.assertRaises(ValueError, self.resolve, retry_backoff=-0.1)


# -- the blocking client ------------------------------------------------------


class BlockingClientTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.secured = secured_server()

    def client(self, servers: Any = None, **options: Any) -> Client:
        options.setdefault("environ", {})
        client = Client(servers, **options)
        self.addCleanup(client.close)
        return client

    def test_right_token(self) -> None:
        client = self.client(self.secured.address, auth_token_file=self.secured.token_file)
        with client.lock("secured", wait=1) as lock:
            self.assertTrue(lock.held)
            self.assertIsNotNone(lock.token)
            self.assertEqual(client.status("secured"), KeyStatus("secured", 1, 0))

    def test_wrong_token(self) -> None:
        client = self.client(self.secured.address, auth_token_file=self.secured.wrong_token_file, retry_backoff=1)
        start = time.monotonic()
        with self.assertRaises(AuthFailed) as caught:
            client.status("k")
        self.assertLess(time.monotonic() - start, 1, "an auth failure is not retried")
        self.assertEqual(caught.exception.message, "INVALID_PARAMETER: auth failed")
        self.assertIn("refused the auth token", str(caught.exception))

    def test_no_token(self) -> None:
        with self.assertRaises(AuthFailed) as caught:
            self.client(self.secured.address).status("k")
        self.assertIn("JESYNC_AUTH_TOKEN_FILE", str(caught.exception))

    def test_token_file_from_environment(self) -> None:
        client = self.client(self.secured.address, environ={"JESYNC_AUTH_TOKEN_FILE": self.secured.token_file})
        self.assertEqual(client.status("k"), KeyStatus("k", 0, 0))

    def test_everything_from_os_environ(self) -> None:
        """C{Client()} with no arguments reads JESYNC_SERVERS and the auth and TLS variables from os.environ."""
        variables = {
            "JESYNC_SERVERS": self.secured.tls_address,
            "JESYNC_AUTH_TOKEN_FILE": self.secured.token_file,
            "JESYNC_TLS_CA_FILE": self.secured.pki.ca_file,
        }
        self.patch(os, "environ", dict(os.environ, **variables))
        client = Client()
        self.addCleanup(client.close)
        self.assertEqual([str(server) for server in client.servers], [self.secured.tls_address])
        self.assertEqual(client.status("k"), KeyStatus("k", 0, 0))

    def test_tls(self) -> None:
        """The CA file verifies the certificate, and the name checked is the host (an IP address here)."""
        client = self.client(
            self.secured.tls_address, auth_token_file=self.secured.token_file, tls_ca_file=self.secured.pki.ca_file
        )
        with client.lock("over-tls", wait=1):
            self.assertEqual(client.status("over-tls"), KeyStatus("over-tls", 1, 0))
            self.assertEqual(len(client.listing()), 1)

    def test_tls_host_name(self) -> None:
        client = self.client(
            self.secured.tls_name_address, auth_token_file=self.secured.token_file, tls_ca_file=self.secured.pki.ca_file
        )
        self.assertEqual(client.status("k"), KeyStatus("k", 0, 0))

    def test_tls_server_name(self) -> None:
        client = self.client(
            self.secured.tls_address,
            auth_token_file=self.secured.token_file,
            tls_ca_file=self.secured.pki.ca_file,
            tls_server_name="localhost",
        )
        self.assertEqual(client.status("k"), KeyStatus("k", 0, 0))

    def assertTLSRefused(self, **options: Any) -> None:
        client = self.client(self.secured.tls_address, auth_token_file=self.secured.token_file, retry_backoff=1, **options)
        start = time.monotonic()
        with self.assertRaises(ConnectFailed) as caught:
            client.status("k")
        self.assertLess(time.monotonic() - start, 1, "a certificate that does not check out is not retried")
        self.assertFalse(caught.exception.retryable)
        self.assertIn("TLS failed", caught.exception.reason)

    def test_tls_wrong_ca(self) -> None:
        self.assertTLSRefused(tls_ca_file=self.secured.pki.other_ca_file)

    def test_tls_wrong_name(self) -> None:
        self.assertTLSRefused(tls_ca_file=self.secured.pki.ca_file, tls_server_name="wrong.example")

    def test_tls_system_trust(self) -> None:
        """TLS without a CA file trusts the system's store, which does not know the test CA."""
        self.assertTLSRefused(tls=True)

    def test_tls_from_environment(self) -> None:
        client = self.client(
            self.secured.tls_address,
            environ={
                "JESYNC_AUTH_TOKEN_FILE": self.secured.token_file,
                "JESYNC_TLS_CA_FILE": self.secured.pki.ca_file,
                "JESYNC_TLS_SERVER_NAME": "localhost",
            },
        )
        self.assertEqual(client.status("k"), KeyStatus("k", 0, 0))

    def test_tls_many_replies(self) -> None:
        """Many pipelined requests and a waiting lock over TLS, from two threads."""
        options = dict(auth_token_file=self.secured.token_file, tls_ca_file=self.secured.pki.ca_file)
        first = self.client(self.secured.tls_address, **options)
        second = self.client(self.secured.tls_address, **options)
        lock = first.lock("busy")
        result: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: result.update(lock=second.lock("busy", wait=5)))
        waiter.start()
        for _ in range(200):
            first.status("busy")
        lock.release()
        waiter.join(WITHIN)
        self.assertTrue(result["lock"].held)
        self.assertTrue(result["lock"].release())


class RetryTests(SynchronousTestCase):
    def test_server_started_later(self) -> None:
        """A server started after the client began connecting is reached by a retry."""
        server = ServerThread()
        self.addCleanup(server.close)
        client = Client(server.address, connect_retries=1000, retry_backoff=0.05, retry_backoff_max=0.2, environ={})
        self.addCleanup(client.close)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def status() -> None:
            try:
                outcome["status"] = client.status("k")
            except BaseException as error:
                outcome["error"] = error
            done.set()

        threading.Thread(target=status, daemon=True).start()
        time.sleep(0.3)
        self.assertFalse(done.is_set())
        server.start()
        self.assertTrue(done.wait(WITHIN))
        self.assertEqual(outcome, {"status": KeyStatus("k", 0, 0)})

    def test_wait_zero_fails_at_once(self) -> None:
        client = Client(f"127.0.0.1:{free_port()}", connect_retries=10, retry_backoff=2, environ={})
        self.addCleanup(client.close)
        start = time.monotonic()
        self.assertRaises(ConnectFailed, client.lock, "k", wait=0)
        self.assertLess(time.monotonic() - start, 1)

    def test_retries_within_the_wait(self) -> None:
        client = Client(f"127.0.0.1:{free_port()}", connect_retries=100, retry_backoff=0.05, environ={})
        self.addCleanup(client.close)
        start = time.monotonic()
        self.assertRaises(ConnectFailed, client.lock, "k", wait=1)
        self.assertLess(time.monotonic() - start, 1.5)
        self.assertGreater(time.monotonic() - start, 0.3)

    def test_retries_counted(self) -> None:
        client = Client(f"127.0.0.1:{free_port()}", connect_retries=0, retry_backoff=5, environ={})
        self.addCleanup(client.close)
        start = time.monotonic()
        self.assertRaises(ConnectFailed, client.status, "k")
        self.assertLess(time.monotonic() - start, 1)


# -- the asyncio client -------------------------------------------------------


class AsyncClientTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.secured = secured_server()

    def run_async(self, coroutine: Any) -> Any:
        return asyncio.run(asyncio.wait_for(coroutine, 20))

    async def status(self, servers: str, **options: Any) -> KeyStatus:
        options.setdefault("environ", {})
        async with AsyncClient(servers, **options) as client:
            async with client.lock("aio", wait=1):
                return await client.status("aio")

    def test_token_and_tls(self) -> None:
        secured = self.secured
        self.assertEqual(
            self.run_async(self.status(secured.address, auth_token_file=secured.token_file)), KeyStatus("aio", 1, 0)
        )
        self.assertEqual(
            self.run_async(
                self.status(secured.tls_address, auth_token_file=secured.token_file, tls_ca_file=secured.pki.ca_file)
            ),
            KeyStatus("aio", 1, 0),
        )
        environ = {"JESYNC_AUTH_TOKEN_FILE": secured.token_file, "JESYNC_TLS_CA_FILE": secured.pki.ca_file}
        self.assertEqual(self.run_async(self.status(secured.tls_name_address, environ=environ)), KeyStatus("aio", 1, 0))

    def test_refusals(self) -> None:
        secured = self.secured
        self.assertRaises(
            AuthFailed, self.run_async, self.status(secured.address, auth_token_file=secured.wrong_token_file)
        )
        self.assertRaises(AuthFailed, self.run_async, self.status(secured.address))
        for options in (
            dict(tls_ca_file=secured.pki.other_ca_file),
            dict(tls_ca_file=secured.pki.ca_file, tls_server_name="wrong.example"),
        ):
            with self.assertRaises(ConnectFailed) as caught:
                self.run_async(self.status(secured.tls_address, auth_token_file=secured.token_file, **options))
            self.assertFalse(caught.exception.retryable)

    def test_server_started_later(self) -> None:
        server = ServerThread()
        self.addCleanup(server.close)

        async def later() -> KeyStatus:
            client = AsyncClient(server.address, connect_retries=1000, retry_backoff=0.05, retry_backoff_max=0.2, environ={})
            try:
                status = asyncio.ensure_future(client.status("k"))
                await asyncio.sleep(0.3)
                self.assertFalse(status.done())
                await asyncio.get_running_loop().run_in_executor(None, server.start)
                return await status
            finally:
                await client.close()

        self.assertEqual(self.run_async(later()), KeyStatus("k", 0, 0))

    def test_wait_zero_fails_at_once(self) -> None:
        async def try_lock() -> None:
            async with AsyncClient(f"127.0.0.1:{free_port()}", connect_retries=10, retry_backoff=2, environ={}) as client:
                await client.lock("k", wait=0)

        start = time.monotonic()
        self.assertRaises(ConnectFailed, self.run_async, try_lock())
        self.assertLess(time.monotonic() - start, 1)


# -- the Twisted client -------------------------------------------------------


class TwistedClientTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.secured = secured_server()

    def client(self, servers: str, **options: Any) -> TwistedClient:
        options.setdefault("environ", {})
        client = TwistedClient(reactor, servers, **options)
        self.addCleanup(client.close)
        return client

    async def test_token_and_tls(self) -> None:
        secured = self.secured
        plain = self.client(secured.address, auth_token_file=secured.token_file)
        lock = await plain.lock("tx", wait=1)
        self.assertEqual(await plain.status("tx"), KeyStatus("tx", 1, 0))
        self.assertTrue(await lock.release())
        for address in (secured.tls_address, secured.tls_name_address):
            tls = self.client(address, auth_token_file=secured.token_file, tls_ca_file=secured.pki.ca_file)
            lock = await tls.lock("tx", wait=1)
            self.assertEqual(await tls.status("tx"), KeyStatus("tx", 1, 0))
            self.assertTrue(await lock.release())
        environ = {
            "JESYNC_AUTH_TOKEN_FILE": secured.token_file,
            "JESYNC_TLS_CA_FILE": secured.pki.ca_file,
            "JESYNC_TLS_SERVER_NAME": "localhost",
        }
        self.assertEqual(await self.client(secured.tls_address, environ=environ).status("k"), KeyStatus("k", 0, 0))

    async def test_refusals(self) -> None:
        secured = self.secured
        with self.assertRaises(AuthFailed):
            await self.client(secured.address, auth_token_file=secured.wrong_token_file).status("k")
        with self.assertRaises(AuthFailed):
            await self.client(secured.address).status("k")
        for options in (
            dict(tls_ca_file=secured.pki.other_ca_file),
            dict(tls_ca_file=secured.pki.ca_file, tls_server_name="wrong.example"),
        ):
            client = self.client(secured.tls_address, auth_token_file=secured.token_file, retry_backoff=2, **options)
            start = reactor.seconds()
            with self.assertRaises(ConnectFailed) as caught:
                await client.status("k")
            self.assertFalse(caught.exception.retryable)
            self.assertIn("TLS failed", caught.exception.reason)
            self.assertLess(reactor.seconds() - start, 1.5)

    async def test_server_started_later(self) -> None:
        server = ServerThread()
        self.addCleanup(server.close)
        client = self.client(server.address, connect_retries=1000, retry_backoff=0.05, retry_backoff_max=0.2)
        status = client.status("k")
        await task.deferLater(reactor, 0.3, lambda: None)
        self.assertFalse(status.called)
        await threads.deferToThread(server.start)
        self.assertEqual(await status, KeyStatus("k", 0, 0))

    async def test_wait_zero_fails_at_once(self) -> None:
        client = self.client(f"127.0.0.1:{free_port()}", connect_retries=10, retry_backoff=2)
        start = reactor.seconds()
        with self.assertRaises(ConnectFailed):
            await client.lock("k", wait=0)
        self.assertLess(reactor.seconds() - start, 1)

    async def test_close_stops_retrying(self) -> None:
        client = TwistedClient(reactor, f"127.0.0.1:{free_port()}", connect_retries=10, retry_backoff=5, environ={})
        status = client.status("k")
        await task.deferLater(reactor, 0.2, lambda: None)
        await client.close()
        with self.assertRaises(defer.CancelledError):
            await status
