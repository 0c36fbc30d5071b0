"""The state of the script's Keras callbacks that decides its run, kept with every checkpoint.

EarlyStopping and ReduceLROnPlateau count epochs without improvement (`wait`, `best`, a cooldown), and
ModelCheckpoint(save_best_only=True) remembers the best value; a resumed fit would start them from scratch and
stop, lower the learning rate or save at another epoch than the run never stopped. Their counters are written
beside each checkpoint (`ckpt-N.callbacks`, JSON) and given back after the restore, which comes after their own
`on_train_begin` resets them (the backup callback runs after the script's). The learning rate they lowered is the
optimizer's, restored with it. EarlyStopping(restore_best_weights=True)'s best weights go beside them
(`ckpt-N.best-weights.npz`): a resumed run restored the first epoch after the resume instead (#84).

Keras' History is the fit's own, made anew by every fit: a resumed fit returned the epochs since the resume only.
The epochs' logs (`EpochLogs`) go into the same file and are put before the resumed fit's at its end.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
from collections.abc import Callable
from typing import Any

KEPT = {  # class name (in the callback's MRO) -> the attributes that decide what it does next
    "EarlyStopping": ("wait", "best", "stopped_epoch", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "best", "cooldown_counter"),
    "ModelCheckpoint": ("best",),
}
SUFFIX = ".callbacks"  # not .json: a Keras 3 checkpoint is marked complete by its ckpt-N.json
BEST_WEIGHTS = ".best-weights.npz"  # EarlyStopping(restore_best_weights=True)'s, beside the counters


class EpochLogs:
    """The logs of a fit's epochs ended so far, in History's form (`epoch`, `history`)."""

    def __init__(self, saved: dict | None = None) -> None:
        saved = saved or {}
        self.epoch: list[int] = [int(e) for e in saved.get("epoch", [])]
        self.history: dict[str, list] = {k: list(v) for k, v in saved.get("history", {}).items()}

    def add(self, epoch: int, logs: dict | None) -> None:
        self.epoch.append(int(epoch))
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(_number(value))

    def as_json(self) -> dict:
        return {"epoch": self.epoch, "history": self.history}

    def copy(self) -> EpochLogs:
        return EpochLogs(self.as_json())

    def put_before(self, history: Any) -> None:
        """Keras' History of the resumed fit, given the epochs before the resume first."""
        if not self.epoch or history is None or not hasattr(history, "epoch"):
            return
        later = [e for e in history.epoch if e > self.epoch[-1]]
        kept = len(history.epoch) - len(later)  # epochs History holds that these logs hold too: theirs kept
        history.epoch[:] = self.epoch + later
        for key in set(self.history) | set(history.history):
            history.history[key] = self.history.get(key, []) + list(history.history.get(key, []))[kept:]


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


def write(checkpoint_prefix: str, callbacks: list, logged: EpochLogs | None = None) -> None:
    capture(callbacks, logged)(checkpoint_prefix)


def capture(callbacks: list, logged: EpochLogs | None = None) -> Callable[[str], None]:
    """The callbacks' state read now, written by the function returned beside a checkpoint (a writer thread's)."""
    from ..runs import write_private_json

    state = snapshot(callbacks)
    best = [c.best_weights for c in callbacks if _kind(c) == "EarlyStopping" and getattr(c, "best_weights", None)]
    history = logged.copy().as_json() if logged is not None else None  # Keras replaces best_weights, never edits it

    def write_beside(checkpoint_prefix: str) -> None:
        if best:
            _write_arrays(checkpoint_prefix + BEST_WEIGHTS, best[0])
        if state or history is not None:
            write_private_json(checkpoint_prefix + SUFFIX, {"callbacks": state, "history": history or {}})

    return write_beside


def _write_arrays(path: str, arrays: list) -> None:
    import numpy as np

    temporary = f"{path}.{os.getpid()}.npz"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
        np.savez(handle, *arrays)
    os.replace(temporary, path)


def logged_before(checkpoint_prefix: str) -> EpochLogs:
    """The epochs' logs kept with this checkpoint (none where it has none)."""
    try:
        with open(checkpoint_prefix + SUFFIX) as handle:
            return EpochLogs(json.load(handle).get("history"))
    except (OSError, ValueError, AttributeError):
        return EpochLogs()


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
        if _kind(callback) == "EarlyStopping" and os.path.exists(checkpoint_prefix + BEST_WEIGHTS):
            callback.best_weights = _read_arrays(checkpoint_prefix + BEST_WEIGHTS)
        restored += 1
    return restored


def _read_arrays(path: str) -> list | None:
    import numpy as np

    try:
        with np.load(path) as saved:
            return [saved[f"arr_{i}"] for i in range(len(saved.files))]
    except (OSError, ValueError, KeyError):
        return None


def _set_up_now(callback: Any) -> None:
    """Keras 3's EarlyStopping picks its comparison at its first epoch end (`_set_monitor_op`, once the model's
    metrics are built), and sets `best` to +-inf there: a `best` given back before would be lost. Set up now,
    where it can be (a loss or a mode says the direction); where it cannot, the first epoch end does as before."""
    # patch: callback_state.restore
    if getattr(callback, "monitor_op", True) is None and hasattr(callback, "_set_monitor_op"):
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            callback._set_monitor_op()


def remove(checkpoint_prefix: str) -> None:
    for suffix in (SUFFIX, BEST_WEIGHTS):
        with contextlib.suppress(OSError):
            os.unlink(checkpoint_prefix + suffix)
