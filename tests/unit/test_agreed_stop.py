"""A stop agreed at an epoch's last step waits for that epoch's end (stopping.AgreedStop): a checkpoint taken
before it would resume at the next epoch's start without the epoch's validation and epoch-end callbacks. Every rank
says in the stop check's all-reduce whether its epoch ends there, so all of them wait or none does (the end-to-end
proof: integration/test_exact_resume.py::test_a_checkpoint_at_an_epochs_last_step_keeps_that_epochs_end)."""

import pytest

from entrypoint.fit import steps, stopping
from entrypoint.plan import detect


class Backup:
    """What the stop uses of a backup: its schedule and a checkpoint written now."""

    def __init__(self, position, save_freq="epoch"):
        self.position, self.save_freq, self.saved = position, save_freq, []

    def save_now(self, then=None):
        self.saved.append((self.position.epoch, self.position.batch))
        where = f"epoch {self.position.epoch}, after step {self.position.batch}"
        if then is not None:
            then(where)
        return where


class Fit:
    """The stop, its backup and the training position they read, as the fit hook builds them."""

    def __init__(self, reduce_sum=lambda values: values, learnt_length=None, save_freq="epoch"):
        self.position = steps.TrainingPosition(learnt_length=learnt_length)
        self.backup = Backup(self.position, save_freq)
        flag = stopping.SignalFlag()
        flag.signame = "SIGTERM"  # the signal came: the next check stops
        self.stop = stopping.AgreedStop(detect({}, gpus=[]), reduce_sum, self.backup, flag, self.position)
        self.position.observers.append(self.stop.step_ended)

    def step_ends_at(self, epoch, batch, length):
        """The epoch begins (`length` steps, None: unknown) and trains up to `batch`: its last call checks."""
        self.position.epoch_began(epoch, length)
        self.position.batch = batch - 1
        self.position.call_ended()


@pytest.mark.parametrize(("length", "learnt"), [(7, None), (None, 7)], ids=["fits-steps", "learnt-length"])
def test_a_stop_at_an_epochs_last_step_is_taken_after_its_end(length, learnt):
    fit = Fit(learnt_length=lambda: learnt)
    fit.step_ends_at(1, 6, length)  # the first call checks: the 7th and last step of the epoch
    assert fit.backup.saved == []
    with pytest.raises(stopping.Preempted):
        fit.stop.epoch_end()
    assert fit.backup.saved == [(1, 6)]


def test_a_stop_within_an_epoch_is_taken_before_the_next_step_after_this_ones_batch_hooks():
    """The script's batch-end callbacks of the step the stop lands on run first (#84: before, never)."""
    fit = Fit()
    fit.step_ends_at(1, 3, 7)
    assert fit.backup.saved == []  # Keras calls the step's batch-end callbacks now
    with pytest.raises(stopping.Preempted):
        fit.position.call_begins()
    assert fit.backup.saved == [(1, 3)]


def test_ranks_that_disagree_about_the_epochs_end_all_stop_before_the_next_step():
    """Another rank's epoch does not end at this step (a rank that has not learnt the length yet): its sum of
    "last" is below the count, and every rank stops here rather than some waiting while others write."""
    other_rank = [0.0, 0.001, 0.0, 1.0, 0.0]  # [signalled, step time, checkpoint due, one, last]
    fit = Fit(reduce_sum=lambda values: [a + b for a, b in zip(values, other_rank, strict=True)])
    fit.step_ends_at(1, 6, 7)
    with pytest.raises(stopping.Preempted):
        fit.position.call_begins()
    assert fit.backup.saved == [(1, 6)]


def test_a_timed_checkpoint_due_at_an_epochs_last_step_is_written_after_its_end():
    """DISTRAIN_CHECKPOINT_MINUTES with DISTRAIN_CHECKPOINT_EVERY: the backup writes none at the epoch's end."""
    fit = Fit(save_freq=100)
    fit.stop.flag.signame = None
    fit.stop.timed, fit.stop.saved_at = 60.0, -1e9  # a timed checkpoint long due
    fit.step_ends_at(0, 6, 7)
    assert fit.backup.saved == []
    fit.stop.epoch_end()
    assert fit.backup.saved == [(0, 6)]
