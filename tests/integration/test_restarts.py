"""Faults survived without a person (entrypoint/restarts.py): `distrain launch -n 2` with one worker SIGKILLed
mid-epoch (as the OOM killer would) restarts both from the last checkpoint and ends with the weights of the run
never interrupted; the script's own error is not retried; a worker killed at every attempt ends the run after
DISTRAIN_MAX_RESTARTS with exit 4, leaving no process behind."""

import re
from pathlib import Path

import numpy as np

from helpers import DISTRAIN, ROOT, keras_env, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "exact_resume.py")


def launch(out: Path, state: Path, family: str = "legacy", **env: str):
    out.mkdir(exist_ok=True)
    return run([DISTRAIN, "launch", "-n", "2", SCRIPT, "--out", str(out)],
               env=keras_env(family, DISTRAIN_OUTPUT_DIR=str(state), DISTRAIN_CHECKPOINT_EVERY="3", **env))


def test_a_worker_killed_mid_epoch_is_restarted_from_the_checkpoint_and_the_result_is_the_same(tmp_path):
    never_killed = launch(tmp_path / "a", tmp_path / "state-a")
    assert never_killed.returncode == 0, never_killed.stdout[-3000:]
    killed = launch(tmp_path / "b", tmp_path / "state-b", KILL_AT="2:5")
    assert killed.returncode == 0, killed.stdout[-3000:]
    assert (tmp_path / "b" / "killed").exists()  # it was killed, once
    restart = re.search(r"distrain launch: worker 1 \(localhost:\d+\) was killed by SIGKILL \(out of memory\?\); "
                        r"restart 1 of 3 from the checkpoint at epoch 2, step \d \(lost: the work since it, \d+ s\)",
                        killed.stdout)
    assert restart, killed.stdout[-3000:]
    assert killed.stdout.strip().splitlines()[-1].startswith("distrain launch: finished after 1 restart(s)")
    assert not re.search(r"\[\d/2\] \[\d/2\]", killed.stdout), killed.stdout[-3000:]  # the launcher's prefix alone
    assert np.array_equal(np.load(tmp_path / "a" / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))


def test_the_scripts_own_error_is_not_retried(tmp_path):
    crashed = launch(tmp_path / "b", tmp_path / "state", CRASH_AT="2:2")  # rank 0 exits 1: the script's error
    assert crashed.returncode == 1 and "restart 1 of" not in crashed.stdout, crashed.stdout[-3000:]


def test_a_worker_killed_at_every_attempt_ends_the_run_after_the_limit(tmp_path):
    out = launch(tmp_path / "b", tmp_path / "state", KILL_AT="1:2", KILL_EVERY_TIME="1", DISTRAIN_MAX_RESTARTS="1")
    assert out.returncode == 4, out.stdout[-3000:]
    assert len(re.findall(r"distrain launch: worker 1 \(localhost:\d+\) was killed by SIGKILL", out.stdout)) == 1
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("distrain launch: gave up after 1 restart(s) (DISTRAIN_MAX_RESTARTS=1): worker 1"), last
    leftover = run(["pgrep", "-f", f"{tmp_path}/b"])
    assert leftover.stdout.strip() == "", leftover.stdout  # nothing left running
