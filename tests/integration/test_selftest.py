"""`distrain selftest` fails with exit 1 when a mode does not compute what one process computes, even where its
ranks agree. That it passes every mode this machine allows, skipping the GPU rows with their reason, is proven
where it runs anyway: the image's %test (container/test_images.py::test_apptainer_plan_test_and_labels) and
jobs/selftest.job (slurm/test_jobs.py). Ranks that disagree, the work not split, a non-finite value and the GPU
rows' tolerances: unit/test_selftest_checks.py, on recorded results."""

import json

from helpers import DISTRAIN, clean_env, run


def rows_of(path) -> dict[str, dict]:
    return {row["check"]: row for row in json.loads(path.read_text())}


def test_selftest_fails_a_mode_whose_ranks_agree_on_wrong_numbers(tmp_path):
    """Negative control: DISTRAIN_SELFTEST_FAULT (read by the self-test's worker only) doubles rank 1's loss. The
    ranks stay in sync, so the sync rows pass; the comparison with the one-process run fails, naming the step and
    the variable, in MWM x2 and Horovod x2."""
    out = run([DISTRAIN, "selftest", "--json", str(tmp_path / "selftest.json")],
              env=clean_env(DISTRAIN_SELFTEST_FAULT="scale-rank-1"))
    assert out.returncode == 1, out.stdout[-3000:]
    rows = rows_of(tmp_path / "selftest.json")
    for mode in ("MWM x2", "Horovod x2"):
        assert rows[mode]["status"] == "pass" and "weights identical" in rows[mode]["detail"], rows[mode]
        arithmetic = rows[f"{mode} = one process"]
        assert arithmetic["status"] == "fail" and "step 1: " in arithmetic["detail"], arithmetic
        assert "kernel" in arithmetic["detail"] and "one process's weights" in arithmetic["detail"], arithmetic
    assert "verdict: FAIL (MWM x2 = one process, Horovod x2 = one process)" in out.stdout
