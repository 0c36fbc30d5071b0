"""Horovod's TensorFlow 2 example style, written for Keras 3: `import keras`, Horovod's TensorFlow API
(DistributedGradientTape, broadcast_variables of model and optimizer variables), rank-0 checkpoint."""

import hashlib
import os
import sys
import tempfile

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

tf.random.set_seed(hvd.rank())  # ranks start apart: the broadcast must bring them together
digits = load_digits()
images = (digits.images[..., None] / 16.0).astype("float32")
dataset = (tf.data.Dataset.from_tensor_slices((images, digits.target.astype("int64")))
           .repeat().shuffle(2000, seed=hvd.rank()).batch(32))

model = keras.Sequential([
    keras.layers.Conv2D(16, 3, activation="relu", input_shape=(8, 8, 1)),
    keras.layers.Flatten(),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dropout(0.25),  # as Horovod's tensorflow2_mnist.py: a seed state broadcast_variables is handed
    keras.layers.Dense(10, activation="softmax"),
])
loss = keras.losses.SparseCategoricalCrossentropy()
opt = keras.optimizers.Adam(0.001 * hvd.size())
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss_value = loss(labels, probs)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    return loss_value


losses = []
for batch, (images_, labels) in enumerate(dataset.take(300 // hvd.size())):
    loss_value = training_step(images_, labels, batch == 0)
    losses.append(float(loss_value))
    if batch % 50 == 0 and hvd.rank() == 0:
        print(f"Step #{batch}\tLoss: {loss_value:.6f}")
if hvd.rank() == 0:
    checkpoint.save(sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "ckpt"))
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
first, last = np.mean(losses[:10]), np.mean(losses[-10:])
print(f"RESULT epochs=1 loss_first={first:.4f} loss_last={last:.4f} weights={digest}", flush=True)
