"""The README is a user guide a user reads in minutes, and every command in it and in the reference it links to
works as written: each block is executed by a test (or tagged as needing a GPU or a published release, or as
output), and every command and variable they name exists."""

import re
from pathlib import Path

import pytest

from entrypoint.console import COMMANDS, HIDDEN_COMMANDS
from helpers import ROOT
from readme_blocks import GUIDES

README = (ROOT / "README.md").read_text()
MAX_LINES = 250  # issue #85: a guide; the reference is docs/reference.md
NOT_EXECUTED = {"needs:gpu": "a GPU node (the admins' selftest there is the proof)", "output": "a log line shown",
                "needs:release": "a published image (none yet: the README says so; the release workflow makes it)"}
BY_CI = {"develop"}  # scripts/install.sh and scripts/test.sh: what .ci/run runs


def test_the_readme_is_short_enough_to_read_in_minutes():
    assert len(README.splitlines()) <= MAX_LINES, "the reference goes to docs/reference.md, benchmarks to benchmarks/"


@pytest.mark.parametrize("guide", GUIDES)
def test_every_block_is_executed_by_a_test_or_says_why_not(guide):
    text = (ROOT / guide).read_text()
    tags = re.findall(r"^(.*)\n```", text, re.MULTILINE)[::2]  # the line before each block's opening fence
    tests = "\n".join(p.read_text() for p in Path(ROOT / "tests").rglob("*.py"))
    for tag in tags:
        found = re.fullmatch(r"<!-- (test:([\w-]+)|[\w:]+) -->", tag)
        assert found, f"{guide}: a block without a tag (<!-- test:NAME -->, <!-- needs:gpu -->, <!-- output -->): {tag}"
        name = found.group(2)
        if name:
            assert name in BY_CI or f'block("{name}")' in tests, f"no test runs the {guide} block test:{name}"
        else:
            assert found.group(1) in NOT_EXECUTED, tag


@pytest.mark.parametrize("guide", GUIDES)
def test_every_command_and_variable_the_guides_name_exists(guide):
    text = (ROOT / guide).read_text()
    blocks = re.findall(r"```\w*\n(.*?)```", text, re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```\w*\n.*?```", "", text, flags=re.DOTALL))
    commands = [line.split(" #")[0].strip() for block in blocks + inline for line in block.splitlines()]
    named = {m.group(1) for c in commands for m in [re.match(r"(?:[\w./~-]*/)?distrain ([a-z][\w-]*)(?![\w:.-])", c)]
             if m}
    known = set(COMMANDS + HIDDEN_COMMANDS) | {"runz"}  # runz: the reference's example of a mistyped command
    assert named <= known, named - known
    sources = "\n".join(p.read_text() for folder in ("entrypoint", "jobs", "scripts") for p in
                        (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".job", ""))
    variables = set(re.findall(r"\bDISTRAIN_[A-Z_]+[A-Z]\b", text))
    missing = {v for v in variables if v not in sources}
    assert variables and not missing, missing


def test_the_readme_links_its_reference_and_every_guide_exists():
    for guide in GUIDES:
        assert (ROOT / guide).is_file() and (guide == "README.md" or f"`{guide}`" in README), guide
