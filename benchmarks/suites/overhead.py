"""overhead: distrain run/launch against the same work hand-written for the mode (benchmarks/run.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile

from harness import BY_HAND_MWM, DISTRAIN, PINNED, WORKLOAD, last_error, one_after_other, side_by_side
from ratios import one_pass, overhead_row, steady_cpu

from . import Options

FAMILIES = ("keras3", "legacy")


CONTROL = "control: mwm x2 (legacy) hand-written against itself"  # an overhead row: no distrain on either side



def run(options: Options) -> dict:
    """Each mode through distrain against the same work hand-written, side by side (`side_by_side`; Horovod one
    after the other, `one_after_other`). Each pair runs at two lengths: the whole longer run gives the CPU per run
    (start-up and the checkpoint at the epoch end included), and the CPU difference over the extra steps the CPU
    per step, where a run's fixed costs cancel out; what is left is distrain's extra CPU per run, in seconds.
    `every_row_one_after_other`: every row as Horovod's (to see whether a worker to a core resolves a row
    better on a given VM)."""
    reps, smoke, only = options.reps, options.smoke, options.only
    every_row_one_after_other = options.one_after_other
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
            rows[mode] = {"skipped": f"a variant failed: {last_error(str(exc))}"}
            continue
        try:
            rows[mode] = overhead_row(passes)
        except ValueError as exc:  # the row's passes are kept, the other rows still run
            rows[mode] = {"skipped": f"no ratio: {exc}", "passes": passes}
    shutil.rmtree(state, ignore_errors=True)
    return rows

