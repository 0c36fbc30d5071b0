"""Real TensorFlow: the unmodified example trained by `distrain run` (single) and `distrain launch` (MWM)."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers import (
    CPP_CHATTER,
    DISTRAIN,
    KERAS_FAMILIES,
    Watched,
    assert_trained_in_sync,
    clean_env,
    keras_env,
    load_model,
    results,
    run,
)

# On TensorFlow 2.21 (`core`) both families' ranks that start apart: the broadcast of the chief's first weights (the
# conformance suite's scenarios start alike). A tf_keras model saved and loaded on 2.21 is the Horovod sync test's
# (horovod/test_horovod.py, mpi-legacy), not the single one's
BOTH_CORE = [pytest.param(family, marks=pytest.mark.core) for family in KERAS_FAMILIES]


@pytest.mark.parametrize("family", KERAS_FAMILIES)
def test_single_trains_the_unmodified_script_and_saves_once(tmp_path, family):
    model = tmp_path / "digits.keras"
    out = run([DISTRAIN, "run", "examples/train.py", "--epochs", "3", "--save", str(model)], env=keras_env(family))
    assert out.returncode == 0, out.stdout[-3000:]
    assert "distrain: single on 1 worker(s)" in out.stdout
    assert_trained_in_sync(out.stdout, workers=1)
    assert sorted(os.listdir(tmp_path)) == ["digits.keras"]  # no temp files left behind
    load_model(model, family)


def test_python_dash_m_entrypoint_is_the_same_command(tmp_path):
    out = run(["python", "-m", "entrypoint", "examples/train.py", "--epochs", "1"])
    assert out.returncode == 0, out.stdout[-3000:]
    assert results(out.stdout)[0]["epochs"] == "1"


@pytest.mark.parametrize("family", BOTH_CORE)
def test_mwm_synchronises_ranks_that_start_apart(tmp_path, family):
    """Different seeds and data per rank; identical weights at the end, progress from the chief only, one model
    saved. Without the hooks: different weights."""
    model = tmp_path / "m.keras"
    out = run([DISTRAIN, "launch", "-n", "2", "examples/sync_check.py", "--epochs", "2", "--save", str(model)],
              env=keras_env(family))
    assert out.returncode == 0, out.stdout[-3000:]
    found = assert_trained_in_sync(out.stdout, workers=2)
    assert {r["rank"] for r in found} == {"0", "1"} and {r["size"] for r in found} == {"2"}
    assert "[0/2] Epoch 1/2" in out.stdout and "[1/2] Epoch" not in out.stdout  # progress from the chief only
    assert not CPP_CHATTER.search(out.stdout), CPP_CHATTER.findall(out.stdout)  # rank-prefixed, no C++ INFO lines
    assert os.listdir(tmp_path) == ["m.keras"]
    load_model(model, family, input_shape=(16,))

    control = run([DISTRAIN, "launch", "-n", "2", "examples/sync_check.py", "--epochs", "2"],
                  env=keras_env(family, DISTRAIN_HOOKS="0"))
    assert control.returncode == 0, control.stdout[-3000:]
    assert len({r["weights"] for r in results(control.stdout)}) == 2, "negative control did not diverge"


@pytest.mark.parametrize("family", KERAS_FAMILIES)
def test_dt_save_from_two_workers_leaves_one_complete_model(tmp_path, family):
    """The other format of each family (`.keras`: test_mwm_synchronises_ranks_that_start_apart). Keras 3 saves
    .keras and .h5 only (a directory is model.export's job): distrain keeps Keras' rules."""
    target = tmp_path / ("savedmodel" if family == "legacy" else "model.h5")
    out = run([DISTRAIN, "launch", "-n", "2", "examples/sync_check.py", "--epochs", "1", "--save", str(target)],
              env=keras_env(family))
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.count("distrain: saved model to") == 1
    assert os.listdir(tmp_path) == [target.name]
    if family == "legacy":
        assert (target / "saved_model.pb").is_file()
    load_model(target, family, input_shape=(16,))


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_a_killed_worker_fails_the_launch_fast():
    proc = Watched([DISTRAIN, "launch", "-n", "2", "examples/train.py", "--epochs", "500"],
                   clean_env(DISTRAIN_CHECKPOINT="0"))
    lines = proc.until("Epoch 2/")
    workers = _children(proc.pid)
    assert len(workers) == 2, lines
    os.kill(workers[1], signal.SIGKILL)
    killed_at = time.monotonic()
    rest = proc.rest(timeout=60)
    code = proc.wait()
    assert time.monotonic() - killed_at < 60
    assert code == 4
    assert "distrain: error: lost worker 1 (localhost:" in rest and "killed by SIGKILL" in rest


def test_tfrecord_shards_are_disjoint_and_cover_the_data(tmp_path):
    out = run([DISTRAIN, "data", str(tmp_path / "tfr"), "--shards", "4"])
    assert out.returncode == 0, out.stdout
    out = run([DISTRAIN, "launch", "-n", "2", "examples/tfrecord_digits.py", str(tmp_path / "tfr"),
               "--epochs", "2", "--index-log", str(tmp_path / "seen")])
    assert out.returncode == 0, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=2)
    seen = [json.loads((tmp_path / f"seen.{rank}.json").read_text()) for rank in (0, 1)]
    assert not set(seen[0]) & set(seen[1]), "a sample was read by both workers"
    assert sorted(seen[0] + seen[1]) == list(range(1797)), "some samples were never read"


def test_plan_json_and_doctor():
    out = run([DISTRAIN, "plan", "--json"])
    assert out.returncode == 0 and json.loads(out.stdout)["mode"] == "single"
    out = run([DISTRAIN, "doctor"])
    assert out.returncode == 0, out.stdout
    assert "tensorflow: 2.17" in out.stdout and "horovod: 0.28.1" in out.stdout and "no problems found" in out.stdout
