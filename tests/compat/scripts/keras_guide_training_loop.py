"""The Keras guide "Writing a training loop from scratch": a GradientTape step in a plain Python loop, no strategy;
here a model built on its first batch with BatchNormalization. `--keras legacy`: tf_keras."""
import sys

import numpy as np
import tensorflow as tf

if "--keras" in sys.argv and sys.argv[sys.argv.index("--keras") + 1] == "legacy":
    import tf_keras as keras
else:
    import keras

keras.utils.set_random_seed(3)
x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
model = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.BatchNormalization(),
                          keras.layers.Dense(2)])
optimizer = keras.optimizers.SGD(learning_rate=0.1)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(batch_x, batch_y):
    with tf.GradientTape() as tape:
        loss_value = loss_fn(batch_y, model(batch_x, training=True))
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply_gradients(zip(grads, model.trainable_weights))
    return loss_value


for epoch in range(2):
    for batch_x, batch_y in dataset:
        loss_value = train_step(batch_x, batch_y)
    print(f"epoch {epoch} loss {float(loss_value)!r}", flush=True)
