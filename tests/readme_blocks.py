"""The README's user commands, as the tests run them: a fenced block right after `<!-- test:NAME -->`."""

from __future__ import annotations

import re

from helpers import ROOT


def block(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- test:{re.escape(name)} -->\n```\w*\n(.*?)```", text, re.DOTALL)
    assert match, f"README has no block marked test:{name}"
    return match.group(1)
