"""A stuck rank is named in minutes: rank 1's input blocks forever at step 20; every rank prints its stacks,
names rank 1 and where it is stuck, and exits 4. Negative controls: slower, long pauses and long first steps
are not stalls."""

import re
import subprocess
import time

import pytest

from helpers import DISTRAIN, ROOT, assert_trained_in_sync, clean_env, run

SLOW = str(ROOT / "tests" / "integration" / "scripts" / "slow_steps.py")
STUCK = [SLOW, "--step-seconds", "0.05", "--epochs", "100", "--steps", "30", "--stuck-rank", "1", "--stuck-after",
         "20"]
NAMED = re.compile(r"distrain: error: stalled at epoch 1 step \d+: rank 1 \(node \S+\) is stuck in your code at "
                   r"slow_steps.py:\d+ in read_batch_from_a_share_that_hangs; nothing ended for \d+ s")


def assert_rank_1_named(output: str) -> None:
    """The last error line names rank 1 and the function it is stuck in; rank 1's stack shows it."""
    errors = [line for line in output.splitlines() if "distrain: error:" in line]
    assert errors and NAMED.search(errors[-1]), output[-4000:]
    assert re.search(r"\[1/2\]\s+File \".*slow_steps.py\", line \d+ in read_batch_from_a_share_that_hangs", output)


@pytest.mark.core
def test_a_stuck_mwm_rank_is_named_within_the_stall_floor_and_a_minute(tmp_path):
    """With the floor at 15 s (the default, 120 s, is the Plan's: unit/test_plan.py; the watchdog's clock against
    it: unit/test_stall_watchdog.py), the stall is named well within floor + start-up + a minute."""
    started = time.monotonic()
    out = run([DISTRAIN, "launch", "-n", "2", *STUCK], timeout=400,
              env=clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path), DISTRAIN_STALL_SECONDS="15",
                            DISTRAIN_MAX_RESTARTS="0"))  # a stall is retried once by default (restarts.py)
    took = time.monotonic() - started
    print(f"stall named after {took:.0f} s (DISTRAIN_STALL_SECONDS=15)")
    assert out.returncode == 4 and took < 15 + 120, out.stdout[-3000:]
    assert_rank_1_named(out.stdout)


def test_a_stuck_horovod_rank_is_named(tmp_path):
    out = run(["horovodrun", "-np", "2", "--gloo", DISTRAIN, "run", *STUCK], timeout=300,
              env=clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path), DISTRAIN_STALL_SECONDS="15"))
    assert out.returncode != 0, out.stdout[-3000:]
    assert NAMED.search(out.stdout) and "exit with status code 4" in out.stdout, out.stdout[-4000:]


def test_a_slower_rank_a_long_first_step_and_long_epoch_ends_are_not_stalls(tmp_path):
    """Negative controls, in one run, each pause 3x the floor: rank 1 twice as slow as rank 0 (every step is
    slower), a first step of 9 s (a slow compile) and a chief-only report of 9 s at every epoch's end."""
    out = run([DISTRAIN, "launch", "-n", "2", SLOW, "--epochs", "2", "--steps", "12", "--step-seconds", "0.3",
               "--slower-rank", "1", "--first-step-seconds", "9", "--chief-epoch-end-seconds", "9"],
              env=clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path), DISTRAIN_STALL_SECONDS="3"), timeout=400)
    assert out.returncode == 0 and "stalled" not in out.stdout, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=2)


def test_the_stall_floor_is_a_setting_checked_at_start():
    out = subprocess.run([DISTRAIN, "plan"], env=clean_env(DISTRAIN_STALL_SECONDS="soon"), capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and "DISTRAIN_STALL_SECONDS='soon' is not a number" in out.stderr
