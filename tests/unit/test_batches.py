"""Global batches in every mode (entrypoint/fit/batches.py, arrays.py): the batch bounds, the ranks' shares, and
real tf.data pipelines that partition each epoch between the ranks and never hand a replica an empty batch."""

import numpy as np
import pytest

from entrypoint.compat.script_gpu_pinning import TaskGPUs
from entrypoint.fit.arrays import array_dataset, batch_bounds, share, splits_cleanly
from entrypoint.fit.batches import batch_layout, even_out_last_batch, is_sharded, pipeline_stages, rank_slices


def sizes(bounds):
    return [end - start for start, end in bounds]


def test_a_short_last_batch_takes_what_it_lacks_from_the_one_before():
    assert sizes(batch_bounds(66, 16, replicas=4)) == [16, 16, 16, 14, 4]
    assert sizes(batch_bounds(769, 64, replicas=2)) == [64] * 11 + [63, 2]
    assert sizes(batch_bounds(64, 16, replicas=4)) == [16] * 4  # nothing short: unchanged
    assert sizes(batch_bounds(66, 16, replicas=1)) == [16, 16, 16, 16, 2]
    assert sizes(batch_bounds(5, 4, replicas=4)) == [4, 1]  # too few to spare: left as it is
    # 1797 digits in 64s: a last batch of 5 would be cut 2, 2, 1, 0 by TensorFlow's rebatch; 8 splits 2 each
    assert sizes(batch_bounds(1797, 64, replicas=4))[-2:] == [61, 8]


def test_a_clean_split_gives_every_replica_a_sample():
    assert [b for b in range(1, 13) if splits_cleanly(b, 4)] == [4, 7, 8, 10, 11, 12]
    assert splits_cleanly(64, 4) and not splits_cleanly(9, 4) and splits_cleanly(2, 2) and not splits_cleanly(1, 2)


def test_shares_are_contiguous_and_cover_the_batch():
    assert [share(10, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [share(2, r, 2) for r in range(2)] == [(0, 1), (1, 2)]


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_the_ranks_partition_every_epoch_of_shuffled_arrays(tf, ranks):
    x = {"pixels": np.arange(66, dtype="float32").reshape(66, 1)}
    y = np.arange(66)
    per_rank = [array_dataset((x, y), 16, True, rank, ranks) for rank in range(ranks)]
    orders = []
    for _epoch in range(2):
        seen, steps = [], set()
        for dataset in per_rank:
            batches = [labels.numpy().tolist() for _, labels in dataset]
            assert all(batches), "a rank got an empty batch"
            steps.add(len(batches))
            seen += sum(batches, [])
        assert sorted(seen) == list(range(66)) and len(steps) == 1  # every sample once, same step count
        assert int(per_rank[0].cardinality()) == 5
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled each epoch, the same way on every rank


def test_a_dataset_keeps_its_step_count_and_gives_every_replica_a_sample(tf):
    dataset = tf.data.Dataset.from_tensor_slices((np.arange(66.0), np.arange(66))).batch(16)
    evened = even_out_last_batch(dataset, 4)
    assert [int(labels.shape[0]) for _, labels in evened] == [16, 16, 16, 14, 4]
    five = tf.data.Dataset.range(1797).batch(64)  # examples/train.py's digits: a last batch of 5 on 4 workers
    assert [int(b.shape[0]) for b in even_out_last_batch(five, 4)][-2:] == [61, 8]
    assert int(evened.cardinality()) == 5
    shares = [[labels.numpy().tolist() for _, labels in rank_slices(evened, r, 4)] for r in range(4)]
    assert sorted(sum(sum(shares, []), [])) == list(range(66))
    assert all(batch for rank in shares for batch in rank)


@pytest.mark.parametrize(("samples", "batch", "replicas"), [(66, 16, 4), (1797, 64, 4), (65, 64, 2), (27, 8, 4)])
def test_known_batches_are_recut_natively_as_the_look_ahead_would(tf, samples, batch, replicas):
    known = tf.data.Dataset.range(samples).batch(batch).prefetch(1)
    unknown = tf.data.Dataset.range(samples).filter(lambda i: i >= 0).batch(batch)  # length unknown: look-ahead
    recut, looked_ahead = even_out_last_batch(known, replicas), even_out_last_batch(unknown, replicas)
    stages = [type(stage).__name__ for stage in pipeline_stages(recut)]
    assert stages[0] == "_PrefetchDataset" and "_RebatchDataset" in stages  # native, beneath the script's prefetch
    assert "_ScanDataset" not in stages  # no function per batch
    assert [b.numpy().tolist() for b in recut] == [b.numpy().tolist() for b in looked_ahead]
    assert int(recut.cardinality()) == -(-samples // batch)


def test_the_rank_slices_go_beneath_the_scripts_own_prefetch_and_keep_it(tf):
    dataset = tf.data.Dataset.range(64).batch(16).prefetch(3)
    sliced = rank_slices(dataset, 1, 2)
    assert type(sliced).__name__ == "_PrefetchDataset" and int(sliced._buffer_size) == 3
    assert [b.numpy().tolist() for b in sliced] == [list(range(s + 8, s + 16)) for s in range(0, 64, 16)]
    options, data = tf.data.Options(), tf.data.experimental.AutoShardPolicy.DATA
    options.experimental_distribute.auto_shard_policy = data
    last_options = rank_slices(dataset.with_options(options), 1, 2)  # the multi-worker tutorial's order
    assert [type(s).__name__ for s in pipeline_stages(last_options)][:2] == ["_OptionsDataset", "_PrefetchDataset"]
    assert last_options.options().experimental_distribute.auto_shard_policy == data
    assert [b.numpy().tolist() for b in last_options] == [b.numpy().tolist() for b in sliced]


def test_an_infinite_or_already_even_dataset_is_unchanged_in_content(tf):
    even = tf.data.Dataset.range(64).batch(16)
    assert [b.numpy().tolist() for b in even_out_last_batch(even, 4)] == [b.numpy().tolist() for b in even]
    assert even_out_last_batch(even, 4) is even  # known from the graph: nothing added to the pipeline
    cleanly = tf.data.Dataset.range(71).shuffle(71).batch(16).map(lambda b: b * 2).prefetch(1)  # a last batch of 7
    assert even_out_last_batch(cleanly, 4) is cleanly
    endless = tf.data.Dataset.range(8).batch(4).repeat()
    assert even_out_last_batch(endless, 4) is endless


def test_the_batch_layout_is_read_from_the_pipeline_where_it_can_be(tf):
    assert batch_layout(tf.data.Dataset.range(66).shuffle(66).batch(16).map(lambda b: b).prefetch(2)) == (66, 16, False)
    assert batch_layout(tf.data.Dataset.range(66).batch(16, drop_remainder=True)) == (66, 16, True)
    assert batch_layout(tf.data.Dataset.range(66).filter(lambda i: i > 3).batch(16)) is None  # unknown length
    assert batch_layout(tf.data.Dataset.range(66).batch(16).unbatch().batch(8)) is None  # unbatch: length unknown
    assert batch_layout(tf.data.Dataset.range(66).batch(16).take(2)) is None  # take: not read through


@pytest.mark.parametrize(("samples", "batch", "ranks"), [(70, 16, 2), (71, 16, 4), (40, 9, 4)])
def test_the_ranks_slices_partition_every_batch_and_none_is_empty(tf, samples, batch, ranks):
    dataset = even_out_last_batch(tf.data.Dataset.range(samples).batch(batch), ranks)
    per_rank = [[b.numpy().tolist() for b in rank_slices(dataset, r, ranks)] for r in range(ranks)]
    assert len({len(batches) for batches in per_rank}) == 1 and all(b for batches in per_rank for b in batches)
    assert sorted(sum(sum(per_rank, []), [])) == list(range(samples))


def test_a_dataset_the_script_sharded_is_recognised(tf):
    base = tf.data.Dataset.range(100)
    assert is_sharded(base.shard(2, 1).shuffle(10).batch(8).prefetch(1))
    assert not is_sharded(base.shuffle(10).batch(8))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    assert is_sharded(base.batch(8).with_options(options))  # per-rank files, split by the script


def test_a_scripts_gpu_index_by_local_rank_means_the_tasks_gpu():
    gpus = TaskGPUs(["GPU:0"], local_rank=1)  # distrain narrowed this task to one GPU
    assert gpus[1] == "GPU:0" and gpus[0] == "GPU:0" and list(gpus) == ["GPU:0"]
    with pytest.raises(IndexError):
        gpus[2]  # any other index is still wrong
    assert TaskGPUs(["GPU:0", "GPU:1"], local_rank=1)[1] == "GPU:1"  # in range: the task's own second GPU
    with pytest.raises(IndexError):
        TaskGPUs([], local_rank=1)[1]


def test_pydataset_and_generator_batches_are_shared_between_the_ranks(tf):
    import keras

    from entrypoint.fit.batches import adapt_fit_arguments

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            x = np.arange(index * 10, index * 10 + 10)
            return [x, x * 2], x  # a list of two model inputs, and the labels

    seen = []
    for rank in range(2):
        arguments = {"x": Batches()}
        adapt_fit_arguments(arguments, keras, rank=rank, size=2, note=lambda line: None)
        share = arguments["x"]
        assert len(share) == 3
        for index in range(3):
            (first, second), labels = share[index]
            assert list(second) == list(first * 2) and list(labels) == list(first)
            seen += list(labels)
        arguments = {"x": iter([(np.arange(4), np.arange(4))])}
        adapt_fit_arguments(arguments, keras, rank=rank, size=2, note=lambda line: None)
        assert [list(y) for _, y in arguments["x"]] == [[0, 1] if rank == 0 else [2, 3]]
    assert sorted(seen) == list(range(30))


def test_exact_resumes_pipeline_gives_every_epoch_its_own_order_wherever_it_starts():
    from entrypoint.fit.arrays import positioned_array_dataset

    x = np.arange(10, dtype="float32")
    whole = [b.numpy().tolist() for b in positioned_array_dataset((x,), 4, True, first_epoch=0, epochs=3, skip=0)]
    assert len(whole) == 9  # 3 epochs of 3 batches (4, 4, 2)
    for epoch in range(3):
        assert sorted(sum(whole[epoch * 3:epoch * 3 + 3], [])) == list(range(10))  # every sample once per epoch
    assert whole[0:3] != whole[3:6]  # reshuffled every epoch
    resumed = [b.numpy().tolist() for b in positioned_array_dataset((x,), 4, True, first_epoch=1, epochs=3, skip=2)]
    assert resumed == whole[5:]  # epoch 2, step 3 on: what the run never stopped trains next


def test_a_shuffle_without_any_seed_cannot_be_positioned():
    import tensorflow as tf

    from entrypoint.fit.resume import unseeded_shuffle

    numbers = tf.data.Dataset.range(10)
    assert unseeded_shuffle(numbers.shuffle(10).batch(2).map(lambda b: b * 2))
    assert not unseeded_shuffle(numbers.shuffle(10, seed=3).batch(2))
    assert not unseeded_shuffle(numbers.batch(2))
    tf.random.set_seed(5)  # a global seed fixes every op's seed
    try:
        assert not unseeded_shuffle(numbers.shuffle(10).batch(2))
    finally:
        tf.random.set_seed(None)
