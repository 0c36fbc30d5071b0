"""A dataset of unknown length (TFRecord files through `interleave`, a `filter`), positioned for exact resume.

Keras reads such a dataset through a new iterator each epoch until the data ends, and its versions make other
numbers of iterators an epoch: Keras 3.15 one more at an epoch's end once it knows the length, never read;
tf_keras one more before the first epoch. Each iterator made draws the next order of a seeded reshuffle, so the
epoch a resumed process starts at could not know which order it trains. Here every epoch is the one element of an
outer dataset whose inner one, the script's pipeline, is made only when an iterator is first read: one order
drawn per epoch trained, whatever the Keras version, in the run never stopped as in a resumed one. A resumed
process draws the orders of the epochs done first (iterators made, nothing read), and the first epoch read
leaves out the batches trained before the stop, beneath the stages that make them where it can
(skip_beneath.py).

The train step that finds the data ended still counts an optimizer step in both families (measured: the
optimizer's `iterations` goes 7 -> 9 across such an epoch end, plain Keras and tf_keras alike: the increment does
not wait for the batch that never comes), and Adam's bias correction reads that count. So a resumed epoch must
end as the same epoch of the run never stopped did: tf_keras learns the length at its first epoch's end and
never reads past it again; Keras 3 (3.3, and 3.15, whose learnt length counts the failed step) reads past the
end of every epoch. The length is therefore learnt here too, from the first epoch that ends (the pipeline records
it when its data runs out) and kept with every checkpoint after it; a tf_keras fit resumed in a later epoch is
given it, through the positioning of a dataset of known length (resume.py): the epochs in one iterator, cut by
`steps_per_epoch`, never read past their end (an `assert_cardinality` on this outer dataset would fail under MWM,
whose iterator reads ahead past a resumed epoch's shorter end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import skip_beneath

_SKIP, _MADE, _LENGTH = 0, 1, 2  # the table's keys: batches to leave out of the next epoch read, batches made in
# the epoch being read (those left out included), the length of an epoch that ran to its end


class EpochLength:
    """The number of batches in an epoch of the positioned dataset: learnt by it, else the checkpoint's record."""

    def __init__(self, table: Any, recorded: int | None) -> None:
        self.table, self.recorded = table, recorded

    def __call__(self) -> int | None:
        import tensorflow as tf

        learnt = int(self.table.lookup(tf.constant(_LENGTH, tf.int64)))
        return learnt or self.recorded


def positioned_epochs(dataset: Any, epoch: int, step: int, recorded_length: int | None,
                      note: Callable[[str], None]) -> tuple[Any, EpochLength]:
    """The script's dataset as one epoch per iterator read (see the module doc), the first epoch read without its
    first `step` batches after the `epoch` epochs done; and how long an epoch is, once known."""
    import tensorflow as tf

    for _ in range(epoch):
        iter(dataset)  # draws the order of an epoch done
    skipping, why = skip_beneath.skipper(dataset)
    if step and why:
        note(f"the {step} batches a resume passes over are made again before its first step: {why}")
    # a table, not a variable: under distrain's strategy (the default one) a variable would be a distributed one
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
    table.insert(tf.constant([_SKIP], tf.int64), tf.constant([step], tf.int64))

    def value(key: int) -> Any:
        return table.lookup(tf.constant(key, tf.int64))

    def put(key: int, number: Any) -> Any:
        return table.insert(tf.constant([key], tf.int64), tf.reshape(number, [1]))

    def count(*batch: Any) -> Any:
        with tf.control_dependencies([put(_MADE, value(_MADE) + 1)]):
            return tf.nest.map_structure(tf.identity, batch[0] if len(batch) == 1 else batch)

    def ended(_: Any) -> Any:
        with tf.control_dependencies([put(_LENGTH, value(_MADE))]):
            return tf.data.Dataset.range(0).flat_map(lambda _: dataset)  # nothing, in the dataset's structure

    def one_epoch(_: Any) -> Any:
        left_out = value(_SKIP)
        with tf.control_dependencies([left_out]):
            started = [put(_SKIP, tf.constant(0, tf.int64)), put(_MADE, left_out)]
        with tf.control_dependencies(started):
            left_out = tf.identity(left_out)
        end = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(ended)
        return skipping(left_out).map(count).concatenate(end)

    epochs = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(one_epoch)
    return epochs.with_options(dataset.options()), EpochLength(table, recorded_length)
