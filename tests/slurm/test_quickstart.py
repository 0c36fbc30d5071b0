"""The README's quick start as a user runs it: from their own project directory, outside the checkout, with
the job file's path, outputs on scratch, nothing under $HOME; a stopped job resumed by submitting it again."""

import json
import os
import re
import shutil
import subprocess

import slurm_jobs
from helpers import DISTRAIN, ROOT, assert_trained_in_sync
from slurm_jobs import cancel, quick_start_trained, run_quick_start, submitted, user, wait_for_text, wait_gone


def test_the_quick_start_block_runs_as_written_from_the_users_project(slurm, tmp_path):
    """The walk-through of a user on Slurm with their own package (a local wheel named by requirements.txt) and
    data (`$SCRATCH/data`): the README's block as written, from the user's project."""
    home, project, env = user(slurm, tmp_path)
    slurm_jobs.with_the_labs_package(project)
    log = run_quick_start(slurm, home, project, env)
    quick_start_trained(log, tmp_path / "scratch")
    assert log.count("labtools 42") == 2 and log.count("distrain: installing ") == 1, log  # one rank built it
    assert (tmp_path / "scratch" / "distrain" / "runs").is_dir()
    assert len(list((tmp_path / "scratch" / "distrain" / "packages").glob("*/.complete"))) == 1
    # nothing under $HOME but the user's own project and the job's log there: not even Keras' config file, which
    # `import keras` writes to ~/.keras under plain python (KERAS_HOME is the run's while the user has no ~/.keras)
    assert set(os.listdir(home)) == {"myproject"}
    files = sorted(os.listdir(project))
    assert files[1:] == ["requirements.txt", "train.py", "wheels"] and files[0].startswith("distrain-mwm-"), files


def test_a_job_stopped_without_requeue_resumes_with_the_command_its_log_prints(slurm, tmp_path):
    home, project, env = user(slurm, tmp_path)
    command = ["sbatch", "--no-requeue", "--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2", "--cpus-per-task=1",
               f"{ROOT}/jobs/mwm.job", "train.py", "--epochs", "12", "--batch-size", "8"]
    # batches of 8: 225 steps, epochs of about 2 s here, so that the 10 epochs left after the listing's start are
    # far longer than the listing takes under load (2-4 s; with the default 64, 0.3 s epochs: training once ended
    # before the signal came, a timing flake)
    job_id = submitted(subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300))
    log = project / f"distrain-mwm-{job_id}.out"
    runs = [DISTRAIN, "runs", "--json"]  # the user's output dir ($SCRATCH/distrain), as on the login node
    try:
        wait_for_text(log, "Epoch 2/")  # one epoch's loss logged: where the loss has to fall from
        running = json.loads(subprocess.run(runs, env=env, capture_output=True, text=True, timeout=300).stdout)
        signalled_in = int(re.findall(r"Epoch (\d+)/12", log.read_text(errors="replace"))[-1])  # listing took epochs
        subprocess.run(["scancel", "--signal=TERM", job_id], env=env, check=True, timeout=300)
        wait_gone(slurm, job_id, timeout=120)
    finally:
        cancel(slurm, job_id)
    assert [(r["live"], r["state"].split(" on ")[0]) for r in running] == [(True, f"running as job {job_id}")], running
    text = log.read_text(errors="replace")
    assert "stopped on SIGTERM after saving a checkpoint" in text, text[-3000:]
    loss_at_start = float(re.search(r"loss: ([\d.]+)", text).group(1))
    # the last line says exactly what to type: the job's own sbatch options and job name, from the submit dir
    resume = re.search(r"to resume, submit it again: (.+)", text).group(1)
    stopped = json.loads(subprocess.run(runs, env=env, capture_output=True, text=True, timeout=300).stdout)
    assert [(r["live"], r["state"].split(" (")[0][:10], r["resume"]) for r in stopped] == \
        [(False, "stopped at", resume)], stopped  # distrain runs shows the same command
    # (--gres=gpu:2 as given is --gpus-per-task=1 of the header for its 2 tasks: the same GPUs)
    assert resume == f"cd {project} && sbatch --nodes=1 --ntasks-per-node=2 --gpus-per-task=1 --cpus-per-task=1 " \
        f"--partition=debug --time=01:00:00 --job-name=distrain-mwm {ROOT}/jobs/mwm.job {project}/train.py " \
        "--epochs 12 --batch-size 8", resume
    again = submitted(subprocess.run(["bash", "-c", resume], cwd=tmp_path, env=env, capture_output=True, text=True,
                                     timeout=300))
    try:
        wait_gone(slurm, again, timeout=300)
    finally:
        cancel(slurm, again)
    text = (project / f"distrain-mwm-{again}.out").read_text(errors="replace")
    stopped_in = int(re.search(r"resuming run train-\w+ at (?:the start of )?epoch (\d+)", text).group(1))
    # the signal came in epoch `signalled_in` of 2-second epochs: the stop is within seconds, not epochs later
    assert signalled_in <= stopped_in <= signalled_in + 2, (signalled_in, text[-3000:])
    assert int(re.search(r"Epoch (\d+)/12", text).group(1)) == stopped_in, text[-3000:]
    # under load the stop can come late in the 12 epochs, leaving the resumed job a single one: the loss is
    # checked over the whole run, from the first epoch before the stop to the last after it
    assert_trained_in_sync(text, workers=2, loss_before=loss_at_start)


def test_bad_input_to_a_job_is_one_line_and_exit_2_before_srun(slurm, tmp_path):
    home, project, env = user(slurm, tmp_path)
    small = ["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1"]
    missing = subprocess.run([*small, "--output=missing.out", f"{ROOT}/jobs/mwm.job", "nope.py"], cwd=project,
                             env=env, capture_output=True, text=True, timeout=300)
    text = (project / "missing.out").read_text(errors="replace")
    assert missing.returncode == 2, text
    assert f"distrain job: error: training script {project}/nope.py not found" in text
    assert "task(s) on" not in text  # srun never started
    alone = project / "mwm.job"  # a job file copied out of the checkout: no lib.sh beside it
    shutil.copy(ROOT / "jobs" / "mwm.job", alone)
    lost = subprocess.run([*small, "--output=alone.out", str(alone), "train.py"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    text = (project / "alone.out").read_text(errors="replace")
    assert lost.returncode == 2 and "distrain job: error: cannot read jobs/lib.sh" in text, text
    assert len(text.strip().splitlines()) == 1
