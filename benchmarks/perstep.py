"""distrain's own per-step work, timed directly (run under `distrain run`, so the Plan and engine are real).

- callbacks: the stall watchdog's and the stop check's `on_train_batch_begin/end`, called as fit calls them, with
  the watchdog thread running, in microseconds per step;
- input: distrain's rewrites as tf.data pipelines alone, iterated at a high batch rate against plain tf.data on the
  same arrays (time of plain / time of the rewrite: >= 1 is as fast): exact resume's positioned numpy pipeline
  against the pipeline Keras 3 itself builds from numpy arrays (what `fit` trains on without distrain) and
  against `from_tensor_slices().shuffle().batch()`, the even last batch (MWM: where the last batch splits as it
  is, and where a last batch of one sample is topped up) and Horovod's rank slices on top of the plain pipeline
  against it alone.

Prints `BENCH {...}` for benchmarks/run.py perstep.
"""

import argparse
import json
import statistics
import time

import numpy as np
import tensorflow as tf

from entrypoint import batches, stalls, stopping
from entrypoint.runtime import STATE

parser = argparse.ArgumentParser()
parser.add_argument("--reps", type=int, default=5)
parser.add_argument("--smoke", action="store_true")
args = parser.parse_args()
plan, engine, keras = STATE.plan, STATE.engine, STATE.keras
calls = 2_000 if args.smoke else 100_000


def callback_cost(callback) -> float:
    """Microseconds per step of a callback's per-step hooks (the median of the repetitions)."""
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    per_rep = []
    for _ in range(args.reps):
        start = time.perf_counter()
        for step in range(calls):
            callback.on_train_batch_begin(step)
            callback.on_train_batch_end(step)
        per_rep.append((time.perf_counter() - start) / calls * 1e6)
    callback.on_epoch_end(0)
    callback.on_train_end()
    return statistics.median(per_rep)


callbacks = {"stall watchdog": callback_cost(stalls.make_callback(plan, keras)),
             "stop check": callback_cost(stopping.make_callback(plan, keras, tf, engine, None))}

samples, batch = (8_192, 64) if args.smoke else (262_144, 64)  # 4,096 batches: about 0.6 s an epoch
rng = np.random.default_rng(0)
x, y = rng.random((samples, 16), dtype=np.float32), rng.integers(0, 10, samples)


def plain(count: int = samples):
    return tf.data.Dataset.from_tensor_slices((x[:count], y[:count])).shuffle(count, seed=1).batch(batch).prefetch(
        tf.data.AUTOTUNE)


def short_last():
    return plain(samples - batch + 1)  # a last batch of one sample: on 2 replicas it must be topped up


def keras_numpy():
    """What `fit(x, y, batch_size=64, shuffle=True)` trains on without distrain (Keras 3's own numpy pipeline)."""
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    return ArrayDataAdapter(x, y, batch_size=batch, shuffle=True).get_tf_dataset()


pipelines = {
    "positioned numpy (exact resume) vs Keras' own": (keras_numpy, lambda: batches.positioned_array_dataset(
        (x, y), batch, True, first_epoch=0, epochs=1, skip=0)),
    "positioned numpy (exact resume) vs from_tensor_slices": (plain, lambda: batches.positioned_array_dataset(
        (x, y), batch, True, first_epoch=0, epochs=1, skip=0)),
    "even last batch (MWM), last batch splits": (plain, lambda: batches.even_out_last_batch(plain(), 2)),
    "even last batch (MWM), last batch of 1 topped up": (short_last,
                                                         lambda: batches.even_out_last_batch(short_last(), 2)),
    "rank slices (Horovod)": (plain, lambda: batches.rank_slices(batches.even_out_last_batch(plain(), 2), 0, 2)),
}


def epoch_time(make) -> float:
    dataset = make()
    start = time.perf_counter()
    for _ in dataset:
        pass
    return time.perf_counter() - start


inputs = {}
for name, (baseline, rewrite) in pipelines.items():
    epoch_time(baseline), epoch_time(rewrite)  # warm-up: graph building, first allocations
    theirs, ours = [], []
    for _ in range(args.reps):
        theirs.append(epoch_time(baseline))
        ours.append(epoch_time(rewrite))
    per_rep = [a / b for a, b in zip(theirs, ours)]
    inputs[name] = {"ratio": statistics.median(theirs) / statistics.median(ours), "ratio_min": min(per_rep),
                    "ratio_max": max(per_rep), "batches_per_s": samples / batch / statistics.median(ours)}
print("BENCH " + json.dumps({"callbacks_us_per_step": callbacks, "input": inputs}), flush=True)
