"""A custom training loop that runs the same under Horovod, MWM and one process.

    horovodrun -np 2 distrain run examples/custom_loop.py
    distrain launch -n 2 examples/custom_loop.py

Recipe: build under `dt.strategy().scope()`, run the step with `dt.strategy().run`, wrap the tape with
`dt.distributed_tape` (averages gradients under Horovod; a no-op where the strategy does it) and broadcast the
initial variables once with `dt.broadcast_variables` (a no-op outside Horovod).
"""

import hashlib

import numpy as np

import entrypoint as dt

# isort: split
import tensorflow as tf

strategy = dt.strategy()
tf.keras.utils.set_random_seed(7 + dt.rank())  # ranks start apart on purpose
rng = np.random.default_rng(dt.rank())
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
batch = 32
dataset = dt.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(batch, drop_remainder=True)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(dt.scale_lr(0.05))
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


@tf.function
def step(features, labels):
    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            per_example = loss_fn(labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        tape = dt.distributed_tape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.reduce("SUM", strategy.run(replica_step, args=(features, labels)), axis=None)


losses = []
for epoch in range(3):
    total = 0.0
    for i, (features, labels) in enumerate(strategy.experimental_distribute_dataset(dataset)):
        total += float(step(features, labels))
        if epoch == 0 and i == 0:
            dt.broadcast_variables(model.variables + optimizer.variables)  # after the first step built them
    losses.append(total)
    if dt.is_chief():
        print(f"epoch {epoch}: loss {total:.4f}", flush=True)
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT rank={dt.rank()} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
