"""The user guide's commands (README, docs/reference.md, docs/admins.md), as the tests run them: a fenced block
right after `<!-- test:NAME -->`."""

from __future__ import annotations

import re

from helpers import ROOT

GUIDES = ("README.md", "docs/reference.md", "docs/admins.md")  # every command in them runs as written


def block(name: str) -> str:
    text = "\n".join((ROOT / guide).read_text() for guide in GUIDES)
    found = re.findall(rf"<!-- test:{re.escape(name)} -->\n```\w*\n(.*?)```", text, re.DOTALL)
    assert len(found) == 1, f"{len(found)} blocks marked test:{name} in {', '.join(GUIDES)}"
    return found[0]
