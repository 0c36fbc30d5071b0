"""Horovod's elastic Keras example (tensorflow2_keras_mnist_elastic.py), as users copy it: horovod.tensorflow.keras,
GPU pinning by local rank, a repeated dataset each rank shuffles by itself, hvd.DistributedOptimizer, a one-step
fit to create the optimizer's variables, hvd.elastic.KerasState with a reset callback that rescales the learning
rate, the three elastic callbacks, a rank-0 ModelCheckpoint, and the training function under @hvd.elastic.run.
(The digits stand in for MNIST: no download.)

Test instruments, not part of the example: with DIE_AT_EPOCH=E the worker started as rank DIE_RANK kills itself
(SIGKILL, as a node failure would) at the start of epoch E, once (DIE_MARKER records it); the reset callback
prints where the state was rolled back to; `--save PATH` saves the model at the end, on every rank, as many
scripts do.
"""
import argparse
import hashlib
import os
import signal
import tempfile

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--save")
args = parser.parse_args()

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

model = tf.keras.Sequential([
    tf.keras.layers.Input((8, 8, 1)),
    tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
opt = tf.optimizers.Adam(0.001 * hvd.size())
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
              experimental_run_tf_function=False)
# Horovod: initialize the optimizer's state so it can be synchronised across workers
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    tf.keras.backend.set_value(state.model.optimizer.lr, 0.001 * hvd.size())
    print(f"RESET rank={hvd.rank()} size={hvd.size()} epoch={state.epoch} batch={state.batch}", flush=True)
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)


state.register_reset_callbacks([on_state_reset])


class DieOnce(tf.keras.callbacks.Callback):
    """The test instrument: this worker's node fails at the start of an epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        marker = os.environ.get("DIE_MARKER", "")
        if (os.environ.get("DIE_AT_EPOCH") == str(state.epoch + 1) and os.environ.get("HOROVOD_RANK")
                == os.environ.get("DIE_RANK") and marker and not os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
    DieOnce(),
]
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(tempfile.mkdtemp(), "checkpoint-{epoch}.h5")))

losses = []


@hvd.elastic.run
def train(state):
    history = state.model.fit(dataset, steps_per_epoch=48 // hvd.size(), epochs=4 - state.epoch,
                              callbacks=callbacks, verbose=1)
    losses.extend(history.history["loss"])


train(state)
if args.save:
    model.save(args.save)

weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} size={hvd.size()} "
      f"epochs={state.epoch}", flush=True)
