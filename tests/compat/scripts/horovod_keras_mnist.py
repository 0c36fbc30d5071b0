"""Horovod's tensorflow2_keras_mnist.py example, as users copy it: horovod.tensorflow.keras, GPU pinning by local
rank, a repeated dataset each rank shuffles by itself, the learning rate scaled by hvd.size() and warmed up,
hvd.DistributedOptimizer, compile(experimental_run_tf_function=False), the broadcast and metric-average
callbacks, a rank-0 ModelCheckpoint, steps_per_epoch divided by the number of ranks, a Sequential with no input
shape (built on its first batch). (The digits stand in for MNIST: no download.)"""
import hashlib
import os
import sys
import tempfile

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import counting  # noqa: E402 - the test instrument, not part of the example

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

digits = load_digits()
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(digits.images[..., tf.newaxis] / 16.0, tf.float32), tf.cast(digits.target, tf.int64)))
dataset = dataset.repeat().shuffle(2000).batch(32)

mnist_model = tf.keras.Sequential([
    counting.layer(tf.keras),
    tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dropout(0.0),
    tf.keras.layers.Dense(10, activation="softmax"),
])
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)
opt = hvd.DistributedOptimizer(opt)
mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                    experimental_run_tf_function=False)
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
]
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(tempfile.mkdtemp(), "checkpoint-{epoch}.h5")))
verbose = 1 if hvd.rank() == 0 else 0
steps, epochs = 48 // hvd.size(), 3
history = mnist_model.fit(dataset, steps_per_epoch=steps, callbacks=callbacks, epochs=epochs, verbose=verbose)

losses = history.history["loss"]
weights = mnist_model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} "
      f"samples={counting.trained()} total={48 * 32 * epochs}", flush=True)
