"""distrain's developer benchmarks: ratios measured side by side in one run, over repetitions. This file is the
command line and the table of suites; the harness is harness.py, the statistics ratios.py, each suite a module of
suites/ entered as `run(options)`, and the scripts the suites run as processes are in workers/.

    .venv/bin/python benchmarks/run.py all            (by hand: results in benchmarks/results/)
    .venv/bin/python benchmarks/run.py overhead --reps 9
    .venv/bin/python benchmarks/run.py overhead --only mwm --reps 3      (re-measure some of its rows)
    .venv/bin/python benchmarks/run.py overhead --only mwm --one-after-other   (a worker to a core, one side at a time)
    .venv/bin/python benchmarks/run.py stop --reps 5
    .venv/bin/python benchmarks/run.py all --smoke --out /tmp/bench   (CI: tiny sizes, checks it all runs)

overhead   distrain run/launch (checkpoints on, as by default) vs the same work hand-written for the mode (single,
           MWM x2, Horovod x2), for each Keras family (Keras 3 MWM by hand: with the upstream fixes applied by hand),
           oneDNN as TensorFlow ships it, side by side: throughput, and the CPU seconds of every process of the run
           from the kernel's accounting, per run and per step (two run lengths: the difference is per step, the
           fixed costs left per run), and the chief's CPU over the steps alone (cpu_steady_ratio: no start-up, no
           teardown); a control row runs the hand-written MWM tf_keras command against itself the same way: the
           ratios the machine alone gives
perstep    distrain's own per-step work timed directly: its callbacks (stall watchdog, stop check) per step in a
           hot loop and in place (each hook timed inside a real 2-worker MWM fit: workload.py --time-hooks), its
           step observers against a batch callback (workers/observer_ways.py: CPU and Python calls a step), its
           whole fit against the plain fit it wraps inside the same two MWM workers (their fits alternating, with
           a known 1% as the positive control: workers/fits_alternating.py), and its input rewrites as pipelines
           alone against plain tf.data at a high batch rate, in one process (epochs alternating; a control row runs
           plain tf.data against itself), one such process on each core; `input` runs only these, `fit` only
           fit_in_process
startup    time to the first training step: distrain run vs python; and per phase (process and plan, TensorFlow's
           import, strategy and rendezvous, the script to its first step) for 1, 2, 4 and 8 local workers
scaling    epoch time with 2 workers against 1 on the same numpy data (each worker one core, one intra-op thread):
           MWM and zero-code Horovod through distrain, and Horovod hand-written with sharding as its examples do
container  apptainer run (the image) vs the same work in the host venv, where an image exists
comm       all-reduce time against tensor size: MWM ring vs Horovod Gloo vs Horovod MPI, 2 local workers
stop       what a stop costs: SIGTERM to exit 75, and process start to the first step resumed at 10 % and 90 % of an
           epoch with an expensive map (pure: skipped beneath it; random: made again), in one process, MWM x2 and
           Horovod x2; the checkpoint's write per MB; back at the stopped step against Keras' own BackupAndRestore
nodes      8 emulated nodes of a second local Slurm: MWM x8 and Horovod x8 through jobs/*.job, rank 0's start-up
           phases to its first step
checkpoint-vs-disk  distrain's checkpoint of a 10 MB, 100 MB and 1 GB model against a raw write of the same bytes
           (numpy, fsync, temp file and rename) in the same directory, alternating: the write's ratio and the
           training time it blocks, over the raw write
Side by side (overhead): the two variants run at the same time, each with all its processes on one core,
then swapped (side_by_side); Horovod's row one after the other, each rank on a core of its own (one_after_other:
two Horovod ranks on one core make its coordination bistable; `--one-after-other`: every row so). Elsewhere the
variants alternate within each repetition. Every ratio comes with its spread, the lowest and highest of the
per-repetition ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import ROOT, compile_as_installed, machine
from suites import Options, checkpoint_vs_disk, comm, container, nodes, overhead, perstep, scaling, startup, stop

SUITES: dict[str, Callable[[Options], dict]] = {
    "overhead": overhead.run, "perstep": perstep.run, "scaling": scaling.run, "startup": startup.run,
    "container": container.run, "comm": comm.run, "stop": stop.run, "nodes": nodes.run,
    "input": lambda options: perstep.input_pipelines(options.reps, options.smoke),  # parts of perstep
    "fit": lambda options: perstep.fit_in_process(options.smoke),
    "checkpoint-vs-disk": checkpoint_vs_disk.run,
}
# `all`; stop, nodes and checkpoint-vs-disk run on their own
ALL = ("overhead", "perstep", "scaling", "startup", "container", "comm")
TARGETS = {"overhead": ">= 0.99 (throughput and CPU ratios)", "startup": "<= 1.05 (time ratio)",
           "perstep": "input ratios >= 0.99; callbacks a small share of a step",
           "input": "every ratio >= 0.99, as the control row",
           "fit": "distrain >= 0.99 of the plain fit; spin 1% (the positive control) about 0.99",
           "container": ">= 0.98 (throughput ratio)",
           "scaling": ">= 1.8 speed-up through distrain; zero-code Horovod within 2% of hand-written",
           "stop": "resume at 90 % over 10 % <= 1.2 where the skip goes beneath the map",
           "checkpoint-vs-disk": "write_ratio <= 1.2, blocked_ratio <= 0.1 (each size and mode)"}


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
    parser.add_argument("which", choices=[*SUITES, "all"])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repetition: checks it runs")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="overhead: only the rows whose name holds TEXT (\"mwm\", \"keras3\"), to re-measure them")
    parser.add_argument("--one-after-other", action="store_true",
                        help="overhead: every row one after the other, a worker to a core, as Horovod's row always")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--sif", default=os.environ.get("DISTRAIN_BENCH_SIF", "/var/cache/distrain/distrain-test.sif"))
    opts = parser.parse_args()
    options = Options(reps=1 if opts.smoke else opts.reps, smoke=opts.smoke, only=opts.only,
                      one_after_other=opts.one_after_other, sif=opts.sif)
    compile_as_installed()
    results = {"machine": machine(), "reps": options.reps, "smoke": options.smoke}
    for name in ALL if opts.which == "all" else [opts.which]:
        started = time.monotonic()
        results[name] = data = SUITES[name](options)
        print(report(name, data) + f"\n  ({time.monotonic() - started:.0f} s)", flush=True)
    os.makedirs(opts.out, exist_ok=True)
    path = Path(opts.out) / f"{'smoke-' if opts.smoke else ''}{opts.which}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
