"""The user's script the stop-cost benchmark stops and resumes (benchmarks/suites/stop.py): issue 54's pipeline,
`range(N).shuffle(N, seed).map(expensive).batch(32)`, the map a stand-in for decode and augment, under a small
model.

    [STOP_AT=STEP] distrain run benchmarks/workers/expensive_map.py [--samples 8000] [--map pure|random]

--map pure: a function of its element alone (a fixed transform); --map random: it draws random numbers (random
augmentation), so no batch passed over can be left unmade. STOP_AT=STEP (not an argument: the resume is the same
command): the process sends itself SIGTERM after the first epoch's step STEP (1-based), as a preemption would, and
prints when. Prints one line,
`STOPCOST {"process_start", "first_step", "signalled"}`: wall times, the first step's when it ended.
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
args = parser.parse_args()
stop_at = int(os.environ.get("STOP_AT", "0"))
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
        if stop_at and self.epoch == 0 and batch + 1 == stop_at and "signalled" not in stamps:
            stamps["signalled"] = time.time()
            print("STOPCOST " + json.dumps(stamps), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


model = tf.keras.Sequential([tf.keras.layers.Input((SIDE * SIDE,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(dataset, epochs=1, callbacks=[Stamps()], verbose=0)
print("STOPCOST " + json.dumps(stamps), flush=True)
