"""Horovod for Keras 3, through `horovod.tensorflow`, since `horovod.tensorflow.keras` cannot drive Keras 3.

With Keras 3, Horovod 0.28.1's Keras API breaks (horovod/horovod#4290, its fix withdrawn):
`BroadcastGlobalVariablesCallback` fails ("'Variable' object has no attribute 'ref'"), `MetricAverageCallback`
fails (`keras.backend` has no `constant`), and `DistributedOptimizer` raises nothing but does not average the
gradients, so ranks silently drift apart. `horovod.tensorflow` works on the variables' backing `tf.Variable`s.
This module gives the three things Horovod's Keras API would: averaged gradients in the optimizer's apply
step, rank 0's initial variables on every rank before the first step, averaged epoch metrics.

`broken()` checks that the defect is there (Horovod's Keras module still resolves `keras` to Keras 3's backend
without `constant`), so the day Horovod supports Keras 3 this module can go.
"""

from __future__ import annotations

from typing import Any


def tf_variables(variables: Any) -> list:
    """Keras 3 variables wrap a tf.Variable in `.value`; Horovod (and tf.distribute code) needs the tf.Variable."""
    import tensorflow as tf

    return [v if isinstance(v, tf.Variable) else getattr(v, "value", v) for v in variables]


def broadcastable(variables: Any) -> list:
    """The tf.Variables Horovod can broadcast. Horovod has no unsigned 32/64-bit type ("DataType uint32 not in
    list of allowed values"), and Keras 3 before keras-team/keras#19928 (3.3.x, NGC's image) keeps the state of
    every SeedGenerator (Dropout's) in a uint32 variable: that state stays each rank's own, as each rank's dropout
    masks do; the weights are still rank 0's. From Keras 3.5 on the state is int64 and is broadcast too."""
    return [v for v in tf_variables(variables) if v.dtype.name not in ("uint32", "uint64")]


class TapeOverTFVariables:
    """Horovod's DistributedGradientTape keys gradients by `variable.ref()`, which Keras 3 variables lack: hand
    it their tf.Variables (the gradients are the same)."""

    def __init__(self, tape: Any) -> None:
        self._tape = tape

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(sources, (list, tuple)):
            sources = tf_variables(sources)
        return self._tape.gradient(target, sources, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def wrap_optimizer(optimizer: Any, hvd: Any) -> Any:
    """Average the gradients across ranks in the optimizer's `apply` (what `apply_gradients` calls)."""
    if getattr(optimizer, "_distrain_wrapped", False):
        return optimizer
    original = optimizer.apply

    def apply(grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        averaged = hvd.grouped_allreduce([grads[i] for i in present], op=hvd.Average, name="distrain_grads")
        for i, value in zip(present, averaged):
            grads[i] = value
        return original(grads, trainable_variables)

    # patch: keras3_horovod.optimizer_apply
    optimizer.apply = apply
    optimizer._distrain_apply_unaveraged = original  # compat/horovod_fused_logs.py averages the gradients itself
    optimizer._distrain_wrapped = True
    return optimizer


def callbacks(keras: Any, hvd: Any) -> list:
    """Broadcast rank 0's variables (at the start and after the first step, when the optimizer exists) and
    average the epoch's metrics."""

    class BroadcastFromRankZero(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._done_after_first_step = False
            self._local_vars: set = set()

        def register_local_var(self, var: Any) -> None:
            """Not broadcast after the first step (as Horovod's own callback's method of that name)."""
            self._local_vars.add(var.ref())

        def _broadcast(self) -> None:
            variables = list(self.model.variables)
            if self.model.optimizer is not None and getattr(self.model.optimizer, "built", False):
                variables += list(self.model.optimizer.variables)
            variables = [v for v in broadcastable(variables) if v.ref() not in self._local_vars]
            hvd.broadcast_variables(variables, root_rank=0)

        def on_train_begin(self, logs: Any = None) -> None:
            if self.model.built:
                self._broadcast()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if not self._done_after_first_step:
                self._done_after_first_step = True
                self._broadcast()

    class AverageMetrics(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if not logs:
                return
            import tensorflow as tf

            for key in sorted(logs):
                value = logs[key]
                if isinstance(value, (int, float)) or getattr(value, "shape", None) == ():
                    logs[key] = float(hvd.allreduce(tf.constant(float(value)), op=hvd.Average,
                                                    name=f"distrain_metric_{key}"))

    return [BroadcastFromRankZero(), AverageMetrics()]


def adopt_tensorflow_api(hvd: Any, keras: Any) -> bool:
    """A Keras 3 script using Horovod's TensorFlow API (`hvd.DistributedGradientTape(tape)`,
    `hvd.broadcast_variables(model.variables, 0)`) fails with "'Variable' object has no attribute 'ref'":
    Horovod 0.28.1 keys variables by `ref()`, which Keras 3 variables lack (horovod/horovod#4290's family).
    Hand Horovod their tf.Variables, the same values, less the uint32 seed states it cannot broadcast (a model
    with Dropout, as Horovod's own tensorflow2_mnist.py: `broadcastable`). Applied only where the defect is there;
    True if applied."""
    if hasattr(keras.Variable, "ref") or getattr(hvd, "_distrain_keras3_variables", False):
        return False
    broadcast, make_tape = hvd.broadcast_variables, hvd.DistributedGradientTape

    def broadcast_variables(variables: Any, root_rank: int, *args: Any, **kwargs: Any) -> Any:
        return broadcast(broadcastable(list(variables)), root_rank, *args, **kwargs)

    def distributed_gradient_tape(gradtape: Any, *args: Any, **kwargs: Any) -> Any:
        return TapeOverTFVariables(make_tape(gradtape, *args, **kwargs))

    # patch: keras3_horovod.tf_variables
    hvd.broadcast_variables, hvd.DistributedGradientTape = broadcast_variables, distributed_gradient_tape
    hvd._distrain_keras3_variables = True
    return True


def hand_tf_variables_to_horovods_api(keras: Any, is_chief: bool) -> None:
    """`adopt_tensorflow_api` where Horovod imports (else the script's own import will say why), said once."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return
    if adopt_tensorflow_api(hvd, keras) and is_chief:
        from ..log import get as log

        log().info("Keras 3 variables handed to Horovod's TensorFlow API as tf.Variables (no .ref())")
