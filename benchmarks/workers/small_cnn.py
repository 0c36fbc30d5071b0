"""The work the benchmarks' workers train: a small CNN on one fixed synthetic batch, each worker on one core.

workload.py and fit_in_process.py import it, so the two measure the same step by construction, not by copy.
"""

import os
from typing import Any, Callable


def pin_to_one_core(local_rank: int) -> None:
    """Every thread of this process to one of the cores it was given (workers/account.py), by local rank, so two
    workers on a small machine do not fight over its cores. Call it after TensorFlow's import, as distrain does:
    threads made later inherit the mask from their creator (the runner sets TF_NUM_INTRAOP_THREADS)."""
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[local_rank % len(allowed)]
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), {core})


def build(keras: Any, wrap_optimizer: Callable[[Any], Any] = lambda optimizer: optimizer) -> Any:
    """The compiled model, in whatever strategy scope the caller entered (`wrap_optimizer`: Horovod's)."""
    model = keras.Sequential([
        keras.layers.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10),
    ])
    model.compile(optimizer=wrap_optimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def batches(tf: Any, batch: int, count: int) -> Any:
    """One random batch of `batch` images and labels, `count` times: the input costs next to nothing."""
    images = tf.random.uniform((batch, 32, 32, 3), seed=1)
    labels = tf.random.uniform((batch,), maxval=10, dtype=tf.int32, seed=1)
    return tf.data.Dataset.from_tensors((images, labels)).repeat(count)
