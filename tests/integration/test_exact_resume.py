"""A stop is invisible: stopped mid-epoch and resumed, a run trains the very batches, in the very order, and ends
with the very weights of the same run never stopped, bit for bit: single, MWM x2 and Horovod x2, both Keras
families, numpy input with shuffle=True, a tf.data dataset reshuffled every epoch, an endless one read in epochs of
fit's steps_per_epoch (Horovod's and TensorFlow's examples) and TFRecord shards through the tf.data performance
guide's pipeline (interleave, map, cache, shuffle, batch, prefetch: of unknown length), a model with its input
shape and one built on its first batch (tests/integration/scripts/exact_resume.py records every sample it trains
on), covered pairwise: every pair of values in some case. With a BatchNormalization layer, its moving statistics
too: each rank updates its own from its batches until the epoch's end averages them; a mid-epoch checkpoint keeps
every rank's own (rank_state.py) and the resume gives each rank its own back."""

import itertools
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from entrypoint.runs import newest_checkpoint
from helpers import DISTRAIN, FULL_TIER, KERAS_FAMILIES, MPIRUN, ROOT, Watched, clean_env, keras_env, run, run_once

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "exact_resume.py")
LAUNCHERS = {
    "single": [DISTRAIN, "run"],
    "mwm": [DISTRAIN, "launch", "-n", "2"],
    "horovod": [*MPIRUN, DISTRAIN, "run"],
}


def train(launcher: list[str], out: Path, state: Path, family: str, data: str = "numpy", args: tuple = (),
          **env: str):
    out.mkdir(exist_ok=True)
    return run([*launcher, SCRIPT, "--input", data, "--out", str(out), *args],
               env=keras_env(family, DISTRAIN_OUTPUT_DIR=str(state), **env))


def never_stopped(kept: Path, launcher: list[str], family: str, data: str = "numpy", args: tuple = ()) -> Path:
    """The output of the command run through, never stopped: what a stopped and resumed run must end with, run once
    a session for the tests that compare against the same command (helpers.run_once). Without checkpoint settings:
    a run that checkpoints ends the same."""
    return run_once(kept, ("exact_resume", launcher, family, data, args),
                    lambda out, state: train(launcher, out, state, family, data, args=args))


def trained_ids(out: Path) -> dict[str, list[str]]:
    """Each rank's trained batches, in order (sample indices, one line per batch)."""
    return {p.name: p.read_text().splitlines() for p in sorted(out.glob("ids-rank*.txt"))}


def every_sample(ids: dict[str, list[str]]) -> list[int]:
    return sorted(int(i) for lines in ids.values() for line in lines for i in line.split())


# Pairwise over input x mode x Keras family x input shape: each input in every mode, with complementary values, so that
# every pair of values appears in some case (--full: scripts/test.sh --full runs the whole product). `core`: also
# on TensorFlow 2.21, whose Keras 3.15 epoch iterator is the other one resume.py starts mid-epoch.
PAIRWISE = [("numpy", "single", "keras3", "input-shape"), ("tfdata", "single", "legacy", "built-on-first-batch"),
            ("numpy", "mwm", "keras3", "built-on-first-batch"), ("tfdata", "mwm", "legacy", "input-shape"),
            ("numpy", "horovod", "legacy", "built-on-first-batch"), ("tfdata", "horovod", "keras3", "input-shape"),
            ("stream", "single", "keras3", "built-on-first-batch"), ("stream", "mwm", "keras3", "input-shape"),
            ("stream", "horovod", "legacy", "input-shape"), ("tfrecord", "single", "legacy", "built-on-first-batch"),
            ("tfrecord", "mwm", "keras3", "input-shape"), ("tfrecord", "horovod", "legacy", "input-shape")]
# on 2.21: numpy (distrain's array pipeline) and the endless stream (unknown length, as TFRecord's) under MWM, the
# mode Keras 3.15's epoch iterators changed; tf_keras 2.21's resume: test_stages.py's core mwm-legacy case
CORE = {PAIRWISE[2], PAIRWISE[7]}
STREAM_SAMPLES = 3 * (100 // 16) * 16  # the stream's first 288 samples: 3 epochs of 6 batches of 16


def cases():
    product = itertools.product(("numpy", "tfdata", "stream", "tfrecord"), LAUNCHERS, KERAS_FAMILIES,
                                ("input-shape", "built-on-first-batch"))
    for case in (product if FULL_TIER else PAIRWISE):
        yield pytest.param(*case, marks=[pytest.mark.core] if case in CORE else [], id="-".join(case))


def stop_and_resume(launcher: list[str], tmp_path: Path, family: str, data: str, args: tuple,
                    between: Callable[[Path], None] = lambda state: None) -> re.Match:
    """Run b: stopped on SIGTERM mid-epoch (rank 0 after epoch 2 step 3; every step checks for a stop, so it lands
    there however fast the steps are), `between` applied to its state, then the same command again."""
    stopped = train(launcher, tmp_path / "b", tmp_path / "state-b", family, data, args=args, STOP_AT="2:3",
                    DISTRAIN_STOP_CHECK_SECONDS="0")
    assert stopped.returncode != 0, stopped.stdout[-3000:]
    where = re.search(r"stopped on SIGTERM after saving a checkpoint; rerun to resume at epoch (\d+), step (\d+)",
                      stopped.stdout)
    assert where and 1 < int(where[2]) <= 7, stopped.stdout[-3000:]  # mid-epoch, not at an epoch's start
    between(tmp_path / "state-b")
    resumed = train(launcher, tmp_path / "b", tmp_path / "state-b", family, data, args=args)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resuming run exact_resume-" in resumed.stdout and f"at epoch {where[1]}, step {where[2]} (" in \
        resumed.stdout, resumed.stdout[-3000:]
    return where


@pytest.mark.parametrize(("data", "mode", "family", "shape"), list(cases()))
def test_a_run_stopped_mid_epoch_resumes_exactly_where_it_was(tmp_path, kept_runs, data, mode, family, shape):
    launcher = LAUNCHERS[mode]
    args = ("--batch-norm", *(("--no-input-shape",) if shape == "built-on-first-batch" else ()))
    a = never_stopped(kept_runs, launcher, family, data, args)
    stop_and_resume(launcher, tmp_path, family, data, args)

    reference, stopped_and_resumed = trained_ids(a), trained_ids(tmp_path / "b")
    assert len(reference) == (1 if mode == "single" else 2)
    assert stopped_and_resumed == reference  # the same batches in the same order: nothing repeated or skipped
    if data == "stream":  # the stream's first 288 samples, every one of the 100 in them
        assert len(every_sample(reference)) == STREAM_SAMPLES and set(every_sample(reference)) == set(range(100))
    else:
        assert every_sample(reference) == sorted(list(range(100)) * 3)  # 3 epochs of 100, split between the ranks
    for kept in ("weights.npy", "statistics.npy"):  # every weight, the moving statistics included, bit for bit
        assert np.array_equal(np.load(a / kept), np.load(tmp_path / "b" / kept)), kept


# a PyDataset (tf_keras: Sequence) reshuffled by its own seeded on_epoch_end, fit's shuffle=False; an endless Python
# generator with steps_per_epoch, given to fit as it is or through tf.data.Dataset.from_generator
SCRIPT_BATCHES = [("pydataset", "single", "keras3"), ("pydataset", "mwm", "legacy"), ("generator", "horovod", "keras3"),
                  ("from-generator", "single", "legacy")]


@pytest.mark.parametrize(("data", "mode", "family"), [
    pytest.param(*case, marks=[pytest.mark.core] if case == SCRIPT_BATCHES[0] else [], id="-".join(case))
    for case in SCRIPT_BATCHES])
def test_a_pydataset_and_a_generator_resume_where_they_were(tmp_path, kept_runs, data, mode, family):
    """A PyDataset is positioned by index (the resumed epoch's step S reads the script's batch S; its on_epoch_end
    called once per epoch done, so its seeded reshuffle draws the same orders), a generator by replay (the batches
    trained before the stop read again and passed over): the same batches, the same weights as never stopped."""
    launcher = LAUNCHERS[mode]
    a = never_stopped(kept_runs, launcher, family, data)
    stop_and_resume(launcher, tmp_path, family, data, ())
    assert trained_ids(tmp_path / "b") == trained_ids(a)
    samples = every_sample(trained_ids(a))
    if data == "pydataset":  # 3 epochs of the 100 samples, split between the ranks
        assert samples == sorted(list(range(100)) * 3)
    else:  # the stream's first 288 samples
        assert len(samples) == STREAM_SAMPLES and set(samples) == set(range(100))
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))


@pytest.mark.parametrize(("data", "said"), [
    ("pydataset", "the PyDataset's batch 4 of this epoch (counted from 1) reads otherwise than before the stop"),
    ("generator", "passed over, is not the one trained last before the stop")])
def test_a_pydataset_or_generator_that_reshuffles_without_a_seed_is_said_to_train_other_batches(tmp_path, data,
                                                                                                said):
    """Negative control of the check above: reshuffled without a seed, the orders of a new process differ, and the
    digest of the last batch trained, kept in the checkpoint, says so in one line."""
    launcher, args = LAUNCHERS["single"], ("--unseeded",)
    stopped = train(launcher, tmp_path / "b", tmp_path / "state-b", "keras3", data, args=args, STOP_AT="2:3",
                    DISTRAIN_STOP_CHECK_SECONDS="0")
    where = re.search(r"rerun to resume at epoch (\d+), step (\d+)", stopped.stdout)
    assert stopped.returncode == 75 and where and int(where[2]) > 1, stopped.stdout[-3000:]
    resumed = train(launcher, tmp_path / "b", tmp_path / "state-b", "keras3", data, args=args)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    expected = said.replace("batch 4", f"batch {int(where[2]) - 1}")  # the last one trained: the step before
    assert expected in resumed.stdout, resumed.stdout[-3000:]


def test_each_ranks_own_moving_statistics_are_what_makes_the_resume_exact_negative_control(tmp_path, kept_runs):
    """The same stop under MWM x2 (numpy-mwm-keras3-built-on-first-batch above), the ranks' own copies removed
    before the resume: every rank then goes on from the chief's statistics, and the run ends with other ones than
    the run never stopped."""
    launcher, args = LAUNCHERS["mwm"], ("--batch-norm", "--no-input-shape")
    a = never_stopped(kept_runs, launcher, "keras3", "numpy", args)

    def remove_each_ranks_own(state: Path) -> None:
        (kept,) = state.glob("runs/*/ranks")
        assert len(list(kept.glob("*.rank*-of2.npz"))) == 2  # one copy per rank, beside the chief's checkpoint
        shutil.rmtree(kept)

    stop_and_resume(launcher, tmp_path, "keras3", "numpy", args, between=remove_each_ranks_own)
    assert trained_ids(tmp_path / "b") == trained_ids(a)
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))
    assert not np.array_equal(np.load(a / "statistics.npy"), np.load(tmp_path / "b" / "statistics.npy"))


def batches_done_at_resume(output: str, steps_per_epoch: int) -> int:
    """The batches the checkpoint a rerun resumed from had trained, from its line `... at epoch E, step S (`."""
    where = re.search(r"at epoch (\d+), step (\d+) \(", output)
    assert where, output[-3000:]
    return (int(where[1]) - 1) * steps_per_epoch + int(where[2]) - 1


@pytest.mark.parametrize(("mode", "family"), [("mwm", "legacy"), ("single", "keras3"),
                                              *([("single", "legacy")] if FULL_TIER else [])])
def test_a_crashed_run_resumes_from_its_last_timed_checkpoint(tmp_path, kept_runs, mode, family):
    """DISTRAIN_CHECKPOINT_EVERY=3: a checkpoint every 3 steps. A crash (no signal, no last checkpoint) at epoch 2
    step 5 loses steps 3-5 of epoch 2 (the newest checkpoint is after its step 2); the rerun goes on from step 3
    and ends with the weights of the run never stopped. Checkpoints are written while training goes on: one still
    being written when the crash came is lost too, and the rerun goes on from the one before (after epoch 1's step
    6), as exactly."""
    launcher = LAUNCHERS[mode]
    a = never_stopped(kept_runs, launcher, family)
    crashed = train(launcher, tmp_path / "b", tmp_path / "state-b", family, CRASH_AT="2:5",
                    DISTRAIN_CHECKPOINT_EVERY="3")
    assert crashed.returncode != 0, crashed.stdout[-3000:]
    trained_before = {rank: len(lines) for rank, lines in trained_ids(tmp_path / "b").items()}
    counters = saved_counters(tmp_path / "state-b") if family == "legacy" else None  # what tf_keras' resume reads
    resumed = train(launcher, tmp_path / "b", tmp_path / "state-b", family, DISTRAIN_CHECKPOINT_EVERY="3")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    steps = 7  # an epoch: 100 samples in global batches of 16
    done = batches_done_at_resume(resumed.stdout, steps)
    assert done in (steps + 2, steps - 1), resumed.stdout[-3000:]
    if counters is not None:  # after epoch 2's step 2 (index 1, 1), or epoch 1's step 6 (0, 5)
        assert counters == ({"ckpt_saved_epoch": 1, "ckpt_saved_batch": 1} if done == steps + 2 else
                            {"ckpt_saved_epoch": 0, "ckpt_saved_batch": 5}), counters

    reference, crashed_and_resumed = trained_ids(a), trained_ids(tmp_path / "b")
    assert crashed_and_resumed.keys() == reference.keys()
    for rank, lines in crashed_and_resumed.items():  # what ran after the checkpoint before the crash, ran again
        assert lines[:done] + lines[trained_before[rank]:] == reference[rank]
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))


@pytest.mark.parametrize("family", [pytest.param("keras3", marks=pytest.mark.core), "legacy"])
def test_timed_checkpoints_with_several_steps_a_call_resume_exactly(tmp_path, kept_runs, family):
    """compile(steps_per_execution=2): a train-function call runs 2 steps, and Keras' batch hooks run once a call
    (Keras 3.3 passing the call's first batch, tf_keras its last). 6 steps an epoch, DISTRAIN_CHECKPOINT_EVERY=4
    and a crash after epoch 2's second call: the rerun goes on from the newest checkpoint's true position, redoes
    only what came after it, and ends with the weights of the run never stopped. The checkpoints written in place
    (a crash during a write in flight loses it: test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_whole)."""
    launcher, two_a_call = LAUNCHERS["single"], ("--steps-per-execution", "2", "--samples", "96")
    a = never_stopped(kept_runs, launcher, family, args=two_a_call)
    crashed = train(launcher, tmp_path / "b", tmp_path / "state-b", family, args=two_a_call, CRASH_AT="2:3",
                    DISTRAIN_CHECKPOINT_EVERY="4", DISTRAIN_CHECKPOINT_ASYNC="0")
    assert crashed.returncode != 0, crashed.stdout[-3000:]
    (trained_before,) = (len(lines) for lines in trained_ids(tmp_path / "b").values())
    resumed = train(launcher, tmp_path / "b", tmp_path / "state-b", family, args=two_a_call,
                    DISTRAIN_CHECKPOINT_EVERY="4")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    steps = 6  # an epoch: 96 samples in batches of 16
    done = batches_done_at_resume(resumed.stdout, steps)  # batches in the checkpoint the rerun resumed from
    assert 0 < trained_before - done <= 4, (trained_before, done)
    (reference,), (lines,) = trained_ids(a).values(), trained_ids(tmp_path / "b").values()
    assert lines[:done] + lines[trained_before:] == reference  # nothing trained twice into the weights, nothing left
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))


@pytest.mark.parametrize(("mode", "family"), [("single", "keras3"), ("mwm", "legacy"), ("horovod", "keras3")])
def test_a_resumed_fit_returns_every_epochs_history_and_early_stopping_restores_the_best_weights(
        tmp_path, kept_runs, mode, family):
    """Before #84 a resumed fit's History held the epochs since the resume only, its interrupted epoch's loss was
    the mean of the steps after the resume, and EarlyStopping(restore_best_weights=True) restored the weights of
    the first epoch after the resume instead of the best one (here the first epoch's, restored at the third's end).
    Each rank's History is the run never stopped's, and the script's own batch hook ran once for every batch (the
    step the stop landed on lost its call)."""
    launcher, args = LAUNCHERS[mode], ("--early-stopping",)
    a = never_stopped(kept_runs, launcher, family, "numpy", args)
    stop_and_resume(launcher, tmp_path, family, "numpy", args)
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))
    for rank_file in sorted(a.glob("history-rank*.json")):
        want, got = (json.loads(path.read_text()) for path in (rank_file, tmp_path / "b" / rank_file.name))
        assert got["epoch"] == want["epoch"] == [0, 1, 2], (got, want)
        assert np.allclose(got["history"]["loss"], want["history"]["loss"], rtol=1e-6, atol=0), (got, want)
    for rank_file in sorted(a.glob("batch-ends-rank*.txt")):
        assert (tmp_path / "b" / rank_file.name).read_text() == rank_file.read_text(), rank_file.name


def test_a_run_stopped_twice_in_one_epoch_resumes_exactly(tmp_path, kept_runs):
    """Stopped at epoch 2 step 2, resumed, stopped again at its step 4, resumed: the second checkpoint records the
    step the resumed epoch reached (before stop 64 its steps were counted from the resume, and the second stop
    recorded a position before the first's: the rerun trained those batches twice)."""
    launcher, args = LAUNCHERS["single"], ("--batch-norm",)
    a = never_stopped(kept_runs, launcher, "keras3", "numpy", args)
    wheres = []
    for stop_at in ("2:2", "2:4"):
        stopped = train(launcher, tmp_path / "b", tmp_path / "state-b", "keras3", args=args, STOP_AT=stop_at,
                        DISTRAIN_STOP_CHECK_SECONDS="0")
        assert stopped.returncode == 75, stopped.stdout[-3000:]
        wheres.append(re.search(r"rerun to resume at epoch 2, step (\d+)", stopped.stdout))
        assert wheres[-1], stopped.stdout[-3000:]
    assert int(wheres[0][1]) < int(wheres[1][1])
    assert train(launcher, tmp_path / "b", tmp_path / "state-b", "keras3", args=args).returncode == 0
    assert trained_ids(tmp_path / "b") == trained_ids(a)
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))


@pytest.mark.parametrize(("family", "data", "stop", "where"), [
    ("keras3", "numpy", {"STOP_AT": "2:6", "DISTRAIN_STOP_CHECK_SECONDS": "0"}, "the start of epoch 3"),
    # written in place: a crash a step after a checkpoint written in the background could come before its end
    ("legacy", "numpy", {"CRASH_AT": "3:2", "DISTRAIN_CHECKPOINT_EVERY": "7", "DISTRAIN_CHECKPOINT_ASYNC": "0"},
     "the start of epoch 3"),
    ("keras3", "tfrecord", {"CRASH_AT": "3:2", "DISTRAIN_CHECKPOINT_EVERY": "7", "DISTRAIN_CHECKPOINT_ASYNC": "0"},
     "the start of epoch 3"),
    ("legacy", "numpy", {"STOP_AT": "3:6", "DISTRAIN_STOP_CHECK_SECONDS": "0"}, "the start of epoch 4")],
    ids=["stop-keras3", "timed-checkpoint-then-crash-legacy", "timed-checkpoint-unknown-length-keras3",
         "stop-at-the-fits-end-legacy"])
def test_a_checkpoint_at_an_epochs_last_step_keeps_that_epochs_end(tmp_path, kept_runs, family, data, stop, where):
    """A stop agreed at an epoch's last step (the signal comes one step before: the check after the next step
    finds it), or a DISTRAIN_CHECKPOINT_EVERY checkpoint falling there (7 steps an epoch), waits for that epoch's
    end: the script's ReduceLROnPlateau lowers the learning rate there, and the run resumed at the next epoch's
    start ends with the weights of the run never stopped (a checkpoint written before the epoch's end resumes
    without it: weights 0.036 apart). An epoch of unknown length (TFRecord shards) too, once its first epoch has
    learnt the length (a checkpoint taken at the step itself would resume at "epoch 2, step 8").
    Stopped at the last epoch's last step, the rerun has nothing left to train and finishes (where a rerun of
    nothing to train could make tf_keras fail with `Empty logs`)."""
    launcher, args = LAUNCHERS["single"], ("--reduce-lr-on-plateau",)
    a = never_stopped(kept_runs, launcher, family, data, args=args)
    interrupted = train(launcher, tmp_path / "b", tmp_path / "state-b", family, data, args=args, **stop)
    assert interrupted.returncode != 0, interrupted.stdout[-3000:]
    if "STOP_AT" in stop:
        assert f"rerun to resume at {where}" in interrupted.stdout, interrupted.stdout[-3000:]
    resumed = train(launcher, tmp_path / "b", tmp_path / "state-b", family, data, args=args,
                    **{k: v for k, v in stop.items() if k == "DISTRAIN_CHECKPOINT_EVERY"})
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"at {where} (" in resumed.stdout, resumed.stdout[-3000:]
    assert np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))


def saved_counters(state: Path) -> dict[str, int]:
    """The epoch and batch (0-based) tf_keras' BackupAndRestore keeps in the newest checkpoint of the run."""
    import tensorflow as tf

    (run_dir,) = state.glob("runs/*")
    reader = tf.train.load_checkpoint(newest_checkpoint(str(run_dir / "chief")))
    return {name: int(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))
            for name in ("ckpt_saved_epoch", "ckpt_saved_batch")}


def test_a_negative_control_tells_a_different_order_apart(tmp_path, kept_runs):
    """The comparison can fail: the same run without distrain's checkpoints resumes nothing and retrains, every
    batch of the stopped part trained twice. (Its weights are the run never stopped's: the seeded script, run
    again from the start, trains the same batches in the same order, as plain python would.)"""
    a = never_stopped(kept_runs, LAUNCHERS["single"], "keras3")
    stopped = train(LAUNCHERS["single"], tmp_path / "b", tmp_path / "state-b", "keras3", STOP_AT="2:3",
                    DISTRAIN_STOP_CHECK_SECONDS="0", DISTRAIN_CHECKPOINT="0")
    assert stopped.returncode == 75, stopped.stdout[-3000:]
    train(LAUNCHERS["single"], tmp_path / "b", tmp_path / "state-b", "keras3", DISTRAIN_CHECKPOINT="0")
    (reference,), (retrained,) = trained_ids(a).values(), trained_ids(tmp_path / "b").values()
    assert retrained != reference and retrained[len(retrained) - len(reference):] == reference
    assert len(retrained) > len(reference) + 8  # epoch 1 and the first steps of epoch 2 trained twice


def test_zero_code_horovod_without_checkpoints_trains_plain_kerass_numpy_orders(tmp_path):
    """Horovod's shares of numpy input come from the positioned pipeline with checkpoints off too
    (DISTRAIN_CHECKPOINT=0), which draws tf_keras' own orders of the seeded script: each global batch, rank 0's
    share then rank 1's, is plain python's batch (before, distrain's own reshuffle drew other orders there)."""
    (tmp_path / "plain").mkdir()
    plain = run(["python", SCRIPT, "--input", "numpy", "--out", str(tmp_path / "plain")],
                env=clean_env(TF_USE_LEGACY_KERAS="1"))
    assert plain.returncode == 0, plain.stdout[-3000:]
    out = train(LAUNCHERS["horovod"], tmp_path / "a", tmp_path / "state", "legacy", DISTRAIN_CHECKPOINT="0")
    assert out.returncode == 0, out.stdout[-3000:]
    (want,), ranks = trained_ids(tmp_path / "plain").values(), trained_ids(tmp_path / "a")
    assert [" ".join(shares) for shares in zip(ranks["ids-rank0.txt"], ranks["ids-rank1.txt"])] == want


def test_the_scripts_own_backup_under_horovod_resumes_as_plain_python_resumes_it(tmp_path):
    """The script's own BackupAndRestore (distrain's checkpoints stand aside): stopped mid-epoch under Horovod x2 and
    rerun, the run ends with the weights plain python ends with, stopped at the same step and rerun (both resume at
    the interrupted epoch's start, from the backup the chief alone wrote)."""
    ends = {}
    for name, launcher in (("plain", ["python"]), ("horovod", LAUNCHERS["horovod"])):
        for attempt, stop in enumerate(({"STOP_AT": "2:3", "DISTRAIN_STOP_CHECK_SECONDS": "0"}, {})):
            out = train(launcher, tmp_path / name, tmp_path / f"state-{name}", "keras3", "tfdata",
                        args=("--own-backup",), **stop)
            assert out.returncode == ((-15 if name == "plain" else 75) if attempt == 0 else 0), out.stdout[-3000:]
        ends[name] = np.load(tmp_path / name / "weights.npy")
    np.testing.assert_allclose(ends["horovod"], ends["plain"], rtol=1e-5)


@pytest.mark.parametrize(("before", "after"), [("mwm", "single"), ("single", "mwm")])
def test_a_run_resumes_on_another_number_of_workers(tmp_path, kept_runs, before, after):
    """Stopped on 2 workers and resumed on 1 (or the reverse): the same global batches go on from the same step,
    every sample once per epoch, and the weights are those of the run never stopped within floating-point
    reduction order (the gradient of a global batch is the same mean however many replicas share it)."""
    a = never_stopped(kept_runs, LAUNCHERS[before], "keras3")
    stopped = train(LAUNCHERS[before], tmp_path / "b", tmp_path / "state", "keras3", STOP_AT="2:3",
                    DISTRAIN_STOP_CHECK_SECONDS="0")
    where = re.search(r"stopped on SIGTERM after saving a checkpoint; rerun to resume at epoch (\d+), step (\d+)",
                      stopped.stdout)
    assert where, stopped.stdout[-3000:]
    resumed = train(LAUNCHERS[after], tmp_path / "b", tmp_path / "state", "keras3")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"at epoch {where[1]}, step {where[2]} (" in resumed.stdout, resumed.stdout[-3000:]
    assert every_sample(trained_ids(tmp_path / "b")) == sorted(list(range(100)) * 3)
    through, resumed = np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy")
    assert np.allclose(through, resumed, rtol=1e-4, atol=1e-5), abs(through - resumed).max()


@pytest.mark.core
@pytest.mark.parametrize(("data", "family"), [("tfdata", "keras3"), ("tfdata", "legacy"), ("numpy", "legacy"),
                                            ("pydataset", "keras3")])
def test_distrain_trains_the_orders_plain_keras_trains(tmp_path, data, family):
    """What positions the data changes nothing of the script's meaning: the batches and their order per epoch are
    those of the same script run by plain Python (seeded, so they are known). Each iterator Keras makes of a
    tf.data dataset draws an order, read or not: Keras 3.15 makes one more at each epoch's end (plain Keras trains
    orders 1, 3, 5), tf_keras one before the first epoch (2, 3, 4); distrain's pipeline makes the same unread ones
    (compat/epoch_iterators.py; without them: 1, 2, 3). numpy input with shuffle=True trains the permutations
    Keras' own array adapter draws from the script's seed (compat/numpy_orders.py): tf_keras a new one every
    epoch of a fit (Keras 3 the same one, proven by the conformance suite's numpy_shuffled); distrain's own order,
    drawn from one seed of its own, differs in every epoch."""
    (tmp_path / "plain").mkdir()
    plain = run(["python", SCRIPT, "--input", data, "--out", str(tmp_path / "plain")],
                env=clean_env(TF_USE_LEGACY_KERAS="1" if family == "legacy" else "0"))
    assert plain.returncode == 0, plain.stdout[-3000:]
    assert train(LAUNCHERS["single"], tmp_path / "a", tmp_path / "state", family, data).returncode == 0
    assert trained_ids(tmp_path / "a") == trained_ids(tmp_path / "plain")


# what a write in flight leaves in the chief's directory, and what makes the first checkpoint complete: Keras 3's
# temporary weights file (distrain renames it, then writes the record), tf_keras' CheckpointManager's temporary
# directory (TensorFlow merges it into ckpt-N.index and .data, then distrain writes the position)
WRITE_IN_FLIGHT = {"keras3": (".tmp-*.weights.h5", "ckpt-1.json", "ckpt-2.json"),
                   "legacy": ("ckpt-2_temp/*tempstate*", "ckpt-1.position", "ckpt-2.index")}


@pytest.mark.parametrize("family", KERAS_FAMILIES)
def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_whole(tmp_path, kept_runs, family):
    """SIGKILL (the OOM killer, a node's end) while the chief writes a checkpoint: a timed checkpoint every 3 steps of
    a 44 MB model (weights and Adam's state), the process group killed the moment the chief's temporary file of its
    second checkpoint appears, before it becomes a checkpoint. The first checkpoint is whole: the rerun resumes from
    it and ends with the weights of the run never stopped, bit for bit. (A kill that came after the write had ended
    proves nothing: tried again, up to 3 times.) Negative control, by hand: Keras 3's record written before its
    weights, the rerun fails on the second checkpoint."""
    launcher, wide = LAUNCHERS["single"], ("--wide", "370000")
    in_flight, first, second = WRITE_IN_FLIGHT[family]
    a = never_stopped(kept_runs, launcher, family, args=wide)
    for attempt in range(3):
        out, state = tmp_path / f"b{attempt}", tmp_path / f"state-b{attempt}"
        out.mkdir()
        proc = Watched([*launcher, SCRIPT, "--input", "numpy", "--out", str(out), *wide],
                       keras_env(family, DISTRAIN_OUTPUT_DIR=str(state), DISTRAIN_CHECKPOINT_EVERY="3"))
        writing = _a_write_in_flight(state, in_flight, first, proc, timeout=180)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        chief = next(state.glob("runs/*/chief"))
        if writing.exists() and not (chief / second).exists():  # killed mid-write
            break
    else:
        pytest.fail("in 3 runs every kill came after the write had ended")
    resumed = train(launcher, out, state, family, args=wide, DISTRAIN_CHECKPOINT_EVERY="3")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "at epoch 1, step 4 (" in resumed.stdout, resumed.stdout[-3000:]  # ckpt-1: after step 3
    assert np.array_equal(np.load(a / "weights.npy"), np.load(out / "weights.npy"))


def _a_write_in_flight(state: Path, in_flight: str, first: str, proc: Watched, timeout: float) -> Path:
    """Polled every millisecond: a file of the chief's second checkpoint being written, the first complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for chief in state.glob("runs/*/chief"):
            found = next(chief.glob(in_flight), None)
            if found is not None and (chief / first).exists():
                return found
        assert proc.proc.poll() is None, proc.output[-3000:]
        time.sleep(0.001)
    pytest.fail(f"no second checkpoint within {timeout:.0f} s: {proc.output[-3000:]}")


@pytest.mark.parametrize(("stop_at", "record"), [("2:5", "the previous one"), ("1:2", "none")])
def test_a_checkpoint_tensorflow_wrote_but_never_recorded_is_the_one_resumed(tmp_path, kept_runs, stop_at, record):
    """tf_keras: a kill after TensorFlow wrote ckpt-N (its index, after distrain's records) but before its
    CheckpointManager recorded it leaves the record naming N-1, or no record at all for a first checkpoint. Made here
    by stopping (exit 75: the stop's checkpoint N written) and putting the record back. The rerun resumes from N,
    where distrain's position is, and ends with the weights of the run never stopped. Negative control, by hand:
    without `_restore_the_newest` tf_keras restored N-1's weights (or none) under N's position: other weights."""
    launcher, family = LAUNCHERS["single"], "legacy"
    a = never_stopped(kept_runs, launcher, family)
    out, state = tmp_path / "b", tmp_path / "state-b"
    timed = {} if record == "none" else {"DISTRAIN_CHECKPOINT_EVERY": "3"}  # none: the stop's is the first
    stopped = train(launcher, out, state, family, STOP_AT=stop_at, DISTRAIN_STOP_CHECK_SECONDS="0", **timed)
    assert stopped.returncode == 75, stopped.stdout[-3000:]
    chief = next(state.glob("runs/*/chief"))
    numbers = sorted(int(p.name[len("ckpt-"):-len(".index")]) for p in chief.glob("ckpt-*.index"))
    if record == "none":
        assert numbers == [1]
        (chief / "checkpoint").unlink()
    else:
        assert len(numbers) == 2
        name = f"ckpt-{numbers[0]}"
        (chief / "checkpoint").write_text(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    resumed = train(launcher, out, state, family, **timed)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert np.array_equal(np.load(a / "weights.npy"), np.load(out / "weights.npy"))
