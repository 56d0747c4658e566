"""
Cluster mode: a token rotated by SIGHUP survives a change of leader.

A member builds a new lock server each term; its policies start from the
member's tokens as rotated so far (L{jesync.lock_server.MemberTokens}), and the
member, not the term, reads the token files again, so a standby rotates
too.  On a L{Clock}, with a stand-in for the member (a service with a
C{term}), its terms built by L{build_lock_server} as a member builds them.
"""

from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

from twisted.application.service import MultiService
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from jesync.lock_server import MemberTokens, TokenFile
from jesync.server import ServerSettings, build_lock_server
from tests.support import UnitClient, connect_unit

GRACE = 30.0


class Member(MultiService):
    """What L{MemberTokens} needs of a member: a service parent, and the current C{term} (None: a standby)."""

    term = None


class TokensAcrossTermsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        directory = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, directory)
        self.paths = {name: os.path.join(directory, name) for name in ("token", "admin-token")}
        for name, token in (("token", b"first"), ("admin-token", b"admin-first")):
            self.write(name, token)
            self.addCleanup(os.unlink, self.paths[name])
        self.settings = ServerSettings(
            ports=["tcp:0:interface=127.0.0.1"],
            admin_ports=["tcp:0:interface=127.0.0.1"],
            auth_token=b"first",
            auth_token_file=self.paths["token"],
            admin_token=b"admin-first",
            admin_token_file=self.paths["admin-token"],
            auth_token_grace=GRACE,
        )
        self.tokens = MemberTokens(self.settings.auth_token, self.settings.admin_token)
        self.member = Member()
        self.tokens.read_again_on_sighup(
            self.member,
            self.clock,
            self.settings.auth_token_file,
            self.settings.admin_token_file if self.settings.admin_ports else None,
            self.settings.auth_token_grace,
        )
        self.member.startService()  # (a Clock: no SIGHUP handler; reload() is SIGHUP's)
        self.addCleanup(self.member.stopService)
        self._port = 41000

    def write(self, name: str, token: bytes) -> None:
        with open(self.paths[name], "wb") as file:
            file.write(token + b"\n")

    def sighup(self) -> None:
        for token_file in self.member:
            assert isinstance(token_file, TokenFile)
            token_file.reload()

    def new_term(self):
        server = build_lock_server(self.clock, self.settings, tokens=self.tokens)
        self.member.term = SimpleNamespace(server=server)
        return server

    def connect(self, factory) -> UnitClient:
        self._port += 1
        return connect_unit(factory, IPv4Address("TCP", "127.0.0.1", self._port))

    def accepted(self, policy) -> list:
        now = self.clock.seconds()
        return [token for token in (b"first", b"second", b"admin-first", b"admin-second") if policy.accepts(token, now)]

    def test_a_new_term_after_a_rotation(self) -> None:
        first = self.new_term()
        self.write("token", b"second")
        self.write("admin-token", b"admin-second")
        self.sighup()
        self.assertEqual(self.accepted(first.policy), [b"first", b"second"])
        # The leader changes within the grace period: the new term takes
        # the new tokens, and the previous ones until the grace ends.
        self.member.term = None
        second = self.new_term()
        admin_policy = second.factories["admin"].policy
        self.assertEqual(self.accepted(second.policy), [b"first", b"second"])
        self.assertEqual(self.accepted(admin_policy), [b"admin-first", b"admin-second"])
        on_old = self.connect(second.factories["jesync"])
        self.assertEqual(on_old.ask(b"auth first\nlock a\n"), b"OK\nGRANTED 1 0 a 120\n")
        on_new = self.connect(second.factories["jesync"])
        self.assertEqual(on_new.ask(b"auth second\n"), b"OK\n")
        admin_on_old = self.connect(second.factories["admin"])
        self.assertEqual(admin_on_old.ask(b"auth admin-first\n"), b"OK\n")
        self.clock.advance(GRACE)
        # The grace is over: the rotated-out tokens open nothing, and the
        # new term's connections still on them are closed.
        self.assertEqual(self.accepted(second.policy), [b"second"])
        self.assertEqual(self.accepted(admin_policy), [b"admin-second"])
        self.assertTrue(on_old.closing)
        self.assertTrue(admin_on_old.closing)
        self.assertFalse(on_new.closing)
        # So does the standby's (the metrics ask for the member's tokens),
        # and the next term's.
        self.member.term = None
        self.assertEqual(self.accepted(self.tokens.lock), [b"second"])
        self.assertEqual(self.accepted(self.new_term().policy), [b"second"])

    def test_a_standby_rotates_too(self) -> None:
        self.write("token", b"second")
        self.sighup()
        self.assertEqual(self.accepted(self.tokens.lock), [b"first", b"second"])
        self.clock.advance(GRACE)
        self.assertEqual(self.accepted(self.tokens.lock), [b"second"])
        self.assertEqual(self.accepted(self.new_term().policy), [b"second"])

    def test_the_admin_token_may_not_become_the_lock_token(self) -> None:
        self.write("admin-token", b"first")
        self.sighup()
        self.assertEqual(self.accepted(self.tokens.admin), [b"admin-first"])
        term = self.new_term()
        self.assertEqual(self.accepted(term.factories["admin"].policy), [b"admin-first"])
