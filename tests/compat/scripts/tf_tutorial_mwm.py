"""TensorFlow's multi_worker_with_keras tutorial: its own MWM, a global batch of per-worker batch x workers, a
repeated dataset with steps_per_epoch, and the tutorial's save rule (non-chief workers save to temp dirs)."""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

per_worker_batch_size = 32
tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config.get("cluster", {}).get("worker", [None]))
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers


def mnist_dataset(batch_size):
    rng = np.random.default_rng(2)
    x_train = rng.random((1024, 28, 28)).astype("float32")
    # a learnable stand-in for MNIST's labels (top half brighter than the bottom), so the loss can fall
    y_train = (x_train[:, :14].mean(axis=(1, 2)) > x_train[:, 14:].mean(axis=(1, 2))).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024, seed=2).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


multi_worker_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=20)


def _is_chief(task_type, task_id):
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


def write_filepath(filepath, task_type, task_id):
    dirpath, base = os.path.dirname(filepath), os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = os.path.join(dirpath, f"workertemp_{task_id}")
        tf.io.gfile.makedirs(dirpath)
    return os.path.join(dirpath, base)


losses = history.history["loss"]
weights = multi_worker_model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
if len(sys.argv) > 1:
    task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
    path = write_filepath(sys.argv[1], task_type, task_id)
    multi_worker_model.save(path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(path))
