"""Proof that ranks train as one: each rank starts from a different seed and sees different data; if the
engine synchronises, all ranks end with identical weights. Uses distrain's API (`import entrypoint as dt`).

    horovodrun -np 2 --gloo distrain run examples/sync_check.py
    distrain launch -n 2 examples/sync_check.py
"""

import argparse
import hashlib

import numpy as np
import tensorflow as tf  # noqa: E402  (after distrain on purpose)

import entrypoint as dt  # before TensorFlow: distrain sets up visibility and legacy Keras first

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--save", default=None)
args = parser.parse_args()

rank, size = dt.rank(), dt.size()
tf.keras.utils.set_random_seed(1000 + rank)  # a different start on every rank
rng = np.random.default_rng(rank)
x = rng.normal(size=(512, 16)).astype("float32")  # different data on every rank
y = (x @ np.arange(16, dtype="float32") > 0).astype("int64")

model = tf.keras.Sequential([
    tf.keras.layers.Input((16,)),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(2),
])
model.compile(optimizer=tf.keras.optimizers.SGD(dt.scale_lr(0.05)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=32, epochs=args.epochs)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT rank={rank} size={size} local_rank={dt.local_rank()} loss_first={losses[0]:.4f} "
      f"loss_last={losses[-1]:.4f} weights={digest}", flush=True)
if args.save:
    dt.save(model, args.save)
