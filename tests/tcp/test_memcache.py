"""
The memcached listener over real TCP: C{twistd jesync --memcache-port}'s
server, built from its options in this process, on a reactor of its own in a
thread of its own (L{tests.servers.serve_in_thread}), spoken to with
C{pymemcache} (the text protocol), raw sockets (exact text replies, the
binary protocol) and a JESync client on C{--port} (the lock table the
objects' locks live in).

Four servers serve the whole module, each started when a test first needs
it and stopped by L{tearDownModule}: the default one, a small one
(C{--memcache-memory 64k --memcache-max-item 1024}) for oversized requests
and eviction, one for yrmcds's C{keys} listings (which see every object of
their server), and one with C{--auth-token-file}.  Every test uses keys of its
own, and leaves the server as it found it: its connections are closed and
the test waits until the server has seen them go (no memcached connection
left but the one asking, nothing in the lock table).

Nothing sleeps to let something happen: every read has a bounded timeout
(L{TIMEOUT}), and a disconnect's release is waited for by retrying, with a
deadline.  That a reply is I{not} sent is shown by order: a later request's
reply (C{version}, a binary C{noop}) is the next thing that arrives.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import time
import unittest
from typing import Callable, ClassVar, Dict, List, NamedTuple, Optional, Tuple

from pymemcache import exceptions as pymemcache_errors
from pymemcache.client.base import Client

from tests.servers import ServerThread, free_port, serve_in_thread

#: How long any one read may wait, and any retry loop may go on.
TIMEOUT = 5.0
#: The auth server's token.
TOKEN = b"memcache-test-token"

# -- the binary protocol (memcached's binary protocol and yrmcds's extensions) --

HEADER = struct.Struct(">BBHBBHIIQ")
REQUEST_MAGIC = 0x80
RESPONSE_MAGIC = 0x81

GET, SET, ADD, REPLACE, DELETE, INCREMENT, DECREMENT, QUIT, FLUSH = range(9)
GETQ, NOOP, VERSION, GETK, GETKQ, APPEND, PREPEND, STAT = range(9, 17)
SETQ, ADDQ, REPLACEQ, DELETEQ, INCREMENTQ, DECREMENTQ, QUITQ, FLUSHQ, APPENDQ, PREPENDQ = range(17, 27)
VERBOSITY, TOUCH, GAT, GATQ = range(27, 31)
SASL_LIST_MECHS, SASL_AUTH = 0x20, 0x21
GATK, GATKQ = 0x23, 0x24
LOCK, LOCKQ, UNLOCK, UNLOCKQ, UNLOCK_ALL, UNLOCK_ALLQ = range(0x40, 0x46)
LAG, LAGQ, LAGK, LAGKQ, RAU, RAUQ = range(0x46, 0x4C)
KEYS = 0x50

SUCCESS = 0x0000
KEY_NOT_FOUND = 0x0001
KEY_EXISTS = 0x0002
VALUE_TOO_LARGE = 0x0003
INVALID_ARGUMENTS = 0x0004
ITEM_NOT_STORED = 0x0005
NON_NUMERIC = 0x0006
LOCKED = 0x0010
NOT_LOCKED = 0x0011
AUTH_ERROR = 0x0020
UNKNOWN_COMMAND = 0x0081
OUT_OF_MEMORY = 0x0082

NO_EXTRAS = b""


def storage_extras(flags: int = 0, exptime: int = 0) -> bytes:
    """A binary Set/Add/Replace/RaU's extras: flags and expiration."""
    return struct.pack(">II", flags, exptime & 0xFFFFFFFF)


def delta_extras(delta: int, initial: int = 0, exptime: int = 0xFFFFFFFF) -> bytes:
    """A binary Increment/Decrement's extras (expiration 0xFFFFFFFF: do not create a missing counter)."""
    return struct.pack(">QQI", delta, initial, exptime)


def exptime_extras(exptime: int) -> bytes:
    """A Touch/GAT/LaG expiration extra."""
    return struct.pack(">I", exptime & 0xFFFFFFFF)


def request(
    opcode: int,
    key: bytes = b"",
    extras: bytes = NO_EXTRAS,
    value: bytes = b"",
    opaque: int = 0,
    cas: int = 0,
    body_length: Optional[int] = None,
) -> bytes:
    """One binary request packet (C{body_length} given: a lying header)."""
    length = len(extras) + len(key) + len(value) if body_length is None else body_length
    return HEADER.pack(REQUEST_MAGIC, opcode, len(key), len(extras), 0, 0, length, opaque, cas) + extras + key + value


class Response(NamedTuple):
    opcode: int
    status: int
    opaque: int
    cas: int
    extras: bytes
    key: bytes
    value: bytes


# -- clients ---------------------------------------------------------------------


class RawClient:
    """A blocking socket whose every read waits at most L{TIMEOUT}."""

    def __init__(self, port: int, receive_buffer: Optional[int] = None) -> None:
        if receive_buffer is None:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        else:
            # (set before connecting, so the window the server sees stays that small)
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(TIMEOUT)
            self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, *pieces: bytes) -> None:
        self.sock.sendall(b"".join(pieces))

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise EOFError(f"the server closed the connection; unread: {self.buffer!r}")
        self.buffer += chunk

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def until(self, marker: bytes) -> bytes:
        """Everything up to and including the first C{marker}."""
        while marker not in self.buffer:
            self._fill()
        end = self.buffer.index(marker) + len(marker)
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    def line(self) -> bytes:
        return self.until(b"\n")

    def response(self) -> Response:
        """One binary response."""
        magic, opcode, key_length, extras_length, _, status, body_length, opaque, cas = HEADER.unpack(
            self.exactly(HEADER.size)
        )
        if magic != RESPONSE_MAGIC:
            raise AssertionError(f"not a binary response: {self.buffer[:40]!r}")
        body = self.exactly(body_length)
        return Response(
            opcode,
            status,
            opaque,
            cas,
            body[:extras_length],
            body[extras_length : extras_length + key_length],
            body[extras_length + key_length :],
        )

    def read_to_close(self) -> bytes:
        """Everything until the server closes the connection (a reset ends it too)."""
        data, self.buffer = self.buffer, b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def close(self) -> None:
        self.sock.close()


class TextClient(RawClient):
    """The memcached text protocol, replies read exactly as sent."""

    def ask(self, data: bytes, lines: int = 1) -> bytes:
        """Send C{data}; its reply, C{lines} lines long."""
        self.send(data)
        return b"".join(self.line() for _ in range(lines))

    def ask_until(self, data: bytes, marker: bytes = b"END\r\n") -> bytes:
        self.send(data)
        return self.until(marker)

    def store(self, key: bytes, value: bytes, flags: int = 0, exptime: int = 0, command: bytes = b"set") -> bytes:
        return self.ask(b"%s %s %d %d %d\r\n%s\r\n" % (command, key, flags, exptime, len(value), value))

    def get(self, *keys: bytes) -> bytes:
        return self.ask_until(b"get " + b" ".join(keys) + b"\r\n")

    def value_of(self, key: bytes) -> Optional[bytes]:
        """The value C{get} answers for C{key}, or None (a miss)."""
        reply = self.get(key)
        if reply == b"END\r\n":
            return None
        header, rest = reply.split(b"\r\n", 1)
        size = int(header.split()[3])
        return rest[:size]

    def version_line(self) -> bytes:
        return self.ask(b"version\r\n")

    def stats(self) -> Dict[bytes, bytes]:
        reply = self.ask_until(b"stats\r\n")
        rows = [line.split(b" ", 2) for line in reply.split(b"\r\n") if line.startswith(b"STAT ")]
        return {name: value for _, name, value in rows}


class BinaryClient(RawClient):
    """The memcached binary protocol: packets out, one response read at a time."""

    def read(self) -> Response:
        return self.response()

    def call(
        self,
        opcode: int,
        key: bytes = b"",
        extras: bytes = NO_EXTRAS,
        value: bytes = b"",
        opaque: int = 0,
        cas: int = 0,
    ) -> Response:
        self.send(request(opcode, key, extras, value, opaque, cas))
        return self.read()

    def set(self, key: bytes, value: bytes, flags: int = 0, exptime: int = 0) -> Response:
        return self.call(SET, key, storage_extras(flags, exptime), value)

    def noop_after(self, *packets: bytes) -> List[Response]:
        """Send C{packets} and a noop (opaque 0xfeed); every response up to the noop's, the noop's last."""
        self.send(*packets, request(NOOP, opaque=0xFEED))
        responses = []
        while True:
            response = self.read()
            responses.append(response)
            if response.opcode == NOOP and response.opaque == 0xFEED:
                return responses


# -- the servers -------------------------------------------------------------------


class _ModuleScope:
    """What L{serve_in_thread} registers its cleanups with: the module's, run by L{tearDownModule}."""

    def __init__(self) -> None:
        self.cleanups: List[Tuple[Callable[..., object], tuple]] = []

    def addCleanup(self, function: Callable[..., object], *args: object) -> None:
        self.cleanups.append((function, args))

    def run_cleanups(self) -> None:
        while self.cleanups:
            function, args = self.cleanups.pop()
            function(*args)


_SCOPE = _ModuleScope()


class Server(NamedTuple):
    process: ServerThread
    memcache_port: int
    auth_token: Optional[bytes]

    @property
    def jesync_port(self) -> int:
        return self.process.port


_SERVERS: Dict[str, Server] = {}


def _token_file() -> str:
    descriptor, path = tempfile.mkstemp(prefix="jesync-memcache-token-")
    with os.fdopen(descriptor, "wb") as file:
        file.write(TOKEN + b"\n")
    _SCOPE.addCleanup(os.unlink, path)
    return path


def server(kind: str) -> Server:
    """The module's server of this kind (C{default}, C{small}, C{listing}, C{auth}), started when first asked for."""
    if kind not in _SERVERS:
        port = free_port()
        args = ["--memcache-port", f"tcp:{port}:interface=127.0.0.1"]
        token = None
        if kind == "small":
            args += ["--memcache-memory", "64k", "--memcache-max-item", "1024"]
        elif kind == "listing":
            pass  # (a server of its own: what a listing of every key shows is the test's alone)
        elif kind == "auth":
            args += ["--auth-token-file", _token_file()]
            token = TOKEN
        _SERVERS[kind] = Server(serve_in_thread(_SCOPE, extra_args=args, auth_token=token), port, token)
    return _SERVERS[kind]


def tearDownModule() -> None:
    _SERVERS.clear()
    _SCOPE.run_cleanups()


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Retry C{condition} until it holds, for L{TIMEOUT} at most."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {TIMEOUT} s: {what}")
        time.sleep(0.005)


class MemcacheTestCase(unittest.TestCase):
    """Tests against one of the module's servers (C{kind}), with clients closed and waited for at the end."""

    kind: ClassVar[str] = "default"

    def setUp(self) -> None:
        self.server = server(self.kind)
        self._closers: List[Callable[[], object]] = []
        self.addCleanup(self._quiesce)

    # -- clients ---------------------------------------------------------------

    def _authenticate_text(self, client: TextClient) -> None:
        if self.server.auth_token is not None:
            self.assertEqual(client.store(b"auth", b"user " + self.server.auth_token), b"STORED\r\n")

    def text(self, authenticate: bool = True, receive_buffer: Optional[int] = None) -> TextClient:
        client = TextClient(self.server.memcache_port, receive_buffer)
        self._closers.append(client.close)
        if authenticate:
            self._authenticate_text(client)
        return client

    def binary(self, authenticate: bool = True) -> BinaryClient:
        client = BinaryClient(self.server.memcache_port)
        self._closers.append(client.close)
        if authenticate and self.server.auth_token is not None:
            reply = client.call(SASL_AUTH, b"PLAIN", value=b"\0user\0" + self.server.auth_token)
            self.assertEqual(reply.status, SUCCESS)
        return client

    def pymemcache(self, **options: object) -> Client:
        client = Client(("127.0.0.1", self.server.memcache_port), connect_timeout=TIMEOUT, timeout=TIMEOUT, **options)
        self._closers.append(client.close)
        return client

    def jesync(self) -> TextClient:
        """A JESync client (on --port): lines end in LF."""
        client = TextClient(self.server.jesync_port)
        self._closers.append(client.close)
        if self.server.auth_token is not None:
            self.assertEqual(client.ask(b"auth " + self.server.auth_token + b"\n"), b"OK\n")
        return client

    def key(self, name: str = "k") -> bytes:
        """A key of this test's own (the servers are shared)."""
        return f"{type(self).__name__}.{self._testMethodName}.".encode() + name.encode("latin-1")

    # -- the end of a test ----------------------------------------------------------

    def _quiesce(self) -> None:
        """Close this test's clients; wait until the server has seen them go and its lock table is empty."""
        for close in reversed(self._closers):
            close()
        watcher, locks = self.text(), self.jesync()
        eventually(lambda: watcher.stats()[b"curr_connections"] == b"1", "the test's memcached connections closed")
        eventually(lambda: locks.ask_until(b"status-by-key\n", b"END\n") == b"END\n", "the lock table empty")
        watcher.close()
        locks.close()

    # -- assertions --------------------------------------------------------------------

    def assertNothingBefore(self, client: TextClient, *requests: bytes) -> None:
        """C{requests} are answered with nothing: the next reply is that of a C{version} sent after them."""
        client.send(*requests, b"version\r\n")
        line = client.line()
        self.assertTrue(line.startswith(b"VERSION "), f"answered {line!r} before the version")

    def assertLockedAgainst(self, client: TextClient, key: bytes) -> None:
        """C{client} may not write object C{key}: every write answers LOCKED."""
        for command in (b"set", b"add", b"replace", b"append", b"prepend"):
            self.assertEqual(client.store(key, b"theirs", command=command), b"LOCKED\r\n", command)
        gets = client.ask_until(b"gets " + key + b"\r\n")
        cas = int(gets.split(b"\r\n")[0].split()[4]) if gets != b"END\r\n" else 1
        self.assertEqual(client.ask(b"cas %s 0 0 6 %d\r\ntheirs\r\n" % (key, cas)), b"LOCKED\r\n")
        self.assertEqual(client.ask(b"incr %s 1\r\n" % key), b"LOCKED\r\n")
        self.assertEqual(client.ask(b"decr %s 1\r\n" % key), b"LOCKED\r\n")
        self.assertEqual(client.ask(b"delete %s\r\n" % key), b"LOCKED\r\n")

    def assertServing(self) -> None:
        """A new client is served."""
        client = self.text()
        self.assertEqual(client.store(self.key("alive"), b"yes"), b"STORED\r\n")
        self.assertEqual(client.value_of(self.key("alive")), b"yes")


# == the text protocol ===================================================================


class TextCommandTests(MemcacheTestCase):
    """Every text command, as memcached answers it."""

    def test_set_get_gets_multi_key(self) -> None:
        client = self.text()
        a, b, missing = self.key("a"), self.key("b"), self.key("missing")
        self.assertEqual(client.store(a, b"alpha", flags=42), b"STORED\r\n")
        self.assertEqual(client.store(b, b"b\r\nc"), b"STORED\r\n")
        self.assertEqual(
            client.get(a, missing, b),
            b"VALUE %s 42 5\r\nalpha\r\nVALUE %s 0 4\r\nb\r\nc\r\nEND\r\n" % (a, b),
        )
        reply = client.ask_until(b"gets %s %s\r\n" % (a, b))
        lines = reply.split(b"\r\n")
        first, second = lines[0].split(), lines[2].split()
        self.assertEqual(first[:4], [b"VALUE", a, b"42", b"5"])
        self.assertEqual(second[:4], [b"VALUE", b, b"0", b"4"])
        self.assertNotEqual(int(first[4]), int(second[4]))
        self.assertEqual(client.get(missing), b"END\r\n")

    def test_repeated_keys_and_bare_line_feeds(self) -> None:
        # memcached returns every hit, repeats included, and takes LF alone as a line's end.
        client = self.text()
        key = self.key()
        self.assertEqual(client.ask(b"set %s 0 0 1\nv\r\n" % key), b"STORED\r\n")
        self.assertEqual(
            client.ask_until(b"get %s %s %s\n" % (key, self.key("missing"), key)),
            b"VALUE %s 0 1\r\nv\r\n" % key * 2 + b"END\r\n",
        )

    def test_keys_with_control_characters(self) -> None:
        # memcached's fields are separated by spaces only: a key may hold any other byte.
        client = self.text()
        for key in (self.key("a\x01\x7f\xffb"), self.key("tab\tb"), self.key("vt\x0bb"), self.key("ff\x0cb")):
            self.assertEqual(client.store(key, b"z"), b"STORED\r\n", key)
            self.assertEqual(client.get(key), b"VALUE %s 0 1\r\nz\r\nEND\r\n" % key, key)
            self.assertEqual(client.ask(b"lock %s\r\n" % key), b"OK\r\n", key)

    def test_cas(self) -> None:
        client = self.text()
        key = self.key()
        client.store(key, b"one")
        unique = int(client.ask_until(b"gets %s\r\n" % key).split()[4])
        self.assertEqual(client.ask(b"cas %s 0 0 3 %d\r\ntwo\r\n" % (key, unique + 1000)), b"EXISTS\r\n")
        self.assertEqual(client.ask(b"cas %s 5 0 3 %d\r\ntwo\r\n" % (key, unique)), b"STORED\r\n")
        self.assertEqual(client.get(key), b"VALUE %s 5 3\r\ntwo\r\nEND\r\n" % key)
        # The CAS value changed: the old one no longer matches.
        self.assertEqual(client.ask(b"cas %s 0 0 5 %d\r\nthree\r\n" % (key, unique)), b"EXISTS\r\n")
        self.assertEqual(client.ask(b"cas %s 0 0 3 1\r\ntwo\r\n" % self.key("missing")), b"NOT_FOUND\r\n")

    def test_add_replace_append_prepend(self) -> None:
        client = self.text()
        key, missing = self.key(), self.key("missing")
        self.assertEqual(client.store(key, b"1", command=b"add"), b"STORED\r\n")
        self.assertEqual(client.store(key, b"x", command=b"add"), b"NOT_STORED\r\n")
        self.assertEqual(client.store(key, b"2", flags=7, command=b"replace"), b"STORED\r\n")
        self.assertEqual(client.store(key, b"3", flags=9, command=b"append"), b"STORED\r\n")
        self.assertEqual(client.store(key, b"0", command=b"prepend"), b"STORED\r\n")
        # (appending keeps the item's flags)
        self.assertEqual(client.get(key), b"VALUE %s 7 3\r\n023\r\nEND\r\n" % key)
        for command in (b"replace", b"append", b"prepend"):
            self.assertEqual(client.store(missing, b"x", command=command), b"NOT_STORED\r\n", command)
        self.assertEqual(client.get(missing), b"END\r\n")

    def test_incr_decr(self) -> None:
        client = self.text()
        key = self.key()
        client.store(key, b"10")
        self.assertEqual(client.ask(b"incr %s 5\r\n" % key), b"15\r\n")
        self.assertEqual(client.ask(b"decr %s 3\r\n" % key), b"12\r\n")
        # decr stops at 0
        self.assertEqual(client.ask(b"decr %s 100\r\n" % key), b"0\r\n")
        # incr wraps at 2**64
        client.store(key, b"18446744073709551615")
        self.assertEqual(client.ask(b"incr %s 2\r\n" % key), b"1\r\n")
        self.assertEqual(client.get(key), b"VALUE %s 0 1\r\n1\r\nEND\r\n" % key)
        self.assertEqual(client.ask(b"incr %s 1\r\n" % self.key("missing")), b"NOT_FOUND\r\n")
        client.store(key, b"abc")
        self.assertEqual(
            client.ask(b"incr %s 1\r\n" % key), b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        )
        self.assertEqual(client.ask(b"incr %s x\r\n" % key), b"CLIENT_ERROR invalid numeric delta argument\r\n")
        self.assertEqual(client.ask(b"decr %s -1\r\n" % key), b"CLIENT_ERROR invalid numeric delta argument\r\n")
        self.assertEqual(client.get(key), b"VALUE %s 0 3\r\nabc\r\nEND\r\n" % key)

    def test_incr_of_a_number_with_leading_spaces(self) -> None:
        # memcached and yrmcds read the value with strtoull, which skips leading whitespace.
        client = self.text()
        key = self.key()
        client.store(key, b" 12")
        self.assertEqual(client.ask(b"incr %s 1\r\n" % key), b"13\r\n")

    def test_delete_and_touch(self) -> None:
        client = self.text()
        key = self.key()
        client.store(key, b"v")
        self.assertEqual(client.ask(b"touch %s 100\r\n" % key), b"TOUCHED\r\n")
        self.assertEqual(client.ask(b"touch %s 100\r\n" % self.key("missing")), b"NOT_FOUND\r\n")
        self.assertEqual(client.ask(b"delete %s\r\n" % key), b"DELETED\r\n")
        self.assertEqual(client.ask(b"delete %s\r\n" % key), b"NOT_FOUND\r\n")
        client.store(key, b"v")
        # memcached still takes "delete <key> 0"
        self.assertEqual(client.ask(b"delete %s 0\r\n" % key), b"DELETED\r\n")

    def test_expiration_times(self) -> None:
        client = self.text()
        negative, past, future, touched = (self.key(name) for name in ("negative", "past", "future", "touched"))
        self.assertEqual(client.store(negative, b"v", exptime=-1), b"STORED\r\n")
        # beyond 30 days: an absolute Unix time (this one is in 1970)
        self.assertEqual(client.store(past, b"v", exptime=30 * 24 * 3600 + 1), b"STORED\r\n")
        self.assertEqual(client.store(future, b"v", exptime=int(time.time()) + 3600), b"STORED\r\n")
        self.assertEqual(client.get(negative, past, future), b"VALUE %s 0 1\r\nv\r\nEND\r\n" % future)
        client.store(touched, b"v", exptime=3600)
        self.assertEqual(client.ask(b"touch %s -1\r\n" % touched), b"TOUCHED\r\n")
        self.assertEqual(client.get(touched), b"END\r\n")

    def test_gat_gats(self) -> None:
        client = self.text()
        key, missing = self.key(), self.key("missing")
        client.store(key, b"v", flags=3)
        self.assertEqual(client.ask_until(b"gat 100 %s %s\r\n" % (key, missing)), b"VALUE %s 3 1\r\nv\r\nEND\r\n" % key)
        reply = client.ask_until(b"gats 100 %s\r\n" % key)
        self.assertRegex(reply, rb"^VALUE %s 3 1 \d+\r\nv\r\nEND\r\n$" % key)
        # gat with an expiration in the past: this read still finds it, the next does not
        self.assertEqual(client.ask_until(b"gat -1 %s\r\n" % key), b"VALUE %s 3 1\r\nv\r\nEND\r\n" % key)
        self.assertEqual(client.get(key), b"END\r\n")

    def test_flush_all(self) -> None:
        client = self.text()
        key = self.key()
        client.store(key, b"v")
        before = int(client.stats()[b"cmd_flush"])
        # A delayed flush leaves the items until then ...
        self.assertEqual(client.ask(b"flush_all 3600\r\n"), b"OK\r\n")
        self.assertEqual(client.value_of(key), b"v")
        # ... and a flush now (instead) removes them.
        self.assertEqual(client.ask(b"flush_all\r\n"), b"OK\r\n")
        self.assertEqual(client.get(key), b"END\r\n")
        client.store(key, b"v")
        self.assertNothingBefore(client, b"flush_all noreply\r\n")
        self.assertEqual(client.get(key), b"END\r\n")
        self.assertEqual(int(client.stats()[b"cmd_flush"]), before + 3)

    def test_version_verbosity_quit(self) -> None:
        client = self.text()
        self.assertRegex(client.version_line(), rb"^VERSION \S+\r\n$")
        self.assertEqual(client.ask(b"verbosity 1\r\n"), b"OK\r\n")
        self.assertNothingBefore(client, b"verbosity 1 noreply\r\n")
        client.send(b"quit\r\n")
        self.assertEqual(client.read_to_close(), b"")

    def test_stats(self) -> None:
        client = self.text()
        key = self.key()
        before = client.stats()
        for name in (
            b"pid",
            b"uptime",
            b"time",
            b"version",
            b"curr_connections",
            b"total_connections",
            b"cmd_get",
            b"cmd_set",
            b"get_hits",
            b"get_misses",
            b"curr_items",
            b"total_items",
            b"bytes",
            b"limit_maxbytes",
            b"evictions",
            b"locked_items",
        ):
            self.assertIn(name, before)
            if name != b"version":
                self.assertTrue(before[name].isdigit(), (name, before[name]))
        client.store(key, b"12345")
        client.get(key)
        client.get(key, self.key("missing"))
        self.assertEqual(client.ask(b"lock %s\r\n" % key), b"OK\r\n")
        after = client.stats()

        def grew(name: bytes) -> int:
            return int(after[name]) - int(before[name])

        self.assertEqual(grew(b"get_hits"), 2)
        self.assertEqual(grew(b"get_misses"), 1)
        self.assertEqual(grew(b"cmd_get"), 3)
        self.assertEqual(grew(b"cmd_set"), 1)
        self.assertEqual(grew(b"curr_items"), 1)
        self.assertEqual(grew(b"locked_items"), 1)
        self.assertGreaterEqual(grew(b"bytes"), len(key) + 5)
        self.assertEqual(int(after[b"limit_maxbytes"]), 64 * 1024 * 1024)
        settings = client.ask_until(b"stats settings\r\n")
        self.assertIn(b"STAT item_size_max 1048576\r\n", settings)
        self.assertIn(b"STAT maxbytes 67108864\r\n", settings)

    def test_noreply(self) -> None:
        client = self.text()
        key, counter = self.key(), self.key("counter")
        self.assertNothingBefore(
            client,
            b"set %s 0 0 1 noreply\r\na\r\n" % key,
            b"add %s 0 0 1 noreply\r\nx\r\n" % key,  # (NOT_STORED: not said either)
            b"replace %s 0 0 1 noreply\r\nb\r\n" % key,
            b"append %s 0 0 1 noreply\r\nc\r\n" % key,
            b"prepend %s 0 0 1 noreply\r\nd\r\n" % key,
            b"set %s 0 0 2 noreply\r\n10\r\n" % counter,
            b"incr %s 5 noreply\r\n" % counter,
            b"decr %s 2 noreply\r\n" % counter,
            b"touch %s 100 noreply\r\n" % key,
            b"delete %s noreply\r\n" % self.key("missing"),
        )
        self.assertEqual(
            client.get(key, counter), b"VALUE %s 0 3\r\ndbc\r\nVALUE %s 0 2\r\n13\r\nEND\r\n" % (key, counter)
        )
        unique = int(client.ask_until(b"gets %s\r\n" % key).split()[4])
        self.assertNothingBefore(
            client, b"cas %s 0 0 1 %d noreply\r\ne\r\n" % (key, unique), b"delete %s noreply\r\n" % counter
        )
        self.assertEqual(client.get(key, counter), b"VALUE %s 0 1\r\ne\r\nEND\r\n" % key)

    def test_noreply_silences_errors_too(self) -> None:
        # memcached (and yrmcds) send nothing at all for a noreply command,
        # not even an error reply.
        client = self.text()
        key = self.key()
        client.store(key, b"not a number")
        self.assertNothingBefore(client, b"incr %s 1 noreply\r\n" % key)

    def test_noreply_silences_argument_errors_as_memcached(self) -> None:
        # Probed byte by byte against memcached 1.6.18: a command that takes
        # noreply and ends with it is silent once its number of fields is
        # right, whatever its other arguments are (libmemcached's memccapable
        # sends "verbosity noreply", with no level); a pipelining client reads
        # no stray error as the reply to its next command.
        client = self.text()
        key, text = self.key(), self.key("text")
        client.store(text, b"not a number")
        long_key = b"k" * 251
        self.assertNothingBefore(
            client,
            b"verbosity noreply\r\n",
            b"verbosity x noreply\r\n",
            b"verbosity 1 noreply\r\n",
            b"touch %s noreply\r\n" % key,
            b"touch %s x noreply\r\n" % key,
            b"touch %s 10 noreply\r\n" % long_key,
            b"flush_all x noreply\r\n",
            b"delete %s 1 noreply\r\n" % key,
            b"delete %s x noreply\r\n" % key,
            b"delete %s noreply\r\n" % long_key,
            b"incr %s noreply\r\n" % key,
            b"incr %s x noreply\r\n" % key,
            b"decr %s -1 noreply\r\n" % key,
            b"incr %s 1 noreply\r\n" % text,
            b"incr %s 1 noreply\r\n" % long_key,
        )
        # A storage command silenced so is not stored; its data line is then
        # read as a command (ERROR), as memcached does.
        for line in (
            b"set %s x 0 1 noreply" % key,
            b"set %s 0 x 1 noreply" % key,
            b"set %s 0 0 x noreply" % key,
            b"set %s 0 0 -1 noreply" % key,
            b"set %s 0 0 noreply" % key,
            b"cas %s 0 0 1 noreply" % key,
            b"cas %s 0 0 1 x noreply" % key,
            b"set %s 0 0 1 noreply" % long_key,
        ):
            self.assertEqual(client.ask(line + b"\r\nv\r\n"), b"ERROR\r\n", line)
        self.assertEqual(client.get(key), b"END\r\n")
        self.assertEqual(client.value_of(text), b"not a number")

    def test_noreply_is_the_last_field_of_a_command_with_the_right_count(self) -> None:
        # ... and only then (memcached 1.6.18's replies, byte for byte).
        client = self.text()
        key = self.key()
        for line, reply in (
            # too many or too few fields: ERROR, noreply or not
            (b"verbosity 1 2 noreply", b"ERROR\r\n"),
            (b"touch %s 10 x noreply" % key, b"ERROR\r\n"),
            (b"touch noreply", b"ERROR\r\n"),
            (b"flush_all 0 noreply x", b"ERROR\r\n"),
            (b"delete %s 0 noreply x" % key, b"ERROR\r\n"),
            # a last field that is not noreply: ignored, and answered
            (b"verbosity 1 2", b"OK\r\n"),
            (b"touch %s 10 x" % key, b"NOT_FOUND\r\n"),
            (b"incr %s 1 x" % key, b"NOT_FOUND\r\n"),
            (b"flush_all 0 x", b"OK\r\n"),
            # noreply where a number should be, and not last: that number's error
            (b"flush_all noreply x", b"CLIENT_ERROR invalid exptime argument\r\n"),
            (b"delete %s 0 x" % key, b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"),
            # "delete noreply" deletes the key "noreply"
            (b"delete noreply", b"NOT_FOUND\r\n"),
            # commands that take no noreply answer all the same
            (b"get %s noreply" % key, b"END\r\n"),
        ):
            self.assertEqual(client.ask(line + b"\r\n"), reply, line)
        self.assertNothingBefore(client, b"delete %s 0 noreply\r\n" % key, b"flush_all 0 noreply\r\n")

    def test_pipelining(self) -> None:
        client = self.text()
        keys = [self.key(str(n)) for n in range(100)]
        batch = [b"set %s 0 0 %d\r\n%d\r\n" % (key, len(b"%d" % n), n) for n, key in enumerate(keys)]
        batch += [b"get %s\r\n" % key for key in keys]
        batch += [b"incr %s 1000\r\n" % key for key in keys]
        batch += [b"delete %s\r\n" % key for key in keys[::2]]
        batch.append(b"get " + b" ".join(keys[:4]) + b"\r\n")
        client.send(b"".join(batch))
        for _ in keys:
            self.assertEqual(client.line(), b"STORED\r\n")
        for n, key in enumerate(keys):
            self.assertEqual(client.until(b"END\r\n"), b"VALUE %s 0 %d\r\n%d\r\nEND\r\n" % (key, len(b"%d" % n), n))
        for n in range(len(keys)):
            self.assertEqual(client.line(), b"%d\r\n" % (n + 1000))
        for _ in keys[::2]:
            self.assertEqual(client.line(), b"DELETED\r\n")
        self.assertEqual(
            client.until(b"END\r\n"),
            b"VALUE %s 0 4\r\n1001\r\nVALUE %s 0 4\r\n1003\r\nEND\r\n" % (keys[1], keys[3]),
        )

    def test_text_and_binary_on_one_connection(self) -> None:
        client = self.text()
        key = self.key()
        client.send(b"set %s 0 0 2\r\nhi\r\n" % key, request(GETK, key, opaque=9), b"version\r\n")
        self.assertEqual(client.line(), b"STORED\r\n")
        response = client.response()
        self.assertEqual(
            (response.opcode, response.status, response.opaque, response.key, response.value),
            (GETK, SUCCESS, 9, key, b"hi"),
        )
        self.assertTrue(client.line().startswith(b"VERSION "))


class PymemcacheTests(MemcacheTestCase):
    """pymemcache, a memcached client library, against the listener."""

    def test_commands(self) -> None:
        client = self.pymemcache(default_noreply=False)
        a, b, counter = self.key("a"), self.key("b"), self.key("counter")
        self.assertTrue(client.set(a, b"1"))
        self.assertEqual(client.set_many({b: b"2", counter: b"10"}), [])
        self.assertEqual(client.get(a), b"1")
        self.assertEqual(client.get_many([a, b, self.key("missing")]), {a: b"1", b: b"2"})
        self.assertFalse(client.add(a, b"x"))
        self.assertTrue(client.replace(a, b"3"))
        self.assertFalse(client.replace(self.key("missing"), b"x"))
        self.assertTrue(client.append(a, b"4"))
        self.assertTrue(client.prepend(a, b"2"))
        self.assertEqual(client.get(a), b"234")
        value, unique = client.gets(a)
        self.assertEqual(value, b"234")
        self.assertFalse(client.cas(a, b"x", int(unique) + 1))
        self.assertTrue(client.cas(a, b"5", unique))
        self.assertIsNone(client.cas(self.key("missing"), b"x", 1))
        self.assertEqual(client.incr(counter, 5), 15)
        self.assertEqual(client.decr(counter, 20), 0)
        self.assertIsNone(client.incr(self.key("missing"), 1))
        self.assertTrue(client.set(b, b"nan"))
        with self.assertRaises(pymemcache_errors.MemcacheClientError):
            client.incr(b, 1)
        self.assertTrue(client.touch(a, 100))
        self.assertFalse(client.touch(self.key("missing"), 100))
        self.assertTrue(client.delete(a))
        self.assertFalse(client.delete(a))
        self.assertIsNone(client.get(a))
        self.assertTrue(client.version())
        stats = client.stats()
        for name in (b"curr_items", b"bytes", b"get_hits", b"get_misses", b"evictions", b"locked_items"):
            self.assertIn(name, stats)
        self.assertTrue(client.flush_all())
        self.assertIsNone(client.get(b))

    def test_default_noreply_pipelines(self) -> None:
        # pymemcache's default: storage commands with noreply, not waited for.
        client = self.pymemcache()
        keys = [self.key(str(n)) for n in range(50)]
        for n, key in enumerate(keys):
            client.set(key, b"%d" % n)
        self.assertEqual(client.get_many(keys), {key: b"%d" % n for n, key in enumerate(keys)})

    def test_lock_with_raw_commands(self) -> None:
        owner, other = self.pymemcache(default_noreply=False), self.pymemcache(default_noreply=False)
        key = self.key()
        owner.set(key, b"mine")
        self.assertEqual(owner.raw_command(b"lock " + key), b"OK")
        self.assertEqual(other.raw_command(b"lock " + key), b"LOCKED")
        self.assertEqual(other.get(key), b"mine")
        # pymemcache knows no LOCKED reply: it raises (and drops its connection).
        with self.assertRaises(pymemcache_errors.MemcacheUnknownError) as raised:
            other.set(key, b"theirs")
        self.assertIn(b"LOCKED", raised.exception.args[0])
        self.assertTrue(owner.set(key, b"changed"))
        with self.assertRaises(pymemcache_errors.MemcacheClientError) as refused:
            other.raw_command(b"unlock " + key)
        self.assertEqual(refused.exception.args[0], b"object is not locked or not found")
        self.assertEqual(owner.raw_command(b"unlock " + key), b"OK")
        self.assertTrue(other.set(key, b"theirs"))
        self.assertEqual(owner.get(key), b"theirs")

    def test_keys_over_250_bytes_are_pymemcaches_error(self) -> None:
        client = self.pymemcache(default_noreply=False)
        with self.assertRaises(pymemcache_errors.MemcacheIllegalInputError):
            client.set(b"k" * 251, b"v")
        self.assertTrue(client.set(b"k" * 250, b"v"))
        self.assertEqual(client.get(b"k" * 250), b"v")
        self.assertTrue(client.delete(b"k" * 250))


# == the binary protocol ==================================================================


class BinaryCommandTests(MemcacheTestCase):
    """Every binary command, with their quiet and key variants."""

    def test_set_get_getk(self) -> None:
        client = self.binary()
        key = self.key()
        stored = client.call(SET, key, storage_extras(flags=7), b"value", opaque=1)
        self.assertEqual((stored.opcode, stored.status, stored.opaque), (SET, SUCCESS, 1))
        self.assertNotEqual(stored.cas, 0)
        got = client.call(GET, key, opaque=2)
        self.assertEqual(got, Response(GET, SUCCESS, 2, stored.cas, struct.pack(">I", 7), b"", b"value"))
        got = client.call(GETK, key, opaque=3)
        self.assertEqual(got, Response(GETK, SUCCESS, 3, stored.cas, struct.pack(">I", 7), key, b"value"))
        missing = client.call(GET, self.key("missing"), opaque=4)
        self.assertEqual((missing.status, missing.opaque, missing.value), (KEY_NOT_FOUND, 4, b"Not found"))
        missing = client.call(GETK, self.key("missing"), opaque=5)
        self.assertEqual((missing.status, missing.key), (KEY_NOT_FOUND, self.key("missing")))

    def test_getkq_pipelining_ended_by_noop(self) -> None:
        client = self.binary()
        keys = [self.key(str(n)) for n in range(10)]
        for n, key in enumerate(keys[::2]):
            client.set(key, b"%d" % n)
        responses = client.noop_after(*(request(GETKQ, key, opaque=n) for n, key in enumerate(keys)))
        self.assertEqual(
            [(r.opcode, r.key, r.opaque) for r in responses[:-1]],
            [(GETKQ, key, n * 2) for n, key in enumerate(keys[::2])],
        )
        self.assertEqual([r.value for r in responses[:-1]], [b"%d" % n for n in range(5)])
        # GetQ: hits only, without their keys
        responses = client.noop_after(request(GETQ, keys[1]), request(GETQ, keys[0], opaque=77))
        self.assertEqual(
            [(r.opcode, r.key, r.value, r.opaque) for r in responses], [(GETQ, b"", b"0", 77), (NOOP, b"", b"", 0xFEED)]
        )

    def test_add_replace_append_prepend(self) -> None:
        client = self.binary()
        key, missing = self.key(), self.key("missing")
        self.assertEqual(client.call(ADD, key, storage_extras(), b"1").status, SUCCESS)
        self.assertEqual(client.call(ADD, key, storage_extras(), b"x").status, KEY_EXISTS)
        self.assertEqual(client.call(REPLACE, key, storage_extras(flags=3), b"2").status, SUCCESS)
        self.assertEqual(client.call(REPLACE, missing, storage_extras(), b"x").status, KEY_NOT_FOUND)
        self.assertEqual(client.call(APPEND, key, value=b"3").status, SUCCESS)
        self.assertEqual(client.call(PREPEND, key, value=b"0").status, SUCCESS)
        self.assertEqual(client.call(APPEND, missing, value=b"x").status, ITEM_NOT_STORED)
        self.assertEqual(client.call(PREPEND, missing, value=b"x").status, ITEM_NOT_STORED)
        got = client.call(GET, key)
        self.assertEqual((got.extras, got.value), (struct.pack(">I", 3), b"023"))

    def test_cas(self) -> None:
        client = self.binary()
        key = self.key()
        unique = client.set(key, b"one").cas
        self.assertEqual(client.call(SET, key, storage_extras(), b"two", cas=unique + 1000).status, KEY_EXISTS)
        replaced = client.call(SET, key, storage_extras(), b"two", cas=unique)
        self.assertEqual(replaced.status, SUCCESS)
        self.assertNotEqual(replaced.cas, unique)
        self.assertEqual(client.call(REPLACE, key, storage_extras(), b"3", cas=unique).status, KEY_EXISTS)
        self.assertEqual(client.call(SET, self.key("missing"), storage_extras(), b"x", cas=5).status, KEY_NOT_FOUND)
        self.assertEqual(client.call(DELETE, key, cas=unique).status, KEY_EXISTS)
        self.assertEqual(client.call(DELETE, key, cas=replaced.cas).status, SUCCESS)
        self.assertEqual(client.call(DELETE, key).status, KEY_NOT_FOUND)

    def test_increment_decrement(self) -> None:
        client = self.binary()
        key, fresh = self.key(), self.key("fresh")
        client.set(key, b"10")
        reply = client.call(INCREMENT, key, delta_extras(5))
        self.assertEqual((reply.status, reply.value), (SUCCESS, struct.pack(">Q", 15)))
        reply = client.call(DECREMENT, key, delta_extras(100))
        self.assertEqual((reply.status, reply.value), (SUCCESS, struct.pack(">Q", 0)))
        client.set(key, b"18446744073709551615")
        self.assertEqual(client.call(INCREMENT, key, delta_extras(1)).value, struct.pack(">Q", 0))
        # A missing counter: not found, or created with the initial value.
        self.assertEqual(client.call(INCREMENT, fresh, delta_extras(1, 42)).status, KEY_NOT_FOUND)
        reply = client.call(INCREMENT, fresh, delta_extras(1, 42, exptime=0))
        self.assertEqual((reply.status, reply.value), (SUCCESS, struct.pack(">Q", 42)))
        self.assertEqual(client.call(GET, fresh).value, b"42")
        client.set(key, b"abc")
        reply = client.call(DECREMENT, key, delta_extras(1))
        self.assertEqual(reply.status, NON_NUMERIC)

    def test_increment_with_a_cas(self) -> None:
        # memcached and yrmcds: a CAS that does not match is Exists (0x0002), the counter unchanged.
        client = self.binary()
        key = self.key()
        unique = client.set(key, b"5").cas
        self.assertEqual(client.call(INCREMENT, key, delta_extras(1), cas=unique + 1000).status, KEY_EXISTS)
        self.assertEqual(client.call(GET, key).value, b"5")
        reply = client.call(INCREMENT, key, delta_extras(1), cas=unique)
        self.assertEqual((reply.status, reply.value), (SUCCESS, struct.pack(">Q", 6)))

    def test_touch_gat_gatk(self) -> None:
        client = self.binary()
        key, missing = self.key(), self.key("missing")
        unique = client.set(key, b"v", flags=2).cas
        self.assertEqual(client.call(TOUCH, key, exptime_extras(100)).status, SUCCESS)
        self.assertEqual(client.call(TOUCH, missing, exptime_extras(100)).status, KEY_NOT_FOUND)
        got = client.call(GAT, key, exptime_extras(100))
        self.assertEqual(
            (got.status, got.extras, got.key, got.value, got.cas), (SUCCESS, struct.pack(">I", 2), b"", b"v", unique)
        )
        got = client.call(GATK, key, exptime_extras(100))
        self.assertEqual((got.status, got.key, got.value), (SUCCESS, key, b"v"))
        self.assertEqual(client.call(GAT, missing, exptime_extras(100)).status, KEY_NOT_FOUND)
        responses = client.noop_after(
            request(GATQ, missing, exptime_extras(100)),
            request(GATKQ, missing, exptime_extras(100)),
            request(GATKQ, key, exptime_extras(-1)),
        )
        self.assertEqual([(r.opcode, r.key) for r in responses], [(GATKQ, key), (NOOP, b"")])
        # (that GAT gave it an expiration in the past)
        self.assertEqual(client.call(GET, key).status, KEY_NOT_FOUND)

    def test_touch_answers_the_flags(self) -> None:
        # memcached 1.6: a Touch's response carries the item's flags as its extras.
        client = self.binary()
        key = self.key()
        unique = client.set(key, b"v", flags=5).cas
        touched = client.call(TOUCH, key, exptime_extras(100))
        self.assertEqual((touched.status, touched.extras, touched.cas), (SUCCESS, struct.pack(">I", 5), unique))

    def test_quiet_variants_are_silent_only_on_success(self) -> None:
        client = self.binary()
        key, counter, missing = self.key(), self.key("counter"), self.key("missing")
        responses = client.noop_after(
            request(SETQ, key, storage_extras(), b"1"),
            request(SETQ, counter, storage_extras(), b"5"),
            request(ADDQ, key, storage_extras(), b"x", opaque=1),
            request(REPLACEQ, key, storage_extras(), b"2"),
            request(REPLACEQ, missing, storage_extras(), b"x", opaque=2),
            request(APPENDQ, key, value=b"3"),
            request(PREPENDQ, key, value=b"0"),
            request(APPENDQ, missing, value=b"x", opaque=3),
            request(INCREMENTQ, counter, delta_extras(2)),
            request(DECREMENTQ, counter, delta_extras(1)),
            request(INCREMENTQ, missing, delta_extras(1), opaque=4),
            request(DELETEQ, missing, opaque=5),
            request(SETQ, key, storage_extras(), b"x", cas=1, opaque=6),
        )
        self.assertEqual(
            [(r.opcode, r.status, r.opaque) for r in responses],
            [
                (ADDQ, KEY_EXISTS, 1),
                (REPLACEQ, KEY_NOT_FOUND, 2),
                (APPENDQ, ITEM_NOT_STORED, 3),
                (INCREMENTQ, KEY_NOT_FOUND, 4),
                (DELETEQ, KEY_NOT_FOUND, 5),
                (SETQ, KEY_EXISTS, 6),
                (NOOP, SUCCESS, 0xFEED),
            ],
        )
        self.assertEqual(client.call(GET, key).value, b"023")
        self.assertEqual(client.call(GET, counter).value, b"6")
        self.assertEqual([r.opcode for r in client.noop_after(request(DELETEQ, key))], [NOOP])
        self.assertEqual(client.call(GET, key).status, KEY_NOT_FOUND)

    def test_flush(self) -> None:
        client = self.binary()
        key = self.key()
        client.set(key, b"v")
        self.assertEqual(client.call(FLUSH, extras=exptime_extras(3600)).status, SUCCESS)
        self.assertEqual(client.call(GET, key).status, SUCCESS)
        self.assertEqual(client.call(FLUSH).status, SUCCESS)
        self.assertEqual(client.call(GET, key).status, KEY_NOT_FOUND)
        client.set(key, b"v")
        self.assertEqual([r.opcode for r in client.noop_after(request(FLUSHQ))], [NOOP])
        self.assertEqual(client.call(GET, key).status, KEY_NOT_FOUND)

    def test_noop_version_verbosity_stat(self) -> None:
        client = self.binary()
        self.assertEqual(client.call(NOOP, opaque=3), Response(NOOP, SUCCESS, 3, 0, b"", b"", b""))
        version = client.call(VERSION)
        self.assertEqual(version.status, SUCCESS)
        self.assertTrue(version.value)
        self.assertEqual(client.call(VERBOSITY, extras=struct.pack(">I", 1)).status, SUCCESS)
        client.send(request(STAT, opaque=8))
        stats = {}
        while True:
            response = client.read()
            self.assertEqual((response.opcode, response.status, response.opaque), (STAT, SUCCESS, 8))
            if not response.key:
                break
            stats[response.key] = response.value
        for name in (
            b"curr_items",
            b"bytes",
            b"get_hits",
            b"get_misses",
            b"evictions",
            b"locked_items",
            b"curr_connections",
        ):
            self.assertIn(name, stats)
        self.assertEqual(client.call(STAT, b"no-such-group").status, KEY_NOT_FOUND)

    def test_sasl_mechanisms_without_auth(self) -> None:
        client = self.binary()
        self.assertEqual(client.call(SASL_LIST_MECHS).value, b"PLAIN")

    def test_quit(self) -> None:
        client = self.binary()
        self.assertEqual(client.call(QUIT, opaque=4), Response(QUIT, SUCCESS, 4, 0, b"", b"", b""))
        self.assertEqual(client.read_to_close(), b"")
        quiet = self.binary()
        quiet.send(request(QUITQ))
        self.assertEqual(quiet.read_to_close(), b"")


# == yrmcds's locks ====================================================================


class TextLockTests(MemcacheTestCase):
    """lock, unlock, unlock_all between two text clients."""

    def test_lock_unlock(self) -> None:
        owner, other = self.text(), self.text()
        key = self.key()
        self.assertEqual(owner.ask(b"lock %s\r\n" % self.key("missing")), b"NOT_FOUND\r\n")
        owner.store(key, b"v")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        # Anyone's lock of a locked object, the owner's too, answers LOCKED.
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"LOCKED\r\n")
        self.assertEqual(other.ask(b"lock %s\r\n" % key), b"LOCKED\r\n")
        unlocked = b"CLIENT_ERROR object is not locked or not found\r\n"
        self.assertEqual(other.ask(b"unlock %s\r\n" % key), unlocked)
        self.assertEqual(other.ask(b"unlock %s\r\n" % self.key("missing")), unlocked)
        self.assertEqual(owner.ask(b"unlock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(owner.ask(b"unlock %s\r\n" % key), unlocked)
        self.assertEqual(other.ask(b"lock %s\r\n" % key), b"OK\r\n")

    def test_other_clients_writes_are_refused(self) -> None:
        owner, other = self.text(), self.text()
        key = self.key()
        owner.store(key, b"5")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertLockedAgainst(other, key)
        # Reads and touch still work.
        self.assertEqual(other.get(key), b"VALUE %s 0 1\r\n5\r\nEND\r\n" % key)
        self.assertEqual(other.ask(b"touch %s 100\r\n" % key), b"TOUCHED\r\n")
        self.assertEqual(other.ask_until(b"gat 100 %s\r\n" % key), b"VALUE %s 0 1\r\n5\r\nEND\r\n" % key)
        # A noreply write is refused silently.
        self.assertNothingBefore(other, b"set %s 0 0 1 noreply\r\n9\r\n" % key)
        self.assertEqual(other.value_of(key), b"5")
        # Another client's unlock_all is no unlock of this one (its arguments are ignored, as yrmcds's).
        self.assertEqual(other.ask(b"unlock_all\r\n"), b"OK\r\n")
        self.assertEqual(other.ask(b"unlock_all %s\r\n" % key), b"OK\r\n")
        self.assertEqual(other.store(key, b"9"), b"LOCKED\r\n")

    def test_owners_writes_succeed(self) -> None:
        owner, other = self.text(), self.text()
        key = self.key()
        owner.store(key, b"5")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(owner.store(key, b"6"), b"STORED\r\n")
        self.assertEqual(owner.store(key, b"0", command=b"append"), b"STORED\r\n")
        self.assertEqual(owner.store(key, b"1", command=b"prepend"), b"STORED\r\n")
        self.assertEqual(owner.store(key, b"x", command=b"add"), b"NOT_STORED\r\n")
        self.assertEqual(owner.ask(b"incr %s 1\r\n" % key), b"161\r\n")
        self.assertEqual(owner.ask(b"decr %s 61\r\n" % key), b"100\r\n")
        unique = int(owner.ask_until(b"gets %s\r\n" % key).split()[4])
        self.assertEqual(owner.ask(b"cas %s 0 0 1 %d\r\n7\r\n" % (key, unique)), b"STORED\r\n")
        self.assertEqual(owner.store(key, b"8", command=b"replace"), b"STORED\r\n")
        # still locked for the other client
        self.assertEqual(other.store(key, b"x"), b"LOCKED\r\n")
        self.assertEqual(other.value_of(key), b"8")

    def test_owner_delete_drops_the_lock(self) -> None:
        owner, other = self.text(), self.text()
        key = self.key()
        owner.store(key, b"v")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(owner.ask(b"delete %s\r\n" % key), b"DELETED\r\n")
        self.assertEqual(other.store(key, b"w"), b"STORED\r\n")
        self.assertEqual(other.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(owner.store(key, b"x"), b"LOCKED\r\n")

    def test_unlock_all(self) -> None:
        owner, other = self.text(), self.text()
        keys = [self.key(str(n)) for n in range(3)]
        for key in keys:
            owner.store(key, b"v")
            self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(owner.ask(b"unlock_all\r\n"), b"OK\r\n")
        for key in keys:
            self.assertEqual(other.ask(b"lock %s\r\n" % key), b"OK\r\n")

    def test_disconnect_releases_every_lock(self) -> None:
        owner, other = self.text(), self.text()
        keys = [self.key(str(n)) for n in range(3)]
        for key in keys:
            owner.store(key, b"v")
            self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
            self.assertEqual(other.ask(b"lock %s\r\n" % key), b"LOCKED\r\n")
        owner.close()
        eventually(lambda: other.ask(b"lock %s\r\n" % keys[0]) == b"OK\r\n", "the lock released by the disconnect")
        for key in keys[1:]:
            self.assertEqual(other.ask(b"lock %s\r\n" % key), b"OK\r\n")

    def test_a_locked_object_does_not_expire(self) -> None:
        owner, other = self.text(), self.text()
        key = self.key()
        owner.store(key, b"v")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(other.ask(b"touch %s -1\r\n" % key), b"TOUCHED\r\n")
        self.assertEqual(other.value_of(key), b"v")
        self.assertEqual(owner.value_of(key), b"v")
        self.assertEqual(owner.ask(b"unlock %s\r\n" % key), b"OK\r\n")
        # once unlocked, its (past) expiration time counts
        self.assertEqual(other.get(key), b"END\r\n")

    def test_a_locked_object_survives_flush_all_until_unlocked(self) -> None:
        owner, other = self.text(), self.text()
        key, unlocked = self.key(), self.key("unlocked")
        owner.store(key, b"v")
        owner.store(unlocked, b"v")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(other.ask(b"flush_all\r\n"), b"OK\r\n")
        self.assertEqual(other.get(key, unlocked), b"VALUE %s 0 1\r\nv\r\nEND\r\n" % key)
        self.assertEqual(other.store(key, b"x"), b"LOCKED\r\n")
        # yrmcds: the flushed object goes once it is unlocked
        self.assertEqual(owner.ask(b"unlock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(other.get(key), b"END\r\n")

    def test_an_object_stored_after_the_flush_stays(self) -> None:
        # (docs/protocols/memcached.md: unlike yrmcds, only the object that was there at the flush goes at the unlock)
        owner, other = self.text(), self.text()
        key = self.key()
        owner.store(key, b"old")
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(other.ask(b"flush_all\r\n"), b"OK\r\n")
        self.assertEqual(owner.store(key, b"new"), b"STORED\r\n")
        self.assertEqual(owner.ask(b"unlock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(other.value_of(key), b"new")

    def test_arguments(self) -> None:
        client = self.text()
        key = self.key()
        client.store(key, b"v")
        # yrmcds: ERROR for a lock or unlock with no key or more than one
        # argument (no noreply either); unlock_all takes no arguments.
        for line in (b"lock", b"lock %s %s" % (key, key), b"lock %s noreply" % key, b"unlock", b"unlock %s x" % key):
            self.assertEqual(client.ask(line + b"\r\n"), b"ERROR\r\n", line)
        # (this listener's keys are memcached's: at most 250 bytes)
        self.assertEqual(client.ask(b"lock %s\r\n" % (b"k" * 251)), b"CLIENT_ERROR bad command line format\r\n")
        self.assertEqual(client.ask(b"lock %s\r\n" % key), b"OK\r\n")


class BinaryLockTests(MemcacheTestCase):
    """Lock 0x40 ... RaUQ 0x4b between two binary clients."""

    def test_lock_unlock(self) -> None:
        owner, other = self.binary(), self.binary()
        key, missing = self.key(), self.key("missing")
        owner.set(key, b"v")
        self.assertEqual(owner.call(LOCK, missing).status, KEY_NOT_FOUND)
        self.assertEqual(owner.call(LOCK, key, opaque=1), Response(LOCK, SUCCESS, 1, 0, b"", b"", b""))
        self.assertEqual(owner.call(LOCK, key).status, LOCKED)
        self.assertEqual(other.call(LOCK, key).status, LOCKED)
        self.assertEqual(other.call(UNLOCK, key).status, NOT_LOCKED)
        self.assertEqual(other.call(UNLOCK, missing).status, KEY_NOT_FOUND)
        self.assertEqual(owner.call(UNLOCK, key).status, SUCCESS)
        self.assertEqual(owner.call(UNLOCK, key).status, NOT_LOCKED)
        # Quiet: silent on success only.
        responses = other.noop_after(
            request(LOCKQ, key), request(LOCKQ, key, opaque=1), request(UNLOCKQ, key), request(UNLOCKQ, key, opaque=2)
        )
        self.assertEqual(
            [(r.opcode, r.status, r.opaque) for r in responses],
            [(LOCKQ, LOCKED, 1), (UNLOCKQ, NOT_LOCKED, 2), (NOOP, SUCCESS, 0xFEED)],
        )

    def test_other_clients_writes_are_refused(self) -> None:
        owner, other = self.binary(), self.binary()
        key = self.key()
        unique = owner.set(key, b"5", flags=1).cas
        self.assertEqual(owner.call(LOCK, key).status, SUCCESS)
        refused = [
            request(SET, key, storage_extras(), b"x", opaque=SET),
            request(ADD, key, storage_extras(), b"x", opaque=ADD),
            request(REPLACE, key, storage_extras(), b"x", opaque=REPLACE),
            request(APPEND, key, value=b"x", opaque=APPEND),
            request(PREPEND, key, value=b"x", opaque=PREPEND),
            request(SET, key, storage_extras(), b"x", cas=unique, opaque=0x100),
            request(INCREMENT, key, delta_extras(1), opaque=INCREMENT),
            request(DECREMENT, key, delta_extras(1), opaque=DECREMENT),
            request(DELETE, key, opaque=DELETE),
            request(SETQ, key, storage_extras(), b"x", opaque=SETQ),
            request(DELETEQ, key, opaque=DELETEQ),
            request(INCREMENTQ, key, delta_extras(1), opaque=INCREMENTQ),
        ]
        responses = other.noop_after(*refused)
        self.assertEqual(
            [(r.status, r.opaque) for r in responses[:-1]],
            [(LOCKED, HEADER.unpack_from(packet)[7]) for packet in refused],
        )
        self.assertEqual(responses[0].value, b"Locked")
        self.assertEqual(other.call(TOUCH, key, exptime_extras(100)).status, SUCCESS)
        got = other.call(GET, key)
        self.assertEqual((got.status, got.value, got.extras), (SUCCESS, b"5", struct.pack(">I", 1)))
        self.assertEqual(other.call(GAT, key, exptime_extras(100)).value, b"5")
        self.assertEqual(owner.call(SET, key, storage_extras(), b"6").status, SUCCESS)
        self.assertEqual(owner.call(INCREMENT, key, delta_extras(1)).value, struct.pack(">Q", 7))

    def test_unlock_all(self) -> None:
        owner, other = self.binary(), self.binary()
        keys = [self.key(str(n)) for n in range(3)]
        for key in keys:
            owner.set(key, b"v")
            self.assertEqual(owner.call(LOCK, key).status, SUCCESS)
        self.assertEqual(owner.call(UNLOCK_ALL, opaque=5), Response(UNLOCK_ALL, SUCCESS, 5, 0, b"", b"", b""))
        for key in keys:
            self.assertEqual(other.call(LOCK, key).status, SUCCESS)
        self.assertEqual([r.opcode for r in other.noop_after(request(UNLOCK_ALLQ))], [NOOP])
        # (a key or extras are ignored, as yrmcds does)
        self.assertEqual(owner.call(UNLOCK_ALL, keys[0], exptime_extras(1)).status, SUCCESS)
        self.assertEqual(owner.call(LOCK, keys[0]).status, SUCCESS)

    def test_lock_and_get(self) -> None:
        owner, other = self.binary(), self.binary()
        key = self.key()
        unique = owner.set(key, b"value", flags=9).cas
        got = owner.call(LAG, key, opaque=3)
        self.assertEqual(got, Response(LAG, SUCCESS, 3, unique, struct.pack(">I", 9), b"", b"value"))
        # LaG of a locked object answers Locked, whoever holds it.
        self.assertEqual(owner.call(LAG, key).status, LOCKED)
        self.assertEqual(other.call(LAG, key).status, LOCKED)
        self.assertEqual(other.call(LAGK, key).status, LOCKED)
        self.assertEqual(other.call(SET, key, storage_extras(), b"x").status, LOCKED)
        self.assertEqual(owner.call(UNLOCK, key).status, SUCCESS)
        got = other.call(LAGK, key)
        self.assertEqual((got.status, got.key, got.value, got.extras), (SUCCESS, key, b"value", struct.pack(">I", 9)))
        self.assertEqual(owner.call(SET, key, storage_extras(), b"x").status, LOCKED)

    def test_quiet_lock_and_get(self) -> None:
        client = self.binary()
        key, missing = self.key(), self.key("missing")
        client.set(key, b"v")
        responses = client.noop_after(request(LAGKQ, missing, opaque=1), request(LAGQ, missing, opaque=2))
        # LaGKQ of a missing key sends nothing, LaGQ answers Not found.
        self.assertEqual(
            [(r.opcode, r.status, r.opaque) for r in responses], [(LAGQ, KEY_NOT_FOUND, 2), (NOOP, SUCCESS, 0xFEED)]
        )
        self.assertEqual([r.opcode for r in client.noop_after(request(LAGKQ, missing))], [NOOP])
        self.assertEqual(client.call(LAG, missing).status, KEY_NOT_FOUND)
        self.assertEqual(client.call(LAGK, missing).status, KEY_NOT_FOUND)
        # A hit is answered, quiet or not; a locked one answers Locked.
        responses = client.noop_after(request(LAGKQ, key, opaque=3), request(LAGQ, key, opaque=4))
        self.assertEqual(
            [(r.opcode, r.status, r.key, r.value, r.opaque) for r in responses],
            [(LAGKQ, SUCCESS, key, b"v", 3), (LAGQ, LOCKED, b"", b"Locked", 4), (NOOP, SUCCESS, b"", b"", 0xFEED)],
        )

    def test_lock_and_get_with_an_expiration(self) -> None:
        client = self.binary()
        renewed, kept = self.key("renewed"), self.key("kept")
        client.set(renewed, b"v")
        client.set(kept, b"v")
        # An absolute time in 1970: expired once unlocked.
        got = client.call(LAG, renewed, exptime_extras(30 * 24 * 3600 + 1))
        self.assertEqual((got.status, got.value), (SUCCESS, b"v"))
        self.assertEqual(client.call(LAG, kept).status, SUCCESS)
        # (locked: not expired yet)
        self.assertEqual(client.call(GET, renewed).status, SUCCESS)
        self.assertEqual(client.call(UNLOCK_ALL).status, SUCCESS)
        self.assertEqual(client.call(GET, renewed).status, KEY_NOT_FOUND)
        self.assertEqual(client.call(GET, kept).status, SUCCESS)

    def test_replace_and_unlock(self) -> None:
        owner, other = self.binary(), self.binary()
        key = self.key()
        owner.set(key, b"old")
        self.assertEqual(owner.call(LAG, key).value, b"old")
        self.assertEqual(other.call(RAU, key, storage_extras(), b"theirs").status, NOT_LOCKED)
        replaced = owner.call(RAU, key, storage_extras(flags=4), b"new", opaque=6)
        self.assertEqual((replaced.opcode, replaced.status, replaced.opaque), (RAU, SUCCESS, 6))
        self.assertNotEqual(replaced.cas, 0)
        # replaced and unlocked at once: another client locks and reads the new value
        got = other.call(LAG, key)
        self.assertEqual(
            (got.status, got.value, got.extras, got.cas), (SUCCESS, b"new", struct.pack(">I", 4), replaced.cas)
        )
        self.assertEqual(owner.call(RAU, key, storage_extras(), b"x").status, NOT_LOCKED)
        # a CAS that does not match: Exists, and the lock stays
        self.assertEqual(other.call(RAU, key, storage_extras(), b"x", cas=replaced.cas + 1000).status, KEY_EXISTS)
        self.assertEqual(owner.call(LOCK, key).status, LOCKED)
        # RaUQ: silent on success, answered otherwise.
        responses = other.noop_after(
            request(RAUQ, key, storage_extras(), b"quiet"), request(RAUQ, key, storage_extras(), b"x", opaque=7)
        )
        self.assertEqual(
            [(r.opcode, r.status, r.opaque) for r in responses], [(RAUQ, NOT_LOCKED, 7), (NOOP, SUCCESS, 0xFEED)]
        )
        self.assertEqual(owner.call(GET, key).value, b"quiet")
        self.assertEqual(owner.call(LOCK, key).status, SUCCESS)

    def test_replace_and_unlock_of_a_missing_object(self) -> None:
        # yrmcds 1.1.9 answers Not found (0x0001) for a RaU of a missing object.
        client = self.binary()
        self.assertEqual(client.call(RAU, self.key("missing"), storage_extras(), b"v").status, KEY_NOT_FOUND)

    def test_owner_delete_drops_the_lock(self) -> None:
        owner, other = self.binary(), self.binary()
        key = self.key()
        owner.set(key, b"v")
        self.assertEqual(owner.call(LOCK, key).status, SUCCESS)
        self.assertEqual(owner.call(DELETE, key).status, SUCCESS)
        self.assertEqual(other.set(key, b"w").status, SUCCESS)
        self.assertEqual(other.call(LOCK, key).status, SUCCESS)

    def test_disconnect_releases_every_lock(self) -> None:
        owner, other = self.binary(), self.binary()
        keys = [self.key(str(n)) for n in range(3)]
        for key in keys:
            owner.set(key, b"v")
            self.assertEqual(owner.call(LAG, key).status, SUCCESS)
        owner.close()
        eventually(lambda: other.call(LOCK, keys[0]).status == SUCCESS, "the lock released by the disconnect")
        for key in keys[1:]:
            self.assertEqual(other.call(LOCK, key).status, SUCCESS)

    def test_text_and_binary_clients_share_the_locks(self) -> None:
        binary, text = self.binary(), self.text()
        key = self.key()
        binary.set(key, b"v")
        self.assertEqual(binary.call(LOCK, key).status, SUCCESS)
        self.assertEqual(text.ask(b"lock %s\r\n" % key), b"LOCKED\r\n")
        self.assertLockedAgainst(text, key)
        self.assertEqual(binary.call(UNLOCK, key).status, SUCCESS)
        self.assertEqual(text.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(binary.call(LAG, key).status, LOCKED)
        self.assertEqual(binary.call(SET, key, storage_extras(), b"x").status, LOCKED)

    def test_malformed_lock_requests(self) -> None:
        client = self.binary()
        key = self.key()
        client.set(key, b"v")
        self.assertEqual(client.call(LOCK, key, extras=b"xxxx").status, INVALID_ARGUMENTS)
        self.assertEqual(client.call(LOCK).status, INVALID_ARGUMENTS)
        self.assertEqual(client.call(LAG, key, extras=b"xx").status, INVALID_ARGUMENTS)
        self.assertEqual(client.call(RAU, key, value=b"v").status, INVALID_ARGUMENTS)
        self.assertEqual(client.call(LOCK, key).status, SUCCESS)


# == across protocols ==================================================================


# == yrmcds's Keys ==================================================================


def keys_response(key: bytes, opaque: int) -> bytes:
    """One response of a binary Keys reply, as yrmcds 1.1.9 sends it (a key only; no key: the last)."""
    return HEADER.pack(RESPONSE_MAGIC, KEYS, len(key), 0, 0, SUCCESS, len(key), opaque, 0) + key


class KeysTests(MemcacheTestCase):
    """
    yrmcds's C{Keys} (text C{keys [prefix]}, binary 0x50): the keys of the
    store's objects that start with a prefix, from a snapshot taken at once,
    streamed.  The replies' bytes are those yrmcds 1.1.9 sends (probed).
    """

    kind = "listing"

    def setUp(self) -> None:
        super().setUp()
        self.assertEqual(self.text().ask(b"flush_all\r\n"), b"OK\r\n")

    def listed(self, client: TextClient, command: bytes) -> List[bytes]:
        """The keys a text C{keys} command lists, in the order sent."""
        reply = client.ask_until(command + b"\r\n")
        lines = reply.split(b"\r\n")
        self.assertEqual(lines[-2:], [b"END", b""])
        self.assertTrue(all(line.startswith(b"VALUE ") for line in lines[:-2]), reply[:200])
        return [line[len(b"VALUE ") :] for line in lines[:-2]]

    def test_text_keys(self) -> None:
        client = self.text()
        self.assertEqual(client.ask(b"keys\r\n"), b"END\r\n")
        for key in (b"apple", b"apricot", b"banana"):
            client.store(key, b"v", flags=5)
        # a lock-table key with no object is not listed; a locked object is
        self.assertEqual(self.jesync().ask(b"lock only-a-lock 1 0\n"), b"GRANTED 1 0 only-a-lock 120\n")
        self.assertEqual(client.ask(b"lock banana\r\n"), b"OK\r\n")
        self.assertIn(
            client.ask(b"keys ap\r\n", 3),
            (b"VALUE apple\r\nVALUE apricot\r\nEND\r\n", b"VALUE apricot\r\nVALUE apple\r\nEND\r\n"),
        )
        self.assertEqual(sorted(self.listed(client, b"keys")), [b"apple", b"apricot", b"banana"])
        self.assertEqual(self.listed(client, b"keys apple"), [b"apple"])
        self.assertEqual(self.listed(client, b"keys zz"), [])
        # (what follows the prefix is ignored, as yrmcds does; and noreply is a prefix)
        self.assertEqual(self.listed(client, b"keys  ban  extra"), [b"banana"])
        self.assertEqual(self.listed(client, b"keys noreply"), [])

    def test_binary_keys(self) -> None:
        text, client = self.text(), self.binary()
        for key in (b"apple", b"apricot", b"banana"):
            text.store(key, b"v", flags=5)
        # (in no particular order, as yrmcds's)
        client.send(request(KEYS, b"ap", opaque=0x1234, cas=5))
        apple, apricot = keys_response(b"apple", 0x1234), keys_response(b"apricot", 0x1234)
        self.assertIn(
            client.exactly(len(apple) + len(apricot) + 24),
            (apple + apricot + keys_response(b"", 0x1234), apricot + apple + keys_response(b"", 0x1234)),
        )
        client.send(request(KEYS, opaque=7))
        listed = []
        while True:
            response = client.read()
            self.assertEqual(
                (response.opcode, response.status, response.opaque, response.extras, response.value),
                (KEYS, SUCCESS, 7, b"", b""),
            )
            if not response.key:
                break
            listed.append(response.key)
        self.assertEqual(sorted(listed), [b"apple", b"apricot", b"banana"])
        client.send(request(KEYS, b"zz", opaque=8))
        self.assertEqual(client.exactly(24), keys_response(b"", 8))
        # extras, a value or a key over 250 bytes: an invalid request, and the connection goes on
        for packet in (
            request(KEYS, b"ap", extras=b"\0\0\0\0", opaque=9),
            request(KEYS, b"ap", value=b"v", opaque=10),
            request(KEYS, b"a" * 251, opaque=11),
        ):
            client.send(packet)
            reply = client.read()
            self.assertEqual(
                (reply.opcode, reply.status, reply.opaque), (KEYS, INVALID_ARGUMENTS, HEADER.unpack_from(packet)[7])
            )
        self.assertEqual(client.call(NOOP, opaque=12).opaque, 12)

    def test_expired_objects_are_not_listed(self) -> None:
        client = self.text()
        client.store(b"live", b"v")
        client.store(b"gone-now", b"v", exptime=-1)  # (stored, and expired at once)
        client.store(b"gone-long-ago", b"v", exptime=1_000_000_000)  # (an absolute time in the past)
        client.store(b"touched-away", b"v")
        self.assertEqual(client.ask(b"touch touched-away -1\r\n"), b"TOUCHED\r\n")
        # locked, then its time ran out: live until it is unlocked, as a get sees it
        client.store(b"locked", b"v")
        self.assertEqual(client.ask(b"lock locked\r\n"), b"OK\r\n")
        self.assertEqual(client.ask(b"touch locked -1\r\n"), b"TOUCHED\r\n")
        self.assertEqual(sorted(self.listed(client, b"keys")), [b"live", b"locked"])
        self.assertEqual(client.ask(b"unlock locked\r\n"), b"OK\r\n")
        self.assertEqual(self.listed(client, b"keys"), [b"live"])

    def test_a_large_listing_is_streamed_and_a_reader_that_stops_holds_up_no_one(self) -> None:
        # 40,000 keys of 200 bytes: an 8 MB listing, more than the socket
        # buffers hold, so the server must wait for the reader to take it.
        writer = self.text()
        keys = [b"big.%06d." % n + b"x" * 189 for n in range(40_000)]
        writer.send(b"".join(b"set %s 0 0 1 noreply\r\nv\r\n" % key for key in keys))
        self.assertTrue(writer.version_line().startswith(b"VERSION "))
        reader = self.text(receive_buffer=65536)
        reader.send(b"keys big.\r\n")
        first = reader.line()  # (the listing has begun: its snapshot is taken)
        self.assertTrue(first.startswith(b"VALUE big."), first)
        # While the reader reads nothing more, everyone else is served at once,
        # and what they change is not in the listing already taken.
        other = self.text()
        self.assertEqual(other.ask(b"delete %s\r\n" % keys[-1]), b"DELETED\r\n")
        self.assertEqual(other.store(b"big.after", b"v"), b"STORED\r\n")
        self.assertEqual(other.value_of(keys[0]), b"v")
        self.assertEqual(sorted(self.listed(other, b"keys big.00000")), keys[:10])
        binary = self.binary()
        self.assertEqual(binary.call(GET, keys[1]).value, b"v")
        # The reader then gets the whole listing, as it was when asked for.
        rest = reader.until(b"END\r\n")
        listed = [first[len(b"VALUE ") : -2]] + [line[len(b"VALUE ") :] for line in rest.split(b"\r\n")[:-2]]
        self.assertEqual(sorted(listed), keys)
        self.assertEqual(self.listed(reader, b"keys big.after"), [b"big.after"])


class CrossProtocolTests(MemcacheTestCase):
    """One lock table: JESync's locks are the objects' locks."""

    def test_a_jesync_lock_locks_the_object(self) -> None:
        jesync, owner, other = self.jesync(), self.text(), self.text()
        key, missing = self.key(), self.key("missing")
        owner.store(key, b"v")
        self.assertEqual(jesync.ask(b"lock %s 1 0\n" % key), b"GRANTED 1 0 %s 120\n" % key)
        self.assertEqual(jesync.ask(b"lock %s 1 0\n" % missing), b"GRANTED 1 0 %s 120\n" % missing)
        self.assertEqual(owner.ask(b"lock %s\r\n" % key), b"LOCKED\r\n")
        self.assertLockedAgainst(owner, key)
        self.assertLockedAgainst(other, missing)
        self.assertEqual(owner.get(missing), b"END\r\n")
        self.assertEqual(other.get(key), b"VALUE %s 0 1\r\nv\r\nEND\r\n" % key)
        binary = self.binary()
        self.assertEqual(binary.call(LOCK, key).status, LOCKED)
        self.assertEqual(binary.call(ADD, missing, storage_extras(), b"x").status, LOCKED)
        # neither expired nor flushed while held
        self.assertEqual(other.ask(b"touch %s -1\r\n" % key), b"TOUCHED\r\n")
        self.assertEqual(other.ask(b"flush_all\r\n"), b"OK\r\n")
        self.assertEqual(other.value_of(key), b"v")
        self.assertEqual(jesync.ask(b"release %s\n" % missing), b"RELEASED 0 0 %s\n" % missing)
        self.assertEqual(other.store(missing, b"x", command=b"add"), b"STORED\r\n")
        self.assertEqual(jesync.ask(b"release %s\n" % key), b"RELEASED 0 0 %s\n" % key)
        self.assertEqual(other.get(key), b"END\r\n")

    def test_a_memcached_lock_is_a_jesync_grant(self) -> None:
        jesync, text, binary = self.jesync(), self.text(), self.binary()
        key, other_key = self.key(), self.key("binary")
        text.store(key, b"v")
        text.store(other_key, b"v")
        self.assertEqual(text.ask(b"lock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(binary.call(LAG, other_key).status, SUCCESS)
        self.assertEqual(jesync.ask(b"status %s\n" % key), b"STATUS 1 0 %s\n" % key)
        self.assertEqual(jesync.ask(b"status %s\n" % other_key), b"STATUS 1 0 %s\n" % other_key)
        self.assertEqual(jesync.ask(b"lock %s 1 0\n" % key), b"TIMEOUT 1 0 %s\n" % key)
        self.assertEqual(jesync.ask(b"lock %s 1 0\n" % other_key), b"TIMEOUT 1 0 %s\n" % other_key)
        self.assertEqual(jesync.ask(b"release %s\n" % key), b"NOT_RELEASED 1 0 %s\n" % key)
        self.assertEqual(text.ask(b"unlock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(jesync.ask(b"status %s\n" % key), b"STATUS 0 0 %s\n" % key)
        self.assertEqual(jesync.ask(b"lock %s 1 0\n" % key), b"GRANTED 1 0 %s 120\n" % key)
        binary.close()
        eventually(
            lambda: jesync.ask(b"lock %s 1 0\n" % other_key) == b"GRANTED 1 0 %s 120\n" % other_key,
            "the binary client's lock released by its disconnect",
        )

    def test_a_jesync_waiter_is_granted_on_unlock(self) -> None:
        jesync, text = self.jesync(), self.text()
        key = self.key()
        text.store(key, b"v")
        self.assertEqual(text.ask(b"lock %s\r\n" % key), b"OK\r\n")
        jesync.send(b"lock %s 1 5000\n" % key)
        watcher = self.jesync()
        eventually(lambda: watcher.ask(b"status %s\n" % key) == b"STATUS 1 1 %s\n" % key, "the JESync wait")
        self.assertEqual(text.ask(b"unlock %s\r\n" % key), b"OK\r\n")
        self.assertEqual(jesync.line(), b"GRANTED 1 0 %s 120\n" % key)
        self.assertEqual(text.store(key, b"x"), b"LOCKED\r\n")


# == malformed and oversized requests =======================================================


class MalformedRequestTests(MemcacheTestCase):
    """Clear errors; the connection goes on (or closes, for a line too long); nothing of anyone else's is lost."""

    kind = "small"

    def setUp(self) -> None:
        super().setUp()
        # A bystander with an object and a lock on it.
        self.bystander = self.text()
        self.held, self.kept = self.key("held"), self.key("kept")
        self.bystander.store(self.held, b"held")
        self.bystander.store(self.kept, b"kept")
        self.assertEqual(self.bystander.ask(b"lock %s\r\n" % self.held), b"OK\r\n")

    def assertBystanderUntouched(self) -> None:
        check = self.text()
        self.assertEqual(
            check.get(self.held, self.kept),
            b"VALUE %s 0 4\r\nheld\r\nVALUE %s 0 4\r\nkept\r\nEND\r\n" % (self.held, self.kept),
        )
        self.assertEqual(check.store(self.held, b"x"), b"LOCKED\r\n")
        self.assertEqual(self.bystander.store(self.held, b"held"), b"STORED\r\n")
        self.assertServing()

    def test_text_value_too_large(self) -> None:
        client = self.text()
        key = self.key()
        self.assertEqual(client.store(key, b"x" * 1024), b"STORED\r\n")
        self.assertEqual(client.store(key, b"y" * 1025), b"SERVER_ERROR object too large for cache\r\n")
        # far too large (more than a frame): the data is skipped all the same
        self.assertEqual(client.store(key, b"y" * 100_000), b"SERVER_ERROR object too large for cache\r\n")
        self.assertEqual(client.value_of(key), b"x" * 1024)
        self.assertBystanderUntouched()

    def test_append_past_the_largest_item(self) -> None:
        # memcached: NOT_STORED (text), Not stored 0x0005 (binary).
        client, binary = self.text(), self.binary()
        key = self.key()
        client.store(key, b"x" * 1000)
        self.assertEqual(client.store(key, b"y" * 100, command=b"append"), b"NOT_STORED\r\n")
        self.assertEqual(binary.call(APPEND, key, value=b"y" * 100).status, ITEM_NOT_STORED)
        self.assertEqual(client.value_of(key), b"x" * 1000)

    def test_too_large_with_noreply_is_silent(self) -> None:
        # memcached: noreply silences the error; the data is skipped.
        client = self.text()
        self.assertNothingBefore(client, b"set %s 0 0 2000 noreply\r\n%s\r\n" % (self.key(), b"y" * 2000))

    def test_binary_value_too_large(self) -> None:
        client = self.binary()
        key = self.key()
        self.assertEqual(client.set(key, b"x" * 1024).status, SUCCESS)
        too_large = client.call(SET, key, storage_extras(), b"y" * 1025, opaque=1)
        self.assertEqual((too_large.opcode, too_large.status, too_large.opaque), (SET, VALUE_TOO_LARGE, 1))
        # more than a frame: its body is skipped, the next request read
        responses = client.noop_after(request(SET, key, storage_extras(), b"y" * 100_000, opaque=2))
        self.assertEqual(
            [(r.opcode, r.status, r.opaque) for r in responses], [(SET, VALUE_TOO_LARGE, 2), (NOOP, SUCCESS, 0xFEED)]
        )
        self.assertEqual(client.call(GET, key).value, b"x" * 1024)
        self.assertBystanderUntouched()

    def test_bad_data_chunk(self) -> None:
        client = self.text()
        key = self.key()
        # three bytes where one was announced: not followed by CRLF
        self.assertEqual(client.ask(b"set %s 0 0 1\r\nabc\r\n" % key, 2), b"CLIENT_ERROR bad data chunk\r\nERROR\r\n")
        self.assertEqual(client.get(key), b"END\r\n")
        self.assertBystanderUntouched()

    def test_keys_over_250_bytes(self) -> None:
        client = self.text()
        long_key = b"k" * 251
        self.assertEqual(client.ask(b"get %s\r\n" % long_key), b"CLIENT_ERROR bad command line format\r\n")
        # memcached then reads the data line as a command
        self.assertEqual(
            client.ask(b"set %s 0 0 1\r\nv\r\n" % long_key, 2), b"CLIENT_ERROR bad command line format\r\nERROR\r\n"
        )
        self.assertEqual(client.ask(b"delete %s\r\n" % long_key), b"CLIENT_ERROR bad command line format\r\n")
        self.assertEqual(client.get(b"k" * 250), b"END\r\n")
        binary = self.binary()
        self.assertEqual(binary.call(GET, long_key).status, INVALID_ARGUMENTS)
        self.assertEqual(binary.call(SET, long_key, storage_extras(), b"v").status, INVALID_ARGUMENTS)
        self.assertBystanderUntouched()

    def test_unknown_commands(self) -> None:
        client = self.text()
        self.assertEqual(client.ask(b"frobnicate x\r\n"), b"ERROR\r\n")
        self.assertEqual(client.ask(b"\r\n"), b"ERROR\r\n")
        self.assertEqual(client.ask(b"GET x\r\n"), b"ERROR\r\n")
        self.assertEqual(client.ask(b"stats no-such-group\r\n"), b"ERROR\r\n")
        binary = self.binary()
        unknown = binary.call(0x77, opaque=5)
        self.assertEqual(
            (unknown.opcode, unknown.status, unknown.opaque, unknown.value),
            (0x77, UNKNOWN_COMMAND, 5, b"Unknown command"),
        )
        self.assertEqual(binary.call(NOOP).status, SUCCESS)
        self.assertBystanderUntouched()

    def test_missing_arguments_answer_error(self) -> None:
        # memcached 1.6 (and yrmcds) answer ERROR to a known command with too few arguments.
        client = self.text()
        key = self.key()
        for line in (
            b"set %s 0 0" % key,
            b"cas %s 0 0 1" % key,
            b"incr %s" % key,
            b"delete",
            b"touch %s" % key,
            b"get",
            b"gat",
        ):
            self.assertEqual(client.ask(line + b"\r\n"), b"ERROR\r\n", line)
        # (but a gat with an expiration and no key is an empty read, as memcached's)
        self.assertEqual(client.ask(b"gat 10\r\n"), b"END\r\n")

    def test_bad_numbers(self) -> None:
        client = self.text()
        key = self.key()
        for line in (b"set %s abc 0 1" % key, b"set %s -1 0 1" % key, b"set %s 0 0 -1" % key, b"set %s 0 0 abc" % key):
            self.assertEqual(client.ask(line + b"\r\n"), b"CLIENT_ERROR bad command line format\r\n", line)
        # (the data line that followed is a command of its own)
        self.assertEqual(
            client.ask(b"set %s abc 0 1\r\nv\r\n" % key, 2), b"CLIENT_ERROR bad command line format\r\nERROR\r\n"
        )
        self.assertEqual(client.get(key), b"END\r\n")
        self.assertBystanderUntouched()

    def test_binary_wrong_extras_key_or_value(self) -> None:
        client = self.binary()
        key = self.key()
        client.set(key, b"v")
        for packet in (
            request(SET, key, b"", b"v", opaque=1),  # no flags and expiration
            request(GET, key, b"xx", opaque=2),  # extras on a Get
            request(GET, b"", opaque=3),  # no key
            request(INCREMENT, key, b"x" * 8, opaque=4),
            request(TOUCH, key, opaque=5),
            request(NOOP, b"", b"", b"value", opaque=6),
            HEADER.pack(REQUEST_MAGIC, GET, 10, 0, 0, 0, 4, 7, 0) + b"abcd",  # a key longer than the body
        ):
            client.send(packet)
            reply = client.read()
            self.assertEqual(
                (reply.status, reply.opaque), (INVALID_ARGUMENTS, HEADER.unpack_from(packet)[7]), packet[:24]
            )
        self.assertEqual(client.call(GET, key).value, b"v")
        self.assertBystanderUntouched()

    def test_line_too_long(self) -> None:
        client = self.text()
        # (no LF in 4000 bytes, and not a get: memcached closes too, past 2048)
        client.send(b"x" * 4000)
        self.assertEqual(client.read_to_close(), b"CLIENT_ERROR line too long\r\n")
        self.assertBystanderUntouched()

    def test_garbage_then_the_connection_goes_on(self) -> None:
        client = self.text()
        client.send(b"\x00\x01\x02 garbage\r\n")
        self.assertEqual(client.line(), b"ERROR\r\n")
        self.assertTrue(client.version_line().startswith(b"VERSION "))
        self.assertBystanderUntouched()


# == memory =========================================================================


class EvictionTests(MemcacheTestCase):
    """--memcache-memory 64k: least recently used unlocked items go; locked ones stay."""

    kind = "small"
    VALUE = b"v" * 900

    def test_old_unlocked_items_are_evicted_locked_ones_stay(self) -> None:
        client, owner = self.text(), self.text()
        keep = self.key("locked")
        self.assertEqual(client.ask(b"flush_all\r\n"), b"OK\r\n")
        before = client.stats()
        self.assertEqual(int(before[b"limit_maxbytes"]), 64 * 1024)
        owner.store(keep, self.VALUE)
        self.assertEqual(owner.ask(b"lock %s\r\n" % keep), b"OK\r\n")
        keys = [self.key(str(n)) for n in range(200)]
        client.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(self.VALUE), self.VALUE) for key in keys))
        for _ in keys:
            self.assertEqual(client.line(), b"STORED\r\n")
        after = client.stats()
        self.assertGreater(int(after[b"evictions"]) - int(before[b"evictions"]), 100)
        self.assertLessEqual(int(after[b"bytes"]), 64 * 1024)
        self.assertLess(int(after[b"curr_items"]), 80)
        # The oldest, locked, survives; of the others, the newest are there (all
        # of a size) and those before them were evicted.
        newest = int(after[b"curr_items"]) - 1
        self.assertGreater(newest, 20)
        self.assertEqual(client.get(keys[-newest - 1]), b"END\r\n")
        self.assertEqual(client.value_of(keys[-newest]), self.VALUE)
        # That read made it the most recently used: the next store evicts the one after it.
        client.store(self.key("200"), self.VALUE)
        self.assertEqual(client.get(keys[-newest + 1]), b"END\r\n")
        self.assertEqual(client.value_of(keys[-newest]), self.VALUE)
        self.assertEqual(client.value_of(keys[-1]), self.VALUE)
        self.assertEqual(client.value_of(keep), self.VALUE)

    def test_out_of_memory_when_only_locked_items_are_left(self) -> None:
        client, binary = self.text(), self.binary()
        self.assertEqual(client.ask(b"flush_all\r\n"), b"OK\r\n")
        locked = []
        for n in range(200):
            key = self.key(str(n))
            reply = client.store(key, self.VALUE)
            if reply != b"STORED\r\n":
                self.assertEqual(reply, b"SERVER_ERROR out of memory storing object\r\n")
                break
            self.assertEqual(client.ask(b"lock %s\r\n" % key), b"OK\r\n")
            locked.append(key)
        else:
            self.fail("200 locked items of 900 bytes fit in 64 KiB")
        self.assertGreater(len(locked), 30)
        stats = client.stats()
        self.assertEqual(int(stats[b"locked_items"]), len(locked))
        self.assertEqual(int(stats[b"curr_items"]), len(locked))
        failed = binary.call(SET, self.key("binary"), storage_extras(), self.VALUE, opaque=3)
        self.assertEqual((failed.status, failed.opaque), (OUT_OF_MEMORY, 3))
        # nothing was lost, and the connection goes on
        self.assertEqual(client.value_of(locked[0]), self.VALUE)
        self.assertEqual(client.ask(b"unlock %s\r\n" % locked[0]), b"OK\r\n")
        self.assertEqual(binary.set(self.key("binary"), self.VALUE).status, SUCCESS)
        self.assertEqual(client.get(locked[0]), b"END\r\n")
        self.assertEqual(client.value_of(locked[1]), self.VALUE)


# == authentication ==================================================================


class AuthTests(MemcacheTestCase):
    """--auth-token-file: memcached's text authentication and binary SASL PLAIN, the token as password."""

    kind = "auth"

    def test_text_authentication(self) -> None:
        client = self.text(authenticate=False)
        key = self.key()
        self.assertEqual(client.store(b"anything", b"someone " + TOKEN), b"STORED\r\n")
        self.assertEqual(client.store(key, b"v"), b"STORED\r\n")
        self.assertEqual(client.value_of(key), b"v")
        self.assertEqual(client.ask(b"lock %s\r\n" % key), b"OK\r\n")

    def test_unauthenticated_text_command(self) -> None:
        client = self.text(authenticate=False)
        client.send(b"get x\r\n")
        self.assertEqual(client.read_to_close(), b"CLIENT_ERROR unauthenticated\r\n")

    def test_wrong_text_token(self) -> None:
        client = self.text(authenticate=False)
        client.send(b"set x 0 0 %d\r\nuser wrong-token\r\n" % len(b"user wrong-token"))
        self.assertEqual(client.read_to_close(), b"CLIENT_ERROR authentication failure\r\n")
        self.assertServing()

    def test_text_authentication_data_without_a_space(self) -> None:
        client = self.text(authenticate=False)
        client.send(b"set x 0 0 %d\r\n%s\r\n" % (len(TOKEN), TOKEN))
        self.assertEqual(client.read_to_close(), b"CLIENT_ERROR bad authentication token format\r\n")

    def test_binary_sasl_plain(self) -> None:
        client = self.binary(authenticate=False)
        mechanisms = client.call(SASL_LIST_MECHS, opaque=1)
        self.assertEqual((mechanisms.status, mechanisms.value, mechanisms.opaque), (SUCCESS, b"PLAIN", 1))
        accepted = client.call(SASL_AUTH, b"PLAIN", value=b"\0anyone\0" + TOKEN, opaque=2)
        self.assertEqual((accepted.status, accepted.opaque), (SUCCESS, 2))
        key = self.key()
        self.assertEqual(client.set(key, b"v").status, SUCCESS)
        self.assertEqual(client.call(LAG, key).value, b"v")

    def test_wrong_sasl_password(self) -> None:
        client = self.binary(authenticate=False)
        refused = client.call(SASL_AUTH, b"PLAIN", value=b"\0user\0wrong", opaque=4)
        self.assertEqual((refused.opcode, refused.status, refused.opaque), (SASL_AUTH, AUTH_ERROR, 4))
        self.assertEqual(client.read_to_close(), b"")
        self.assertServing()

    def test_unauthenticated_binary_command(self) -> None:
        client = self.binary(authenticate=False)
        refused = client.call(GET, b"x", opaque=6)
        self.assertEqual((refused.opcode, refused.status, refused.opaque), (GET, AUTH_ERROR, 6))
        self.assertEqual(client.read_to_close(), b"")

    def test_pymemcache_authenticates_with_a_set(self) -> None:
        client = self.pymemcache(default_noreply=False)
        key = self.key()
        self.assertTrue(client.set("auth", b"user " + TOKEN))
        self.assertTrue(client.set(key, b"v"))
        self.assertEqual(client.get(key), b"v")


if __name__ == "__main__":
    unittest.main()
