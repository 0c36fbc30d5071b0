"""What tells the ranks' inputs apart (fit/own_shards.py): a dataset's graph constants (its files, shard indices,
arrays), never a batch read from it (that would draw a seeded reshuffle's next order), and numpy arrays' rows."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from entrypoint.fit.own_shards import input_digest  # noqa: E402


def files(names: list[str]):  # noqa: ANN201
    return tf.data.TFRecordDataset(names).map(lambda record: record).shuffle(10, seed=1).batch(4)


def test_the_same_pipeline_built_twice_has_one_digest_and_another_file_list_another():
    assert input_digest(files(["a", "b"])) == input_digest(files(["a", "b"]))
    assert input_digest(files(["a", "b"])) != input_digest(files(["a", "c"]))


def test_a_shard_index_or_an_arrays_share_changes_the_digest():
    base = tf.data.Dataset.range(100)
    assert input_digest(base.shard(2, 0).batch(8)) != input_digest(base.shard(2, 1).batch(8))
    x = np.arange(200, dtype="float32").reshape(100, 2)
    assert input_digest(tf.data.Dataset.from_tensor_slices(x[0::2]).batch(8)) != \
        input_digest(tf.data.Dataset.from_tensor_slices(x[1::2]).batch(8))
    assert input_digest(x[0::2]) != input_digest(x[1::2]) and input_digest(x) == input_digest(x.copy())


def test_digesting_a_seeded_reshuffle_does_not_draw_its_next_order():
    def dataset():  # noqa: ANN202
        return tf.data.Dataset.range(50).shuffle(50, seed=4, reshuffle_each_iteration=True).batch(50)

    untouched, digested = dataset(), dataset()
    input_digest(digested)
    assert list(next(iter(digested)).numpy()) == list(next(iter(untouched)).numpy())


def test_an_unseeded_shuffle_has_one_digest_on_every_rank():
    assert input_digest(tf.data.Dataset.range(50).shuffle(50).batch(5)) == \
        input_digest(tf.data.Dataset.range(50).shuffle(50).batch(5))


def test_the_same_files_in_each_ranks_own_directory_are_one_input(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
        for part in range(2):
            (tmp_path / f"rank{rank}" / f"part-{part}.tfrecord").write_bytes(b"x" * (10 + part))
    copies = [files([str(tmp_path / f"rank{rank}" / f"part-{p}.tfrecord") for p in range(2)]) for rank in (0, 1)]
    assert input_digest(copies[0]) == input_digest(copies[1])
    assert input_digest(files([str(tmp_path / "rank0" / "part-0.tfrecord")])) != \
        input_digest(files([str(tmp_path / "rank0" / "part-1.tfrecord")]))
