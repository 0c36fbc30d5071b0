"""distrain's developer benchmarks: ratios measured side by side in one run, medians over repetitions.

    .venv/bin/python benchmarks/run.py all            (by hand: results in benchmarks/results/)
    .venv/bin/python benchmarks/run.py overhead --reps 7
    .venv/bin/python benchmarks/run.py all --smoke --out /tmp/bench   (CI: tiny sizes, checks it all runs)

overhead   distrain run/launch vs the same work hand-written for the mode (single, MWM x2, Horovod x2)
startup    time to the first training step: distrain run vs python
container  apptainer run (the image) vs the same work in the host venv, where an image exists
comm       all-reduce time against tensor size: MWM ring vs Horovod Gloo vs Horovod MPI, 2 local workers
Variants alternate within each repetition, so drift on the machine hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DISTRAIN = str(BIN / "distrain")
WORKLOAD = str(ROOT / "benchmarks" / "workload.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-x", "PATH", "-mca", "btl_tcp_if_include", "lo",
          "-mca", "oob_tcp_if_include", "lo"]
TARGETS = {"overhead": ">= 0.99 (throughput ratio)", "startup": "<= 1.05 (time ratio)",
           "container": ">= 0.98 (throughput ratio)"}


def env() -> dict[str, str]:
    skip = ("SLURM_", "OMPI_", "PMI", "HOROVOD_", "DISTRAIN_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    base.pop("TF_CONFIG", None)
    base.update(PATH=f"{BIN}:{base.get('PATH', '')}", TF_CPP_MIN_LOG_LEVEL="2", DISTRAIN_CHECKPOINT="0",
                PYTHONUNBUFFERED="1")
    return base


def bench_line(cmd: list[str], tag: str = "BENCH", extra_env: dict | None = None) -> tuple[dict, float]:
    """Run a command; return the JSON its chief printed after `tag` and the wall time it was started at."""
    started = time.time()
    out = subprocess.run(cmd, env={**env(), **(extra_env or {})}, cwd=ROOT, text=True, timeout=900,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in out.stdout.splitlines():
        if f"{tag} " in line:
            return json.loads(line.split(f"{tag} ", 1)[1]), started
    raise RuntimeError(f"{' '.join(cmd)} printed no {tag} line (exit {out.returncode}):\n{out.stdout[-3000:]}")


def handmade_mwm(args: list[str]) -> tuple[dict, float]:
    """Two workers with a TF_CONFIG written by hand, the way the user guides do it."""
    from entrypoint.launcher import free_ports

    workers = [f"localhost:{p}" for p in free_ports(2)]
    started = time.time()
    procs = []
    for index in range(2):
        config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, WORKLOAD, "--handmade", "mwm", *args], cwd=ROOT,
                                      env={**env(), "TF_CONFIG": config}, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for line in outputs[0].splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:]), started
    raise RuntimeError(f"hand-made MWM printed no BENCH line:\n{outputs[0][-3000:]}")


def alternate(variants: dict, reps: int) -> dict[str, list]:
    samples: dict[str, list] = {name: [] for name in variants}
    for _ in range(reps):
        for name, run in variants.items():
            samples[name].append(run())
    return samples


def overhead(reps: int, smoke: bool) -> dict:
    work = ["--steps", "8" if smoke else "150", "--warmup", "3" if smoke else "20"]
    pairs = {
        "single": (lambda: bench_line([DISTRAIN, "run", WORKLOAD, *work]),
                   lambda: bench_line([sys.executable, WORKLOAD, "--handmade", "single", *work])),
        # distrain's defaults turn oneDNN off for multi-worker MWM (tensorflow#60857, see README); the second
        # row gives distrain the hand-written version's kernels, isolating distrain's own overhead
        "mwm x2 (defaults: oneDNN off)": (lambda: bench_line([DISTRAIN, "launch", "-n", "2", WORKLOAD, *work]),
                                          lambda: handmade_mwm(work)),
        "mwm x2 (TF_ENABLE_ONEDNN_OPTS=1)": (
            lambda: bench_line([DISTRAIN, "launch", "-n", "2", WORKLOAD, *work],
                               extra_env={"TF_ENABLE_ONEDNN_OPTS": "1"}),
            lambda: handmade_mwm(work)),
        "horovod x2 (gloo)": (
            lambda: bench_line(["horovodrun", "-np", "2", "--gloo", DISTRAIN, "run", WORKLOAD, *work]),
            lambda: bench_line(["horovodrun", "-np", "2", "--gloo", sys.executable, WORKLOAD, "--handmade",
                                "horovod", *work])),
    }
    rows = {}
    for mode, (with_distrain, by_hand) in pairs.items():
        samples = alternate({"distrain": with_distrain, "hand-written": by_hand}, reps)
        ours = statistics.median(s[0]["images_per_sec"] for s in samples["distrain"])
        theirs = statistics.median(s[0]["images_per_sec"] for s in samples["hand-written"])
        rows[mode] = {"distrain_images_per_sec": ours, "handwritten_images_per_sec": theirs, "ratio": ours / theirs}
    return rows


def startup(reps: int, smoke: bool) -> dict:
    work = ["--steps", "3", "--warmup", "1"]
    samples = alternate({
        "distrain run": lambda: bench_line([DISTRAIN, "run", WORKLOAD, *work]),
        "python": lambda: bench_line([sys.executable, WORKLOAD, "--handmade", "single", *work]),
    }, reps)
    first = {name: statistics.median(r["first_step"] - started for r, started in runs)
             for name, runs in samples.items()}
    return {"distrain_s": first["distrain run"], "python_s": first["python"],
            "ratio": first["distrain run"] / first["python"]}


def container(reps: int, smoke: bool, sif: str | None) -> dict:
    apptainer = shutil.which("apptainer") or shutil.which("apptainer", path="/opt/distrain-apptainer/bin")
    if not sif or not os.path.isfile(sif) or not apptainer:
        return {"skipped": f"no image ({sif}) or no apptainer: build one with `distrain image build`"}
    work = ["--steps", "8" if smoke else "150", "--warmup", "3" if smoke else "20"]
    extra = {"APPTAINER_DROP_CAPS": "CAP_SYS_RESOURCE"} if os.geteuid() == 0 else {}
    samples = alternate({
        "apptainer": lambda: bench_line([apptainer, "run", "--env", "DISTRAIN_REQUIRE_GPU=0", "--bind", str(ROOT),
                                         sif, WORKLOAD, *work], extra_env=extra),
        "host venv": lambda: bench_line([DISTRAIN, "run", WORKLOAD, *work]),
    }, reps)
    ours = statistics.median(r["images_per_sec"] for r, _ in samples["apptainer"])
    host = statistics.median(r["images_per_sec"] for r, _ in samples["host venv"])
    return {"apptainer_images_per_sec": ours, "host_images_per_sec": host, "ratio": ours / host}


def comm(reps: int, smoke: bool) -> dict:
    script = str(ROOT / "benchmarks" / "allreduce.py")
    work = ["--sizes", "1000,100000" if smoke else "1000,100000,1000000,4000000", "--reps", "3" if smoke else "20"]
    runs = {
        "mwm ring": ([DISTRAIN, "launch", "-n", "2", script, *work], {"DISTRAIN_COLLECTIVE": "ring"}),
        "horovod gloo": (["horovodrun", "-np", "2", "--gloo", DISTRAIN, "run", script, *work], {}),
        "horovod mpi": ([*MPIRUN, DISTRAIN, "run", script, *work], {}),
    }
    table: dict[str, dict] = {}
    for name, (cmd, extra) in runs.items():
        table[name] = bench_line(cmd, "ALLREDUCE", extra)[0]["ms"]
    return {"allreduce_ms_by_elements": table}


def machine() -> dict:
    import tensorflow as tf  # noqa: F401 - version only

    cpu = platform.machine()
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return {"host": platform.node(), "cpu": names[0] if names else cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "tensorflow": tf.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def report(name: str, data: dict) -> str:
    lines = [f"## {name}" + (f"  (target {TARGETS[name]})" if name in TARGETS else "")]
    for key, value in data.items():
        if isinstance(value, dict):
            cells = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
            lines.append(f"- {key}: {cells}")
        else:
            lines.append(f"- {key}: {value:.3f}" if isinstance(value, float) else f"- {key}: {value}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["overhead", "startup", "container", "comm", "all"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repetition: checks it runs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--sif", default=os.environ.get("DISTRAIN_BENCH_SIF", "/var/cache/distrain/distrain-test.sif"))
    opts = parser.parse_args()
    reps = 1 if opts.smoke else opts.reps
    chosen = ["overhead", "startup", "container", "comm"] if opts.which == "all" else [opts.which]
    results = {"machine": machine(), "reps": reps, "smoke": opts.smoke}
    for name in chosen:
        started = time.monotonic()
        data = container(reps, opts.smoke, opts.sif) if name == "container" else globals()[name](reps, opts.smoke)
        results[name] = data
        print(report(name, data) + f"\n  ({time.monotonic() - started:.0f} s)", flush=True)
    os.makedirs(opts.out, exist_ok=True)
    path = Path(opts.out) / f"{'smoke-' if opts.smoke else ''}{opts.which}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
