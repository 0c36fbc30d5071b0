"""The user guides' Horovod script (guide 002): hvd.init, pinning by hvd.local_rank(), the learning rate scaled by
the ranks, its own DistributedOptimizer and callbacks, rank-0 save. Written for tf.keras with Horovod's Keras API."""
import hashlib
import os
import sys

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    gpu = gpus[int(hvd.local_rank())]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
lr = 0.001 * int(os.environ.get("SLURM_NTASKS", hvd.size()))
tf.keras.utils.set_random_seed(100 + hvd.rank())  # ranks start apart: the broadcast must align them
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(512, 12)).astype("float32")
y = (x[:, :6].sum(axis=1) > 0).astype("int64")
model = tf.keras.Sequential([tf.keras.layers.Input((12,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(2)])
opt = tf.keras.optimizers.Adam(learning_rate=lr)
opt = hvd.DistributedOptimizer(opt)
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
history = model.fit(x, y, batch_size=32, epochs=3, callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT rank={hvd.rank()} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
if len(sys.argv) > 1 and hvd.rank() == 0:
    tf.keras.Sequential.save(model, filepath=sys.argv[1])
