"""distrain's per-step work as a batch callback against as an observer of the train function (entrypoint/fit/steps.py),
and neither, in one process: epochs of a short-step fit (a tiny dense model, about 0.5 ms of the training
thread's CPU a step) alternating between the three, the order rotated every repetition. On tf_keras a batch
callback switches the per-batch callback machinery on; Keras 3 on TensorFlow calls every batch hook anyway.

    TF_USE_LEGACY_KERAS=1 taskset -c 0 .venv/bin/python benchmarks/workers/observer_ways.py     (or 0: Keras 3)

`benchmarks/run.py perstep` runs it for both Keras families. Prints `OBSERVERS {...}`: the training thread's CPU
per step, median epoch of each way, in microseconds, and the Python calls (function and builtin calls,
`sys.setprofile`) the training thread makes per step each way: a count that a noisy VM cannot blur, where 50 µs
of a 550 µs step is within one epoch's spread.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from entrypoint.fit import stalls, steps, stopping
from entrypoint.plan import detect

parser = argparse.ArgumentParser()
parser.add_argument("--reps", type=int, default=6)
parser.add_argument("--steps", type=int, default=2000)
args = parser.parse_args()

keras = tf.keras
BATCH = 64
rng = np.random.default_rng(0)
x = rng.random((args.steps * BATCH, 8), dtype=np.float32)
y = x.sum(axis=1)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
plan = detect({"DISTRAIN_CHECKPOINT": "0"}, gpus=[])


class AsBatchCallback(keras.callbacks.Callback):
    """The way before steps.py: the same observers called from on_train_batch_end."""

    def __init__(self, observers):
        super().__init__()
        self._supports_tf_logs = True
        self.observers = observers

    def on_train_batch_end(self, batch, logs=None):
        for observer in self.observers:
            observer()


def epoch(way: str) -> float:
    position = steps.TrainingPosition()
    watch = stalls.make_callback(plan, keras, position)
    stop = stopping.make_callback(plan, keras, tf, None, None, stopping.SignalFlag(), position)
    position.observers = [watch.step_ended, stop.step_ended]
    callbacks = {"none": [],
                 "batch callback": [watch, stop, AsBatchCallback([watch.step_ended, stop.step_ended])],
                 "train-function observer": [steps.make_callback(keras, position), watch, stop]}[way]
    began = time.thread_time()
    if way == "train-function observer":
        with steps.observed(model, position):
            model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
    else:
        model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
    return 1e6 * (time.thread_time() - began) / args.steps


def calls_per_step(way: str) -> float:
    calls = 0

    def count(frame, event, arg):  # noqa: ARG001
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        epoch(way)
    finally:
        sys.setprofile(None)
    return calls / args.steps


WAYS = ["none", "batch callback", "train-function observer"]
for way in WAYS:
    epoch(way)  # trace, warm up
calls = {way: calls_per_step(way) for way in WAYS}
times: dict[str, list[float]] = {way: [] for way in WAYS}
for rep in range(args.reps):
    for way in WAYS[rep % 3:] + WAYS[:rep % 3]:
        times[way].append(epoch(way))
median = {way: statistics.median(t) for way, t in times.items()}
print("OBSERVERS " + json.dumps({"us_per_step": median, "all": times, "python_calls_per_step": calls,
                                 "batch callback extra": median["batch callback"] - median["none"],
                                 "observer extra": median["train-function observer"] - median["none"]}), flush=True)
