"""The script the checkpoint-vs-disk benchmark runs (benchmarks/suites/checkpoint_vs_disk.py): a model whose
weights and Adam's two slots make about --mb megabytes, trained under distrain with a timed checkpoint every
--every steps (DISTRAIN_CHECKPOINT_EVERY, set by the suite), and in each cycle the same bytes written raw by this
script in the same directory: numpy's save to a temporary file, fsync, rename (the disk's own speed, as a careful
program writes). So the two writes alternate in one process, on one disk.

    DISTRAIN_CHECKPOINT_EVERY=8 distrain run benchmarks/workers/checkpoint_vs_disk.py --mb 100 --checkpoints 6

A cycle of --every steps (8: phases 0-7), distrain's checkpoint after the step of phase 0: its pause (between that
step's end, this script's batch-end hook, which Keras runs before distrain's backup, and the next step's start)
holds the snapshot (or with DISTRAIN_CHECKPOINT_ASYNC=0 the whole write); the steps of phases 1 to --every - 3
run beside the write in flight and copy the variables the snapshot shares (copy on write,
fit/checkpoint_snapshot.py); before the step of phase --every - 2 the raw write, once distrain's has ended (the two
never share the disk; that step, after the raw write evicted the caches, is left out); the steps of phases
--every - 1 and 0 are the baseline. blocked = the checkpoint's pause less the median pause elsewhere, plus each
step beside the write less the baseline's median step. Prints one line, `CKPTDISK {"state_mb", "raw_s": [...],
"blocked_s": [...], "held_s", "after_s", "pause_s", "step_s", "distrain_s": [...]}`: each raw write's seconds,
each checkpoint's blocked seconds (and its two parts: the pause, the steps beside the write), the median pause and
step, and distrain's own record of each write (stop-cost.json's checkpoint_writes, each from its start to its fsync
and rename: the first carries Keras' save warm-up).
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


def written() -> list[float]:
    """distrain's own record of each of its writes (the run's stop-cost.json)."""
    with open(os.path.join(state_dir, "stop-cost.json")) as kept:
        return json.load(kept).get("checkpoint_writes", [])


def phase(batch: int) -> int:
    """Where a step is in the cycle of `--every` steps: 0 is the step distrain's checkpoint follows."""
    return (batch + 1) % args.every


AFTER = range(1, args.every - 2)  # the steps after a checkpoint, its write in flight beside them: counted
RAW = args.every - 2  # the raw write before this step (its time left out: the raw write evicted the caches)
QUIET = (args.every - 1, 0)  # the steps before the next checkpoint: the baseline


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
            if phase(batch) == RAW and batch > args.every and chief:  # distrain's write ended first: apart
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
due = [c for c in timing.pauses if phase(c) == 0 and c >= args.every - 1 and c + args.every - 2 < len(timing.steps)]
quiet = statistics.median(pause for c, pause in timing.pauses.items() if phase(c) != 0)
step = statistics.median(t for b, t in enumerate(timing.steps) if phase(b) in QUIET and b >= args.every)
held = [timing.pauses[c] - quiet for c in due]  # the snapshot and distrain's other work at the checkpoint
after = [sum(timing.steps[c + j] - step for j in AFTER) for c in due]  # the steps beside the write
blocked = [h + a for h, a in zip(held, after)]
state_mb = sum(a.nbytes for a in state_arrays()) / 1e6
print("CKPTDISK " + json.dumps({
    "state_mb": state_mb, "raw_s": timing.raw, "blocked_s": blocked, "held_s": held, "after_s": after,
    "pause_s": quiet, "step_s": step, "distrain_s": written()}), flush=True)
