"""The interrupted epoch's metric states, kept with a mid-epoch checkpoint: its logs as the run never stopped.

Keras resets the metrics at every epoch's start and logs the epoch's loss and metrics from their states: a run
stopped at epoch 2 step 3 and resumed logged epoch 2's loss as the mean of the steps after the resume (1.19144
where the run never stopped logs 1.06224), and a callback watching `loss` (EarlyStopping, ReduceLROnPlateau)
decided on that number. Every rank keeps its own states beside the checkpoint (rank_state.py's per-rank files, in
`metrics/`); after the resumed epoch's first step each rank adds them to its states, which Keras' reset left at
zero before that step: Keras' metric states are sums (totals and counts, true and false positives, AUC's bins), so
the sum is what the run never stopped holds. Resumed on another number of ranks, they are left out (said).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from .. import runs
from . import rank_state

FOLDER = "metrics"


def variables(model: Any) -> list:
    """The model's metric states as tf.Variables, in a fixed order (the loss tracker's, the compiled metrics'):
    Keras 3 and tf_keras both list them under `model.metrics`."""
    from ..compat.keras3_horovod import tf_variables

    return tf_variables([v for metric in getattr(model, "metrics", []) for v in getattr(metric, "variables", [])])


def applies(plan: Any) -> bool:
    """Kept where each process is one replica, its states its own (not MirroredStrategy's several in one)."""
    return bool(plan.checkpoint_dir) and plan.replicas == plan.size


def kept(plan: Any, position: runs.Position, model: Any,
         local_reads: Callable[[], contextlib.AbstractContextManager]) -> Callable[[], None] | None:
    """This rank's metric states at a mid-epoch `position`, read now (every rank calls it, no collective:
    `local_reads`, Engine.local_reads); the file written by the call returned, on the checkpoint's writer (None:
    nothing to keep)."""
    import tensorflow as tf

    states = variables(model) if applies(plan) and position.step > 0 else []
    if not states:
        return None
    values = rank_state.local_values(states, tf, local_reads)
    return lambda: rank_state.save(plan.checkpoint_dir, position, plan.rank, plan.size, values, FOLDER)


def add_after_first_step(plan: Any, position: runs.Position, model: Any, say: Callable[[str], None],
                         observers: list[Callable[[], None]]) -> None:
    """Adds this rank's kept states once the resumed epoch's first step has run (a step observer among
    `observers`, leaving them once done), where some were kept at `position` for this number of ranks."""
    if position.step == 0 or not applies(plan):
        return
    kept = rank_state.own(plan.checkpoint_dir, position, plan.rank, plan.size, FOLDER)
    if kept is None:
        say("the interrupted epoch's metric states were not kept for this number of ranks: its logs count the "
            "steps since the resume only")
        return

    def add_kept() -> None:
        observers.remove(add_kept)
        states = variables(model)
        if len(kept) == len(states):
            for state, value in zip(states, kept):
                _local(state).assign_add(value.astype(state.dtype.as_numpy_dtype))

    observers.append(add_kept)


def _local(variable: Any) -> Any:
    """The variable this process adds to: an MWM worker's own copy of a distributed (on-read) one."""
    copies = getattr(variable, "values", None)
    return copies[0] if copies else variable


def remove(plan: Any) -> None:
    """This rank's kept states, once its fit has ended."""
    if plan.checkpoint_dir:
        rank_state.remove(plan.checkpoint_dir, plan.rank, FOLDER)
