"""
The HTTP API's examples (docs/http.md, and the README's "HTTP API"
section) run as written against a real C{twistd jesync} and print what the
pages say they print.  One convention, for every example:

 - A ```sh block whose first line is C{twistd ...} is the server the blocks
   after it talk to: the test starts that command (a server before it is
   stopped), its C{--http-port 8080} on a free port of 127.0.0.1 and its
   C{--auth-token-file /etc/jesync/token} a file of the test's.
 - Every other ```sh block runs in one C{bash} per page, as in a reader's
   terminal: a variable set by one block is there for the next.  The only
   change to a block: C{localhost:8080} (in the page's one
   C{export JESYNC_HTTP=localhost:8080}) becomes the test's server, and
   C{/etc/jesync/token} the test's token file.
 - The ```json block right after a ```sh block is what it prints: the JSON
   values it prints, in order (how they are laid out does not matter: the
   server sends each on one line, the page shows them indented), each equal
   to the page's except for the fields whose values vary from run to run
   (L{VARYING}: ids, fencing tokens (they follow the clock), times, peers' ports, the version), whose values need
   only be of the same JSON type (a null stays a null).  A ```sh block with
   no ```json block after it prints nothing.
 - A ```sh block that streams (C{curl -N}, Server-Sent Events) runs in a
   shell of its own, in the background: once it has printed its first
   event, the blocks after it in its section run; the ```text block after
   it is the events it prints, C{event:} lines exactly and C{data:} lines'
   JSON as above (C{: ping} comments left out).

The reader's tools are the page's tools: C{bash}, C{curl} and C{jq}.
Without them the tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, List, NamedTuple, Optional, Tuple

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from tests.doc_pages import ROOT, section
from tests.servers import environment, free_port, start_server

#: The address the pages' examples use, stated once (C{export JESYNC_HTTP=...}).
PAGE_ADDRESS = "localhost:8080"
PAGE_TOKEN_FILE = "/etc/jesync/token"

#: Fields whose values vary from run to run: only their JSON type is compared.
VARYING = frozenset({"session", "token", "held_for", "expires_in", "waited", "uptime", "peer", "version", "listeners"})

#: How long one block may take (a long poll in an example waits far less).
BLOCK_TIMEOUT = 30.0

TOOLS = ("bash", "curl", "jq")


def require_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise SkipTest(
            f"SKIPPED: the HTTP API's docs examples need {', '.join(missing)} (as their reader does); "
            "install them (Debian: apt-get install curl jq)"
        )


class Block(NamedTuple):
    language: str
    text: str


class Step(NamedTuple):
    """A ```sh block of a page, and the blocks after it that show what it prints."""

    command: str
    shown: List[Block]

    @property
    def starts_server(self) -> bool:
        return self.command.startswith("twistd ")

    @property
    def streams(self) -> bool:
        return re.search(r"\bcurl -s?N\b", self.command) is not None


def fenced_blocks(text: str) -> List[Block]:
    """Every fenced block of C{text} (not indented), in order, with its language."""
    return [Block(language, body) for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def steps_of(text: str) -> List[Step]:
    """The ```sh blocks of C{text}, each with the ```json or ```text blocks after it, before the next one."""
    steps: List[Step] = []
    for block in fenced_blocks(text):
        if block.language == "sh":
            steps.append(Step(block.text, []))
        elif block.language in ("json", "text") and steps:
            steps[-1].shown.append(block)
    return steps


def page_sections(page: str) -> List[Tuple[str, str]]:
    """The C{## } sections of a page: (title, text)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    titles = re.findall(r"^## (.*)$", text, re.M)
    found = []
    for title in titles:
        body = section(text, title)
        assert body is not None
        found.append((title, body))
    return found


def json_values(text: str) -> List[Any]:
    """The JSON values in C{text}, one after another (any layout); anything else is an error."""
    decoder = json.JSONDecoder()
    values = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError as error:
            raise AssertionError(f"not JSON at {text[position:position + 60]!r}: {error}")
        values.append(value)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def differences(shown: Any, printed: Any, where: str = "") -> List[str]:
    """How C{printed} differs from C{shown}: equal, but L{VARYING} fields only by type."""
    if isinstance(shown, dict) and isinstance(printed, dict):
        if list(shown) != list(printed):
            return [f"{where or '.'}: fields {list(printed)}, the page shows {list(shown)}"]
        found = []
        for name, value in shown.items():
            if name in VARYING:
                if json_type(value) != json_type(printed[name]):
                    found.append(f"{where}.{name}: {printed[name]!r}, the page shows {value!r}")
            else:
                found.extend(differences(value, printed[name], f"{where}.{name}"))
        return found
    if isinstance(shown, list) and isinstance(printed, list):
        if len(shown) != len(printed):
            return [f"{where or '.'}: {printed!r}, the page shows {shown!r}"]
        found = []
        for index, (one, other) in enumerate(zip(shown, printed)):
            found.extend(differences(one, other, f"{where}[{index}]"))
        return found
    if json_type(shown) != json_type(printed) or shown != printed:
        return [f"{where or '.'}: {printed!r}, the page shows {shown!r}"]
    return []


def event_differences(shown: str, printed: List[str]) -> List[str]:
    """How the event stream's lines C{printed} differ from the page's C{shown} (C{data:} lines as JSON)."""
    expected = shown.rstrip("\n").split("\n")
    if len(printed) < len(expected):
        return [f"printed {len(printed)} lines, the page shows {len(expected)}: {printed!r}"]
    found = []
    for number, (one, other) in enumerate(zip(expected, printed), 1):
        if one.startswith("data: ") and other.startswith("data: "):
            try:
                printed_value = json.loads(other[6:])
            except ValueError:
                found.append(f"line {number}: {other!r} is not JSON")
                continue
            found.extend(
                f"line {number}: {difference}" for difference in differences(json.loads(one[6:]), printed_value)
            )
        elif one != other:
            found.append(f"line {number}: {other!r}, the page shows {one!r}")
    return found


class Shell:
    """One C{bash} for a page's blocks, as a reader's terminal: a block's variables are there for the next."""

    def __init__(self, testcase: SynchronousTestCase, env: dict, directory: str) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=directory,
            start_new_session=True,
        )
        testcase.addCleanup(self.close)

    def run(self, block: str) -> Tuple[int, str, str]:
        """Run C{block}: its status, what it printed and what it printed on stderr."""
        marker = secrets.token_hex(8)
        assert self.process.stdin is not None and self.process.stdout is not None and self.process.stderr is not None
        self.process.stdin.write(
            f"{block}\nprintf '\\n{marker} %d\\n' $?\nprintf '\\n{marker}\\n' >&2\n".encode()
        )
        self.process.stdin.flush()
        ends = {self.process.stdout.fileno(): re.compile(rf"\n{marker} (\d+)\n$".encode()),
                self.process.stderr.fileno(): re.compile(rf"\n{marker}\n$".encode())}
        received = {fd: b"" for fd in ends}
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while any(ends[fd].search(received[fd]) is None for fd in ends):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"this block did not end within {BLOCK_TIMEOUT} s:\n{block}\n{received!r}")
            ready, _, _ = select.select(list(ends), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"bash ended during this block:\n{block}\n{received!r}")
                received[fd] += chunk
        out = received[self.process.stdout.fileno()]
        status_match = ends[self.process.stdout.fileno()].search(out)
        assert status_match is not None
        err = received[self.process.stderr.fileno()]
        return (
            int(status_match.group(1)),
            out[: status_match.start()].decode(),
            err[: ends[self.process.stderr.fileno()].search(err).start()].decode(),  # type: ignore[union-attr]
        )

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


class Stream:
    """A block that streams (C{curl -N}), in a shell of its own in the background; its lines as they come."""

    def __init__(self, testcase: SynchronousTestCase, block: str, env: dict, directory: str) -> None:
        self.block = block
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-c", block],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=directory,
            start_new_session=True,
        )
        self.received = b""
        testcase.addCleanup(self.close)

    def lines(self) -> List[str]:
        """The lines printed so far (whole lines only), but the C{: ping} comments."""
        whole = self.received.decode(errors="replace").split("\n")[:-1]
        return [line for line in whole if not line.startswith(":")]

    def wait_lines(self, count: int) -> List[str]:
        """Wait until it has printed C{count} lines (L{BLOCK_TIMEOUT} at most)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while len(self.lines()) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.block} printed only {self.lines()!r}, the page shows {count} lines")
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"{self.block} ended after {self.received!r}")
                self.received += chunk
        return self.lines()

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class PageRun:
    """
    A page's examples run in order against the servers it starts; each
    difference from what the page shows is kept in L{problems}, named by
    its section and its block's first line.
    """

    def __init__(self, testcase: SynchronousTestCase) -> None:
        self.testcase = testcase
        self.directory = tempfile.mkdtemp()
        testcase.addCleanup(shutil.rmtree, self.directory, True)
        self.port = free_port()
        self.token = secrets.token_hex(16).encode()
        self.token_file = Path(self.directory, "token")
        self.token_file.write_bytes(self.token + b"\n")
        self.env = dict(environment(), JESYNC_HTTP=f"127.0.0.1:{self.port}")
        self.shell = Shell(testcase, self.env, self.directory)
        self.server: Any = None
        self.problems: List[str] = []
        self.ran = 0

    def adapted(self, block: str) -> str:
        """The block as this test runs it: the test's address and token file for the page's."""
        return block.replace(PAGE_ADDRESS, f"127.0.0.1:{self.port}").replace(PAGE_TOKEN_FILE, str(self.token_file))

    def start_server(self, command: str) -> None:
        """Start the page's server command, with this test's port and token file (a server before it stops)."""
        words = command.split()
        assert words[:4] == ["twistd", "-n", "--pidfile=", "jesync"], command
        options = words[4:]
        arguments: List[str] = []
        auth_token: Optional[bytes] = None
        http_ports = 0
        while options:
            option = options.pop(0)
            value = options.pop(0) if options and not options[0].startswith("--") else None
            if option == "--port":
                continue  # (the test's server listens on a port of its own)
            if option == "--http-port":
                http_ports += 1
                value = f"tcp:{self.port}:interface=127.0.0.1"
            elif option == "--auth-token-file":
                assert value == PAGE_TOKEN_FILE, command
                value = str(self.token_file)
                auth_token = self.token
            arguments += [option] if value is None else [option, value]
        self.testcase.assertEqual(http_ports, 1, command)
        if self.server is not None:
            self.server.close()
        self.server = start_server(self.testcase, extra_args=arguments, auth_token=auth_token)

    def run_section(self, title: str, text: str) -> None:
        steps = steps_of(text)
        streams: List[Tuple[Stream, Step]] = []
        for step in steps:
            self.ran += 1
            name = f"{title!r}: {step.command.splitlines()[0]}"
            if step.starts_server:
                self.start_server(step.command)
            elif step.streams:
                stream = Stream(self.testcase, self.adapted(step.command), self.env, self.directory)
                stream.wait_lines(1)
                streams.append((stream, step))
            else:
                self.check(name, step, *self.shell.run(self.adapted(step.command)))
        for stream, step in streams:
            name = f"{title!r}: {step.command.splitlines()[0]}"
            shown = [block for block in step.shown if block.language == "text"]
            if len(shown) != 1:
                self.problems.append(f"{name}: a stream shows one text block of events, this one {len(shown)}")
                continue
            expected = shown[0].text.rstrip("\n").split("\n")
            printed = stream.wait_lines(len(expected))
            self.problems.extend(f"{name}: {difference}" for difference in event_differences(shown[0].text, printed))
            stream.close()

    def check(self, name: str, step: Step, status: int, printed: str, errors: str) -> None:
        if status != 0 or errors:
            self.problems.append(f"{name}: exit status {status}, stderr {errors!r}, printed {printed!r}")
            return
        shown_blocks = [block for block in step.shown if block.language == "json"]
        if len(shown_blocks) > 1:
            self.problems.append(f"{name}: one json block after a command, not {len(shown_blocks)}")
            return
        shown = json_values(shown_blocks[0].text) if shown_blocks else []
        try:
            values = json_values(printed)
        except AssertionError as error:
            self.problems.append(f"{name}: {error}")
            return
        if len(values) != len(shown):
            self.problems.append(f"{name}: printed {len(values)} JSON values, the page shows {len(shown)}: {printed}")
            return
        for one, other in zip(shown, values):
            self.problems.extend(f"{name}: {difference}" for difference in differences(one, other))


class HttpPageTests(SynchronousTestCase):
    def setUp(self) -> None:
        require_tools()

    def test_every_example_of_the_page(self) -> None:
        """docs/http.md's examples, section by section, print what the page shows."""
        run = PageRun(self)
        sections = page_sections("docs/http.md")
        self.assertTrue(steps_of(sections[0][1])[0].starts_server, "the page's first example starts the server")
        for title, text in sections:
            run.run_section(title, text)
        self.assertEqual(run.problems, [], "\n\n".join(run.problems))
        self.assertGreater(run.ran, 20)

    def test_the_address_is_stated_once(self) -> None:
        """The page names its server once (C{export JESYNC_HTTP=localhost:8080}); every example uses the variable."""
        text = (ROOT / "docs" / "http.md").read_text(encoding="utf-8")
        commands = "\n".join(step.command for _, body in page_sections("docs/http.md") for step in steps_of(body))
        self.assertEqual(commands.count(PAGE_ADDRESS), 1)
        self.assertIn(f"export JESYNC_HTTP={PAGE_ADDRESS}", commands)
        self.assertNotIn("localhost:", commands.replace(f"export JESYNC_HTTP={PAGE_ADDRESS}", ""))
        self.assertIn("$JESYNC_HTTP", text)


class ReadmeHttpTests(SynchronousTestCase):
    def setUp(self) -> None:
        require_tools()

    def test_the_lifecycle(self) -> None:
        """The README's HTTP API section: its server, then a session, a long poll, its token, release, end."""
        [(title, text)] = [(title, text) for title, text in page_sections("README.md") if title == "HTTP API"]
        steps = steps_of(text)
        self.assertTrue(steps[0].starts_server, steps[0].command)
        self.assertIn("docs/images/status-page.png", text)
        self.assertIn("(docs/http.md)", text)
        run = PageRun(self)
        run.run_section(title, text)
        self.assertEqual(run.problems, [], "\n\n".join(run.problems))


class ConventionTests(SynchronousTestCase):
    """The rules the page tests compare by, on documents of their own."""

    def test_varying_fields_compare_by_type(self) -> None:
        shown = {"session": "a", "ttl": 30.0, "grants": [{"held_for": 0.0, "expires_in": None, "max_concurrent": 1}]}
        same = {"session": "b", "ttl": 30, "grants": [{"held_for": 1.5, "expires_in": None, "max_concurrent": 1}]}
        self.assertEqual(differences(shown, same), [])
        other = {"session": "b", "ttl": 30.0, "grants": [{"held_for": 1.5, "expires_in": 9.0, "max_concurrent": 2}]}
        self.assertEqual(
            differences(shown, other),
            [".grants[0].expires_in: 9.0, the page shows None", ".grants[0].max_concurrent: 2, the page shows 1"],
        )
        self.assertEqual(differences({"a": 1}, {"a": 1, "b": 2}), [".: fields ['a', 'b'], the page shows ['a']"])
        self.assertEqual(differences({"a": True}, {"a": 1}), [".a: 1, the page shows True"])

    def test_json_values_in_any_layout(self) -> None:
        self.assertEqual(json_values('{"a": [1,\n 2]}{"b":null}\n409\n'), [{"a": [1, 2]}, {"b": None}, 409])
        self.assertRaises(AssertionError, json_values, "{} not json")

    def test_events_compare_data_as_json(self) -> None:
        shown = 'event: granted\ndata: {"key": "report", "holder": {"peer": "127.0.0.1:40000"}}\n\n'
        printed = ["event: granted", 'data: {"key":"report","holder":{"peer":"x"}}', ""]
        self.assertEqual(event_differences(shown, printed), [])
        self.assertEqual(
            event_differences(shown, ["event: released", 'data: {"key":"report","holder":{"peer":"x"}}', ""]),
            ["line 1: 'event: released', the page shows 'event: granted'"],
        )

    def test_steps_pair_commands_with_what_they_print(self) -> None:
        text = (
            "```sh\ntwistd -n --pidfile= jesync --http-port 8080\n```\n"
            "```sh\ncurl -s x\n```\n\n```json\n{}\n```\n"
            "```sh\ncurl -sN y\n```\n```text\nevent: a\n```\n"
        )
        steps = steps_of(text)
        self.assertEqual(
            [(step.starts_server, step.streams, [block.language for block in step.shown]) for step in steps],
            [(True, False, []), (False, False, ["json"]), (False, True, ["text"])],
        )
