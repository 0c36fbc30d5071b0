"""Exact resume: a stopped run goes on with the very batch the uninterrupted run would have trained next.

Keras alone cannot: Keras 3's BackupAndRestore reads only the epoch back and trains the interrupted epoch again;
tf_keras' skips the steps already done but restarts the data, so it trains the epoch's first batches again and
never the last ones; and a reshuffling input replays epoch 1's order in a new process. Two things are needed:

- **The data position.** numpy input (the common `fit(x, y, batch_size, shuffle=True)`) is taken into one
  pipeline over all remaining epochs (array_input.positioned_array_dataset) whose epoch e order is the one
  Keras' own fit draws of a seeded script (compat/numpy_orders.py), or else one drawn from (seed, e) alone; a
  resume at epoch E, step S starts it at E and leaves out S batches. A tf.data dataset of
  known length is repeated for the remaining epochs, each drawing the orders Keras' fit draws of it (one an
  epoch, or two on Keras 3.15), the orders of the epochs done drawn first, S batches skipped. The same pipeline
  runs whether or not the run was ever stopped, so both train the same batches.
- **The step count.** The resumed epoch runs its steps S..end only (tf_keras: the counters its own
  BackupAndRestore would load; Keras 3: the first S steps of the epoch iterator are passed over before any batch
  is read): starting.py.

An endless dataset with fit's steps_per_epoch is one stream read through one iterator for the whole fit: a
resume at epoch E, step S leaves out E * steps_per_epoch + S batches of it. A dataset of unknown length (TFRecord
files, a filter) is read by Keras through one iterator an epoch until its data ends: unknown_length.py.

Checkpoints record (E, S) beside the weights (runs.write_position). Input that cannot be positioned (a Python
generator, a Sequence, a dataset shuffled without a seed or in an order not the same in every process,
steps_per_epoch over input that ends) is said so at start-up and resumes at the start of the interrupted epoch,
with its partial progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import runs
from ..compat import epoch_iterators, numpy_orders
from ..keras_family import KerasFamily
from . import arrays as array_input
from . import batches, script_batches, skip_beneath, starting, unknown_length

_ENDLESS = -1  # tf.data.INFINITE_CARDINALITY
_UNKNOWN = -2  # tf.data.UNKNOWN_CARDINALITY


@dataclass(frozen=True)
class Start(runs.Position):
    """Where a fit starts (runs.Position: epochs done, steps of the next trained) and what its input is there."""

    rank_share: bool = False  # the input is already this rank's share of each batch (batches.adapt_fit_arguments)
    script_dataset: Any = None  # the script's own tf.data dataset, where it was positioned: Keras 3's build reads it
    epoch_length: int | None = None  # a dataset of unknown length: its epochs' length, where a checkpoint has it
    learnt_length: Callable[[], int | None] | None = None  # ... and where it is learnt (unknown_length.py)
    last_batch: str | None = None  # the checkpoint's digest of the last batch trained (script_batches.py)
    script_input: script_batches.PositionedInput | None = None  # a PyDataset or generator positioned

    def to_record(self, epoch: int, step: int) -> dict:
        """What a checkpoint at (epoch, step) records of the input beside the position: the epochs' length where
        it is learnt, the last batch's digest where the input is a PyDataset or generator."""
        record = {"epoch_length": self.learnt_length() if self.learnt_length is not None else None,
                  "last_batch": self.script_input.last_batch_digest(epoch, step) if self.script_input else None}
        return {key: value for key, value in record.items() if value}


def saved_position(checkpoint_dir: str) -> Start | None:
    found = runs.read_checkpoint_record(checkpoint_dir)
    if not found:
        return None
    position, kept = found
    return Start(position.epoch, position.step, epoch_length=kept.get("epoch_length"),
                 last_batch=kept.get("last_batch"))


def position_input(arguments: dict, *, family: KerasFamily, checkpoint_dir: str | None, rank: int, size: int,
                   replicas: int, note: Callable[[str], None], evened: batches.EvenedInputs) -> Start | None:
    """Rewrite fit's bound arguments so that the input is positioned (see the module doc); the position this fit
    starts at, or None (said through `note`) when the input cannot be positioned. rank/size: this rank's share of
    every global batch (zero-code Horovod), else 0/1; replicas: how many replicas each global batch feeds;
    `evened` learns the dataset made here (each epoch's last batch splits cleanly)."""
    saved = saved_position(checkpoint_dir) if checkpoint_dir else None
    why_not = _why_not_positionable(arguments, family)
    if saved is None and checkpoint_dir and runs.newest_checkpoint(runs.chief_dir(checkpoint_dir)):
        why_not = why_not or "the checkpoint records no position (an older distrain wrote it)"
    if why_not:
        note(f"{why_not}: a stop resumes at the start of the interrupted epoch, with its partial progress")
        return None
    epochs = int(arguments.get("epochs") or 1)
    start = saved or Start(int(arguments.get("initial_epoch") or 0), 0)
    x = arguments["x"]
    arrays = None if array_input.is_dataset(x) or _is_script_batches(x) else batches.take_validation_split(arguments)
    steps = _steps_per_epoch(arguments, arrays, start)
    position = _within(start, steps, epochs)
    if position.epoch >= epochs:  # stopped at the end of the fit's last epoch: nothing left to train
        arguments["initial_epoch"] = epochs
        return position
    first_epoch = int(arguments.get("initial_epoch") or 0)  # the script's: epochs before it are not this fit's
    script_input = None
    if _is_script_batches(x):
        script_input = script_batches.positioned(
            x, epoch=position.epoch, step=position.step, first_epoch=first_epoch,
            steps_per_epoch=arguments.get("steps_per_epoch"), recorded_digest=start.last_batch, note=note)
        dataset, rank_share = script_input.x, False
    elif array_input.is_dataset(x) and arguments.get("steps_per_epoch"):  # an endless stream
        dataset, rank_share = _positioned_stream(x, position, first_epoch, steps, rank, size, replicas, note)
    elif array_input.is_dataset(x) and int(x.cardinality()) == _UNKNOWN:
        in_later_epoch = position.epoch > first_epoch
        steps, position, dataset, rank_share = _positioned_unknown_length(x, position, family, in_later_epoch,
                                                                          epochs, rank, size, replicas, note)
    elif array_input.is_dataset(x):
        made = epoch_iterators.made(family.name)
        dataset, rank_share = _positioned_dataset(x, position, epochs, rank, size, replicas, note, made, first_epoch)
    else:
        batch_size = int(arguments.get("batch_size") or 32)
        shuffle = arguments.get("shuffle", True)
        orders = None if shuffle in (False, "batch") else numpy_orders.keras_orders(
            family, array_input.first_length(arrays), first_epoch=position.epoch, epochs=epochs,
            fit_first_epoch=int(arguments.get("initial_epoch") or 0))
        dataset = array_input.positioned_array_dataset(arrays, batch_size, shuffle is not False,
                                                       first_epoch=position.epoch, epochs=epochs, skip=position.step,
                                                       rank=rank, size=size, replicas=replicas, orders=orders)
        rank_share = size > 1
    script_dataset = arguments["x"] if array_input.is_dataset(arguments["x"]) else None
    if array_input.is_dataset(dataset):
        evened.add(dataset)
    for name in ("y", "sample_weight", "batch_size"):
        arguments.pop(name, None)
    # the dataset draws the order: Keras' default shuffle=True would warn that it ignores it for a dataset
    arguments.update(x=dataset, initial_epoch=position.epoch, shuffle=False)
    if steps is not None and script_input is None:  # a PyDataset's epochs are its length: with steps_per_epoch
        arguments["steps_per_epoch"] = steps  # Keras would read it as one stream, ending after the first epoch
    return dataclasses.replace(position, rank_share=rank_share, script_dataset=script_dataset,
                               script_input=script_input)


def build_before_restore(model: Any, arguments: dict, checkpoint_dir: str) -> None:
    """A model built on its first batch (a Sequential without an input shape) has no variables for a checkpoint to
    be restored into before that batch: Keras 3.3's load_weights refuses, and tf_keras defers the restore into the
    first step, where no rank's own state (sync.py) can follow it. Built from the input's spec first, only where
    a checkpoint will be restored: its weights replace the ones built."""
    if runs.newest_checkpoint(runs.chief_dir(checkpoint_dir)):
        build_from_input(model, arguments)


def build_from_input(model: Any, arguments: dict) -> None:
    """Build a model not built yet from the shape of fit's input (see build_before_restore; stages.py)."""
    if getattr(model, "built", True):
        return
    shape = _input_shape(arguments.get("x"))
    if shape is not None:
        model.build(shape)


def _input_shape(x: Any) -> tuple | None:
    """The shape of a batch of the model's input, batch dimension None; None where it is not one array."""
    if x is not None and array_input.is_dataset(x):
        spec = x.element_spec
        spec = spec[0] if isinstance(spec, tuple) else spec
        shape = getattr(spec, "shape", None)
        return tuple(shape.as_list()) if shape is not None and shape.rank is not None else None
    shape = getattr(x, "shape", None)
    return (None, *shape[1:]) if shape is not None and len(shape) > 0 else None


def _steps_per_epoch(arguments: dict, arrays: Any, start: Start) -> int | None:
    """Fit's steps per epoch for this input; None where its length is unknown and no checkpoint records it."""
    x = arguments["x"]
    if arrays is not None:
        return array_input.steps_per_epoch(arrays, int(arguments.get("batch_size") or 32))
    if arguments.get("steps_per_epoch"):
        return int(arguments["steps_per_epoch"])
    if script_batches.is_indexed(x):
        return len(x)
    length = int(x.cardinality())
    return start.epoch_length if length == _UNKNOWN else length


def _within(position: Start, steps: int | None, epochs: int) -> Start:
    """The position as the start of the next epoch where it is at its epoch's end, and at the fit's end (epoch
    `epochs`, step 0) where nothing is left to train. A fit resumed there trains no epoch: one with no step left
    to run would fail in Keras 3.3 (`'NoneType' object is not iterable`) and tf_keras (`Empty logs`)."""
    if steps is not None and position.step >= steps:
        position = dataclasses.replace(position, epoch=position.epoch + 1, step=0)
    if position.epoch >= epochs:
        position = dataclasses.replace(position, epoch=epochs, step=0)
    return position


def _positioned_dataset(dataset: Any, position: Start, epochs: int, rank: int, size: int, replicas: int,
                        note: Callable[[str], None], made: tuple[int, int] = (0, 1),
                        first_epoch: int = 0) -> tuple[Any, bool]:
    """The script's dataset, one epoch after the other from `position` on, and whether it is this rank's share of
    each batch. The fit makes the iterators Keras' fit makes of it (`made`: unread ones before the fit's first
    epoch, `first_epoch`, and ones each epoch: compat/epoch_iterators.py): a seeded
    `shuffle(reshuffle_each_iteration=True)` draws its next order for each new iterator, so each epoch trains the
    order plain `python` trains, and the same run stopped or not trains the same batches. The iterators before
    the position (nothing is read: that draws their orders) are made before it starts. The resumed epoch is the
    script's pipeline with its first batches left out beneath the stages that make them (skip_beneath.py), the
    same order: its iterator draws it."""
    import tensorflow as tf

    before, draws = made
    per_epoch, rank_share = _this_ranks_batches(dataset, rank, size, replicas)
    for _ in range(before + max(0, position.epoch - first_epoch) * draws):
        iter(per_epoch)
    left = epochs - position.epoch
    if not position.step:  # no stage that does nothing in every fresh run: a stage costs CPU on every batch
        if draws == 1:
            return per_epoch.repeat(left), rank_share
        epochs_drawn, length = _epochs_drawn(per_epoch, per_epoch, left, draws), int(per_epoch.cardinality())
        if length >= 0:  # known as `repeat` knows it (a Horovod rank's slices are of unknown length)
            epochs_drawn = epochs_drawn.apply(tf.data.experimental.assert_cardinality(left * length))
        return epochs_drawn, rank_share
    first = _without_first_batches(dataset, position.step, int(dataset.cardinality()), rank, size, replicas, note)
    # the length is left unknown (a filter that keeps everything): Keras 3.15 counts the steps passed over in the
    # resumed epoch (starting.py) against a known one and would end the last epoch that many early
    return _epochs_drawn(first, per_epoch, left, draws).filter(_keep), rank_share


def _epochs_drawn(first: Any, per_epoch: Any, epochs: int, draws: int) -> Any:
    """`first`, then `per_epoch` for the other epochs, each epoch's iterator made with the `draws - 1` others Keras
    makes after it: unread inputs of a `choose_from_datasets` that reads only the first (its iterator makes all of
    them, in order, and reads none but the one chosen). Every epoch is a `flat_map`'s: a `choose_from_datasets`
    as `concatenate`'s first input fails under a strategy's MultiDeviceIterator (TensorFlow 2.21: "Incompatible
    shapes at component 0")."""
    import tensorflow as tf

    if draws == 1:
        return first.concatenate(per_epoch.repeat(epochs - 1))

    def drawn(epoch: Any, count: int) -> Any:
        def one(_: Any) -> Any:
            first_only = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
            return tf.data.Dataset.choose_from_datasets([epoch] + [per_epoch] * (draws - 1), first_only,
                                                        stop_on_empty_dataset=True)

        return tf.data.Dataset.range(count).flat_map(one)

    return drawn(first, 1).concatenate(drawn(per_epoch, epochs - 1))


def _positioned_unknown_length(dataset: Any, position: Start, family: KerasFamily, in_later_epoch: bool,
                               epochs: int, rank: int, size: int, replicas: int,
                               note: Callable[[str], None]) -> tuple[int | None, Start, Any, bool]:
    """A dataset of unknown length (unknown_length.py): fit's steps_per_epoch (None: Keras ends each epoch where
    its data ends), the position, the dataset and whether it is this rank's share of each batch. tf_keras reads
    past the end of its fit's first epoch only: resumed in a later epoch (`in_later_epoch`), where the run never
    stopped knew the length, it is given the recorded one; resumed in the first, it finds the end as that run did."""
    import tensorflow as tf

    recorded = position.epoch_length
    if recorded and in_later_epoch and family.keeps_the_first_epochs_length:
        known = dataset.apply(tf.data.experimental.assert_cardinality(recorded))
        known, rank_share = _positioned_dataset(known, position, epochs, rank, size, replicas, note)
        return recorded, dataclasses.replace(position, learnt_length=lambda: recorded), known, rank_share
    sharded = batches.is_sharded(dataset)  # before the script's pipeline is hidden inside another
    positioned, length = unknown_length.positioned_epochs(dataset, position.epoch, position.step, recorded, note)
    positioned, rank_share = _this_ranks_batches(positioned, rank, size, replicas, sharded)
    return None, dataclasses.replace(position, learnt_length=length), positioned, rank_share


def _positioned_stream(dataset: Any, position: Start, first_epoch: int, steps_per_epoch: int, rank: int,
                       size: int, replicas: int, note: Callable[[str], None]) -> tuple[Any, bool]:
    """An endless dataset (`shuffle(seed).repeat().batch`, Horovod's and TensorFlow's examples), or one of unknown
    length (`from_generator`), with fit's `steps_per_epoch`: Keras reads it through one iterator for the whole fit
    (from its `first_epoch`), so its position is the count of global batches this fit trained, and the resumed
    stream starts past them: a generator's are made again and passed over."""
    stream, rank_share = _this_ranks_batches(dataset, rank, size, replicas)
    passed = (position.epoch - first_epoch) * steps_per_epoch + position.step
    if not passed:
        return stream, rank_share
    return _without_first_batches(dataset, passed, None, rank, size, replicas, note), rank_share


def _without_first_batches(dataset: Any, count: int, steps: int | None, rank: int, size: int, replicas: int,
                           note: Callable[[str], None]) -> Any:
    """This rank's batches of `dataset` but its first `count`, left out beneath the stages that make them where
    the pipeline allows it (said where not). Where batches are split between replicas, the epoch's last two are
    made as before: evening out the last one (batches.even_out_last_batch) takes from the one before it."""
    beneath = count if steps is None or (size == 1 and replicas == 1) else min(count, max(steps - 2, 0))
    first, why = skip_beneath.skip_batches(dataset, beneath)
    if why:
        note(f"the {beneath} batches a resume passes over are made again before its first step: {why}")
    first, _ = _this_ranks_batches(first, rank, size, replicas)
    return first.skip(count - beneath) if count > beneath else first


def _this_ranks_batches(dataset: Any, rank: int, size: int, replicas: int,
                        sharded: bool | None = None) -> tuple[Any, bool]:
    """The script's batches as this rank trains them, and whether they are its share of each global batch.
    sharded: whether the script's own pipeline is this rank's already, where `dataset` hides it."""
    if sharded is None:
        sharded = batches.is_sharded(dataset)
    if size > 1 and not sharded:  # zero-code Horovod: this rank's share of each batch
        return batches.rank_slices(batches.even_out_last_batch(dataset, size), rank, size), True
    if replicas > 1:
        return batches.evened_for_replicas(dataset, replicas), False
    return dataset, False


def _is_script_batches(x: Any) -> bool:
    return x is not None and (script_batches.is_indexed(x) or script_batches.is_generator(x))


def _keep(*_element: Any) -> bool:
    return True


def _why_not_positionable(arguments: dict, family: KerasFamily) -> str | None:
    x = arguments.get("x")
    if family.starts_by_skipping_steps and starting.keras3_step_generator() is None:
        return "this Keras 3 has no epoch iterator distrain knows how to start mid-epoch"
    if x is not None and array_input.is_dataset(x):
        length = int(x.cardinality())
        stream = bool(arguments.get("steps_per_epoch"))
        if length == _ENDLESS and not stream:
            return "a tf.data dataset of endless length without steps_per_epoch is not positioned"
        if length == 0:
            return "an empty tf.data dataset is not positioned"
        if order := nondeterministic_order(x):
            return f"the dataset's order is not the same in every process ({order})"
        if unseeded_shuffle(x):
            return "the dataset shuffles without a seed (give shuffle a seed, or call tf.random.set_seed)"
        if stream and length >= 0:
            return "steps_per_epoch over a dataset that ends is not positioned (over an endless one it is)"
        return None
    if _is_script_batches(x):
        return script_batches.why_not(x, arguments)
    if arguments.get("steps_per_epoch"):
        return "steps_per_epoch over input that is not an endless tf.data dataset is not positioned"
    if x is None or not array_input.is_array_input(x):
        return f"input of type {type(x).__name__} is not positioned by distrain"
    if arguments.get("y") is None and arguments.get("sample_weight") is not None:
        return "sample_weight without y"
    return None


def nondeterministic_order(dataset: Any) -> str | None:
    """Where the pipeline lets its parallel stages give elements in the order they finish: another order in every
    process, so no resumed process can know the interrupted epoch's."""
    # patch: tfdata.pipeline_stages
    if dataset.options().deterministic is False:
        return "tf.data.Options.deterministic is False"
    for stage in batches.pipeline_stages(dataset):
        if getattr(stage, "_deterministic", None) == "false":
            return f"its {type(stage).__name__.strip('_')} stage has deterministic=False"
    return None


def unseeded_shuffle(dataset: Any) -> bool:
    """Whether the pipeline has a shuffle with neither its own seed nor a global one: its orders are new in every
    process, so no resumed process can know the interrupted epoch's."""
    # patch: tfdata.pipeline_stages
    for stage in batches.pipeline_stages(dataset):
        if type(stage).__name__ == "_ShuffleDataset":
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                if int(stage._seed) == 0 and int(stage._seed2) == 0:
                    return True
    return False
