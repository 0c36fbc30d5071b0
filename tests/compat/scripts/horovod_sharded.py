"""Horovod's own Keras examples with tf.data: the dataset sharded by hand (dataset.shard(hvd.size(), hvd.rank())),
per-rank batches, the learning rate scaled by hvd.size(), its own DistributedOptimizer and callbacks, progress on
rank 0 only."""
import hashlib

import counting
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

hvd.init()
rng = np.random.default_rng(8)
x = rng.normal(size=(1024, 12)).astype("float32")
y = (x[:, :6].sum(axis=1) > 0).astype("int64")
dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
           .shuffle(1024, seed=hvd.rank()).batch(32))
model = tf.keras.Sequential([tf.keras.layers.Input((12,)), counting.layer(tf.keras),
                             tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(2)])
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))
model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
history = model.fit(dataset, epochs=3, callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT rank={hvd.rank()} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} "
      f"samples={counting.trained()} total={1024 * len(losses)}", flush=True)
