"""A fit started at its position (resume.py positions its input): Keras 3's epoch iterator passes over the resumed
epoch's steps already trained, without reading a batch for them; tf_keras' fit is told its first epoch and step
as its own BackupAndRestore would tell it. Keras 3's symbolic build, which reads a batch under a strategy, reads
none from the positioned input."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from ..compat import keras3_trainer
from ..keras_family import KerasFamily

_TF_KERAS_COUNTERS = "_maybe_load_initial_counters_from_ckpt"  # where tf_keras' fit asks for its first epoch and step


@contextlib.contextmanager
def starting_at(family: KerasFamily, model: Any, position: Any) -> Iterator[None]:
    """Run the fit inside this so that its first epoch, `position.epoch`, starts at step `position.step`
    (`position`: a resume.Start, or None where the input is not positioned)."""
    if position is None:
        yield
        return
    if family.starts_by_skipping_steps:
        with _keras3_building_from_the_spec(position.script_dataset), _keras3_skipping(position.step):
            yield
        return
    if position.step == 0:
        yield
        return
    with _tf_keras_starting_at(model, position):
        yield


@contextlib.contextmanager
def _tf_keras_starting_at(model: Any, position: Any) -> Iterator[None]:
    """tf_keras' fit asks the model where to start (`Model._maybe_load_initial_counters_from_ckpt`, its
    BackupAndRestore's counters): for this model, during this fit, the answer is the position. Patched on the
    class that defines the method and restored after the fit, never set on the user's model."""
    # patch: resume.tf_keras_counters
    owner = next(cls for cls in type(model).__mro__ if _TF_KERAS_COUNTERS in vars(cls))
    original = vars(owner)[_TF_KERAS_COUNTERS]

    def counters(self: Any, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return (position.epoch, position.step) if self is model else original(self, *args, **kwargs)

    setattr(owner, _TF_KERAS_COUNTERS, counters)
    try:
        yield
    finally:
        setattr(owner, _TF_KERAS_COUNTERS, original)


def keras3_step_generator() -> tuple[Any, str] | None:
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
def _keras3_building_from_the_spec(script_dataset: Any) -> Iterator[None]:
    """Keras 3.4 on, under a strategy, builds the model, metrics and optimizer symbolically before the first
    epoch from one batch it reads through an iterator of its own, then drops it. Plain `python` (no strategy)
    reads none; read from distrain's positioned pipeline, the epochs repeated in one iterator, read-ahead past a
    short remainder of an epoch draws the next order too, so the epochs after it trained other orders than the
    run never stopped (measured on Keras 3.15.1 under MWM: the resumed epoch trained the next epoch's order). So
    the build reads nothing: it is given the script's dataset's element spec (compat/keras3_mwm.py does the same
    for input that is not positioned); a spec that is not plain tensors (ragged, sparse) has it read its batch
    from the script's own dataset. Keras 3.3 has no such build: nothing to do."""
    # patch: resume.keras3_build
    TensorFlowTrainer = keras3_trainer.trainer_class()  # noqa: N806 - the class, under Keras' own name

    build = getattr(TensorFlowTrainer, "_maybe_symbolic_build", None)
    if build is None or script_dataset is None:
        yield
        return

    import tensorflow as tf

    spec = script_dataset.element_spec
    plain = all(isinstance(leaf, tf.TensorSpec) for leaf in tf.nest.flatten(spec))

    def from_the_scripts_dataset(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        # patch: resume.keras3_build
        if iterator is not None and plain:
            return build(self, iterator=None, data_batch=spec)
        if iterator is not None:
            iterator = _ScriptsOwnBatch(getattr(iterator, "_distribute_strategy", None), script_dataset)
        return build(self, iterator=iterator, data_batch=data_batch)

    TensorFlowTrainer._maybe_symbolic_build = from_the_scripts_dataset
    try:
        yield
    finally:
        TensorFlowTrainer._maybe_symbolic_build = build


class _ScriptsOwnBatch:
    """What Keras 3's symbolic build iterates in place of its epoch iterator: one (step, step, iterator) tuple,
    the iterator over the script's own dataset, distributed as Keras distributes it."""

    def __init__(self, strategy: Any, dataset: Any) -> None:
        self.strategy, self.dataset = strategy, dataset

    def __iter__(self) -> Iterator[tuple]:
        dataset = self.dataset
        if self.strategy is not None:
            dataset = self.strategy.experimental_distribute_dataset(dataset)
        yield 0, 0, iter(dataset)


@contextlib.contextmanager
def _keras3_skipping(steps: int) -> Iterator[None]:
    """Keras 3's fit reads a batch only when it runs a step: the first epoch's first `steps` (step, ...,
    iterator) tuples are passed over, so no batch is read for them and the callbacks see the true step
    numbers."""
    # patch: resume.keras3_skipping
    if not steps:
        yield
        return
    found = keras3_step_generator()
    if found is None:
        raise RuntimeError("position_input positions Keras 3 input only where it can skip steps")
    owner, name = found
    original = getattr(owner, name)
    pending = [steps]
    building = [False]
    TensorFlowTrainer = keras3_trainer.trainer_class()  # noqa: N806 - the class, under Keras' own name

    build = getattr(TensorFlowTrainer, "_maybe_symbolic_build", None)

    def skipping(self: Any) -> Iterator[Any]:
        # Keras 3.4+ under a strategy takes one batch for its symbolic build before the first epoch through the
        # epoch iterator (numpy input: _keras3_building_from_the_spec gives tf.data its own): that is not the
        # epoch, and the skip waits for it
        skip = 0 if building[0] or not pending else pending.pop()
        for item in original(self):
            if item[0] >= skip:
                yield item

    def symbolic_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        building[0] = True
        try:
            return build(self, *args, **kwargs)
        finally:
            building[0] = False

    setattr(owner, name, skipping)
    if build is not None:
        TensorFlowTrainer._maybe_symbolic_build = symbolic_build
    try:
        yield
    finally:
        setattr(owner, name, original)
        if build is not None:
            TensorFlowTrainer._maybe_symbolic_build = build
