"""TensorFlow's custom-training tutorial: its own MirroredStrategy, a GradientTape loop under strategy.run,
compute_average_loss with the global batch, a distributed dataset."""
import hashlib

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH_SIZE = 32 * strategy.num_replicas_in_sync
rng = np.random.default_rng(5)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    loss_object = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")


def train_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        per_example = loss_object(labels, model(features, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(inputs):
    per_replica = strategy.run(train_step, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


losses = []
for _ in range(3):
    total, batches = 0.0, 0
    for batch in dist_dataset:
        total += float(distributed_train_step(batch))
        batches += 1
    losses.append(total / batches)
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT replicas={strategy.num_replicas_in_sync} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} "
      f"weights={digest}", flush=True)
