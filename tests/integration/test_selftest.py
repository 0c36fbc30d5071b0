"""`distrain selftest` fails with exit 1 when the ranks disagree. That it passes every mode this machine allows,
skipping the GPU rows with their reason, is proven where it runs anyway: the image's %test
(container/test_images.py::test_apptainer_plan_test_and_labels) and jobs/selftest.job (slurm/test_jobs.py)."""

import json

from helpers import DISTRAIN, clean_env, run


def rows_of(path) -> dict[str, dict]:
    return {row["check"]: row for row in json.loads(path.read_text())}


def test_selftest_fails_with_exit_1_when_the_ranks_disagree(tmp_path):
    """Negative control: with distrain's hooks off the workers train alone on their own data and end apart."""
    out = run([DISTRAIN, "selftest", "--json", str(tmp_path / "selftest.json")], env=clean_env(DISTRAIN_HOOKS="0"))
    assert out.returncode == 1, out.stdout[-3000:]
    rows = rows_of(tmp_path / "selftest.json")
    assert rows["MWM x2"]["status"] == "fail" and "different weights" in rows["MWM x2"]["detail"]
    assert "different weights" in rows["Horovod x2"]["detail"]  # both ranks ran: horovodrun --gloo, started here
    assert "verdict: FAIL (MWM x2, Horovod x2)" in out.stdout
