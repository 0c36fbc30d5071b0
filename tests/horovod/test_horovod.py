"""Real Horovod (Gloo and MPI) running unmodified scripts through `distrain run`."""

import os

import pytest

from helpers import (
    DISTRAIN,
    FULL_TIER,
    HOROVODRUN_GLOO,
    KERAS_FAMILIES,
    MPIRUN,
    assert_trained_in_sync,
    clean_env,
    keras_env,
    load_model,
    results,
    run,
)

CORE = {("gloo", "keras3"), ("mpi", "legacy")}


# Pairwise: two cases that hold every launcher and every family once (`core`: TensorFlow 2.21 too); the Keras 3
# script below adds Keras 3 over MPI (TensorFlow 2.17), Horovod's elastic example (compat/) tf_keras over Gloo.
# --full: every launcher x family. The other Horovod tests start it with mpirun (helpers.MPIRUN says why).
@pytest.mark.parametrize(("launcher", "family"), [
    pytest.param(launcher, family, marks=[pytest.mark.core] if (launcher, family) in CORE else [],
                 id=f"{launcher}-{family}")
    for launcher in ("gloo", "mpi") for family in KERAS_FAMILIES if FULL_TIER or (launcher, family) in CORE])
def test_horovod_averages_ranks_that_start_apart(launcher, family, tmp_path):
    cmd = HOROVODRUN_GLOO if launcher == "gloo" else MPIRUN
    out = run([*cmd, DISTRAIN, "run", "examples/sync_check.py", "--epochs", "3", "--save", str(tmp_path / "m.keras")],
              env=keras_env(family))
    assert out.returncode == 0, out.stdout[-3000:]
    found = assert_trained_in_sync(out.stdout, workers=2)
    assert {(r["rank"], r["size"]) for r in found} == {("0", "2"), ("1", "2")}
    assert "horovod on 2 worker(s)" in out.stdout
    # dt.save under Horovod: rank 0 alone writes, atomically
    assert out.stdout.count("distrain: saved model to") == 1 and os.listdir(tmp_path) == ["m.keras"]
    load_model(tmp_path / "m.keras", family, input_shape=(16,))


@pytest.mark.parametrize("family", KERAS_FAMILIES)
def test_negative_control_without_hooks_diverges(family):
    out = run([*MPIRUN, DISTRAIN, "run", "examples/sync_check.py", "--epochs", "3"],
              env=keras_env(family, DISTRAIN_HOOKS="0"))
    assert out.returncode == 0, out.stdout[-3000:]
    found = results(out.stdout)
    assert len(found) == 2 and len({r["weights"] for r in found}) == 2, found


def test_unmodified_train_py_under_mpirun_saves_exactly_one_model(tmp_path):
    target = tmp_path / "digits.keras"
    out = run([*MPIRUN, DISTRAIN, "run", "examples/train.py", "--epochs", "3", "--save", str(target)])
    assert out.returncode == 0, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=2)
    assert out.stdout.count("distrain: saved model to") == 1
    assert os.listdir(tmp_path) == ["digits.keras"]


def test_custom_loop_recipe_with_distributed_tape():
    out = run([*MPIRUN, DISTRAIN, "run", "examples/custom_loop.py"])
    assert out.returncode == 0, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=2)


@pytest.mark.parametrize("launcher", [*(["gloo"] if FULL_TIER else []), "mpi"])
def test_keras3_script_under_horovod_ends_identical_from_different_starts(launcher):
    cmd = HOROVODRUN_GLOO if launcher == "gloo" else MPIRUN
    out = run([*cmd, DISTRAIN, "run", "examples/keras3_train.py", "--start-apart", "--epochs", "3"])
    assert out.returncode == 0, out.stdout[-3000:]
    found = assert_trained_in_sync(out.stdout, workers=2)
    assert all(r["keras"].startswith("3.") for r in found)


def test_keras3_negative_control_without_hooks_diverges():
    out = run([*MPIRUN, DISTRAIN, "run", "examples/keras3_train.py", "--start-apart",
               "--epochs", "1"], env=clean_env(DISTRAIN_HOOKS="0"))
    assert out.returncode == 0, out.stdout[-3000:]
    assert len({r["weights"] for r in results(out.stdout)}) == 2
