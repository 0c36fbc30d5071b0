"""The exact srun, apptainer and sbatch lines the job scripts build (jobs/lib.sh), in milliseconds and without Slurm:
each job file runs under bash with the environment Slurm gives a batch shell, `srun`, `scontrol` and `apptainer`
replaced by recorders on PATH. The same lines run for real in tests/slurm/ and tests/container/; these pin them
word for word, as Horovod's runner tests pin their `mpirun` line."""

import shlex
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

RECORDER = """#!/bin/bash
printf '%s' "$(basename "$0")" >> "$RECORD"; printf ' %q' "$@" >> "$RECORD"; echo >> "$RECORD"
case "$(basename "$0") $1" in
  "srun --mpi=list") echo "MPI plugin types are..."; echo "	none"; echo "	${FAKE_MPI:-pmi2}" ;;
  "scontrol show") printf 'JobId=%s JobName=%s\\n   Requeue=%s Restarts=0\\n   TimeLimit=20:00:00 TimeMin=N/A\\n' \
                     "$SLURM_JOB_ID" "$SLURM_JOB_NAME" "${FAKE_REQUEUE:-1}"
                   printf '   Command=%s\\n   StdOut=%s/log.out\\n' "$FAKE_JOB_FILE" "$SLURM_SUBMIT_DIR" ;;
  "srun "*) echo "step-env CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}" >> "$RECORD"; exit "${FAKE_STEP_RC:-0}" ;;
esac
"""

# A batch shell of `sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-task=1 --cpus-per-task=8`, as Slurm sets it
SLURM_BATCH = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "8",
               "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_GPUS_PER_TASK": "1",
               "SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_PARTITION": "gpu",
               "SLURM_JOB_ACCOUNT": "proj7"}


def run_job(tmp_path: Path, job: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """jobs/JOB.job ARGS as its batch shell runs it; what it printed and each recorded command's argv."""
    fakes = tmp_path / "fakes"
    fakes.mkdir(exist_ok=True)
    for name in ("srun", "scontrol", "apptainer"):
        (fakes / name).write_text(RECORDER)
        (fakes / name).chmod(0o755)
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text("print('never run here')\n")
    (tmp_path / "distrain.sif").write_text("")
    record = tmp_path / "record"
    record.write_text("")
    job_file = str(ROOT / "jobs" / f"{job}.job")
    full_env = {"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "RECORD": str(record),
                "SLURM_SUBMIT_DIR": str(project), "SLURM_JOB_NAME": f"distrain-{job}", "FAKE_JOB_FILE": job_file,
                "DISTRAIN_IMAGE": str(tmp_path / "distrain.sif"), "SCRATCH": str(tmp_path / "scratch"),
                **SLURM_BATCH, **env}
    out = subprocess.run(["bash", job_file, *args], env=full_env, cwd=project, capture_output=True, text=True,
                         timeout=30)
    return out, [shlex.split(line) for line in record.read_text().splitlines()]


def steps(recorded: list[list[str]]) -> list[list[str]]:
    return [argv for argv in recorded if argv[0] == "srun" and argv[1] != "--mpi=list"]


def test_the_mwm_job_runs_one_srun_step_of_the_image_with_its_binds(tmp_path):
    out, recorded = run_job(tmp_path, "mwm", "train.py", "--epochs", "3", DISTRAIN_DATA_DIR=str(tmp_path))
    assert out.returncode == 0, out.stderr
    project, scratch = tmp_path / "project", tmp_path / "scratch" / "distrain"
    apptainer = str(tmp_path / "fakes" / "apptainer")  # found on PATH, named absolute
    assert steps(recorded) == [["srun", "--kill-on-bad-exit=1", apptainer, "run", "--nv", "--bind",
                                f"{scratch},{project},{tmp_path}", str(tmp_path / "distrain.sif"),
                                str(project / "train.py"), "--epochs", "3"]]
    assert f"distrain job: mwm, 8 task(s) on gpu[01-02]: srun --kill-on-bad-exit=1 {apptainer} run" in out.stdout


@pytest.mark.parametrize(("plugins", "chosen"), [("pmix", "--mpi=pmix"), ("pmi2", "--mpi=pmi2")])
def test_the_horovod_job_takes_pmix_where_srun_has_it(tmp_path, plugins, chosen):
    out, recorded = run_job(tmp_path, "horovod", "train.py", USE_CONTAINER="0", FAKE_MPI=plugins,
                            DISTRAIN_VENV=str(ROOT / ".venv"))
    assert out.returncode == 0, out.stderr
    assert steps(recorded) == [["srun", "--kill-on-bad-exit=1", chosen, str(ROOT / ".venv" / "bin" / "distrain"),
                                str(tmp_path / "project" / "train.py")]]


def test_a_stopped_step_requeues_the_job_or_prints_the_sbatch_line_that_resumes_it(tmp_path):
    out, recorded = run_job(tmp_path, "mwm", "train.py", "--lr", "0.1", FAKE_STEP_RC="75")
    assert out.returncode == 75 and ["scontrol", "requeue", "4242"] in recorded, out.stdout
    out, recorded = run_job(tmp_path, "mwm", "train.py", "--lr", "0.1", FAKE_STEP_RC="75", FAKE_REQUEUE="0")
    assert out.returncode == 75 and not any(argv[:2] == ["scontrol", "requeue"] for argv in recorded)
    resume = out.stdout.split("to resume, submit it again: ")[1].splitlines()[0]
    assert shlex.split(resume) == [
        "cd", str(tmp_path / "project"), "&&", "sbatch", "--nodes=2", "--ntasks-per-node=4", "--gpus-per-task=1",
        "--cpus-per-task=8", "--partition=gpu", "--account=proj7", "--time=20:00:00", "--job-name=distrain-mwm",
        str(ROOT / "jobs" / "mwm.job"), str(tmp_path / "project" / "train.py"), "--lr", "0.1"]


def test_the_single_job_gives_its_step_one_gpu_of_the_node(tmp_path):
    one_task = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "",
                "SLURM_TASKS_PER_NODE": "1", "SLURM_GPUS_PER_TASK": "", "SLURM_GPUS_ON_NODE": "2",
                "CUDA_VISIBLE_DEVICES": "0,1"}
    out, recorded = run_job(tmp_path, "single", "train.py", FAKE_STEP_RC="75", FAKE_REQUEUE="0", **one_task)
    assert out.returncode == 75, out.stderr
    [step] = steps(recorded)
    assert step[:5] == ["srun", "--kill-on-bad-exit=1", str(tmp_path / "fakes" / "apptainer"), "run", "--nv"]
    assert ["step-env", "CUDA_VISIBLE_DEVICES=0"] in recorded  # XLA would otherwise spread over both
    resume = shlex.split(out.stdout.split("to resume, submit it again: ")[1].splitlines()[0])
    assert resume[4:8] == ["--nodes=1", "--ntasks=1", "--gres=gpu:2", "--cpus-per-task=8"]
