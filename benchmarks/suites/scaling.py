"""scaling: epoch time with 2 workers against 1 on the same data (benchmarks/run.py)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from harness import BY_HAND_MWM, DISTRAIN, PINNED, WORKLOAD, alternate, bench_line
from ratios import spread

from . import Options

SPIN = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nt = time.perf_counter()\n" \
       "x = sum(i * i for i in range(6_000_000))\nprint('BENCH {\"epoch_s\": %f}' % (time.perf_counter() - t))\n"



def cpu_ceiling() -> float:
    """Pure Python on each core: the time one process takes over the time two at once take (2.0 on two free
    cores; less where the cores are shared with the host's other guests)."""
    def spin(*cores: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(c)], stdout=subprocess.PIPE, text=True)
                 for c in cores]
        return max(json.loads(p.communicate()[0].split("BENCH ", 1)[1])["epoch_s"] for p in procs)

    return 2 * spin(0) / spin(0, 1 % (os.cpu_count() or 1))


def run(options: Options) -> dict:
    """Speed-up of 2 workers over 1 in epoch time, the same numpy data and global batch (tf_keras: the family
    hand-written Horovod can use), next to what the machine's cores allow."""
    reps, smoke = options.reps, options.smoke
    work = ["--epochs", "2" if smoke else "3", "--samples", "1024" if smoke else "8192", "--batch", "256", "--pin"]
    ours = {"DISTRAIN_KERAS": "legacy", **PINNED}
    hvd2 = ["horovodrun", "-np", "2", "--gloo"]

    def epoch(cmd: list[str], extra: dict) -> float:
        return bench_line(cmd, extra_env=extra)[0]["epoch_s"]

    runs = {
        "distrain, 1 worker": lambda: epoch([DISTRAIN, "run", WORKLOAD, *work], ours),
        "distrain mwm x2": lambda: epoch([DISTRAIN, "launch", "-n", "2", WORKLOAD, *work], ours),
        "distrain horovod x2": lambda: epoch([*hvd2, DISTRAIN, "run", WORKLOAD, *work], ours),
        "hand-written, 1 worker": lambda: epoch([sys.executable, WORKLOAD, "--handmade", "single", *work], PINNED),
        "hand-written mwm x2": lambda: epoch([sys.executable, BY_HAND_MWM, sys.executable, WORKLOAD, "--handmade",
                                              "mwm", *work], PINNED),
        "hand-written horovod x2": lambda: epoch([*hvd2, sys.executable, WORKLOAD, "--handmade", "horovod", *work],
                                                 PINNED),
        "cpu ceiling": cpu_ceiling,
    }
    samples = alternate(runs, reps)
    rows: dict[str, dict] = {name: {"epoch_s": statistics.median(times)} for name, times in samples.items()
                             if name != "cpu ceiling"}
    rows["cpu ceiling (2 pinned processes vs 1, pure Python)"] = {
        "speed_up": statistics.median(samples["cpu ceiling"]), "min": min(samples["cpu ceiling"]),
        "max": max(samples["cpu ceiling"])}
    one, hand_one = samples["distrain, 1 worker"], samples["hand-written, 1 worker"]
    for mode in ("mwm", "horovod"):
        rows[f"speed-up, distrain {mode} x2"] = spread(one, samples[f"distrain {mode} x2"])
        rows[f"speed-up, hand-written {mode} x2"] = spread(hand_one, samples[f"hand-written {mode} x2"])
        # hand-written epoch time over distrain's: 1.0 = as fast, below 1 = distrain slower
        rows[f"distrain {mode} x2 vs hand-written"] = spread(samples[f"hand-written {mode} x2"],
                                                            samples[f"distrain {mode} x2"])
    return rows

