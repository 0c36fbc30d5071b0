"""Example data as TFRecord shards, the format HPC guides recommend on shared file systems.

`write_digits` turns 1,797 seeded 8x8 "digits" (ten noisy templates: no download, nothing the image lacks) into N
shard files; `shard_files` gives each worker a disjoint set of files, so no sample is read twice in an epoch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

DIGITS = 1797  # samples, as many as scikit-learn's digits, which examples/train.py draws the same way
DIGITS_SEED = 42


def digits(count: int = DIGITS, seed: int = DIGITS_SEED):  # noqa: ANN201
    """(images (count, 8, 8) float32 in [0, 1], labels (count,) int64): ten fixed templates with noise, learnable
    in a few epochs; the same arrays as examples/train.py's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    templates = rng.random((10, 8, 8))
    labels = rng.integers(0, 10, count)
    images = np.clip(templates[labels] + rng.normal(0.0, 0.3, (count, 8, 8)), 0.0, 1.0)
    return images.astype("float32"), labels.astype("int64")


def write_digits(out_dir: str, shards: int = 8) -> list[str]:
    """Write the 1797 digits (8×8 images, labels) into `shards` TFRecord files; return their paths."""
    import tensorflow as tf

    images, labels = digits()
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"digits-{i:05d}-of-{shards:05d}.tfrecord") for i in range(shards)]
    writers = [tf.io.TFRecordWriter(p + ".tmp") for p in paths]
    for index in range(len(labels)):
        feature = {
            "image": tf.train.Feature(float_list=tf.train.FloatList(value=images[index].ravel())),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[index]])),
            "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[index])),
        }
        writers[index % shards].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for writer, path in zip(writers, paths):
        writer.close()
        os.replace(path + ".tmp", path)
    return paths


def shard_files(files: Sequence[str], rank: int, size: int) -> list[str]:
    """Files for worker `rank` of `size`: every size-th file, so workers' sets are disjoint and cover all."""
    files = sorted(files)
    if size > len(files):
        raise ValueError(f"{len(files)} files cannot feed {size} workers: write at least {size} shards")
    return files[rank::size]


def parse_example(record):  # noqa: ANN001, ANN201
    """Decode one record to ((8, 8, 1) image, label, index)."""
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([64], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "index": tf.io.FixedLenFeature([], tf.int64),
    }
    parsed = tf.io.parse_single_example(record, spec)
    return tf.reshape(parsed["image"], (8, 8, 1)), parsed["label"], parsed["index"]
