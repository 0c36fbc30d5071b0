"""distrain's own per-step work, timed directly.

    distrain run benchmarks/workers/perstep_parts.py callbacks [--reps N] [--smoke]
    python benchmarks/workers/perstep_parts.py input NAME [--reps N] [--smoke]

- callbacks (under `distrain run`, so the Plan and engine are real): the per-step hooks
  (`on_train_batch_begin/end`, and the step observers steps.py calls) of the callbacks distrain adds to `fit`:
  the stall watchdog (with its thread running), the stop check and the checkpoint callback of the Keras family
  DISTRAIN_KERAS chose (DISTRAIN_CHECKPOINT on), called as fit calls them, in microseconds per step;
- input: one of distrain's rewrites as a tf.data pipeline alone and what the script would get without it (its
  baseline), in one process, epochs of the two alternating (the order swapped every repetition), iterated at a
  high batch rate: each side's median epoch, in wall seconds and in the CPU seconds of the process (what a VM's
  steal time does not inflate). One process makes both sides share everything a second process would not (its
  core, its allocator, the machine's moment): the control row, plain tf.data against itself, is within 1-2% this
  way, where two processes side by side differed by 5-10%. The pipelines: exact resume's positioned numpy
  pipeline against the pipeline Keras 3 itself builds from numpy arrays (what `fit` trains on without distrain)
  and against `from_tensor_slices().shuffle().batch()`; the even last batch (MWM: where the last batch splits as
  it is, and where a last batch of one sample is topped up) and Horovod's rank slices on top of the plain
  pipeline, against it alone.

Prints `BENCH {...}` for benchmarks/run.py perstep.
"""

import argparse
import gc
import json
import os
import statistics
import time

parser = argparse.ArgumentParser()
parser.add_argument("part", choices=["callbacks", "input"])
parser.add_argument("name", nargs="?")
parser.add_argument("--reps", type=int, default=5)
parser.add_argument("--smoke", action="store_true")
args = parser.parse_args()
if args.part == "input":
    os.environ["TF_USE_LEGACY_KERAS"] = "0"  # Keras 3's own numpy pipeline is a baseline

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from entrypoint.fit import arrays, batches  # noqa: E402


def callback_cost(callback, calls: int, position=None) -> float:
    """Microseconds per step of a callback's per-step hooks (the median of the repetitions): its batch hooks, and
    its step observer (entrypoint/fit/steps.py) where it has one, as the train function calls it (through the
    training position it reads)."""
    observe = getattr(callback, "step_ended", None)
    if position is not None and observe is not None:
        position.observers, observe = [observe], position.call_ended
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    per_rep = []
    for _ in range(args.reps):
        start = time.perf_counter()
        for step in range(calls):
            callback.on_train_batch_begin(step)
            callback.on_train_batch_end(step)
            if observe is not None:
                observe()
        per_rep.append((time.perf_counter() - start) / calls * 1e6)
    callback.on_epoch_end(0)
    callback.on_train_end()
    return statistics.median(per_rep)


def checkpoint_callback(plan, keras, steps: int, position):
    """distrain's checkpoint callback for this family, on a small compiled model, as fit sets it up."""
    from entrypoint.fit import checkpoint, stopping

    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    hooks = checkpoint.BackupHooks(position, stopping.stop_for_rerun)
    backup = checkpoint.make_backup_callback(plan, keras, 1, (), hooks)
    backup.set_model(model)
    backup.set_params({"epochs": 1, "steps": steps, "verbose": 0})
    return backup


def callbacks() -> dict:
    from entrypoint.fit import stalls, steps, stopping
    from entrypoint.runtime import setup

    engine = setup()  # the one this process set up (idempotent)
    plan = engine.plan
    keras = engine.keras
    calls = 2_000 if args.smoke else 100_000
    if not plan.checkpoint_dir:
        raise SystemExit("perstep callbacks: run with DISTRAIN_CHECKPOINT=1, its callback is timed too")
    made = {"stall watchdog": lambda at: stalls.make_callback(plan, keras, at),
            "stop check": lambda at: stopping.make_callback(plan, keras, tf, engine, None, stopping.SignalFlag(), at),
            "checkpoint": lambda at: checkpoint_callback(plan, keras, calls, at)}
    costs = {}
    for name, make in made.items():
        position = steps.TrainingPosition()
        position.epoch_began(0, None)  # no length: every rep counts on
        costs[name] = callback_cost(make(position), calls, position)
    return {"callbacks_us_per_step": costs}


SAMPLES, BATCH = (8_192, 64) if args.smoke else (262_144, 64)  # 4,096 batches: about 0.6 s an epoch
rng = np.random.default_rng(0)
x, y = rng.random((SAMPLES, 16), dtype=np.float32), rng.integers(0, 10, SAMPLES)


def plain(count: int = SAMPLES):
    return tf.data.Dataset.from_tensor_slices((x[:count], y[:count])).shuffle(count, seed=1).batch(BATCH).prefetch(
        tf.data.AUTOTUNE)


def short_last():
    return plain(SAMPLES - BATCH + 1)  # a last batch of one sample: on 2 replicas it must be topped up


def keras_numpy():
    """What `fit(x, y, batch_size=64, shuffle=True)` trains on without distrain (Keras 3's own numpy pipeline)."""
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    return ArrayDataAdapter(x, y, batch_size=BATCH, shuffle=True).get_tf_dataset()


def positioned():
    return arrays.positioned_array_dataset((x, y), BATCH, True, first_epoch=0, epochs=1, skip=0)


PIPELINES = {
    "control: plain tf.data against itself": (plain, plain),
    "positioned numpy (exact resume) vs Keras' own": (keras_numpy, positioned),
    "positioned numpy (exact resume) vs from_tensor_slices": (plain, positioned),
    "even last batch (MWM), last batch splits": (plain, lambda: batches.even_out_last_batch(plain(), 2)),
    "even last batch (MWM), last batch of 1 topped up": (short_last,
                                                         lambda: batches.even_out_last_batch(short_last(), 2)),
    "rank slices (Horovod)": (plain, lambda: batches.rank_slices(batches.even_out_last_batch(plain(), 2), 0, 2)),
}


def epoch_time(make) -> tuple[float, float]:
    """One epoch: the iterator made and run to its end. The previous epoch's iterator is gone by then (deleted and
    collected outside the timing): left to go when the next one is made, its teardown made `iter()` take 0.9-1.2 s
    instead of 0.01 in about half the epochs of a 262,144-sample shuffled from_tensor_slices pipeline here (TF
    2.17, one core), and the epoch times fell into two groups (1.27 s and 2.55 s) that said nothing of the
    rewrites. Returns the wall seconds and the CPU seconds of the process (every thread: the kernel's account,
    which a VM's steal time does not inflate)."""
    dataset = make()
    gc.collect()
    start, start_cpu = time.perf_counter(), time.process_time()
    iterator = iter(dataset)
    for _ in iterator:
        pass
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    del iterator, dataset
    gc.collect()
    return elapsed, cpu


def input_rate() -> dict:
    """Both sides' median epoch (wall and CPU seconds), their epochs alternating in this process."""
    sides = dict(zip(("baseline", "rewrite"), PIPELINES[args.name]))
    for make in sides.values():
        epoch_time(make)  # warm-up: graph building, first allocations
    times: dict[str, list] = {side: [] for side in sides}
    for rep in range(args.reps):
        for side in list(sides)[::1 if rep % 2 == 0 else -1]:
            times[side].append(epoch_time(sides[side]))
    result = {}
    for side, epochs in times.items():
        wall, cpu = zip(*epochs)
        result.update({f"{side}_epoch_s": statistics.median(wall), f"{side}_epoch_cpu_s": statistics.median(cpu)})
    return {**result, "batches_per_s": SAMPLES / BATCH / result["rewrite_epoch_s"]}


if __name__ == "__main__":
    print("BENCH " + json.dumps(callbacks() if args.part == "callbacks" else input_rate()), flush=True)
