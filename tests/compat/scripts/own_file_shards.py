"""A script that splits its files between the ranks itself, as the seeds' guides teach: its rank from TF_CONFIG's
task index (MWM), SLURM_PROCID (srun) or the MPI launcher's rank, its share of a TFRecord file list, batches of the
global batch size. Every rank must train on its own share only: under MWM, auto-sharding the share again trained
half the data an epoch (#84)."""
import hashlib
import json
import os
import tempfile

import counting
import keras
import numpy as np
import tensorflow as tf

FILES, PER_FILE, BATCH = 8, 64, 32
config = json.loads(os.environ.get("TF_CONFIG") or "{}")
if config:
    rank, ranks = config["task"]["index"], len(config["cluster"]["worker"])
else:
    rank = int(os.environ.get("SLURM_PROCID") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    ranks = int(os.environ.get("SLURM_NTASKS") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)

folder = os.path.join(tempfile.gettempdir(), f"own-file-shards-{os.getuid()}")
os.makedirs(folder, exist_ok=True)
rng = np.random.default_rng(3)
for part in range(FILES):  # the same bytes from every rank, each file written whole (temporary name, rename)
    x = rng.normal(size=(PER_FILE, 8)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("float32")
    path = os.path.join(folder, f"part-{part}.tfrecord")
    if not os.path.exists(path):
        with tf.io.TFRecordWriter(f"{path}.{os.getpid()}") as writer:
            for features, label in zip(x, y):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=features)),
                    "y": tf.train.Feature(float_list=tf.train.FloatList(value=[label]))})).SerializeToString())
        os.replace(f"{path}.{os.getpid()}", path)

files = sorted(tf.io.gfile.glob(os.path.join(folder, "part-*.tfrecord")))[rank::ranks]
spec = {"x": tf.io.FixedLenFeature([8], tf.float32), "y": tf.io.FixedLenFeature([1], tf.float32)}


def parse(record):
    example = tf.io.parse_single_example(record, spec)
    return example["x"], example["y"]


dataset = tf.data.TFRecordDataset(files).map(parse).batch(BATCH)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), counting.layer(keras), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
history = model.fit(dataset, epochs=3, verbose=2)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest} "
      f"samples={counting.trained()} total={FILES * PER_FILE * len(losses)}", flush=True)
