"""How the overhead benchmark turns its passes into ratios (benchmarks/ratios.py overhead_row, spread), and that the
committed results, whose figures the README's tables quote, are what their own passes give."""

import importlib.util
import json

import pytest

from helpers import ROOT

spec = importlib.util.spec_from_file_location("ratios", ROOT / "benchmarks" / "ratios.py")
ratios = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ratios)


def side(cpu_s: float, steady_cpu_s: float, images_per_sec: float = 100.0) -> dict:
    return {"core": 0, "wall_s": 1.0, "cpu_s": cpu_s, "steady_cpu_s": steady_cpu_s, "images_per_sec": images_per_sec}


def test_a_ratio_is_the_median_of_each_repetitions_own_ratio():
    # the machine's cost moves between repetitions, both sides alike; distrain reads 0.990 in two repetitions
    # of three. The ratio of the medians (104 / 101) would set repetition 2's hand-written run against repetition
    # 0's distrain run and read 1.03
    hand, ours = [100.0, 108.0, 104.0], [101.0, 109.08, 99.0]
    result = ratios.spread(hand, ours)
    assert result["ratio"] == pytest.approx(100 / 101)
    assert (result["ratio_min"], result["ratio_max"]) == (pytest.approx(100 / 101), pytest.approx(104 / 99))


def test_a_row_pairs_each_repetitions_passes_over_both_core_orders_and_run_lengths():
    passes = []
    for rep, scale in enumerate((1.0, 1.08, 0.95)):  # a repetition's hour: both sides alike
        for steps, cpu in ((300, 10.0), (1200, 40.0)):
            for ours_extra in (0.2, 0.0):  # two core orders, the mean is what counts
                passes.append({"rep": rep, "steps": steps,
                               "distrain": side(scale * cpu * 1.01 + ours_extra, scale * cpu * 0.5),
                               "hand-written": side(scale * cpu, scale * cpu * 0.5)})
    row = ratios.overhead_row(passes)
    assert row["steps"] == 1200 and row["passes"] == passes
    assert row["cpu_ratio"] == pytest.approx(40 / (40 * 1.01 + 0.1 / 1.0), rel=1e-3)
    assert row["cpu_per_step_ratio"] == pytest.approx(1 / 1.01)  # the fixed 0.1 s a run cancels out per step
    assert row["cpu_steady_ratio"] == pytest.approx(1.0) and row["ratio"] == pytest.approx(1.0)
    assert row["distrain_extra_cpu_s_per_run"] == pytest.approx(0.1)  # what is left once the steps are paid


def test_a_pass_keeps_its_cpu_seconds_to_the_microsecond():
    # a smoke run's two lengths can differ by little: rounded to the millisecond, the per-step CPU could read 0
    # and its ratio divide by it (CI of 2026-11-27)
    kept = ratios.one_pass(side(20.6841234, 1.3612345) | {"wall_s": 22.2214567})
    assert (kept["cpu_s"], kept["steady_cpu_s"], kept["wall_s"]) == (20.684123, 1.361234, 22.221)


def test_a_row_whose_distrain_side_measured_no_cpu_says_which_ratio():
    passes = [{"rep": 0, "steps": steps, "distrain": side(10.0, 0.0), "hand-written": side(10.0 + steps / 100, 1.0)}
              for steps in (8, 24)]  # the same CPU at both lengths: a per-step CPU of 0
    with pytest.raises(ValueError, match="cpu_per_step: distrain's side measured 0 CPU s"):
        ratios.overhead_row(passes)


RESULTS = sorted((ROOT / "benchmarks" / "results").glob("overhead*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[path.name for path in RESULTS])
def test_the_committed_overhead_rows_are_what_their_passes_give(path):
    rows = {name: row for name, row in json.loads(path.read_text())["overhead"].items() if row.get("passes")}
    for name, row in rows.items():
        again = ratios.overhead_row(row["passes"])
        for key in (k for k in again if k != "passes"):
            assert row[key] == pytest.approx(again[key], abs=1e-9), (name, key)
