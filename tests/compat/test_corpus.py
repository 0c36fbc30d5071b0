"""The scripts users already have (tests/compat/scripts), written as the guides and TensorFlow's and Keras' docs
teach, not as distrain's examples are: each runs unchanged in one process, under MWM x2 (distrain launch) and,
where it does not build its own MultiWorkerMirroredStrategy, under Horovod x2 (mpirun). Every rank exits 0 and ends
with identical weights, the loss falls, the ranks' samples add up to one pass per epoch (the scripts that carry
tests/compat/scripts/counting.py's layer), and a model saved on the chief only is complete and loadable."""

import os
from pathlib import Path

import pytest

from helpers import DISTRAIN, FULL_TIER, MPIRUN, assert_trained_in_sync, clean_env, load_model, results, run
from slurm_jobs import submit

SCRIPTS = Path(__file__).parent / "scripts"
OWN_MWM = ["guide_mwm.py", "otbtf_mwm.py", "tf_tutorial_mwm.py", "custom_loop_strategy.py", "keras_guide_mirrored.py",
           "tf_tutorial_mwm_ctl.py"]
ANY_LAUNCHER = ["keras3_subclassed.py", "tf_keras_cnn.py", "keras3_functional_ops.py", "keras3_cnn_bn.py",
                "own_file_shards.py"]
HOROVOD_BY_HAND = ["guide_horovod.py", "horovod_sharded.py", "horovod_tf2_custom_loop.py",
                   "horovod_tf2_custom_loop_keras3.py", "horovod_keras_mnist.py",
                   "horovod_keras_synthetic_benchmark.py"]
LAUNCH = {
    "single": ([DISTRAIN, "run"], 1),
    "mwm": ([DISTRAIN, "launch", "-n", "2"], 2),
    "horovod": ([*MPIRUN, DISTRAIN, "run"], 2),
}
# Horovod's Keras API drives tf_keras only (horovod#4290): distrain's Keras `auto` sees the script import it and
# picks tf_keras by itself (keras_family.choose), so no script here needs DISTRAIN_KERAS


# One process runs a script's own distribution code the same way whatever the script (a strategy of one worker, a
# Horovod of one rank): in the default tier, one script of each kind in one process; every one in --full
ONE_PROCESS = {"guide_mwm.py", "tf_tutorial_mwm_ctl.py", "keras3_cnn_bn.py", "tf_keras_cnn.py", "guide_horovod.py"}


# Plain Keras 3 scripts with no distribution code of their own are the conformance suite's (tests/conformance: every
# mode, against plain python's numbers): in the default tier only the ones it has no scenario like (a model with
# BatchNormalization, tf_keras under Horovod) run here; every one in --full
CONFORMANCE_COVERS = {"keras3_subclassed.py", "keras3_functional_ops.py"}


def cases():
    for scripts, modes in ((OWN_MWM, ("single", "mwm")), (ANY_LAUNCHER, ("single", "mwm", "horovod")),
                           (HOROVOD_BY_HAND, ("single", "horovod"))):
        for script in scripts:
            if script in CONFORMANCE_COVERS and not FULL_TIER:
                continue
            yield from ((script, mode) for mode in modes if mode != "single" or FULL_TIER or script in ONE_PROCESS)


# The scripts that save a model as their guide does (chief-only under MWM, rank 0 under Horovod): the arguments that
# ask for it, the file it leaves, its Keras family and input shape, whether it holds the counting layer. Checked in
# the run of every mode they run in.
SAVES = {
    "guide_mwm.py": (["--save-model", "--output-dir", "{dir}"], "mnist_model.keras", "keras3", (28, 28, 1), True),
    "otbtf_mwm.py": (["{dir}/model.keras"], "model.keras", "keras3", (16, 16, 3), True),
    "tf_tutorial_mwm.py": (["{dir}/model.keras"], "model.keras", "keras3", (28, 28), False),
    "guide_horovod.py": (["{dir}/m.keras"], "m.keras", "legacy", (12,), False),  # its own DistributedOptimizer only
}


@pytest.mark.parametrize(("script", "mode"), list(cases()))
def test_the_script_runs_unchanged(script, mode, tmp_path):
    launcher, ranks = LAUNCH[mode]
    saves = SAVES.get(script)
    args = [arg.format(dir=tmp_path / "saved") for arg in saves[0]] if saves else []
    (tmp_path / "saved").mkdir()
    out = run([*launcher, str(SCRIPTS / script), *args], env=clean_env(), timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
    found = assert_trained_in_sync(out.stdout, workers=ranks)
    assert_work_split(found, ranks)
    if mode != "single" and script in OWN_MWM:
        assert "adopted the script's" in out.stdout, out.stdout[-3000:]
    if saves:  # one complete model, no worker's temporary directory left
        _, name, family, shape, counting = saves
        assert os.listdir(tmp_path / "saved") == [name]
        load_model(tmp_path / "saved" / name, family, input_shape=shape, counting=counting)


@pytest.mark.parametrize("family", ["keras3", "legacy"])
def test_a_custom_loop_its_own_optimizer_updates_is_refused_under_zero_code_horovod(family, tmp_path):
    """TensorFlow's custom-training tutorial (its own MirroredStrategy, `strategy.run`, `optimizer.apply_gradients`)
    trains distributed under MWM (test_the_script_runs_unchanged). Under zero-code Horovod nothing averages an
    optimizer the script never gave compile(): before, each rank trained alone and they ended apart, silently
    (weights 749f3a9d91bf829b and 2c0c54828929c81b, Keras 3). Now one line at its first update, exit 3."""
    out = run([*LAUNCH["horovod"][0], str(SCRIPTS / "custom_loop_strategy.py")],
              env=clean_env(DISTRAIN_KERAS=family), timeout=300)
    assert out.returncode == 3, out.stdout[-3000:]
    assert "RESULT" not in out.stdout and "Traceback" not in out.stdout, out.stdout[-3000:]
    assert "the script updates variables with an optimizer it did not give compile()" in out.stdout


@pytest.mark.parametrize(("family", "mode"), [("keras3", "single"), ("keras3", "mwm"), ("legacy", "mwm"),
                                            ("legacy", "horovod")])
def test_a_training_loop_written_for_one_process_runs_as_one_and_is_refused_in_one_line_under_ranks(family, mode):
    """The Keras guide's loop from scratch (no strategy; a model built on its first batch, BatchNormalization): one
    process prints plain python's losses; under MWM its variables are mirrored, which TensorFlow refuses deep in
    its step (before: a traceback wall per rank, Keras 3's `DistributedVariable.handle`, tf_keras' loss
    reduction): one line, exit 3; under Horovod its first update is refused (nothing would average it)."""
    script = [str(SCRIPTS / "keras_guide_training_loop.py"), "--keras", family]
    out = run([*LAUNCH[mode][0], *script], env=clean_env(DISTRAIN_KERAS=family), timeout=300)
    if mode == "single":
        plain = run(["python", *script], env=clean_env(), timeout=300)
        losses = [line for line in plain.stdout.splitlines() if line.startswith("epoch ")]
        assert out.returncode == 0 and len(losses) == 2 and all(line in out.stdout for line in losses), out.stdout
        return
    assert out.returncode == 3 and "Traceback" not in out.stdout and "epoch 0" not in out.stdout, out.stdout[-3000:]
    said = "trains outside `strategy.run`" if mode == "mwm" else "an optimizer it did not give compile()"
    assert said in out.stdout and "run it as one process (`distrain run`)" in out.stdout, out.stdout[-3000:]


def assert_work_split(found: list[dict], ranks: int) -> None:
    """The samples trained on (scripts with the counting layer) add up to one pass over the data per epoch in
    total, in about equal shares: the work is split between the ranks, never done twice."""
    counted = [r for r in found if "samples" in r]
    if not counted:
        return
    total = int(counted[0]["total"])
    assert sum(int(r["samples"]) for r in counted) == total, counted
    for r in counted:
        assert abs(int(r["samples"]) - total / ranks) <= total / ranks / 10, counted


def test_horovods_tensorflow_api_fails_on_keras_3_variables_without_distrain_negative_control(tmp_path):
    """horovod.tensorflow keys variables by .ref(), which Keras 3 variables lack: compat/keras3_horovod hands it
    their tf.Variables. The day this passes without distrain's hooks, Horovod is fixed and the fix can go."""
    out = run([*MPIRUN, DISTRAIN, "run", str(SCRIPTS / "horovod_tf2_custom_loop_keras3.py"),
               str(tmp_path / "ckpt")], env=clean_env(DISTRAIN_HOOKS="0"))
    assert out.returncode != 0 and "object has no attribute 'ref'" in out.stdout, out.stdout[-3000:]


@pytest.mark.core
def test_horovod_elastic_keeps_training_when_the_chief_dies(tmp_path):
    """Horovod's elastic Keras example through distrain, two workers on two host names of this machine: the
    worker started as rank 0 is killed at the start of epoch 2. The survivor rolls back to the last commit (the
    end of epoch 1, as Horovod promises), is renumbered rank 0 of 1, trains the remaining epochs and, as the
    chief now, saves the model. distrain restores none of its own checkpoints over the elastic state and does not
    end the job as a lost worker."""
    hosts = tmp_path / "discover-hosts.sh"
    hosts.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    hosts.chmod(0o755)
    out = run(["horovodrun", "--gloo", "-np", "2", "--min-np", "1", "--host-discovery-script", str(hosts),
               DISTRAIN, "run", str(SCRIPTS / "horovod_keras_elastic.py"), "--save", str(tmp_path / "model.h5")],
              env=clean_env(DIE_AT_EPOCH="2", DIE_RANK="0", DIE_MARKER=str(tmp_path / "died")), timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
    assert (tmp_path / "died").exists() and "exit with status code 137" in out.stdout  # the chief did die
    assert "RESET rank=0 size=1 epoch=1 batch=0" in out.stdout, out.stdout[-3000:]
    [result] = results(out.stdout)
    assert (result["size"], result["epochs"]) == ("1", "4") and float(result["loss_last"]) < float(result["loss_first"])
    assert "resumed from checkpoint" not in out.stdout and "lost worker" not in out.stdout, out.stdout[-3000:]
    assert "[0/1] distrain: saved model to" in out.stdout  # the survivor saves: it is the chief now
    load_model(tmp_path / "model.h5", "legacy")


@pytest.mark.parametrize(("job", "script", "extra"), [
    ("mwm", "guide_mwm.py", {}),
    ("horovod", "guide_horovod.py", {}),
])
def test_the_guides_scripts_through_the_job_scripts(slurm, tmp_path, job, script, extra):
    submitted = submit(slurm, tmp_path, job, ["--cpus-per-task=1", "--time=10", "--nodes=2", "--ntasks-per-node=1",
                                               "--gres=gpu:1"], TRAIN_SCRIPT=str(SCRIPTS / script), **extra)
    assert submitted.code == 0, submitted
    assert_trained_in_sync(submitted.log, workers=2)


def as_a_keras3_user_writes_it(script: Path, tmp_path: Path) -> Path:
    """The same example written for Keras 3: `import keras`, and `opt.variables` is a property there."""
    source = script.read_text().replace("import horovod.tensorflow as hvd\n",
                                        "import horovod.tensorflow as hvd\nimport keras\n")
    keras3 = tmp_path / script.name
    keras3.write_text(source.replace("opt.variables()", "opt.variables"))
    return keras3


# the averaging reads both families' statistics the same way (keras3_horovod.tf_variables); Keras 3 also needs
# its variables handed to Horovod's TensorFlow API (compat/keras3_horovod): Keras 3 in CI, tf_keras in --full (the
# negative control below runs the tf_keras script)
@pytest.mark.parametrize("family", ["keras3", "legacy"] if FULL_TIER else ["keras3"])
def test_a_horovod_custom_loops_batchnorm_statistics_are_averaged_so_rank_0s_save_is_the_global_model(tmp_path,
                                                                                                       family):
    """Horovod's TF2 synthetic benchmark: a BatchNorm model, each rank its own random images, a rank-0 save. Plain
    Horovod leaves each rank its own moving statistics (the negative control below; with Keras 3 it does not run at
    all: see the .ref() control above); under distrain every rank ends with all weights identical, the statistics
    included, so rank 0's saved model is the global one."""
    script = SCRIPTS / "horovod_tf2_synthetic_benchmark.py"
    if family == "keras3":
        script = as_a_keras3_user_writes_it(script, tmp_path)
    out = run([*MPIRUN, DISTRAIN, "run", str(script), str(tmp_path / "model.keras")],
              timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
    assert f"keras {family}" in distrain_plan(script), family  # auto picks the family the script was written for
    assert_trained_in_sync(out.stdout, workers=2)
    load_model(tmp_path / "model.keras", family, input_shape=(32, 32, 3))


def distrain_plan(script: Path) -> str:
    return " ".join(run([DISTRAIN, "plan", str(script)], env=clean_env()).stdout.split())


def test_without_distrain_a_horovod_custom_loop_ends_with_each_rank_its_own_statistics_negative_control(tmp_path):
    out = run([*MPIRUN, DISTRAIN, "run", str(SCRIPTS / "horovod_tf2_synthetic_benchmark.py"),
               str(tmp_path / "model.keras")], env=clean_env(DISTRAIN_HOOKS="0"), timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
    assert len({r["weights"] for r in results(out.stdout)}) == 2, out.stdout[-2000:]
