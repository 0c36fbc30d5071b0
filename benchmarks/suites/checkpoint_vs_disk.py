"""checkpoint-vs-disk: what distrain's checkpoint costs against the disk's own speed, in one run of this suite:

    .venv/bin/python benchmarks/run.py checkpoint-vs-disk [--reps 5] [--smoke]

For models of about 10 MB, 100 MB and 1 GB (weights and Adam's two slots), one `distrain run` each of
benchmarks/workers/checkpoint_vs_disk.py: a timed checkpoint every few steps and, after each, the same bytes
written raw in the same directory (numpy, fsync, temp file and rename), alternating, `reps` times after a first
pair reported apart (Keras' save warm-up; the 10 MB model SMALL_REPS_FACTOR times as many). Per size:
`write_ratio`, distrain's write over the raw write (the median of the per-repetition ratios, with their lowest and
highest); `blocked_ratio`, the training time the checkpoint blocked (the pause between the steps around it less the
median pause, plus the steps run beside its write less the median quiet step: the worker's docstring) over the raw
write, and those two parts; the
milliseconds per MB of each. The 100 MB model also under MWM x2 and Horovod x2 (the chief writes; its figures).
Each single-process size twice, side by side: written off the training's path (the default) and in place
(DISTRAIN_CHECKPOINT_ASYNC=0, the rows named "in place"); the middle size so again for a tf_keras script.
Goal (#87): write_ratio <= 1.2 and blocked_ratio <= 0.1 for each size and mode.
"""

from __future__ import annotations

import statistics
import tempfile

from harness import DISTRAIN, MPIRUN, WORKERS, bench_line

from . import Options

SCRIPT = str(WORKERS / "checkpoint_vs_disk.py")
SIZES_MB = {"10 MB": 10, "100 MB": 100, "1 GB": 1000}
MODES = {"single": [DISTRAIN, "run"], "mwm x2": [DISTRAIN, "launch", "-n", "2"],
         "horovod x2": [*MPIRUN, DISTRAIN, "run"]}
EVERY = 8  # steps between checkpoints: 5 beside the write, 1 after the raw write, 2 the baseline (the worker's)
# repetitions of the 10 MB model, times --reps: its checkpoint costs the training a few ms against a 20 ms raw
# write, where a step's own jitter is a millisecond or two (5 repetitions' medians of the step after the snapshot
# ranged 0.10-0.31 in one hour)
SMALL_REPS_FACTOR = 4


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(launcher: list[str], mb: float, reps: int, in_background: bool = True, tf_keras: bool = False) -> dict:
    """One run of the worker with reps + 1 checkpoints: the first pair apart, then the ratios."""
    with tempfile.TemporaryDirectory(prefix="distrain-ckptdisk-") as state:
        found, _ = bench_line([*launcher, SCRIPT, "--mb", str(mb), "--checkpoints", str(reps + 1),
                               "--every", str(EVERY)], tag="CKPTDISK",
                              extra_env={"DISTRAIN_CHECKPOINT": "1", "DISTRAIN_OUTPUT_DIR": state,
                                         "DISTRAIN_CHECKPOINT_EVERY": str(EVERY),
                                         "DISTRAIN_CHECKPOINT_ASYNC": "1" if in_background else "0",
                                         **({"TF_USE_LEGACY_KERAS": "1"} if tf_keras else {})})
    raw, blocked, written = found["raw_s"], found["blocked_s"], found["distrain_s"]
    pairs = min(len(raw), len(blocked), len(written))
    if pairs < 2:
        raise RuntimeError(f"{pairs} checkpoint(s) timed, not {reps + 1}: {found}")
    write_ratios = [written[i] / raw[i] for i in range(1, pairs)]
    blocked_ratios = [blocked[i] / raw[i] for i in range(1, pairs)]
    size = found["state_mb"]
    return {"size_mb": round(size, 1),
            "write_ratio": statistics.median(write_ratios), "write_ratio_spread": spread(write_ratios),
            "blocked_ratio": statistics.median(blocked_ratios), "blocked_ratio_spread": spread(blocked_ratios),
            "distrain_ms_per_mb": 1e3 * statistics.median(written[1:pairs]) / size,
            "raw_ms_per_mb": 1e3 * statistics.median(raw[1:pairs]) / size,
            "warmup": {"distrain_s": written[0], "blocked_s": blocked[0], "raw_s": raw[0]},
            "blocked_parts_ms": {"pause": 1e3 * statistics.median(found["held_s"][1:pairs]),
                                 "steps_beside_the_write": 1e3 * statistics.median(found["after_s"][1:pairs])},
            "step_s": found["step_s"], "pause_s": found["pause_s"], "repetitions": pairs - 1}


def run(options: Options) -> dict:
    sizes = {"1 MB": 1} if options.smoke else SIZES_MB
    reps = max(2, options.reps) if not options.smoke else 1
    rows = [{"name": f"{name}, single{'' if behind else ', in place'}",
             **measure(MODES["single"], mb, reps * SMALL_REPS_FACTOR if mb == 10 else reps, behind)}
            for name, mb in sizes.items() for behind in (True, False)]
    middle = "1 MB" if options.smoke else "100 MB"
    modes = ("mwm x2",) if options.smoke else ("mwm x2", "horovod x2")  # CI's smoke: each way the chief writes
    rows += [{"name": f"{middle}, {mode}", **measure(MODES[mode], sizes[middle], reps)} for mode in modes]
    rows += [{"name": f"{middle}, single, tf_keras{'' if behind else ', in place'}",
              **measure(MODES["single"], sizes[middle], reps, behind, tf_keras=True)}
             for behind in (True, False) if not options.smoke]  # CI's smoke: Keras 3's rows only
    return {"rows": rows, "every_steps": EVERY,
            "goal": "write_ratio <= 1.2 and blocked_ratio <= 0.1 for each size and mode"}
