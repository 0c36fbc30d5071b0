"""Keras 3 scripts run on Keras 3, tf_keras ones on tf_keras; a Keras whose internals moved is refused. Keras 3 under
MWM from different starts: test_single_and_mwm.py; its numbers in every mode: tests/conformance."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import DISTRAIN, assert_trained_in_sync, clean_env, results, run

SCRIPT = "examples/keras3_train.py"


@pytest.mark.core
def test_keras3_script_runs_on_keras3_by_default(tmp_path):
    out = run([DISTRAIN, "run", SCRIPT, "--epochs", "2", "--save", str(tmp_path / "m.keras")])
    # (saved models are loaded back in test_single_and_mwm: Keras 3.3's Lambda layers do not deserialize)
    assert out.returncode == 0, out.stdout[-3000:]
    found = assert_trained_in_sync(out.stdout, workers=1)
    assert found[0]["keras"].startswith("3.")
    # numpy input given to Keras as distrain's dataset: no "`shuffle=True` was passed, but will be ignored" (3.15)
    assert "but will be ignored" not in out.stdout, out.stdout[-3000:]
    plan = run([DISTRAIN, "plan", SCRIPT])
    assert re.search(r"^keras\s+keras3\s+Keras 3\.", plan.stdout, re.MULTILINE), plan.stdout
    assert os.listdir(tmp_path) == ["m.keras"]


@pytest.mark.core
def test_a_tf_keras_script_stays_on_tf_keras(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text("import tf_keras as keras\nprint('RESULT family=' + keras.Model.__module__.split('.')[0])\n")
    out = run([DISTRAIN, "run", str(script)])
    assert out.returncode == 0 and results(out.stdout)[0]["family"] == "tf_keras", out.stdout[-2000:]


@pytest.fixture(scope="module")
def unknown_keras(tmp_path_factory) -> Path:
    """A real Keras 3 whose TensorFlow trainer is shaped differently (reduce_per_replica renamed), as a future
    Keras might be: a copy of the installed one, patched, first on PYTHONPATH."""
    import keras

    site = tmp_path_factory.mktemp("keras-future")
    shutil.copytree(Path(keras.__file__).parent, site / "keras", ignore=shutil.ignore_patterns("__pycache__"))
    trainer = site / "keras" / "src" / "backend" / "tensorflow" / "trainer.py"
    trainer.write_text(trainer.read_text().replace("reduce_per_replica", "reduce_across_replicas"))
    version = site / "keras" / "src" / "version.py"
    version.write_text(re.sub(r'__version__ = "[^"]+"', '__version__ = "3.99.0"', version.read_text()))
    return site


def test_a_keras_with_unknown_internals_is_refused_at_start_up(unknown_keras):
    out = run([DISTRAIN, "launch", "-n", "2", SCRIPT], env=clean_env(PYTHONPATH=str(unknown_keras)))
    assert out.returncode == 3, out.stdout[-3000:]
    errors = [line for line in out.stdout.splitlines() if "distrain: error:" in line]
    assert errors and all("Keras 3.99.0" in e and "DISTRAIN_KERAS=legacy" in e for e in errors), out.stdout[-3000:]
    assert "Traceback" not in out.stdout and "Epoch" not in out.stdout


def test_unknown_keras_still_runs_single_where_nothing_needs_fixing(unknown_keras):
    out = run([DISTRAIN, "run", SCRIPT, "--epochs", "1"], env=clean_env(PYTHONPATH=str(unknown_keras)))
    assert out.returncode == 0 and "keras=3.99.0" in out.stdout, out.stdout[-3000:]


def test_plain_python_and_distrain_agree_on_the_keras_family(tmp_path):
    """`tf.keras` is Keras 3 under plain python with TensorFlow 2.16+ (no TF_USE_LEGACY_KERAS): under distrain too."""
    script = tmp_path / "family.py"
    script.write_text("import tensorflow as tf\nprint('FAMILY', tf.keras.Model.__module__.split('.')[0])\n")
    plain = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True, text=True,
                           timeout=300)
    assert "FAMILY keras" in plain.stdout, plain.stderr[-2000:]
    distributed = run([DISTRAIN, "run", str(script)], env=clean_env(DISTRAIN_CHECKPOINT="0"), cwd=tmp_path)
    assert distributed.returncode == 0 and "FAMILY keras\n" in distributed.stdout, distributed.stdout[-2000:]
