"""A run's life: a stop within seconds, each command its own run, one process per run, a full disk survived,
and a launcher that always stops."""

import os
import re
import signal
import time
from pathlib import Path

import pytest

from helpers import DISTRAIN, KERAS_FAMILIES, ROOT, Watched, clean_env, keras_env, run, small_tmpfs

SLOW = str(ROOT / "tests" / "integration" / "scripts" / "slow_steps.py")


def start(cmd, env, **kwargs) -> Watched:
    return Watched(cmd, env, **kwargs)


def every_rank_in_its_first_step(seen: str, ranks: int = 2) -> bool:
    """Every rank of slow_steps.py has started reading its first batch: inside fit, past the start-up (a fixed
    sleep after the start is too short on a loaded machine)."""
    return all(f"rank {rank} reads its first batch" in seen for rank in range(ranks))


def gone(pgid: int) -> bool:
    """No process of this process group is left (zombies count as gone)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


@pytest.mark.core
def test_the_stop_check_takes_the_strategys_own_all_reduce_launcher():
    """StrategyEngine.sum_over_ranks (the stop check's sum) calls TensorFlow's private launcher layout eagerly (a
    third cheaper than the public way: benchmarks/run.py comm), and falls back to the public way where the layout
    changed: this fails the day a TensorFlow line changes it, instead of the stop check growing slower unseen."""
    code = ("import tensorflow as tf; from entrypoint.engines import strategy; "
            "launcher = strategy.one_device_launcher(tf.distribute.MultiWorkerMirroredStrategy()); "
            "print('SUM', launcher.all_reduce(tf.constant([1.0, 2.0])).numpy().tolist())")
    out = run(["python", "-c", code], env=clean_env(TF_CPP_MIN_LOG_LEVEL="2"))
    assert "SUM [1.0, 2.0]" in out.stdout, out.stdout[-3000:]


def test_a_signal_stops_two_workers_with_slow_steps_within_seconds(tmp_path):
    """(On TensorFlow 2.21 the stop's collective runs in test_exact_resume.py's `core` cases, with a check at
    every step.)"""
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path))
    proc = start([DISTRAIN, "launch", "-n", "2", SLOW, "--step-seconds", "0.6", "--epochs", "6", "--steps", "8"], env)
    proc.until(r"STEP epoch=2 step=3 ")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.rest()
    assert proc.wait(timeout=60) == 75, rest
    latency = time.monotonic() - sent
    print(f"stop latency, 0.6 s steps, 2 workers: {latency:.1f} s")
    assert latency < 10, rest
    assert rest.count("stopped on SIGTERM after saving a checkpoint") == 2, rest


def wake_ups(pid: int) -> int:
    """How often a process's main thread has gone to sleep and been woken (its voluntary context switches)."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.MULTILINE).group(1))


def test_the_launcher_sleeps_while_its_workers_train(tmp_path):
    """No polling: on a VM each wake-up costs CPU the workers could use (the launcher used to wake every second)."""
    proc = start([DISTRAIN, "launch", "-n", "2", SLOW, "--step-seconds", "0.3", "--epochs", "1", "--steps", "30"],
                 clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path)))
    proc.until(every_rank_in_its_first_step)
    before = wake_ups(proc.pid)
    time.sleep(4)
    woken = wake_ups(proc.pid) - before
    rest = proc.rest()
    assert proc.wait(timeout=120) == 0, rest
    assert woken <= 1, f"the launcher woke {woken} times in 4 s"


def test_the_workers_stay_in_the_launchers_session_each_leading_its_own_process_group(tmp_path):
    """A session each would put each worker in a scheduler autogroup of its own: workers sharing cores then preempt
    each other 2-3 times as often (#21). A group each: a stop reaches a worker's whole group, Ctrl-C only the
    launcher."""
    proc = start([DISTRAIN, "launch", "-n", "2", SLOW, "--step-seconds", "0.1", "--epochs", "1", "--steps", "20"],
                 clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path)))
    proc.until(every_rank_in_its_first_step)
    workers = [int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    sessions = {os.getsid(pid) for pid in workers}
    groups, launchers_session = [os.getpgid(pid) for pid in workers], os.getsid(proc.pid)
    rest = proc.rest()
    assert proc.wait(timeout=120) == 0, rest
    assert len(workers) == 2, workers
    assert sessions == {launchers_session}, f"workers in sessions {sessions}, the launcher in {launchers_session}"
    assert groups == workers, f"process groups {groups} for workers {workers}"


def test_each_command_is_its_own_run_and_the_same_command_resumes(tmp_path):
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path))
    first = ["examples/train.py", "--epochs", "40", "--lr", "0.01"]
    proc = start([DISTRAIN, "run", *first], env)
    head = proc.until(r"Epoch 3/")
    assert re.search(r"distrain: new run train-\w+ \(state in ", head), head
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    other = run([DISTRAIN, "run", "examples/train.py", "--epochs", "2", "--lr", "0.5"], env=env)
    assert other.returncode == 0, other.stdout[-3000:]
    assert "new run" in other.stdout and "resuming" not in other.stdout  # another experiment starts fresh
    assert re.search(r"Epoch 1/2", other.stdout)
    again = start([DISTRAIN, "run", *first], env)
    head = again.until(r"Epoch \d+/")
    assert re.search(r"resuming run train-\w+ at (the start of )?epoch [3-9](, step \d+)? ", head), head
    assert int(re.search(r"Epoch (\d+)/40", head).group(1)) >= 3
    # the same command a second time, while the first still runs: refused, not trained on twice at once
    twice = run([DISTRAIN, "run", *first], env=env)
    assert twice.returncode == 2 and re.search(r"error: this run's state in .* is in use by pid \d+", twice.stdout)
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=60) == 75
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "runs").iterdir()) == ["train", "train"]


@pytest.mark.parametrize("launcher", [[DISTRAIN, "run"], [DISTRAIN, "launch", "-n", "2"]], ids=["run", "mwm"])
def test_a_process_the_script_forks_in_fit_ends_on_sigterm_as_under_plain_python(tmp_path, launcher):
    """PyDataset's `use_multiprocessing` and multiprocessing Pools fork the worker; `terminate()` sends the child
    SIGTERM. The child inherited distrain's stop handler and lived on (the conformance launch hung in
    `py_dataset_multiprocessing` until its deadline); now it gets Python's defaults back when forked. A child
    terminated the moment it is forked (Keras 3.3's PyDataset, an epoch ending as the next begins) took the SIGTERM
    before its reset and dropped it: the stop signals are held around the fork. Under MWM a child forked from
    another thread printed a traceback (the default strategy's scope lost with the main thread's storage)."""
    out = run([*launcher, str(ROOT / "tests" / "integration" / "scripts" / "forks_in_fit.py")],
              env=keras_env("keras3", DISTRAIN_OUTPUT_DIR=str(tmp_path)), timeout=180)
    ranks = 2 if "launch" in launcher else 1
    assert out.returncode == 0 and out.stdout.count("child exit code -15") == ranks, out.stdout[-3000:]
    assert out.stdout.count("children terminated at once: 20 of 20 ended") == ranks, out.stdout[-3000:]
    assert "received SIGTERM" not in out.stdout and "Exception ignored" not in out.stdout, out.stdout[-3000:]


def test_distrain_resume_0_starts_over(tmp_path):
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path))
    proc = start([DISTRAIN, "run", "examples/train.py", "--epochs", "40"], env)
    proc.until(r"Epoch 3/")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    plan = run([DISTRAIN, "plan", "examples/train.py", "--epochs", "40"], env=env)
    assert re.search(r"resume: a checkpoint exists .* at epoch \d, step \d", plan.stdout), plan.stdout
    fresh = run([DISTRAIN, "run", "examples/train.py", "--epochs", "40"], env=clean_env(
        DISTRAIN_OUTPUT_DIR=str(tmp_path), DISTRAIN_RESUME="0"), timeout=300)
    assert fresh.returncode == 0 and "earlier state removed" in fresh.stdout and "Epoch 1/40" in fresh.stdout


@pytest.mark.parametrize("family", KERAS_FAMILIES)
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_training_goes_on(tmp_path, family):
    with small_tmpfs(tmp_path / "small", "700k") as disk:
        env = keras_env(family, DISTRAIN_CHECKPOINT_DIR=str(disk / "ckpt"))
        # a checkpoint is ~260 kB: one or two fit, then the disk is full
        cmd = [DISTRAIN, "run", SLOW, "--step-seconds", "0.2", "--epochs", "30", "--steps", "4", "--width", "250"]
        proc = start(cmd, env)
        head = proc.until(r"checkpoint not written")
        assert re.search(r"checkpoint not written \(No space left on device\): the previous one \(\S+ckpt-\d\) "
                         r"stays; training goes on", head), head
        proc.until(r"STEP epoch=\d+ step=2 ")  # it goes on
        proc.send_signal(signal.SIGTERM)
        rest = proc.rest()
        assert proc.wait(timeout=60) == 75, rest
        assert "the checkpoint could not be written (see above), so a rerun resumes from the previous one" in rest
        rerun = start(cmd, env)
        head = rerun.until(r"resumed from checkpoint")
        assert re.search(r"resuming run slow_steps-\w+ at the start of epoch [23]", head), head
        os.killpg(rerun.pid, signal.SIGKILL)
        rerun.wait()


def test_a_timed_checkpoint_survives_a_hard_kill(tmp_path):
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path), DISTRAIN_CHECKPOINT_MINUTES="0.05")  # every 3 s
    cmd = [DISTRAIN, "run", SLOW, "--step-seconds", "0.3", "--epochs", "3", "--steps", "40"]
    proc = start(cmd, env)
    head = proc.until(r"timed checkpoint")
    at = re.search(r"timed checkpoint \(every 0.05 min\): resumes at (epoch 1, step \d+)", head)  # mid-epoch
    assert at, head
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    rerun = start(cmd, env)
    head = rerun.until(r"run slow_steps")
    assert "resuming run slow_steps-" in head and f" at {at[1]} (" in head, head
    os.killpg(rerun.pid, signal.SIGKILL)
    rerun.wait()


def test_launch_kills_a_stuck_worker_after_the_kill_wait_and_leaves_nothing_behind(tmp_path):
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path), DISTRAIN_KILL_WAIT="10")
    # the first step blocks for 1000 s: the workers never reach a point where they could stop
    proc = start([DISTRAIN, "launch", "-n", "2", SLOW, "--step-seconds", "1000", "--epochs", "1"], env)
    head = proc.until(every_rank_in_its_first_step)
    assert every_rank_in_its_first_step(head), head
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.rest()
    code = proc.wait(timeout=60)
    assert time.monotonic() - sent < 20, rest
    assert code == 128 + signal.SIGTERM and "had not stopped 10 s after the stop (DISTRAIN_KILL_WAIT): killed" in rest
    time.sleep(1)
    assert gone(proc.pid)


def test_launch_second_ctrl_c_kills_at_once(tmp_path):
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path))
    proc = start([DISTRAIN, "launch", "-n", "2", SLOW, "--step-seconds", "1000", "--epochs", "1"], env)
    head = proc.until(every_rank_in_its_first_step)
    assert every_rank_in_its_first_step(head), head
    proc.send_signal(signal.SIGINT)
    time.sleep(1)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.rest()
    assert proc.wait(timeout=30) == 130, rest
    assert time.monotonic() - sent < 5 and "interrupted (a second Ctrl-C)" in rest
    time.sleep(1)
    assert gone(proc.pid)


@pytest.mark.core
def test_a_stop_while_distrain_starts_exits_75_at_once_with_one_line(tmp_path):
    """#67: SIGTERM 1 s after the start (distrain and TensorFlow loading) and 3 s after (TensorFlow's import, or
    the script's own set-up before its first fit: a whole run of examples/train.py takes 3 s on a quick machine):
    exit 75 within seconds and one line, where it was 143 and nothing. A job script requeues on 75
    (slurm/test_jobs.py)."""
    setup = tmp_path / "slow_setup.py"  # a script that loads its data for a minute before its first fit
    setup.write_text("import time\nimport tensorflow as tf\n\ntime.sleep(60)\n")
    for after, script in ((1.0, ROOT / "examples" / "train.py"), (3.0, setup)):
        proc = start([DISTRAIN, "run", str(script), "--epochs", "3"], clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path)))
        time.sleep(after)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out = proc.rest(timeout=60)
        assert proc.returncode == 75, out[-3000:]
        assert time.monotonic() - sent < 5, out[-3000:]
        assert re.search(r"distrain: stopped on SIGTERM (while starting, before any training|before the script's "
                         r"first fit): nothing was lost; the same command resumes", out), out[-3000:]
        assert "Traceback" not in out and "Epoch 1/" not in out, out[-3000:]


def test_a_scripts_own_except_exception_cannot_swallow_the_stop(tmp_path):
    """A script that wraps its training in `try: ... except Exception:` (slow_steps.py run inside one) still
    stops on SIGTERM with exit 75 after its checkpoint, and the code after its `except` does not run."""
    wrapper = tmp_path / "wrapped.py"
    wrapper.write_text("import runpy, sys\nsys.argv = sys.argv[1:]\ntry:\n"
                       "    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept Exception as exc:\n"
                       "    print('SWALLOWED', type(exc).__name__, flush=True)\nprint('AFTER', flush=True)\n")
    proc = start([DISTRAIN, "run", str(wrapper), SLOW, "--step-seconds", "0.2", "--epochs", "20"],
                 clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path / "out")))
    try:
        seen = proc.until(r"STEP epoch=1 step=2 ", timeout=120)
        proc.send_signal(signal.SIGTERM)
        rest = proc.rest(timeout=60)
    finally:
        proc.kill()
    out = seen + rest
    assert proc.returncode == 75, out[-3000:]
    assert "stopped on SIGTERM after saving a checkpoint" in out, out[-3000:]
    assert "SWALLOWED" not in out and "AFTER" not in out, out[-3000:]


def _processes_running(marker: str) -> list[int]:
    """The processes whose command line holds `marker` (a run's script path)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_sigterm_to_the_whole_group_with_data_worker_processes_ends_75_in_seconds_and_leaves_nothing(tmp_path):
    """scancel and a preemption signal the whole process group: a PyDataset's pool workers die at once, and the
    batch they were making never comes. Before #84 the run printed "will checkpoint" and hung on that batch (the
    stall watchdog blamed TensorFlow 30 min later), its pool workers lived on holding the run's lock, and a rerun
    was refused as "in use by pid N"."""
    script = str(ROOT / "tests" / "integration" / "scripts" / "slow_py_dataset.py")
    env = keras_env("keras3", DISTRAIN_OUTPUT_DIR=str(tmp_path))
    with Watched([DISTRAIN, "run", script], env) as proc:
        proc.until(r"Epoch 2/")
        time.sleep(3)  # mid-epoch: the workers are making batches
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 75, proc.output[-3000:]
        assert time.monotonic() - stopped < 30, proc.output[-3000:]
    deadline = time.monotonic() + 10
    while _processes_running(script) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_running(script), proc.output[-3000:]
    with Watched([DISTRAIN, "run", script], env) as again:
        again.until(r"Epoch \d+/30")
        assert "in use by" not in again.output and "resum" in again.output, again.output[-3000:]
