"""The package's layers, bottom to top: a module imports only from its own layer or below, and no two modules
import each other, directly or around a circle (function-level imports count too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "entrypoint"
LAYERS = [  # bottom to top; a module's layer is that of the longest prefix naming it
    ("base", ["errors", "log", "startup_stop", "descendants"]),
    ("decision", ["settings", "workdirs", "slurm", "runs", "ports", "gpus", "world", "keras_family", "plan",
                  "devices", "peers", "endings", "container_paths",
                  "user_site", "one_process_loops", "job_files"]),
    ("setup", ["engines", "compat", "runtime", "packages"]),
    ("inside fit", ["fit"]),
    ("the run", ["runner", "restarts", "launcher"]),
    ("commands and tools", ["commands", "runs_view", "tools"]),
    ("entry", ["__init__", "console", "cli", "__main__"]),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports, anywhere in it."""
    name = module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".") if name != "__init__" else []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("entrypoint"):
                target = node.module.removeprefix("entrypoint").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in modules else target or "__init__")
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("entrypoint.") for a in node.names if a.name.startswith("entrypoint.")}
    return {m for m in found if m in modules and m != name}


def layer(module: str) -> int:
    best = max(((len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), default=None)
    assert best is not None, f"entrypoint.{module} is in no layer: add it to LAYERS"
    return best[1]


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Upward imports and import circles."""
    found = [f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]}): upward" for a in sorted(graph)
             for b in sorted(graph[a]) if layer(b) > layer(a)]
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append("circle: " + " -> ".join(path[path.index(nxt):] + [node, nxt]))
            elif not state.get(nxt):
                visit(nxt, path + [node] if nxt not in path else path)
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [])
    return found


def package_graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports(p, modules) for p in files}


def test_the_package_imports_only_downward_and_in_no_circle():
    graph = package_graph()
    assert {"plan", "runner", "fit.checkpoint", "tools.selftest", "cli"} <= set(graph)
    assert "runs" in graph["plan"] and "commands" in graph["cli"]  # the graph is really read
    assert violations(graph) == []


def test_the_check_finds_an_upward_import_and_a_circle_negative_control():
    graph = package_graph()
    graph["plan"] = graph["plan"] | {"runner"}  # a decision that reaches up into the run
    graph["commands"] = graph["commands"] | {"console"}  # console -> commands -> console
    found = violations(graph)
    assert any(v.startswith("plan (decision) imports runner (the run): upward") for v in found), found
    assert any(v.startswith("circle:") and "console" in v for v in found), found


MAX_FUNCTION_LINES = 60  # one decision long; a nested class or function counts toward the one that holds it


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function of `source` longer than MAX_FUNCTION_LINES, methods included."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((child.name, lines))
            elif isinstance(child, ast.ClassDef):
                visit(child)

    visit(ast.parse(source))
    return found


def test_no_function_in_the_package_is_over_60_lines():
    too_long = {f"{path.relative_to(ROOT)}:{name}": lines for path in sorted(PACKAGE.rglob("*.py"))
                for name, lines in long_functions(path.read_text())}
    assert not too_long, too_long


def test_the_length_check_counts_a_nested_class_negative_control():
    nested = "def outer():\n    class Inner:\n" + "".join(f"        x{i} = {i}\n" for i in range(60))
    assert long_functions(nested) == [("outer", 62)]


# the family's name spelled, or compared through its constant (`family == TF_KERAS.name`); `X.module`, the package
# a target lives in, is not the family's name
FAMILY_NAMES = re.compile(r"""["'](keras3|legacy)["']"""
                          r"|\b(KERAS3|TF_KERAS)\.name\b\s*[!=]=|[!=]=\s*(KERAS3|TF_KERAS)\.name\b")


def test_the_keras_family_is_named_only_where_the_plan_decides_it():
    """One Keras seam: plan.py chooses the family, keras_family.py says what differs; everything else reads
    `plan.family`'s named differences, never compares the family's name."""
    named = [f"{path.relative_to(ROOT)}:{number}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.name not in ("plan.py", "keras_family.py")  # the Plan's value, chosen there
             for number, line in enumerate(path.read_text().splitlines(), 1) if FAMILY_NAMES.search(line)]
    assert not named, named


# plan.py reads the settings; the modules detect calls with the environment it was given (world.py: the ranks,
# gpus.py, keras_family.py: the family, slurm.py: the step, runs.py: the run's identity, workdirs.py: the output
# root, settings.py: how a value is read) belong to it. The rest, each with its reason:
SETTINGS_READERS = {"plan.py", "slurm.py", "runs.py", "workdirs.py", "world.py", "gpus.py", "keras_family.py",
                    "settings.py"}
SETTINGS_EXCEPTIONS = {
    "tools/selftest.py": "SLURM_NTASKS of an allocation the self-test judges from its rows (selftest.job)",
    "tools/selftest_train.py": "DISTRAIN_SELFTEST_FAULT: the self-test's negative control, read by its worker only",
    "runs_view.py": "DISTRAIN_QUEUED_JOBS: the host's squeue list that bin/distrain hands the image (no Plan made)",
    "tools/images.py": "DISTRAIN_HOME, DISTRAIN: where the checkout is, for `image build` (no Plan made)",
    "job_files.py": "DISTRAIN_HOME, DISTRAIN: where the job files are, for `plan --job-name` (not this Plan's)",
}
def setting_reads(source: str) -> list[int]:
    """Lines that read a DISTRAIN_* or SLURM_* variable: `x.get("NAME")`, `getenv("NAME")`, `x["NAME"]` (a load)."""
    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
            node.value.startswith(("DISTRAIN_", "SLURM_", "SLURMD_"))

    def reads(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr in ("get", "getenv") and bool(node.args) and named(node.args[0])
        return isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and named(node.slice)

    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if reads(node))


def test_settings_are_read_in_the_plan():
    """Every DISTRAIN_* and SLURM_* variable is read where the Plan is made (or by an exception named above)."""
    outside = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
               if path.name not in SETTINGS_READERS and str(path.relative_to(PACKAGE)) not in SETTINGS_EXCEPTIONS
               for line in setting_reads(path.read_text())]
    assert not outside, outside


def test_the_settings_scan_finds_each_way_of_reading_negative_control():
    source = 'import os\nos.environ.get("DISTRAIN_X")\nos.getenv("SLURM_Y")\nenv["DISTRAIN_Z"]\n' \
             'env["DISTRAIN_W"] = "1"\n'
    assert setting_reads(source) == [2, 3, 4]
