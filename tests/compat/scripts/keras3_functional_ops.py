"""Keras 3, as its guides write it: a functional model with a custom layer in keras.ops and keras.ops on symbolic
tensors, a tf.data pipeline (shuffle, batch, prefetch) with a validation dataset, evaluate and predict after fit."""
import hashlib

import counting
import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops


class RMSNorm(layers.Layer):
    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + 1e-6) * self.scale


keras.utils.set_random_seed(6)
rng = np.random.default_rng(6)
x = rng.normal(size=(1000, 16)).astype("float32")
y = ((x[:, :8] ** 2).sum(axis=1) > 8).astype("int64")
train = tf.data.Dataset.from_tensor_slices((x[:800], y[:800])).shuffle(800, seed=6).batch(64).prefetch(tf.data.AUTOTUNE)
validation = tf.data.Dataset.from_tensor_slices((x[800:], y[800:])).batch(64)

inputs = keras.Input((16,))
h = layers.Dense(32)(counting.layer(keras)(inputs))
h = layers.Activation("gelu")(RMSNorm()(h))
h = ops.concatenate([h, ops.abs(inputs)], axis=-1)
model = keras.Model(inputs, layers.Dense(2)(h))
model.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(train, validation_data=validation, epochs=3)
evaluation = model.evaluate(validation, verbose=0)
predictions = model.predict(x[:7], verbose=0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} predict={predictions.shape[0]} "
      f"val_accuracy={history.history['val_accuracy'][-1]:.3f} weights={digest} "
      f"samples={counting.trained()} total={800 * len(losses)}", flush=True)
