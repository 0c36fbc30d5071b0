"""The README is a user guide a user reads in minutes, and every command in it works as written: each block is
executed by a test (or tagged as needing a GPU, or as output), and every command and variable it names exists."""

import re
from pathlib import Path

from entrypoint.console import COMMANDS, HIDDEN_COMMANDS
from helpers import ROOT

README = (ROOT / "README.md").read_text()
MAX_LINES = 450  # issue #53: later issues keep it so
NOT_EXECUTED = {"needs:gpu": "a GPU node (the admins' selftest there is the proof)", "output": "a log line shown"}
BY_CI = {"develop"}  # scripts/install.sh and scripts/test.sh: what .ci/run runs


def test_the_readme_is_short_enough_to_read_in_minutes():
    assert len(README.splitlines()) <= MAX_LINES, "benchmarks go to benchmarks/README.md, details to docs/"


def test_every_block_is_executed_by_a_test_or_says_why_not():
    tags = re.findall(r"^(.*)\n```", README, re.MULTILINE)[::2]  # the line before each block's opening fence
    tests = "\n".join(p.read_text() for p in Path(ROOT / "tests").rglob("*.py"))
    for tag in tags:
        found = re.fullmatch(r"<!-- (test:([\w-]+)|[\w:]+) -->", tag)
        assert found, f"a README block without a tag (<!-- test:NAME -->, <!-- needs:gpu -->, <!-- output -->): {tag}"
        name = found.group(2)
        if name:
            assert name in BY_CI or f'block("{name}")' in tests, f"no test runs the README block test:{name}"
        else:
            assert found.group(1) in NOT_EXECUTED, tag


def test_every_command_and_variable_the_readme_names_exists():
    blocks = re.findall(r"```\w*\n(.*?)```", README, re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```\w*\n.*?```", "", README, flags=re.DOTALL))
    commands = [line.split(" #")[0].strip() for text in blocks + inline for line in text.splitlines()]
    named = {m.group(1) for c in commands for m in [re.match(r"(?:[\w./~-]*/)?distrain ([a-z][\w-]*)(?![\w:.-])", c)]
             if m}
    known = set(COMMANDS + HIDDEN_COMMANDS) | {"runz"}  # runz: the README's example of a mistyped command
    assert named and named <= known, named - known
    sources = "\n".join(p.read_text() for folder in ("entrypoint", "jobs", "scripts") for p in
                        (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".job", ""))
    variables = set(re.findall(r"\bDISTRAIN_[A-Z_]+[A-Z]\b", README))
    missing = {v for v in variables if v not in sources}
    assert variables and not missing, missing
