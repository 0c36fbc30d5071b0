"""The job scripts in jobs/, submitted with sbatch to a real local Slurm (venv mode: USE_CONTAINER=0)."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np

from helpers import DISTRAIN, ROOT, assert_trained_in_sync, clean_env, run
from slurm_jobs import cancel, submit, wait_for_text, wait_gone

SMALL = ["--cpus-per-task=1", "--time=10"]


def ranks_and_devices(log: str) -> dict[int, str]:
    """rank -> device, from each rank's start line."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"rank (\d+) of \d+ on \S+: local rank \d+, (.+)", log)}


def test_single_job(slurm, tmp_path):
    job = submit(slurm, tmp_path, "single", [*SMALL, "--gres=gpu:1"], ["--epochs", "2"])
    assert job.code == 0, job
    assert "single on 1 worker(s)" in job.log and "plan | mode" in job.log
    assert ranks_and_devices(job.log) == {0: "GPU 0"}
    assert_trained_in_sync(job.log, workers=1)


def test_mirrored_job_uses_all_gpus_of_the_node(slurm, tmp_path):
    job = submit(slurm, tmp_path, "mirrored", ["--cpus-per-task=2", "--time=10", "--gres=gpu:2"], ["--epochs", "2"])
    assert job.code == 0, job
    assert re.search(r"plan \| devices\s+0,1", job.log), job
    assert_trained_in_sync(job.log, workers=1)


def test_mwm_two_nodes_two_tasks_each_one_gpu_per_task(slurm, tmp_path):
    job = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=2", "--ntasks-per-node=2", "--gpus-per-task=1"],
                 ["--epochs", "2"])
    assert job.code == 0, job
    assert "mwm on 4 worker(s)" in job.log
    # --gpus-per-task=1: Slurm gives each task its own GPU; local ranks 0,1 on each node
    assert ranks_and_devices(job.log) == {0: "GPU 0", 1: "GPU 1", 2: "GPU 0", 3: "GPU 1"}
    # n9 before n10 (numeric, Slurm's order), one port per rank
    cluster = re.search(r"plan \| cluster\s+(.+?)\s{2}", job.log).group(1).split()
    assert [c.split(":")[0] for c in cluster] == ["n9", "n9", "n10", "n10"]
    assert len({c.split(":")[1] for c in cluster}) == 4
    assert_trained_in_sync(job.log, workers=4)


def test_horovod_job_through_srun_pmix(slurm, tmp_path):
    job = submit(slurm, tmp_path, "horovod", [*SMALL, "--nodes=2", "--ntasks-per-node=2", "--gpus-per-task=1"],
                 ["--epochs", "2"])
    assert job.code == 0, job
    assert "horovod on 4 worker(s)" in job.log and ": srun --kill-on-bad-exit=1 --mpi=pmix " in job.log, job.log[-3000:]
    assert set(ranks_and_devices(job.log)) == {0, 1, 2, 3}
    assert_trained_in_sync(job.log, workers=4)


def test_two_mwm_jobs_share_a_node_without_port_collisions(slurm, tmp_path):
    args = [*SMALL, "--nodes=1", "--ntasks-per-node=2", "--nodelist=n9", "--gres=gpu:2"]
    # two runs (another job name: another run; the same command twice at once would be refused)
    first = submit(slurm, tmp_path, "mwm", [*args, "--job-name=first"], ["--epochs", "3"], wait=False)
    second = submit(slurm, tmp_path, "mwm", [*args, "--job-name=second"], ["--epochs", "3"], wait=False)
    for job_id in (first, second):
        wait_gone(slurm, job_id)
    for job_id in (first, second):
        log = (tmp_path / f"mwm-{job_id}.out").read_text(errors="replace")
        assert_trained_in_sync(log, workers=2)


EXACT = str(ROOT / "tests" / "integration" / "scripts" / "exact_resume.py")
TWO_NODES = [*SMALL, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"]


def test_a_killed_task_is_restarted_in_the_allocation_and_the_job_ends_as_if_never_killed(slurm, tmp_path):
    """Worker 1 SIGKILLs itself mid-epoch after a checkpoint (as the OOM killer would): the survivor names it and
    exits 4, lib.sh reads why each worker ended, runs the step again from the checkpoint, and the job completes
    with the weights of a run never interrupted (the same script under `distrain launch -n 2`)."""
    never = tmp_path / "never-killed"
    never.mkdir()
    reference = run([DISTRAIN, "launch", "-n", "2", EXACT, "--out", str(never)],
                    env=clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path / "launch-state"), DISTRAIN_CHECKPOINT_EVERY="3"))
    assert reference.returncode == 0, reference.stdout[-3000:]
    out = tmp_path / "killed"
    out.mkdir()
    job = submit(slurm, tmp_path, "mwm", TWO_NODES, [EXACT, "--out", str(out)], KILL_AT="2:5",
                 DISTRAIN_CHECKPOINT_EVERY="3")
    assert job.code == 0, job
    assert (out / "killed").exists()
    # the survivor names the lost worker, with no traceback (a lost peer is not a script error); on a loaded machine
    # Slurm's KillWait (10 s here, 30 by default) may end it before TensorFlow's heartbeat timeout says who was lost
    survivor_errors = re.findall(r"\[0/2\] distrain: error: (.*)", job.log)
    assert all(re.match(r"lost worker 1 \(n10:\d+\)", line) for line in survivor_errors), job
    assert "Traceback" not in job.log, job
    assert re.search(r"distrain job: worker 1 \(n10\) was killed by SIGKILL \(out of memory\?\); restart 1 of 3 "
                     r"from the checkpoint at epoch 2, step \d", job.log), job
    assert "resumed from checkpoint" in job.log and "distrain job: finished after 1 restart(s)" in job.log, job
    assert np.array_equal(np.load(never / "weights.npy"), np.load(out / "weights.npy"))
    listed = json.loads(run([DISTRAIN, "runs", "--json", "--dir", str(tmp_path / "output")], env=clean_env()).stdout)
    assert [(v["state"][:8], v["restarts"], v["job"]) for v in listed] == [("finished", 1, job.id)], listed


def test_a_horovod_step_whose_task_was_killed_is_restarted_and_completes(slurm, tmp_path):
    """The same under srun --mpi=pmix: Slurm kills the survivor too (Open MPI does not let it end by itself), so
    neither worker says how it ended; lib.sh names the task srun reported killed first, restarts the step, once,
    and it resumes. (Bit-identical
    resumes under Horovod: integration/test_exact_resume.py.)"""
    out = tmp_path / "killed"
    out.mkdir()
    job = submit(slurm, tmp_path, "horovod", TWO_NODES, [EXACT, "--out", str(out)], KILL_AT="2:5",
                 DISTRAIN_CHECKPOINT_EVERY="3")
    assert job.code == 0, job
    # srun reports task 1 killed first, then task 0 (its KillWait): the first is named
    assert re.search(r"distrain job: worker 1 \(n10\) was killed by SIGKILL \(out of memory\?\); restart 1 of 3 ",
                     job.log), job
    assert "resumed from checkpoint" in job.log and (out / "weights.npy").exists(), job


def test_missing_image_fails_in_seconds_with_the_reason_in_the_log(slurm, tmp_path):
    """The image named by the site's defaults (jobs/site.sh, here DISTRAIN_SITE) is missing: exit 2 before srun."""
    site = tmp_path / "site.sh"
    site.write_text((ROOT / "jobs" / "site.sh.example").read_text().replace("/apps/distrain/", "/nonexistent/"))
    started = time.monotonic()
    job = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"],
                 USE_CONTAINER="1", DISTRAIN_SITE=str(site))
    assert job.code == 2, job
    assert "image /nonexistent/distrain.sif not found" in job.log
    assert time.monotonic() - started < 30


def test_gpus_per_node_must_split_evenly_among_tasks(slurm, tmp_path):
    # a user edits the header to --gres=gpu:3 (instead of --gpus-per-task=1) but keeps 2 tasks per node
    edited = tmp_path / "mwm.job"
    edited.write_text((ROOT / "jobs" / "mwm.job").read_text().replace("--gpus-per-task=1", "--gres=gpu:3"))
    job = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=1", "--ntasks-per-node=2"], script=edited)
    assert job.code == 2, job
    assert "2 tasks per node but 3 GPUs per node: the GPUs must split evenly" in job.log


def test_one_mwm_task_per_node_takes_all_its_gpus(slurm, tmp_path):
    """TensorFlow's own multi-worker layout: each worker mirrors over its node's GPUs."""
    edited = tmp_path / "mwm.job"
    edited.write_text((ROOT / "jobs" / "mwm.job").read_text().replace("--gpus-per-task=1", "--gres=gpu:4"))
    job = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=2", "--ntasks-per-node=1"], ["--epochs", "2"],
                 script=edited)
    assert job.code == 0, job
    assert ranks_and_devices(job.log) == {0: "GPU 0,1,2,3", 1: "GPU 0,1,2,3"}
    assert_trained_in_sync(job.log, workers=2)


def test_sigterm_checkpoints_requeues_and_resumes(slurm, tmp_path):
    # tf_keras: under Keras 3 one CI run resumed one epoch late here (a race not yet found, see the closing note
    # of issue 10); Keras 3's SIGTERM -> 75 -> resume is tested under distrain launch (test_recovery.py)
    job_id = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"],
                    ["--epochs", "9"], wait=False, DISTRAIN_KERAS="legacy")
    log = tmp_path / f"mwm-{job_id}.out"
    env = {**os.environ, "SLURM_CONF": slurm}
    try:
        wait_for_text(log, "Epoch 3/")
        subprocess.run(["scancel", "--signal=TERM", job_id], env=env, check=True, timeout=300)
        # the requeued run waits for the old credential to expire (the test cluster's cred_expire=10)
        wait_gone(slurm, job_id, timeout=300)
    finally:
        cancel(slurm, job_id)
    text = log.read_text(errors="replace")
    assert text.count("stopped on SIGTERM after saving a checkpoint") == 2, text[-3000:]
    assert f"requeueing job {job_id}" in text
    # examples/train.py's seeded tf.data shuffle is positioned: the rerun goes on at the very step
    at = re.search(r"rerun to resume at ((?:the start of )?epoch (\d+)(?:, step \d+)?)", text)
    stopped_in = int(at[2])
    assert stopped_in >= 3  # the signal came during epoch 3
    resumed = text[text.index("resumed from checkpoint"):]
    assert f"training goes on at {at[1]}" in resumed, resumed[:500]
    assert int(re.search(r"Epoch (\d+)/\d+", resumed).group(1)) == stopped_in  # completed epochs not redone
    assert_trained_in_sync(resumed, workers=2)
    show = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True,
                          timeout=300).stdout
    assert "Restarts=1" in show and "JobState=COMPLETED" in show


def test_a_job_stopped_while_it_starts_is_requeued(slurm, tmp_path):
    """#67: a preemption in a job's first seconds (its batch shell signalled as the step starts, before any task
    has its stop handler) requeues the job, whatever the step's exit code: 75 from a task, 143 or srun's own."""
    job_id = submit(slurm, tmp_path, "single", [*SMALL, "--gres=gpu:1"], ["--epochs", "2"], wait=False)
    log = tmp_path / f"single-{job_id}.out"
    env = {**os.environ, "SLURM_CONF": slurm}
    try:
        wait_for_text(log, "distrain job: checkpoints:")  # the line before the step starts
        subprocess.run(["scancel", "--batch", "--signal=TERM", job_id], env=env, check=True, timeout=300)
        wait_for_text(log, f"requeueing job {job_id}", timeout=60)
    finally:
        cancel(slurm, job_id)
    text = log.read_text(errors="replace")
    assert "got SIGTERM, forwarding it to the training step" in text, text[-3000:]
    assert f"requeueing job {job_id} to resume" in text, text[-3000:]
    assert "Epoch 1/" not in text.split("requeueing job")[0], text[-3000:]


def test_bench_as_the_job_script(slurm, tmp_path):
    job = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"],
                 ["--steps", "5", "--warmup", "2", "--json", str(tmp_path / "bench.json")], TRAIN_SCRIPT="bench")
    assert job.code == 0, job
    assert job.log.count("images/sec") == 1 and "mwm, 2 worker(s), 2 replica(s)" in job.log
    assert (tmp_path / "bench.json").is_file()


def test_a_stuck_rank_ends_the_job_with_exit_4_and_is_named(slurm, tmp_path):
    slow = ROOT / "tests" / "integration" / "scripts" / "slow_steps.py"
    job = submit(slurm, tmp_path, "mwm", [*SMALL, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"],
                 [str(slow), "--step-seconds", "0.05", "--epochs", "100", "--steps", "30", "--stuck-rank", "1",
                  "--stuck-after", "20"], DISTRAIN_STALL_SECONDS="15", DISTRAIN_MAX_RESTARTS="0")  # no retry
    assert job.code == 4, job
    assert re.search(r"\[[01]/2\] distrain: error: stalled at epoch 1 step \d+: rank 1 \(node n10\) is stuck in your "
                     r"code at slow_steps.py:\d+ in read_batch_from_a_share_that_hangs", job.log), job


def test_selftest_job_proves_mwm_and_horovod_across_two_nodes(slurm, tmp_path):
    job = submit(slurm, tmp_path, "selftest", [*SMALL, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"])
    assert job.code == 0, job
    verdict = job.log[job.log.index("check "):]
    for check in ("single", "MWM x2", "Horovod x2"):
        assert re.search(rf"^{re.escape(check)}\s+pass .*2 ranks on 2 node\(s\); weights identical"
                         if check != "single" else rf"^{check}\s+pass ", verdict, re.MULTILINE), verdict
        if check != "single":  # across two nodes, the numbers of the one-process run of the same job
            assert re.search(rf"^{check} = one process\s+pass .*largest relative difference", verdict,
                             re.MULTILINE), verdict
    assert re.search(r"^GPU: XLA\s+skip .*no GPU visible to TensorFlow", verdict, re.MULTILINE), verdict  # emulated
    assert "verdict: PASS" in verdict
    rows = json.loads(next((tmp_path / "output").glob("selftest-*/selftest.json")).read_text())
    assert {"check", "status", "detail", "seconds"} == set(rows[0])


def test_a_site_that_takes_gpus_only_as_gres_submits_every_job_file_gres_jobs_writes(slurm_gres_only, tmp_path):
    """A Slurm with select/cons_res (tests/cluster/gres-only.env) refuses --gpus-per-task, which sbatch reads from
    the header before any site file could change it: scripts/gres-jobs.sh writes the job files with
    --gres=gpu:<tasks per node>, and every one of them is accepted as written (sbatch --test-only: the scheduler's
    own check of the header against the cluster; the allocations they get are the ones the --gres jobs above run)."""
    def test_only(job: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["sbatch", "--test-only", str(job), "train.py"], capture_output=True, text=True,
                              env=clean_env(SLURM_CONF=slurm_gres_only), timeout=60, cwd=tmp_path)

    refused = test_only(ROOT / "jobs" / "mwm.job")  # negative control: the job file as shipped
    assert refused.returncode != 0 and "GRES option unsupported" in refused.stderr, refused.stderr
    made = subprocess.run([str(ROOT / "scripts" / "gres-jobs.sh"), str(tmp_path / "jobs-gres")], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    written = sorted((tmp_path / "jobs-gres").glob("*.job"))
    assert [job.name for job in written] == sorted(job.name for job in (ROOT / "jobs").glob("*.job"))
    for job in written:
        header = job.read_text()
        assert "--gpus-per-task" not in header and f"DISTRAIN_HOME=${{DISTRAIN_HOME:-{ROOT}}}" in header, job.name
        tasks = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", header, re.M)
        if tasks:  # one GPU a task, as before
            assert f"\n#SBATCH --gres=gpu:{tasks[1]}\n" in header, job.name
        accepted = test_only(job)
        assert accepted.returncode == 0 and "to start at" in accepted.stderr, (job.name, accepted.stderr)
