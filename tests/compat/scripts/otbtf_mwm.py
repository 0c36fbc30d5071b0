"""OTBTF's Jean-Zay page (guide 000/001): SlurmClusterResolver(port_base=13565), NCCL, save on the chief only."""
import hashlib
import sys

import counting
import numpy as np
import tensorflow as tf

cluster_resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=13565)
implementation = tf.distribute.experimental.CommunicationImplementation.NCCL
communication_options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver,
                                                     communication_options=communication_options)
rng = np.random.default_rng(1)
x = rng.normal(size=(640, 16, 16, 3)).astype("float32")
y = x.mean(axis=(1, 2)).astype("float32")  # per-channel regression, a fully convolutional toy
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(640, seed=1).batch(32)
with strategy.scope():
    inputs = tf.keras.Input((16, 16, 3))
    h = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    h = tf.keras.layers.BatchNormalization()(counting.layer(tf.keras)(h))
    outputs = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(3, 1)(h))
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
history = model.fit(dataset, epochs=3)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} "
      f"samples={counting.trained()} total={640 * len(losses)}", flush=True)
if len(sys.argv) > 1 and strategy.cluster_resolver.task_id == 0:  # "defer the save to the master worker"
    model.save(sys.argv[1])
