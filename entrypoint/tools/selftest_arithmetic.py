"""Does a multi-rank mode compute what one process computes? Judged from what selftest_train.py's ranks wrote in
that mode against the one-process run of the same selftest, on the same global batches: every model's weights
after every step, its loss per epoch, `evaluate`'s metrics and its final weights, within a tolerance per
precision; no loss or weight non-finite on any rank; the work split (each rank trained its share of the samples,
not all of them). Ranks that agree on a wrong number pass the sync check: this one compares with one process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .selftest_rows import FAIL, PASS, SKIP, Row

# the largest relative difference allowed, by the precision a model trained in: float32 (TF32 off) differs from
# one process only in the order of the all-reduce's sums; float16 keeps about 3 decimal digits
TOLERANCE = {"float32": 1e-4, "xla": 1e-4, "mixed_float16": 5e-2}
TINY = 1e-6  # the scale below which a difference is measured absolutely


def steps_file(directory: str) -> str:
    return os.path.join(directory, "rank0-steps.npz")


def load_steps(directory: str) -> dict:
    """Rank 0's weights after every step, by model ("float32/sgd"); {} where they were not written."""
    import numpy as np

    path = steps_file(directory)
    if not os.path.exists(path):
        return {}
    with np.load(path) as found:
        return {key.replace("__", "/"): found[key] for key in found.files}


def _relative(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), TINY)


def _first_step_apart(steps: object, reference: object, layout: list, tolerance: float) -> tuple[float, str | None]:
    """The largest relative difference over every step (against the model's largest weight at that step: a bias
    still near zero would make any rounding look large), and where the first step beyond `tolerance` is, naming
    the variable that differs most; (largest, None) where none is."""
    import numpy as np

    got, want = np.asarray(steps), np.asarray(reference)
    if got.shape != want.shape:
        return float("inf"), f"{len(got)} steps where one process ran {len(want)}"
    largest, bounds, start = 0.0, [], 0
    for name, length in layout:
        bounds.append((name, start, start + length))
        start += length
    for step in range(len(want)):
        scale = max(float(np.abs(want[step]).max(initial=0.0)), TINY)
        apart = [(float(np.abs(got[step, begin:end] - want[step, begin:end]).max(initial=0.0)) / scale, name)
                 for name, begin, end in bounds]
        difference, name = max(apart, default=(0.0, "?"))
        largest = max(largest, difference)
        if difference > tolerance:
            return largest, f"step {step + 1}: {name} differs by {difference:.1e}"
    return largest, None


def judge_arithmetic(check: str, results: list[dict], reference: Mapping | None, steps: Mapping,
                     reference_steps: Mapping) -> Row:
    """One multi-rank mode's row: `results` its ranks' records, `reference` the one-process record, `steps` and
    `reference_steps` rank 0's weights after every step in each (load_steps)."""
    name = f"{check} = one process"
    if not results or reference is None or "models" not in reference:
        return Row(name, SKIP, "the one-process run or this mode's did not finish: nothing to compare")
    for result in sorted(results, key=lambda r: r["rank"]):
        for key, model in result.get("models", {}).items():
            if model.get("error"):
                return Row(name, FAIL, f"rank {result['rank']}, model {key} failed: {model['error']}")
            if model.get("nonfinite"):
                return Row(name, FAIL, f"rank {result['rank']}, model {key}: {model['nonfinite']}")
    chief = min(results, key=lambda r: r["rank"])
    largest, compared = 0.0, 0
    for key, want in reference["models"].items():
        if want.get("error"):
            return Row(name, FAIL, f"model {key} failed in the one-process run: {want['error']}")
        got = chief.get("models", {}).get(key)
        if got is None:
            return Row(name, FAIL, f"model {key} was not trained in this mode")
        tolerance = TOLERANCE.get(key.split("/")[0], TOLERANCE["float32"])
        samples = [r["models"][key].get("samples") for r in results if key in r.get("models", {})]
        if want.get("samples") and None not in samples and (sum(samples) != want["samples"] or
                                                            len(set(samples)) != 1):
            return Row(name, FAIL, f"model {key}: the ranks trained {'+'.join(map(str, samples))} samples where "
                                   f"one process trained {want['samples']}: the work was not split between them")
        if key in reference_steps:
            if key not in steps:
                return Row(name, FAIL, f"model {key}: rank 0 recorded no steps")
            step_largest, apart = _first_step_apart(steps[key], reference_steps[key], want["layout"], tolerance)
            if apart:
                return Row(name, FAIL, f"model {key}, {apart} (one process's weights; tolerance {tolerance:g})")
            largest, compared = max(largest, step_largest), compared + len(reference_steps[key])
        for what in ("loss", "evaluate"):
            for index, (a, b) in enumerate(zip(got[what], want[what])):
                difference = _relative(a, b)
                if difference > tolerance:
                    where = f"epoch {index + 1}'s loss" if what == "loss" else f"evaluate's value {index + 1}"
                    return Row(name, FAIL, f"model {key}: {where} is {a:.6g} where one process computes {b:.6g} "
                                           f"(relative difference {difference:.1e}, tolerance {tolerance:g})")
                largest = max(largest, difference)
    models = ", ".join(reference["models"])
    return Row(name, PASS, f"{len(reference['models'])} models ({models}): {compared} steps' weights, the losses and "
                           f"evaluate as one process computes them, largest relative difference {largest:.1e}")
