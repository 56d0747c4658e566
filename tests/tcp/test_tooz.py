"""
The tooz backend (jesync.tooz_driver) through tooz's public API only
(C{tooz.coordination.get_coordinator("jesync://...")}), against real
servers over real TCP (and a UNIX socket): C{twistd jesync}'s options built
by the composition root, each on a reactor of its own in a thread of this
process (L{tests.servers.ServerThread}); the server's view is checked with
JESync C{status} requests on a plain socket.  What needs a process of its
own (a coordinator's process killed; what C{import jesync} loads) is in
L{tests.process.test_tooz_processes}.

tooz finds its drivers through the C{tooz.backends} entry point (stevedore,
which reads the installed distributions' metadata).  When jesync is
pip-installed with its entry point, that is what these tests use.  When it
is not (the suite runs from a checkout through PYTHONPATH), the module
registers the same entry point the same way a pip install does: a small
C{.dist-info} directory with an C{entry_points.txt}, put on C{sys.path} (and
on the PYTHONPATH of the subprocesses), so tooz and stevedore go through
their ordinary discovery either way.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import tempfile
import time
from typing import Any, Callable
from unittest import SkipTest, mock

from tests.client_case import WITHIN
from tests.servers import free_port, serve_in_thread
from tests.tooz_case import ToozTestCase, _registered_backends

import tooz  # (tests.tooz_case raises SkipTest without it)
from tooz import coordination

from jesync.client import Client, ConnectionLost, Leadership

TOOZ_LOG = "jesync.tooz_driver"


class EntryPointTests(ToozTestCase):
    def test_scheme_loads_the_driver(self) -> None:
        """get_coordinator("jesync://...") finds the driver through the tooz.backends entry point."""
        from jesync.tooz_driver import JESyncDriver

        coordinator = coordination.get_coordinator(self.url, b"member")
        self.assertIsInstance(coordinator, JESyncDriver)
        self.assertFalse(coordinator.is_started)
        (entry_point,) = _registered_backends()
        self.assertEqual(entry_point.value, "jesync.tooz_driver:JESyncDriver")

    def test_characteristics(self) -> None:
        coordinator = coordination.get_coordinator(
            self.url,
            b"member",
            characteristics=[
                coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
                coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
                coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
            ],
        )
        self.assertTrue(coordinator.requires_beating)


class StartStopTests(ToozTestCase):
    def test_start_and_stop(self) -> None:
        coordinator = coordination.get_coordinator(self.url, b"member")
        self.assertRaises(tooz.ToozError, coordinator.stop)
        coordinator.start()
        self.assertTrue(coordinator.is_started)
        coordinator.stop()
        self.assertFalse(coordinator.is_started)
        # A stopped coordinator starts again.
        coordinator.start()
        lock = coordinator.get_lock(b"again")
        self.assertTrue(lock.acquire(blocking=False))
        coordinator.stop()

    def test_stop_after_the_connection_dropped(self) -> None:
        """A leader and holder whose server went away stops cleanly, and starts again on a server that is back."""
        coordinator = coordination.get_coordinator(self.url, b"member")
        coordinator.start()
        coordinator.create_group(b"g").get()
        coordinator.watch_elected_as_leader(b"g", lambda event: None)
        coordinator.run_watchers()
        self.assertTrue(coordinator.get_lock(b"held").acquire(blocking=False))
        self.server.kill()
        coordinator.stop()
        self.assertFalse(coordinator.is_started)
        self.server.start()  # on the same port, its lock table empty
        coordinator.start()
        self.addCleanup(coordinator.stop)
        self.assertTrue(coordinator.get_lock(b"held").acquire(blocking=False))

    def test_stop_closes_the_client_when_resigning_fails(self) -> None:
        """A resign that raises (the connection dropped while it was asked) is logged; stop() still closes."""
        coordinator = coordination.get_coordinator(self.url, b"member")
        coordinator.start()
        coordinator.create_group(b"g").get()
        coordinator.watch_elected_as_leader(b"g", lambda event: None)
        coordinator.run_watchers()
        self.assertTrue(coordinator.get_lock(b"held").acquire(blocking=False))
        dropped = ConnectionLost(f"127.0.0.1:{self.server.port}", "dropped while resigning")
        with mock.patch.object(Leadership, "resign", side_effect=dropped):
            with self.assertLogs(TOOZ_LOG, "WARNING") as logged:
                coordinator.stop()
        self.assertIn("Unable to resign the leadership of group b'g'", logged.output[0])
        self.assertFalse(coordinator.is_started)
        # Its connection closed: the server freed what it held.
        self.assertEqual(self.status("election:g"), (0, 0))
        self.assertEqual(self.status("held"), (0, 0))

    def test_no_server(self) -> None:
        """start() connects: with no server listening it raises ToozConnectionError."""
        coordinator = coordination.get_coordinator(f"jesync://127.0.0.1:{free_port()}?connect_timeout=2", b"member")
        self.assertRaises(coordination.ToozConnectionError, coordinator.start)
        self.assertFalse(coordinator.is_started)

    def test_bad_option(self) -> None:
        for query in ("lock_expires=soon", "timeout=-1", "timeout=0", "tls=maybe", "prefix=a%20b"):
            with self.subTest(query=query):
                self.assertRaises(ValueError, coordination.get_coordinator, f"{self.url}?{query}", b"member")

    def test_servers_option_and_unix_socket(self) -> None:
        """servers= lists servers (here one on a unix socket, with no host in the URL)."""
        directory = tempfile.mkdtemp(prefix="jt-")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "s")
        unix_server = serve_in_thread(self, unix_socket=path)
        coordinator = self.coordinator(f"jesync://?servers=unix:{path}&lock_expires=0")
        lock = coordinator.get_lock("on-unix")
        self.assertTrue(lock.acquire(blocking=False))
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(WITHIN)
            probe.connect(path)
            probe.sendall(b"status on-unix\n")
            self.assertEqual(probe.recv(100), b"STATUS 1 0 on-unix\n")
        self.assertTrue(lock.release())
        self.assertEqual(coordinator.heartbeat(), 10.0)  # lock_expires=0: nothing expires
        del unix_server

    def test_token_file(self) -> None:
        """token_file= authenticates to a server that wants a token; without it start() fails."""
        directory = tempfile.mkdtemp(prefix="jt-")
        token_path = os.path.join(directory, "token")
        with open(token_path, "wb") as file:
            file.write(b"s3cret-token\n")
        self.addCleanup(shutil.rmtree, directory, True)
        secured = serve_in_thread(self, extra_args=["--auth-token-file", token_path], auth_token=b"s3cret-token")
        url = f"jesync://127.0.0.1:{secured.port}"
        coordinator = self.coordinator(f"{url}?token_file={token_path}")
        with coordinator.get_lock("secured"):
            pass
        refused = coordination.get_coordinator(url, b"member", token_file=os.path.join(directory, "missing"))
        self.assertRaises(tooz.ToozError, refused.start)

    def test_tls_ca(self) -> None:
        """tls_ca= connects with TLS, trusting that CA."""
        from tests.tls_certificates import make_certificate, skip_without_tls

        if skip_without_tls:
            raise SkipTest(skip_without_tls)
        key_path, certificate_path, _ = make_certificate(self)
        tls_port = free_port()
        serve_in_thread(
            self,
            extra_args=[
                "--port",
                f"ssl:{tls_port}:privateKey={key_path}:certKey={certificate_path}:interface=127.0.0.1",
            ],
        )
        coordinator = self.coordinator(f"jesync://127.0.0.1:{tls_port}?tls_ca={certificate_path}")
        with coordinator.get_lock(b"over-tls"):
            pass
        # Without the CA the certificate does not check out.
        plain = coordination.get_coordinator(f"jesync://127.0.0.1:{tls_port}?tls=1", b"member")
        self.assertRaises(tooz.ToozError, plain.start)


class LockTests(ToozTestCase):
    def test_mutual_exclusion(self) -> None:
        first = self.coordinator(member=b"first")
        second = self.coordinator(member=b"second")
        held = first.get_lock(b"shared-resource")
        other = second.get_lock(b"shared-resource")
        self.assertTrue(held.acquire(blocking=False))
        self.assertEqual(self.status("shared-resource"), (1, 0))
        self.assertFalse(other.acquire(blocking=False))
        self.assertFalse(other.release())

        # A timed wait gives up within its time: 1.5 s waits the whole second
        # the server counts; 0.5 s (no whole second) tries once.
        start = time.monotonic()
        self.assertFalse(other.acquire(blocking=1.5))
        self.assertGreaterEqual(time.monotonic() - start, 0.9)
        self.assertLess(time.monotonic() - start, 1.5 + 1.0)
        start = time.monotonic()
        self.assertFalse(other.acquire(blocking=0.5))
        self.assertLess(time.monotonic() - start, 0.5 + 0.5)
        start = time.monotonic()
        self.assertFalse(other.acquire(blocking=True, timeout=1))
        self.assertLess(time.monotonic() - start, 1 + 1.0)

        # A blocking acquire gets it once it is released.
        waiting = self.in_thread(other.acquire)
        self.wait_for(lambda: self.status("shared-resource") == (1, 1))
        self.assertFalse(waiting["done"].is_set())
        self.assertTrue(held.release())
        self.assertFalse(held.release())
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertIs(waiting.get("result"), True, waiting)
        self.assertEqual(self.status("shared-resource"), (1, 0))
        self.assertFalse(held.acquire(blocking=False))
        self.assertTrue(other.release())
        self.assertEqual(self.status("shared-resource"), (0, 0))
        self.assertTrue(held.acquire(blocking=2))
        self.assertTrue(held.release())

    def test_same_coordinator(self) -> None:
        """Lock objects (and threads) of one coordinator exclude each other too."""
        coordinator = self.coordinator()
        lock1 = coordinator.get_lock("same")
        lock2 = coordinator.get_lock(b"same")
        self.assertTrue(lock1.acquire())
        self.assertFalse(lock1.acquire(blocking=False))  # not reentrant
        self.assertFalse(lock2.acquire(blocking=False))
        self.assertFalse(coordinator.get_lock("same").acquire(blocking=False))
        start = time.monotonic()
        self.assertFalse(lock2.acquire(blocking=0.3))
        self.assertLess(time.monotonic() - start, 0.3 + 0.5)
        self.assertFalse(lock2.release())

        waiting = self.in_thread(lock2.acquire)
        self.assertFalse(waiting["done"].wait(0.2))
        self.assertTrue(lock1.release())
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertIs(waiting.get("result"), True, waiting)
        self.assertEqual(self.status("same"), (1, 0))
        self.assertFalse(lock1.release())
        self.assertTrue(lock2.release())
        self.assertEqual(self.status("same"), (0, 0))

    def test_one_lock_object_two_threads(self) -> None:
        coordinator = self.coordinator()
        lock = coordinator.get_lock("one-object")
        with lock:
            waiting = self.in_thread(lock.acquire)
            self.assertFalse(waiting["done"].wait(0.2))
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertIs(waiting.get("result"), True, waiting)
        self.assertTrue(lock.release())

    def test_context_manager(self) -> None:
        first = self.coordinator(member=b"first")
        second = self.coordinator(member=b"second")
        lock = first.get_lock("with-block")
        with lock as returned:
            self.assertIs(returned, lock)
            self.assertEqual(self.status("with-block"), (1, 0))
            self.assertTrue(lock.is_still_owner())
            with self.assertRaises(coordination.LockAcquireFailed):
                with second.get_lock("with-block")(False):
                    self.fail("acquired a held lock")
            with self.assertRaises(coordination.LockAcquireFailed):
                with second.get_lock("with-block")(1):
                    self.fail("acquired a held lock")
        self.assertFalse(lock.is_still_owner())
        self.assertEqual(self.status("with-block"), (0, 0))
        with second.get_lock("with-block")(5) as returned:
            self.assertEqual(self.status("with-block"), (1, 0))
            self.assertTrue(returned.release())  # released within: leaving is fine
        self.assertEqual(self.status("with-block"), (0, 0))

    def test_heartbeat_keeps_locks_past_their_expiry(self) -> None:
        """lock_expires=1: heartbeat() renews every held lock; without it the server lets them go."""
        coordinator = self.coordinator(f"{self.url}?lock_expires=1")
        other = self.coordinator(member=b"other")
        locks = [coordinator.get_lock(name) for name in ("beat-1", "beat-2")]
        for lock in locks:
            self.assertTrue(lock.acquire(blocking=False))
        self.assertFalse(coordinator.get_lock("not-held").heartbeat())
        start = time.monotonic()
        while time.monotonic() - start < 2.5:  # more than twice the expiry
            interval = coordinator.heartbeat()
            self.assertAlmostEqual(interval, 1 / 3)
            for name in ("beat-1", "beat-2"):
                self.assertEqual(self.status(name), (1, 0))
            self.assertTrue(all(lock.is_still_owner() for lock in locks))
            time.sleep(interval)
        self.assertFalse(other.get_lock("beat-1").acquire(blocking=False))
        # Without heartbeats the failsafe releases them.
        self.wait_for(lambda: self.status("beat-1") == (0, 0) and self.status("beat-2") == (0, 0), within=1 + WITHIN)
        self.assertTrue(other.get_lock("beat-1").acquire(blocking=WITHIN))
        self.assertFalse(locks[0].release())
        self.assertFalse(locks[1].release())
        # The coordinator's own lock objects may take the expired key again.
        self.assertTrue(coordinator.get_lock("beat-2").acquire(blocking=False))

    def test_heart_renews(self) -> None:
        """start(start_heart=True): tooz's heart thread renews the held locks."""
        coordinator = coordination.get_coordinator(f"{self.url}?lock_expires=1", b"member")
        coordinator.start(start_heart=True)
        self.addCleanup(coordinator.stop)
        lock = coordinator.get_lock("hearty")
        self.assertTrue(lock.acquire())
        deadline = time.monotonic() + 2.5  # more than twice the expiry
        while time.monotonic() < deadline:
            self.assertEqual(self.status("hearty"), (1, 0))
            time.sleep(0.1)
        self.assertTrue(lock.release())

    def test_stop_releases(self) -> None:
        first = self.coordinator(member=b"first")
        second = self.coordinator(member=b"second")
        lock = first.get_lock("stopped")
        self.assertTrue(lock.acquire())
        waiting = self.in_thread(lambda: second.get_lock("stopped").acquire(blocking=WITHIN))
        self.wait_for(lambda: self.status("stopped") == (1, 1))
        first.stop()
        self.assertTrue(waiting["done"].wait(WITHIN))
        self.assertIs(waiting.get("result"), True, waiting)
        self.assertFalse(lock.release())

    def test_server_dies(self) -> None:
        """The server is killed: held locks are lost (release() False), and requests raise ToozConnectionError."""
        server = serve_in_thread(self)
        coordinator = self.coordinator(f"jesync://127.0.0.1:{server.port}")
        lock = coordinator.get_lock("doomed")
        self.assertTrue(lock.acquire())
        server.kill()
        self.wait_for(lambda: not lock.is_still_owner())
        self.assertFalse(lock.release())
        self.assertRaises(coordination.ToozConnectionError, coordinator.get_lock("next").acquire)


class NameTests(ToozTestCase):
    def test_names_that_are_keys(self) -> None:
        """A name that is a valid key is its own key, bytes or str."""
        coordinator = self.coordinator()
        other = self.coordinator(member=b"other")
        for name, key in ((b"plain", "plain"), ("caf\u00e9/volume:7", "caf\u00e9/volume:7")):
            with self.subTest(name=name):
                lock = coordinator.get_lock(name)
                self.assertEqual(lock.name, name)
                with lock:
                    self.assertEqual(self.status(key), (1, 0))
                    self.assertFalse(other.get_lock(name).acquire(blocking=False))
                    # bytes and str name the same lock
                    alias = name.decode() if isinstance(name, bytes) else name.encode()
                    self.assertFalse(other.get_lock(alias).acquire(blocking=False))

    def test_encoded_names(self) -> None:
        """Names that cannot be keys (or look like encoded ones) are encoded; each still excludes."""

        def b64(raw: bytes) -> str:
            return "tooz:b64:" + base64.urlsafe_b64encode(raw).decode().rstrip("=")

        long_name = b"x" * 2000
        cases = [
            (b"with space", b64(b"with space")),
            ("tab\there", b64(b"tab\there")),
            (b"\xff\xfe not utf-8", b64(b"\xff\xfe not utf-8")),
            (b"tooz:b64:abc", b64(b"tooz:b64:abc")),
            (long_name, "tooz:sha256:" + hashlib.sha256(long_name).hexdigest()),
        ]
        coordinator = self.coordinator()
        other = self.coordinator(member=b"other")
        for name, key in cases:
            with self.subTest(name=name):
                lock = coordinator.get_lock(name)
                self.assertEqual(lock.name, name)
                self.assertTrue(lock.acquire(blocking=False))
                self.assertEqual(self.status(key), (1, 0))
                self.assertFalse(other.get_lock(name).acquire(blocking=False))
                self.assertTrue(lock.release())
                self.assertEqual(self.status(key), (0, 0))

    def test_prefix(self) -> None:
        coordinator = self.coordinator(f"{self.url}?prefix=nova.")
        with coordinator.get_lock(b"instance-1"):
            self.assertEqual(self.status("nova.instance-1"), (1, 0))
        with coordinator.get_lock(b"two words"):
            self.assertEqual(self.status("nova.tooz:b64:" + base64.urlsafe_b64encode(b"two words").decode()), (1, 0))


class SharedAndBreakTests(ToozTestCase):
    def test_shared_locks(self) -> None:
        """Shared holders share; an exclusive one waits for them; one lock object counts its shared acquires."""
        reader1, reader2 = self.coordinator(member=b"r1"), self.coordinator(member=b"r2")
        writer = self.coordinator(member=b"w")
        lock1, lock2 = reader1.get_lock("data"), reader2.get_lock("data")
        self.assertTrue(lock1.acquire(shared=True))
        self.assertTrue(lock1.acquire(shared=True))
        self.assertTrue(lock2.acquire(shared=True, blocking=False))
        self.assertEqual(self.status("data"), (2, 0))
        self.assertFalse(writer.get_lock("data").acquire(blocking=False))
        self.assertTrue(lock1.release())
        self.assertEqual(self.status("data"), (2, 0))  # one of its two acquires
        self.assertTrue(lock1.release())
        self.assertFalse(lock1.release())
        self.assertTrue(lock2.release())
        with writer.get_lock("data"):
            self.assertFalse(lock1.acquire(shared=True, blocking=False))

    def test_break_with_the_admin_listener(self) -> None:
        """break_() force-releases through admin=; its holder's release() then says False."""
        directory = tempfile.mkdtemp(prefix="jt-")
        self.addCleanup(shutil.rmtree, directory, True)
        token_file = os.path.join(directory, "admin-token")
        with open(token_file, "w") as file:
            file.write("admin-secret\n")
        admin_port = free_port()
        server = serve_in_thread(
            self,
            extra_args=["--admin-port", f"tcp:{admin_port}:interface=127.0.0.1", "--admin-token-file", token_file],
        )
        url = f"jesync://127.0.0.1:{server.port}"
        holder = self.coordinator(url, member=b"holder").get_lock("stuck")
        admin = f"admin=127.0.0.1:{admin_port}&admin_token_file={token_file}"
        breaker = self.coordinator(f"{url}?{admin}").get_lock("stuck")
        self.assertTrue(holder.acquire(blocking=False))
        self.assertTrue(breaker.break_())
        self.assertFalse(breaker.break_())  # nobody holds it now
        self.assertTrue(breaker.acquire(blocking=False))
        self.assertFalse(holder.release())
        # A wrong admin token is refused, as the admin listener refuses it.
        wrong = os.path.join(directory, "wrong")
        with open(wrong, "w") as file:
            file.write("not-it\n")
        refused = self.coordinator(f"{url}?admin=127.0.0.1:{admin_port}&admin_token_file={wrong}")
        self.assertRaises(tooz.ToozError, refused.get_lock("stuck").break_)

    def test_break_without_the_admin_listener(self) -> None:
        lock = self.coordinator().get_lock("stuck")
        with self.assertRaises(tooz.NotImplemented) as caught:
            lock.break_()
        self.assertIn("admin=", str(caught.exception))
        self.assertRaises(ValueError, coordination.get_coordinator, f"{self.url}?admin_token_file=/x", b"m")


class GroupTests(ToozTestCase):
    def test_members_capabilities_and_leaving_with_the_connection(self) -> None:
        first, second = self.coordinator(member=b"first"), self.coordinator(member=b"second")
        first.create_group(b"g").get()
        self.assertRaises(coordination.GroupAlreadyExist, first.create_group(b"g").get)
        first.join_group(b"g", {"role": "web"}).get()
        second.join_group(b"g").get()
        self.assertRaises(coordination.MemberAlreadyExist, first.join_group(b"g").get)
        self.assertEqual(first.get_members(b"g").get(), {b"first", b"second"})
        self.assertEqual(second.get_member_capabilities(b"g", b"first").get(), {"role": "web"})
        info = second.get_member_info(b"g", b"first").get()
        self.assertEqual(info["capabilities"], {"role": "web"})
        self.assertIsInstance(info["token"], int)
        self.assertEqual(self.status("group:g/first"), (1, 0))  # a member is a holder of its key
        self.assertRaises(coordination.GroupNotEmpty, first.delete_group(b"g").get)
        second.stop()
        self.assertEqual(first.get_members(b"g").get(), {b"first"})
        first.leave_group(b"g").get()
        self.assertRaises(coordination.MemberNotJoined, first.leave_group(b"g").get)
        first.delete_group(b"g").get()
        self.assertRaises(coordination.GroupNotCreated, first.get_members(b"g").get)
        self.assertEqual(first.get_groups().get(), [])

    def test_ids_that_are_not_group_names(self) -> None:
        """Ids with a '/', or not UTF-8, come back as they went in; prefix= keeps deployments apart."""
        coordinator = self.coordinator(member=b"\xff member")
        other = self.coordinator(f"{self.url}?prefix=other.")
        for group_id in (b"a/b", b"\x00\xfe"):
            coordinator.create_group(group_id).get()
            coordinator.join_group(group_id).get()
            self.assertEqual(coordinator.get_members(group_id).get(), {b"\xff member"})
        other.create_group(b"a/b").get()
        # Without a prefix every group is the coordinator's (the other's too, by its name on the server).
        self.assertLessEqual({b"\x00\xfe", b"a/b"}, set(coordinator.get_groups().get()))
        self.assertEqual(other.get_groups().get(), [b"a/b"])
        self.assertEqual(self.status("group:tooz:b64:" + base64.urlsafe_b64encode(b"a/b").decode()), (1, 0))

    def test_lease_lapses_without_heartbeat(self) -> None:
        """timeout= is each membership's lease: heartbeat() renews it; a member that stops stops being one."""
        beating = self.coordinator(f"{self.url}?timeout=1", member=b"beating")
        silent = self.coordinator(f"{self.url}?timeout=1", member=b"silent")
        beating.create_group(b"g").get()
        beating.join_group(b"g").get()
        silent.join_group(b"g").get()
        self.assertLessEqual(beating.heartbeat(), 1 / 3)
        deadline = time.monotonic() + WITHIN
        while b"silent" in beating.get_members(b"g").get():
            self.assertLess(time.monotonic(), deadline, "the silent member never lapsed")
            beating.heartbeat()
            time.sleep(0.1)
        self.assertEqual(beating.get_members(b"g").get(), {b"beating"})

    def test_watchers(self) -> None:
        watcher, member = self.coordinator(member=b"watcher"), self.coordinator(member=b"member")
        watcher.create_group(b"g").get()
        events: list[Any] = []
        watcher.watch_join_group(b"g", events.append)
        watcher.watch_leave_group(b"g", events.append)
        member.join_group(b"g").get()
        watcher.run_watchers()
        member.stop()
        watcher.run_watchers()
        self.assertEqual(
            [(type(event).__name__, event.member_id) for event in events],
            [("MemberJoinedGroup", b"member"), ("MemberLeftGroup", b"member")],
        )

    def test_heartbeat_after_the_lease_lapsed(self) -> None:
        """A lapsed membership is said once, then forgotten: later heartbeats renew nothing and say nothing."""
        member = self.coordinator(f"{self.url}?timeout=1", member=b"late")
        member.create_group(b"g").get()
        member.join_group(b"g").get()
        deadline = time.monotonic() + WITHIN
        while member.get_members(b"g").get():  # no heartbeat: the server ends it a second after the join
            self.assertLess(time.monotonic(), deadline, "the membership never lapsed")
            time.sleep(0.05)
        with self.assertLogs(TOOZ_LOG, "WARNING") as logged:
            member.heartbeat()
            member.heartbeat()
        self.assertEqual(len([line for line in logged.output if "had left" in line]), 1, logged.output)
        # Joined again, it is a member again, and heartbeats renew it.
        member.join_group(b"g").get()
        member.heartbeat()
        self.assertEqual(member.get_members(b"g").get(), {b"late"})

    def test_member_names_made_by_hand(self) -> None:
        """A name no id maps to (tooz: and base64 that is not the canonical one, or no base64) is no tooz member."""
        coordinator = self.coordinator(member=b"abc")
        coordinator.create_group(b"g").get()
        coordinator.join_group(b"g").get()
        with Client(f"127.0.0.1:{self.server.port}") as by_hand:
            group = by_hand.group("g")
            for name in ("tooz:b64:YWJj=", "tooz:b64:YW.Jj", "tooz:b64:!!!!", "tooz:abc", "def"):
                group.join(name)
            self.assertEqual(len(group.members()), 6)
            self.assertEqual(coordinator.get_members(b"g").get(), {b"abc", b"def"})
            # b"abc" is the coordinator's membership, not one of the hand-made look-alikes.
            self.assertEqual(coordinator.get_member_info(b"g", b"abc").get()["capabilities"], None)
            self.assertEqual(
                coordinator.get_member_info(b"g", b"abc").get()["token"],
                next(member.token for member in group.members() if member.member == "abc"),
            )

    def test_ids_with_lone_surrogates(self) -> None:
        """A str id with a lone surrogate is named like a lock name with one (base64 of its UTF-8, surrogates kept)."""
        coordinator = self.coordinator()
        coordinator.create_group("g\udc80").get()
        coordinator.join_group("g\udc80").get()
        raw = "g\udc80".encode("utf-8", "surrogatepass")
        self.assertEqual(coordinator.get_groups().get(), [raw])
        self.assertEqual(coordinator.get_members(raw).get(), {b"member"})
        self.assertEqual(self.status("group:tooz:b64:" + base64.urlsafe_b64encode(raw).decode().rstrip("=")), (1, 0))

    def test_a_prefix_without_a_separator_is_warned_about(self) -> None:
        """prefix=app can't tell its groups from app1:'s: it is kept (keys never change), and warned about."""
        with self.assertLogs(TOOZ_LOG, "WARNING") as logged:
            unseparated = self.coordinator(f"{self.url}?prefix=app")
        self.assertIn("prefix 'app' ends with no separator", logged.output[0])
        separated = self.coordinator(f"{self.url}?prefix=app.", member=b"other")
        other = self.coordinator(f"{self.url}?prefix=app1:", member=b"other")
        other.create_group(b"g").get()
        separated.create_group(b"g").get()
        self.assertEqual(separated.get_groups().get(), [b"g"])
        self.assertEqual(sorted(unseparated.get_groups().get()), [b".g", b"1:g"])  # what the warning says


class ElectionTests(ToozTestCase):
    def test_hand_over_on_stand_down_and_on_stop(self) -> None:
        coordinators = [self.coordinator(member=name) for name in (b"a", b"b", b"c")]
        a, b, c = coordinators
        a.create_group(b"g").get()
        elected: list[bytes] = []
        for coordinator in coordinators:
            coordinator.watch_elected_as_leader(b"g", lambda event: elected.append(event.member_id))
            coordinator.run_watchers()
        self.assertEqual(elected, [b"a"])
        self.assertEqual(c.get_leader(b"g").get(), b"a")
        self.assertTrue(a.stand_down_group_leader(b"g"))
        self.assertFalse(a.stand_down_group_leader(b"g"))
        b.run_watchers()
        self.assertEqual(c.get_leader(b"g").get(), b"b")
        b.stop()  # its connection's end ends its leadership at once
        c.run_watchers()
        a.run_watchers()
        self.assertEqual(elected, [b"a", b"b", b"c"])
        self.assertEqual(a.get_leader(b"g").get(), b"c")
        # The election is the key election:g, its holder the leader, with a fencing token.
        with Client(f"127.0.0.1:{self.server.port}") as client:
            (holder,) = client.holders("election:g")
        self.assertEqual(holder.value, b"c")
        self.assertIsInstance(holder.token, int)

    def test_unwatching_the_last_callback_resigns(self) -> None:
        coordinator = self.coordinator()
        coordinator.create_group(b"g").get()
        callback = lambda event: None  # noqa: E731
        coordinator.watch_elected_as_leader(b"g", callback)
        coordinator.run_watchers()
        self.assertEqual(coordinator.get_leader(b"g").get(), b"member")
        coordinator.unwatch_elected_as_leader(b"g", callback)
        self.assertIsNone(coordinator.get_leader(b"g").get())

    def test_a_lost_leadership_is_campaigned_for_again(self) -> None:
        """A leader that lost its leadership (its server restarted) campaigns again at the next run_watchers."""
        leader = self.coordinator(member=b"a")
        leader.create_group(b"g").get()
        elected: list[bytes] = []
        leader.watch_elected_as_leader(b"g", lambda event: elected.append(event.member_id))
        leader.run_watchers()
        self.assertEqual(elected, [b"a"])
        self.server.kill()
        self.server.start()  # on the same port, its lock table empty: nobody leads
        deadline = time.monotonic() + WITHIN
        with self.assertLogs(TOOZ_LOG, "WARNING") as logged:
            while len(elected) < 2:  # until its client has seen the connection drop
                self.assertLess(time.monotonic(), deadline, "the leader never campaigned again")
                leader.run_watchers()
                time.sleep(0.05)
        self.assertIn("lost the leadership of group b'g'", logged.output[0])
        self.assertEqual(elected, [b"a", b"a"])
        self.assertEqual(leader.get_leader(b"g").get(), b"a")
        self.assertEqual(self.status("election:g"), (1, 0))
