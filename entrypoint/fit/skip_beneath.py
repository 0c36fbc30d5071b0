"""Skip a resumed epoch's batches where they are cheapest: beneath the stages that make each batch.

A resume at step S of an epoch leaves out its first S batches. `dataset.skip(S)` on top of the script's pipeline
makes each of them (decode, augment, batch) only to drop it: the cost grows with the position (issue 54: 0.7 s
to the first step resumed at step 11, 4.9 s at step 204). Stages that make one output from one input without
state (a `map` whose function is pure, `batch`, `prefetch`) give the same later elements whether the skipped
ones were made or not, so the skip can go beneath them: S batches of `batch(B)` are S * B elements of its input.
The walk stops at the first stage that is not one of those (a `shuffle`, whose order needs every element, a
`filter`, an `interleave`, the source) and puts the skip there; the stages above are built again on top of it,
with the same functions. A map whose function holds state (random ops drawing from a generator, a variable, a
`py_function`) would compute other values after a skip: the skip stays above it, and the reason is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ONE_TO_ONE = {"_MapDataset", "_ParallelMapDataset", "_BatchDataset", "_PrefetchDataset", "_OptionsDataset",
              "_AssertCardinalityDataset"}
# the stages a skip may pass beneath (TensorFlow's private class names, 2.17 to 2.21)


def skip_batches(dataset: Any, count: int) -> tuple[Any, str | None]:
    """`dataset` without its first `count` elements (batches), and why the skip had to make them (None: it did
    not, or only below stages that must see every element anyway)."""
    if count <= 0:
        return dataset, None
    skipping, why = skipper(dataset)
    return skipping(count), why


def skipper(dataset: Any) -> tuple[Callable[[Any], Any], str | None]:
    """A function from a count (an int, or a scalar int64 tensor inside a dataset function) to `dataset` without
    its first `count` elements, and why it makes them (see skip_batches)."""
    # patch: tfdata.pipeline_stages
    rebuilds: list[Callable[[Any], Any]] = []
    stage, factor, why = dataset, 1, None
    while type(stage).__name__ in ONE_TO_ONE:
        step = _one_to_one(stage)
        if isinstance(step, str):
            why = step
            break
        rebuild, per_output = step
        rebuilds.append(rebuild)
        stage, factor = stage._input_dataset, factor * per_output
    if not rebuilds:
        return dataset.skip, why or f"its last stage ({type(dataset).__name__.strip('_')}) comes first"
    beneath = stage

    def skipping(count: Any) -> Any:
        rebuilt = beneath.skip(count * factor)
        for rebuild in reversed(rebuilds):
            rebuilt = rebuild(rebuilt)
        return rebuilt

    return skipping, why


def _one_to_one(stage: Any) -> tuple[Callable[[Any], Any], int] | str:
    """How to build `stage` again on another input and how many input elements one of its outputs takes; or why
    the skip cannot pass beneath it."""
    # patch: tfdata.pipeline_stages
    import tensorflow as tf

    kind = type(stage).__name__
    try:
        if kind == "_AssertCardinalityDataset":  # a check of the whole epoch's length: the skipped one is shorter
            return (lambda d: d), 1
        if kind == "_OptionsDataset":
            options = stage.options()
            return (lambda d: d.with_options(options)), 1
        if "Prefetch" in kind:
            buffer = int(stage._buffer_size)
            return (lambda d: d.prefetch(buffer)), 1
        if "Batch" in kind:
            size, drop = int(stage._batch_size), bool(stage._drop_remainder)
            return (lambda d: d.batch(size, drop_remainder=drop)), size
        function = stage._map_func.function
        if function.function_def.signature.is_stateful:
            return "its map holds state (random numbers, a variable, a py_function): each batch passed over is made"
        out_spec, parallel = stage.element_spec, "Parallel" in kind
        specs = tf.nest.flatten((stage._input_dataset.element_spec, out_spec))
        if not all(isinstance(spec, tf.TensorSpec) for spec in specs):
            return "its map takes or makes ragged or sparse tensors: each batch passed over is made"

        def apply(*element: Any) -> Any:
            flat = tf.nest.flatten(element[0] if len(element) == 1 else element)
            return tf.nest.pack_sequence_as(out_spec, tf.nest.flatten(function(*flat)))

        if parallel:
            return (lambda d: d.map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)), 1
        return (lambda d: d.map(apply)), 1
    except (AttributeError, TypeError, ValueError):  # private TensorFlow attributes: any surprise, no rewrite
        return f"its {kind} stage is not one distrain can rebuild"
