"""Benchmarks in smoke mode: every benchmark runs and writes its ratios. No speed is asserted here (timings
on a shared 2-core machine are noise); the numbers come from running benchmarks/run.py by hand."""

import json
import math
import sys

from helpers import DISTRAIN, clean_env, full_tier_only, run


@full_tier_only("the benchmarks' harness, not a promise of the README (6 minutes on a quiet VM, 14 on a slow one)")
def test_benchmarks_smoke_writes_every_ratio(tmp_path):
    # the timeout only guards against a hang: 6 minutes on a fast VM, 14-15 on the slowest EPYC VMs seen
    out = run([sys.executable, "benchmarks/run.py", "all", "--smoke", "--out", str(tmp_path)], timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "smoke-all.json").read_text())
    assert results["machine"]["cores"] >= 1 and results["machine"]["tensorflow"].startswith("2.17")
    rows = ["single (keras3)", "mwm x2 (keras3)", "single (legacy)", "mwm x2 (legacy)", "horovod x2 (legacy)",
            "control: mwm x2 (legacy) hand-written against itself"]  # the machine's own ratios, no distrain
    assert sorted(results["overhead"]) == sorted(rows)
    every_core = ",".join(str(core) for core in range(results["machine"]["cores"]))
    for name, row in results["overhead"].items():  # every mode has a baseline (Keras 3 MWM: the upstream fixes by hand)
        assert "skipped" not in row, (name, row)
        # throughput; CPU seconds of the run from the kernel's accounting; the chief's CPU over the steps alone
        for ratio in ("ratio", "cpu_ratio", "cpu_steady_ratio"):
            assert 0 < row[f"{ratio}_min"] <= row[ratio] <= row[f"{ratio}_max"] and math.isfinite(row[f"{ratio}_max"])
        # per step: the CPU difference between two run lengths (16 steps apart in smoke mode: sign not asserted)
        assert row["cpu_per_step_ratio_min"] <= row["cpu_per_step_ratio_max"]
        assert all(math.isfinite(row[k]) for k in ("cpu_per_step_ratio", "distrain_extra_cpu_s_per_run"))
        assert row["distrain_cpu_s"] > 0 and row["handwritten_cpu_s"] > 0
        # every pass kept, so an outlier can be named: both run lengths; the sides at once, each on its own core,
        # but Horovod's one after the other on every core (two of its ranks on one core make it bistable)
        assert [p["steps"] for p in row["passes"]] == [8, 24]
        assert all(p["distrain"]["cpu_s"] > 0 for p in row["passes"])
        cores = {(p["distrain"]["core"], p["hand-written"]["core"]) for p in row["passes"]}
        if name.startswith("horovod"):
            assert cores == {(every_core, every_core)}, cores
        else:
            assert all(ours != theirs for ours, theirs in cores), cores
    perstep = results["perstep"]
    assert set(perstep["callbacks"]) == {f"{hook} ({family})" for hook in ("stall watchdog", "stop check", "checkpoint")
                                         for family in ("Keras 3", "tf_keras")}
    assert all(c["us_per_step"] > 0 and 0 < c["share_of_step"] < 1 for c in perstep["callbacks"].values())
    assert "control: plain tf.data against itself" in perstep["input"] and len(perstep["input"]) == 6
    # distrain's fit against the plain fit it wraps, alternating in the same two MWM workers, each Keras family:
    # every `distrain` fit had distrain's checkpoint callback; `spin 1%` is the known cost the measure must see
    for family, variants in (("Keras 3", {"distrain", "spin 1%"}), ("tf_keras", {"distrain", "own backup", "spin 1%"})):
        in_process = perstep["fit_in_process"][family]
        assert in_process["distrain_fits"] == 2 and in_process["rounds"] == 4, in_process
        assert set(in_process) - {"plain_ms_per_step", "spin_ms_per_step", "distrain_fits", "rounds",
                                  "fit_wall_s"} == variants
        assert all(0 < in_process[name]["cpu_ratio_min"] <= in_process[name]["cpu_ratio_max"] for name in variants)
        assert 0 < in_process["spin_ms_per_step"] < in_process["plain_ms_per_step"] / 20  # about 1% of a step
    assert all(r["ratio"] > 0 and r["cpu_ratio_min"] <= r["cpu_ratio_max"] for r in perstep["input"].values())
    # distrain's callbacks timed in place, inside a real 2-worker fit: each of its callbacks is found and timed,
    # the per-step work of the stall watchdog and the stop check where the train function calls it (steps.py)
    for family, checkpoint in (("Keras 3", "Keras3Backup"), ("tf_keras", "TfKerasBackup")):
        in_place = perstep["callbacks_in_place"][family]
        assert "TrainingPosition.call_ended" in in_place["per_step_hook_us"], in_place["per_step_hook_us"]
        timed = {hook.split(".")[0] for hook in in_place["once_a_run_ms"]}
        assert {"WatchForStalls", "StopAndCheckpoint", checkpoint} <= timed, timed
        assert in_place["once_a_run_ms"][f"{checkpoint}.on_epoch_end"] > 0  # the checkpoint written at the end
        assert 0 < in_place["share_of_run_cpu"] < 1
    # the step observers against a batch callback and neither, both families: CPU and Python calls a step
    assert set(perstep["observers"]) == {"Keras 3", "tf_keras"}
    for row in perstep["observers"].values():
        ways = {"none", "batch callback", "train-function observer"}
        assert set(row["us_per_step"]) == ways and all(row["us_per_step"][way] > 0 for way in ways)
        assert row["python_calls_per_step"]["batch callback"] > row["python_calls_per_step"]["none"] > 100
    phases = results["startup"]["phases_s_by_workers"]
    assert set(phases) == {"1 worker(s)", "2 worker(s)"}
    assert all(p["total"] > 0 and p["TensorFlow import"] > 0 for p in phases.values())
    assert math.isfinite(results["startup"]["seconds_per_added_worker"])
    for mode in ("mwm", "horovod"):
        for name in (f"speed-up, distrain {mode} x2", f"speed-up, hand-written {mode} x2",
                     f"distrain {mode} x2 vs hand-written"):
            row = results["scaling"][name]
            assert 0 < row["ratio_min"] <= row["ratio"] <= row["ratio_max"] and math.isfinite(row["ratio_max"])
    assert results["scaling"]["cpu ceiling (2 pinned processes vs 1, pure Python)"]["speed_up"] > 0
    assert results["startup"]["ratio"] > 0
    assert "ratio" in results["container"] or "skipped" in results["container"]
    assert set(results["comm"]["allreduce_ms_by_elements"]) == {"mwm ring", "horovod gloo", "horovod mpi"}
    check = results["comm"]["stop_check (mwm)"]  # distrain's stop check against the public tf.function way
    assert check["distrain_cpu_ms"] > 0 and check["tf.function_cpu_ms"] > 0 and check["ratio"] > 0, check
    # TensorFlow's private launcher layout is still the one engines/strategy.one_device_launcher reads (else the
    # public way)
    assert check["distrain_way"] == "eager_sum", check


def test_distrain_bench_json_baseline_and_plot(tmp_path):
    single, double = tmp_path / "one.json", tmp_path / "two.json"
    out = run([DISTRAIN, "bench", "--steps", "5", "--warmup", "2", "--json", str(single)], env=clean_env())
    assert out.returncode == 0, out.stdout[-3000:]
    assert "images/sec" in out.stdout
    out = run([DISTRAIN, "launch", "-n", "2", "bench", "--steps", "5", "--warmup", "2", "--baseline", str(single),
               "--json", str(double)], env=clean_env())
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.count("images/sec") == 1  # the table comes from the chief only
    result = json.loads(double.read_text())
    assert (result["mode"], result["replicas"], result["global_batch"]) == ("mwm", 2, 64)
    assert result["scaling_efficiency"] > 0
    png = tmp_path / "scaling.png"
    out = run([DISTRAIN, "bench", "--plot", str(png), "--result", str(single), "--result", str(double)])
    assert out.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overhead_only_names_the_rows_when_none_matches(tmp_path):
    out = run([sys.executable, "benchmarks/run.py", "overhead", "--smoke", "--only", "no such row", "--out",
               str(tmp_path)])
    assert out.returncode == 1
    assert "no overhead row's name holds 'no such row': the rows are single (keras3), mwm x2 (keras3)" in out.stdout
    assert not list(tmp_path.iterdir())


@full_tier_only("a flag of the benchmarks' harness")
def test_overhead_one_after_other_gives_every_worker_a_core_one_side_at_a_time(tmp_path):
    # a row that runs side by side by default (each side on one core) runs each side alone on every core instead
    out = run([sys.executable, "benchmarks/run.py", "overhead", "--smoke", "--only", "single (legacy)",
               "--one-after-other", "--out", str(tmp_path)], timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((tmp_path / "smoke-overhead.json").read_text())
    row = results["overhead"]["single (legacy)"]
    every_core = ",".join(str(core) for core in range(results["machine"]["cores"]))
    cores = {(p["distrain"]["core"], p["hand-written"]["core"]) for p in row["passes"]}
    assert cores == {(every_core, every_core)}, cores  # as Horovod's row in the smoke run above
    assert row["cpu_ratio"] > 0


@full_tier_only("the harness; the resume it times is tested in test_exact_resume.py, test_skip_beneath.py")
def test_stop_cost_smoke_stops_resumes_and_writes_each_cost(tmp_path):
    out = run([sys.executable, "benchmarks/run.py", "stop", "--smoke", "--out", str(tmp_path)], timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    rows = json.loads((tmp_path / "smoke-stop.json").read_text())["stop"]
    by_position = ["pure map", "random map", "mwm x2, pure map", "horovod x2, pure map"]
    assert set(rows) == {"samples", "map_products", *by_position, "checkpoint write",
                         "against Keras' BackupAndRestore"}
    for row in (rows[name] for name in by_position):  # each run stopped with exit 75 and resumed (else it raises)
        assert all(row[f"{cost} at {where}"] > 0 for cost in ("stop_s", "resume_first_step_s")
                   for where in ("10 %", "90 %")), row
        assert 0 < row["ratio_min"] <= row["ratio_90_over_10"] <= row["ratio_max"], row
    write = rows["checkpoint write"]
    assert 0 < write["state_mb (small)"] < 2 and 90 < write["state_mb (large)"] < 110, write  # weights, Adam's slots
    keras = rows["against Keras' BackupAndRestore"]
    assert keras["back_s (distrain)"] > 0 and 0 < keras["ratio_min"] <= keras["ratio_max"], keras


def test_checkpoint_vs_disk_smoke_writes_each_rows_ratios(tmp_path):
    """#87's suite in smoke mode (a 1 MB model, one process written off the training's path and in place, MWM x2):
    each row's write and blocked ratios against the raw write, with their spread and the warm-up apart; no speed
    asserted."""
    out = run([sys.executable, "benchmarks/run.py", "checkpoint-vs-disk", "--smoke", "--out", str(tmp_path)],
              timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    rows = json.loads((tmp_path / "smoke-checkpoint-vs-disk.json").read_text())["checkpoint-vs-disk"]["rows"]
    assert [row["name"] for row in rows] == ["1 MB, single", "1 MB, single, in place", "1 MB, mwm x2"]
    for row in rows:
        assert 0.5 < row["size_mb"] < 2 and row["repetitions"] >= 1, row
        for ratio in ("write_ratio", "blocked_ratio"):
            spread = row[f"{ratio}_spread"]
            assert spread["min"] <= row[ratio] <= spread["max"] and math.isfinite(spread["max"]), row
        assert row["write_ratio"] > 0 and row["raw_ms_per_mb"] > 0 and row["warmup"]["distrain_s"] > 0, row
