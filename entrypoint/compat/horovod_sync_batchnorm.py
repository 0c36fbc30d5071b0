"""`BatchNormalization(synchronized=True)` under zero-code Horovod: the global batch's statistics, as the script asks.

Keras computes a synchronized layer's mean and variance from sums all-reduced by the replica context. Under a
tf.distribute strategy (MWM, mirrored) that context spans the replicas, and the numbers are plain python's on the
global batch. Under Horovod there is no strategy: the default context's all-reduce is the rank's own, so each rank
silently normalized its own share of the batch (Keras 3.3, 3 epochs, Horovod x2: loss 0.73607 where plain python
and MWM x2 give 0.72717). Here the same three sums (values, squares, count) are summed over the ranks by Horovod,
as Keras sums them over replicas; Horovod's gradient of a sum is the sum of the gradients, as tf.distribute's.

A script that uses Horovod itself is left as under `horovodrun python` (Keras' layer does not know Horovod there),
and an unsynchronized layer normalizes each rank's share, as under every strategy (README, "Your script,
unchanged").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from . import registry


def moments_over_ranks(x: Any, axes: Any, keepdims: bool, mask: Any = None) -> tuple[Any, Any]:
    """Mean and variance of `x` over `axes` and over every Horovod rank's `x`: Keras' own formula (sums, squared
    sums and counts all-reduced, var = E(x^2) - E(x)^2), with Horovod's all-reduce for the replica context's."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    y = tf.cast(x, tf.float32) if x.dtype == tf.float16 else x  # tf_keras' rule: float16 lacks the range
    if mask is not None:
        weights = tf.expand_dims(tf.cast(mask, y.dtype), axis=-1)
        y = y * weights
        count = tf.broadcast_to(weights, tf.shape(y))
    else:
        count = tf.ones_like(y)
    local = [tf.reduce_sum(t, axis=axes, keepdims=True) for t in (y, tf.square(y), count)]
    total, squares, count = (hvd.allreduce(t, op=hvd.Sum) for t in local)
    mean = tf.math.divide_no_nan(total, count)
    variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    if x.dtype == tf.float16:
        mean, variance = tf.cast(mean, tf.float16), tf.cast(variance, tf.float16)
    return mean, variance


def install(synchronized_moments: str) -> bool:
    """Make the family's synchronized moments (KerasFamily.synchronized_moments) sum over the Horovod ranks; False
    where this Keras has no such function (registry.verify has refused a Keras it does not know)."""
    def over_ranks(original: Callable) -> Callable:
        if inspect.signature(original).parameters.get("self") is not None:  # tf_keras' method
            @functools.wraps(original)
            def replacement(self: Any, x: Any, reduction_axes: Any, keep_dims: bool, mask: Any = None) -> Any:  # noqa: ARG001
                return moments_over_ranks(x, reduction_axes, keep_dims, mask)
        else:
            @functools.wraps(original)
            def replacement(x: Any, axes: Any, keepdims: bool) -> Any:  # type: ignore[misc]
                return moments_over_ranks(x, axes, keepdims)
        return replacement

    return registry.replace(("horovod_sync_batchnorm.keras3_moments", "horovod_sync_batchnorm.tf_keras_moments"),
                            synchronized_moments, over_ranks) is not None
