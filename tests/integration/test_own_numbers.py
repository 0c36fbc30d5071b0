"""A script's numbers are those plain `python` computes on the same global batches (#67): each model's metrics
its own when a script trains two one after the other, and gradient clipping acting on the global batch's
gradients, in every mode. Ranks that agree prove nothing here: every comparison is with plain `python`.

Pairwise over mode and family: Keras 3 under MWM x2 (`core`: both TensorFlow lines, where the two defects were
found) and in one process (`distrain run`, digit for digit); tf_keras under Horovod x2 (mpirun)."""

import re
import subprocess

import pytest

from helpers import DISTRAIN, MPIRUN, ROOT, clean_env, keras_env, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "own_numbers.py")
NUMBERS = re.compile(r"NUMBERS name=(\S+) fit=([\d.]+/[\d.]+) evaluate=([\d.]+/[\d.]+)")
RANK_TAG = re.compile(r"\[(\d+/\d+|\d+,\d+)\]")  # distrain launch's [0/2], mpirun's [1,0]
SCENARIOS = {"sgd_0.01", "sgd_0.5", "clipnorm", "clipvalue", "global_clipnorm"}
TOLERANCE = 2e-4  # several ranks sum in another order: the 5th decimal may differ, no more


def numbers(output: str) -> list[dict[str, list[float]]]:
    """Each rank's scenarios, in the order its lines came: [{name: [fit loss, fit acc, eval loss, eval acc]}]."""
    by_rank: dict[str, dict[str, list[float]]] = {}
    for line in output.splitlines():
        found = NUMBERS.search(line)
        if found:
            tags = RANK_TAG.findall(line[:found.start()])  # mpirun's --tag-output may glue lines together
            rank = tags[-1] if tags else ""
            values = [float(v) for part in found.groups()[1:] for v in part.split("/")]
            by_rank.setdefault(rank, {})[found[1]] = values
    return list(by_rank.values())


def plain_python(family: str) -> dict[str, list[float]]:
    env = clean_env(TF_CPP_MIN_LOG_LEVEL="2", **({"TF_USE_LEGACY_KERAS": "1"} if family == "legacy" else {}))
    out = run(["python", SCRIPT], env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    [reference] = numbers(out.stdout)
    assert set(reference) == SCENARIOS, out.stdout[-2000:]
    return reference


def assert_as_plain_python(output: str, reference: dict[str, list[float]], ranks: int, exact: bool = False) -> None:
    found = numbers(output)
    assert len(found) == ranks, output[-3000:]
    for rank in found:
        assert set(rank) == SCENARIOS, output[-3000:]
        for name, values in rank.items():
            wrong = [(got, want) for got, want in zip(values, reference[name])
                     if (got != want if exact else abs(got - want) > TOLERANCE)]
            assert not wrong, f"{name}: {values} where plain python prints {reference[name]}\n{output[-2000:]}"


@pytest.mark.core
def test_keras3_under_mwm_and_alone_prints_plain_pythons_numbers_for_every_model():
    reference = plain_python("keras3")
    assert reference["sgd_0.5"] != reference["sgd_0.01"]  # two models, two sets of numbers
    assert len({tuple(reference[form]) for form in ("clipnorm", "clipvalue", "global_clipnorm")}) == 3  # it clips
    mwm = run([DISTRAIN, "launch", "-n", "2", SCRIPT], env=keras_env("keras3"), timeout=400)
    assert mwm.returncode == 0, mwm.stdout[-3000:]
    assert_as_plain_python(mwm.stdout, reference, ranks=2)
    alone = run([DISTRAIN, "run", SCRIPT], env=keras_env("keras3"))
    assert alone.returncode == 0, alone.stdout[-3000:]
    assert_as_plain_python(alone.stdout, reference, ranks=1, exact=True)


def test_tf_keras_under_horovod_prints_plain_pythons_numbers_for_every_model():
    reference = plain_python("legacy")
    out = run([*MPIRUN, DISTRAIN, "run", SCRIPT],
              env=keras_env("legacy"), timeout=400)
    assert out.returncode == 0, out.stdout[-3000:]
    assert_as_plain_python(out.stdout, reference, ranks=2)


NEGATIVE_CONTROL = """
import weakref
import tensorflow as tf
from entrypoint.compat import keras3_mwm

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

@tf.function
def sum_of_arguments(values):  # the metric-state sum distrain had: the variables as the function's arguments
    local = strategy.run(lambda: [tf.identity(v) for v in values])
    return [strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in local]

class Model:  # what keras3_mwm keys its sums by
    pass

with strategy.scope():
    first, second = [tf.Variable(1.0), tf.Variable(2.0)], [tf.Variable(10.0), tf.Variable(20.0)]
models = Model(), Model()
print("ARGUMENTS", [float(v) for v in sum_of_arguments(first)], [float(v) for v in sum_of_arguments(second)])
print("DISTRAIN", *([float(v) for v in keras3_mwm._all_sum(m, strategy, vs, tf)()]
                    for m, vs in zip(models, (first, second))))
"""


def test_negative_control_a_sum_given_the_variables_as_arguments_reads_the_first_models():
    """Why the metric-state sum keeps its variables in its closure: a tf.function given distributed variables as
    arguments reads the first ones it was traced with (a second model's metrics were the first model's). Two
    replicas in one process (two logical CPUs) show it as MWM x2 did."""
    out = subprocess.run(["python", "-c", NEGATIVE_CONTROL], env=clean_env(TF_CPP_MIN_LOG_LEVEL="2"), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert "ARGUMENTS [2.0, 4.0] [2.0, 4.0]" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "DISTRAIN [2.0, 4.0] [20.0, 40.0]" in out.stdout, out.stdout + out.stderr[-3000:]
