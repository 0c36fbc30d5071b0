"""stop: what a stop costs. A run of benchmarks/workers/expensive_map.py (issue 54's pipeline, an expensive map)
stopped by SIGTERM and resumed, in one run of this suite:

    .venv/bin/python benchmarks/run.py stop [--reps 5] [--smoke]

- by map, `distrain run`, stopped at 10 % and at 90 % of its epoch (the positions alternating within each
  repetition): pure (the resume skips the batches passed over beneath the map and the batch) and random (it must
  make them all). stop_s: from the SIGTERM to the exit 75 (the ranks agree on the step, the checkpoint is
  written); resume_first_step_s: from the resumed process's start to its first trained step (TensorFlow's
  import, the model, the restore, the batches passed over, the first step's trace). The ratio at 90 % over 10 %
  is what the position costs: 1.0 is a resume in O(1) of the position (issue 54's goal: <= 1.2 where skipping is
  possible);
- by mode, the pure map: MWM x2 (`distrain launch -n 2`) and Horovod x2 (mpirun), the same costs, rank 0's;
- the checkpoint's write per MB: stop_s at 50 % with a small and a large model (weights and Adam's state),
  alternating; the difference over the megabytes' difference is the write's cost per MB;
- against Keras' own BackupAndRestore (the script's, as its guide writes it; distrain then saves nothing):
  stopped at 90 %, back_s is from the resumed process's start until training is past the step it stopped at.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time

from harness import DISTRAIN, MPIRUN, WORKERS, env

from . import Options

SCRIPT = str(WORKERS / "expensive_map.py")
POSITIONS = {"10 %": 0.1, "90 %": 0.9}
MAPS = ("pure", "random")
MODES = {"single": [DISTRAIN, "run"], "mwm x2": [DISTRAIN, "launch", "-n", "2"],
         "horovod x2": [*MPIRUN, DISTRAIN, "run"]}
WIDTHS = {"small": 32, "large": 2048}  # units of the hidden layer: 1.6 MB and 100 MB of weights and Adam's state
BATCH = 32
EXIT_STOPPED = 75
TIMEOUT_S = 600


def stopcost_line(output: str) -> dict:
    """Rank 0's STOPCOST line (under `distrain launch`, after the launcher's rank prefix; another rank's output can
    follow it on the same line: the JSON object alone is read)."""
    lines = [line.split("STOPCOST ", 1)[1] for line in output.splitlines() if "STOPCOST " in line]
    if not lines:
        raise RuntimeError(f"no STOPCOST line:\n{output[-3000:]}")
    return json.JSONDecoder().raw_decode(lines[-1])[0]


def environment(state: str, **extra: str) -> dict[str, str]:
    """The harness's clean environment, with checkpoints on (what is measured) in `state`, every step checked."""
    return {**env(), **extra, "DISTRAIN_CHECKPOINT": "1", "DISTRAIN_OUTPUT_DIR": state,
            "DISTRAIN_STOP_CHECK_SECONDS": "0"}


def stop_and_resume(launcher: list[str], work: list[str], stop_at: int, keras_backup: bool = False) -> dict:
    """One stop at step `stop_at` and its resume, in a fresh state directory: the costs in seconds."""
    with tempfile.TemporaryDirectory(prefix="distrain-stopcost-") as state:
        command = [*launcher, SCRIPT, *work, *(["--keras-backup", f"{state}/keras-backup"] if keras_backup else [])]
        stopped = subprocess.run(command, env=environment(state, STOP_AT=str(stop_at)), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
        ended = time.time()
        if stopped.returncode != EXIT_STOPPED:
            raise RuntimeError(f"the stop exited {stopped.returncode}, not {EXIT_STOPPED}:\n{stopped.stdout[-3000:]}")
        signalled = stopcost_line(stopped.stdout)["signalled"]
        resumed = subprocess.run(command, env=environment(state, BACK_AT=str(stop_at)), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
        if resumed.returncode != 0 or ("resuming run" not in resumed.stdout and not keras_backup):
            raise RuntimeError(f"the resume exited {resumed.returncode}:\n{resumed.stdout[-3000:]}")
        stamps = stopcost_line(resumed.stdout)
        return {"stop_s": ended - signalled, "resume_first_step_s": stamps["first_step"] - stamps["process_start"],
                "back_s": stamps["back"] - stamps["process_start"], "state_mb": stamps["state_mb"]}


def by_position(launcher: list[str], work: list[str], reps: int, steps: int) -> dict:
    """The stop and the resume at 10 % and at 90 %, alternating; medians and the per-repetition ratio."""
    runs: dict[str, list[dict]] = {name: [] for name in POSITIONS}
    for _ in range(reps):
        for name, fraction in POSITIONS.items():
            runs[name].append(stop_and_resume(launcher, work, max(1, int(steps * fraction))))
    row = {f"{key} at {name}": statistics.median(r[key] for r in found)
           for name, found in runs.items() for key in ("stop_s", "resume_first_step_s")}
    per_rep = [late["resume_first_step_s"] / early["resume_first_step_s"]
               for early, late in zip(runs["10 %"], runs["90 %"], strict=True)]
    return {**row, "ratio_90_over_10": statistics.median(per_rep), "ratio_min": min(per_rep),
            "ratio_max": max(per_rep)}


def checkpoint_write(work: list[str], reps: int, steps: int) -> dict:
    """stop_s at 50 % for a small and a large model, alternating: the write's cost per MB is their difference."""
    runs: dict[str, list[dict]] = {name: [] for name in WIDTHS}
    for _ in range(reps):
        for name, width in WIDTHS.items():
            runs[name].append(stop_and_resume(MODES["single"], [*work, "--width", str(width)], steps // 2))
    row = {f"{key} ({name})": statistics.median(r[key] for r in found)
           for name, found in runs.items() for key in ("state_mb", "stop_s")}
    per_mb = [(large["stop_s"] - small["stop_s"]) / (large["state_mb"] - small["state_mb"])
              for small, large in zip(runs["small"], runs["large"], strict=True)]
    return {**row, "s_per_mb": statistics.median(per_mb), "s_per_mb_min": min(per_mb), "s_per_mb_max": max(per_mb)}


def against_keras_backup(work: list[str], reps: int, steps: int) -> dict:
    """Stopped at 90 %: from the resumed start until past the step it stopped at, distrain's checkpoint against
    the script's own BackupAndRestore, alternating."""
    runs: dict[str, list[dict]] = {"distrain": [], "BackupAndRestore": []}
    for _ in range(reps):
        for name in runs:
            runs[name].append(stop_and_resume(MODES["single"], work, int(steps * 0.9),
                                              keras_backup=name == "BackupAndRestore"))
    row = {f"back_s ({name})": statistics.median(r["back_s"] for r in found) for name, found in runs.items()}
    ratios = [theirs["back_s"] / ours["back_s"]
              for ours, theirs in zip(runs["distrain"], runs["BackupAndRestore"], strict=True)]
    return {**row, "ratio_keras_over_distrain": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios)}


def run(options: Options) -> dict:
    samples, work = (640, 2) if options.smoke else (8000, 30)
    steps = samples // BATCH
    result: dict = {"samples": samples, "map_products": work}
    for kind in MAPS:
        result[f"{kind} map"] = by_position(MODES["single"], ["--samples", str(samples), "--map", kind, "--work",
                                                              str(work)], options.reps, steps)
    pure = ["--samples", str(samples), "--map", "pure", "--work", str(work)]
    for mode in ("mwm x2", "horovod x2"):
        result[f"{mode}, pure map"] = by_position(MODES[mode], pure, options.reps, steps)
    result["checkpoint write"] = checkpoint_write(pure, options.reps, steps)
    result["against Keras' BackupAndRestore"] = against_keras_backup(pure, options.reps, steps)
    return result
