"""Which ends of a launch are faults a restart survives (entrypoint/restarts.py), and the limit."""

from entrypoint.launcher import Ended
from entrypoint.restarts import RunOfLaunch, fault

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
