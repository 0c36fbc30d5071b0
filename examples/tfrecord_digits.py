"""Training from TFRecord shards, the I/O format HPC guides recommend on shared file systems.

    distrain data /scratch/$USER/digits --shards 8
    distrain launch -n 2 examples/tfrecord_digits.py /scratch/$USER/digits

Each worker reads its own files (`dt.rank()`-th of every `dt.size()`), so no sample is read twice per epoch;
auto-sharding is switched off because the files are already split.
"""

import argparse
import glob
import hashlib
import json
import os

import numpy as np

import entrypoint as dt
from entrypoint.tools.data import parse_example, shard_files

# isort: split

import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("data_dir")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--index-log", default=None, help="write the sample indices this worker read to PATH.RANK.json")
args = parser.parse_args()

all_files = glob.glob(os.path.join(args.data_dir, "*.tfrecord"))
files = shard_files(all_files, dt.rank(), dt.size())
records = tf.data.TFRecordDataset(files).map(parse_example)
if args.index_log:
    with open(f"{args.index_log}.{dt.rank()}.json", "w") as handle:
        json.dump([int(index) for _, _, index in records.as_numpy_iterator()], handle)

# Collectives need the same number of steps on every worker: use the smallest worker's share.
shares = [sum(1 for _ in tf.data.TFRecordDataset(shard_files(all_files, r, dt.size()))) for r in range(dt.size())]
steps = min(shares) // args.batch_size
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF  # split by files above
dataset = (records.map(lambda image, label, index: (image, label)).shuffle(512, seed=dt.rank())
           .batch(args.batch_size, drop_remainder=True).take(steps).repeat().with_options(options))

model = tf.keras.Sequential([
    tf.keras.layers.Input((8, 8, 1)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10),
])
model.compile(optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT rank={dt.rank()} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
