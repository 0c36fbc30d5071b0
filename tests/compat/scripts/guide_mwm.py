"""The user guides' MultiWorkerMirroredStrategy script (ml-dist notes, guide 002): pinning by SLURM_LOCALID,
RING, its own SlurmClusterResolver, the learning rate scaled by SLURM_NTASKS, chief-only save."""
import argparse
import hashlib
import os

import counting
import numpy as np
import tensorflow as tf
from tensorflow.keras import layers

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.001)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--save-model", action="store_true")
parser.add_argument("--output-dir", default=".")
args = parser.parse_args()

# Set each process to see a unique GPU (guarded: CPU partitions have none)
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    gpu = gpus[int(os.environ.get("SLURM_LOCALID", 0))]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)

communication_options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING)
cluster_resolver = tf.distribute.cluster_resolver.SlurmClusterResolver()
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication_options,
                                                     cluster_resolver=cluster_resolver)
args.lr = args.lr * int(os.environ.get("SLURM_NTASKS", strategy.num_replicas_in_sync))

rng = np.random.default_rng(0)
x = rng.random((768, 28, 28, 1)).astype("float32")
y = (x.mean(axis=(1, 2, 3)) * 20).astype("int64") % 10
with strategy.scope():
    model = tf.keras.Sequential([
        layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1)),
        counting.layer(tf.keras),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(32, activation="relu"),
        layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(learning_rate=args.lr), metrics=["accuracy"])
history = model.fit(x, y, batch_size=64, epochs=args.epochs)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT task={cluster_resolver.task_id} loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} "
      f"weights={digest} samples={counting.trained()} total={768 * len(losses)}", flush=True)
if args.save_model and cluster_resolver.task_id == 0:
    tf.keras.Sequential.save(model, filepath=f"{args.output_dir}/mnist_model.keras")
