"""stop: what a stop costs. A run of benchmarks/workers/expensive_map.py (issue 54's pipeline, an expensive map)
stopped by SIGTERM at 10 % and at 90 % of its epoch under `distrain run`, and resumed.

    .venv/bin/python benchmarks/run.py stop [--reps 5] [--smoke]

For each map (pure: the resume skips the batches passed over beneath the map and the batch; random: it must make
them all) and each position, medians over --reps repetitions, the positions alternating within each:
- stop_s: from the SIGTERM to the process's exit 75 (the ranks agree on the step, the checkpoint is written);
- resume_first_step_s: from the resumed process's start to its first trained step (TensorFlow's import, the
  model, the restore, the batches passed over, the first step's trace).
The ratio at 90 % over 10 % is what the position costs: 1.0 is a resume in O(1) of the position (issue 54's goal:
<= 1.2 where skipping is possible).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time

from harness import DISTRAIN, WORKERS, env

from . import Options

SCRIPT = str(WORKERS / "expensive_map.py")
POSITIONS = {"10 %": 0.1, "90 %": 0.9}
MAPS = ("pure", "random")
EXIT_STOPPED = 75
TIMEOUT_S = 600


def stopcost_line(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("STOPCOST ")]
    if not lines:
        raise RuntimeError(f"no STOPCOST line:\n{output[-3000:]}")
    return json.loads(lines[-1].split(" ", 1)[1])


def environment(state: str, **extra: str) -> dict[str, str]:
    """The harness's clean environment, with checkpoints on (what is measured) in `state`, every step checked."""
    return {**env(), **extra, "DISTRAIN_CHECKPOINT": "1", "DISTRAIN_OUTPUT_DIR": state,
            "DISTRAIN_STOP_CHECK_SECONDS": "0"}


def stop_and_resume(work: list[str], stop_at: int) -> dict:
    """One stop at step `stop_at` and its resume, in a fresh state directory: the two costs in seconds."""
    with tempfile.TemporaryDirectory(prefix="distrain-stopcost-") as state:
        command = [DISTRAIN, "run", SCRIPT, *work]
        stopped = subprocess.run(command, env=environment(state, STOP_AT=str(stop_at)), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
        ended = time.time()
        if stopped.returncode != EXIT_STOPPED:
            raise RuntimeError(f"the stop exited {stopped.returncode}, not {EXIT_STOPPED}:\n{stopped.stdout[-3000:]}")
        signalled = stopcost_line(stopped.stdout)["signalled"]
        resumed = subprocess.run(command, env=environment(state), text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
        if resumed.returncode != 0 or "resuming run" not in resumed.stdout:
            raise RuntimeError(f"the resume exited {resumed.returncode}:\n{resumed.stdout[-3000:]}")
        stamps = stopcost_line(resumed.stdout)
        return {"stop_s": ended - signalled, "resume_first_step_s": stamps["first_step"] - stamps["process_start"]}


def measure(reps: int, samples: int, work: int) -> dict:
    steps = samples // 32
    table: dict[str, dict] = {}
    for kind in MAPS:
        runs: dict[str, list[dict]] = {name: [] for name in POSITIONS}
        for _ in range(reps):
            for name, fraction in POSITIONS.items():
                stop_at = max(1, int(steps * fraction))
                runs[name].append(stop_and_resume(["--samples", str(samples), "--map", kind, "--work", str(work)],
                                                  stop_at))
        row = {}
        for name, found in runs.items():
            for key in ("stop_s", "resume_first_step_s"):
                row[f"{key} at {name}"] = statistics.median(r[key] for r in found)
        per_rep = [late["resume_first_step_s"] / early["resume_first_step_s"]
                   for early, late in zip(runs["10 %"], runs["90 %"], strict=True)]
        row.update(ratio_90_over_10=statistics.median(per_rep), ratio_min=min(per_rep), ratio_max=max(per_rep))
        table[f"{kind} map"] = row
    return table


def run(options: Options) -> dict:
    samples, work = (640, 2) if options.smoke else (8000, 30)
    return {"samples": samples, "map_products": work, **measure(options.reps, samples, work)}
