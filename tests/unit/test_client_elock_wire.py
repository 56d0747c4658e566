"""
The elock client's sans-I/O rules (L{jesync.client.elock_wire}): the
members a C{servers} string names, what each reply means, the request
lines, the grace period on the wire, and what becomes of a request a
failover interrupted.  No sockets: the client against real servers is in
tests/tcp/test_client_elock.py.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from jesync.client import LockTimeout, ServerError
from jesync.client.address import ClusterAddress, TCPAddress, UNIXAddress
from jesync.client.elock_wire import (
    AGAIN,
    DEFAULT_ELOCK_PORT,
    ELockReply,
    Owned,
    Request,
    acquired,
    after_resume,
    grace_milliseconds,
    keys_to_check,
    owned,
    parse_members,
    parse_reply,
    session_id,
    unlocked,
)
from jesync.client.wire import UnexpectedReply


class MembersTests(SynchronousTestCase):
    def test_a_host_alone_gets_the_elock_port(self) -> None:
        self.assertEqual(parse_members("db1"), (TCPAddress("db1", DEFAULT_ELOCK_PORT),))
        self.assertEqual(parse_members("[::1]"), (TCPAddress("::1", 11401),))
        self.assertEqual(parse_members("::1"), (TCPAddress("::1", 11401),))
        self.assertEqual(DEFAULT_ELOCK_PORT, 11401)

    def test_an_explicit_port_is_kept(self) -> None:
        self.assertEqual(parse_members("db1:7"), (TCPAddress("db1", 7),))
        self.assertEqual(parse_members("[::1]:11400"), (TCPAddress("::1", 11400),))
        self.assertEqual(parse_members("unix:/run/e.sock"), (UNIXAddress("/run/e.sock"),))

    def test_a_cluster(self) -> None:
        expected = (TCPAddress("a", 11401), TCPAddress("b", 9), UNIXAddress("/s"))
        self.assertEqual(parse_members("a|b:9|unix:/s"), expected)
        self.assertEqual(parse_members(ClusterAddress(expected)), expected)
        self.assertEqual(parse_members(["a", TCPAddress("b", 9), "unix:/s"]), expected)
        self.assertEqual(parse_members(TCPAddress("a", 1)), (TCPAddress("a", 1),))

    def test_refused(self) -> None:
        bad: list[Any] = ["a,b", "a b", "a||b", "|a", "a|a:11401", "", "a:0", []]
        for servers in bad:
            self.assertRaises(ValueError, parse_members, servers)
        self.assertRaises(TypeError, parse_members, [7])


class RepliesTests(SynchronousTestCase):
    def test_parse(self) -> None:
        self.assertEqual(parse_reply(b"200 Acquired\r"), ELockReply(200, "Acquired"))
        self.assertEqual(parse_reply(b"409 Unavailable"), ELockReply(409, "Unavailable"))
        for line in (b"", b"OK", b"20 x", b"2000 x", b"abc def"):
            self.assertRaises(UnexpectedReply, parse_reply, line)

    def test_acquired(self) -> None:
        self.assertIsNone(acquired(ELockReply(200, "Acquired"), "k", 0))
        self.assertEqual(acquired(ELockReply(200, "Acquired 17"), "k", 0), 17)
        self.assertRaises(UnexpectedReply, acquired, ELockReply(200, "Acquired x"), "k", 0)
        busy = self.assertRaises(LockTimeout, acquired, ELockReply(409, "Unavailable"), "k", 0)
        self.assertEqual((busy.key, str(busy)), ("k", "'k' is held by another session"))
        late = self.assertRaises(LockTimeout, acquired, ELockReply(409, "Unavailable"), "k", 3)
        self.assertEqual(str(late), "'k' was not granted within 3 s")
        refused = self.assertRaises(ServerError, acquired, ELockReply(503, "max-keys exceeded (1)"), "k", 0)
        self.assertEqual(refused.message, "503 max-keys exceeded (1)")

    def test_unlocked_owned_session_id(self) -> None:
        self.assertTrue(unlocked(ELockReply(200, "Unlocked")))
        self.assertFalse(unlocked(ELockReply(403, "not_yours")))
        self.assertFalse(unlocked(ELockReply(403, "not_locked")))
        self.assertEqual(owned(ELockReply(200, "owned")), Owned(True, None))
        self.assertEqual(owned(ELockReply(200, "owned 5")), Owned(True, 5))
        self.assertEqual(owned(ELockReply(404, "not_owned")), Owned(False))
        self.assertRaises(ServerError, owned, ELockReply(400, 'Unknown command: "owned"'))
        self.assertEqual(session_id(ELockReply(200, "3q2-kYc1T0iFqR2m8dJx5A")), "3q2-kYc1T0iFqR2m8dJx5A")
        self.assertRaises(UnexpectedReply, session_id, ELockReply(403, "cannot set conn id"))

    def test_requests(self) -> None:
        self.assertEqual(Request("lock", "k").line(5), b"lock k 5\r\n")
        self.assertEqual(Request("unlock", "k").line(), b"unlock k\r\n")
        self.assertEqual(Request("owned", "k").line(), b"owned k\r\n")
        self.assertEqual(Request("ping").line(), b"conn_id\r\n")
        for key in ("", "a b", "a\rb"):
            self.assertRaises(ValueError, Request("lock", key).line)

    def test_grace(self) -> None:
        self.assertEqual(grace_milliseconds(30), 30000)
        self.assertEqual(grace_milliseconds(0.25), 250)
        self.assertRaises(ValueError, grace_milliseconds, -1)
        self.assertRaises(ValueError, grace_milliseconds, 3e6)
        self.assertRaises(TypeError, grace_milliseconds, "30")


class AfterResumeTests(SynchronousTestCase):
    """What becomes of a request a failover interrupted, from what the resumed session holds."""

    def test_lock(self) -> None:
        self.assertEqual(after_resume(Request("lock", "k"), {"k": 9}), 9)  # it was granted before the drop
        self.assertIs(after_resume(Request("lock", "k"), {}), AGAIN)
        self.assertIs(after_resume(Request("lock", "k"), None), AGAIN)

    def test_unlock(self) -> None:
        self.assertIs(after_resume(Request("unlock", "k"), {"k": None}), AGAIN)
        self.assertIs(after_resume(Request("unlock", "k"), {}), True)

    def test_others(self) -> None:
        self.assertEqual(after_resume(Request("owned", "k"), {"k": 4}), Owned(True, 4))
        self.assertEqual(after_resume(Request("owned", "k"), {}), Owned(False, None))
        self.assertIsNone(after_resume(Request("ping"), {}))
        self.assertIs(after_resume(Request("unlock_all"), {}), AGAIN)
        self.assertIs(after_resume(Request("quit"), None), AGAIN)

    def test_keys_to_check(self) -> None:
        self.assertEqual(keys_to_check(["a", "b"], Request("lock", "c")), ["a", "b", "c"])
        self.assertEqual(keys_to_check(["a", "b"], Request("unlock", "a")), ["a", "b"])
        self.assertEqual(keys_to_check(["a"], None), ["a"])
