"""Keras 3: a subclassed model with its own train_step, keras.ops, a PyDataset input, evaluate and predict."""
import hashlib

import counting
import keras
import numpy as np
import tensorflow as tf
from keras import ops


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return int(np.ceil(len(self.x) / self.batch_size))

    def __getitem__(self, index):
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[part], self.y[part]


class Regressor(keras.Model):
    def __init__(self):
        super().__init__()
        self.count = counting.layer(keras)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.out = keras.layers.Dense(1)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, inputs, training=None):
        return self.out(self.hidden(self.count(inputs, training=training)))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = ops.mean(ops.square(self(x, training=True)[:, 0] - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)
x = rng.normal(size=(640, 10)).astype("float32")
y = (x @ np.linspace(-1, 1, 10)).astype("float32")
model = Regressor()
model.compile(optimizer=keras.optimizers.SGD(learning_rate=keras.optimizers.schedules.ExponentialDecay(0.05, 10, 0.9)))
history = model.fit(Batches(x, y, 64), epochs=3)
predictions = model.predict(x[:4], verbose=0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} predict={predictions.shape[0]} "
      f"weights={digest} samples={counting.trained()} total={640 * len(losses)}", flush=True)
