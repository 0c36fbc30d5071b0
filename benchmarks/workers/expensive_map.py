"""The user's script the stop-cost benchmark stops and resumes (benchmarks/suites/stop.py): issue 54's pipeline,
`range(N).shuffle(N, seed).map(expensive).batch(32)`, the map a stand-in for decode and augment, under a small
model.

    [STOP_AT=STEP] [BACK_AT=STEP] distrain run benchmarks/workers/expensive_map.py [--samples 8000]
        [--map pure|random] [--width 32] [--keras-backup DIR]

--map pure: a function of its element alone (a fixed transform); --map random: it draws random numbers (random
augmentation), so no batch passed over can be left unmade. --width: the hidden layer's units, so the model's
state (weights and Adam's two slots) is what a checkpoint writes. --keras-backup DIR: the script's own Keras
BackupAndRestore, as its guide shows (distrain then leaves checkpoints to it). STOP_AT=STEP (not an argument: the
resume is the same command): every rank sends itself SIGTERM after the first epoch's step STEP (1-based), as a
preemption would, and says when; BACK_AT=STEP: the resumed run says when training is past that step again. Rank 0
prints one line, `STOPCOST {"process_start", "first_step", "signalled", "back", "state_mb"}`: wall times (the
first step's and the step past BACK_AT's when they ended) and the megabytes of weights and optimizer state.
"""

import argparse
import json
import os
import signal
import time

import tensorflow as tf


def process_start() -> float:
    """This process's start, wall time (/proc/self/stat field 22 against /proc/uptime)."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        return time.time() - (float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))


parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=8000)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--map", choices=["pure", "random"], default="pure")
parser.add_argument("--work", type=int, default=30, help="64x64 matrix products per element: the map's cost")
parser.add_argument("--width", type=int, default=32, help="the hidden layer's units: the checkpoint's size")
parser.add_argument("--keras-backup", help="the script's own keras.callbacks.BackupAndRestore in this directory")
args = parser.parse_args()
stop_at, back_at = int(os.environ.get("STOP_AT", "0")), int(os.environ.get("BACK_AT", "0"))
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or json.loads(os.environ.get("TF_CONFIG") or
                                                                 '{"task": {"index": 0}}')["task"]["index"])
stamps: dict[str, float] = {"process_start": process_start()}
tf.keras.utils.set_random_seed(3)
SIDE = 64


def expensive(index):
    x = tf.reshape(tf.cast(tf.range(SIDE * SIDE) + tf.cast(index, tf.int32), tf.float32) / SIDE**2, (SIDE, SIDE))
    if args.map == "random":
        x = x + tf.random.uniform((SIDE, SIDE), maxval=0.01)
    for _ in range(args.work):
        x = tf.tanh(tf.matmul(x, x) / SIDE)
    return tf.reshape(x, (SIDE * SIDE,)), tf.cast(index % 2, tf.float32)


dataset = (tf.data.Dataset.range(args.samples).shuffle(args.samples, seed=3)
           .map(expensive, num_parallel_calls=tf.data.AUTOTUNE).batch(args.batch_size))


class Stamps(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        stamps.setdefault("first_step", time.time())
        if back_at and self.epoch == 0 and batch + 1 > back_at:
            stamps.setdefault("back", time.time())
        if stop_at and self.epoch == 0 and batch + 1 == stop_at and "signalled" not in stamps:
            stamps["signalled"] = time.time()
            say()
            os.kill(os.getpid(), signal.SIGTERM)


def say():
    if rank == 0:
        print("STOPCOST " + json.dumps(stamps), flush=True)


model = tf.keras.Sequential([tf.keras.layers.Input((SIDE * SIDE,)),
                             tf.keras.layers.Dense(args.width, activation="relu"), tf.keras.layers.Dense(1)])
model.compile(optimizer="adam", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
callbacks = [Stamps()]
if args.keras_backup:
    callbacks.append(tf.keras.callbacks.BackupAndRestore(args.keras_backup))
model.fit(dataset, epochs=1, callbacks=callbacks, verbose=0)
slots = model.optimizer.variables
slots = slots() if callable(slots) else slots  # a method in tf_keras, a property in Keras 3
stamps["state_mb"] = sum(v.numpy().nbytes for v in [*model.variables, *slots]) / 1e6
say()
