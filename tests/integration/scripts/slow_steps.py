"""A Keras script whose steps take a set time (its input pipeline sleeps), as slow real steps do.

    distrain run slow_steps.py --step-seconds 0.6 --epochs 3 --steps 8
"""

import argparse
import hashlib
import json
import os
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--step-seconds", type=float, default=0.6)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--width", type=int, default=8, help="hidden units (a larger checkpoint)")
parser.add_argument("--stuck-rank", type=int, default=None, help="this rank's input blocks forever ...")
parser.add_argument("--stuck-after", type=int, default=20, help="... after this many batches")
parser.add_argument("--slower-rank", type=int, default=None, help="this rank's steps take twice as long")
parser.add_argument("--first-step-seconds", type=float, default=0, help="a long first step (a slow compile)")
parser.add_argument("--chief-epoch-end-seconds", type=float, default=0, help="a chief-only epoch-end report")
args = parser.parse_args()

tf.keras.utils.set_random_seed(1)
n = args.steps * args.batch_size
x = np.random.default_rng(0).normal(size=(n, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")


def my_rank() -> int:
    """The rank as a script without distrain code would read it: TF_CONFIG, Horovod's or Slurm's variables."""
    if os.environ.get("TF_CONFIG"):
        return json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    return int(os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or
               os.environ.get("SLURM_PROCID") or 0)


batches_read = 0


def read_batch_from_a_share_that_hangs():
    time.sleep(10**6)


def slow(features, label):
    def wait(value):
        global batches_read
        batches_read += 1
        if my_rank() == args.stuck_rank and batches_read > args.stuck_after:
            read_batch_from_a_share_that_hangs()
        if batches_read == 1:
            print(f"rank {my_rank()} reads its first batch", flush=True)  # in fit: past the start-up
            time.sleep(args.first_step_seconds)
        time.sleep(args.step_seconds * (2 if my_rank() == args.slower_rank else 1))
        return value

    return tf.numpy_function(wait, [features], tf.float32, stateful=True), label


dataset = (tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).map(slow)
           .map(lambda f, label: (tf.ensure_shape(f, [None, 4]), label)))
model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(args.width, activation="relu"),
                             tf.keras.layers.Dense(args.width, activation="relu"), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))


class Steps(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        print(f"STEP epoch={self.epoch + 1} step={batch + 1} t={time.time():.2f}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if my_rank() == 0:
            time.sleep(args.chief_epoch_end_seconds)  # the chief writes a report for a while


history = model.fit(dataset, epochs=args.epochs, callbacks=[Steps()], verbose=0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT epochs={len(losses)} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
