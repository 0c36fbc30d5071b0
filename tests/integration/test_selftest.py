"""`distrain selftest` proves every mode this machine allows, for real: single, MWM x2 and Horovod x2 train and
agree; GPU rows are skipped with their reason here; ranks that disagree fail it with exit 1."""

import json
import re

from helpers import DISTRAIN, clean_env, run


def rows_of(path) -> dict[str, dict]:
    return {row["check"]: row for row in json.loads(path.read_text())}


def test_selftest_passes_every_mode_here_and_skips_the_gpu_rows_with_reasons(tmp_path):
    out = run([DISTRAIN, "selftest", "--json", str(tmp_path / "selftest.json")])
    assert out.returncode == 0, out.stdout[-3000:]
    assert re.search(r"^verdict: PASS \(\d+ passed, \d+ skipped\)$", out.stdout, re.MULTILINE), out.stdout
    rows = rows_of(tmp_path / "selftest.json")
    assert set(rows["single"]) == {"check", "status", "detail", "seconds"}
    for check in ("single", "MWM x2", "Horovod x2"):
        assert rows[check]["status"] == "pass" and rows[check]["seconds"] > 0, rows[check]
    assert "weights identical" in rows["MWM x2"]["detail"] and "ring collectives" in rows["MWM x2"]["detail"]
    assert "Horovod with gloo" in rows["Horovod x2"]["detail"]
    for check in ("GPU: mixed float16", "GPU: XLA", "GPU pinning", "driver"):
        assert rows[check]["status"] == "skip" and rows[check]["detail"], rows[check]  # skipped, with the reason
    assert "pass" not in {rows[c]["status"] for c in rows if c.startswith("GPU")}


def test_selftest_fails_with_exit_1_when_the_ranks_disagree(tmp_path):
    """Negative control: with distrain's hooks off the workers train alone on their own data and end apart."""
    out = run([DISTRAIN, "selftest", "--json", str(tmp_path / "selftest.json")], env=clean_env(DISTRAIN_HOOKS="0"))
    assert out.returncode == 1, out.stdout[-3000:]
    rows = rows_of(tmp_path / "selftest.json")
    assert rows["MWM x2"]["status"] == "fail" and "different weights" in rows["MWM x2"]["detail"]
    assert "verdict: FAIL (MWM x2, Horovod x2)" in out.stdout
