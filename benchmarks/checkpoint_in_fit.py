"""distrain's checkpoint callback inside a real 2-worker MWM fit (tf_keras), in the same two processes as no
checkpoint callback and as tf_keras' own BackupAndRestore (the positive control: it assigns the saved batch to a
mirrored variable before every step, which distrain's subclass does not).

    python benchmarks/by_hand_mwm.py python benchmarks/checkpoint_in_fit.py [--rounds N] [--steps N]

Between two processes side by side a 1% difference is within what the machine alone gives (`run.py overhead`'s
control row); inside one process the variants share the allocator, the memory layout, the core and the hour. So
fits alternate here, each round all three (the order reversed every other round), on a 2-worker MWM strategy
made by hand (no distrain around the script: the callback is the only difference), and each fit's CPU per step
is taken from the end of its warm-up to its last step: the process's (every thread, TensorFlow's included) and
the training thread's (where the callbacks run).

Prints `CHECKPOINT_IN_FIT {...}` on each worker: per variant, the CPU per step of each round (ms), and against no
callback the ratio of each round (none / variant: >= 1 costs nothing) with the median, lowest and highest, and the
training thread's extra CPU per step (median); and how many of distrain's fits ended with a checkpoint written.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["DISTRAIN_KERAS"] = "legacy"
import tensorflow as tf  # noqa: E402

from entrypoint import checkpoint  # noqa: E402
from entrypoint.plan import detect  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=12)
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=20)
args = parser.parse_args()

rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
allowed = sorted(os.sched_getaffinity(0))
for task in os.listdir("/proc/self/task"):  # one core a worker, as workload.py --pin
    os.sched_setaffinity(int(task), {allowed[rank % len(allowed)]})
strategy = tf.distribute.MultiWorkerMirroredStrategy()
keras = tf.keras
with strategy.scope():
    model = keras.Sequential([
        keras.layers.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
images = tf.random.uniform((64, 32, 32, 3), seed=1)
labels = tf.random.uniform((64,), maxval=10, dtype=tf.int32, seed=1)
dataset = tf.data.Dataset.from_tensors((images, labels)).repeat(args.warmup + args.steps)

state = tempfile.mkdtemp(prefix=f"distrain-ckpt-in-fit-{rank}-")
plan = detect({**{k: v for k, v in os.environ.items() if not k.startswith("DISTRAIN_")}, "DISTRAIN_MODE": "mwm",
               "DISTRAIN_KERAS": "legacy", "DISTRAIN_CHECKPOINT": "1", "DISTRAIN_OUTPUT_DIR": state}, gpus=[])
VARIANTS = {
    "none": lambda: [],
    "distrain": lambda: [checkpoint.make_backup_callback(plan, keras)],
    "tf_keras": lambda: [keras.callbacks.BackupAndRestore(os.path.join(state, "tf_keras"))],
}
marks: dict[str, tuple[float, float]] = {}


class Marks(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch in (args.warmup - 1, args.warmup + args.steps - 1):
            marks["from" if batch == args.warmup - 1 else "to"] = (time.process_time(), time.thread_time())


per_step: dict[str, dict[str, list[float]]] = {name: {"process_ms": [], "thread_ms": []} for name in VARIANTS}
written = 0
for round_ in range(args.rounds):
    for name in (list(VARIANTS) if round_ % 2 == 0 else list(VARIANTS)[::-1]):
        callbacks = VARIANTS[name]()
        model.fit(dataset, epochs=1, callbacks=[*callbacks, Marks()], verbose=0)
        written += sum(bool(getattr(callback, "written", False)) for callback in callbacks)  # distrain's: at the end
        model._training_state = None  # tf_keras' BackupAndRestore deletes the attribute a later fit reads
        for i, key in enumerate(("process_ms", "thread_ms")):
            per_step[name][key].append((marks["to"][i] - marks["from"][i]) / args.steps * 1e3)

shutil.rmtree(state, ignore_errors=True)
result: dict = {"rank": rank, "steps": args.steps, "rounds": args.rounds, "distrain_checkpoints_written": written,
                "per_step": per_step, "vs_none": {}}
for name in ("distrain", "tf_keras"):
    ratios = [none / other for none, other in zip(per_step["none"]["process_ms"], per_step[name]["process_ms"])]
    threads = [other - none for none, other in zip(per_step["none"]["thread_ms"], per_step[name]["thread_ms"])]
    result["vs_none"][name] = {"cpu_ratio": statistics.median(ratios), "cpu_ratio_min": min(ratios),
                               "cpu_ratio_max": max(ratios), "thread_extra_ms": statistics.median(threads)}
print("CHECKPOINT_IN_FIT " + json.dumps(result), flush=True)
