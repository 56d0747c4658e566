"""
The pages of the docs as the doc tests read them: a section of a page
(L{section}), the fenced blocks in a language (L{blocks}), and both from a
page of the checkout (L{page_blocks}).
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
