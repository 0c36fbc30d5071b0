"""The script the checkpoint-vs-disk benchmark runs (benchmarks/suites/checkpoint_vs_disk.py): a model whose
weights and Adam's two slots make about --mb megabytes, trained under distrain with a timed checkpoint every
--every steps (DISTRAIN_CHECKPOINT_EVERY, set by the suite), and after each of distrain's checkpoints the same
bytes written raw by this script in the same directory: numpy's save to a temporary file, fsync, rename (the
disk's own speed, as a careful program writes). So the two writes alternate in one process, on one disk.

    DISTRAIN_CHECKPOINT_EVERY=5 distrain run benchmarks/workers/checkpoint_vs_disk.py --mb 100 --checkpoints 6

What a checkpoint blocks: the training pauses between a step's end (this script's batch-end hook, which Keras
runs before distrain's backup writes) and the next step's start; at a checkpoint's step that pause holds the
checkpoint (the write, or with DISTRAIN_CHECKPOINT_ASYNC=1 its snapshot), elsewhere only the hooks; and the step
after a snapshot copies the variables it updates (copy on write, fit/checkpoint_snapshot.py). blocked = that pause
minus the median pause of the steps without one, plus that next step minus the median step. The raw write waits
for distrain's write in flight first (apart from both: the two writes never share the disk). Prints one line,
`CKPTDISK {"state_mb", "raw_s": [...], "blocked_s": [...], "pause_s", "step_s", "distrain_s": [...]}`: each raw
write's seconds, each checkpoint's blocked seconds, the median pause and step, and distrain's own record of each
write (stop-cost.json's checkpoint_writes, each from its start to its fsync and rename: the first carries Keras'
save warm-up).
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import tensorflow as tf

import entrypoint as dt
from entrypoint.fit.checkpoint_snapshot import finish_writes

parser = argparse.ArgumentParser()
parser.add_argument("--mb", type=float, default=10.0, help="weights and Adam's two slots, megabytes")
parser.add_argument("--checkpoints", type=int, default=6, help="distrain's checkpoints (and raw writes) to time")
parser.add_argument("--every", type=int, default=int(os.environ.get("DISTRAIN_CHECKPOINT_EVERY", "5")))
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()
tf.keras.utils.set_random_seed(5)

# one Dense(width, width) layer: width**2 weights (+ width biases), three float32 copies with Adam's slots
width = max(16, int((args.mb * 1e6 / 12) ** 0.5))
steps = args.every * (args.checkpoints + 1)
x = np.random.default_rng(0).standard_normal((args.batch_size * 4, width), dtype=np.float32)
dataset = tf.data.Dataset.from_tensor_slices((x, x)).repeat().batch(args.batch_size)
model = tf.keras.Sequential([tf.keras.layers.Input((width,)), tf.keras.layers.Dense(width)])
model.compile(optimizer="adam", loss="mse")
state_dir, chief = dt.plan().checkpoint_dir, dt.rank() == 0


def state_arrays() -> list[np.ndarray]:
    slots = model.optimizer.variables  # tf_keras' is a method
    return [np.asarray(v) for v in [*model.weights, *(slots() if callable(slots) else slots)]]


def raw_write() -> float:
    """The same bytes as the checkpoint, written as a careful program does: temp file, fsync, rename."""
    arrays = state_arrays()
    started = time.perf_counter()
    folder = os.path.join(state_dir, "chief")  # where distrain's checkpoints are: the same directory, the same disk
    tmp, final = os.path.join(folder, ".raw.npz.tmp"), os.path.join(folder, "raw.npz")
    with open(tmp, "wb") as handle:
        np.savez(handle, *arrays)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    return time.perf_counter() - started


class Timing(tf.keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.ended: float | None = None
        self.begun: float | None = None
        self.pauses: dict[int, float] = {}
        self.steps: list[float] = []
        self.raw: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):  # noqa: ANN001, ANN201
        now = time.perf_counter()
        if self.ended is not None:
            self.pauses[batch - 1] = now - self.ended
            if batch % args.every == 0 and chief:  # distrain wrote after the previous step: the raw write, apart
                finish_writes()
                self.raw.append(raw_write())
        self.begun = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        self.ended = time.perf_counter()
        self.steps.append(self.ended - self.begun)


timing = Timing()
model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timing])
if not chief:
    raise SystemExit(0)
due = {step for step in timing.pauses if (step + 1) % args.every == 0}
quiet = statistics.median(pause for step, pause in timing.pauses.items() if step not in due)
step = statistics.median(timing.steps[i] for i in range(len(timing.steps)) if i - 1 not in due)
blocked = [timing.pauses[i] - quiet + timing.steps[i + 1] - step for i in sorted(due) if i + 1 < len(timing.steps)]
with open(os.path.join(state_dir, "stop-cost.json")) as kept:
    written = json.load(kept).get("checkpoint_writes", [])
state_mb = sum(a.nbytes for a in state_arrays()) / 1e6
print("CKPTDISK " + json.dumps({
    "state_mb": state_mb, "raw_s": timing.raw, "blocked_s": blocked, "pause_s": quiet, "step_s": step,
    "distrain_s": written}), flush=True)
