"""Zero-code Horovod: each step's logs averaged over the ranks within the gradients' own all-reduce.

Each rank's train step logs its own share of the global batch; the progress bar and a batch callback must read the
global batch's numbers (#69). Averaged after the step, they cost a second negotiation round of Horovod's background
thread every step (2.8 ms on 14.5 ms CPU steps: 0.84 of hand-written Horovod's throughput, #87). Keras' own
`train_step` applies the gradients before it computes the metrics, but the metrics read only the step's
predictions: here the optimizer's update waits until the step's logs exist, and the logs' all-reduce is launched
beside the gradients' (Horovod's ops are not stateful in TensorFlow's graph: nothing orders one after the other),
so both are negotiated in the same round. The update is the one the optimizer makes (the same averaged gradients,
the same apply), only later in the step; the logs are averaged as before (float64 means, cast back).

Only where the step is Keras' own and the optimizer distrain's wrapping (`_distrain_wrapped`): a script's own
`train_step` may read its updated weights within the step (a GAN's second optimizer), and another optimizer's
reduction is not distrain's to move. Elsewhere the logs are averaged after the step (fit/sync.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LOGS_NAME = "distrain_batch_logs"


def fusable(model: Any, base_step: Callable[..., Any], horovod_keras_api: bool) -> bool:
    """Whether this model's steps can average their logs within the gradients' all-reduce: Keras' own train_step
    (`base_step`, its Model class's) and distrain's wrapping of the optimizer, Horovod's one-pass one for tf_keras."""
    # patch: horovod_fused_logs.train_step
    optimizer = getattr(model, "optimizer", None)
    if type(model).train_step is not base_step or not getattr(optimizer, "_distrain_wrapped", False):
        return False
    if horovod_keras_api:
        return "_allreduce_grads" in vars(optimizer) and getattr(optimizer, "_agg_helper", None) is None
    return "_distrain_apply_unaveraged" in vars(optimizer)


def install(model: Any, tf: Any, hvd: Any, horovod_keras_api: bool) -> None:
    """Every later step of `model` (its train function traced again) averages its logs within the gradients'
    all-reduce, for the rest of the process: the same numbers, one round a step."""
    # patch: horovod_fused_logs.train_step
    if getattr(model, "_distrain_fused_logs", False):
        return
    original = model.train_step
    deferred = _deferred_tf_keras if horovod_keras_api else _deferred_keras3

    def train_step(data: Any) -> Any:
        return deferred(model.optimizer, lambda: original(data), tf, hvd)

    object.__setattr__(model, "train_step", train_step)  # no Keras attribute tracking
    object.__setattr__(model, "_distrain_fused_logs", True)
    model.train_function = None  # one traced before (train_on_batch) would not average its logs


def _scalar_keys(logs: Any) -> list:
    if not isinstance(logs, dict):
        return []
    return [key for key in sorted(logs) if getattr(logs[key], "shape", None) == ()
            and getattr(getattr(logs[key], "dtype", None), "is_floating", False)]


def _averaged_logs(logs: Any, tf: Any) -> tuple[list, Callable[[list], Any]]:
    """The logs' float64 tensors to average, and what makes the logs of their means."""
    keys = _scalar_keys(logs)
    values = [tf.cast(logs[key], tf.float64) for key in keys]
    return values, lambda means: {**logs, **{key: tf.cast(mean, logs[key].dtype) for key, mean in zip(keys, means)}}


def _deferred_keras3(optimizer: Any, step: Callable[[], Any], tf: Any, hvd: Any) -> Any:
    """Keras 3: distrain's `apply` (compat/keras3_horovod.wrap_optimizer) recorded during the step, then the
    gradients' and the logs' all-reduces side by side, then Keras' own apply with the averaged gradients."""
    # patch: horovod_fused_logs.train_step
    recorded: list = []
    averaging = optimizer.apply
    object.__setattr__(optimizer, "apply", lambda grads, variables=None: recorded.append((list(grads), variables)))
    try:
        logs = step()
    finally:
        object.__setattr__(optimizer, "apply", averaging)
    values, rebuilt = _averaged_logs(logs, tf)
    means = hvd.grouped_allreduce(values, op=hvd.Average, name=LOGS_NAME) if values else []
    for grads, variables in recorded:
        present = [i for i, grad in enumerate(grads) if grad is not None]
        reduced = hvd.grouped_allreduce([grads[i] for i in present], op=hvd.Average, name="distrain_grads")
        for i, value in zip(present, reduced):
            grads[i] = value
        optimizer._distrain_apply_unaveraged(grads, variables)
    return rebuilt(means)


def _deferred_tf_keras(optimizer: Any, step: Callable[[], Any], tf: Any, hvd: Any) -> Any:
    """tf_keras: Horovod's DistributedOptimizer reduces the gradients in `_allreduce_grads` and applies them in
    `apply_gradients`; both recorded during the step, then its own reduction runs over the gradients and the
    logs together, and its own `apply_gradients` with the averaged gradients."""
    # patch: horovod_fused_logs.train_step
    reduce, recorded = optimizer._allreduce_grads, {}

    def held(grads: Any, variables: Any = None) -> list:
        recorded["reduce"] = (list(grads), list(variables or []))
        return list(grads)

    object.__setattr__(optimizer, "_allreduce_grads", held)
    object.__setattr__(optimizer, "apply_gradients", lambda *args, **kwargs: recorded.setdefault("apply",
                                                                                                 (args, kwargs)))
    try:
        logs = step()
    finally:
        object.__setattr__(optimizer, "_allreduce_grads", reduce)
        object.__delattr__(optimizer, "apply_gradients")
    values, rebuilt = _averaged_logs(logs, tf)
    grads, variables = recorded.get("reduce", ([], []))
    reduced = reduce(grads + values, variables + [None] * len(values)) if grads or values else []
    reduced_of = {id(grad): value for grad, value in zip(grads, reduced)}
    if "apply" in recorded:
        args, kwargs = recorded["apply"]
        pairs = [(reduced_of.get(id(grad), grad), variable) for grad, variable in args[0]]
        optimizer.apply_gradients(pairs, *args[1:], **kwargs)
    return rebuilt(list(reduced[len(grads):]))
