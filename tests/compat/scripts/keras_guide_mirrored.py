"""The Keras guide "Multi-GPU distributed training with TensorFlow" (keras.io), Keras 3: `import keras`, its own
MirroredStrategy, the model built and compiled in strategy.scope(), global batches (batch per replica x
replicas) of tf.data, validation data, and its make_or_restore_model() with ModelCheckpoint in a directory."""
import hashlib
import os
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import counting  # noqa: E402 - the test instrument, not part of the guide

checkpoint_dir = os.path.join(tempfile.mkdtemp(), "ckpt")


def get_compiled_model():
    inputs = keras.Input(shape=(64,))
    x = counting.layer(keras)(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 100
    rng = np.random.default_rng(3)
    x_train = rng.random((600, 64)).astype("float32")
    y_train = (x_train[:, :5].sum(axis=1) * 2).astype("int64") % 10
    x_val, y_val = x_train[-num_val_samples:], y_train[-num_val_samples:]
    x_train, y_train = x_train[:-num_val_samples], y_train[:-num_val_samples]
    return (tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
            tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size))


def make_or_restore_model():
    checkpoints = [os.path.join(checkpoint_dir, name) for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest)
        return keras.models.load_model(latest)
    print("Creating a new model")
    return get_compiled_model()


if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)
strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")
with strategy.scope():
    model = make_or_restore_model()
train_dataset, val_dataset = get_dataset()
callbacks = [keras.callbacks.ModelCheckpoint(filepath=checkpoint_dir + "/ckpt-{epoch}.keras", save_freq="epoch")]
epochs = 3
history = model.fit(train_dataset, epochs=epochs, callbacks=callbacks, validation_data=val_dataset, verbose=2)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} "
      f"samples={counting.trained()} total={500 * epochs}", flush=True)
