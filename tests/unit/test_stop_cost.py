"""What a stop costs (entrypoint/fit/stop_cost.py) against the job's signal lead: the job files declare the lead
they give, the run measures its epoch ends and checkpoints and warns once when a stop needs more."""

import re
import time
from pathlib import Path

import pytest

from entrypoint.fit import stop_cost
from entrypoint.plan import detect
from entrypoint.runs_view import describe_stop_cost

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.mark.parametrize("job", sorted(p.name for p in JOBS.glob("*.job") if "--signal" in p.read_text()))
def test_each_job_declares_the_signal_lead_its_header_gives(job):
    text = (JOBS / job).read_text()
    signal = re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", text, re.M)
    declared = re.search(r"^STOP_LEAD=(\d+) ", text, re.M)
    assert signal and declared and signal.group(1) == declared.group(1), job


def test_the_lead_is_a_checked_setting():
    assert detect({"DISTRAIN_STOP_LEAD": "120"}).stop_lead_seconds == 120.0
    assert detect({"DISTRAIN_STOP_LEAD": ""}).stop_lead_seconds is None
    with pytest.raises(Exception, match="DISTRAIN_STOP_LEAD='soon' is not a number"):
        detect({"DISTRAIN_STOP_LEAD": "soon"})


def test_an_epoch_end_longer_than_the_lead_warns_once_and_is_kept_for_the_runs_listing(tmp_path):
    warned = []
    cost = stop_cost.StopCost(str(tmp_path), lead=1.0, agree_seconds=0.5, warn=warned.append)
    cost.step_ended()
    cost.wrote(0.2)
    cost.epoch_ended()  # 0.5 s agreeing + a quick epoch end: within the lead
    assert warned == [] and stop_cost.read(str(tmp_path))["checkpoint_seconds"] == 0.2
    for _ in range(2):
        cost.step_ended()
        time.sleep(0.6)  # validation, a callback, the checkpoint
        cost.epoch_ended()
    assert len(warned) == 1 and "more than the 1 s the job's signal gives" in warned[0], warned
    kept = stop_cost.read(str(tmp_path))
    assert kept["epoch_end_seconds"] >= 0.6 and kept["lead_seconds"] == 1.0
    assert describe_stop_cost(kept).startswith("an epoch's end up to 0.6 s"), describe_stop_cost(kept)
    again = stop_cost.StopCost(str(tmp_path), lead=None, agree_seconds=0.5, warn=warned.append)
    assert again.known["epoch_end_seconds"] == kept["epoch_end_seconds"]  # a resumed attempt knows the run's cost
    assert describe_stop_cost({}) == "not measured yet (after its first epoch)"


def test_each_checkpoint_write_is_recorded_and_shown_with_the_first_apart(tmp_path):
    cost = stop_cost.StopCost(str(tmp_path), lead=None, agree_seconds=0.5, warn=print)
    for seconds in (0.9, 0.2, 0.3, 0.25):  # the first carries Keras' save warm-up
        cost.wrote(seconds)
    kept = stop_cost.read(str(tmp_path))
    assert kept["checkpoint_writes"] == [0.9, 0.2, 0.3, 0.25] and kept["checkpoint_seconds"] == 0.9
    assert "(a write 0.25 s, the first 0.90 s with Keras' warm-up)" in describe_stop_cost(kept)
