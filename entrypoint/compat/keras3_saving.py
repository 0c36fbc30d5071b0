"""Keras 3's saving and loading under MultiWorkerMirroredStrategy: the same collectives on every worker.

To know which attributes of a model, optimizer or metric to walk, Keras 3 builds throwaway reference objects
(`saving_lib.get_attr_skiplist`, `get_attr_skipset` in later 3.x): `Optimizer(1.0)` has two variables, and under
MWM every variable's initial value is a broadcast, one collective key each from a counter every worker must
advance alike. Keras 3.3 builds them once per process (until `clear_session()`), at the process's first save or
load. Under distrain the chief saves (plainly, `adopt.local_reads`) and the other workers only load what it wrote:
their first `load_model` then creates two variables the chief does not, and from there every collective pairs
with another one: "Collective instance 279 expected ... data type 9 but got ... data type 1" (an int64 variable met
a float32 one), or, where the two have the same shape and type, an initial value from the wrong variable. The
reference objects are made with plain variables here, on every rank alike, in saves and loads.
"""

from __future__ import annotations

import functools
from typing import Any

from . import adopt, registry

SAVING_LIB = "keras.src.saving.saving_lib"
REFERENCE_BUILDERS = ("get_attr_skiplist", "get_attr_skipset")  # its name in Keras 3.3, in Keras 3.15


def apply(tf: Any) -> list[str]:
    """Make the reference objects' variables plain; the fixes' names (none where Keras builds no such object)."""
    return [f"saving's reference objects with plain variables ({name})" for name in REFERENCE_BUILDERS
            if registry.replace("keras3_saving.plain_reference_objects", f"{SAVING_LIB}:{name}",
                                lambda builder: _with_plain_variables(builder, tf))]


def _with_plain_variables(builder: Any, tf: Any) -> Any:
    @functools.wraps(builder)
    def plain_reference_objects(obj_type: str) -> Any:
        with adopt.plain_variables(tf):
            return builder(obj_type)

    return plain_reference_objects
