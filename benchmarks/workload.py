"""The training work every benchmark measures: a small CNN on fixed synthetic data.

`--handmade none` is an ordinary Keras script (what `distrain run` distributes). `--handmade single|mwm|horovod`
is the same work written by hand for that mode, the way the user guides do it: the baseline for the overhead
ratio. Prints one line `BENCH {json}` from the chief: throughput after warm-up and the wall time of the first step.
"""

import argparse
import json
import os
import statistics
import time

parser = argparse.ArgumentParser()
parser.add_argument("--handmade", choices=["none", "single", "mwm", "horovod"], default="none")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--batch", type=int, default=64, help="global batch")
args = parser.parse_args()

if args.handmade != "none":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # the hand-written versions use the same Keras as distrain
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

hvd = None
strategy = tf.distribute.get_strategy()
rank, batch = 0, args.batch
if args.handmade == "mwm":
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(name, None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
elif args.handmade == "horovod":
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, batch = hvd.rank(), args.batch // hvd.size()
elif args.handmade == "none" and "TF_CONFIG" in os.environ:
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
elif args.handmade == "none":
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    size = int(os.environ.get("HOROVOD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    batch = args.batch // size

images = tf.random.uniform((batch, 32, 32, 3), seed=1)
labels = tf.random.uniform((batch,), maxval=10, dtype=tf.int32, seed=1)
dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input((32, 32, 3)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(), tf.keras.layers.Dense(128, activation="relu"), tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    if hvd is not None:
        optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

stamps = []


class Stamp(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        stamps.append(time.time())


callbacks = [Stamp()]
if hvd is not None:
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks]
model.fit(dataset, epochs=1, steps_per_epoch=args.warmup + args.steps, callbacks=callbacks, verbose=0)
steps = [b - a for a, b in zip(stamps[args.warmup:], stamps[args.warmup + 1:])]
if rank == 0:
    print("BENCH " + json.dumps({"images_per_sec": args.batch / statistics.median(steps), "first_step": stamps[0]}),
          flush=True)
