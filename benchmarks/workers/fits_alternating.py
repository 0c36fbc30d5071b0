"""distrain's fit against the plain fit, in the same two MWM workers: what distrain adds to a fit, a step at a time.

    DISTRAIN_KERAS=legacy DISTRAIN_CHECKPOINT=1 distrain launch -n 2 benchmarks/workers/fits_alternating.py [--rounds N]

Between two runs side by side a 1% difference is within what the machine alone gives (`run.py overhead`'s control
row). Inside one process the variants share the allocator, the memory layout, the core and the hour. distrain's
fit hook keeps the fit it replaced (`keras.Model.fit.__wrapped_original__`), so here, under `distrain launch`,
fits alternate on the same model and input, each round every variant (the order reversed every other round):

- `plain`: the original fit: distrain's strategy, none of what distrain adds to a fit;
- `distrain`: `model.fit` as the script calls it: distrain's callbacks (checkpoint at the epoch end, stop check,
  stall watchdog, batch-norm sync), its step observers, its input rewrites and the exact-resume positioning;
- `own backup` (tf_keras): the plain fit with tf_keras' own BackupAndRestore, which assigns the saved batch to a
  mirrored variable before every step (distrain's subclass does not); Keras 3.3's own cannot run under MWM (its
  workers' saves do not match: a collective mismatch);
- `spin 1%`: the plain fit with a batch-end callback that burns 1% of the plain step's CPU on the training
  thread (measured in a warm-up fit): the positive control, a known 1% the measure must see.

Each fit's CPU per step is taken from the end of its warm-up to its last step: the process's (every thread,
TensorFlow's included) and the training thread's (where the callbacks run). Prints `FIT_IN_PROCESS {...}` on each
worker: per variant, each round's CPU per step in ms and the fit's wall time (under MWM a fit returns only at
TensorFlow's next ~10 s tick, with or without distrain: few, long fits); benchmarks/run.py pools both workers' rounds
into ratios.
"""

import argparse
import json
import os
import shutil
import tempfile
import time

import small_cnn  # benchmarks/, this script's directory
import tensorflow as tf

import entrypoint
from entrypoint.fit import checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=20)
args = parser.parse_args()

small_cnn.pin_to_one_core(entrypoint.local_rank())
keras, rank = tf.keras, entrypoint.rank()  # distrain set tf.keras to the family DISTRAIN_KERAS names
with tf.distribute.get_strategy().scope():  # distrain's: the script's scope, as a user's script would enter
    model = small_cnn.build(keras)
dataset = small_cnn.batches(tf, 64, args.warmup + args.steps)
plain_fit = keras.Model.fit.__wrapped_original__  # what distrain's fit hook wraps (entrypoint/runner.py)
made: list = []  # distrain's checkpoint callbacks, one per distrain fit: proof that the variant is distrain's
make_backup_callback = checkpoint.make_backup_callback
checkpoint.make_backup_callback = lambda *a: made.append(make_backup_callback(*a)) or made[-1]
own_dir = tempfile.mkdtemp(prefix=f"distrain-fit-in-process-{rank}-")


class Marks(keras.callbacks.Callback):
    """The process's and this thread's CPU at the end of the warm-up and at the last step."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == args.warmup - 1:
            self.warmed_up = (time.process_time(), time.thread_time())
        elif batch == args.warmup + args.steps - 1:
            self.last_step = (time.process_time(), time.thread_time())

    def per_step_ms(self) -> tuple[float, float]:
        return tuple((end - start) / args.steps * 1e3 for start, end in zip(self.warmed_up, self.last_step))


class Spin(keras.callbacks.Callback):
    """Burns `seconds` of this thread's CPU after every batch."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        until = time.thread_time() + self.seconds
        while time.thread_time() < until:
            pass


def fit(variant: str, spin_s: float = 0.0) -> tuple[float, float, float]:
    """One fit of `variant`: its CPU per step (process, training thread, ms) and its wall time, call to return (s)."""
    began, marks = time.monotonic(), Marks()
    if variant == "distrain":
        model.fit(dataset, epochs=1, callbacks=[marks], verbose=0)
    else:
        extra = {"plain": [], "spin 1%": [Spin(spin_s)],
                 "own backup": [keras.callbacks.BackupAndRestore(os.path.join(own_dir, "backup"))]}[variant]
        plain_fit(model, dataset, epochs=1, callbacks=[*extra, marks], verbose=0)
    model._training_state = None  # tf_keras' BackupAndRestore (distrain's too) deletes the attribute a fit reads
    return (*marks.per_step_ms(), time.monotonic() - began)


spin_s = fit("plain")[0] * 1e-3 / 100  # a warm-up fit, not counted: 1% of its CPU per step
VARIANTS = ("plain", "distrain", *(["own backup"] if keras.__name__.startswith("tf_keras") else []), "spin 1%")
KEYS = ("process_ms", "thread_ms", "fit_wall_s")
per_step: dict[str, dict[str, list[float]]] = {name: {key: [] for key in KEYS} for name in VARIANTS}
for round_ in range(args.rounds):
    for name in (VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]):
        for key, value in zip(KEYS, fit(name, spin_s)):
            per_step[name][key].append(value)
shutil.rmtree(own_dir, ignore_errors=True)
print("FIT_IN_PROCESS " + json.dumps({"rank": rank, "steps": args.steps, "rounds": args.rounds,
                                      "spin_ms": spin_s * 1e3, "distrain_fits": len(made),
                                      "per_step": per_step}), flush=True)
