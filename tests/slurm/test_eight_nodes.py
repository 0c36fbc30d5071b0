"""8 emulated nodes (issue 54): MWM x8 and Horovod x8, one task per node, train in sync through the job scripts,
on a second local cluster of 8 nodes (tests/cluster/eight-nodes.env). Eight TensorFlow processes on CI's 2 cores:
--full only; the time they take to their first step is `benchmarks/run.py nodes`."""

import pytest

from helpers import assert_trained_in_sync, full_tier_only
from slurm_jobs import submit

EIGHT_NODES = ["--cpus-per-task=1", "--time=20", "--nodes=8", "--ntasks-per-node=1", "--gres=gpu:1"]


@full_tier_only("8 TensorFlow processes on 2 cores, about a minute a mode")
@pytest.mark.parametrize("mode", ["mwm", "horovod"])
def test_eight_nodes_train_in_sync(slurm_eight_nodes, tmp_path, mode):
    job = submit(slurm_eight_nodes, tmp_path, mode, EIGHT_NODES, ["--epochs", "2"])
    assert job.code == 0, job
    assert f"{mode} on 8 worker(s)" in job.log, job
    assert_trained_in_sync(job.log, workers=8)
