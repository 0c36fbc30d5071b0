"""tf_keras' checkpoint off the training's path (entrypoint/fit/checkpoint_snapshot.take_tensorflow): its
CheckpointManager's save recorded with the tensors it read, written later with the values of its moment, as the
files that save writes."""

import os

import numpy as np
import pytest

from entrypoint.fit import checkpoint_snapshot

pytestmark = pytest.mark.core  # both TensorFlows: the ops it records are TensorFlow's private modules'


@pytest.fixture(scope="module")
def tf_keras():
    return pytest.importorskip("tf_keras")


def trained(tf_keras, directory):
    import tensorflow as tf

    # no seed set: TensorFlow's global seed would outlive this test in its process (test_own_shards reads it unset)
    model = tf_keras.Sequential([tf_keras.layers.Input((8,)), tf_keras.layers.Dense(16),
                                 tf_keras.layers.BatchNormalization(), tf_keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((32, 8)), np.ones((32, 1)), verbose=0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=model.optimizer),
                                         str(directory), max_to_keep=2)
    return model, manager


def values(model):
    return [np.array(v) for v in [*model.weights, *model.optimizer.variables()]]


def test_the_snapshot_keeps_the_values_of_its_moment_and_names_the_checkpoint_once_written(tf_keras, tmp_path):
    import tensorflow as tf

    model, manager = trained(tf_keras, tmp_path)
    then = values(model)
    snapshot = checkpoint_snapshot.take_tensorflow(manager.save, str(tmp_path / "ckpt-1"))
    assert not os.path.exists(tmp_path / "ckpt-1.index") and not os.path.exists(tmp_path / "checkpoint")
    model.fit(np.ones((32, 8)), np.zeros((32, 1)), verbose=0)  # every weight and Adam's slots move
    assert not np.array_equal(then[0], np.array(model.weights[0]))
    snapshot.write()
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-1")
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(str(tmp_path / "ckpt-1")).assert_consumed()
    assert all(np.array_equal(a, b) for a, b in zip(then, values(model), strict=True))


def test_negative_control_a_save_run_later_writes_later_values(tf_keras, tmp_path):
    """Why the save is recorded on the training thread: run on the writer's, it reads the weights of its time."""
    import tensorflow as tf

    model, manager = trained(tf_keras, tmp_path)
    then = values(model)
    model.fit(np.ones((32, 8)), np.zeros((32, 1)), verbose=0)
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(manager.save()).assert_consumed()
    assert not np.array_equal(then[0], values(model)[0])


def test_the_files_are_the_ones_the_managers_save_writes(tf_keras, tmp_path):
    import tensorflow as tf
    from tensorflow.python.ops import io_ops

    model, manager = trained(tf_keras, tmp_path / "snap")
    checkpoint_snapshot.take_tensorflow(manager.save, str(tmp_path / "snap" / "ckpt-1")).write()
    _, own = trained(tf_keras, tmp_path / "own")
    own.save()
    assert tf.train.list_variables(str(tmp_path / "snap" / "ckpt-1")) == \
        tf.train.list_variables(str(tmp_path / "own" / "ckpt-1"))
    assert sorted(os.listdir(tmp_path / "snap")) == sorted(os.listdir(tmp_path / "own"))
    assert io_ops.save_v2.__name__ == "save_v2"  # TensorFlow's own again once taken


def test_the_oldest_checkpoint_is_deleted_only_once_the_newest_is_written(tf_keras, tmp_path):
    """max_to_keep=2: until the third checkpoint's index is there, the first stays (two whole ones to fall back on)."""
    _, manager = trained(tf_keras, tmp_path)
    for number in (1, 2):
        checkpoint_snapshot.take_tensorflow(manager.save, str(tmp_path / f"ckpt-{number}")).write()
    third = checkpoint_snapshot.take_tensorflow(manager.save, str(tmp_path / "ckpt-3"))
    assert (tmp_path / "ckpt-1.index").exists() and not (tmp_path / "ckpt-3.index").exists()
    third.write()
    assert sorted(p.name for p in tmp_path.glob("*.index")) == ["ckpt-2.index", "ckpt-3.index"]
