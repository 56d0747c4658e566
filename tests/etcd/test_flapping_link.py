"""
A leader whose link to etcd drops and heals every 0.5-1 s for 10 s keeps
leading, and answers every durable request right (issue 27).

The topology, all of it made here and removed in every outcome:

    [netns E]  etcd on 10.X.Y.1:2379
        | veth (the etcd link: cut with iptables DROP in M, both ways)
    [netns M]  the member, C{twistd jesync --etcd http://10.X.Y.1:2379
        |      --lease-ttl 3}, serving elock and /health on 10.X.Y.6
        | veth (the client link: never cut)
    [this process]  10.X.Y.5: an elock client doing lock/unlock (each
                    reply durable: it waits for an etcd transaction)

An episode: the etcd link is cut and healed in turn, each state lasting a
random 0.5-1 s (seeded), for 10 s; then, healed, the client goes on for
one certainty window (2.25 s), so a step-down the flapping set off shows.
The member must never step down (its log) and still lead (/health), and
every reply must be the right one.  C{JESYNC_FLAP_EPISODES} (default 1)
episodes in a row, C{JESYNC_FLAP_SEED} (default 27) seeding the first;
BENCHMARKS.md has the counts before and after the fix.

Needs root, C{ip netns} and C{iptables}; without them it is skipped,
saying why (and warning).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
from dataclasses import dataclass, field
from typing import List, Optional

from tests.cluster import member_health
from tests.etcd_server import EtcdProcess, require_etcd
from tests.servers import environment, twistd_command

TTL = 3
CERTAINTY = TTL - min(1.0, TTL / 4)  # jesync.cluster.member.Timing(3).certainty: 2.25 s
FLAPPING = 10.0
EPISODES = int(os.environ.get("JESYNC_FLAP_EPISODES", "1"))
SEED = int(os.environ.get("JESYNC_FLAP_SEED", "27"))
WITHIN = 30.0
ELOCK_PORT, JESYNC_PORT, METRICS_PORT = 11401, 11400, 9400


def tool(name: str) -> Optional[str]:
    """C{name}'s path: on the PATH, or in /usr/sbin or /sbin (often not on a user's PATH)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _run(*command: str) -> None:
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)


def _why_not() -> Optional[str]:
    """Why this machine cannot run the test, or None."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "it needs root (ip netns, iptables)"
    for name in ("ip", "iptables"):
        if tool(name) is None:
            return f"`{name}` is not installed (Debian: apt-get install iproute2 iptables)"
    return None


def skip_loudly(why: str) -> None:
    message = f"the flapping-link test is SKIPPED: {why}"
    warnings.warn(message)
    raise unittest.SkipTest(message)


class Network:
    """The namespaces, veth pairs and addresses of the module docstring; L{close} removes them."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.etcd_ns, self.member_ns = f"jflap{tag}e", f"jflap{tag}m"
        self.etcd_link, self.member_link = f"jf{tag}e", f"jf{tag}m"  # the etcd link's two ends
        self.client_link, self.root_link = f"jf{tag}c", f"jf{tag}r"  # the client link's
        net = f"10.{200 + os.getpid() % 50}.{os.getpid() // 50 % 256}"
        self.etcd_address, self.member_etcd_address = f"{net}.1", f"{net}.2"
        self.root_address, self.member_address = f"{net}.5", f"{net}.6"
        self._made: List[List[str]] = []
        self.ip, self.iptables_path = tool("ip") or "ip", tool("iptables") or "iptables"

    def make(self) -> None:
        """Build it (a failure leaves what was made to L{close})."""
        for namespace in (self.etcd_ns, self.member_ns):
            _run(self.ip, "netns", "add", namespace)
            self._made.append([self.ip, "netns", "del", namespace])
            _run(self.ip, "-n", namespace, "link", "set", "lo", "up")
        # (a veth pair goes with either end: deleting the namespaces removes both pairs)
        _run(self.ip, "link", "add", self.etcd_link, "type", "veth", "peer", "name", self.member_link)
        self._made.append([self.ip, "link", "del", self.etcd_link])
        _run(self.ip, "link", "set", self.etcd_link, "netns", self.etcd_ns)
        _run(self.ip, "link", "set", self.member_link, "netns", self.member_ns)
        _run(self.ip, "link", "add", self.root_link, "type", "veth", "peer", "name", self.client_link)
        self._made.append([self.ip, "link", "del", self.root_link])
        _run(self.ip, "link", "set", self.client_link, "netns", self.member_ns)
        for namespace, link, address in [
            (self.etcd_ns, self.etcd_link, self.etcd_address),
            (self.member_ns, self.member_link, self.member_etcd_address),
            (self.member_ns, self.client_link, self.member_address),
        ]:
            _run(self.ip, "-n", namespace, "addr", "add", f"{address}/30", "dev", link)
            _run(self.ip, "-n", namespace, "link", "set", link, "up")
        _run(self.ip, "addr", "add", f"{self.root_address}/30", "dev", self.root_link)
        _run(self.ip, "link", "set", self.root_link, "up")
        # The member's side of the etcd link, both ways, through a chain that is empty (healed) or drops (cut).
        self.iptables("-N", "FLAP")
        self.iptables("-A", "INPUT", "-i", self.member_link, "-j", "FLAP")
        self.iptables("-A", "OUTPUT", "-o", self.member_link, "-j", "FLAP")

    def iptables(self, *arguments: str) -> None:
        _run(self.ip, "netns", "exec", self.member_ns, self.iptables_path, *arguments)

    def cut(self) -> None:
        self.iptables("-A", "FLAP", "-j", "DROP")

    def heal(self) -> None:
        self.iptables("-F", "FLAP")

    def in_namespace(self, namespace: str) -> List[str]:
        return [self.ip, "netns", "exec", namespace]

    def close(self) -> None:
        for command in reversed(self._made):
            subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        self._made = []


class NamespacedEtcd(EtcdProcess):
    """etcd in the namespace E, its client URL on the etcd link."""

    def __init__(self, binary: str, network: Network) -> None:
        self.network = network
        super().__init__(binary, client_port=2379, peer_port=2380)

    @property
    def endpoint(self) -> str:
        return f"http://{self.network.etcd_address}:2379"

    @property
    def peer_url(self) -> str:
        return "http://127.0.0.1:2380"

    def command(self) -> List[str]:
        return [*self.network.in_namespace(self.network.etcd_ns), *super().command()]


class Member:
    """C{twistd jesync --etcd ...} in the namespace M."""

    def __init__(self, network: Network, etcd: str) -> None:
        self.network = network
        self._log = tempfile.TemporaryFile()
        address = network.member_address
        self.process = subprocess.Popen(
            [
                *network.in_namespace(network.member_ns),
                *twistd_command(),
                "-n",
                "--pidfile=",
                "jesync",
                "--etcd",
                etcd,
                "--cluster",
                "flap",
                "--lease-ttl",
                str(TTL),
                "--port",
                f"tcp:{JESYNC_PORT}:interface={address}",
                "--elock-port",
                f"tcp:{ELOCK_PORT}:interface={address}",
                "--metrics",
                f"tcp:{METRICS_PORT}:interface={address}",
                # (the client comes from another address than the member's own, on a link of the test's)
                "--protected-mode",
                "off",
            ],
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=tempfile.gettempdir(),
        )

    def health(self) -> Optional[str]:
        return member_health(self.network.member_address, METRICS_PORT)

    def wait_to_lead(self, etcd: EtcdProcess) -> None:
        deadline = time.monotonic() + WITHIN
        while self.health() != "leader":
            if self.process.poll() is not None or not etcd.running():
                raise AssertionError(f"the member or etcd exited:\n{self.log()}\n--- etcd:\n{etcd.log()}")
            if time.monotonic() > deadline:
                logs = f"{self.log()}\n--- etcd:\n{etcd.log()}"
                raise AssertionError(f"the member did not lead within {WITHIN} s:\n{logs}")
            time.sleep(0.05)

    def step_downs(self) -> List[str]:
        return [line for line in self.log().splitlines() if " steps down: " in line]

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@dataclass
class ClientRecord:
    cycles: int = 0
    slowest: float = 0.0
    wrong: List[str] = field(default_factory=list)


class ElockClient(threading.Thread):
    """lock/unlock of one key, one request at a time, until told to stop; every reply checked."""

    def __init__(self, address: str, key: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((address, ELOCK_PORT), timeout=2 * CERTAINTY)
        self.file = self.sock.makefile("rb")
        self.key = key
        self.record = ClientRecord()
        self.stopping = threading.Event()

    def ask(self, request: str, expected: str) -> bool:
        started = time.monotonic()
        try:
            self.sock.sendall(request.encode() + b"\r\n")
            reply = self.file.readline().decode(errors="replace").rstrip("\r\n")
        except OSError as error:
            reply = f"<{type(error).__name__}: {error}>"
        self.record.slowest = max(self.record.slowest, time.monotonic() - started)
        if reply != expected:
            self.record.wrong.append(f"{request!r} -> {reply or '<closed>'!r}, not {expected!r}")
            return False
        return True

    def run(self) -> None:
        while not self.stopping.is_set():
            if not self.ask(f"lock {self.key}", "200 Acquired") or not self.ask(f"unlock {self.key}", "200 Unlocked"):
                return
            self.record.cycles += 1

    def finish(self) -> ClientRecord:
        self.stopping.set()
        self.join(4 * CERTAINTY)
        self.sock.close()
        return self.record


@dataclass
class Episode:
    number: int
    cuts: int
    client: ClientRecord
    step_downs: List[str]

    def __str__(self) -> str:
        return (
            f"episode {self.number}: {self.cuts} cuts, {self.client.cycles} lock/unlock cycles, "
            f"slowest reply {self.client.slowest:.2f} s, {len(self.client.wrong)} wrong replies, "
            f"{len(self.step_downs)} step-downs"
        )


class FlappingLinkTests(unittest.TestCase):
    def setUp(self) -> None:
        why = _why_not()
        if why is not None:
            skip_loudly(why)
        binary = require_etcd()
        self.network = Network()
        self.addCleanup(self.network.close)
        try:
            self.network.make()
        except subprocess.CalledProcessError as error:
            skip_loudly(f"could not make the namespaces ({error}: {error.stderr.decode(errors='replace').strip()})")
        self.etcd = NamespacedEtcd(binary, self.network)
        self.addCleanup(self.etcd.close)
        self.etcd.launch()
        self.member = Member(self.network, self.etcd.endpoint)
        self.addCleanup(self.member.close)

    def flap(self, number: int) -> Episode:
        """One episode (the module docstring), the member leading when it starts."""
        self.member.wait_to_lead(self.etcd)
        before = len(self.member.step_downs())
        rng = random.Random(SEED + number)
        client = ElockClient(self.network.member_address, f"flap-{number}")
        client.start()
        cuts = 0
        end = time.monotonic() + FLAPPING
        try:
            while time.monotonic() < end:
                self.network.cut()
                cuts += 1
                time.sleep(rng.uniform(0.5, 1.0))
                self.network.heal()
                time.sleep(min(rng.uniform(0.5, 1.0), max(0.0, end - time.monotonic())))
        finally:
            self.network.heal()
        # One certainty window more, the client at work: a step-down the flapping set off shows now.
        client.stopping.wait(CERTAINTY)
        record = client.finish()
        return Episode(number, cuts, record, self.member.step_downs()[before:])

    def test_a_leader_on_a_flapping_link_keeps_leading(self) -> None:
        episodes = []
        for number in range(EPISODES):
            episode = self.flap(number)
            sys.stderr.write(f"flapping link: {episode}\n")
            episodes.append(episode)
        failed = [episode for episode in episodes if episode.step_downs or episode.client.wrong]
        details = "\n".join(
            f"{episode}\n  " + "\n  ".join(episode.step_downs + episode.client.wrong) for episode in failed
        )
        summary = f"{len(failed)} of {len(episodes)} episodes went wrong:\n{details}"
        self.assertEqual(failed, [], f"{summary}\n--- member:\n{self.member.log()}")
        self.assertEqual(self.member.health(), "leader")
        for episode in episodes:
            self.assertGreater(episode.client.cycles, 0, str(episode))
            self.assertGreater(episode.cuts, 5, str(episode))
