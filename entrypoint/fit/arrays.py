"""numpy input (arrays, tensors, lists and dicts of them, pandas) as the tf.data pipelines of global batches that
`fit` trains on in every mode: each global batch's bounds (a last batch that would leave a replica empty topped
up from the one before), each rank's contiguous share of it, and the epoch's order, the same on every rank so
that their shares partition it (Keras' own where the script seeded TensorFlow: compat/numpy_orders.py).
`positioned_array_dataset` is the same pipeline started at a given epoch and step, for exact resume (resume.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHUFFLE_SEED = 20_241_122  # the same on every rank: their slices must partition the same permutation
ARRAY_ARGS = ("x", "y", "sample_weight")


def splits_cleanly(size: Any, replicas: int) -> Any:
    """Whether a batch of `size` gives every replica a sample, however it is split: contiguous shares (Horovod
    here) need size >= replicas; TensorFlow's rebatch for batches of unknown size cuts pieces of ceil(size /
    replicas) (`_LegacyRebatchDataset`: 5 on 4 replicas is 2, 2, 1, 0), so it needs size > (replicas - 1) x that.
    Works on ints and on int64 tensors."""
    return size - (replicas - 1) * ((size + replicas - 1) // replicas) > 0


def batch_bounds(samples: int, batch_size: int, replicas: int) -> list[tuple[int, int]]:
    """[start, end) of each global batch; a last batch that does not split cleanly between the replicas is
    topped up to the next multiple of `replicas` from the end of the one before (when what is left there still
    splits cleanly), so the step count stays ceil(samples / batch)."""
    bounds = [(start, min(start + batch_size, samples)) for start in range(0, samples, batch_size)]
    if len(bounds) > 1 and not splits_cleanly(bounds[-1][1] - bounds[-1][0], replicas):
        (start, _), (last_start, end) = bounds[-2], bounds[-1]
        last = -(-(end - last_start) // replicas) * replicas
        if splits_cleanly(end - last - start, replicas):
            bounds[-2:] = [(start, end - last), (end - last, end)]
    return bounds


def share(length: Any, rank: int, size: int) -> tuple[Any, Any]:
    """[start, end) of rank's contiguous share of `length` items (the first ranks take the extra ones last)."""
    return length * rank // size, length * (rank + 1) // size


def is_array_input(x: Any) -> bool:
    """numpy arrays, tensors, lists of them or dicts of them: what Keras batches itself."""
    import numpy as np

    if isinstance(x, Mapping):
        return bool(x) and all(is_array_input(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return bool(x) and all(is_array_input(v) for v in x)
    if hasattr(x, "to_numpy") and hasattr(x, "shape"):  # pandas
        return True
    return isinstance(x, np.ndarray) or (hasattr(x, "shape") and hasattr(x, "dtype") and not is_dataset(x))


def is_dataset(x: Any) -> bool:
    return any(cls.__name__ == "DatasetV2" and "tensorflow" in cls.__module__ for cls in type(x).__mro__)


def first_length(structure: Any) -> int:
    import tensorflow as tf

    return int(tf.nest.flatten(structure)[0].shape[0])


def rank_spans(bounds: list[tuple[int, int]], rank: int, size: int) -> list[tuple[int, int]]:
    """[start, end) of this rank's share of each global batch [start, end) in `bounds`."""
    return [(start + first, start + last) for start, end in bounds for first, last in [share(end - start, rank, size)]]


def _span_constants(spans: list[tuple[int, int]]) -> tuple[Any, Any]:
    """The starts and the ends of `spans` as int64 tensors."""
    import tensorflow as tf

    return tf.constant([start for start, _ in spans], tf.int64), tf.constant([end for _, end in spans], tf.int64)


def _span_tensors(samples: int, batch_size: int, rank: int, size: int, replicas: int = 1) -> tuple[Any, Any, int]:
    """[start, end) of this rank's share of every global batch (each splitting cleanly between `replicas`, or the
    `size` ranks), as int64 tensors, and the number of batches."""
    bounds = batch_bounds(samples, batch_size, max(size, replicas))
    return (*_span_constants(rank_spans(bounds, rank, size)), len(bounds))


def _element(arrays: tuple) -> Any:
    """`arrays` (x[, y[, sample_weight]]) as tensors, in the structure fit's batches have."""
    import tensorflow as tf

    tensors = tf.nest.map_structure(lambda a: tf.convert_to_tensor(_as_numpy(a)), arrays)
    return tensors if len(tensors) > 1 else tensors[0]


def _as_numpy(array: Any) -> Any:
    """pandas as Keras' own array adapters take it (both families): a DataFrame its values, a Series a column of
    them, (n, 1). As (n,), a Series' labels trained the same, but the first `evaluate` after a fit whose validation
    batches were distrain's met a test function traced for the other rank: "Cannot take the length of shape with
    unknown rank"."""
    import numpy as np

    if not hasattr(array, "to_numpy"):
        return array
    values = array.to_numpy()
    return np.expand_dims(values, -1) if type(array).__name__ == "Series" else values


def _gather_batches(arrays: tuple, batch_indices: Any, cardinality: int) -> Any:
    """The batches of `arrays` at each element of `batch_indices` (a dataset of index vectors)."""
    import tensorflow as tf

    element = _element(arrays)
    dataset = batch_indices.map(lambda indices: tf.nest.map_structure(lambda t: tf.gather(t, indices), element),
                                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.apply(tf.data.experimental.assert_cardinality(cardinality)).prefetch(tf.data.AUTOTUNE)


def array_dataset(arrays: tuple, batch_size: int, shuffle: bool, rank: int = 0, size: int = 1) -> Any:
    """A tf.data pipeline of global batches of `arrays` (x[, y[, sample_weight]]), reshuffled every epoch with a
    seed shared by the ranks; with size > 1, only this rank's slice of each global batch."""
    import tensorflow as tf

    samples = first_length(arrays)
    starts, ends, count = _span_tensors(samples, batch_size, rank, size)
    order = tf.data.Dataset.range(samples)
    if shuffle:
        order = order.shuffle(samples, seed=SHUFFLE_SEED, reshuffle_each_iteration=True)
    order = order.batch(samples)  # one element: this epoch's order, the same on every rank

    def batches(permutation: Any) -> Any:
        return tf.data.Dataset.from_tensor_slices((starts, ends)).map(lambda start, end: permutation[start:end])

    return _gather_batches(arrays, order.flat_map(batches), count)


def steps_per_epoch(arrays: tuple, batch_size: int) -> int:
    return -(-first_length(arrays) // batch_size)


def positioned_array_dataset(arrays: tuple, batch_size: int, shuffle: bool, *, first_epoch: int, epochs: int,
                             skip: int, rank: int = 0, size: int = 1, replicas: int = 1, orders: Any = None) -> Any:
    """Every remaining epoch's batches of `arrays` in one dataset, from epoch `first_epoch` on, its first `skip`
    batches left out: exact resume (resume.py). Shuffled, epoch e's order is the e-th of `orders` (a dataset of
    permutations from `first_epoch` on: the ones Keras' own fit draws of a seeded script, compat/numpy_orders.py),
    or else a permutation drawn from (seed, e) alone; either way a resumed process trains the batches the
    uninterrupted one would have, wherever it stopped. Global batches (this rank's slice of each with size > 1)
    split cleanly between `replicas`; fit runs it with steps_per_epoch = the batches of one epoch and one
    iterator for all epochs."""
    import tensorflow as tf

    samples = first_length(arrays)
    bounds = batch_bounds(samples, batch_size, max(size, replicas))
    # the leading full batches are rows of the epoch's order reshaped (Keras' own numpy pipeline does the same):
    # their index vectors come without a per-batch slice; the one or two batches after them are sliced
    full = next((i for i, (start, end) in enumerate(bounds) if (start, end) != (i * batch_size, (i + 1) * batch_size)),
                len(bounds))
    first, last = share(batch_size, rank, size)
    tail = rank_spans(bounds[full:], rank, size)
    tail_starts, tail_ends = _span_constants(tail)
    element = _element(arrays)

    def own_order(epoch: Any) -> Any:
        order = tf.range(samples, dtype=tf.int64)
        if shuffle:
            seed = tf.stack([tf.constant(SHUFFLE_SEED, tf.int64), epoch])
            order = tf.random.experimental.stateless_shuffle(order, seed=seed)
        return order

    def epoch_indices(order: Any) -> Any:
        rows = tf.reshape(order[:full * batch_size], [full, batch_size])[:, first:last]
        indices = tf.data.Dataset.from_tensor_slices(rows)
        if tail:
            indices = indices.concatenate(tf.data.Dataset.from_tensor_slices((tail_starts, tail_ends)).map(
                lambda start, end: order[start:end]))
        return indices

    # the length stays unknown: Keras 3.15 counts the steps resume.py passes over against a known one. The batches
    # passed over are index vectors, never gathered; the gather runs on the flattened stream, as Keras' does.
    if orders is None or not shuffle:
        orders = tf.data.Dataset.range(first_epoch, epochs).map(own_order)
    indices = orders.flat_map(epoch_indices)
    if skip:
        indices = indices.skip(skip)
    batches = indices.map(lambda batch: tf.nest.map_structure(lambda t: tf.gather(t, batch), element),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # as Keras' own numpy pipeline: TensorFlow's default rewrites of the graph would serialise it, with the arrays
    # it holds, each time an iterator is made, and find nothing to improve in it
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    return batches.prefetch(tf.data.AUTOTUNE).with_options(options)
