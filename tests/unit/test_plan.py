"""Mode detection, overrides and bad values: detect(env) as a pure function of a dict."""

import contextlib
import json
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.gpus import probe_gpus
from entrypoint.plan import detect


def test_no_environment_is_single_cpu():
    plan = detect({}, gpus=[])
    assert (plan.mode, plan.rank, plan.size, plan.devices, plan.is_chief) == ("single", 0, 1, (), True)


def test_one_gpu_is_single():
    assert detect({}, gpus=["0"]).mode == "single"


def test_several_gpus_is_mirrored_over_all():
    plan = detect({}, gpus=["0", "1", "2", "3"])
    assert plan.mode == "mirrored" and plan.devices == ("0", "1", "2", "3")


def test_single_on_multi_gpu_node_restricts_to_one():
    plan = detect({"DISTRAIN_MODE": "single"}, gpus=["2", "3"])
    assert plan.devices == ("2",)
    assert dict(plan.env_set)["CUDA_VISIBLE_DEVICES"] == "2"


def test_tf_config_is_respected_as_is():
    config = {"cluster": {"worker": ["a:1", "b:2", "a:3"]}, "task": {"type": "worker", "index": 2}}
    plan = detect({"TF_CONFIG": json.dumps(config)}, gpus=[])
    assert (plan.mode, plan.rank, plan.size, plan.local_rank, plan.local_size) == ("mwm", 2, 3, 1, 2)
    assert plan.cluster == ("a:1", "b:2", "a:3")
    assert "TF_CONFIG" not in dict(plan.env_set)  # not rewritten


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        '{"cluster": {}}',
        '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 5}}',
        '{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}',  # TensorFlow needs the task type
    ],
)
def test_malformed_tf_config(raw):
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        detect({"TF_CONFIG": raw}, gpus=[])


def test_multi_task_slurm_step_is_mwm():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2",
           "SLURM_PROCID": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "2"}
    plan = detect(env, gpus=[])
    assert (plan.mode, plan.rank, plan.size) == ("mwm", 1, 2)
    assert "Slurm step with 2 tasks" in dict(plan.reasons)["mode"]


def test_batch_script_itself_is_not_a_multi_task_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}  # no SLURM_STEP_ID outside srun
    assert detect(env, gpus=[]).mode == "single"


@pytest.mark.parametrize(
    ("env", "rank", "size", "local"),
    [
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
          "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_PROCID": "0"}, 3, 4, 1),  # mpirun: SLURM_PROCID=0 everywhere
        ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}, 1, 2, 1),
        ({"PMI_RANK": "2", "PMI_SIZE": "3"}, 2, 3, 0),
    ],
)
def test_mpi_launch_variables_mean_horovod(env, rank, size, local):
    plan = detect(env, gpus=[])
    assert (plan.mode, plan.rank, plan.size, plan.local_rank) == ("horovod", rank, size, local)


def test_pmix_in_multi_task_srun_step_is_not_taken_as_horovod():
    env = {"PMIX_RANK": "1", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n1",
           "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "1",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
    plan = detect(env, gpus=[])
    assert plan.mode == "mwm" and "DISTRAIN_MODE=horovod" in dict(plan.reasons)["mode"]
    plan = detect({**env, "DISTRAIN_MODE": "horovod"}, gpus=[])
    assert (plan.mode, plan.rank, plan.size, plan.local_size) == ("horovod", 1, 2, 2)


def test_horovod_elastic_leaves_recovery_to_the_script():
    """horovodrun --min-np/--host-discovery-script sets HOROVOD_ELASTIC=1: no distrain checkpoint to restore over
    the elastic state, and `plan` says why."""
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_ELASTIC": "1", "DISTRAIN_OUTPUT_DIR": "/tmp/x"}
    plan = detect(env, gpus=[])
    assert (plan.mode, plan.elastic, plan.checkpoint_dir) == ("horovod", True, None)
    assert "hvd.elastic" in dict(plan.reasons)["checkpoint"]
    assert ("elastic", "yes") in [row[:2] for row in plan.rows()]
    assert not detect({**env, "HOROVOD_ELASTIC": "0"}, gpus=[]).elastic
    assert not detect({"HOROVOD_ELASTIC": "1"}, gpus=[]).elastic  # not launched by horovodrun: single


def test_horovod_launch_wins_over_tf_config():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
           "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})}
    assert detect(env, gpus=[]).mode == "horovod"


def test_override_beats_detection():
    assert detect({"DISTRAIN_MODE": "single"}, gpus=["0", "1"]).mode == "single"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DISTRAIN_MODE": "turbo"}, "unknown DISTRAIN_MODE='turbo'"),
        ({"DISTRAIN_MODE": "mwm"}, "outside any cluster"),
        ({"DISTRAIN_COLLECTIVE": "mpi"}, "unknown DISTRAIN_COLLECTIVE"),
        ({"DISTRAIN_KERAS": "2"}, "unknown DISTRAIN_KERAS"),
        ({"DISTRAIN_REQUIRE_GPU": "maybe"}, "DISTRAIN_REQUIRE_GPU"),
        ({"DISTRAIN_CHECKPOINT_EVERY": "-3"}, "DISTRAIN_CHECKPOINT_EVERY"),
        ({"DISTRAIN_START_TIMEOUT": "5m"}, "DISTRAIN_START_TIMEOUT='5m' is not a number"),
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "outside world size"),
    ],
)
def test_bad_values_are_one_clear_error(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        detect(env, gpus=[])


def test_single_mode_in_a_multi_task_step_is_refused():
    env = {"DISTRAIN_MODE": "single", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
           "SLURM_STEP_NUM_TASKS": "4"}
    with pytest.raises(ConfigError, match="this Slurm step has 4 tasks"):
        detect(env, gpus=[])


def test_mwm_unsets_proxies_and_says_why():
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}),
           "http_proxy": "http://proxy:3128", "HTTPS_PROXY": "http://proxy:3128"}
    plan = detect(env, gpus=[])
    assert set(plan.env_unset) == {"http_proxy", "HTTPS_PROXY"}
    assert "proxy" in dict(plan.reasons)["unset"]
    assert detect({"http_proxy": "x"}, gpus=[]).env_unset == ()  # single mode keeps them


def test_legacy_keras_sets_tf_use_legacy_keras_before_tensorflow_loads():
    assert dict(detect({"DISTRAIN_KERAS": "legacy"}, gpus=[]).env_set)["TF_USE_LEGACY_KERAS"] == "1"
    assert "TF_USE_LEGACY_KERAS" not in dict(detect({"DISTRAIN_KERAS": "keras3"}, gpus=[]).env_set)


def test_checkpoint_dir_is_per_run_and_never_in_home():
    plan = detect({"SLURM_JOB_ID": "99", "HOME": "/home/u", "SCRATCH": "/scratch/u"}, gpus=[], script="train.py")
    assert plan.checkpoint_dir == f"/scratch/u/distrain/runs/{plan.run_name}"
    assert plan.run_name.startswith("train-")
    assert detect({"DISTRAIN_CHECKPOINT": "0"}, gpus=[]).checkpoint_dir is None


@pytest.mark.parametrize(
    ("cvd", "ids"), [("0,1", ("0", "1")), ("", ()), ("-1", ()), ("NoDevFiles", ()), ("GPU-abc", ("GPU-abc",))]
)
def test_probe_gpus_from_cuda_visible_devices(cvd, ids):
    assert probe_gpus({"CUDA_VISIBLE_DEVICES": cvd}) == ids


def test_probe_gpus_numbers_the_device_files_as_cuda_does(tmp_path):
    """A container given the host's GPUs 1 and 3 (`docker run --gpus '"device=1,3"'`) holds /dev/nvidia1 and
    /dev/nvidia3; CUDA calls them 0 and 1 (nvidia-docker#907): pinning "1,3" would leave one GPU hidden."""
    for name in ("nvidia3", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"):
        (tmp_path / name).write_text("")
    assert probe_gpus({}, dev=str(tmp_path)) == ("0", "1")
    assert probe_gpus({}, dev=str(tmp_path / "absent")) == ()
    assert probe_gpus({"CUDA_VISIBLE_DEVICES": "1"}, dev=str(tmp_path)) == ("1",)  # the variable decides


def test_plan_is_immutable_and_serialisable():
    plan = detect({}, gpus=[])
    with pytest.raises(AttributeError):
        plan.mode = "mwm"
    assert json.loads(plan.to_json())["mode"] == "single"


def test_multi_worker_mwm_keeps_onednn_on():
    """oneDNN's empty-batch failure (tensorflow#60857) is prevented by evening out the input (batches.py), so
    multi-worker MWM no longer turns oneDNN off and pays ~40% on CPU for it."""
    config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})
    assert "TF_ENABLE_ONEDNN_OPTS" not in dict(detect({"TF_CONFIG": config}, gpus=[]).env_set)


def test_hooks_are_a_plan_decision():
    assert detect({}, gpus=[]).hooks is True
    off = detect({"DISTRAIN_HOOKS": "0"}, gpus=[])
    assert off.hooks is False and off.checkpoint_dir is None
    keras3 = detect({"DISTRAIN_KERAS": "keras3"}, gpus=[])
    assert keras3.hooks is True and keras3.checkpoint_dir and not keras3.warnings  # hooks for both families


KERAS3_TF217 = {"tensorflow": "2.17.1", "keras": "3.3.2", "tf_keras": "2.17.0"}


def test_auto_keeps_what_plain_python_would_use():
    plan = detect({}, gpus=[], packages=KERAS3_TF217)
    assert plan.keras == "keras3" and "TF_USE_LEGACY_KERAS" not in dict(plan.env_set)
    assert "Keras 3.3.2" in dict(plan.reasons)["keras"]


def test_legacy_for_a_script_written_with_horovods_keras_api(tmp_path):
    """The guides' Horovod scripts use horovod.tensorflow.keras, which cannot drive Keras 3 (horovod#4290)."""
    for source in ("import horovod.tensorflow.keras as hvd\n", "from horovod.tensorflow.keras import callbacks\n",
                   "import horovod.keras as hvd\n", "from horovod.tensorflow import keras as hvd\n"):
        script = tmp_path / "train.py"
        script.write_text(source)
        plan = detect({}, gpus=[], script=str(script), packages=KERAS3_TF217)
        assert plan.keras == "legacy" and "horovod#4290" in dict(plan.reasons)["keras"], source
    # Horovod's TensorFlow API with tf.keras, as Horovod's TF2 examples write it: Keras 2 idioms
    for source in ("import horovod.tensorflow as hvd\n", "from horovod.tensorflow import DistributedGradientTape\n"):
        script.write_text(source + "import tensorflow as tf\nmodel = tf.keras.Sequential()\n")
        plan = detect({}, gpus=[], script=str(script), packages=KERAS3_TF217)
        assert plan.keras == "legacy" and "Horovod's TensorFlow API" in dict(plan.reasons)["keras"], source
    # ... but a Keras 3 script using it keeps Keras 3 (its variables are handed to Horovod as tf.Variables)
    script.write_text("import keras\nimport horovod.tensorflow as hvd\n")
    assert detect({}, gpus=[], script=str(script), packages=KERAS3_TF217).keras == "keras3"


def test_legacy_when_the_user_or_the_script_asks_for_tf_keras(tmp_path):
    assert detect({"TF_USE_LEGACY_KERAS": "1"}, gpus=[], packages=KERAS3_TF217).keras == "legacy"
    for source in ("import tf_keras as keras\n", "from tf_keras import layers\n",
                   "import numpy as np, tensorflow as tf, tf_keras as keras\n",  # several modules, one line
                   "def main():\n    from tf_keras.layers import Dense\n",  # inside a function
                   "import os\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\n",
                   'os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")\n'):
        script = tmp_path / "train.py"
        script.write_text(source)
        plan = detect({}, gpus=[], script=str(script), packages=KERAS3_TF217)
        assert plan.keras == "legacy" and dict(plan.env_set)["TF_USE_LEGACY_KERAS"] == "1", source
    for source in ("import keras  # tf_keras is mentioned only in a comment\n", "import keras_cv_tf_keras\n",
                   "text = 'import tf_keras'\n"):
        script.write_text(source)
        assert detect({}, gpus=[], script=str(script), packages=KERAS3_TF217).keras == "keras3", source


def test_old_tensorflow_or_no_keras3_is_legacy_and_forcing_wins():
    assert detect({}, gpus=[], packages={"tensorflow": "2.15.1", "keras": "2.15.0"}).keras == "legacy"
    assert detect({"DISTRAIN_KERAS": "legacy"}, gpus=[], packages=KERAS3_TF217).keras == "legacy"
    assert detect({"DISTRAIN_KERAS": "keras3", "TF_USE_LEGACY_KERAS": "1"}, gpus=[], packages=KERAS3_TF217).keras == \
        "keras3"
    with pytest.raises(ConfigError, match="unknown DISTRAIN_KERAS='keras2'"):
        detect({"DISTRAIN_KERAS": "keras2"}, gpus=[], packages=KERAS3_TF217)


def test_installed_versions_read_like_importlib_metadata():
    """What the Keras decision reads from the dist-info names, without importing importlib.metadata."""
    import importlib.metadata as metadata

    from entrypoint.keras_family import installed_versions

    found = installed_versions()
    for package, dists in (("tensorflow", ("tensorflow", "tensorflow-cpu")), ("keras", ("keras",)),
                           ("tf_keras", ("tf-keras",))):
        versions = []
        for dist in dists:
            with contextlib.suppress(metadata.PackageNotFoundError):
                versions.append(metadata.version(dist))
        assert found.get(package) == (versions[0] if versions else None), package


def test_installed_versions_first_on_the_path_wins(tmp_path):
    from entrypoint.keras_family import installed_versions

    first, second = tmp_path / "a", tmp_path / "b"
    for folder, names in ((first, ["Keras-3.3.2.dist-info", "tf_keras-2.17.0-py3.11.egg-info"]),
                          (second, ["keras-3.15.1.dist-info", "tensorflow_cpu-2.17.1.dist-info", "kerastuner.py"])):
        folder.mkdir()
        for name in names:
            (folder / name).mkdir()
    assert installed_versions([str(first), str(tmp_path / "missing"), str(second)]) == {
        "keras": "3.3.2", "tf_keras": "2.17.0", "tensorflow": "2.17.1"}


def test_keras_3_is_found_under_the_nightly_names_and_by_its_own_version_file(tmp_path):
    """#68: `pip install tensorflow-cpu==2.22.0rc0` brings `keras-nightly` (package `keras`): Keras 3, not "Keras 3
    is not installed". A package without the metadata expected (a copy on PYTHONPATH) says its version itself."""
    from entrypoint.keras_family import installed_versions

    nightly, copied = tmp_path / "nightly", tmp_path / "copied"
    for name in ("keras_nightly-3.16.0.dev2026112103.dist-info", "tensorflow_cpu-2.22.0rc0.dist-info", "keras"):
        (nightly / name).mkdir(parents=True)
    (copied / "keras" / "src").mkdir(parents=True)
    (copied / "keras" / "src" / "version.py").write_text('from x import y\n__version__ = "3.99.0"\n')
    (copied / "tf_keras").mkdir()
    (copied / "tf_keras" / "__init__.py").write_text("__version__ = '2.22.0'\n")
    assert installed_versions([str(nightly)]) == {"keras": "3.16.0.dev2026112103", "tensorflow": "2.22.0rc0"}
    assert installed_versions([str(copied), str(nightly)]) == {"keras": "3.99.0", "tf_keras": "2.22.0",
                                                               "tensorflow": "2.22.0rc0"}
    plan = detect({}, gpus=[], packages=installed_versions([str(nightly)]))
    assert plan.keras == "keras3", plan.reasons


def test_the_timers_defaults_are_the_readmes():
    """The defaults the integration tests shorten through the settings (a stall floor of 15 s, checks at every
    step) are, unset, what the reference's configuration table says."""
    plan = detect({}, gpus=[])
    assert (plan.stall_seconds, plan.stall_pause_seconds, plan.stop_check_seconds, plan.checkpoint_minutes,
            plan.start_timeout) == (120.0, 1800.0, 2.0, 30.0, 300.0)
    reference = (Path(__file__).parents[2] / "docs" / "reference.md").read_text()
    for variable, default in (("DISTRAIN_STALL_SECONDS", "120"), ("DISTRAIN_STALL_PAUSE_SECONDS", "1800"),
                              ("DISTRAIN_STOP_CHECK_SECONDS", "2"), ("DISTRAIN_CHECKPOINT_MINUTES", "30"),
                              ("DISTRAIN_START_TIMEOUT", "300")):
        assert f"| `{variable}` | `{default}` |" in reference, variable


def test_keras_writes_its_config_in_the_runs_state_only_for_a_user_without_a_keras_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "DISTRAIN_OUTPUT_DIR": str(tmp_path / "out")}
    plan = detect(env, gpus=[], script=str(tmp_path / "train.py"))
    assert dict(plan.env_set)["KERAS_HOME"] == f"{plan.checkpoint_dir}/keras"
    assert "KERAS_HOME" not in dict(detect({**env, "KERAS_HOME": "/mine"}, gpus=[]).env_set)  # the user's own
    (home / ".keras").mkdir()  # their config and downloaded datasets: left as they are
    assert "KERAS_HOME" not in dict(detect(env, gpus=[], script=str(tmp_path / "train.py")).env_set)


def test_a_script_importing_both_keras_gets_the_one_plain_python_gets_or_is_asked(tmp_path):
    """`import keras` is Keras 3 under plain python: a script importing both is not made tf_keras by a guess."""
    script = tmp_path / "train.py"
    script.write_text("try:\n    import tf_keras as keras\nexcept ImportError:\n    import keras\n")
    assert detect({}, gpus=[], script=str(script), packages=KERAS3_TF217).keras == "legacy"
    without_tf_keras = {k: v for k, v in KERAS3_TF217.items() if k != "tf_keras"}
    assert detect({}, gpus=[], script=str(script), packages=without_tf_keras).keras == "keras3"
    script.write_text("try:\n    import keras\nexcept ModuleNotFoundError:\n    import tf_keras as keras\n")
    assert detect({}, gpus=[], script=str(script), packages=KERAS3_TF217).keras == "keras3"
    # chosen as it runs (the conformance script's `--keras legacy`): the user says which, in one line
    script.write_text("import sys\nif '--legacy' in sys.argv:\n    import tf_keras as keras\nelse:\n    import keras\n")
    with pytest.raises(ConfigError, match="imports both keras .* DISTRAIN_KERAS=keras3 or DISTRAIN_KERAS=legacy"):
        detect({}, gpus=[], script=str(script), packages=KERAS3_TF217)
    assert detect({"DISTRAIN_KERAS": "keras3"}, gpus=[], script=str(script), packages=KERAS3_TF217).keras == "keras3"
    assert detect({"TF_USE_LEGACY_KERAS": "1"}, gpus=[], script=str(script), packages=KERAS3_TF217).keras == "legacy"


def test_horovods_gloo_timeout_is_the_stall_watchdogs_unless_the_user_set_one():
    """#84: a rank slowed by a loaded machine ended a Horovod x2 run ("Horovod has been shut down") at Gloo's 30 s,
    which horovodrun sets itself; distrain's watchdog names a stuck rank instead."""
    launched = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}
    for given in ({}, {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"}):
        assert dict(detect({**launched, **given}, gpus=[]).env_set)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "1800"
    own = detect({**launched, "HOROVOD_GLOO_TIMEOUT_SECONDS": "600"}, gpus=[])
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in dict(own.env_set)
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in dict(detect({}, gpus=[]).env_set)
