"""Whether a script's callback can set `model.stop_training` from its batch hooks, read from its compiled code.

Under several ranks, a stop one rank takes in a batch hook is taken by all at that step (stopping.py): one small
all-reduce after every step, a collective of its own. Under zero-code Horovod that round cost 17 % of the
throughput where the script's callback only timed its steps (#87: 2,290 images/s against 2,830 by hand, two
ranks on a 2-vCPU VM; without the round, the same as by hand). A callback whose code never reaches the name needs
no such round: a timer, a logger, a progress line.

The code is read as Python compiled it: the names used by the callback class's own methods (its bases' below
Keras' Callback), by every nested function and lambda in them, and by every function, class or module of the
script's own those names lead to through the functions' globals and closures; and the methods of the script's
own classes (its module's, as a custom Model's `halt()` that `self.model.halt()` calls) whose names that code
uses, but for dunder names (`super().__init__()` would tie every class to every other; a class the code names is
read whole anyway). A LambdaCallback's functions are read the same way. The callback can stop training where any
of that code names `stop_training`, sets attributes by a computed name (`setattr`, `__setattr__`, `__dict__`,
`vars`, `exec`, `eval`), or cannot be read (more than `MAX_REACHED` objects: a large library's callback).
Keras', TensorFlow's, Horovod's, distrain's and the standard library's own code (by where its module lives) is
not followed: it sets `stop_training` only in the callbacks stopping.py names.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from collections.abc import Iterator
from typing import Any

SETS_IT = frozenset({"stop_training", "setattr", "__setattr__", "__dict__", "vars", "exec", "eval"})
LIBRARIES = frozenset({"keras", "tf_keras", "tensorflow", "horovod", "numpy", "entrypoint"})
MAX_REACHED = 400  # objects followed before the answer is "it can": a large library's callback
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])


def can_stop_training(callback_class: type, base: type) -> bool:
    """Whether code reached from `callback_class` (a subclass of Keras' Callback, `base`) can set stop_training."""
    return _reaches([c for c in callback_class.__mro__ if c not in base.__mro__], callback_class)


def lambdas_can_stop_training(callback: Any) -> bool:
    """Whether a LambdaCallback's functions (its instance's own hooks) can set stop_training; a hook that is no
    Python function (a builtin, another callable) is taken to be able to."""
    hooks = [value for name, value in vars(callback).items() if name.startswith("on_") and callable(value)]
    functions = [getattr(hook, "__func__", hook) for hook in hooks]
    if not all(isinstance(f, types.FunctionType) for f in functions):
        return True
    return _reaches(functions, functions[0]) if functions else False


def _reaches(roots: list[Any], home: Any) -> bool:
    """Whether code reached from `roots` names stop_training (see the module doc); `home`: what the script's own
    classes are looked up beside (its module's namespace)."""
    own_classes = [c for c in _module_namespace(home) if isinstance(c, type) and not _is_library(c)]
    todo = list(roots)
    seen: set[int] = set()
    while todo:
        item = todo.pop()
        if id(item) in seen or _is_library(item):
            continue
        seen.add(id(item))
        if len(seen) > MAX_REACHED:
            return True
        if isinstance(item, type):
            todo += [f for member in vars(item).values() for f in _functions_of(member)]
        elif isinstance(item, types.ModuleType):
            todo += [v for v in vars(item).values() if isinstance(v, (types.FunctionType, type))]
        elif isinstance(item, types.FunctionType):
            names = set(_names(item.__code__))
            if names & SETS_IT:
                return True
            todo += _followed(item, names)  # each function's own globals: a name may mean another thing
            todo += [f for c in own_classes for name, member in vars(c).items()
                     if name in names and not name.startswith("__") for f in _functions_of(member)]
    return False


def _followed(function: types.FunctionType, names: set[str]) -> list[Any]:
    """The functions, classes and modules `function`'s names lead to: its globals', its closure's."""
    found = [function.__globals__.get(name) for name in names]
    for cell in function.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # an empty cell: the closure's variable not yet assigned
            continue
    return [f for f in found if isinstance(f, (types.FunctionType, type, types.ModuleType))]


def _names(code: types.CodeType) -> Iterator[str]:
    """Every global and attribute name `code` and the code nested in it use, and its string constants."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names(constant)
        elif isinstance(constant, str):
            yield constant


def _functions_of(member: Any) -> list[types.FunctionType]:
    """The plain functions behind a class member: a method's, a static or class method's, a property's."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    found = [member.fget, member.fset, member.fdel] if isinstance(member, property) else [member]
    return [f for f in found if isinstance(f, types.FunctionType)]


def _module_namespace(item: Any) -> list[Any]:
    module = sys.modules.get(getattr(item, "__module__", "") or "")
    return list(vars(module).values()) if module is not None else []


def _is_library(item: Any) -> bool:
    """Code distrain does not follow: Keras', TensorFlow's, Horovod's, numpy's, its own, the standard library's
    (by where its module lives: a script's own `trace.py` or `test.py` is the script's)."""
    name = item.__name__ if isinstance(item, types.ModuleType) else getattr(item, "__module__", None) or ""
    top = name.split(".")[0]
    if top in LIBRARIES:
        return True
    if top not in sys.stdlib_module_names:
        return False
    module = item if isinstance(item, types.ModuleType) else sys.modules.get(name)
    where = getattr(module, "__file__", None)
    return where is None or os.path.realpath(where).startswith(_STDLIB)
