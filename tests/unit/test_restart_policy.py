"""Which ends of a launch or a Slurm step are faults a restart survives (entrypoint/restarts.py), from what each
worker recorded of its end (entrypoint/endings.py), and the limit."""

import json
import os

from entrypoint import endings
from entrypoint.restarts import COUNT_FILE, Ended, RunOfLaunch, fault, step_ended

WORKERS = ("localhost:1", "localhost:2")


def test_only_a_killed_worker_or_a_lost_peer_is_a_fault():
    assert fault(Ended(4, 1, -9, WORKERS), stalled=False) == \
        "worker 1 (localhost:2) was killed by SIGKILL (out of memory?)"
    assert fault(Ended(4, 0, -11, WORKERS), stalled=False) == "worker 0 (localhost:1) was killed by SIGSEGV"
    assert fault(Ended(4, 0, 4, WORKERS), stalled=False) == "worker 0 (localhost:1) lost a peer"
    assert fault(Ended(4, 0, 4, WORKERS), stalled=True).startswith("a rank stalled")
    for code in (1, 2, 3, 75, 17):  # the script's error or code, bad input, no GPU, a stop
        assert fault(Ended(code, 0, code, WORKERS), stalled=False) is None
    assert fault(Ended(4, 1, -15, WORKERS, stopped=True), stalled=False) is None  # the user's own stop
    assert fault(Ended(0), stalled=False) is None


def test_restarts_stop_at_the_limit_and_a_stall_is_retried_once(tmp_path):
    run = RunOfLaunch(max_restarts=2, state_dir=str(tmp_path))
    killed = Ended(4, 1, -9, WORKERS)
    assert run.restart_reason(killed).endswith("restart 1 of 2 from the start (no checkpoint yet)")
    assert "restart 2 of 2" in run.restart_reason(killed)
    assert run.restart_reason(killed) is None
    assert run.summary(4).startswith("gave up after 2 restart(s) (DISTRAIN_MAX_RESTARTS=2): worker 1")
    stalled = RunOfLaunch(max_restarts=3, state_dir=str(tmp_path))
    (tmp_path / "stall").mkdir()
    (tmp_path / "stall" / "rank1.json").write_text("{}")
    assert "restart 1 of 3" in stalled.restart_reason(Ended(4, 0, 4, WORKERS))
    assert stalled.restart_reason(Ended(4, 0, 4, WORKERS)) is None
    assert RunOfLaunch(max_restarts=0, state_dir=None).restart_reason(killed) is None


def record(state, rank: int, code: int | None = None, host: str = "n9") -> None:
    endings.started(str(state), rank, 2)
    path = state / "workers" / f"rank{rank}.json"
    data = {**json.loads(path.read_text()), "host": host}
    if code is not None:
        data.update(code=code, kind=endings.KINDS_BY_CODE.get(code, "script error"))
    path.write_text(json.dumps(data))


def test_a_slurm_steps_end_is_read_from_what_its_workers_recorded(tmp_path):
    record(tmp_path, 0, 4, "n9")
    record(tmp_path, 1, None, "n10")  # SIGKILLed: never said how it ended
    ended = step_ended(endings.read(str(tmp_path)), 2, 137)  # srun: 128 + SIGKILL
    assert fault(ended, stalled=False) == "worker 1 (n10) was killed by SIGKILL (out of memory?)"
    assert fault(step_ended(endings.read(str(tmp_path)), 2, 4), False) == \
        "worker 1 (n10) ended without a word (killed, or its node was lost)"
    record(tmp_path, 0, None, "n9")  # Slurm's KillWait ended the survivor before it could say it lost a peer
    assert fault(step_ended(endings.read(str(tmp_path)), 2, 137, killed_first=1), False) == \
        "worker 1 (n10) was killed by SIGKILL (out of memory?)"  # the task srun reported killed first
    assert step_ended(endings.read(str(tmp_path)), 2, 137).rank == 0  # without srun's word: the lowest rank
    record(tmp_path, 0, 4, "n9")
    record(tmp_path, 1, 1, "n10")  # the script's own error on one rank, a lost peer on the other: not a fault
    assert step_ended(endings.read(str(tmp_path)), 2, 4) == Ended(1, 1, 1, ("n9", "n10"))
    assert fault(step_ended(endings.read(str(tmp_path)), 2, 4), False) is None
    record(tmp_path, 1, 75, "n10")
    record(tmp_path, 0, 75, "n9")
    assert step_ended(endings.read(str(tmp_path)), 2, 75).stopped
    assert not step_ended({}, 2, 1).started  # no worker started: the step could not get its nodes
    assert endings.read(str(tmp_path), since=2e9 + 1) == {}  # records older than the step are another step's


def test_a_worker_completes_only_its_own_record(tmp_path):
    endings.started(str(tmp_path), 0, 1)
    endings.ended(str(tmp_path), 0, 1, "ValueError: bad")
    assert endings.read(str(tmp_path))[0]["kind"] == "script error"
    path = tmp_path / "workers" / "rank0.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": os.getpid() + 1, "code": None}))
    endings.ended(str(tmp_path), 0, 0)  # a later start's record (another pid): left as it is
    assert endings.read(str(tmp_path))[0]["code"] is None


def test_a_jobs_restarts_are_counted_in_the_runs_state_across_its_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRAIN_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("DISTRAIN_MAX_RESTARTS", "1")
    script = str(tmp_path / "train.py")
    first = RunOfLaunch.detect(script, [], session="job 7.0")
    assert "restart 1 of 1" in first.restart_reason(Ended(4, 1, -9, WORKERS))
    second = RunOfLaunch.detect(script, [], session="job 7.0")  # the job's next step ended in a fault again
    assert second.count == 1 and second.restart_reason(Ended(4, 1, -9, WORKERS)) is None
    requeued = RunOfLaunch.detect(script, [], session="job 7.1")  # requeued: a new allocation, a new count
    assert requeued.count == 0
    assert json.loads((tmp_path / COUNT_FILE).read_text())["total"] == 1


def test_a_step_none_of_whose_workers_started_asks_the_job_script_for_a_requeue(tmp_path):
    """jobs/lib.sh's question after a failed step (distrain restart-check): nothing recorded since the step began
    (its nodes could not start it) answers 10, which requeues the job."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "DISTRAIN_CHECKPOINT_DIR": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}
    answer = subprocess.run([sys.executable, "-m", "entrypoint", "restart-check", "--code", "1", "--since",
                             str(time.time()), str(tmp_path / "train.py")], env=env, capture_output=True, text=True,
                            timeout=300)
    assert answer.returncode == 10 and "no worker of the step started" in answer.stdout, answer.stdout + answer.stderr
