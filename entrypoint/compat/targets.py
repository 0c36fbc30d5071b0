"""Where a replaced function lives, from its spelling: `module:function` or `module:Class.method`, `a|b` where one
version of a library has it in one place and another in the other (KerasFamily's fields, registry.py's entries).

One reading of that spelling for the registry's check (the object, to compare its parameters) and for the modules
that replace it (its owner and attribute name, to set): what the check proved is what gets replaced.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Target(NamedTuple):
    owner: Any  # the module or class that holds it
    attribute: str
    is_method: bool  # `module:Class.method`, not `module:function`


def resolve(module_name: str, qualified: str) -> Target:
    """The owner of `module_name:qualified` and its last name; ImportError or AttributeError where it is not there."""
    owner_path, _, attribute = qualified.rpartition(".")
    owner: Any = importlib.import_module(module_name)
    for part in owner_path.split(".") if owner_path else []:
        owner = getattr(owner, part)
    getattr(owner, attribute)
    return Target(owner, attribute, bool(owner_path))


def first(spelled: str) -> Target | None:
    """The first alternative of `spelled` that exists in this process (its parameters, in parentheses, ignored)."""
    for alternative in spelled.split("|"):
        module_name, _, qualified = alternative.split("(")[0].partition(":")
        try:
            return resolve(module_name, qualified)
        except (ImportError, AttributeError):
            continue
    return None
