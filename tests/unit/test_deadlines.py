"""Tests that cannot hang: every subprocess a test waits on has a deadline (`timeout=`), and a process started to
run beside the test goes through `helpers.Watched` (its own session, its output read by a thread, every wait with a
deadline), not a bare `Popen` whose pipes nobody reads. Scripts the tests run (`*/scripts/`) are the users'."""

import ast
from pathlib import Path

from helpers import ROOT

WAITS = {"run", "check_output", "call", "check_call"}
POPEN_ALLOWED = {"tests/helpers.py"}  # Watched itself


def undeadlined(source: str, path: str = "") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"):
            continue
        if node.func.attr in WAITS and not any(k.arg == "timeout" for k in node.keywords):
            found.append(f"{path}:{node.lineno}: subprocess.{node.func.attr} without timeout=")
        if node.func.attr == "Popen" and path not in POPEN_ALLOWED:
            found.append(f"{path}:{node.lineno}: subprocess.Popen (use helpers.Watched)")
    return found


def test_every_wait_on_a_process_has_a_deadline():
    tests = [p for p in sorted((ROOT / "tests").rglob("*.py")) if "scripts" not in p.relative_to(ROOT).parts]
    found = [line for p in tests for line in undeadlined(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, found


def test_the_scan_finds_a_wait_without_a_deadline_and_a_bare_popen_negative_control():
    source = ("import subprocess\nsubprocess.run(['x'])\nsubprocess.run(['x'], timeout=3)\n"
              "subprocess.check_output(['x'])\nsubprocess.Popen(['x'])\n")
    assert [line.split(": ", 1)[1] for line in undeadlined(source, "t.py")] == [
        "subprocess.run without timeout=", "subprocess.check_output without timeout=",
        "subprocess.Popen (use helpers.Watched)"]
    assert Path(ROOT / "tests" / "helpers.py").read_text().count("subprocess.Popen(") == 1
