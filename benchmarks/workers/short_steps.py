"""A fit with short steps (a tiny dense model, about 1 ms a step on one CPU core): what distrain's per-step hooks
cost where a step is short, as on a GPU. The overhead workload's 12-37 ms steps, and its own per-batch callback
(which switches tf_keras' per-batch callback machinery on for both sides), hide it.

    TF_USE_LEGACY_KERAS=1 taskset -c 0 .venv/bin/python benchmarks/workers/short_steps.py
    DISTRAIN_KERAS=legacy taskset -c 0 .venv/bin/distrain run benchmarks/workers/short_steps.py

Each epoch after the first prints `SHORT {"epoch", "wall_us", "main_cpu_us"}`: wall time and the main thread's
CPU time per step. Run the two one after the other, twice, on a machine at rest.
"""

import json
import time

import numpy as np
import tensorflow as tf

keras = tf.keras
STEPS, BATCH = 4000, 64
rng = np.random.default_rng(0)
x = rng.random((STEPS * BATCH, 8), dtype=np.float32)
y = x.sum(axis=1)
model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")


class PerStep(keras.callbacks.Callback):
    """Epoch hooks only: without distrain, tf_keras calls no per-batch hook at all."""

    def on_epoch_begin(self, epoch, logs=None):
        self.began, self.began_cpu = time.perf_counter(), time.thread_time()

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:  # the first epoch traces the step
            print("SHORT " + json.dumps({"epoch": epoch, "wall_us": 1e6 * (time.perf_counter() - self.began) / STEPS,
                                          "main_cpu_us": 1e6 * (time.thread_time() - self.began_cpu) / STEPS}),
                  flush=True)


model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=4, verbose=0, callbacks=[PerStep()])
