"""A Keras 3 script as people write them today: `import keras`, `keras.ops`, the functional API, AdamW, the
`.keras` format. No distrain import, no strategy code: distrain runs it on Keras 3 in every mode.

    distrain run examples/keras3_train.py --save /tmp/model.keras
    distrain launch -n 2 examples/keras3_train.py
    horovodrun -np 2 --gloo distrain run examples/keras3_train.py

--start-apart seeds each process differently (from the launcher's rank variables), to prove in tests that the
ranks end identical because distrain synchronises them, not because they started equal.
"""

import argparse
import hashlib
import json
import os

import keras
import numpy as np
from keras import layers, ops

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--save", default=None, help="where to save the model (.keras or .h5)")
parser.add_argument("--start-apart", action="store_true", help="a different seed and data order per process")
args = parser.parse_args()

rank = 0
if args.start_apart:
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    rank = int(os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or task.get("index", 0))
keras.utils.set_random_seed(42 + rank)

rng = np.random.default_rng(rank)
x = rng.normal(size=(1024, 20)).astype("float32")
y = (x[:, :10].sum(axis=1) > x[:, 10:].sum(axis=1)).astype("int64")

inputs = keras.Input((20,))
h = layers.Dense(64, activation="relu")(inputs)
h = layers.BatchNormalization()(h)
h = layers.Dropout(0.2)(h)
h = layers.Lambda(lambda t: ops.tanh(t) * 2.0, output_shape=(64,))(h)
outputs = layers.Dense(2)(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.AdamW(learning_rate=3e-3, weight_decay=1e-4),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_split=0.1)
evaluation = model.evaluate(x, y, batch_size=args.batch_size, verbose=0, return_dict=True)
predictions = model.predict(x[:8], verbose=0)

losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT keras={keras.__version__} epochs={len(losses)} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} "
      f"eval_accuracy={evaluation['accuracy']:.3f} predict={predictions.shape[0]}x{predictions.shape[1]} "
      f"weights={digest}", flush=True)
if args.save:
    model.save(args.save)
