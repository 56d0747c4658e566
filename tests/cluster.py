"""
jesync cluster members for the tests: C{twistd jesync --etcd ...}
subprocesses (L{MemberProcess}), each with JESync, elock, dlock and metrics
ports of its own, and a cluster of them (L{ClusterProcesses}).

A standby listens on nothing but its metrics port, so a member is "up" once
its C{/health} answers (C{leader} or C{standby}); L{ClusterProcesses.leader}
waits, bounded, until exactly one member leads and answers on its JESync
port.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
from typing import List, Optional, Sequence

from tests.servers import ServerProcess, free_port

#: The lease TTL of the tests' members: etcd's smallest (see tests.etcd_server).
TTL = 2
#: How long a takeover may take: the issue's bound, TTL + 2 s.
TAKEOVER_WITHIN = TTL + 2.0


def member_health(host: str, metrics_port: int) -> Optional[str]:
    """A member's role as its metrics' C{/health} says (C{leader}, C{standby}), or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{metrics_port}/health", timeout=1) as response:
            return response.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.read().decode().strip()
    except OSError:
        return None


class MemberProcess(ServerProcess):
    """One member: C{twistd -n jesync --etcd ...} on loopback ports of its own."""

    def __init__(self, etcd: Sequence[str], cluster: str, ttl: int = TTL, extra_args: Sequence[str] = ()) -> None:
        self.elock_port = free_port()
        self.dlock_port = free_port()
        self.metrics_port = free_port()
        args: List[str] = []
        for endpoint in etcd:
            args += ["--etcd", endpoint]
        args += [
            "--cluster",
            cluster,
            "--lease-ttl",
            str(ttl),
            "--elock-port",
            f"tcp:{self.elock_port}:interface=127.0.0.1",
            "--dlock-port",
            f"tcp:{self.dlock_port}:interface=127.0.0.1",
            "--metrics",
            f"tcp:{self.metrics_port}:interface=127.0.0.1",
            *extra_args,
        ]
        super().__init__(extra_args=args)

    def health(self) -> Optional[str]:
        """C{leader} or C{standby} as its /health says, or None if it does not answer."""
        return member_health("127.0.0.1", self.metrics_port)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
            return response.read().decode()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + 20
        while self.health() is None:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"twistd exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the member's /health did not answer within 20 s:\n{self.log()}")
            time.sleep(0.02)

    def serves(self) -> bool:
        """Whether it answers a JESync request now."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as probe:
                probe.sendall(b"status ready-probe\n")
                return probe.recv(100) == b"STATUS 0 0 ready-probe\n"
        except OSError:
            return False

    def refuses(self) -> bool:
        """Whether every client port refuses connections (a standby's)."""
        for port in (self.port, self.elock_port, self.dlock_port):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except ConnectionRefusedError:
                continue
            return False
        return True

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        super().close()


class ClusterProcesses:
    """C{size} members of the cluster C{name} on C{etcd}."""

    def __init__(self, etcd: Sequence[str], size: int = 3, name: str = "test", ttl: int = TTL) -> None:
        self.members = [MemberProcess(etcd, name, ttl) for _ in range(size)]

    def start(self) -> ClusterProcesses:
        for member in self.members:
            member.start()
        return self

    def close(self) -> None:
        for member in self.members:
            member.close()

    def address(self, port: str = "port") -> str:
        """The members' addresses, C{a|b|c}, of one kind of port (port, elock_port, dlock_port)."""
        return "|".join(f"127.0.0.1:{getattr(member, port)}" for member in self.members)

    def leader(self, within: float = 20.0, besides: Sequence[MemberProcess] = ()) -> MemberProcess:
        """
        The one member that leads and serves, waited for (bounded); the
        members in C{besides} (dead or paused) are not asked.
        """
        deadline = time.monotonic() + within
        while True:
            asked = [member for member in self.members if member not in besides]
            leaders = [member for member in asked if member.health() == "leader"]
            if len(leaders) == 1 and leaders[0].serves():
                return leaders[0]
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- member {index}:\n{member.log()}" for index, member in enumerate(self.members))
                raise AssertionError(f"no single serving leader within {within} s (leaders: {len(leaders)}):\n{logs}")
            time.sleep(0.02)


def start_cluster(testcase, etcd: Sequence[str], size: int = 3, ttl: int = TTL) -> ClusterProcesses:
    """A running cluster of C{size} members, killed when C{testcase} ends."""
    cluster = ClusterProcesses(etcd, size, name=f"test-{free_port()}", ttl=ttl)
    testcase.addCleanup(cluster.close)
    return cluster.start()
