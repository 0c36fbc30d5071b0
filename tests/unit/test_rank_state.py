"""Each rank's own non-trainable state beside a mid-epoch checkpoint (entrypoint/fit/rank_state.py): given back to
the rank that wrote it, averaged over the ranks that wrote it when the run resumes on another number of ranks,
private, and only the newest positions kept."""

import os
import stat

import numpy as np

from entrypoint import runs
from entrypoint.fit import rank_state


def restored(state_dir, position, rank, size):
    got = []
    said = rank_state.restore(str(state_dir), position, rank, size, got.extend)
    return said, got


def test_each_rank_gets_its_own_copy_back(tmp_path):
    for rank in (0, 1):
        rank_state.save(str(tmp_path), runs.Position(1, 3), rank, 2,
                        [np.full(4, rank, "float32"), np.array([rank + 10.0])])
    said, got = restored(tmp_path, runs.Position(1, 3), 1, 2)
    assert "own" in said and np.array_equal(got[0], np.ones(4, "float32")) and got[1].tolist() == [11.0]
    # an epoch's end: nothing kept, the state is averaged
    assert restored(tmp_path, runs.Position(2, 0), 1, 2) == (None, [])
    directory = tmp_path / "ranks"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()} == {0o600}


def test_on_another_number_of_ranks_the_copies_are_averaged(tmp_path):
    for rank in (0, 1):
        rank_state.save(str(tmp_path), runs.Position(0, 5), rank, 2, [np.full(3, 2.0 * rank, "float32")])
    said, got = restored(tmp_path, runs.Position(0, 5), 0, 1)
    assert "averaged over the 2 ranks" in said and got[0].dtype == np.float32 and got[0].tolist() == [1.0] * 3


def test_only_the_newest_positions_are_kept_and_a_finished_fit_removes_its_own(tmp_path):
    for step in range(1, 5):
        rank_state.save(str(tmp_path), runs.Position(0, step), 0, 2, [np.zeros(1)])
        os.utime(tmp_path / "ranks" / f"e0-s{step}.rank0-of2.npz", (step, step))
    rank_state.save(str(tmp_path), runs.Position(0, 9), 1, 2, [np.zeros(1)])
    assert sorted(p.name for p in (tmp_path / "ranks").iterdir()) == [
        "e0-s3.rank0-of2.npz", "e0-s4.rank0-of2.npz", "e0-s9.rank1-of2.npz"]
    rank_state.remove(str(tmp_path), 0)
    assert [p.name for p in (tmp_path / "ranks").iterdir()] == ["e0-s9.rank1-of2.npz"]
