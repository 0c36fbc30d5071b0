"""An unmodified script gets plain `python`'s numbers and files in every mode (#69): Keras' public surface as the
scenarios of scripts/keras_surface.py, all of them in one launch per mode and family, each judged against plain
`python` on the same global batches (conformance.py): one process bit for bit, several ranks within
RELATIVE_TOLERANCE, the files each scenario leaves as one process leaves them. The table in tests/README.md says
what each scenario proves. Keras 3 in every mode; tf_keras under MWM x2 (the mode with its own file rules; CI:
all but TF_KERAS_MWM_ONLY_IN_FULL), and
under Horovod x2 the scenarios whose fixes have a tf_keras side (HOROVOD_TF_KERAS_SCENARIOS); the newest
TensorFlow line (`core`) under MWM x2, where the defects were found: there CORE_SCENARIOS (--full: all of
them)."""

import subprocess
from importlib.metadata import version

import pytest
from conformance import SCENARIOS, SCRIPT, judge, plain_python, scenarios

from helpers import DISTRAIN, FULL_TIER, MPIRUN, ROOT, clean_env, keras_env, run, run_once

LAUNCH = {
    "single": ([DISTRAIN, "run"], 1),
    "mwm": ([DISTRAIN, "launch", "-n", "2"], 2),
    "horovod": ([*MPIRUN, DISTRAIN, "run"], 2),
}
# Known to differ from plain python, not fixed yet (tests/README.md's table; #69): (mode, family, scenario) ->
# (the Keras versions it differs on: from, up to but not including, why)
KNOWN: dict[tuple[str, str, str], tuple[str, str | None, str]] = {}


# Refused with one line where upstream cannot work (the table's notes): (mode, family, scenario) -> (the Keras
# versions: from, up to but not including; what the refusal says). XLA with several ranks: no Horovod kernels,
# no CPU collectives (these are CPUs; MWM on GPUs is `distrain selftest`'s)
REFUSED: dict[tuple[str, str, str], tuple[str, str | None, str]] = {
    **{(mode, family, "jit_compile"): ("2", None, f"EnvironmentProblem:compile(jit_compile=True)_under_{mode}")
       for mode in ("mwm", "horovod") for family in ("keras3", "legacy")},
    # Keras updates inside a tf.cond, where MWM's replicas cannot merge (plain Keras 3.3 and 3.15 under a
    # two-replica MirroredStrategy fail the same: "merge_call called while defining a new graph")
    ("mwm", "keras3", "gradient_accumulation"): ("3", None,
                                                  "EnvironmentProblem:gradient_accumulation_steps=2_under_mwm"),
}


# differ in some runs only (a race): not held to "fails once fixed"
RACES: set[tuple[str, str, str]] = set()
# The `core` run (the newest TensorFlow line, scripts/test.sh): the scenarios whose defects were found on Keras 3.15
# (the table's "Keras 3.15" notes, #69 finding 9), the files every rank reads (TensorFlow's checkpoints and exports
# too: their patches' targets are TensorFlow's), the agreed stop, the script's own strategy and backup, the
# optimizer's options and pandas (their Keras internals differ in 3.15); the others prove on 2.17 what Keras 3.15
# does not handle otherwise in distrain's code.
CORE_SCENARIOS = ("global_clipnorm", "builtin_callbacks", "save_then_load", "kfold_best_checkpoints",
                  "custom_train_step", "stop_training_on_one_rank", "steps_per_execution", "python_generator",
                  "image_directory", "tf_train_checkpoint", "export_saved_model", "own_one_device_strategy",
                  "jit_compile", "ema", "gradient_accumulation", "own_backup_and_h5", "pandas_frame",
                  "saved_model_on_localhost")

# tf_keras under Horovod: the scenarios whose Horovod fixes have a tf_keras side of their own (the metric states'
# read, the synchronized moments, the train_step's own optimizers: their registry entries per family); --full: all
HOROVOD_TF_KERAS_SCENARIOS = ("ratio_metrics", "synchronized_batchnorm", "own_optimizers_in_train_step")
# tf_keras under MWM: every scenario but those whose path through distrain is Keras 3's or the family's own with
# nothing of distrain's between (the optimizer's clipping and EMA, loss weights, mixed precision, preprocessing,
# text and timeseries datasets, pandas: Keras' own under tf_keras' own strategy support; the batches they train are
# the numpy and tf.data ones the others prove); --full: all
TF_KERAS_MWM_ONLY_IN_FULL = ("learning_rate_loop", "clipnorm", "clipvalue", "global_clipnorm",
                             "several_inputs_and_outputs", "class_weights", "stop_training_in_a_batch",
                             "steps_per_execution", "text_directory", "mixed_precision", "preprocessing_adapt",
                             "timeseries_input", "ema", "gradient_accumulation", "pandas_frame",
                             "py_dataset_with_workers")


def tf_keras_scenarios() -> tuple[str, ...]:
    """The tf_keras scenarios plain python runs once a session, for both tf_keras launches."""
    return () if FULL_TIER else tuple(name for name in SCENARIOS if name not in TF_KERAS_MWM_ONLY_IN_FULL)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def known(mode: str, family: str, name: str, table: dict | None = None) -> bool:
    entry = (KNOWN if table is None else table).get((mode, family, name))
    if entry is None:
        return False
    installed = _version(version("keras" if family == "keras3" else "tf_keras"))
    low, high, _ = entry
    return _version(low) <= installed and (high is None or installed < _version(high))


def reference(kept, family: str, names: tuple[str, ...] = ()) -> dict:  # noqa: ANN001
    """plain python's results (of `names`, or every scenario), produced once a session for every test that
    compares with them."""
    results = {}

    def produce(out_dir, _state):  # noqa: ANN001, ANN202
        results.update(plain_python(out_dir, family, *names))
        (out_dir / "lines").write_text("\n".join(
            f"CONFORM name={s.name} " + " ".join(f"{k}={v}" for k, v in s.values.items()) for s in results.values()))
        return subprocess.CompletedProcess([], 0)

    kept_dir = run_once(kept, ("conformance", family, names, SCRIPT.stat().st_mtime), produce)
    return results or scenarios((kept_dir / "lines").read_text())[0]


def assert_conforms(mode: str, family: str, kept, tmp_path, names: tuple[str, ...] = (),  # noqa: ANN001
                    produced: tuple[str, ...] | None = None) -> None:
    """`names` (every scenario: ()) judged against plain python's run of `produced` (by default `names`)."""
    everything = reference(kept, family, names if produced is None else produced)
    assert set(names) <= set(everything), f"no such scenario: {set(names) - set(everything)}"
    want = {name: result for name, result in everything.items() if not names or name in names}
    launcher, ranks = LAUNCH[mode]
    out = run([*launcher, str(SCRIPT), str(tmp_path / "out"), "--keras", family, *want], env=keras_env(family),
              timeout=600)
    verdicts = judge(out.stdout, want, ranks, exact=mode == "single")
    for name in [name for name in verdicts if known(mode, family, name, REFUSED)]:  # its one line, every rank
        said = [rank[name].values["status"] for rank in scenarios(out.stdout) if name in rank]
        verdicts[name] = [] if len(said) == ranks and all(
            s.startswith("error:" + REFUSED[mode, family, name][2]) for s in said) else [f"{name}: {said}"]
    wrong = {name: found for name, found in verdicts.items() if found and not known(mode, family, name)}
    assert not wrong, "\n".join(line for found in wrong.values() for line in found[:4]) + "\n" + out.stdout[-2000:]
    fixed = [name for name, found in verdicts.items()
             if known(mode, family, name) and not found and (mode, family, name) not in RACES]
    assert not fixed, f"now as plain python: take {fixed} out of KNOWN and the table"
    assert out.returncode == 0, out.stdout[-3000:]


def test_keras3_alone_is_plain_python_bit_for_bit(kept_runs, tmp_path):
    assert_conforms("single", "keras3", kept_runs, tmp_path)


@pytest.mark.core
def test_keras3_under_mwm_has_plain_pythons_numbers_and_files(kept_runs, tmp_path, request):
    core_run = request.config.option.markexpr == "core" and not FULL_TIER
    assert_conforms("mwm", "keras3", kept_runs, tmp_path, CORE_SCENARIOS if core_run else ())


def test_keras3_under_horovod_has_plain_pythons_numbers_and_files(kept_runs, tmp_path):
    assert_conforms("horovod", "keras3", kept_runs, tmp_path)


def test_tf_keras_under_mwm_has_plain_pythons_numbers_and_files(kept_runs, tmp_path):
    assert_conforms("mwm", "legacy", kept_runs, tmp_path, tf_keras_scenarios())


def test_tf_keras_under_horovod_has_plain_pythons_numbers(kept_runs, tmp_path):
    assert_conforms("horovod", "legacy", kept_runs, tmp_path, () if FULL_TIER else HOROVOD_TF_KERAS_SCENARIOS,
                    produced=tf_keras_scenarios())


OWN_DISTRIBUTION = ROOT / "tests" / "conformance" / "scripts" / "own_distribution.py"


def own_distribution(launcher: list[str] | None, out_dir, family: str, kind: str):  # noqa: ANN001, ANN201
    """scripts/own_distribution.py's `kind` under plain python (launcher None) or a distrain launcher."""
    command = [*(launcher or ["python"]), str(OWN_DISTRIBUTION), str(out_dir), "--keras", family, kind]
    env = keras_env(family) if launcher else clean_env(**({"TF_USE_LEGACY_KERAS": "1"} if family == "legacy" else {}))
    return run(command, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=400)


@pytest.mark.parametrize(("mode", "family"), [
    ("single", "keras3"), pytest.param("mwm", "keras3", marks=pytest.mark.core), ("horovod", "keras3"),
    ("mwm", "legacy")])
def test_the_scripts_own_logical_devices_and_mirrored_strategy_give_plain_pythons_numbers(mode, family, tmp_path):
    """TensorFlow's "Distributed input" set-up: the CPU split into two logical devices before anything else, a
    Keras model in the script's own MirroredStrategy over them. Before #69's fix, under MWM and Horovod:
    `RuntimeError: Virtual devices cannot be modified after being initialized`. The reference is plain python's
    run of the script; under several ranks on Keras 3.3, whose own two-replica MirroredStrategy sums the
    replicas' gradients (keras#19969; loss 0.70256 where one device has 0.75647), the same script over one device."""
    upstream_sums = family == "keras3" and version("keras").startswith("3.3.") and mode != "single"
    reference = own_distribution(None, tmp_path / "plain", family, "one_device" if upstream_sums else "devices")
    assert reference.returncode == 0, reference.stdout[-3000:]
    [want] = scenarios(reference.stdout)
    launcher, ranks = LAUNCH[mode]
    out = own_distribution(launcher, tmp_path / "out", family, "devices")
    verdicts = judge(out.stdout, want, ranks, exact=mode == "single")
    assert not verdicts["own_mirrored_strategy"], "\n".join(verdicts["own_mirrored_strategy"]) + out.stdout[-2000:]
    assert out.returncode == 0, out.stdout[-3000:]
    if mode != "single":
        assert "one device per rank kept" in out.stdout, out.stdout[-3000:]


@pytest.mark.parametrize("mode", ["single", "mwm", "horovod"])
def test_a_parameter_server_strategy_runs_in_one_process_and_is_refused_in_one_line_under_ranks(mode, tmp_path):
    """TensorFlow's parameter server tutorial (its in-process cluster, a ClusterCoordinator loop): in one process
    plain python's numbers bit for bit; under distrain's ranks, where each would run the cluster whole, one line
    and exit 3 before it trains."""
    launcher, _ = LAUNCH[mode]
    out = own_distribution(launcher, tmp_path / "out", "keras3", "parameter_server")
    if mode == "single":
        reference = own_distribution(None, tmp_path / "plain", "keras3", "parameter_server")
        assert out.returncode == 0 and reference.returncode == 0, out.stdout[-3000:] + reference.stdout[-3000:]
        assert judge(out.stdout, scenarios(reference.stdout)[0], 1, exact=True) == {"parameter_server": []}
        return
    assert out.returncode == 3, out.stdout[-3000:]
    assert "CONFORM" not in out.stdout and "Traceback" not in out.stdout, out.stdout[-3000:]
    assert "the script builds its own ParameterServerStrategy, a cluster of its own" in out.stdout


NEGATIVE_CONTROL = """
import tensorflow as tf
from entrypoint.compat import metric_reads
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
@tf.function
def sum_of_arguments(values):  # the metric-state sum distrain had: the variables as the function's arguments
    local = strategy.run(lambda: [tf.identity(v) for v in values])
    return [strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in local]
class Model:  # what metric_reads keys its sums by
    pass
with strategy.scope():
    first, second = [tf.Variable(1.0), tf.Variable(2.0)], [tf.Variable(10.0), tf.Variable(20.0)]
models = Model(), Model()
print("ARGUMENTS", [float(v) for v in sum_of_arguments(first)], [float(v) for v in sum_of_arguments(second)])
print("DISTRAIN", *([float(v) for v in metric_reads.all_sum(m, strategy, vs, tf)()]
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
