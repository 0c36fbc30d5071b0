"""Exact resume: a stopped run goes on with the very batch the uninterrupted run would have trained next.

Keras alone cannot: Keras 3's BackupAndRestore reads only the epoch back and trains the interrupted epoch again;
tf_keras' skips the steps already done but restarts the data, so it trains the epoch's first batches again and
never the last ones; and a reshuffling input replays epoch 1's order in a new process. Two things are needed:

- **The data position.** numpy input (the common `fit(x, y, batch_size, shuffle=True)`) is taken into one
  pipeline over all remaining epochs (batches.positioned_array_dataset) whose epoch e order is drawn from
  (seed, e) alone; a resume at epoch E, step S starts it at E and leaves out S batches. The same pipeline runs
  whether or not the run was ever stopped, so both train the same batches.
- **The step count.** The resumed epoch runs its steps S..end only (tf_keras: the counters its own
  BackupAndRestore would load; Keras 3: the first S steps of the epoch iterator are passed over before any batch
  is read).

Checkpoints record (E, S) beside the weights (runs.write_position). Input that cannot be positioned (a Python
generator, a Sequence, tf.data, a script's own steps_per_epoch) is said so at start-up and resumes at the start
of the interrupted epoch, with its partial progress, as before.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import batches, checkpoint, runs


@dataclass(frozen=True)
class Position:
    epoch: int  # 0-based: the epoch in progress
    step: int  # steps of it already trained


def saved_position(checkpoint_dir: str) -> Position | None:
    found = runs.read_position(checkpoint_dir)
    return Position(found["epoch"], found["step"]) if found else None


def position_input(arguments: dict, *, keras_family: str, checkpoint_dir: str, rank: int, size: int,
                   replicas: int, note: Callable[[str], None]) -> Position | None:
    """Rewrite fit's bound arguments so that the input is positioned (see the module doc); the position this fit
    starts at, or None (said through `note`) when the input cannot be positioned. rank/size: this rank's share of
    every global batch (zero-code Horovod), else 0/1; replicas: how many replicas each global batch feeds."""
    x = arguments.get("x")
    saved = saved_position(checkpoint_dir)
    why_not = _why_not_positionable(arguments)
    if saved is None and checkpoint.newest_checkpoint(os.path.join(checkpoint_dir, "chief")):
        why_not = why_not or "the checkpoint records no position (an older distrain wrote it)"
    if keras_family == "keras3" and _keras3_step_generator() is None:
        why_not = why_not or "this Keras 3 has no epoch iterator distrain knows how to start mid-epoch"
    if why_not:
        note(f"{why_not}: a stop resumes at the start of the interrupted epoch, with its partial progress")
        return None
    epochs = int(arguments.get("epochs") or 1)
    batch_size = int(arguments.get("batch_size") or 32)
    arrays = batches.take_validation_split(arguments)
    steps = batches.steps_per_epoch(arrays, batch_size)
    position = saved or Position(int(arguments.get("initial_epoch") or 0), 0)
    if position.step >= steps:
        position = Position(position.epoch + 1, 0)
    if position.epoch >= epochs:
        position = Position(epochs - 1, steps)  # nothing left to train: an empty remainder of the last epoch
    shuffle = arguments.get("shuffle", True) is not False
    dataset = batches.positioned_array_dataset(arrays, batch_size, shuffle, first_epoch=position.epoch,
                                               epochs=epochs, skip=position.step, rank=rank, size=size,
                                               replicas=replicas)
    if size > 1:
        dataset._distrain_rank_share = batch_size  # noqa: SLF001 - read by batches.adapt_fit_arguments
    for name in ("y", "sample_weight", "batch_size", "shuffle"):
        arguments.pop(name, None)
    arguments.update(x=dataset, steps_per_epoch=steps, initial_epoch=position.epoch)
    del x
    return position


def _why_not_positionable(arguments: dict) -> str | None:
    x = arguments.get("x")
    if x is None or not batches.is_array_input(x):
        kind = "a tf.data dataset" if x is not None and batches._is_dataset(x) else f"input of type {type(x).__name__}"  # noqa: SLF001
        return f"{kind} is not positioned by distrain"
    if arguments.get("steps_per_epoch"):
        return "the script sets steps_per_epoch"
    if arguments.get("y") is None and arguments.get("sample_weight") is not None:
        return "sample_weight without y"
    return None


@contextlib.contextmanager
def starting_at(keras_family: str, model: Any, position: Position | None) -> Iterator[None]:
    """Run the fit inside this so that its first epoch, `position.epoch`, starts at step `position.step`."""
    if position is None or position.step == 0:
        yield
        return
    if keras_family == "keras3":
        with _keras3_skipping(position.step):
            yield
        return
    # tf_keras asks the model where to start (its BackupAndRestore's counters): answer with the position
    model._maybe_load_initial_counters_from_ckpt = lambda *_args, **_kwargs: (position.epoch, position.step)
    try:
        yield
    finally:
        del model._maybe_load_initial_counters_from_ckpt


def _keras3_step_generator() -> tuple[Any, str] | None:
    """The Keras 3 method that yields one epoch's (step, ..., iterator) tuples without reading a batch: Keras 3.3's
    `TFEpochIterator.enumerate_epoch`, later versions' `EpochIterator._enumerate_iterator`; None if neither is
    there (then nothing is positioned: see position_input)."""
    try:
        from keras.src.backend.tensorflow.trainer import TFEpochIterator
    except ImportError:
        return None
    for name in ("_enumerate_iterator", "enumerate_epoch"):
        if inspect.isgeneratorfunction(getattr(TFEpochIterator, name, None)):
            return TFEpochIterator, name
    return None


@contextlib.contextmanager
def _keras3_skipping(steps: int) -> Iterator[None]:
    """Keras 3's fit reads a batch only when it runs a step: the first epoch's first `steps` (step, ...,
    iterator) tuples are passed over, so no batch is read for them and the callbacks see the true step
    numbers."""
    found = _keras3_step_generator()
    if found is None:
        raise RuntimeError("position_input positions Keras 3 input only where it can skip steps")
    owner, name = found
    original = getattr(owner, name)
    pending = [steps]

    def skipping(self: Any) -> Iterator[Any]:
        skip = pending.pop() if pending else 0
        for item in original(self):
            if item[0] >= skip:
                yield item

    setattr(owner, name, skipping)
    try:
        yield
    finally:
        setattr(owner, name, original)
