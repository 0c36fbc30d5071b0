"""The benchmarks' statistics: each ratio the median of the per-repetition ratios, with the lowest and highest, and
the overhead rows computed from their passes (also by benchmarks/summarize.py, to rewrite committed results)."""

from __future__ import annotations

import statistics


def spread(numerators: list[float], denominators: list[float]) -> dict:
    """The median of the per-repetition ratios, with the lowest and highest. Each repetition ran both variants
    side by side or back to back, so a pair shares its seconds of the machine; the ratio of the two medians would
    set one repetition's value against another's, and a VM's cost moves by up to 8% from one repetition to the
    next (benchmarks/results/overhead-mwm-legacy-epyc-1127.json: 0.983 that way, 1.012 paired)."""
    per_rep = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {"ratio": statistics.median(per_rep), "ratio_min": min(per_rep), "ratio_max": max(per_rep)}


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

