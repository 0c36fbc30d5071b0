"""A dataset of unknown length, positioned epoch by epoch (entrypoint/fit/unknown_length.py): each epoch read is
the next order of the script's seeded reshuffle, an iterator made and never read draws none, a resumed one leaves
out the batches already trained, and the epochs' length is learnt when the first epoch's data ends."""

import pytest

tf = pytest.importorskip("tensorflow")

from entrypoint.fit import unknown_length  # noqa: E402

pytestmark = pytest.mark.core  # tf.data's iterators, on both TensorFlow lines


def script_dataset():
    """20 samples, a filter (so TensorFlow does not know the length), a seeded reshuffle, batches of 6: 4 an epoch."""
    return (tf.data.Dataset.range(20).filter(lambda i: i >= 0).shuffle(20, seed=3).map(lambda i: i * 10)
            .batch(6).prefetch(2))


def epoch(iterator):
    """The batches an iterator gives until its data ends."""
    return [batch.numpy().tolist() for batch in iterator]


def test_each_epoch_read_draws_the_next_order_and_an_unread_iterator_none():
    reference = script_dataset()
    orders = [epoch(iter(reference)) for _ in range(3)]  # what three passes of the script's own dataset give
    assert orders[0] != orders[1]
    direct = script_dataset()
    iter(direct)  # the script's own dataset: an iterator made and never read draws an order all the same
    assert epoch(iter(direct)) == orders[1]
    positioned, length = unknown_length.positioned_epochs(script_dataset(), 0, 0, None, print)
    assert int(positioned.cardinality()) == tf.data.UNKNOWN_CARDINALITY  # Keras ends each epoch where data ends
    assert length() is None  # nothing read yet
    first = epoch(iter(positioned))
    for _ in range(3):
        iter(positioned)  # made and never read, as Keras 3.15 does at an epoch's end: no order drawn
    assert [first, epoch(iter(positioned)), epoch(iter(positioned))] == orders
    assert length() == 4  # learnt when the first epoch's data ended


def test_a_resumed_process_starts_at_the_epoch_and_step_it_stopped_at():
    reference = script_dataset()
    orders = [epoch(iter(reference)) for _ in range(3)]
    positioned, length = unknown_length.positioned_epochs(script_dataset(), 1, 2, 4, print)
    assert length() == 4  # the checkpoint's record until this process learns it again
    assert epoch(iter(positioned)) == orders[1][2:]  # epoch 2 without the 2 batches trained before the stop
    assert epoch(iter(positioned)) == orders[2]  # then whole epochs


def test_an_order_not_the_same_in_every_process_is_not_positioned():
    """deterministic=False lets parallel stages give elements in the order they finish: no resumed process can
    know the interrupted epoch's, so the input is said to be not positioned (resume.nondeterministic_order)."""
    from entrypoint.fit.resume import nondeterministic_order

    assert nondeterministic_order(script_dataset()) is None
    racing = script_dataset().map(lambda batch: batch, num_parallel_calls=2, deterministic=False)
    assert "deterministic=False" in nondeterministic_order(racing)
    options = tf.data.Options()
    options.deterministic = False
    assert "Options.deterministic is False" in nondeterministic_order(script_dataset().with_options(options))
