"""
The pages of the docs as the doc tests read them: a section of a page
(L{section}), the fenced blocks in a language (L{blocks}), and both from a
page of the checkout (L{page_blocks}); and a JESync transcript of a page
replayed against a server (L{replay_transcript}).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]


def section(text: str, title: str) -> Optional[str]:
    """The text of the section C{## title} of a page, up to the next C{## }, or None if there is none."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return match.group(1) if match else None


def blocks(text: str, language: str) -> list[str]:
    """The fenced blocks in C{language}; one indented with its fence (in a list item) loses the fence's indent."""
    found = re.findall(rf"^( *)```{language}\n(.*?)^\1```", text, re.S | re.M)
    return [re.sub(rf"^{indent}", "", body, flags=re.M) for indent, body in found]


def page_blocks(page: str, language: str, title: Optional[str] = None) -> list[str]:
    """The blocks in C{language} of C{page} (a path from the root), in its section C{## title} if given."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if title is not None:
        found = section(text, title)
        assert found is not None, f"{page} has no section {title!r}"
        text = found
    return blocks(text, language)


def replay_transcript(test, server, transcript: str) -> None:
    """
    Replay a JESync transcript of the docs (C{C1: <request>}, C{S→C1:
    <line>}, C{(<n> seconds pass)}, C{(C1 disconnects)}) against C{server}
    (a L{tests.support.UnitServer}), client C<n> connecting from
    10.0.0.<n>:5000<n>: every line the page shows a client being sent is the
    next one it reads, and it reads nothing else.
    """
    from twisted.internet.address import IPv4Address

    clients = {}

    def client(name: str):
        if name not in clients:
            number = int(name[1:])
            clients[name] = server.connect(peer=IPv4Address("TCP", f"10.0.0.{number}", 50000 + number))
            clients[name].unread = []
        return clients[name]

    def received(name: str) -> list:
        one = client(name)
        one.unread.extend(one.take().decode().splitlines())
        return one.unread

    for line in transcript.splitlines():
        if line.startswith("S→"):
            name, sent = line[2:].split(": ", 1)
            unread = received(name)
            test.assertTrue(unread, f"{name} was sent nothing; the page shows {sent!r}")
            test.assertEqual(unread.pop(0), sent)
        elif line.endswith(" seconds pass)"):
            server.clock.advance(int(line[1:].split()[0]))
        elif line.endswith(" disconnects)"):
            client(line[1:].split()[0]).lose()
        else:
            name, sent = line.split(": ", 1)
            client(name).send(sent.encode() + b"\n")
    for name in clients:
        test.assertEqual(received(name), [], name)
