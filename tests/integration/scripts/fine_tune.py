"""Transfer learning as Keras' guide teaches it: fit the head with the base frozen, unfreeze, recompile with a
lower learning rate, fit again with EarlyStopping and ReduceLROnPlateau, then evaluate.

    distrain run fine_tune.py --out DIR

Test instruments, not part of the pattern: the first layer appends the index of every sample it trains on to
DIR/ids-rank<r>-fit<k>.txt (one line per batch), each rank the Python and NumPy random numbers drawn after the
first fit to DIR/between-rank<r>.txt, the chief the final weights to DIR/weights.npy and the evaluation to
DIR/evaluation.txt; STOP_AT=FIT:EPOCH:STEP makes rank 0 send itself SIGTERM after that step of that
fit (1-based), as a preemption would.
"""

import argparse
import json
import os
import random
import signal

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--plateau", action="store_true",
                    help="the second fit's loss never improves enough (min_delta=10): ReduceLROnPlateau halves the "
                         "learning rate after every epoch but the first, EarlyStopping stops after the third")
args = parser.parse_args()

tf.keras.utils.set_random_seed(3)
rng = np.random.default_rng(0)
samples = 96
features = rng.normal(size=(samples, 6)).astype("float32")
x = np.concatenate([features, np.arange(samples, dtype="float32")[:, None]], axis=1)  # last column: the index
y = (features[:, :3].sum(axis=1) > features[:, 3:].sum(axis=1)).astype("float32")
fit_number = [0]


def my_rank() -> int:
    if os.environ.get("TF_CONFIG"):
        return json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    return int(os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)


def record(indices):
    with open(os.path.join(args.out, f"ids-rank{my_rank()}-fit{fit_number[0]}.txt"), "a") as handle:
        handle.write(" ".join(str(int(i)) for i in indices) + "\n")
    return np.int64(len(indices))


class RecordIds(tf.keras.layers.Layer):
    def call(self, inputs, training=None):
        if training:
            done = tf.numpy_function(record, [inputs[:, -1]], tf.int64, stateful=True)
            with tf.control_dependencies([done]):
                return tf.identity(inputs[:, :-1])
        return inputs[:, :-1]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1] - 1)


class StopAt(tf.keras.callbacks.Callback):
    def __init__(self, fit: int):
        super().__init__()
        spec = os.environ.get("STOP_AT", "0:0:0").split(":")
        self.at, self.fit, self.epoch, self.done = (int(spec[0]), int(spec[1]) - 1, int(spec[2]) - 1), fit, 0, False

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.fit, self.epoch, batch) >= self.at and self.fit == self.at[0] and not self.done and my_rank() == 0:
            self.done = True
            os.kill(os.getpid(), signal.SIGTERM)


base = tf.keras.Sequential([tf.keras.layers.Input((7,)), RecordIds(), tf.keras.layers.Dense(12, activation="relu"),
                            tf.keras.layers.Dense(8, activation="relu")], name="base")
model = tf.keras.Sequential([base, tf.keras.layers.Dense(1)])

base.trainable = False  # the head first
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
fit_number[0] = 1
jitter = tf.keras.callbacks.LambdaCallback(  # a callback drawing random numbers, e.g. for its own sampling
    on_epoch_end=lambda epoch, logs: (random.random(), np.random.rand()))
model.fit(x, y, batch_size=16, epochs=2, callbacks=[StopAt(1), jitter])
with open(os.path.join(args.out, f"between-rank{my_rank()}.txt"), "w") as handle:  # what the script draws next
    handle.write(f"{random.random()!r} {np.random.rand()!r}")

base.trainable = True  # then everything, slowly
model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
fit_number[0] = 2
if args.plateau:
    callbacks = [tf.keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=2),
                 tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10, patience=1, factor=0.5), StopAt(2)]
else:
    callbacks = [tf.keras.callbacks.EarlyStopping(monitor="loss", patience=4),
                 tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=4), StopAt(2)]
history = model.fit(x, y, batch_size=16, epochs=5 if args.plateau else 3, callbacks=callbacks)
evaluation = model.evaluate(x, y, batch_size=32, verbose=0)

weights = np.concatenate([w.ravel() for w in model.get_weights()])
if my_rank() == 0:
    np.save(os.path.join(args.out, "weights.npy"), weights)
    with open(os.path.join(args.out, "evaluation.txt"), "w") as handle:
        handle.write(repr(float(evaluation)))
    with open(os.path.join(args.out, "last-epoch.txt"), "w") as handle:  # where the second fit ended
        handle.write(str(history.epoch[-1] + 1))
