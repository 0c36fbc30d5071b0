"""Every `fit` of a script is a stage of its run (entrypoint/fit/stages.py): a fine-tuning script as Keras' guide
writes it (tests/integration/scripts/fine_tune.py: the head with the base frozen, then everything with a lower
learning rate, EarlyStopping and ReduceLROnPlateau, then evaluate), stopped by SIGTERM in its second fit and run
again, passes through the first fit without training it, resumes the second exactly, and ends with the weights and
the evaluation of the run never stopped, every sample trained once per fit and epoch. Mode x Keras family,
pairwise (each mode once, each family in several modes; --full: the product)."""

import itertools
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import DISTRAIN, FULL_TIER, KERAS_FAMILIES, MPIRUN, ROOT, keras_env, run, run_once

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "fine_tune.py")
LAUNCHERS = {
    "single": [DISTRAIN, "run"],
    "mwm": [DISTRAIN, "launch", "-n", "2"],
    "horovod": [*MPIRUN, DISTRAIN, "run"],
}
PAIRWISE = [("single", "keras3"), ("mwm", "legacy"), ("horovod", "keras3")]
CORE = {("single", "keras3"), ("mwm", "legacy")}


def cases():
    for case in (itertools.product(LAUNCHERS, KERAS_FAMILIES) if FULL_TIER else PAIRWISE):
        yield pytest.param(*case, marks=[pytest.mark.core] if case in CORE else [], id="-".join(case))


def fine_tune(mode: str, family: str, out: Path, state: Path, args: tuple = (), **env: str):
    out.mkdir(exist_ok=True)
    return run([*LAUNCHERS[mode], SCRIPT, "--out", str(out), *args],
               env=keras_env(family, DISTRAIN_OUTPUT_DIR=str(state), **env))


def never_stopped(kept: Path, mode: str, family: str, args: tuple = ()) -> Path:
    """The script run through, never stopped, once a session for the tests that compare against it
    (helpers.run_once)."""
    return run_once(kept, ("fine_tune", mode, family, args),
                    lambda out, state: fine_tune(mode, family, out, state, args))


def trained_ids(out: Path) -> dict[str, list[str]]:
    """Each rank's trained batches in each fit, in order."""
    return {p.name: p.read_text().splitlines() for p in sorted(out.glob("ids-rank*-fit*.txt"))}


def stopped_then_rerun(mode: str, family: str, tmp_path: Path, stop_at: str, args: tuple = (),
                       between=lambda state: None) -> str:
    stopped = fine_tune(mode, family, tmp_path / "b", tmp_path / "state-b", args, STOP_AT=stop_at,
                        DISTRAIN_STOP_CHECK_SECONDS="0")
    assert stopped.returncode != 0 and "after saving a checkpoint" in stopped.stdout, stopped.stdout[-3000:]
    between(tmp_path / "state-b")
    rerun = fine_tune(mode, family, tmp_path / "b", tmp_path / "state-b", args)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    return rerun.stdout


def assert_the_same_run(a: Path, b: Path, first_fit_finished: bool = True) -> None:
    reference, stopped_and_rerun = trained_ids(a), trained_ids(b)
    assert len(reference) in (2, 4) and stopped_and_rerun == reference  # every batch once, in its fit and order
    assert np.array_equal(np.load(a / "weights.npy"), np.load(b / "weights.npy"))
    assert (a / "evaluation.txt").read_text() == (b / "evaluation.txt").read_text()
    if first_fit_finished:  # its recorded random state: what the script draws after it is what it drew before
        assert drawn_after_the_first_fit(a) == drawn_after_the_first_fit(b)


def drawn_after_the_first_fit(out: Path) -> dict[str, str]:
    """The Python and NumPy random numbers each rank drew after the first fit."""
    return {p.name: p.read_text() for p in sorted(out.glob("between-rank*.txt"))}


@pytest.mark.parametrize(("mode", "family"), list(cases()))
def test_a_fine_tuning_script_stopped_in_its_second_fit_resumes_there_exactly(tmp_path, kept_runs, mode, family):
    a = never_stopped(kept_runs, mode, family)
    rerun = stopped_then_rerun(mode, family, tmp_path, stop_at="2:2:2")
    assert re.search(r"resuming run fine_tune-\w+ at fit 2, epoch 2, step \d+ ", rerun), rerun[-3000:]
    assert "fit 1 finished in an earlier attempt: its end state is restored, not trained again" in rerun
    assert_the_same_run(a, tmp_path / "b")
    assert not list((tmp_path / "state-b").glob("runs/*/finished"))  # the script ended: a rerun trains again


# Keras 3 carries the resumed epoch on the model (Keras' own BackupAndRestore way), where a later fit would read it;
# tf_keras' is answered for the one fit (starting._tf_keras_starting_at) and its second fit is the MWM case above
@pytest.mark.parametrize("family", KERAS_FAMILIES if FULL_TIER else ["keras3"])
def test_a_stop_in_the_first_fit_resumes_there(tmp_path, kept_runs, family):
    a = never_stopped(kept_runs, "single", family)
    rerun = stopped_then_rerun("single", family, tmp_path, stop_at="1:2:2")
    assert re.search(r"resuming run fine_tune-\w+ at epoch 2, step \d+ ", rerun), rerun[-3000:]
    # the global random state within an interrupted fit is not kept with its checkpoints (README): the numbers
    # its callback drew before the stop are drawn anew
    assert_the_same_run(a, tmp_path / "b", first_fit_finished=False)


def test_a_finished_fit_forgotten_is_trained_again_negative_control(tmp_path, kept_runs):
    """The first fit's record removed before the rerun: it trains again (its batches twice in all), which the
    comparison above would catch."""
    a = never_stopped(kept_runs, "single", "keras3")

    def forget_the_first_fit(state: Path) -> None:
        (finished,) = state.glob("runs/*/finished")
        shutil.rmtree(finished)

    stopped_then_rerun("single", "keras3", tmp_path, stop_at="2:2:2", between=forget_the_first_fit)
    reference, rerun = trained_ids(a), trained_ids(tmp_path / "b")
    assert rerun["ids-rank0-fit1.txt"] == reference["ids-rank0-fit1.txt"] * 2
    assert rerun["ids-rank0-fit2.txt"] == reference["ids-rank0-fit2.txt"]


def test_a_skipped_fit_without_its_random_state_draws_other_numbers_negative_control(tmp_path, kept_runs):
    """The first fit's random state left out of its record: the numbers the script draws after it differ."""
    a = never_stopped(kept_runs, "single", "keras3")

    def forget_the_random_state(state: Path) -> None:
        (kept,) = state.glob("runs/*/finished/random-rank0.pkl")
        kept.unlink()

    stopped_then_rerun("single", "keras3", tmp_path, stop_at="2:2:2", between=forget_the_random_state)
    assert drawn_after_the_first_fit(a) != drawn_after_the_first_fit(tmp_path / "b")


@pytest.mark.parametrize(("mode", "family"), [("single", "keras3"), ("mwm", "legacy")],
                         ids=["single-keras3", "mwm-legacy"])
def test_callbacks_whose_patience_runs_out_right_after_the_stop_decide_as_in_the_run_never_stopped(tmp_path, kept_runs,
                                                                                                     mode, family):
    """--plateau: the second fit's loss never improves by min_delta=10, so ReduceLROnPlateau halves the learning
    rate at every epoch end but the first and EarlyStopping (patience 2) stops after epoch 3. Stopped in epoch 3,
    the rerun goes on with their counters (callback_state.py): it stops after epoch 3 too, with the same weights."""
    a = never_stopped(kept_runs, mode, family, ("--plateau",))
    assert (a / "last-epoch.txt").read_text() == "3"
    stopped_then_rerun(mode, family, tmp_path, stop_at="2:3:2", args=("--plateau",))
    assert (tmp_path / "b" / "last-epoch.txt").read_text() == "3"
    assert_the_same_run(a, tmp_path / "b")


def test_callbacks_started_afresh_decide_otherwise_negative_control(tmp_path, kept_runs):
    """The callbacks' counters removed before the rerun: EarlyStopping waits from scratch and stops two epochs
    later, with other weights."""
    a = never_stopped(kept_runs, "single", "legacy", ("--plateau",))

    def forget_the_callbacks(state: Path) -> None:
        kept = list(state.glob("runs/*/fit-2/chief/ckpt-*.callbacks"))
        assert kept  # beside every checkpoint of the second fit
        for path in kept:
            path.unlink()

    stopped_then_rerun("single", "legacy", tmp_path, stop_at="2:3:2", args=("--plateau",),
                       between=forget_the_callbacks)
    assert (tmp_path / "b" / "last-epoch.txt").read_text() == "5"
    assert not np.array_equal(np.load(a / "weights.npy"), np.load(tmp_path / "b" / "weights.npy"))
