"""tensorflow#60857's case: a Conv+ReLU model and 66 samples in batches of 16, so the last global batch (2
samples) is smaller than 4 workers. `--numpy` feeds arrays instead of tf.data; `--own-strategy` builds its own
MultiWorkerMirroredStrategy, as the guides do; `--samples 69` leaves a last batch of 5, which TensorFlow's
rebatch would cut 2, 2, 1, 0."""
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

keras = tf.keras
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "--own-strategy" in sys.argv else tf.distribute.get_strategy()
rng = np.random.default_rng(0)
samples = int(sys.argv[sys.argv.index("--samples") + 1]) if "--samples" in sys.argv else 66
x = rng.normal(size=(samples, 8, 8, 1)).astype("float32")
y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
if "--numpy" in sys.argv:
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
else:
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=3, verbose=0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT onednn={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')} loss_first={losses[0]:.4f} "
      f"loss_last={losses[-1]:.4f} weights={digest}", flush=True)
