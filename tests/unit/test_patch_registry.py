"""Every replacement or private read of another library is declared in compat/registry.py (no TensorFlow here).

The scan reads entrypoint/'s source: an attribute set on anything but `self`, `cls` or distrain's own objects,
`setattr`/`delattr`/`object.__setattr__`, `sys.modules` and `sys.meta_path` changes, and a private attribute read
of another object (`x._y`, `getattr(x, "_y")`) must sit in a function that carries `# patch: <entry>`, and every
marker and entry must name the other. A `registry.replace("<entry>", ...)` call names its entries itself (the
one place the replacement is set is registry.replace, which sets only a target its entry declares)."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import types
from pathlib import Path

import pytest

from entrypoint.compat import patches, registry

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "entrypoint"
MARKER = re.compile(r"#.*?\bpatch: ([\w.]+)")
# distrain's own objects (its state, its logger, the tf.data options it makes, its thread-local flags, the package)
# and the public os._exit
OWN_ROOTS = {"self", "cls", "progress", "run", "_THIS_PROCESS", "_STOP", "_IN_STEP", "flag", "_LOGGER", "options",
             "inside", "_saving", "distrain"}
# model.stop_training: how Keras documents that a callback ends fit (the agreed stop sets it as one would)
ALLOWED = {"os._exit", "sys.argv", "model.stop_training"}


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _own(base: ast.AST) -> bool:
    return _root(base) in OWN_ROOTS


def _private(name: str) -> bool:
    """Another library's private name; distrain's own markers on its objects (`_distrain_*`) are read freely
    (setting one is flagged as any attribute set is)."""
    return name.startswith("_") and not name.startswith(("__", "_distrain"))


def _flagged(tree: ast.AST) -> list[ast.AST]:
    """The nodes that replace, wrap or privately read another library's attribute."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            if isinstance(target, ast.Attribute) and not _own(target.value) and ast.unparse(target) not in ALLOWED:
                found.append(target)
            if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules":
                found.append(target)
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            first = node.args[0] if node.args else None
            if name in ("setattr", "delattr") and first is not None and not _own(first):
                found.append(node)
            if name in ("object.__setattr__", "object.__delattr__", "sys.meta_path.insert", "sys.meta_path.append"):
                found.append(node)
            if name in ("getattr", "hasattr") and len(node.args) >= 2 and first is not None and not _own(first):
                attribute = node.args[1]
                if isinstance(attribute, ast.Constant) and _private(str(attribute.value)):
                    found.append(node)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr) \
                and not _own(node.value) and ast.unparse(node) not in ALLOWED:
            found.append(node)
    return found


def _scopes(tree: ast.AST) -> list[tuple[int, int]]:
    """(first line, last line) of every function, decorators included."""
    return [(min([n.lineno, *[d.lineno for d in n.decorator_list]]), n.end_lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _markers(source: str) -> dict[int, str]:
    comments = (t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT)
    return {t.start[0]: m[1] for t in comments if (m := MARKER.search(t.string))}


def _replaced(source: str) -> set[str]:
    """The entries `registry.replace` calls name (a constant, or a tuple of them)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "registry.replace" and node.args:
            first = node.args[0]
            names |= {ast.literal_eval(first)} if isinstance(first, ast.Constant) else set(ast.literal_eval(first)) \
                if isinstance(first, ast.Tuple) else set()
            assert names, f"registry.replace's entries must be spelled in the call: {ast.unparse(node)}"
    return names


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(PACKAGE.rglob("*.py")) if p.name != "registry.py"]


def undeclared(source: str) -> list[str]:
    """'line: code' of each patch or private read in `source` whose function carries no marker."""
    tree = ast.parse(source)
    markers, scopes, found = _markers(source), _scopes(tree), []
    for node in _flagged(tree):
        inside = [s for s in scopes if s[0] <= node.lineno <= s[1]]
        first, last = max(inside) if inside else (node.lineno - 1, node.lineno)  # the innermost function
        if not any(first <= line <= last for line in markers):
            found.append(f"{node.lineno}: {ast.unparse(node)[:70]}")
    return found


def test_every_patch_and_private_read_is_in_a_function_that_names_its_registry_entry():
    missing = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path, source in _sources()
               for line in undeclared(source)]
    assert not missing, "declare these in compat/registry.py and mark them `# patch: <name>`:\n" + "\n".join(missing)


def test_negative_control_the_scan_finds_each_kind_of_patch_left_unmarked():
    source = """
import keras, sys

def hook(model, tf):
    keras.Model.fit = lambda self: None
    setattr(tf.config, "list_physical_devices", None)
    object.__setattr__(model, "train_function", None)
    sys.modules["keras"] = None
    return model._steps_per_execution, getattr(model, "_private", None), model._distrain_marker

def marked(model):
    # patch: runner.model_hooks
    keras.Model.fit = None

def own(self, progress):
    self.x, progress.step = 1, 2
"""
    lines = sorted(line.split(":")[0] for line in undeclared(source))
    assert lines == ["5", "6", "7", "8", "9", "9"], undeclared(source)


def test_every_marker_names_an_entry_and_every_entry_is_marked_where_it_is_made():
    marked = {(path.name, name) for path, source in _sources()
              for name in [*_markers(source).values(), *_replaced(source)]}
    unknown = sorted(name for _, name in marked if name not in registry.BY_NAME)
    assert not unknown, f"markers without a registry entry: {unknown}"
    unmarked = sorted(set(registry.BY_NAME) - {name for _, name in marked})
    assert not unmarked, f"registry entries no code marks: {unmarked}"


def test_every_private_name_a_marked_function_reads_is_among_its_entries_targets():
    """What is read is what the registry checks: `x._y` under `# patch: e` needs `_y` among e's targets (an
    instance's attribute spelled `module:Class()._y`, checked against the class's own code)."""
    undeclared_reads = []
    for path, source in _sources():
        tree, markers = ast.parse(source), _markers(source)
        scopes = _scopes(tree)
        for node in _flagged(tree):
            name = node.attr if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) else \
                node.args[1].value if isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") \
                and isinstance(node.args[1], ast.Constant) else None
            if not name or not _private(str(name)):
                continue
            inside = [s for s in scopes if s[0] <= node.lineno <= s[1]]
            first, last = max(inside) if inside else (node.lineno - 1, node.lineno)
            entries = [entry for line, entry in markers.items() if first <= line <= last and entry in registry.BY_NAME]
            declared = " ".join(t for entry in entries for t in registry.BY_NAME[entry].targets)
            if entries and not re.search(rf"[.:(]{re.escape(name)}\b", declared):
                undeclared_reads.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name} ({entries})")
    assert not undeclared_reads, "add these to their entries' targets:\n" + "\n".join(undeclared_reads)


def test_every_entry_says_what_why_how_long_and_which_versions():
    for patch in registry.PATCHES:
        assert patch.kind in ("replaces", "wraps", "reads") and patch.lifetime in ("process", "fit", "call",
                                                                                  "instance"), patch
        assert patch.what and patch.why and patch.targets and patch.library in registry.PROVEN, patch
        assert all(":" in target for target in patch.targets), patch


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in library: `fake_lib.Trainer.step(self, batch, logs)` and `fake_lib.reduce(values, strategy)`."""
    module = types.ModuleType("fake_lib")

    class Trainer:
        def step(self, batch, logs):  # noqa: ANN001, ANN202
            return batch, logs

    module.Trainer = Trainer
    module.reduce = lambda values, strategy: values
    monkeypatch.setitem(sys.modules, "fake_lib", module)
    return module


def test_a_target_that_moved_or_changed_its_parameters_is_named(library):
    assert registry._check_one("fake_lib:Trainer.step(self,batch)", "keras3") is None
    assert registry._check_one("fake_lib:reduce(values,strategy)", "keras3") is None
    assert "has no attribute 'fit'" in registry._check_one("fake_lib:Trainer.fit", "keras3")
    assert "takes (values, strategy), not (values, axis)" in registry._check_one("fake_lib:reduce(values,axis)",
                                                                                "keras3")
    assert "No module named" in registry._check_one("missing_lib:x", "keras3")


def test_alternatives_and_optional_targets(library):
    assert registry._check_one("fake_lib:OldTrainer.step|fake_lib:Trainer.step(self,batch)", "keras3") is None
    assert registry._check_one("fake_lib:Trainer.gone?", "keras3") is None  # absent: the fix does nothing
    # present but not the one distrain knows: an optional target is still checked
    assert "not (self, x)" in registry._check_one("fake_lib:Trainer.step(self,x)?", "keras3")


def test_replace_sets_a_declared_target_once_and_refuses_an_undeclared_one(library, monkeypatch):
    entry = patches._p("test.reduce", "a test's patch", "wraps", "process", "a test",
                       ("fake_lib:Gone.reduce|fake_lib:reduce(values,strategy)",), "keras")
    monkeypatch.setitem(registry.BY_NAME, "test.reduce", entry)
    original = library.reduce
    found = registry.replace("test.reduce", "fake_lib:reduce", lambda f: lambda values, strategy: ("wrapped", f))
    assert found is not None and library.reduce(1, 2) == ("wrapped", original)
    registry.replace("test.reduce", "fake_lib:reduce", lambda f: lambda values, strategy: ("twice", f))
    assert library.reduce(1, 2) == ("wrapped", original)  # once a process
    assert registry.replace("test.reduce", "fake_lib:Gone.reduce", lambda f: f) is None  # absent here
    with pytest.raises(AssertionError, match="among the targets of none"):
        registry.replace("test.reduce", "fake_lib:Trainer.step", lambda f: f)
    assert library.Trainer.step(None, 1, 2) == (1, 2)


def test_a_run_whose_target_moved_is_refused_in_one_line_naming_the_library(library, monkeypatch):
    moved = patches._p("test.moved", "a test's patch", "wraps", "process", "a test", ("fake_lib:Trainer.fit",),
                        "horovod")
    monkeypatch.setattr(registry, "PATCHES", (*registry.PATCHES, moved))
    monkeypatch.setattr(registry, "library_version", lambda library: "9.9")
    monkeypatch.setattr(registry, "check", lambda patch, family: "moved" if patch is moved else None)
    with pytest.raises(registry.EnvironmentProblem) as refused:
        registry.verify("keras3", "single")
    message = str(refused.value)
    assert message.startswith("Horovod 9.9: moved: distrain's test.moved") and "\n" not in message, message
    assert "install a version distrain was proven with (Horovod 0.28.1" in message


def test_a_keras_entry_that_moved_under_tf_keras_names_tf_keras(monkeypatch):
    """runner.model_hooks' targets are tf_keras' under tf_keras: its refusal names tf_keras and its version, and
    does not advise DISTRAIN_KERAS=legacy (the run is on it already)."""
    monkeypatch.setattr(registry, "library_version", lambda library: f"{library}-9.9")
    message = str(registry.refusal(registry.BY_NAME["runner.model_hooks"], "moved", "legacy"))
    assert message.startswith("tf_keras tf_keras-9.9: moved: distrain's runner.model_hooks"), message
    assert "DISTRAIN_KERAS" not in message and "tf_keras 2.17.0, 2.21.0" in message, message
    keras3 = str(registry.refusal(registry.BY_NAME["runner.model_hooks"], "moved", "keras3"))
    assert keras3.startswith("Keras keras-9.9: moved") and "DISTRAIN_KERAS=legacy" in keras3, keras3
