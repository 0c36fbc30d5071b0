"""The check of every replacement, wrapper and private read of another library that distrain makes (the table:
compat/patches.py), and the one way a function of another library is replaced (`replace`).

Upstream internals move every release. `verify` checks the entries a run will use, once the libraries are imported
and before the script runs: a target that is not the one distrain knows refuses the run with one line naming the
library and its version, never a wrong result later. `distrain doctor` shows every entry's state (`report`).
`replace` sets only a target its entry declares, so what is replaced is what was checked.

The code that patches calls `replace(<name>, ...)` or carries `# patch: <name>` in the function that does it;
tests/unit/test_patch_registry.py fails on a replacement or private read with neither, and on a marker or entry
without the other.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import EnvironmentProblem
from ..keras_family import FAMILIES, KERAS3, installed_versions
from . import targets
from .patches import ALL_MODES, BY_NAME, PATCHES, PROVEN, Patch

_NAMES = {"tensorflow": "TensorFlow", "keras": "Keras", "tf_keras": "tf_keras", "horovod": "Horovod",
          "python": "Python"}

__all__ = ["ALL_MODES", "BY_NAME", "PATCHES", "PROVEN", "Patch", "check", "moved", "replace", "replaced", "report",
           "verify"]
_REPLACED_BY = "_distrain_replaced_by"  # on a replacement: its entry's name (a second install finds it there)


def _names(spelled: str) -> set[str]:
    """The targets `spelled` names, without parameters, a tf_keras module spelled as the table does (`keras.`)."""
    return {alternative.split("(")[0].removeprefix("tf_") for alternative in spelled.rstrip("?").split("|")}


def _declared(entries: str | tuple[str, ...], spelled: str) -> str:
    """The entry among `entries` (one per Keras family) whose targets include `spelled`: distrain's own bug
    otherwise, said before anything is replaced."""
    names = (entries,) if isinstance(entries, str) else entries
    entry = next((name for name in names
                  if _names(spelled) <= set().union(*(_names(t) for t in BY_NAME[name].targets))), None)
    if entry is None:
        raise AssertionError(f"{spelled} is among the targets of none of {names}: declare it in compat/patches.py")
    return entry


def replace(entries: str | tuple[str, ...], spelled: str, make: Callable[[Any], Any]) -> targets.Target | None:
    """Set the first alternative of `spelled` that exists here to `make(original)`, once a process; None where
    none exists (verify has refused a library that should have it). `spelled` must be among the targets of the
    entry (of one of the `entries`)."""
    entry = _declared(entries, spelled)
    found = targets.first(spelled)
    if found is None:
        return None
    original = getattr(found.owner, found.attribute)
    if getattr(original, _REPLACED_BY, None) != entry:
        replacement = make(original)
        setattr(replacement, _REPLACED_BY, entry)
        setattr(found.owner, found.attribute, replacement)
    return found


@contextlib.contextmanager
def replaced(entry: str, spelled: str, replacement: Any = None,
             make: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """Within: the first alternative of `spelled` (among `entry`'s targets) is `replacement` (or `make(original)`);
    yields the original (None where no alternative exists, and nothing is replaced). A call's lifetime, on the
    calling thread's watch: no other thread should reach the target meanwhile."""
    _declared(entry, spelled)
    found = targets.first(spelled)
    if found is None:
        yield None
        return
    original = getattr(found.owner, found.attribute)
    setattr(found.owner, found.attribute, make(original) if make is not None else replacement)
    try:
        yield original
    finally:
        setattr(found.owner, found.attribute, original)


def _resolve(spec: str, family: str) -> tuple[Any, list[str]]:
    """The object a `module:qualified.name(params)` spec names, and the params it should start with."""
    path, _, params = spec.partition("(")
    module_name, _, qualname = path.partition(":")
    if module_name.split(".")[0] == KERAS3.module:  # the family's own Keras: tf_keras' under tf_keras
        module_name = FAMILIES[family].module + module_name[len(KERAS3.module):]
    owner, attribute, _ = targets.resolve(module_name, qualname)
    return getattr(owner, attribute), [p for p in params.rstrip(")").split(",") if p]


def _check_one(spec: str, family: str) -> str | None:
    """None if the target is there and takes the parameters named; else what is wrong."""
    optional, absent, changed = spec.endswith("?"), [], []
    for alternative in spec.rstrip("?").split("|"):
        name = alternative.split("(")[0]
        if "()." in alternative:  # an instance attribute: its class's own code sets it
            problem = _instance_attribute(alternative, family)
            if problem is None:
                return None
            absent.append(problem)
            continue
        try:
            found, params = _resolve(alternative, family)
        except (ImportError, AttributeError) as exc:
            absent.append(f"{name}: {exc}")
            continue
        try:
            actual = list(inspect.signature(found).parameters) if params else params
        except (TypeError, ValueError):
            actual = []
        if actual[:len(params)] == params:
            return None
        changed.append(f"{name} takes ({', '.join(actual)}), not ({', '.join(params)})")
    # an optional target may be absent (the fix then does nothing); one that is there must be the one known
    return "; ".join(changed) or (None if optional else "; ".join(absent))


def _instance_attribute(spec: str, family: str) -> str | None:
    """None where `module:Class().attribute`'s class, or a class it derives from, assigns `self.attribute` in
    its module's source (an instance's attribute exists only once made: its assignment is what can be checked);
    `module:function().attribute` where a function makes the class (Horovod's DistributedOptimizer)."""
    class_spec, _, attribute = spec.partition("().")
    try:
        cls, _ = _resolve(class_spec, family)
    except (ImportError, AttributeError) as exc:
        return f"{class_spec}: {exc}"
    # `self.a = `, `self.a: T = `, `self.b, self.a = `
    assigned = re.compile(rf"(self\.\w+\s*,\s*)*\bself\.{re.escape(attribute)}\b(\s*,\s*self\.\w+)*\s*(:[^=\n]+)?=[^=]")
    makers = inspect.getmro(cls) if inspect.isclass(cls) else (cls,)  # or the function that defines the class
    files = {inspect.getsourcefile(c) for c in makers if c.__module__ != "builtins"}
    if any(assigned.search(_source_text(path)) for path in files if path):
        return None
    return f"{class_spec} sets no attribute {attribute}"


@functools.cache
def _source_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def library_version(library: str) -> str:
    """The version of the module this process imported (a copy on PYTHONPATH may not be the installed
    distribution), else the installed distribution's, under any of its names (keras, keras-nightly)."""
    if library == "python":
        import platform

        return platform.python_version()
    module = sys.modules.get(library)
    if getattr(module, "__version__", None):
        return str(module.__version__)
    known = installed_versions().get(library)  # tensorflow, keras, tf_keras under any distribution name
    return known or str(getattr(importlib.import_module(library), "__version__", "?"))


def installed(library: str) -> bool:
    return library == "python" or importlib.util.find_spec(library) is not None


def check(patch: Patch, family: str) -> str | None:
    """None where every target of `patch` is the one distrain knows (under `family`'s Keras); else why not."""
    problems = [problem for spec in patch.targets if (problem := _check_one(spec, family))]
    return "; ".join(problems) or None


def moved(family: str, mode: str) -> Iterator[EnvironmentProblem]:
    """The refusal of each entry a run in `mode` on `family` uses whose target is not the one distrain knows
    (entries of a library not installed here are left to the run that needs it)."""
    used = [p for p in PATCHES if p.applies(family, mode) and installed(p.library_for(family))]
    for patch in used:
        if (problem := check(patch, family)) is not None:
            yield refusal(patch, problem, family)


def verify(family: str, mode: str) -> None:
    """Raise the first refusal (one line) among the entries a run in `mode` on `family` uses."""
    for problem in moved(family, mode):
        raise problem


def refusal(patch: Patch, problem: str, family: str) -> EnvironmentProblem:
    library = patch.library_for(family)
    name = _NAMES[library]
    instead = "use DISTRAIN_KERAS=legacy (tf_keras), or a Keras" if library == "keras" else "install a version"
    return EnvironmentProblem(
        f"{name} {library_version(library)}: {problem}: distrain's {patch.name} ({patch.what}) cannot work "
        f"with it: {instead} distrain was proven with ({name} {PROVEN[library]}; `distrain doctor` lists "
        "every patch)")


def report() -> list[str]:
    """One line per entry and Keras family installed here: ok, MOVED (and what), or not installed."""
    families = [f.name for f in FAMILIES.values() if installed(f.module)]
    lines = []
    for patch in PATCHES:
        modes = "all modes" if patch.modes == ALL_MODES else "/".join(sorted(patch.modes))
        for family in sorted(patch.families & set(families)) or sorted(patch.families):
            if family not in families or not installed(patch.library_for(family)):
                state = "not installed"
            else:
                state = "ok" if (problem := check(patch, family)) is None else f"MOVED: {problem}"
            lines.append(f"{patch.name:34} {family:7} {patch.kind:8} {patch.lifetime:8} {modes:12} {state}")
    return lines
