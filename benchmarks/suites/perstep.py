"""perstep: distrain's own per-step work timed directly (benchmarks/run.py); `input` and `fit` run parts of it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile

from harness import ACCOUNT, DISTRAIN, PINNED, ROOT, WORKERS, WORKLOAD, account_line, bench_line, env, side_by_side
from ratios import spread

from . import Options


def run(options: Options) -> dict:
    """distrain's per-step work alone: its callbacks' cost per step against the workload's median step, and its
    input rewrites against plain tf.data (input_pipelines; ratio >= 1: as fast)."""
    reps, smoke = options.reps, options.smoke
    script = str(WORKERS / "perstep_parts.py")
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



def _per_step(hook: str) -> bool:
    """A batch hook, or the step observers called after each train-function call (entrypoint/fit/steps.py)."""
    return "_batch_" in hook or hook.startswith("TrainingPosition.")


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
                                  str(WORKERS / "fits_alternating.py"), *options], cwd=ROOT, text=True,
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
    script = str(WORKERS / "observer_ways.py")
    options = ["--reps", str(max(reps, 3)), "--steps", "200" if smoke else "2000"]
    rows = {}
    for family, label in (("keras3", "Keras 3"), ("legacy", "tf_keras")):
        rows[label], _ = bench_line(["taskset", "-c", "0", sys.executable, script, *options], "OBSERVERS",
                                    {"TF_USE_LEGACY_KERAS": str(int(family == "legacy")), **PINNED})
    return rows


INPUT_PIPELINES = ("control: plain tf.data against itself", "positioned numpy (exact resume) vs Keras' own",
                   "positioned numpy (exact resume) vs from_tensor_slices", "even last batch (MWM), last batch splits",
                   "even last batch (MWM), last batch of 1 topped up", "rank slices (Horovod)")


def input_pipelines(reps: int, smoke: bool) -> dict:
    """Each input rewrite against its baseline pipeline (benchmarks/perstep.py input: both in one process, their
    epochs alternating), one such process on each core at once: 2 x `reps` samples. The baseline's median epoch
    over the rewrite's (>= 1: as fast), in CPU seconds (`cpu_ratio`) and wall seconds (`ratio`), with the lowest
    and highest per-process ratios."""
    script = str(WORKERS / "perstep_parts.py")
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

