"""startup: time to the first training step, distrain against python, and per phase by workers."""

from __future__ import annotations

import statistics
import sys

from harness import DISTRAIN, WORKLOAD, alternate, bench_line

from . import Options


def run(options: Options) -> dict:
    reps, smoke = options.reps, options.smoke
    work = ["--steps", "3", "--warmup", "1"]
    samples = alternate({
        "distrain run": lambda: bench_line([DISTRAIN, "run", WORKLOAD, *work], extra_env={"DISTRAIN_KERAS": "keras3"}),
        "python": lambda: bench_line([sys.executable, WORKLOAD, "--handmade", "single", "--keras", "keras3", *work]),
    }, reps)
    first = {name: statistics.median(r["first_step"] - started for r, started in runs)
             for name, runs in samples.items()}
    return {"distrain_s": first["distrain run"], "python_s": first["python"],
            "ratio": first["distrain run"] / first["python"], **startup_by_workers(reps, smoke)}



PHASES = (("process and plan", "process_start", "phase_plan"), ("TensorFlow import", "phase_plan", "phase_tensorflow"),
          ("strategy and rendezvous", "phase_tensorflow", "phase_strategy"),
          ("script to first step", "phase_strategy", "first_step"))


def startup_by_workers(reps: int, smoke: bool) -> dict:
    """Rank 0's start-up phases under `distrain launch -n N` for N = 1, 2, 4, 8 (medians), and how the time to
    the first step grows with each added worker (least-squares slope)."""
    counts = (1, 2) if smoke else (1, 2, 4, 8)
    work = ["--steps", "3", "--warmup", "1"]
    table: dict[str, dict] = {}
    for count in counts:
        runs = [bench_line([DISTRAIN, "launch", "-n", str(count), WORKLOAD, *work],
                           extra_env={"DISTRAIN_KERAS": "keras3"})[0] for _ in range(max(1, min(reps, 3)))]
        table[f"{count} worker(s)"] = {name: statistics.median(r[end] - r[begin] for r in runs)
                                       for name, begin, end in PHASES}
        table[f"{count} worker(s)"]["total"] = statistics.median(r["first_step"] - r["process_start"] for r in runs)
    totals = [table[f"{n} worker(s)"]["total"] for n in counts]
    mean_n, mean_t = statistics.mean(counts), statistics.mean(totals)
    slope = (sum((n - mean_n) * (t - mean_t) for n, t in zip(counts, totals))
             / sum((n - mean_n) ** 2 for n in counts))
    return {"phases_s_by_workers": table, "seconds_per_added_worker": slope}

