"""A stop agreed at an epoch's last step waits for that epoch's end (stopping.AgreedStop): a checkpoint taken
before it would resume at the next epoch's start without the epoch's validation and epoch-end callbacks. Every rank
says in the stop check's all-reduce whether its epoch ends there, so all of them wait or none does (the end-to-end
proof: integration/test_exact_resume.py::test_a_checkpoint_at_an_epochs_last_step_keeps_that_epochs_end)."""

import pytest

from entrypoint.fit import stopping
from entrypoint.plan import detect


class Backup:
    """What the stop uses of a backup: its schedule and a checkpoint written now."""

    def __init__(self, save_freq="epoch"):
        self.save_freq, self.saved = save_freq, []

    def save_now(self, epoch, batch):
        self.saved.append((epoch, batch))
        return f"epoch {epoch}, after step {batch}"


def agreed_stop(tmp_path, monkeypatch, backup, reduce_sum=lambda values: values, learnt_length=None):
    flag = stopping.SignalFlag()
    flag.signame = "SIGTERM"  # the signal came: the next check stops
    return stopping.AgreedStop(detect({}, gpus=[]), reduce_sum, backup, flag, learnt_length)


@pytest.mark.parametrize(("steps", "learnt"), [(7, None), (None, 7)], ids=["fits-steps", "learnt-length"])
def test_a_stop_at_an_epochs_last_step_is_taken_after_its_end(tmp_path, monkeypatch, steps, learnt):
    backup = Backup()
    stop = agreed_stop(tmp_path, monkeypatch, backup, learnt_length=lambda: learnt)
    stop.epoch_began(1, steps)
    stop.step_ended(6)  # the first step checks: the 7th and last of the epoch
    assert backup.saved == []
    with pytest.raises(stopping.Preempted):
        stop.epoch_end()
    assert backup.saved == [(1, 6)]


def test_a_stop_within_an_epoch_is_taken_at_once(tmp_path, monkeypatch):
    backup = Backup()
    stop = agreed_stop(tmp_path, monkeypatch, backup)
    stop.epoch_began(1, 7)
    with pytest.raises(stopping.Preempted):
        stop.step_ended(3)
    assert backup.saved == [(1, 3)]


def test_ranks_that_disagree_about_the_epochs_end_all_stop_at_once(tmp_path, monkeypatch):
    """Another rank's epoch does not end at this step (a rank that has not learnt the length yet): its sum of
    "last" is below the count, and every rank stops here rather than some waiting while others write."""
    backup = Backup()
    other_rank = [0.0, 0.001, 0.0, 1.0, 0.0]  # [signalled, step time, checkpoint due, one, last]
    stop = agreed_stop(tmp_path, monkeypatch, backup,
                       reduce_sum=lambda values: [a + b for a, b in zip(values, other_rank, strict=True)])
    stop.epoch_began(1, 7)
    with pytest.raises(stopping.Preempted):
        stop.step_ended(6)
    assert backup.saved == [(1, 6)]


def test_a_timed_checkpoint_due_at_an_epochs_last_step_is_written_after_its_end(tmp_path, monkeypatch):
    """DISTRAIN_CHECKPOINT_MINUTES with DISTRAIN_CHECKPOINT_EVERY: the backup writes none at the epoch's end."""
    backup = Backup(save_freq=100)
    stop = agreed_stop(tmp_path, monkeypatch, backup)
    stop.flag.signame = None
    stop.timed, stop.saved_at = 60.0, -1e9  # a timed checkpoint long due
    stop.epoch_began(0, 7)
    stop.step_ended(6)
    assert backup.saved == []
    stop.epoch_end()
    assert backup.saved == [(0, 6)]
