"""The bad-input catalogue (README): each row gives one clear line, a meaningful exit code, no traceback wall."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import DISTRAIN, ROOT, clean_env, free_ports, run, small_tmpfs


def tf_config(*workers: str, index: int = 0) -> str:
    return json.dumps({"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}})


def assert_one_line_error(out, code: int, text: str) -> None:
    assert out.returncode == code, out.stdout[-3000:]
    errors = [line for line in out.stdout.splitlines() if "distrain: error:" in line]
    assert len(errors) == 1 and text in errors[0], out.stdout[-3000:]
    assert "Traceback" not in out.stdout


@pytest.mark.parametrize(
    ("env", "args", "code", "text"),
    [
        ({"DISTRAIN_MODE": "turbo"}, ["examples/train.py"], 2, "unknown DISTRAIN_MODE='turbo'"),
        ({}, ["examples/nope.py"], 2, "training script 'examples/nope.py' not found"),
        ({}, ["pyproject.toml"], 2, "is not a Python script"),
        ({"DISTRAIN_MODE": "mwm"}, ["examples/train.py"], 2, "outside any cluster"),
        ({"TF_CONFIG": "{oops"}, ["examples/train.py"], 2, "TF_CONFIG is not valid"),
        ({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "0",
          "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"},
         ["examples/train.py"], 2, "inconsistent Slurm variables"),
        ({"DISTRAIN_REQUIRE_GPU": "1"}, ["examples/train.py"], 3, "--nv"),
        ({"DISTRAIN_CHECKPOINT_DIR": "/etc/hostname/ckpt"}, ["examples/train.py"], 3, "is not writable"),
        ({"APPTAINER_CONTAINER": "/images/distrain.sif"}, ["tests/integration/scripts/reads_unbound_data.py"], 2,
         "/scratch-not-bound/me/data/train.csv is not in the container (no /scratch-not-bound there): bind it, "
         "DISTRAIN_BIND=/scratch-not-bound/me/data"),
    ],
)
def test_bad_input_row(env, args, code, text):
    started = time.monotonic()
    out = run([DISTRAIN, "run", *args], env=clean_env(**env))
    assert_one_line_error(out, code, text)
    assert time.monotonic() - started < 30


def test_launch_on_a_port_in_use_says_so_before_starting_any_worker():
    with socket.socket() as taken:
        taken.bind(("", free_ports(1)[0]))
        taken.listen()
        port = taken.getsockname()[1]
        out = run([DISTRAIN, "launch", "-n", "2", "--port", str(port), "examples/train.py"], env=clean_env())
    assert_one_line_error(out, 2, f"port(s) {port} already in use: choose another --port")
    assert "[0/2]" not in out.stdout


def test_a_module_only_the_unread_user_site_holds_is_one_line_naming_the_setting(tmp_path):
    """The image reads no ~/.local (PYTHONNOUSERSITE=1, Apptainer.def): a script importing a package installed
    there with `pip install --user` is told which setting reads it; without PYTHONNOUSERSITE it imports."""
    site = tmp_path / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "labtools").mkdir(parents=True)
    (site / "labtools" / "__init__.py").write_text("ANSWER = 42\n")
    script = tmp_path / "train.py"
    script.write_text("import labtools\nprint('labtools', labtools.ANSWER)\n")
    unread = run([DISTRAIN, "run", str(script)], env=clean_env(HOME=str(tmp_path), PYTHONNOUSERSITE="1"))
    assert_one_line_error(unread, 2, f"module 'labtools' is in your user site {site}, which the image does not "
                          "read (it could shadow the image's TensorFlow and NumPy): set DISTRAIN_USER_SITE=1")
    read = subprocess.run(["/usr/bin/python3", "-c", "import labtools; print(labtools.ANSWER)"],
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)
    assert read.stdout.strip() == "42", read.stderr  # where Python reads it (outside a venv), it shadows packages


def test_full_disk_leaves_no_half_written_model(tmp_path):
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        out = run([DISTRAIN, "run", "examples/train.py", "--epochs", "1", "--save", str(disk / "m.keras")],
                  env=clean_env(DISTRAIN_CHECKPOINT="0"))
        assert_one_line_error(out, 3, "No space left on device")
        assert os.listdir(disk) == []


def test_script_exception_passes_through_once(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import tensorflow as tf\nraise RuntimeError('my bug')\n")
    out = run([DISTRAIN, "run", str(script)])
    assert out.returncode == 1
    assert out.stdout.count("Traceback") == 1 and "RuntimeError: my bug" in out.stdout
    exit_script = tmp_path / "seven.py"
    exit_script.write_text("import sys\nsys.exit(7)\n")
    assert run([DISTRAIN, "run", str(exit_script)]).returncode == 7


def test_jit_compile_with_several_ranks_on_cpus_is_refused_at_compile_with_one_line(tmp_path):
    """XLA cannot compile the step around MWM's all-reduce on CPUs (TensorFlow has no XLA CPU collectives): each rank
    says so in one line at compile(), exit 3, instead of TensorFlow's UnimplementedError in fit."""
    script = tmp_path / "xla.py"
    script.write_text("import keras\nmodel = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
                      "model.compile('sgd', 'mse', jit_compile=True)\nprint('COMPILED')\n")
    out = run([DISTRAIN, "launch", "-n", "2", str(script)])
    errors = [line for line in out.stdout.splitlines() if "distrain: error:" in line]
    assert out.returncode == 3 and errors and "Traceback" not in out.stdout and "COMPILED" not in out.stdout, out.stdout
    assert all("compile(jit_compile=True) under mwm with 2 ranks cannot work: TensorFlow's XLA has no collectives "
               "on CPUs" in line for line in errors), errors


def test_failing_rank_under_launch_reports_its_traceback_and_code(tmp_path):
    script = tmp_path / "rank_bug.py"
    script.write_text("import entrypoint as dt\nimport sys\nif dt.rank() == 1:\n    raise ValueError('rank one')\n"
                      "import time\ntime.sleep(60)\n")
    started = time.monotonic()
    out = run([DISTRAIN, "launch", "-n", "2", str(script)])
    assert out.returncode == 1 and time.monotonic() - started < 45
    assert out.stdout.count("Traceback") == 1 and "[1/2] ValueError: rank one" in out.stdout
    assert "worker 1 exited with code 1" in out.stdout


def test_port_in_use_is_named_within_seconds():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run([DISTRAIN, "run", "examples/train.py"],
                  env=clean_env(TF_CONFIG=tf_config(f"localhost:{port}", "localhost:1")))
    assert_one_line_error(out, 3, f"port {port} for rank 0 on localhost is unavailable")


def test_host_that_does_not_resolve():
    config = tf_config(f"localhost:{free_ports(1)[0]}", "no-such-node.invalid:1")
    out = run([DISTRAIN, "run", "examples/train.py"], env=clean_env(TF_CONFIG=config))
    assert_one_line_error(out, 3, "'no-such-node.invalid'")


def test_missing_worker_ends_with_a_message_not_a_hang():
    workers = [f"localhost:{port}" for port in free_ports(2)]
    config = tf_config(*workers)
    started = time.monotonic()
    out = run([DISTRAIN, "run", "examples/train.py"], env=clean_env(TF_CONFIG=config, DISTRAIN_START_TIMEOUT="8"),
              timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stdout[-2000:]  # stuck in C++: only a kill ends it
    assert f"did not all join within 8 s: not listening: rank 1 ({workers[1]}); a worker is missing" in out.stdout
    assert time.monotonic() - started < 60


@pytest.fixture(scope="module")
def venv_without_horovod(tmp_path_factory):
    """A real environment without Horovod (and without TensorFlow): distrain and its CLI dependencies only."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "typer", "spython"], check=True, capture_output=True, timeout=300)
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True, capture_output=True, timeout=300)
    return venv


def test_horovod_asked_for_but_absent(venv_without_horovod):
    out = run([str(venv_without_horovod / "bin" / "distrain"), "run", "examples/train.py"],
              env=clean_env(DISTRAIN_MODE="horovod"))
    assert_one_line_error(out, 3, "Horovod is not installed here")
    assert "scripts/build-horovod.sh" in out.stdout
