"""A resume leaves out the batches it passes over beneath the stages that make them (entrypoint/fit/skip_beneath.py):
the same batches follow as after making and dropping them, without the map's work; a map that holds state keeps
the skip above it, and says so."""

import pytest

from entrypoint.fit.resume import Start, _positioned_dataset
from entrypoint.fit.skip_beneath import skip_batches


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


def expensive(x):  # a pure function of its element: a stand-in for decode and a fixed transform
    import tensorflow as tf

    return {"image": tf.cast(x, tf.float32) * 2.0}, x % 3


def values(dataset) -> list:
    import tensorflow as tf

    return [[t.numpy().tolist() for t in tf.nest.flatten(element)] for element in dataset]


def stages(dataset) -> list[str]:
    names = []
    while dataset is not None:
        names.append(type(dataset).__name__.strip("_"))
        dataset = getattr(dataset, "_input_dataset", None)
    return names


def test_the_issues_pipeline_is_skipped_beneath_its_map_and_batch(tf):
    def pipeline():  # issue 54's: a seeded shuffle, an expensive pure map, batches; built anew for each run
        return tf.data.Dataset.range(100).shuffle(100, seed=3).map(expensive, num_parallel_calls=2).batch(8).prefetch(1)

    resumed, why = skip_batches(pipeline(), 5)
    assert why is None
    assert stages(resumed)[:5] == ["PrefetchDataset", "BatchDataset", "ParallelMapDataset", "SkipDataset",
                                   "ShuffleDataset"]  # 40 elements left out before the map: none of them made
    assert values(resumed) == values(pipeline().skip(5))  # the very batches making and dropping them gives


def test_an_endless_stream_and_a_shuffle_of_batches_keep_their_order(tf):
    def stream():
        return tf.data.Dataset.range(10).shuffle(10, seed=1).repeat().map(lambda x: x * 2).batch(4)

    assert values(skip_batches(stream(), 7)[0].take(6)) == values(stream().skip(7).take(6))

    def batch_shuffle():
        return tf.data.Dataset.range(40).batch(4).shuffle(10, seed=2)

    resumed, why = skip_batches(batch_shuffle(), 3)
    assert values(resumed) == values(batch_shuffle().skip(3))
    assert why == "its last stage (ShuffleDataset) comes first"


def test_a_map_drawing_random_numbers_is_made_for_every_batch_passed_over_and_says_so(tf):
    numbers = tf.data.Dataset.range(40).map(lambda x: tf.random.uniform(()) + tf.cast(x, tf.float32)).batch(4)
    resumed, why = skip_batches(numbers, 3)
    assert "its map holds state" in why
    assert stages(resumed)[:3] == ["BatchDataset", "SkipDataset", "MapDataset"]  # the skip above the random map


def test_a_resumed_epoch_of_a_reshuffled_dataset_is_the_run_never_stopped(tf):
    def pipeline():
        return tf.data.Dataset.range(20).shuffle(20, seed=5).map(expensive).batch(6)  # 4 batches: 6, 6, 6, 2

    whole, _ = _positioned_dataset(pipeline(), Start(0, 0), 3, 0, 1, 1, note=print)
    notes = []
    resumed, _ = _positioned_dataset(pipeline(), Start(1, 2), 3, 0, 1, 1, note=notes.append)
    assert values(resumed) == values(whole)[4 + 2:]  # epoch 2 from its third batch, then epoch 3: their own orders
    assert notes == []  # nothing made again
