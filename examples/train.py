"""An ordinary Keras script: no distrain import, no strategy code. distrain runs it unchanged in every mode.

    distrain run examples/train.py --epochs 3 --save /tmp/digits.keras
    distrain launch -n 2 examples/train.py --epochs 3
"""

import argparse
import hashlib

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--save", default=None, help="where to save the trained model (.keras, .h5 or a directory)")
args = parser.parse_args()

tf.keras.utils.set_random_seed(42)
# 1,797 8x8 "digits": ten fixed templates with noise (no download, no package beyond TensorFlow)
rng = np.random.default_rng(42)
templates = rng.random((10, 8, 8))
y = rng.integers(0, 10, 1797)
x = np.clip(templates[y] + rng.normal(0.0, 0.3, (1797, 8, 8)), 0.0, 1.0)[..., None].astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=42).batch(args.batch_size)

model = tf.keras.Sequential([
    tf.keras.layers.Input((8, 8, 1)),
    tf.keras.layers.Conv2D(16, 3, activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10),
])
model.compile(
    optimizer=tf.keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(dataset, epochs=args.epochs)

losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT epochs={len(losses)} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
if args.save:
    model.save(args.save)
