"""No replica is handed an empty batch (entrypoint/fit/batches.py), so multi-worker MWM keeps oneDNN on: the
tensorflow#60857 case (4 workers, Conv+ReLU, a last global batch of 2 samples, or 5) trains to the end on both
Keras families, with tf.data and numpy input and with the script's own strategy; without distrain it fails.

TensorFlow turns oneDNN on by default only on CPUs with AVX-512 VNNI or BF16, AVX-VNNI or AMX: on an AVX2-only
CPU (the AMD EPYC VMs here) it is off and the case cannot fail. These tests turn it on (TF_ENABLE_ONEDNN_OPTS=1),
as it is by default on CPUs that have those, so that they test the same thing on every x86 CPU."""

import json
import sys
import time

import pytest

from helpers import (
    DISTRAIN,
    FULL_TIER,
    KERAS_FAMILIES,
    Watched,
    assert_trained_in_sync,
    clean_env,
    free_ports,
    keras_env,
    run,
)

SCRIPT = "tests/integration/scripts/short_last_batch.py"
ONEDNN_ON = {"TF_ENABLE_ONEDNN_OPTS": "1"}  # whatever the CPU's default (see the module doc)
# Each family with tf.data and numpy (their data adapters differ) and each last batch once: 2 samples (66, split
# 1, 1, 0, 0) and 5 (69, which TensorFlow's rebatch would cut 2, 2, 1, 0); keras3 is `core`, so on both TF lines
# (--full: every input on both)
INPUTS = {"keras3": (["--samples", "69"], ["--numpy", "--own-strategy"]), "legacy": ([], ["--numpy", "--own-strategy"])}
if FULL_TIER:
    INPUTS = dict.fromkeys(INPUTS, ([], ["--samples", "69"], ["--numpy", "--own-strategy"]))


@pytest.mark.parametrize("family", [pytest.param("keras3", marks=pytest.mark.core), "legacy"])
def test_a_last_batch_smaller_than_the_workers_trains_with_onednn_on(family):
    assert family in KERAS_FAMILIES
    for extra in INPUTS[family]:
        out = run([DISTRAIN, "launch", "-n", "4", SCRIPT, *extra], env={**keras_env(family), **ONEDNN_ON},
                  timeout=600)
        assert out.returncode == 0, out.stdout[-4000:]
        found = assert_trained_in_sync(out.stdout, workers=4)
        assert {r["onednn"] for r in found} == {"1"}  # distrain leaves oneDNN on (it once turned it off)


def test_negative_control_plain_tensorflow_fails_on_the_case(tmp_path):
    """The same script with its own MWM, four plain `python` workers and a hand-written TF_CONFIG, no distrain: a
    worker gets an empty batch and oneDNN's ReluGrad fails. The day this passes, tensorflow#60857 is fixed
    upstream and the evening-out is no longer needed for it."""
    workers = [f"localhost:{port}" for port in free_ports(4)]
    procs = []
    for index in range(4):
        config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        procs.append(Watched([sys.executable, SCRIPT, "--own-strategy"],
                             env={**clean_env(TF_USE_LEGACY_KERAS="1"), **ONEDNN_ON, "TF_CONFIG": config}))
    deadline = time.monotonic() + 300
    try:  # the workers whose peers failed wait on a collective: stop at the first failure
        while time.monotonic() < deadline and not any(p.returncode not in (None, 0) for p in procs) \
                and not all(p.returncode == 0 for p in procs):
            time.sleep(1)
    finally:
        for proc in procs:
            proc.kill()
    output = "".join(proc.rest(timeout=30) for proc in procs)  # each read to its end
    assert "ReluGrad" in output or "must have the same size and shape" in output, output[-3000:]
