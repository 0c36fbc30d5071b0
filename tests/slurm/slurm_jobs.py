"""Submit the real job scripts and read their logs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from helpers import ROOT, a_wheel, assert_trained_in_sync, clean_env
from readme_blocks import block


class Job:
    """A finished sbatch job: exit code and log."""

    def __init__(self, job_id: str, code: int, log: str) -> None:
        self.id, self.code, self.log = job_id, code, log

    def __repr__(self) -> str:
        return f"Job({self.id}, exit {self.code})\n{self.log[-4000:]}"


def job_env(slurm_conf: str, tmp: Path, **extra: str) -> dict[str, str]:
    # OMPI_MCA_btl: the emulated nodes share one host, and Open MPI's shared-memory transport (vader) segfaults
    # when PMIx says two ranks are on different nodes that are really the same machine. Real clusters keep it.
    defaults = {"SLURM_CONF": slurm_conf, "USE_CONTAINER": "0", "DISTRAIN_HOME": str(ROOT),
                "DISTRAIN_VENV": str(ROOT / ".venv"), "DISTRAIN_OUTPUT_DIR": str(tmp / "output"),
                "OMPI_MCA_btl": "self,tcp"}
    return clean_env(**{**defaults, **extra})


def submit(slurm_conf: str, tmp: Path, job: str, sbatch_args: list[str], script_args: list[str] | None = None,
           wait: bool = True, script: Path | None = None, **env: str) -> Job | str:
    """sbatch a real job script from jobs/ (as a user would), by default waiting for it to end."""
    log = tmp / f"{job}-%j.out"
    cmd = ["sbatch", "--parsable", f"--output={log}", f"--chdir={ROOT}", *(["--wait"] if wait else []),
           *sbatch_args, str(script or ROOT / "jobs" / f"{job}.job"), *(script_args or [])]
    proc = subprocess.run(cmd, env=job_env(slurm_conf, tmp, **env), capture_output=True, text=True, timeout=900)
    job_id = proc.stdout.strip().split(";")[0].splitlines()[0] if proc.stdout.strip() else "?"
    if not wait:
        assert proc.returncode == 0, proc.stderr
        return job_id
    path = Path(str(log).replace("%j", job_id))
    return Job(job_id, proc.returncode, path.read_text(errors="replace") if path.exists() else proc.stderr)


def wait_gone(slurm_conf: str, job_id: str, timeout: float = 300) -> None:
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True, timeout=300)
        if job_id not in out.stdout:
            return
        time.sleep(1)
    raise AssertionError(f"job {job_id} still queued/running after {timeout} s")


def wait_for_text(log: Path, text: str, timeout: float = 180) -> None:
    """Wait until a job's log holds `text` (or the timeout passes: the assertions after it say what was seen)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and text not in (log.read_text(errors="replace") if log.exists() else ""):
        time.sleep(0.3)


def cancel(slurm_conf: str, job_id: str) -> None:
    """scancel a test's job (a no-op once it ended), so a failed test never leaves a job holding the nodes."""
    subprocess.run(["scancel", job_id], env={**os.environ, "SLURM_CONF": slurm_conf}, capture_output=True, timeout=300)


def user(slurm: str, tmp_path: Path, **extra: str) -> tuple[Path, Path, dict[str, str]]:
    """A user's $HOME with ~/myproject/train.py, $SCRATCH, and the environment the README assumes."""
    home = tmp_path / "home"
    (home / "myproject").mkdir(parents=True)
    (tmp_path / "scratch" / "data").mkdir(parents=True)  # the quick start's DISTRAIN_DATA_DIR
    shutil.copy(ROOT / "examples" / "train.py", home / "myproject" / "train.py")
    # OMPI_MCA_btl: see slurm_jobs.job_env (emulated nodes share one host)
    defaults = {"SLURM_CONF": slurm, "HOME": str(home), "DISTRAIN": str(ROOT), "SCRATCH": str(tmp_path / "scratch"),
                "USE_CONTAINER": "0", "DISTRAIN_VENV": str(ROOT / ".venv"), "OMPI_MCA_btl": "self,tcp"}
    env = clean_env(**{**defaults, **extra})
    # this machine's root has rustup's proxies on PATH: pip's user agent runs `rustc --version`, which would make
    # ~/.rustup in a user's home that never had rustup (a real user's rustup lives in their own home already)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "/.cargo/" not in p + "/")
    return home, home / "myproject", env


def with_the_labs_package(project: Path) -> None:
    """The walk-through's own package: labtools, a local wheel in the project's `wheels/` (no index, as on compute
    nodes without internet) named by its requirements.txt; its train.py imports it first."""
    wheels = a_wheel(project / "wheels")
    (project / "requirements.txt").write_text(f"--no-index\n--find-links {wheels}\nlabtools==1.0\n")
    script = project / "train.py"
    script.write_text("import labtools  # the lab's own package\nprint('labtools', labtools.ANSWER, flush=True)\n"
                      + script.read_text())


def submitted(out: subprocess.CompletedProcess) -> str:
    """The job id sbatch printed."""
    found = re.search(r"Submitted batch job (\d+)", out.stdout) or re.search(r"^(\d+)", out.stdout, re.MULTILINE)
    assert found, out.stdout + out.stderr
    return found.group(1)


def run_quick_start(slurm: str, home: Path, project: Path, env: dict[str, str]) -> str:
    """Run the README's Slurm quick start in the user's $HOME, wait for its job, return the job log."""
    out = subprocess.run(["bash", "-euc", block("quickstart-slurm")], cwd=home, env=env, capture_output=True,
                         text=True, timeout=60)
    job_id = submitted(out)
    try:
        wait_gone(slurm, job_id, timeout=300)
    finally:
        cancel(slurm, job_id)
    return (project / f"distrain-mwm-{job_id}.out").read_text(errors="replace")


def quick_start_trained(log: str, scratch: Path) -> None:
    """What the quick start promises, read from its job log."""
    assert "mwm on 2 worker(s)" in log and f"checkpoints: {scratch}/distrain/runs/" in log, log
    assert_trained_in_sync(log, workers=2)
