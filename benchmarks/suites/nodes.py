"""nodes: 8 emulated nodes (issue 54). A second local Slurm of 8 nodes (tests/cluster/eight-nodes.env: every node
this one machine, so it measures contention as much as growth), `jobs/mwm.job` and `jobs/horovod.job` with one
task per node on the workload (benchmarks/workers/workload.py, a small CNN), in the virtualenv (USE_CONTAINER=0),
the modes alternating within each repetition:

    .venv/bin/python benchmarks/run.py nodes [--reps 3]

Per mode, medians of rank 0's start-up: its process's start to its first trained step, and each phase (process
and plan, TensorFlow's import, strategy and rendezvous, the script to its first step). The cluster is stopped
afterwards."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from harness import ROOT, WORKLOAD, env

from . import Options
from .startup import PHASES

CLUSTER = ROOT / "tests" / "cluster"
MODES = ("mwm", "horovod")
NODES = 8
TIMEOUT_S = 1200


def cluster_settings() -> dict[str, str]:
    lines = (CLUSTER / "eight-nodes.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def job(conf: str, mode: str, work: list[str], state: str) -> dict:
    """One sbatch --wait of jobs/<mode>.job on the 8 nodes: rank 0's BENCH line."""
    log = Path(state) / f"{mode}-%j.out"
    job_env = {**env(), "SLURM_CONF": conf, "USE_CONTAINER": "0", "DISTRAIN_HOME": str(ROOT),
               "DISTRAIN_VENV": str(ROOT / ".venv"), "DISTRAIN_OUTPUT_DIR": state, "DISTRAIN_KERAS": "keras3",
               "OMPI_MCA_btl": "self,tcp"}  # the emulated nodes share one host (tests/slurm/slurm_jobs.py)
    cmd = ["sbatch", "--parsable", "--wait", f"--output={log}", f"--chdir={ROOT}", "--cpus-per-task=1", "--time=20",
           f"--nodes={NODES}", "--ntasks-per-node=1", "--gres=gpu:1", str(ROOT / "jobs" / f"{mode}.job"),
           WORKLOAD, *work]
    done = subprocess.run(cmd, env=job_env, text=True, capture_output=True, timeout=TIMEOUT_S)
    job_id = done.stdout.strip().split(";")[0]
    output = Path(str(log).replace("%j", job_id)).read_text() if job_id else done.stderr
    bench = [line.split("BENCH ", 1)[1] for line in output.splitlines() if "BENCH " in line]
    if done.returncode != 0 or not bench:
        raise RuntimeError(f"{mode} x{NODES} exited {done.returncode}:\n{output[-3000:]}")
    return json.loads(bench[0])


def run(options: Options) -> dict:
    settings = cluster_settings()
    started = subprocess.run([str(CLUSTER / "start-slurm.sh")], env={**os.environ, **settings}, text=True,
                             capture_output=True, timeout=600)
    if started.returncode != 0:
        raise RuntimeError(f"the 8-node cluster did not start:\n{started.stdout}{started.stderr}")
    conf = f"{settings['SLURM_ROOT']}/etc/slurm.conf"
    work = ["--steps", "3", "--warmup", "1"]
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    try:
        with tempfile.TemporaryDirectory(prefix="distrain-nodes-") as state:
            for _ in range(max(1, options.reps)):
                for mode in MODES:
                    runs[mode].append(job(conf, mode, work, state))
    finally:
        subprocess.run([str(CLUSTER / "stop-slurm.sh")], env={**os.environ, **settings}, capture_output=True,
                       timeout=120)
    table = {}
    for mode, found in runs.items():
        row = {name: statistics.median(r[end] - r[begin] for r in found) for name, begin, end in PHASES}
        row["start to first step"] = statistics.median(r["first_step"] - r["process_start"] for r in found)
        table[f"{mode} x{NODES}"] = row
    return {"label": f"{NODES} emulated nodes on {os.cpu_count()} cores", **table}
