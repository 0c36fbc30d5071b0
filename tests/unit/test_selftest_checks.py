"""The selftest's judgements (entrypoint/tools/selftest.py), fed what ranks and tools report: a check passes only on
evidence, fails with the reason, and skips what cannot run here."""

from pathlib import Path

from entrypoint.tools.selftest import (
    collective_used,
    driver_row,
    gpu_rows,
    infiniband_row,
    judge_training,
    nccl_row,
    pinning_row,
    report,
)

NCCL_LOGS = Path(__file__).parent / "data"
RANK = {"rank": 0, "size": 2, "mode": "mwm", "host": "n1", "loss_first": 0.7, "loss_last": 0.4, "weights": "ab",
        "gpus": []}
SMI = """| NVIDIA-SMI 535.183.01             Driver Version: 535.183.01   CUDA Version: 12.2     |"""


def test_ranks_that_disagree_or_do_not_learn_fail():
    agree = [RANK, {**RANK, "rank": 1, "host": "n2"}]
    assert judge_training("MWM x2", agree, 2).status == "pass"
    assert "2 ranks on 2 node(s)" in judge_training("MWM x2", agree, 2).detail
    apart = judge_training("MWM x2", [RANK, {**RANK, "rank": 1, "weights": "cd"}], 2)
    assert apart.status == "fail" and "different weights" in apart.detail
    flat = judge_training("MWM x2", [{**r, "loss_last": 0.9} for r in agree], 2)
    assert flat.status == "fail" and "did not fall" in flat.detail
    missing = judge_training("MWM x2", [RANK], 2, log="rank 1: error: lost worker 0")
    assert missing.status == "fail" and "1 of 2 ranks finished" in missing.detail and "lost worker" in missing.detail


def test_the_collective_is_named_from_the_libraries_own_words():
    assert collective_used(RANK, "n1:42 [0] NCCL INFO Using network IB") == "NCCL over IB (NCCL's own log)"
    assert "ring collectives over gRPC" in collective_used(RANK, "")
    assert collective_used({**RANK, "mode": "horovod", "horovod_controller": "mpi"}, "").startswith("Horovod with mpi")


def test_nccls_transport_is_read_from_its_verdict_not_from_its_probes():
    """NCCL 2.28.9's own log on an H100 node without InfiniBand probes the plugin and IB before it says
    `Using network Socket`; an IB node's (written from NCCL's documented messages) names its HCAs."""
    h100 = (NCCL_LOGS / "nccl-2.28-init-h100.log").read_text()
    assert "NET/Plugin" in h100 and "NET/IB : No device found" in h100  # what a first-match reading took
    assert collective_used(RANK, h100) == "NCCL over Socket ([0]eth0:192.0.2.2<0>) (NCCL's own log)"
    infiniband = (NCCL_LOGS / "nccl-ib-init.log").read_text()
    assert collective_used(RANK, infiniband) == "NCCL over IB ([0]mlx5_0:1/IB [1]mlx5_1:1/IB) (NCCL's own log)"
    probes_only = "\n".join(line for line in h100.splitlines() if "Using network" not in line)
    assert "ring collectives over gRPC" in collective_used(RANK, probes_only)  # no verdict: NCCL carried nothing


def test_a_driver_older_than_the_images_cuda_fails():
    assert driver_row("12.2", SMI).status == "pass"
    old = driver_row("12.8", SMI)
    assert old.status == "fail" and "older than the image's CUDA 12.8, which needs a driver for CUDA 12.8 or newer " \
        "(Linux 570.86.10+): ask the admins" in old.detail
    none = driver_row("12.5.1", smi=None)  # no nvidia-smi on this machine: the minimum is said all the same
    assert none.status == "skip" and none.detail.endswith(
        "; the image's CUDA 12.5.1 needs a driver for CUDA 12.5 or newer (Linux 555.42.02+)")
    assert driver_row("", SMI).status == "pass"  # a CPU build: nothing to compare
    assert driver_row("12.2", "NVIDIA-SMI has failed because it couldn't communicate with the driver").status == "fail"


def test_infiniband_adapters_without_their_devices_in_the_container_fail(tmp_path):
    assert infiniband_row(str(tmp_path)).status == "skip"
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    unbound = infiniband_row(str(tmp_path))
    assert unbound.status == "fail" and "--bind /dev/infiniband" in unbound.detail
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    (tmp_path / "dev/infiniband/uverbs0").write_text("")
    bound = infiniband_row(str(tmp_path))
    assert bound.status == "pass" and "200 Gb/sec" in bound.detail
    assert nccl_row({"NCCL_IB_DISABLE": "1"}, infiniband=True).status == "fail"
    assert nccl_row({"NCCL_IB_DISABLE": "1"}, infiniband=False).status == "pass"


def test_gpu_rows_pass_only_on_measured_speed_ups_and_skip_without_a_gpu():
    assert {r.status for r in gpu_rows({**RANK, "cuda_build": True})} == {"skip"}
    gpu = {**RANK, "gpus": [{"pci_bus_id": "0000:3b:00.0"}], "memory_growth": True,
           "images_per_sec": {"float32": 1000, "mixed_float16": 2600, "xla": 900}}
    rows = {r.check: r for r in gpu_rows(gpu)}
    assert rows["GPU: mixed float16"].status == "pass" and "2.60x float32" in rows["GPU: mixed float16"].detail
    assert rows["GPU: XLA"].status == "fail" and "slower than float32" in rows["GPU: XLA"].detail
    assert rows["GPU: mixed bfloat16"].status == "skip"


def test_two_ranks_of_a_node_on_one_gpu_fail_pinning():
    on = {"pci_bus_id": "0000:3b:00.0"}
    assert pinning_row([{**RANK, "gpus": [on]}, {**RANK, "rank": 1, "host": "n2", "gpus": [on]}]).status == "pass"
    shared = pinning_row([{**RANK, "gpus": [on]}, {**RANK, "rank": 1, "gpus": [on]}])
    assert shared.status == "fail" and "share GPU 0000:3b:00.0 on n1" in shared.detail


def test_the_verdict_fails_on_any_failed_row():
    rows = [judge_training("single", [{**RANK, "size": 1}], 1), driver_row("12.8", SMI)]
    assert report(rows).endswith("verdict: FAIL (driver)")
    assert report(rows[:1]).endswith("verdict: PASS (1 passed, 0 skipped)")


def test_the_all_reduce_across_nodes_is_compared_with_the_link(tmp_path):
    from entrypoint.tools.selftest import interconnect_row

    ranks = [{**RANK, "allreduce_busbw_gbs": 9.0, "allreduce_mib": 64}, {**RANK, "rank": 1, "host": "n2",
                                                                         "allreduce_busbw_gbs": 9.0}]
    assert interconnect_row(ranks[:1], str(tmp_path)).status == "skip"  # one node: no network crossed
    assert interconnect_row(ranks, str(tmp_path)).status == "skip"  # no link speed reported
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
    fast = interconnect_row(ranks, str(tmp_path))
    assert fast.status == "pass" and "72% of InfiniBand mlx5_0's 100 Gb/s" in fast.detail
    slow = interconnect_row([{**r, "allreduce_busbw_gbs": 1.1} for r in ranks], str(tmp_path))
    assert slow.status == "fail" and "slower path" in slow.detail


def recorded(variant: str = "float32", samples: int | None = 512, loss: float = 0.5, bias: float = 0.0) -> tuple:
    """A rank's record of one model (selftest_train.py's shape) and its weights after each of 4 steps."""
    import numpy as np

    steps = np.array([[1.0, -0.5, 0.25, bias + 0.01 * s] for s in range(4)])
    model = {"loss": [0.7, loss], "evaluate": [loss, 0.8], "weights": "ab", "nonfinite": None, "samples": samples,
             "layout": [["dense/kernel", 3], ["dense/bias", 1]]}
    return {f"{variant}/sgd": model}, {f"{variant}/sgd": steps}


def test_a_mode_that_computes_what_one_process_computes_passes_with_its_largest_difference():
    from entrypoint.tools.selftest_arithmetic import judge_arithmetic

    models, steps = recorded()
    half, _ = recorded(samples=256)
    reference = {"rank": 0, "models": models}
    ranks = [{"rank": 0, "models": half}, {"rank": 1, "models": half}]
    row = judge_arithmetic("MWM x2", ranks, reference, steps, steps)
    assert row.status == "pass" and "4 steps' weights" in row.detail and "difference 0.0e+00" in row.detail, row


def test_a_mode_whose_ranks_agree_on_other_numbers_fails_naming_the_step_and_variable():
    """The negative controls' judging: another weight at step 3 (in sync, but not one process's), a loss scaled on
    every rank, each rank training every sample (the work not split), a NaN on rank 1."""
    from entrypoint.tools.selftest_arithmetic import judge_arithmetic

    models, steps = recorded()
    half, _ = recorded(samples=256)
    reference = {"rank": 0, "models": models}
    ranks = [{"rank": 0, "models": half}, {"rank": 1, "models": half}]
    moved = {"float32/sgd": steps["float32/sgd"].copy()}
    moved["float32/sgd"][2:, 3] += 0.05
    row = judge_arithmetic("MWM x2", ranks, reference, moved, steps)
    assert row.status == "fail" and "step 3: dense/bias differs by 5.0e-02" in row.detail, row
    scaled, _ = recorded(samples=256, loss=1.0)
    row = judge_arithmetic("Horovod x2", [{"rank": 0, "models": scaled}, {"rank": 1, "models": scaled}], reference,
                           steps, steps)
    assert row.status == "fail" and "epoch 2's loss is 1 where one process computes 0.5" in row.detail, row
    row = judge_arithmetic("MWM x2", [{"rank": 0, "models": models}, {"rank": 1, "models": models}], reference,
                           steps, steps)
    assert row.status == "fail" and "512+512 samples where one process trained 512" in row.detail, row
    nan = {"float32/sgd": {**half["float32/sgd"], "nonfinite": "step 2: loss not finite"}}
    row = judge_arithmetic("MWM x2", [ranks[0], {"rank": 1, "models": nan}], reference, steps, steps)
    assert row.status == "fail" and row.detail == "rank 1, model float32/sgd: step 2: loss not finite", row
    failed = {"xla/sgd": {"error": "InvalidArgumentError: no XLA kernel"}}
    row = judge_arithmetic("MWM x2", [{"rank": 0, "models": {**half, **failed}}], reference, steps, steps)
    assert row.status == "fail" and row.detail == "rank 0, model xla/sgd failed: InvalidArgumentError: no XLA kernel"
    assert judge_arithmetic("MWM x2", [], reference, {}, steps).status == "skip"


def test_the_gpu_variants_are_judged_each_against_its_own_precision():
    """Mixed float16 against its own one-process run within 5e-2; XLA (float32) within 1e-4, as float32."""
    from entrypoint.tools.selftest_arithmetic import judge_arithmetic

    for variant, off, status in (("mixed_float16", 0.02, "pass"), ("mixed_float16", 0.08, "fail"),
                                 ("xla", 5e-5, "pass"), ("xla", 5e-4, "fail")):
        models, steps = recorded(variant, samples=None)
        reference = {"rank": 0, "models": models}
        moved = {key: value * (1 + off) for key, value in steps.items()}
        row = judge_arithmetic("MWM x2", [{"rank": 0, "models": models}], reference, moved, steps)
        assert row.status == status, (variant, off, row)
