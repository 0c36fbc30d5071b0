"""distrain's developer benchmarks: ratios measured side by side in one run, over repetitions.

    .venv/bin/python benchmarks/run.py all            (by hand: results in benchmarks/results/)
    .venv/bin/python benchmarks/run.py overhead --reps 9
    .venv/bin/python benchmarks/run.py overhead --only mwm --reps 3      (re-measure some of its rows)
    .venv/bin/python benchmarks/run.py overhead --only mwm --one-after-other   (a worker to a core, one side at a time)
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
           step observers against a batch callback (benchmarks/step_observers.py: CPU and Python calls a step), its
           whole fit against the plain fit it wraps inside the same two MWM workers (their fits alternating, with
           a known 1% as the positive control: benchmarks/fit_in_process.py), and its input rewrites as pipelines
           alone against plain tf.data at a high batch rate, in one process (epochs alternating; a control row runs
           plain tf.data against itself), one such process on each core; `input` runs only these, `fit` only
           fit_in_process
startup    time to the first training step: distrain run vs python; and per phase (process and plan, TensorFlow's
           import, strategy and rendezvous, the script to its first step) for 1, 2, 4 and 8 local workers
scaling    epoch time with 2 workers against 1 on the same numpy data (each worker one core, one intra-op thread):
           MWM and zero-code Horovod through distrain, and Horovod hand-written with sharding as its examples do
container  apptainer run (the image) vs the same work in the host venv, where an image exists
comm       all-reduce time against tensor size: MWM ring vs Horovod Gloo vs Horovod MPI, 2 local workers
Side by side (overhead): the two variants run at the same time, each with all its processes on one core,
then swapped (side_by_side); Horovod's row one after the other, each rank on a core of its own (one_after_other:
two Horovod ranks on one core make its coordination bistable; `--one-after-other`: every row so). Elsewhere the
variants alternate within each repetition. Every ratio comes with its spread, the lowest and highest of the
per-repetition ratios.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DISTRAIN = str(BIN / "distrain")
WORKLOAD = str(ROOT / "benchmarks" / "workload.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-x", "PATH", "-mca", "btl_tcp_if_include", "lo",
          "-mca", "oob_tcp_if_include", "lo"]
TARGETS = {"overhead": ">= 0.99 (throughput and CPU ratios)", "startup": "<= 1.05 (time ratio)",
           "perstep": "input ratios >= 0.99; callbacks a small share of a step",
           "input": "every ratio >= 0.99, as the control row",
           "fit": "distrain >= 0.99 of the plain fit; spin 1% (the positive control) about 0.99",
           "container": ">= 0.98 (throughput ratio)",
           "scaling": ">= 1.8 speed-up through distrain; zero-code Horovod within 2% of hand-written"}
FAMILIES = ("keras3", "legacy")
# one intra-op thread per worker and fixed pool sizes, so a pool is sized the same whether TensorFlow started
# before the workload pinned its threads (under distrain) or after (by hand)
PINNED = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "1"}
SPIN = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nt = time.perf_counter()\n" \
       "x = sum(i * i for i in range(6_000_000))\nprint('BENCH {\"epoch_s\": %f}' % (time.perf_counter() - t))\n"


def env() -> dict[str, str]:
    skip = ("SLURM_", "OMPI_", "PMI", "HOROVOD_", "DISTRAIN_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    base.pop("TF_CONFIG", None)
    base.update(PATH=f"{BIN}:{base.get('PATH', '')}", TF_CPP_MIN_LOG_LEVEL="2", DISTRAIN_CHECKPOINT="0",
                PYTHONUNBUFFERED="1")
    return base


def children_cpu() -> float:
    """User + system CPU seconds of every child process that ended so far, and of theirs (the kernel's account)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_line(cmd: list[str], tag: str = "BENCH", extra_env: dict | None = None) -> tuple[dict, float]:
    """Run a command; return the JSON its chief printed after `tag` (with `cpu_s`: the CPU seconds of all its
    processes) and the wall time it was started at."""
    started, cpu = time.time(), children_cpu()
    out = subprocess.run(cmd, env={**env(), **(extra_env or {})}, cwd=ROOT, text=True, timeout=900,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in out.stdout.splitlines():
        if f"{tag} " in line:
            return {**json.loads(line.split(f"{tag} ", 1)[1]), "cpu_s": children_cpu() - cpu}, started
    raise RuntimeError(f"{' '.join(cmd)} printed no {tag} line (exit {out.returncode}):\n{out.stdout[-3000:]}")


def alternate(variants: dict, reps: int) -> dict[str, list]:
    samples: dict[str, list] = {name: [] for name in variants}
    for _ in range(reps):
        for name, run in variants.items():
            samples[name].append(run())
    return samples


def spread(numerators: list[float], denominators: list[float]) -> dict:
    """The median of the per-repetition ratios, with the lowest and highest. Each repetition ran both variants
    side by side or back to back, so a pair shares its seconds of the machine; the ratio of the two medians would
    set one repetition's value against another's, and a VM's cost moves by up to 8% from one repetition to the
    next (benchmarks/results/overhead-mwm-legacy-epyc-1127.json: 0.983 that way, 1.012 paired)."""
    per_rep = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {"ratio": statistics.median(per_rep), "ratio_min": min(per_rep), "ratio_max": max(per_rep)}


def _last_error(output: str) -> str:
    errors = [line for line in output.splitlines() if "Error" in line]
    return (errors or output.splitlines() or ["?"])[-1][:300]


ACCOUNT = str(ROOT / "benchmarks" / "account.py")
BY_HAND_MWM = str(ROOT / "benchmarks" / "by_hand_mwm.py")
CONTROL = "control: mwm x2 (legacy) hand-written against itself"  # an overhead row: no distrain on either side


def account_line(output: str) -> dict:
    """What benchmarks/account.py printed last (`ACCOUNT {"cpu_s", "returncode"}`), or {} where it printed none."""
    lines = output.splitlines()
    return json.loads(lines[-1].split("ACCOUNT ", 1)[1]) if lines and "ACCOUNT " in lines[-1] else {}


def side_by_side(first: tuple[list[str], dict], second: tuple[list[str], dict],
                 swap: bool = True) -> tuple[list[dict], list[dict]]:
    """Run two commands at once, each confined to one core (benchmarks/account.py), twice: then on each other's
    core (`swap=False`, for smoke runs: once). Both live through the same seconds of the machine (a VM's
    neighbours and clock move both alike, which alternating runs cannot give: a pure-Python loop run alone varies
    by 6-10% from run to run here, two at once on the two cores by 2%), and a difference between the cores
    cancels out, as does which side starts first. Returns each command's BENCH lines, one per pass, each with
    `cpu_s`: the CPU seconds of all its processes, `wall_s`: its wall time, and `core`."""
    results: list[list[dict]] = [[], []]
    orders = ((0, 1), (1, 0)) if (os.cpu_count() or 1) > 1 else ((0, 0), (0, 0))
    for cores in orders if swap else orders[:1]:
        with tempfile.TemporaryFile(mode="w+") as out_first, tempfile.TemporaryFile(mode="w+") as out_second:
            outputs = (out_first, out_second)
            started = time.monotonic()
            procs: dict[int, subprocess.Popen] = {}
            # the side on the lower core starts first, a few ms ahead: over both orders, each side once
            for side in sorted(range(2), key=lambda side: cores[side]):
                cmd, extra = (first, second)[side]
                procs[side] = subprocess.Popen([sys.executable, ACCOUNT, str(cores[side]), *cmd],
                                               env={**env(), **extra}, cwd=ROOT, text=True, stdout=outputs[side],
                                               stderr=subprocess.STDOUT)
            walls = wait_all([procs[0], procs[1]], started, timeout=1800)
            for output, result, (cmd, _), core, wall in zip(outputs, results, (first, second), cores, walls):
                output.seek(0)
                result.append(accounted_pass(cmd, output.read(), wall, core))
    return results[0], results[1]


def accounted_pass(cmd: list[str], output: str, wall: float, core: int | str) -> dict:
    """One pass of a command run under benchmarks/account.py: its chief's BENCH line, with `cpu_s` (the CPU seconds
    of all its processes), `wall_s` and `core`; a RuntimeError with the output's tail where it printed no BENCH
    line or failed."""
    lines = output.splitlines()
    bench = [line.split("BENCH ", 1)[1] for line in lines if "BENCH " in line]
    account = account_line(output)
    if not bench or account.get("returncode"):
        raise RuntimeError(f"{' '.join(cmd)} printed no BENCH line (exit {account.get('returncode')}):\n"
                           + "\n".join(lines[-40:]))
    return {**json.loads(bench[0]), "cpu_s": account["cpu_s"], "wall_s": wall, "core": core}


def one_after_other(first: tuple[list[str], dict], second: tuple[list[str], dict],
                    swap: bool = True) -> tuple[list[dict], list[dict]]:
    """Run two commands one after the other, each alone on every core, a worker to a core (workload.py --pin):
    first then second, then (`swap`) second then first. For Horovod: two of its ranks on one core, as
    `side_by_side` gives them, make its coordination bistable. Each rank's background thread negotiates with the
    other every HOROVOD_CYCLE_TIME (1 ms); where a round trip through the shared core takes longer than that, the
    threads never sleep and Gloo's receiving loop spins (perf: gloo::transport::tcp::Loop in epoll_wait, 8-9 CPU s
    of a 300-step run against 1-1.5 s). A run falls into that state or not at random, distrain's or not: CPU per
    run 52 or 89 s for the same steps. A core to each rank, as on a real node, never shows it."""
    results: list[list[dict]] = [[], []]
    cores = ",".join(str(core) for core in range(os.cpu_count() or 1))
    order = ((0, first), (1, second))
    for index, (cmd, extra) in (*order, *reversed(order)) if swap else order:
        started = time.monotonic()
        out = subprocess.run([sys.executable, ACCOUNT, cores, *cmd], env={**env(), **extra}, cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
        results[index].append(accounted_pass(cmd, out.stdout, time.monotonic() - started, cores))
    return results[0], results[1]


def wait_all(procs: list[subprocess.Popen], started: float, timeout: float) -> list[float]:
    """Wait for every process; return each one's wall time from `started` (monotonic), to 0.1 s."""
    ended: dict[int, float] = {}
    while len(ended) < len(procs):
        if time.monotonic() - started > timeout:
            raise subprocess.TimeoutExpired([str(p.args) for p in procs], timeout)
        ended.update({i: time.monotonic() - started for i, proc in enumerate(procs)
                      if i not in ended and proc.poll() is not None})
        time.sleep(0.1)
    return [ended[i] for i in range(len(procs))]


def one_pass(bench: dict) -> dict:
    """What a row keeps of each pass of one side: its core, wall time, throughput, CPU of every process, the chief's
    steps alone. CPU seconds to the microsecond, as the kernel gives them: rounded to the millisecond, a smoke
    run's two lengths could read the same CPU, a per-step CPU of 0 (CI of 2026-11-27)."""
    return {"core": bench["core"], **{key: round(bench[key], 3) for key in ("wall_s", "images_per_sec")},
            **{key: round(bench[key], 6) for key in ("cpu_s", "steady_cpu_s")}}


def overhead_row(passes: list[dict]) -> dict:
    """An overhead row's figures from its passes (`overhead`). Per repetition, each side's mean over its passes
    (both core orders) at each run length; per run: the longer run; per step: the CPU difference over the extra
    steps; fixed: what is left of a run once its steps are paid. Each ratio is hand-written over distrain
    (>= 1: distrain costs nothing), paired within the repetition (`spread`). Throughput only where the passes
    hold it (results written before 2026-11-27 did not keep it)."""
    lengths = sorted({p["steps"] for p in passes})
    short, long = lengths[0], lengths[-1]
    reps = sorted({p["rep"] for p in passes})

    def mean(side: str, rep: int, steps: int, key: str) -> float:
        return statistics.mean(p[side][key] for p in passes if p["rep"] == rep and p["steps"] == steps)

    def per_rep(key: str, steps: int = long) -> dict[str, list[float]]:
        return {side: [mean(side, rep, steps, key) for rep in reps] for side in ("distrain", "hand-written")}

    per_run, short_runs, steady = per_rep("cpu_s"), per_rep("cpu_s", short), per_rep("steady_cpu_s")
    per_step = {side: [(b - a) / (long - short) for a, b in zip(short_runs[side], per_run[side])]
                for side in per_run}
    fixed = [(d - long * ds) - (h - long * hs) for d, ds, h, hs in
             zip(per_run["distrain"], per_step["distrain"], per_run["hand-written"], per_step["hand-written"])]
    row: dict = {"steps": long}
    if all("images_per_sec" in p[side] for p in passes for side in ("distrain", "hand-written")):
        speed = per_rep("images_per_sec")
        row |= {"distrain_images_per_sec": statistics.median(speed["distrain"]),
                "handwritten_images_per_sec": statistics.median(speed["hand-written"]),
                **spread(speed["distrain"], speed["hand-written"])}
    # the same samples trained on both sides: CPU per sample compares as CPU per run (or per step)
    for name, values in (("cpu", per_run), ("cpu_per_step", per_step), ("cpu_steady", steady)):
        try:
            ratios = spread(values["hand-written"], values["distrain"])
        except ZeroDivisionError:
            zero = values["distrain"]
            raise ValueError(f"{name}: distrain's side measured 0 CPU s in a repetition ({zero})") from None
        row |= {f"{name}_{key}": value for key, value in ratios.items()}
    return row | {"distrain_cpu_s": statistics.median(per_run["distrain"]),
                  "handwritten_cpu_s": statistics.median(per_run["hand-written"]),
                  "distrain_extra_cpu_s_per_run": statistics.median(fixed), "passes": passes}


def steady_cpu(bench: dict) -> float:
    """The chief's CPU seconds (every thread of its process) from the end of the warm-up to the last step: the
    steps alone, without the start-up and the interpreter's teardown, whose CPU moves by ±0.5 s a process from
    pass to pass (workload.py's marks)."""
    marks = bench["cpu_s_at"]
    return marks["last_step"] - marks["warmed_up"]


def overhead(reps: int, smoke: bool, only: str = "", every_row_one_after_other: bool = False) -> dict:
    """Each mode through distrain against the same work hand-written, side by side (`side_by_side`; Horovod one
    after the other, `one_after_other`). Each pair runs at two lengths: the whole longer run gives the CPU per run
    (start-up and the checkpoint at the epoch end included), and the CPU difference over the extra steps the CPU
    per step, where a run's fixed costs cancel out; what is left is distrain's extra CPU per run, in seconds.
    `every_row_one_after_other`: every row as Horovod's (to see whether a worker to a core resolves a row
    better on a given VM)."""
    lengths = (8, 24) if smoke else (300, 1200)
    work = ["--warmup", "3" if smoke else "20", "--pin"]
    state = tempfile.mkdtemp(prefix="distrain-bench-")
    default = {"DISTRAIN_CHECKPOINT": "1", "DISTRAIN_OUTPUT_DIR": state}  # what a user gets: checkpoints on
    python = [sys.executable, WORKLOAD]
    pairs: dict[str, tuple] = {}
    for family in FAMILIES:
        ours, hand = {"DISTRAIN_KERAS": family, **PINNED, **default}, ["--keras", family]
        pairs[f"single ({family})"] = (([DISTRAIN, "run", WORKLOAD, *work], ours),
                                       ([*python, "--handmade", "single", *hand, *work], PINNED))
        # Keras 3's MWM fit fails by hand without the upstream fixes distrain applies (tensorflow#72388): the
        # hand-written baseline applies them itself (--upstream-fixes), nothing else
        fixes = ["--upstream-fixes"] if family == "keras3" else []
        by_hand = ([sys.executable, BY_HAND_MWM, *python, "--handmade", "mwm", *hand, *fixes, *work], PINNED)
        pairs[f"mwm x2 ({family})"] = (([DISTRAIN, "launch", "-n", "2", WORKLOAD, *work], ours), by_hand)
        if family == "legacy":
            # the method's resolution: the same hand-written command on both sides, where any ratio but 1 is the
            # machine's (the two cores, the hour), not distrain's
            pairs[CONTROL] = (by_hand, by_hand)
    # Horovod's Keras API drives tf_keras only (horovod#4290): there is no hand-written Keras 3 Horovod script
    horovodrun = ["horovodrun", "-np", "2", "--gloo"]
    pairs["horovod x2 (legacy)"] = (([*horovodrun, DISTRAIN, "run", WORKLOAD, *work],
                                     {"DISTRAIN_KERAS": "legacy", **PINNED, **default}),
                                    ([*horovodrun, *python, "--handmade", "horovod", "--keras", "legacy", *work],
                                     PINNED))
    if not any(only in mode for mode in pairs):
        raise SystemExit(f"run.py: error: no overhead row's name holds {only!r}: the rows are {', '.join(pairs)}")
    rows = {}
    short, long = (["--steps", str(n)] for n in lengths)
    for mode, ((ours_cmd, ours_env), (hand_cmd, hand_env)) in pairs.items():
        if only not in mode:
            continue
        passes: list[dict] = []  # every pass as measured, so that an outlier can be named afterwards
        try:
            run_pair = one_after_other if every_row_one_after_other or mode.startswith("horovod") else side_by_side
            for rep in range(reps):
                for steps in (short, long):
                    sides = [[{**p, "steady_cpu_s": steady_cpu(p)} for p in side] for side in
                             run_pair(([*ours_cmd, *steps], ours_env), ([*hand_cmd, *steps], hand_env),
                                      swap=not smoke)]
                    passes += [{"rep": rep, "steps": int(steps[1]), "distrain": one_pass(ours_pass),
                                "hand-written": one_pass(hand_pass)} for ours_pass, hand_pass in zip(*sides)]
        except RuntimeError as exc:
            rows[mode] = {"skipped": f"a variant failed: {_last_error(str(exc))}"}
            continue
        try:
            rows[mode] = overhead_row(passes)
        except ValueError as exc:  # the row's passes are kept, the other rows still run
            rows[mode] = {"skipped": f"no ratio: {exc}", "passes": passes}
    shutil.rmtree(state, ignore_errors=True)
    return rows


def cpu_ceiling() -> float:
    """Pure Python on each core: the time one process takes over the time two at once take (2.0 on two free
    cores; less where the cores are shared with the host's other guests)."""
    def spin(*cores: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(c)], stdout=subprocess.PIPE, text=True)
                 for c in cores]
        return max(json.loads(p.communicate()[0].split("BENCH ", 1)[1])["epoch_s"] for p in procs)

    return 2 * spin(0) / spin(0, 1 % (os.cpu_count() or 1))


def scaling(reps: int, smoke: bool) -> dict:
    """Speed-up of 2 workers over 1 in epoch time, the same numpy data and global batch (tf_keras: the family
    hand-written Horovod can use), next to what the machine's cores allow."""
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


def startup(reps: int, smoke: bool) -> dict:
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


INPUT_PIPELINES = ("control: plain tf.data against itself", "positioned numpy (exact resume) vs Keras' own",
                   "positioned numpy (exact resume) vs from_tensor_slices", "even last batch (MWM), last batch splits",
                   "even last batch (MWM), last batch of 1 topped up", "rank slices (Horovod)")


def _per_step(hook: str) -> bool:
    """A batch hook, or the step observers called after each train-function call (entrypoint/fit/steps.py)."""
    return "_batch_" in hook or hook.startswith("StepEnds.")


def hooks_in_place(smoke: bool) -> dict:
    """distrain's callbacks timed in place (workload.py --time-hooks): `distrain launch -n 2`, both workers on one
    core as in `overhead`, for each Keras family. Per worker: each per-step hook's CPU per call, each once-a-run
    hook's CPU, all hooks' CPU per run and their share of the run's CPU (every process of it)."""
    steps, workers = (24 if smoke else 1200), 2
    rows = {}
    for family, label in (("keras3", "Keras 3"), ("legacy", "tf_keras")):
        with tempfile.TemporaryDirectory(prefix="distrain-hooks-") as state:
            out = subprocess.run([sys.executable, ACCOUNT, "0", DISTRAIN, "launch", "-n", str(workers), WORKLOAD,
                                  "--pin", "--warmup", "20", "--steps", str(steps), "--time-hooks"], cwd=ROOT,
                                 text=True, env={**env(), "DISTRAIN_KERAS": family, "DISTRAIN_CHECKPOINT": "1",
                                                 "DISTRAIN_OUTPUT_DIR": state, **PINNED},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900).stdout
        ranks = [json.loads(line.split("HOOKS ", 1)[1]) for line in out.splitlines() if "HOOKS " in line]
        account = account_line(out)
        if len(ranks) != workers or not account or account["returncode"]:
            raise RuntimeError(f"distrain launch --time-hooks failed:\n{out[-3000:]}")
        names = sorted({name for rank in ranks for name in rank["hooks"]})
        mean = {name: statistics.mean(rank["hooks"].get(name, [0.0, 0])[0] for rank in ranks) for name in names}
        calls = {name: max(rank["hooks"].get(name, [0.0, 0])[1] for rank in ranks) for name in names}
        per_worker = sum(mean.values())
        rows[label] = {
            "steps": steps + 20,
            "per_step_hook_us": {name: 1e6 * mean[name] / calls[name] for name in names
                                 if _per_step(name) and calls[name]},
            "once_a_run_ms": {name: 1e3 * mean[name] for name in names if not _per_step(name)},
            "all_hooks_ms_per_worker": 1e3 * per_worker,
            "share_of_run_cpu": workers * per_worker / account["cpu_s"],
        }
    return rows


def perstep(reps: int, smoke: bool) -> dict:
    """distrain's per-step work alone: its callbacks' cost per step against the workload's median step, and its
    input rewrites against plain tf.data (input_pipelines; ratio >= 1: as fast)."""
    script = str(ROOT / "benchmarks" / "perstep.py")
    options = ["--reps", "2" if smoke else "5", *(["--smoke"] if smoke else [])]
    hooks = {}
    for family, label in (("keras3", "Keras 3"), ("legacy", "tf_keras")):  # each family has its checkpoint callback
        with tempfile.TemporaryDirectory(prefix="distrain-perstep-") as state:
            data, _ = bench_line([DISTRAIN, "run", script, "callbacks", *options],
                                 extra_env={"DISTRAIN_KERAS": family, "DISTRAIN_CHECKPOINT": "1",
                                            "DISTRAIN_OUTPUT_DIR": state, **PINNED})
        hooks.update({f"{name} ({label})": us for name, us in data["callbacks_us_per_step"].items()})
    step, _ = bench_line([DISTRAIN, "run", WORKLOAD, "--steps", "8" if smoke else "100", "--warmup", "3", "--pin"],
                         extra_env={"DISTRAIN_KERAS": "keras3", **PINNED})
    step_s = 64 / step["images_per_sec"]
    callbacks = {name: {"us_per_step": us, "share_of_step": us * 1e-6 / step_s}
                 for name, us in hooks.items()}
    return {"workload_step_ms": 1000 * step_s, "callbacks": callbacks, "callbacks_in_place": hooks_in_place(smoke),
            "fit_in_process": fit_in_process(smoke), "observers": step_observers(reps, smoke),
            "input": input_pipelines(reps, smoke)}


def fit_in_process(smoke: bool) -> dict:
    """distrain's fit against the plain fit it wraps, their fits alternating inside the same two workers of
    `distrain launch -n 2`, one core each (benchmarks/fit_in_process.py), for each Keras family: per variant, the
    ratio of the plain fit's CPU per step to the variant's (>= 1: costs nothing; a median over both workers'
    rounds, with the lowest and highest), and the training thread's extra CPU per step (median). `spin 1%` is the
    positive control: a known 1% of the step the measure must show as about 0.99."""
    # a fit's end waits for TensorFlow's input teardown under MWM (up to the next ~10 s tick here, more after many
    # fits): 4 rounds, 8 paired rounds a variant over both workers
    options = ["--rounds", "2", "--steps", "10", "--warmup", "3"] if smoke else ["--rounds", "4", "--steps", "300"]
    rows = {}
    for family, label in (("keras3", "Keras 3"), ("legacy", "tf_keras")):
        with tempfile.TemporaryDirectory(prefix="distrain-fit-in-process-") as state:
            out = subprocess.run([sys.executable, ACCOUNT, "0,1", DISTRAIN, "launch", "-n", "2",
                                  str(ROOT / "benchmarks" / "fit_in_process.py"), *options], cwd=ROOT, text=True,
                                 env={**env(), "DISTRAIN_KERAS": family, "DISTRAIN_CHECKPOINT": "1",
                                      "DISTRAIN_OUTPUT_DIR": state, **PINNED},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800).stdout
        ranks = [json.loads(line.split("FIT_IN_PROCESS ", 1)[1]) for line in out.splitlines()
                 if "FIT_IN_PROCESS " in line]
        if len(ranks) != 2:
            raise RuntimeError(f"fit_in_process.py failed:\n{out[-3000:]}")
        def rounds(variant: str, key: str, ranks: list[dict] = ranks) -> list[float]:
            return [ms for rank in ranks for ms in rank["per_step"][variant][key]]  # both workers' rounds

        plain, plain_thread = rounds("plain", "process_ms"), rounds("plain", "thread_ms")
        row: dict = {"plain_ms_per_step": statistics.median(plain),
                     "spin_ms_per_step": statistics.mean(rank["spin_ms"] for rank in ranks),
                     "distrain_fits": min(rank["distrain_fits"] for rank in ranks), "rounds": len(plain),
                     "fit_wall_s": statistics.median(s for r in ranks for v in r["per_step"].values()
                                                     for s in v["fit_wall_s"])}
        for variant in ranks[0]["per_step"]:
            if variant != "plain":
                extra = [b - a for a, b in zip(plain_thread, rounds(variant, "thread_ms"))]
                row[variant] = {**{f"cpu_{key}": value for key, value in
                                   spread(plain, rounds(variant, "process_ms")).items()},
                                "thread_extra_ms_per_step": statistics.median(extra)}
        rows[label] = row
    return rows


def step_observers(reps: int, smoke: bool) -> dict:
    """distrain's per-step work as a batch callback, as a train-function observer (entrypoint/fit/steps.py), and
    neither, in one process on one core (benchmarks/step_observers.py), for each Keras family: the training
    thread's CPU and its Python calls per step, each way."""
    script = str(ROOT / "benchmarks" / "step_observers.py")
    options = ["--reps", str(max(reps, 3)), "--steps", "200" if smoke else "2000"]
    rows = {}
    for family, label in (("keras3", "Keras 3"), ("legacy", "tf_keras")):
        rows[label], _ = bench_line(["taskset", "-c", "0", sys.executable, script, *options], "OBSERVERS",
                                    {"TF_USE_LEGACY_KERAS": str(int(family == "legacy")), **PINNED})
    return rows


def input_pipelines(reps: int, smoke: bool) -> dict:
    """Each input rewrite against its baseline pipeline (benchmarks/perstep.py input: both in one process, their
    epochs alternating), one such process on each core at once: 2 x `reps` samples. The baseline's median epoch
    over the rewrite's (>= 1: as fast), in CPU seconds (`cpu_ratio`) and wall seconds (`ratio`), with the lowest
    and highest per-process ratios."""
    script = str(ROOT / "benchmarks" / "perstep.py")
    options = ["--reps", "2" if smoke else "7", *(["--smoke"] if smoke else [])]
    inputs = {}
    for name in INPUT_PIPELINES:
        command = ([sys.executable, script, "input", name, *options], PINNED)
        samples = [p for _ in range(reps) for passes in side_by_side(command, command, swap=False) for p in passes]
        wall = spread([s["baseline_epoch_s"] for s in samples], [s["rewrite_epoch_s"] for s in samples])
        cpu = spread([s["baseline_epoch_cpu_s"] for s in samples], [s["rewrite_epoch_cpu_s"] for s in samples])
        inputs[name] = {**{f"cpu_{key}": value for key, value in cpu.items()}, **wall,
                        "batches_per_s": statistics.median(s["batches_per_s"] for s in samples)}
    return inputs


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
    work = ["--sizes", "1000,100000" if smoke else "1000,100000,1000000,4000000", "--reps", "3" if smoke else "20",
            "--stop-checks", "10" if smoke else "100"]
    runs = {
        "mwm ring": ([DISTRAIN, "launch", "-n", "2", script, *work], {"DISTRAIN_COLLECTIVE": "ring"}),
        "horovod gloo": (["horovodrun", "-np", "2", "--gloo", DISTRAIN, "run", script, *work], {}),
        "horovod mpi": ([*MPIRUN, DISTRAIN, "run", script, *work], {}),
    }
    table: dict[str, dict] = {}
    stop_check: dict = {}
    for name, (cmd, extra) in runs.items():
        line = bench_line(cmd, "ALLREDUCE", extra)[0]
        table[name] = line["ms"]
        stop_check = stop_check or line.get("stop_check") or {}
    # the stop check's CPU per call (process, the chief): distrain's eager launcher against the public tf.function
    return {"allreduce_ms_by_elements": table, "stop_check (mwm)": stop_check}


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


def compile_as_installed() -> None:
    """Give distrain's modules the bytecode an installed distrain has. `pip install` (the image) compiles it; an
    editable install under PYTHONDONTWRITEBYTECODE=1 (this machine's shell sets it) has none, so every process
    would compile distrain from source, about 23 ms of CPU each (3 in a 2-worker MWM run), which no user pays and
    no hand-written baseline does."""
    compileall.compile_dir(str(ROOT / "entrypoint"), quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["overhead", "perstep", "input", "fit", "scaling", "startup", "container",
                                          "comm", "all"])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repetition: checks it runs")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="overhead: only the rows whose name holds TEXT (\"mwm\", \"keras3\"), to re-measure them")
    parser.add_argument("--one-after-other", action="store_true",
                        help="overhead: every row one after the other, a worker to a core, as Horovod's row always")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--sif", default=os.environ.get("DISTRAIN_BENCH_SIF", "/var/cache/distrain/distrain-test.sif"))
    opts = parser.parse_args()
    reps = 1 if opts.smoke else opts.reps
    chosen = (["overhead", "perstep", "scaling", "startup", "container", "comm"] if opts.which == "all"
              else [opts.which])
    compile_as_installed()
    results = {"machine": machine(), "reps": reps, "smoke": opts.smoke}
    for name in chosen:
        started = time.monotonic()
        if name == "container":
            data = container(reps, opts.smoke, opts.sif)
        elif name == "overhead":
            data = overhead(reps, opts.smoke, opts.only, opts.one_after_other)
        elif name == "input":
            data = input_pipelines(reps, opts.smoke)
        elif name == "fit":
            data = fit_in_process(opts.smoke)
        else:
            data = globals()[name](reps, opts.smoke)
        results[name] = data
        print(report(name, data) + f"\n  ({time.monotonic() - started:.0f} s)", flush=True)
    os.makedirs(opts.out, exist_ok=True)
    path = Path(opts.out) / f"{'smoke-' if opts.smoke else ''}{opts.which}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
