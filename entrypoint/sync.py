"""Keep the ranks' non-trainable state identical: BatchNormalization's moving statistics and the like.

Gradients are averaged, so trainable weights stay identical; non-trainable state is updated by each rank from its
own batches. tf_keras under MWM creates it ON_READ with MEAN aggregation, so reading it averages across workers,
but with a collective that a chief-only save never completes (compat/adopt.local_reads reads it locally, so the
local copies must be equal). Keras 3's TensorFlow variables do not aggregate (3.3.x ignores `aggregation`, later
3.x default to "none"), and Horovod never did: each rank keeps, and the chief saves, its own moving mean. This
callback averages the floating-point non-trainable variables across ranks at every epoch end and at the end of
training, before the checkpoint and user callbacks that read them, so every rank ends with the same model.
"""

from __future__ import annotations

from typing import Any

from .compat.keras3_horovod import tf_variables


def make_callback(keras: Any, tf: Any, engine: Any) -> Any:
    strategy = engine.strategy

    def state(model: Any) -> list:
        return [v for v in tf_variables(model.non_trainable_variables) if v.dtype.is_floating]

    if engine.hvd is not None:
        import horovod.tensorflow as hvd  # its Keras module (tf_keras runs) has no grouped_allreduce

        def average(variables: list) -> None:
            values = hvd.grouped_allreduce([tf.identity(v) for v in variables], op=hvd.Average,
                                           name="distrain_state")
            for variable, value in zip(variables, values):
                variable.assign(value)
    else:
        @tf.function
        def _mean(variables: list) -> Any:
            local = strategy.run(lambda: [tf.identity(v) for v in variables])
            return [strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None) for value in local]

        def average(variables: list) -> None:
            for variable, value in zip(variables, _mean(variables)):
                variable.assign(value)

    class AverageNonTrainableState(keras.callbacks.Callback):
        def _sync(self) -> None:
            variables = state(self.model)
            if variables:
                average(variables)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._sync()

        def on_train_end(self, logs: Any = None) -> None:
            self._sync()

    return AverageNonTrainableState()
