"""The input of `fit`, made to mean the same in every mode: `batch_size` is the global batch, an epoch is every
sample once, split between the replicas, and no replica is ever handed an empty batch.

- MWM (and MirroredStrategy over several GPUs) splits each global batch between the replicas, but the last
  global batch of an epoch can be smaller than the replicas; a replica then gets an empty batch, and oneDNN's
  fused Conv+ReLU gradient fails on it (tensorflow#60857; Keras 3 also made its loss NaN). distrain's strategy
  (`before_distributing`, given to engines.build) tops such a short last batch up with samples from the end of
  the batch before it, for `fit` (numpy, `tf.data`, generators: Keras hands them all to
  `experimental_distribute_dataset`) and for custom loops alike. The number of steps is unchanged and nothing
  is dropped or repeated.
- Zero-code Horovod runs one copy of the script per rank and Horovod splits nothing: every rank would train on
  the whole epoch. `adapt_fit_arguments` gives each rank its contiguous slice of every global batch, the
  slicing MWM does, so the step count is the same on every rank and every sample is trained on once per epoch in
  total. numpy input is shuffled with one seed shared by the ranks, so their slices partition each epoch's order.

A script that distributes itself under Horovod (its own `hvd.DistributedOptimizer`, or a dataset it sharded with
`dataset.shard(...)`) chose per-rank batches itself and is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .arrays import (
    ARRAY_ARGS,
    array_dataset,
    batch_bounds,
    first_length,
    is_array_input,
    is_dataset,
    share,
    splits_cleanly,
)


def _batch_length(element: Any) -> Any:
    import tensorflow as tf

    return tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]


def beneath_trailing_prefetch(dataset: Any, transform: Callable[[Any], Any]) -> Any:
    """transform(dataset), put beneath the script's own last `prefetch(n)` where its pipeline ends with one, so
    that it runs on the prefetch's thread: a stage on top of a prefetch costs the thread that takes the batches
    (the training step's) 9-14 µs a batch more CPU than the same stage beneath it
    (benchmarks/workers/perstep_parts.py: rank slices 0.95 of plain tf.data on top, 0.99 beneath, as the plain
    pipeline against itself). Options set last
    (`with_options`, as TensorFlow's multi-worker tutorial does after `prefetch`) stay on top."""
    # patch: tfdata.pipeline_stages
    if type(dataset).__name__ == "_OptionsDataset" and hasattr(dataset, "_input_dataset"):
        inner = beneath_trailing_prefetch(dataset._input_dataset, transform)
        return dataset if inner is dataset._input_dataset else inner.with_options(dataset.options())
    if type(dataset).__name__ != "_PrefetchDataset" or not hasattr(dataset, "_input_dataset"):
        return transform(dataset)
    try:
        buffer_size = int(dataset._buffer_size)  # private: any surprise leaves the stage on top
    except Exception:  # noqa: BLE001
        return transform(dataset)
    inner = transform(dataset._input_dataset)
    return dataset if inner is dataset._input_dataset else inner.prefetch(buffer_size)


def even_out_last_batch(dataset: Any, replicas: int) -> Any:
    """`dataset` with a last batch that does not split cleanly between `replicas` (see splits_cleanly) topped up
    to the next multiple of `replicas` from the end of the batch before it (one batch of look-ahead: a batch is
    passed on when the next arrives; an empty end marker flushes the last one; where the batches are known from
    the graph, TensorFlow's `rebatch` instead). The number of batches, and so the cardinality Keras counts steps
    with, does not change."""
    return beneath_trailing_prefetch(dataset, lambda stages: _even_out(stages, replicas))


def _even_out(dataset: Any, replicas: int) -> Any:
    import tensorflow as tf

    if int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
        return dataset  # no last batch
    specs = tf.nest.flatten(dataset.element_spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank for s in specs):
        return dataset  # ragged, sparse or scalar elements: not batches this can rebalance
    if all(s.shape[0] is not None for s in specs):
        return dataset  # batched with drop_remainder: every batch is full
    layout = batch_layout(dataset)
    if layout is not None:  # the batches are known from the graph: no look-ahead
        return _recut_known_batches(dataset, layout, replicas)

    def empty(spec: Any) -> Any:
        return tf.zeros([0] + [d if d is not None else 0 for d in spec.shape[1:]], spec.dtype)

    # a batch is never empty, so an empty one marks the end (and flushes the batch held back); the first
    # emission is always the empty "nothing yet" and is skipped. Two stages per batch (concatenate, scan: one
    # function call), no filter or cardinality assertion: skip(1) keeps the count known.
    end_marker = tf.nest.pack_sequence_as(dataset.element_spec, [empty(s) for s in specs])

    def step(held: Any, batch: Any) -> Any:
        size, have = _batch_length(batch), _batch_length(held) > 0
        total = _batch_length(held) + size
        last = (size + replicas - 1) // replicas * replicas  # the next multiple of replicas: splits cleanly
        top_up = tf.logical_and(tf.logical_and(have, size > 0),
                                tf.logical_and(tf.logical_not(splits_cleanly(size, replicas)),
                                               splits_cleanly(total - last, replicas)))

        def rebalance() -> Any:
            both = tf.nest.map_structure(lambda a, b: tf.concat([a, b], 0), held, batch)
            cut = total - last
            return (tf.nest.map_structure(lambda t: t[cut:], both), tf.nest.map_structure(lambda t: t[:cut], both))

        return tf.cond(top_up, rebalance, lambda: (batch, held))  # (held next, emitted now)

    return dataset.concatenate(tf.data.Dataset.from_tensors(end_marker)).scan(end_marker, step).skip(1)


def _recut_known_batches(dataset: Any, layout: tuple[int, int, bool], replicas: int) -> Any:
    """even_out_last_batch where the batches are known from the graph (batch_layout): TensorFlow's native
    `rebatch` cuts them to batch_bounds' sizes, the same topped-up last batch, without a function per batch (the
    look-ahead costs about 95 µs of CPU a batch, a third of a fast pipeline's own work:
    benchmarks/workers/perstep_parts.py)."""
    import tensorflow as tf

    samples, size, drop = layout
    sizes = [end - start for start, end in batch_bounds(samples, size, replicas)]
    if drop or len(sizes) < 2 or sizes[-2] == size:
        # every batch full, or batch_bounds left them as they are: the last batch splits as it is (the common
        # case) or the one before could not spare samples. Nothing added, no per-batch cost.
        return dataset
    return dataset.rebatch(sizes).apply(tf.data.experimental.assert_cardinality(len(sizes)))


# Stages that pass each batch on as one element: what sits above the batch stage leaves the last batch's size
# (a map that cuts its batches down would not, and is not worth guarding against).
_ONE_TO_ONE = ("_MapDataset", "_ParallelMapDataset", "_PrefetchDataset", "CacheDataset", "_OptionsDataset",
               "_AssertCardinalityDataset")


def batch_layout(dataset: Any) -> tuple[int, int, bool] | None:
    """(samples, batch size, drop_remainder) of the batch stage under `dataset`, read from its graph, or None
    where one pass's batches cannot be known before iterating."""
    # patch: tfdata.pipeline_stages
    stage = dataset
    while type(stage).__name__ in _ONE_TO_ONE and hasattr(stage, "_input_dataset"):
        stage = stage._input_dataset
    if not (hasattr(stage, "_batch_size") and hasattr(stage, "_input_dataset")):
        return None
    try:
        size, samples = int(stage._batch_size), int(stage._input_dataset.cardinality())
        drop = bool(getattr(stage, "_drop_remainder", False))
    except Exception:  # noqa: BLE001 - private TensorFlow attributes: any surprise means "unknown"
        return None
    if samples < 0 or size < 1:
        return None  # unknown or infinite length
    return samples, size, drop


def rank_slices(dataset: Any, rank: int, size: int) -> Any:
    """Each batch of `dataset` cut down to this rank's contiguous share.

    Where every batch splits cleanly into pieces of ceil(size / ranks) (splits_cleanly: batches of a known size,
    the last one evened out without a look-ahead), TensorFlow's own rebatch (what MWM splits batches with) cuts
    them natively and a shard keeps this rank's piece: no per-batch Python function, which costs more than the
    rest of a fast pipeline. Otherwise a map cuts shares (9 on 4 ranks: 2, 2, 2, 3, where rebatch gives 3, 3, 3, 0).
    """
    return beneath_trailing_prefetch(dataset, lambda stages: _rank_slices(stages, rank, size))


def _rank_slices(dataset: Any, rank: int, size: int) -> Any:
    import tensorflow as tf

    if size > 1 and splits_cleanly(_known_batch_size(dataset) or 0, size):
        try:  # private, as _known_batch_size's helper: a TensorFlow without it gets the map below
            from tensorflow.python.data.experimental.ops.distribute import _LegacyRebatchDataset

            shares = _LegacyRebatchDataset(dataset, size).shard(size, rank)
        except (ImportError, AttributeError, TypeError):
            pass
        else:  # a shard's count is unknown to tf.data: Keras 3.3 then trains one more (empty) step an epoch, whose
            # update with no gradient still counts an iteration and decays Adam's moments (#69: other numbers)
            count = int(dataset.cardinality())
            return shares.apply(tf.data.experimental.assert_cardinality(count)) if count >= 0 else shares

    def cut(*element: Any) -> Any:
        element = element[0] if len(element) == 1 else element
        start, end = share(_batch_length(element), rank, size)
        return tf.nest.map_structure(lambda t: t[start:end], element)

    return dataset.map(cut, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def is_sharded(dataset: Any) -> bool:
    """The script split this dataset itself: `dataset.shard(hvd.size(), hvd.rank())` (Horovod's examples), or
    per-rank files with auto-sharding turned off (`AutoShardPolicy.OFF`, TensorFlow's advice for that case)."""
    import tensorflow as tf

    try:
        if dataset.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF:
            return True
    except (AttributeError, TypeError):
        pass
    return any(type(stage).__name__ == "_ShardDataset" for stage in pipeline_stages(dataset))


def pipeline_stages(dataset: Any) -> Iterator[Any]:
    """`dataset` and every dataset it is built on (through TensorFlow's private `_inputs`), each once; a stage
    whose inputs cannot be walked ends its branch."""
    # patch: tfdata.pipeline_stages
    seen, todo = set(), [dataset]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inputs = getattr(current, "_inputs", None)
        try:
            todo.extend(inputs() if callable(inputs) else [])
        except Exception:  # noqa: BLE001, S112 - an input we cannot walk: its branch ends here
            continue


def rank_share_of_sequence(keras: Any, sequence: Any, rank: int, size: int) -> Any:
    """A PyDataset / Sequence whose batch i is this rank's slice of the original's batch i."""
    base = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence

    class RankShare(base):
        def __init__(self) -> None:
            if base.__name__ == "PyDataset":
                super().__init__(workers=getattr(sequence, "workers", 1),
                                 use_multiprocessing=getattr(sequence, "use_multiprocessing", False),
                                 max_queue_size=getattr(sequence, "max_queue_size", 10))

        def __len__(self) -> int:
            return len(sequence)

        def __getitem__(self, index: int) -> Any:
            return _cut_structure(sequence[index], rank, size)

        def on_epoch_end(self) -> None:
            sequence.on_epoch_end()

    return RankShare()


def _is_sequence(keras: Any, x: Any) -> bool:
    kinds = tuple(k for k in (getattr(keras.utils, "PyDataset", None), getattr(keras.utils, "Sequence", None)) if k)
    return isinstance(x, kinds)


def _known_batch_size(dataset: Any) -> int | None:
    """The batch size TensorFlow's rebatch finds in the dataset's graph, or None."""
    try:
        from tensorflow.python.data.experimental.ops import distribute

        size = int(distribute.compute_batch_size(dataset))
    except Exception:  # noqa: BLE001 - a private TensorFlow helper: any failure means "unknown"
        return None
    return size if size > 0 else None


def evened_for_replicas(dataset: Any, replicas: int) -> Any:
    """`dataset` with its last batch evened out (even_out_last_batch) where TensorFlow's own split needs it."""
    # Evening out (look-ahead or native rebatch) hides the batch size from TensorFlow, whose rebatch then cuts
    # ceil(size / replicas) pieces; a full batch that would leave a replica empty that way (9 on 4) keeps
    # TensorFlow's even split instead.
    if replicas > 1 and splits_cleanly(_known_batch_size(dataset) or replicas, replicas):
        return even_out_last_batch(dataset, replicas)
    return dataset


class EvenedInputs:
    """The datasets distrain made whose every epoch already ends in a batch that splits cleanly (resume.py evens
    each epoch before repeating it): `before_distributing` leaves them as they are. Known by identity, for the run:
    nothing is set on the datasets themselves (a later transform would drop it silently)."""

    def __init__(self) -> None:
        self._datasets: dict[int, Any] = {}

    def add(self, dataset: Any) -> None:
        self._datasets[id(dataset)] = dataset  # held, so that its id is never another's

    def __contains__(self, dataset: Any) -> bool:
        return self._datasets.get(id(dataset)) is dataset


def before_distributing(evened: EvenedInputs) -> Callable[[Any, int], Any]:
    """What distrain's strategy does to a dataset before it distributes it between its replicas (engines.build):
    a short last batch evened out (see the module doc), but for the datasets in `evened`."""

    def even_out(dataset: Any, replicas: int) -> Any:
        return dataset if dataset in evened else evened_for_replicas(dataset, replicas)

    return even_out


def adapt_fit_arguments(arguments: dict, keras: Any, *, rank: int, size: int, note: Callable[[str], None],
                        rank_share: bool = False, own_split: tuple[bool, bool] = (False, False)) -> tuple[bool, bool]:
    """Rewrite fit's bound arguments in place so that this rank of `size` trains on its share of each global batch
    (zero-code Horovod); `note` gets one line on what was done. rank_share: the input is already this rank's
    share (exact resume's pipeline, resume.py); own_split: the ranks' training and validation data already differ
    (fit/own_shards.py), each left as it is. Returns whether the ranks' training and validation data now differ
    (split here, or sharded by the script): only then are their metric states the global ones' parts."""
    x = arguments.get("x")
    if own_split[0]:
        note("the ranks' inputs differ (the script splits its data itself): each rank trains on its own batches, "
             "not split again")
        return True, _adapt_validation(arguments, keras, arguments.get("batch_size") or 32, rank, size, own_split[1])
    batch_size = arguments.get("batch_size") or 32
    done = ""
    arrays_given = x is not None and is_array_input(x)
    if arrays_given and arguments.get("y") is None and arguments.get("sample_weight") is not None:
        note("sample_weight without y: the input is not split, every rank trains on all of it")
        return False, False
    if rank_share:
        done = "batches positioned (exact resume, Keras' orders of numpy input) taken as global batches"
    elif arrays_given:
        arrays = take_validation_split(arguments)
        shuffle = arguments.get("shuffle", True) is not False
        arguments["x"] = array_dataset(arrays, batch_size, shuffle, rank, size)
        for name in ("y", "sample_weight", "batch_size"):
            arguments.pop(name, None)
        arguments["shuffle"] = False  # the dataset draws the order: Keras' default True would warn it is ignored
        done = f"arrays in global batches of {batch_size}"
    elif x is not None and is_dataset(x) and is_sharded(x):
        note("the script shards its dataset itself: left as it is")
        return True, False
    elif x is not None and (shared := _share_of_batches(x, keras, rank, size)) is not None:
        arguments["x"], kind = shared
        done = f"{kind} batches taken as global batches"
    elif x is not None and hasattr(x, "__next__"):
        generator = x
        arguments["x"] = (_cut_structure(batch, rank, size) for batch in generator)
        done = "generator batches taken as global batches"
    elif x is not None:
        note(f"input of type {type(x).__name__} is not split: every rank trains on all of it")
    validation_differs = _adapt_validation(arguments, keras, batch_size, rank, size, own_split[1])
    if done:
        note(f"{done}, each rank training on its 1/{size} of every batch")
    return bool(done), validation_differs


def take_validation_split(arguments: dict) -> tuple:
    """The training arrays of fit's bound arguments; a validation_split becomes validation_data by Keras' rule (the
    last fraction, before shuffling)."""
    import tensorflow as tf

    arrays = tuple(arguments.get(name) for name in ARRAY_ARGS if arguments.get(name) is not None)
    split = float(arguments.get("validation_split") or 0.0)
    if split and arguments.get("validation_data") is None:
        cut = int(first_length(arrays) * (1.0 - split))
        arguments["validation_data"] = tf.nest.map_structure(lambda a: a[cut:], arrays)
        arrays = tf.nest.map_structure(lambda a: a[:cut], arrays)
    arguments["validation_split"] = 0.0
    return arrays


def _cut_structure(batch: Any, rank: int, size: int) -> Any:
    """This rank's share of a Python-side batch: (x, y[, w]) tuples, lists of inputs, dicts, arrays (a list of
    numbers becomes an array)."""
    import numpy as np

    if isinstance(batch, tuple) or (isinstance(batch, list) and batch and all(hasattr(b, "shape") for b in batch)):
        return type(batch)(_cut_structure(b, rank, size) for b in batch)  # (x, y, w), or a list of model inputs
    if isinstance(batch, Mapping):
        return {k: _cut_structure(v, rank, size) for k, v in batch.items()}
    if batch is None:
        return None
    if isinstance(batch, list):
        batch = np.asarray(batch)
    start, end = share(len(batch), rank, size)
    return batch[start:end]


def _adapt_validation(arguments: dict, keras: Any, batch_size: int, rank: int, size: int, own_split: bool) -> bool:
    """This rank's share of the validation data, where it can be split; whether the ranks' validation data differ
    (own_split: they do already, the script's own split, left as it is)."""
    data = arguments.get("validation_data")
    if data is None or own_split:
        return own_split
    validation_batch = arguments.get("validation_batch_size") or batch_size
    if isinstance(data, tuple) and data and all(d is None or is_array_input(d) for d in data):
        arrays = tuple(d for d in data if d is not None)
        arguments["validation_data"] = array_dataset(arrays, validation_batch, False, rank, size)
        arguments.pop("validation_batch_size", None)
        return True
    if is_dataset(data) and is_sharded(data):
        return True
    if shared := _share_of_batches(data, keras, rank, size):
        arguments["validation_data"] = shared[0]
        return True
    return False


def _share_of_batches(data: Any, keras: Any, rank: int, size: int) -> tuple[Any, str] | None:
    """This rank's share of input that yields global batches (tf.data, PyDataset/Sequence) and what it was;
    None for anything else."""
    if is_dataset(data):
        return rank_slices(even_out_last_batch(data, size), rank, size), "tf.data"
    if _is_sequence(keras, data):
        return rank_share_of_sequence(keras, data, rank, size), "PyDataset"
    return None
