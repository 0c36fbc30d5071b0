"""What differs between the modes lives in the engines (entrypoint/engines/) and the Plan's decisions: the rest
of the package asks the engine, not the mode. A scan counts the places outside them that still compare the mode
(`plan.mode == "mwm"`, `mode in (...)`), reach for Horovod's module (`engine.hvd`) or tell a strategy's mode by
`engine.strategy is None`; at most MAX_OUTSIDE (issue #86)."""

from __future__ import annotations

import ast

from helpers import ROOT

PACKAGE = ROOT / "entrypoint"
MODES = {"single", "mirrored", "mwm", "horovod"}
# the engines, and the Plan's decisions of the mode, its ranks and devices, and a job file's mode
DECIDE = ("engines/", "plan.py", "world.py", "gpus.py", "job_files.py")
MAX_OUTSIDE = 12


def _names_the_mode(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "mode"
    if isinstance(node, ast.Name):
        return node.id == "mode"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "mode")


def _a_mode(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and n.value in MODES for n in ast.walk(node))


def _the_engines(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine")


def mode_comparisons(source: str) -> list[int]:
    """The lines of `source` that compare the mode, reach for `engine.hvd` or test `engine.strategy` for None."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names_a_mode = any(_names_the_mode(s) for s in sides) and any(_a_mode(s) for s in sides)
            strategy_or_none = any(isinstance(s, ast.Attribute) and s.attr == "strategy" and _the_engines(s.value)
                                   for s in sides) and any(isinstance(s, ast.Constant) and s.value is None
                                                           for s in sides)
            if names_a_mode or strategy_or_none:
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "hvd" and _the_engines(node.value):
            lines.append(node.lineno)
    return sorted(set(lines))


def outside_the_engines() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(DECIDE):
            continue
        found += [f"entrypoint/{relative}:{line}" for line in mode_comparisons(path.read_text())]
    return found


def test_the_scan_finds_each_spelling_of_a_mode_comparison_negative_control() -> None:
    source = '''
if plan.mode == "mwm": pass
if mode in ("single", "mirrored"): pass
if result.get("mode") != "horovod": pass
if engine.hvd is not None: pass
if self.engine.strategy is None: pass
if plan.size > 1 and plan.family.horovod_keras_api: pass
if model.strategy is None: pass
'''
    assert mode_comparisons(source) == [2, 3, 4, 5, 6]


def test_the_modes_are_compared_in_the_engines_and_the_plan_not_across_the_package() -> None:
    found = outside_the_engines()
    assert len(found) <= MAX_OUTSIDE, "mode comparisons outside engines/ and the Plan's modules " \
        f"({len(found)}, at most {MAX_OUTSIDE}): ask the engine instead\n" + "\n".join(found)
