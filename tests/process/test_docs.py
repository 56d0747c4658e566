"""
The docs (README.md and the pages under docs/) say what is true: their
examples run as written and print what the pages say they print, every
fenced example is run by a test or listed in L{NOT_RUN} with the reason,
and every relative link leads to a file, and every anchor to a heading of
it.  The examples are found by page, section title and language, so a test
runs whatever the page holds, not a copy of it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from typing import Optional

from twisted.trial.unittest import SynchronousTestCase

from tests.doc_pages import ROOT, blocks, page_blocks, section

#: Every page of the docs: the front door, and the tree under docs/.
PAGES = ["README.md"] + sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md"))

#: The two commands, as CI runs them (.ci/run): install-and-test, then
#: install-and-run, which stays in the foreground, so each is a block of its own.
INSTALL_AND_TEST = "pip install '.[test]' && python -m pytest"
INSTALL_AND_RUN = "pip install . && twistd -n --pidfile= --reactor jesync-epoll jesync"

# The examples the tests below (and those in the files named) run, as
# (page, "## section" title, language, a text the block holds or None for
# every block of that language in the section).
QUICK_START = ("README.md", "Quick start", "console", "printf")
EMBEDDING = ("docs/embedding.md", "Embedding it", "python", None)
MEMCACHED = ("docs/operating.md", "Running it", "python", "pymemcache")
DLOCK_CLIENT = ("docs/clients.md", "A dlock client in Python", "python", None)
RUN = [
    ("README.md", "The two commands", "sh", None),  # test_opens_with_the_two_commands; .ci/run runs them
    QUICK_START,
    EMBEDDING,
    MEMCACHED,
    DLOCK_CLIENT,
    ("docs/operating.md", "Running it", "sh", "--admin-token-file"),  # test_admin_token.ReadmeAdminTokenTests
    ("docs/clients.md", "Using it from Python", "python", None),  # test_client_docs
    ("docs/clients.md", "Using it from Python", "console", None),  # test_client_docs: the first example's output
    ("docs/clients.md", "Using it from the shell", "sh", None),  # test_client_docs
    ("docs/clients.md", "Using it from the shell", "console", "jesync watch"),  # test_cli_watch
    ("docs/clients.md", "A tooz backend", "python", None),  # test_client_docs
    ("docs/development.md", "Adding an option", "python", None),  # test_adding_an_option
    ("docs/testing.md", "A test of your own", "python", None),  # tests/unit/test_testing.py DocsExampleTests
    ("docs/coordination.md", "In a Twisted application", "python", None),  # test_coordination_docs
    ("docs/coordination.md", "From Python", "python", None),  # test_coordination_docs
    ("docs/coordination.md", "From the shell", "sh", None),  # test_coordination_docs
    ("docs/coordination.md", "Groups", "python", None),  # test_coordination_docs
    ("README.md", "HTTP API", "sh", None),  # test_http_docs
    ("docs/http.md", "Running it", "sh", None),  # test_http_docs
    ("docs/http.md", "Sessions", "sh", None),  # test_http_docs
    ("docs/http.md", "Locks", "sh", None),  # test_http_docs
    ("docs/http.md", "Errors", "sh", None),  # test_http_docs
    ("docs/http.md", "Watches", "sh", None),  # test_http_docs
    ("docs/http.md", "Elections", "sh", None),  # test_http_docs
    ("docs/http.md", "Groups", "sh", None),  # test_http_docs
    ("docs/http.md", "Status", "sh", None),  # test_http_docs
    ("docs/http.md", "Authentication, TLS and protected mode", "sh", None),  # test_http_docs
]

#: Fenced examples no test runs, by page and (language, first line), with the reason.
NOT_RUN = {
    "docs/operating.md": {
        ("sh", "twistd -n --pidfile= jesync --auth-token-file /etc/jesync/token       # clients send auth <token>"): (
            "two alternative servers, each in the foreground until stopped"
        ),
    },
    "docs/cluster.md": {
        ("sh", "pip install '.[cluster]'             # treq, for etcd's JSON gateway"): (
            "three cluster members on a real etcd, each in the foreground until stopped"
        ),
    },
    "docs/clients.md": {
        ("py", "from jesync.client import Client"): "a server at locks.example.com, a token file and a CA in /etc/jesync",
        ("py", "import os"): "the same server, named by the environment",
        ("console", "$ jesync status nightly-report"): "a busy server's output: its keys, waiters and round trips vary",
        ("console", "$ export JESYNC_SERVERS=locks.example.com:11443"): "a server at locks.example.com, with TLS and a token",
        ("console", "$ pip install '.[tooz]'"): "installs a package (the test extra installs the same)",
    },
    "docs/development.md": {
        ("sh", "pip install grpcio-tools==1.72.1      # protoc 30.0"): "regenerates the committed dlock_pb2.py with protoc",
    },
}

LANGUAGES = ("python", "py", "sh", "console")


def example(selector: tuple[str, str, str, Optional[str]]) -> list[str]:
    """The blocks an entry of L{RUN} selects."""
    page, title, language, holding = selector
    return [block for block in page_blocks(page, language, title) if holding is None or holding in block]


def run_python(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", source],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def github_anchor(title: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but C{-} and C{_} dropped, spaces to C{-}."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a page, a repeated one with GitHub's C{-1}, C{-2}, ... too."""
    outside_code = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    seen: dict[str, int] = {}
    found = set()
    for title in re.findall(r"^#+ (.*)$", outside_code, re.M):
        anchor = github_anchor(title)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


class ReadmeTests(SynchronousTestCase):
    def test_opens_with_two_commands(self) -> None:
        """The first two code blocks are the two commands, one each: install-and-test first, then install-and-run."""
        self.assertEqual(
            [block.splitlines() for block in page_blocks("README.md", "sh")[:2]],
            [[INSTALL_AND_TEST], [INSTALL_AND_RUN]],
        )
        first_blocks = re.findall(r"^```\w*\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M)
        self.assertEqual(first_blocks[:2], [INSTALL_AND_TEST + "\n", INSTALL_AND_RUN + "\n"])

    def test_front_door_is_short(self) -> None:
        """README.md is the front door: at most about 150 lines, the rest is in docs/."""
        self.assertLessEqual(len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()), 150)

    def test_quick_start_replies(self) -> None:
        """The quick start's commands, sent to a real server, get the replies it shows."""
        from tests.servers import free_port, start_server

        [session] = example(QUICK_START)
        lines = session.splitlines()
        sent = re.fullmatch(r"\$ printf '(.*)' \| nc -q1 127\.0\.0\.1 7777", lines[1])
        assert sent is not None, lines[1]
        self.assertEqual(lines[0], "$ twistd -n --pidfile= jesync --port 7777")
        port = free_port()
        start_server(self, extra_args=["--port", f"tcp:{port}:interface=127.0.0.1"])
        request = sent.group(1).replace("\\n", "\n").encode()
        replies = b""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(request)
            while replies.count(b"\n") < request.count(b"\n"):
                chunk = connection.recv(4096)
                if not chunk:
                    break
                replies += chunk
        self.assertEqual(replies.decode().splitlines(), lines[2:])


class ExampleTests(SynchronousTestCase):
    def test_embedding_example_runs_as_documented(self) -> None:
        example_code, _ = example(EMBEDDING)
        result = run_python(example_code)
        self.assertEqual(result.returncode, 0, result.stderr)
        [expected] = page_blocks("docs/embedding.md", "text", "Embedding it")
        lines = result.stdout.splitlines()
        expected_lines = expected.splitlines()
        self.assertEqual(len(lines), len(expected_lines), result.stdout)
        self.assertRegex(lines[0], r"^serving JESync on port \d+$")
        self.assertEqual(lines[1:], expected_lines[1:])

    def test_whole_server_example_builds(self) -> None:
        """The build_server example builds both listeners over one lock table."""
        _, example_code = example(EMBEDDING)
        check = (
            "\nprint(sorted(type(child.factory).__name__ for child in server))"
            "\nprint(all(child.factory.service is server.locks for child in server))"
            "\nprint(server.policy.idle_timeout)"
        )
        result = run_python(example_code + check)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), ["['ELockFactory', 'JESyncFactory']", "True", "300"])

    def test_memcached_example_locks_an_object(self) -> None:
        """The pymemcache example runs against a real server and leaves the object written and unlocked."""
        from tests.servers import free_port, start_server

        [example_code] = example(MEMCACHED)
        port = free_port()
        start_server(self, extra_args=["--memcache-port", f"tcp:{port}:interface=127.0.0.1"])
        check = (
            "\nother = Client(('127.0.0.1', PORT))"
            "\nprint(other.get('report'))"
            "\nprint(other.raw_command(b'lock report'))"
        ).replace("PORT", str(port))
        result = run_python(example_code.replace("11211", str(port)) + check)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(), ["b'final'", "b'OK'"])

    def test_dlock_client_example(self) -> None:
        """The dlock client locks two keys with their tokens and unlocks them, against a real server, as it prints."""
        from tests.servers import free_port, start_server

        [example_code] = example(DLOCK_CLIENT)
        port = free_port()
        server = start_server(self, extra_args=["--dlock-port", f"tcp:{port}:interface=127.0.0.1"])
        result = run_python(example_code.replace("11402", str(port)))
        self.assertEqual(result.returncode, 0, result.stderr)
        [expected] = page_blocks("docs/clients.md", "text", "A dlock client in Python")
        self.assertEqual(result.stdout, expected)
        # The keys were released: a JESync client gets both at once.
        host, jesync_port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(jesync_port)), timeout=10) as connection:
            connection.sendall(b"lock account:17 1 0\nlock account:42 1 0\n")
            replies = b""
            while replies.count(b"\n") < 2:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                replies += chunk
        self.assertEqual([line.split()[0] for line in replies.decode().splitlines()], ["GRANTED", "GRANTED"])


class EveryExampleTests(SynchronousTestCase):
    def test_every_example_is_run_or_listed(self) -> None:
        """Every fenced python, py, sh and console block of the docs is selected by RUN or listed in NOT_RUN."""
        unaccounted = []
        for page in PAGES:
            text = (ROOT / page).read_text(encoding="utf-8")
            titles = re.findall(r"^## (.*)$", text, re.M)
            for title in [None] + titles:
                body = text.split("\n## ", 1)[0] if title is None else section(text, title)
                assert body is not None
                for language in LANGUAGES:
                    for block in blocks(body, language):
                        run = any(
                            (page, title, language) == selector[:3] and (selector[3] is None or selector[3] in block)
                            for selector in RUN
                        )
                        listed = (language, block.splitlines()[0]) in NOT_RUN.get(page, {})
                        if not (run or listed):
                            unaccounted.append(f"{page}, {title!r}, {language}: {block.splitlines()[0]}")
        self.assertEqual(unaccounted, [])

    def test_not_run_list_is_current(self) -> None:
        """Every example listed as not run is still in its page, so the list does not outlive what it excuses."""
        for page, first_lines in NOT_RUN.items():
            text = (ROOT / page).read_text(encoding="utf-8")
            present = {(language, block.splitlines()[0]) for language in LANGUAGES for block in blocks(text, language)}
            self.assertEqual(set(first_lines) - present, set(), page)

    def test_run_selectors_select(self) -> None:
        """Every entry of RUN selects at least one block, so a renamed section cannot go unnoticed."""
        for selector in RUN:
            self.assertNotEqual(example(selector), [], selector)


class LinkTests(SynchronousTestCase):
    def test_relative_links_resolve(self) -> None:
        """Every relative link in the docs leads to a file (or folder), and its #anchor to a heading of that page."""
        broken = []
        for page in PAGES + ["BENCHMARKS.md", "CHANGELOG.md", "benchmarks/README.md"]:
            text = (ROOT / page).read_text(encoding="utf-8")
            prose = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
            targets = re.findall(r"\]\(([^)\s]+)\)", prose) + re.findall(r"^\[[^\]]+\]: (\S+)$", prose, re.M)
            for target in targets:
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                linked = (ROOT / page).parent / path if path else ROOT / page
                if not linked.exists():
                    broken.append(f"{page}: {target} (no such file)")
                elif anchor and anchor not in anchors(linked.read_text(encoding="utf-8")):
                    broken.append(f"{page}: {target} (no such heading)")
        self.assertEqual(broken, [])

    def test_anchor_rule(self) -> None:
        """GitHub's rule, on headings these pages have."""
        self.assertEqual(
            github_anchor("memcached (with yrmcds's object locks)"), "memcached-with-yrmcdss-object-locks"
        )
        self.assertEqual(github_anchor("Fencing tokens (every protocol)"), "fencing-tokens-every-protocol")
        self.assertEqual(anchors("## Framing\n## Framing\n```\n# not a heading\n```\n"), {"framing", "framing-1"})


class SiteTests(SynchronousTestCase):
    def test_nav_lists_every_page(self) -> None:
        """mkdocs.yml's nav lists every page under docs/, once, and no page that is not there."""
        listed = re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
        pages = sorted(page[len("docs/"):] for page in PAGES if page.startswith("docs/"))
        self.assertEqual(sorted(listed), pages)
