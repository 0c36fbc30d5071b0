"""Shared clusters: private default work dirs, a lost peer reported as such, and a clean job log."""

import json
import os
import re
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path

import pytest

from helpers import CPP_CHATTER, DISTRAIN, Watched, clean_env, free_ports, run

NOBODY = 65534


@pytest.fixture
def fresh_user():
    """A user name whose default work dir (/tmp/NAME/distrain) does not exist yet; removed afterwards."""
    name = f"distrain-test-{uuid.uuid4().hex[:8]}"
    yield name
    shutil.rmtree(f"/tmp/{name}", ignore_errors=True)


def tree_modes(top: str) -> dict[str, int]:
    modes = {}
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(directory, name)
            modes[os.path.relpath(path, top)] = stat.S_IMODE(os.lstat(path).st_mode)
    return modes


@pytest.mark.parametrize("planted", ["/tmp/USER/distrain", "/tmp/USER"])
def test_a_default_work_dir_made_by_another_user_is_refused(fresh_user, planted):
    path = Path(planted.replace("USER", fresh_user))
    path.mkdir(parents=True)
    os.chmod(path, 0o777)
    os.chown(path, NOBODY, NOBODY)
    out = run([DISTRAIN, "run", "examples/train.py", "--epochs", "1"], env=clean_env(USER=fresh_user))
    assert out.returncode == 3, out.stdout[-2000:]
    errors = [line for line in out.stdout.splitlines() if "distrain: error:" in line]
    assert len(errors) == 1 and f"{path} is owned by uid {NOBODY}" in errors[0], out.stdout[-2000:]
    assert "Traceback" not in out.stdout and "Epoch" not in out.stdout
    assert os.listdir(path) == []  # nothing written below it


def test_the_same_rule_guards_the_image_cache(fresh_user):
    planted = Path(f"/tmp/{fresh_user}/distrain")
    planted.mkdir(parents=True)
    os.chown(planted, NOBODY, NOBODY)
    out = run([DISTRAIN, "image", "pull", "docker://127.0.0.1:5000/none:latest", "/tmp/never.sif"],
              env=clean_env(USER=fresh_user))
    assert out.returncode == 3 and f"{planted} is owned by uid {NOBODY}" in out.stdout, out.stdout
    assert os.listdir(planted) == []


def test_a_fresh_default_work_dir_is_private_down_to_each_checkpoint_file(fresh_user):
    proc = Watched([DISTRAIN, "run", "examples/train.py", "--epochs", "50"], clean_env(USER=fresh_user))
    proc.until("Epoch 3/")
    proc.kill()
    modes = tree_modes(f"/tmp/{fresh_user}")
    checkpoint_files = [p for p in modes if "/chief/ckpt-" in p]
    assert checkpoint_files, modes
    assert stat.S_IMODE(os.stat(f"/tmp/{fresh_user}").st_mode) == 0o700
    for path, bits in modes.items():
        expected = 0o700 if os.path.isdir(f"/tmp/{fresh_user}/{path}") else 0o600
        assert bits == expected, f"{path}: {bits:o}"


def test_a_named_group_writable_dir_is_used(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    os.chmod(project, 0o2770)
    out = run([DISTRAIN, "run", "examples/train.py", "--epochs", "1"], env=clean_env(DISTRAIN_OUTPUT_DIR=str(project)))
    assert out.returncode == 0, out.stdout[-2000:]
    assert "warning" not in out.stdout.lower() or "writable by every user" not in out.stdout
    assert (project / "runs").is_dir()


def start_tf_config_pair(script_args, **env):
    ports = free_ports(2)
    workers = [f"localhost:{p}" for p in ports]
    procs = []
    for index in range(2):
        config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        procs.append(Watched([DISTRAIN, "run", *script_args],
                             clean_env(TF_CONFIG=config, DISTRAIN_CHECKPOINT="0", **env)))
    return workers, procs


@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.core)])  # 2.21: the chief lost
def test_a_lost_peer_under_a_bare_tf_config_is_named_with_exit_4(victim):
    workers, procs = start_tf_config_pair(["examples/train.py", "--epochs", "500"])
    survivor = 1 - victim
    procs[0].until("Epoch 3/")
    procs[victim].kill()
    killed = time.monotonic()
    rest = procs[survivor].rest(timeout=90)
    code = procs[survivor].wait(timeout=10)
    assert time.monotonic() - killed < 60
    assert code == 4, rest[-3000:]
    last = rest.strip().splitlines()[-1]
    assert re.search(rf"distrain: error: lost worker {victim} \({workers[victim]}\)", last), rest[-3000:]
    assert "Traceback" not in rest


def test_a_lost_peer_under_launch_is_the_last_line_with_exit_4():
    proc = Watched([DISTRAIN, "launch", "-n", "2", "examples/train.py", "--epochs", "500"],
                   clean_env(DISTRAIN_CHECKPOINT="0"))
    proc.until("Epoch 2/")
    worker = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[1])
    os.kill(worker, signal.SIGKILL)
    rest = proc.rest(timeout=60)
    assert proc.wait() == 4, rest
    assert re.match(r"distrain: error: lost worker 1 \(localhost:\d+\): killed by SIGKILL",
                    rest.strip().splitlines()[-1]), rest
    assert "Traceback" not in rest


def python_with_env(marker: str, variable: bytes) -> int:
    """The Python process whose environment holds both `marker` and `variable` (a horovodrun rank)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if marker.encode() in b"\0".join(environ) and variable in environ and b"python" in command:
            return int(pid)
    raise AssertionError(f"no process with {variable!r}")


def test_a_lost_peer_under_horovodrun_is_named_by_the_survivor():
    marker = f"DISTRAIN_RUN_ID=hvd-{uuid.uuid4().hex[:8]}"
    proc = Watched(["horovodrun", "-np", "2", "--gloo", DISTRAIN, "run", "examples/train.py", "--epochs", "500"],
                   clean_env(DISTRAIN_CHECKPOINT="0", **dict([marker.split("=")])))
    proc.until("Epoch 3/")
    os.kill(python_with_env(marker, b"HOROVOD_RANK=1"), signal.SIGKILL)
    rest = proc.rest(timeout=90)
    survivor = [line.split(":", 1)[1] for line in rest.splitlines() if line.startswith("[0]<")]
    assert re.match(r"\[0/2\] distrain: error: lost worker 1 \(\S+:\d+\)", survivor[-1]), rest[-3000:]
    # the survivor exits 4 right after that line, unless horovodrun, which saw rank 1 die first, ends it sooner
    assert "Process 0 exit with status code 4" in rest or \
        "Terminating remaining workers after failure of Process 1" in rest, rest[-3000:]
    assert not [line for line in survivor if "Traceback" in line]


@pytest.mark.core
def test_the_job_log_has_no_cpp_chatter_unless_asked_for():
    # without it, none: test_single_and_mwm.py::test_mwm_synchronises_ranks_that_start_apart (both families)
    verbose = run([DISTRAIN, "launch", "-n", "2", "examples/train.py", "--epochs", "1"],
                  env=clean_env(DISTRAIN_VERBOSE="1"))
    assert verbose.returncode == 0 and CPP_CHATTER.search(verbose.stdout), verbose.stdout[-3000:]


def test_a_stop_with_checkpoints_off_says_nothing_was_saved():
    proc = Watched([DISTRAIN, "run", "examples/train.py", "--epochs", "500"],
                   clean_env(DISTRAIN_CHECKPOINT="0", DISTRAIN_STOP_CHECK_SECONDS="0.5"))
    proc.until("Epoch 2/")
    proc.send_signal(signal.SIGTERM)
    rest = proc.rest(timeout=60)
    assert proc.wait() == 75, rest
    assert "stopped on SIGTERM; distrain saved nothing" in rest and "at None" not in rest


def test_doctor_states_the_trust_model():
    out = run([DISTRAIN, "doctor"])
    assert re.search(r"^security: .*no authentication", out.stdout, re.MULTILINE), out.stdout
