"""A script that splits its data between the ranks itself: found by comparing the ranks' inputs, never split again.

A script that keeps its share of a file list by `TF_CONFIG`'s task index or `SLURM_PROCID` (the seeds' guides), or
by `dataset.shard(...)`, hands each rank other data. MWM's auto-sharding would then cut each rank's share again
(half of the data an epoch on 2 workers, nothing said), and so would zero-code Horovod's split of every batch.
`ranks_inputs_differ` tells it before the fit trains: each rank digests its input (a dataset's graph: its files,
shard indices, arrays; numpy arrays' first rows and length), and the engine compares the digests (one collective).
Where they differ, the script's split is kept: under MWM the dataset's auto-sharding is turned off (TensorFlow's
advice for a dataset sharded by hand: each worker's batches are then its share of the global batches, `batch_size`
still the global batch), under Horovod each rank trains on its own batches (as a `dataset.shard` of Horovod's
examples is left, batches.is_sharded). numpy arrays that differ between MWM's workers become each worker's own
dataset of global batches (fit/arrays.py's pipeline, shuffled as it shuffles numpy), left unsplit the same way.

A generator or PyDataset is not compared (only reading it would tell, and a read batch would be lost); a dataset's
split made inside a function of its own (a `filter` on the rank) is not seen. A file is known by its name and size,
not its directory: the same files copied into each rank's own directory are the same input.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from .arrays import array_dataset, is_array_input, is_dataset

DIGEST_BITS = 20  # each rank's digest; compared as sums of v and v**2 in float64: exact below 2**26 for 2**12 ranks
CONSTANT_BYTES = 1 << 20  # of a dataset's in-memory arrays, what is digested (a split's shares differ from the start)
CONSTANT_STRINGS = 10_000  # of a constant's strings (a file list) and numbers


def input_digest(x: Any) -> int | None:
    """A digest of fit's input as this rank sees it, or None where it cannot be had without reading the input: a
    tf.data dataset's graph constants (its files, shard indices, in-memory arrays, seeds: what a split by rank
    changes; reading a batch would draw a seeded reshuffle's next order, unlike plain python), numpy arrays' first
    rows and length."""
    import numpy as np

    if x is None:
        return None
    if is_dataset(x):
        return _graph_digest(x)
    if is_array_input(x):
        leaves = [np.asarray(a) for a in _flat(x)]
        return _digest([len(leaves[0]) if leaves and leaves[0].ndim else 0,
                        *(leaf[:64] if leaf.ndim else leaf for leaf in leaves)])
    return None


def _flat(structure: Any) -> list:
    import tensorflow as tf

    return [] if structure is None else tf.nest.flatten(structure)


def _digest(parts: list) -> int:
    import numpy as np

    hasher = hashlib.blake2b(digest_size=8)
    for part in parts:
        array = np.ascontiguousarray(part)
        hasher.update(f"{array.dtype}{array.shape}".encode())
        hasher.update(array.tobytes() if array.dtype != object else repr(array.tolist()).encode())
    return int.from_bytes(hasher.digest(), "little") % (1 << DIGEST_BITS)


def _graph_digest(dataset: Any) -> int | None:
    """The constants of the dataset's graph, in its order (a constant's first CONSTANT_BYTES and its size); the
    functions' names, which count traces, left out."""
    import numpy as np
    import tensorflow as tf

    try:
        # patch: own_shards.dataset_graph
        serialized = dataset._as_serialized_graph(
            strip_device_assignment=True,
            external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE).numpy()
    except Exception:  # noqa: BLE001 - a dataset TensorFlow cannot serialize (external state): not compared
        return None
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(str(int(dataset.cardinality())).encode())
    for node in tf.compat.v1.GraphDef.FromString(serialized).node:
        if node.op != "Const":
            continue
        tensor = node.attr["value"].tensor
        hasher.update(f"{tensor.dtype}{tensor.tensor_shape}".encode())
        if tensor.dtype == tf.string.as_datatype_enum:  # a file list: packed in tensor_content past one string
            strings = np.ravel(tf.io.parse_tensor(tensor.SerializeToString(), tf.string).numpy())[:CONSTANT_STRINGS]
            hasher.update(repr([_same_file_anywhere(v) for v in strings]).encode())
            continue
        hasher.update(f"{len(tensor.tensor_content)}".encode())
        hasher.update(tensor.tensor_content[:CONSTANT_BYTES])
        hasher.update(repr(tensor.int64_val[:CONSTANT_STRINGS]).encode())
        hasher.update(repr(tensor.float_val[:CONSTANT_STRINGS]).encode())
    return int.from_bytes(hasher.digest(), "little") % (1 << DIGEST_BITS)


def _same_file_anywhere(value: bytes) -> bytes:
    """A string constant that names a file, as its name and size: the same file copied to each rank's own
    directory (node-local storage, a per-rank staging directory) is the same input; another share is another."""
    try:
        path = value.decode()
        if os.path.isfile(path):
            return f"{os.path.basename(path)}:{os.path.getsize(path)}".encode()
    except (UnicodeDecodeError, ValueError, OSError):
        pass
    return value


def ranks_inputs_differ(engine: Any, arguments: dict) -> tuple[bool, bool]:
    """Whether the ranks' training input and validation data differ (every rank calls it, at the same point of the
    same fit: a collective where some input can be digested)."""
    digests = [input_digest(arguments.get("x")), input_digest(_validation_input(arguments.get("validation_data")))]
    known = [d for d in digests if d is not None]
    if not known:
        return False, False
    differ = iter(engine.differ_between_ranks(known))
    return tuple(next(differ) if d is not None else False for d in digests)  # type: ignore[return-value]


def _validation_input(data: Any) -> Any:
    return data[0] if isinstance(data, tuple) and data and is_array_input(data[0]) else data


def kept(engine: Any, arguments: dict, note: Any, distrain_splits: bool) -> tuple[bool, bool]:
    """Whether the ranks' training and validation data differ, where distrain would split them (`distrain_splits`:
    MWM's strategy, zero-code Horovod); under MWM those that differ are made never to be split again."""
    if engine.size < 2 or not distrain_splits:
        return False, False
    differ = ranks_inputs_differ(engine, arguments)
    _keep_the_workers_split(engine, arguments, differ, note)
    return differ


def _keep_the_workers_split(engine: Any, arguments: dict, differ: tuple[bool, bool], note: Any) -> None:
    """Under MWM: the inputs that differ between the workers made never to be auto-sharded (numpy arrays first
    made each worker's own dataset of global batches)."""
    if not engine.shards_input_itself() or not any(differ):
        return
    import tensorflow as tf

    from .batches import take_validation_split

    batch_size = int(arguments.get("batch_size") or 32)
    if differ[0] and not is_dataset(arguments.get("x")):
        arrays = take_validation_split(arguments)
        arguments["x"] = array_dataset(arrays, batch_size, arguments.get("shuffle", True) is not False)
        for name in ("y", "sample_weight", "batch_size"):
            arguments.pop(name, None)
        arguments["shuffle"] = False  # the dataset draws the order: Keras would warn that it ignores shuffle
    data = arguments.get("validation_data")
    if differ[1] and data is not None and not is_dataset(data):
        arrays = tuple(d for d in data if d is not None)
        arguments["validation_data"] = array_dataset(arrays, int(arguments.pop("validation_batch_size", None)
                                                                 or batch_size), False)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    for name, differs in zip(("x", "validation_data"), differ):
        if differs and is_dataset(arguments.get(name)):
            arguments[name] = arguments[name].with_options(options)
    note(f"the ranks' inputs differ (the script splits its data itself): each worker's batches are its share of "
         f"the global batches, not split again ({engine.size} workers)")
