"""tf_keras under MultiWorkerMirroredStrategy: the values a train or test step returns are the global ones already
(its metrics' results are synchronised across the workers), and `reduce_per_replica`'s multi-worker branch sums
them once more over the workers when `distribute_reduction_method` is "auto", which tf_keras reads as "sum"
outside TPUs (keras-team/keras#16664, seen there in keras-team/keras#16922): `train_on_batch`, `test_on_batch` and
every batch log a callback reads say N x the loss (fit's History and `evaluate` read the metrics again, and are
right). A model whose steps are tf_keras' own gets "first", the value every worker holds; a model whose script set
a reduction, or wrote its own train_step or test_step, is left as it is.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import threading
from typing import Any

_SUMS_OVER_WORKERS = re.compile(
    r"""if _collective_all_reduce_multi_worker\(strategy\):(.|\n)*?strategy\.reduce\(\s*["']SUM["']""")
TRAINING_MODULE = "tf_keras.src.engine.training"


@functools.cache
def sums_synchronised_logs() -> bool:
    """Whether this tf_keras' reduce_per_replica has the multi-worker sum (read from its source)."""
    training = importlib.import_module(TRAINING_MODULE)
    return bool(_SUMS_OVER_WORKERS.search(inspect.getsource(training.reduce_per_replica)))


def first_replicas_logs(model: Any) -> None:
    """Set the model's reduction to "first" where it is tf_keras' "auto" and its steps are tf_keras' own (and this
    tf_keras still sums: fixed upstream, this does nothing)."""
    if not sums_synchronised_logs():
        return
    # patch: tf_keras_mwm.first_replica_logs
    if not custom_steps(model) and model.distribute_reduction_method == "auto":
        model.distribute_reduction_method = "first"


# A script's own train_step (and test_step) under a strategy with several replicas (keras-team/keras#16664's
# neighbours): tf_keras sums the replicas' gradients, counting on its own loss being scaled by 1/replicas
# (`scale_loss_for_distribution`, in `compiled_loss`); a step that computes its loss itself (Keras' guide
# "Customizing what happens in fit()", a loss function, `tf.reduce_mean`) trains with N x the gradient, and one
# given `compute_loss`'s value logs it scaled. The values such a step returns are each replica's own, which
# tf_keras then sums over the workers (N x a loss in every batch's logs and the progress bar). Within the step
# distrain undoes the loss scaling and averages the gradients instead: the gradient of the global batch's mean
# loss, as one process computes it; the values it returns are averaged over the replicas and read once ("first");
# its Loss objects reduce as in one process, where tf_keras refuses them. A step that scales its loss for
# distribution itself (`tf.nn.compute_average_loss`, a Loss with `Reduction.SUM`: written for a strategy) trains
# and logs as tf_keras has it (gradients and values summed); one that divides by the global batch by hand is not
# told apart (README: Keras).
_IN_STEP = threading.local()  # at trace time, on the replica's thread: inside a script's own step, and whether
# that step scaled its loss itself
STEPS = ("train_step", "test_step")


def apply() -> None:
    """The fixes a tf_keras run under a strategy with several replicas needs from its start: a script's own steps
    as one process's (they act on the models `one_process_custom_steps` is given), weights files read as arrays."""
    _undo_scaling_in_steps()
    _weights_read_as_arrays()


@functools.cache
def _weights_read_as_arrays() -> None:
    """tf_keras' `load_weights` of a `.weights.h5` file (TensorFlow's tutorial "Distributed training with Keras")
    assigns each h5py dataset as it is; a sync-on-read variable's assign divides it by the replicas (TypeError:
    unsupported operand type(s) for /: 'Dataset' and 'int'). Each layer's entries are read as arrays first."""
    import numpy as np

    layer_cls = importlib.import_module("tf_keras.src.engine.base_layer").Layer
    load = layer_cls.load_own_variables

    def load_own_variables(self: Any, store: Any) -> Any:
        return load(self, {key: np.asarray(store[key]) for key in store})  # an h5py group: a dict of arrays

    # patch: tf_keras_mwm.weights_as_arrays
    layer_cls.load_own_variables = load_own_variables


def custom_steps(model: Any) -> list[str]:
    """The steps of `model`'s class that are the script's own, not tf_keras'."""
    base = importlib.import_module(TRAINING_MODULE).Model
    return [step for step in STEPS if getattr(type(model), step) is not getattr(base, step)]


def one_process_custom_steps(model: Any) -> bool:
    """Make `model`'s own train_step and test_step compute and log what one process does (above), where it has
    any and several replicas; True if it did. Its reduction becomes "first" where it is "auto"."""
    steps = custom_steps(model)
    if not steps or model.distribute_strategy.num_replicas_in_sync < 2 or model.distribute_reduction_method != "auto":
        return False
    _undo_scaling_in_steps()
    # patch: tf_keras_mwm.custom_step_logs
    for step in steps:
        owner = next(cls for cls in type(model).__mro__ if step in vars(cls))
        if not getattr(vars(owner)[step], "__distrain_one_process__", False):
            setattr(owner, step, _as_one_process(vars(owner)[step]))
    model.distribute_reduction_method = "first"
    return True


def _as_one_process(step: Any) -> Any:
    @functools.wraps(step)
    def one_process_step(self: Any, data: Any) -> Any:
        import tensorflow as tf

        _IN_STEP.active, _IN_STEP.script_scales = True, False
        try:
            logs = step(self, data)
        finally:
            _IN_STEP.active = False
        replica = tf.distribute.get_replica_context()
        if replica is None or tf.distribute.get_strategy().num_replicas_in_sync < 2:
            return logs
        # a step that scaled its loss itself is read as tf_keras reads it (summed); else as one process's mean
        reduce_op = tf.distribute.ReduceOp.SUM if _IN_STEP.script_scales else tf.distribute.ReduceOp.MEAN
        # tf.identity: a metric's result comes out of a cross-replica merge with no device, and an all-reduce of it
        # fails ("destinations can not be empty")
        return tf.nest.map_structure(lambda v: replica.all_reduce(reduce_op, tf.identity(v))
                                     if tf.is_tensor(v) and v.dtype.is_floating else v, logs)

    # patch: tf_keras_mwm.custom_step_logs
    one_process_step.__distrain_one_process__ = True
    return one_process_step


def _unscaled_in_steps() -> bool:
    return getattr(_IN_STEP, "active", False) and not getattr(_IN_STEP, "script_scales", False)


@functools.cache
def _undo_scaling_in_steps() -> None:
    """Once a process: tf_keras' loss scaling and gradient sum as one process's mean within a script's own step."""
    import tensorflow as tf

    losses = importlib.import_module("tf_keras.src.utils.losses_utils")
    optimizers = importlib.import_module("tf_keras.src.optimizers.utils")
    scale, sum_gradients = losses.scale_loss_for_distribution, optimizers.all_reduce_sum_gradients

    def scale_loss_for_distribution(loss_value: Any) -> Any:
        return loss_value if _unscaled_in_steps() else scale(loss_value)

    def all_reduce_sum_gradients(grads_and_vars: Any) -> Any:
        if _unscaled_in_steps():
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            grads_and_vars = [(_divided(g, replicas), v) for g, v in grads_and_vars]
        return sum_gradients(grads_and_vars)

    # patch: tf_keras_mwm.custom_step_gradients
    losses.scale_loss_for_distribution = scale_loss_for_distribution
    optimizers.all_reduce_sum_gradients = all_reduce_sum_gradients
    _loss_objects_as_in_one_process(importlib.import_module("tf_keras.src.losses").Loss, losses.ReductionV2)
    # patch: tf_keras_mwm.script_scales_its_loss
    for name in ("compute_average_loss", "scale_regularization_loss"):
        setattr(tf.nn, name, _noting_script_scales(getattr(tf.nn, name)))


def _loss_objects_as_in_one_process(loss_cls: type, reduction: Any) -> None:
    """A Loss object called in a script's own step: a mean as in one process (tf_keras refuses its default
    reduction under a strategy outside its own steps, "Please use `tf.keras.losses.Reduction.SUM`"); one that
    sums (Reduction.SUM, as that message asks) is a step written for the replicas' sum."""
    get_reduction = loss_cls._get_reduction  # patch: tf_keras_mwm.custom_step_losses

    def _get_reduction(self: Any) -> Any:
        if getattr(_IN_STEP, "active", False) and self.reduction == reduction.SUM:
            _IN_STEP.script_scales = True
        if _unscaled_in_steps() and self.reduction in (reduction.AUTO, reduction.SUM_OVER_BATCH_SIZE):
            return reduction.SUM_OVER_BATCH_SIZE
        return get_reduction(self)

    # patch: tf_keras_mwm.custom_step_losses
    loss_cls._get_reduction = _get_reduction


def _noting_script_scales(function: Any) -> Any:
    @functools.wraps(function)
    def scales_for_distribution(*args: Any, **kwargs: Any) -> Any:
        if getattr(_IN_STEP, "active", False):
            _IN_STEP.script_scales = True
        return function(*args, **kwargs)

    return scales_for_distribution


def _divided(gradient: Any, replicas: int) -> Any:
    import tensorflow as tf

    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / replicas, gradient.indices, gradient.dense_shape)
    return gradient / replicas
