"""The state of the script's Keras callbacks that decides its run, kept with every checkpoint.

EarlyStopping and ReduceLROnPlateau count epochs without improvement (`wait`, `best`, a cooldown), and
ModelCheckpoint(save_best_only=True) remembers the best value; a resumed fit would start them from scratch and
stop, lower the learning rate or save at another epoch than the run never stopped. Their counters are written
beside each checkpoint (`ckpt-N.callbacks`, JSON) and given back after the restore, which comes after their own
`on_train_begin` resets them (the backup callback runs after the script's). The learning rate they lowered is the
optimizer's, restored with it. EarlyStopping(restore_best_weights=True)'s best weights are not kept: named at
start-up.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
from typing import Any

KEPT = {  # class name (in the callback's MRO) -> the attributes that decide what it does next
    "EarlyStopping": ("wait", "best", "stopped_epoch", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "best", "cooldown_counter"),
    "ModelCheckpoint": ("best",),
}
SUFFIX = ".callbacks"  # not .json: a Keras 3 checkpoint is marked complete by its ckpt-N.json


def _kind(callback: Any) -> str | None:
    return next((cls.__name__ for cls in type(callback).__mro__ if cls.__name__ in KEPT), None)


def _number(value: Any) -> Any:
    """JSON-safe: numpy scalars as Python numbers, a tensor or variable read as one."""
    if isinstance(value, numbers.Integral):
        return int(value)
    with contextlib.suppress(TypeError, ValueError):
        return float(value)
    return None


def snapshot(callbacks: list) -> list[dict]:
    """The kept counters of each known callback, in the script's order."""
    found = []
    for callback in callbacks:
        kind = _kind(callback)
        if kind:
            found.append({"class": kind, "state": {name: _number(getattr(callback, name, None))
                                                   for name in KEPT[kind] if hasattr(callback, name)}})
    return found


def write(checkpoint_prefix: str, callbacks: list) -> None:
    from ..runs import write_private_json

    state = snapshot(callbacks)
    if state:
        write_private_json(checkpoint_prefix + SUFFIX, {"callbacks": state})


def restore(checkpoint_prefix: str, callbacks: list) -> int:
    """Give the callbacks the counters kept with this checkpoint (matched by class, in order); how many."""
    # patch: callback_state.restore
    try:
        with open(checkpoint_prefix + SUFFIX) as handle:
            saved = json.load(handle)["callbacks"]
    except (OSError, ValueError, KeyError):
        return 0
    restored = 0
    ours = [c for c in callbacks if _kind(c)]
    for callback, kept in zip(ours, saved):
        if _kind(callback) != kept.get("class"):
            break  # the script's callbacks changed: leave the rest as they start
        _set_up_now(callback)
        for name, value in kept["state"].items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                setattr(callback, name, value)
        restored += 1
    return restored


def _set_up_now(callback: Any) -> None:
    """Keras 3's EarlyStopping picks its comparison at its first epoch end (`_set_monitor_op`, once the model's
    metrics are built), and sets `best` to +-inf there: a `best` given back before would be lost. Set up now,
    where it can be (a loss or a mode says the direction); where it cannot, the first epoch end does as before."""
    # patch: callback_state.restore
    if getattr(callback, "monitor_op", True) is None and hasattr(callback, "_set_monitor_op"):
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            callback._set_monitor_op()


def not_restorable(callbacks: list) -> list[str]:
    """What of the script's callbacks a resume cannot give back, in a few words each."""
    return [f"{type(c).__name__}(restore_best_weights=True)'s best weights" for c in callbacks
            if _kind(c) == "EarlyStopping" and getattr(c, "restore_best_weights", False)]


def remove(checkpoint_prefix: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(checkpoint_prefix + SUFFIX)
