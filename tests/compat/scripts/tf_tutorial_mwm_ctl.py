"""TensorFlow's multi_worker_with_ctl tutorial: its own MWM, distribute_datasets_from_function with the input
context's per-replica batch and shard, a tf.function train step under strategy.run with compute_average_loss,
and its fault-tolerant checkpointing (epoch and step variables, CheckpointManager, non-chief workers writing to
temp dirs they remove)."""
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import counting  # noqa: E402 - the test instrument, not part of the tutorial

per_worker_batch_size = 32
tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config.get("cluster", {}).get("worker", [None]))
global_batch_size = per_worker_batch_size * num_workers
num_epochs, num_steps_per_epoch = 3, 10
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def mnist_dataset():
    rng = np.random.default_rng(4)
    x_train = rng.random((1024, 28, 28)).astype("float32")
    y_train = (x_train[:, :14].mean(axis=(1, 2)) > x_train[:, 14:].mean(axis=(1, 2))).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024, seed=4).repeat()


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


def build_cnn_model():
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        counting.layer(tf.keras),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


with strategy.scope():
    multi_worker_model = build_cnn_model()
    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: dataset_fn(global_batch_size, input_context))
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
                y, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


def _is_chief(task_type, task_id, cluster_spec):
    return (task_type is None or task_type == "chief"
            or (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict()))


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath, base = os.path.dirname(filepath), os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = os.path.join(dirpath, f"workertemp_{task_id}")
        tf.io.gfile.makedirs(dirpath)
    return os.path.join(dirpath, base)


checkpoint_dir = os.path.join(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(), "ckpt")
epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")
task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
cluster_spec = strategy.cluster_resolver.cluster_spec()
checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)

losses = []
while epoch.numpy() < num_epochs:
    iterator = iter(multi_worker_dataset)
    total_loss, num_batches = 0.0, 0
    while step_in_epoch.numpy() < num_steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)
    train_loss = total_loss / num_batches
    losses.append(float(train_loss))
    print(f"Epoch: {epoch.numpy()}, accuracy: {train_accuracy.result():.3f}, train_loss: {train_loss:.3f}.")
    train_accuracy.reset_state()
    checkpoint_manager.save()
    if not _is_chief(task_type, task_id, cluster_spec):
        tf.io.gfile.rmtree(write_checkpoint_dir)
    epoch.assign_add(1)
    step_in_epoch.assign(0)

weights = multi_worker_model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} "
      f"samples={counting.trained()} total={num_steps_per_epoch * global_batch_size * num_epochs}", flush=True)
