"""Losing no finished work: resume after a killed worker or a signal, corrupt checkpoints, concurrent saves."""

import os
import re
import signal
from pathlib import Path

import pytest

from helpers import (
    DISTRAIN,
    FULL_TIER,
    KERAS_FAMILIES,
    Watched,
    assert_trained_in_sync,
    clean_env,
    keras_env,
    run,
)

# A rerun after a killed worker and after a SIGTERM go through the launcher, the same for both Keras families: one
# family each (the other --full); each family's own checkpoint layout is read back in the corrupt-checkpoint test
# (both) and test_exact_resume.py
KILLED, SIGNALLED = (KERAS_FAMILIES, KERAS_FAMILIES) if FULL_TIER else (["keras3"], ["legacy"])


def start_launch(env, *args) -> Watched:
    return Watched([DISTRAIN, "launch", "-n", "2", "examples/train.py", *args], env)


def first_epoch(output: str) -> int:
    return int(re.search(r"Epoch (\d+)/", output).group(1))


@pytest.mark.parametrize("family", KILLED)
def test_killed_worker_then_rerun_resumes_at_the_last_epoch(tmp_path, family):
    env = keras_env(family, DISTRAIN_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    proc = start_launch({**env, "DISTRAIN_MAX_RESTARTS": "0"}, "--epochs", "8")  # a person reruns it
    before = proc.until("Epoch 4/")
    worker = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[1])
    os.kill(worker, signal.SIGKILL)
    assert proc.wait(timeout=60) != 0, before
    plan = run([DISTRAIN, "plan"], env=env)
    assert "resume: a checkpoint exists" in plan.stdout
    out = run([DISTRAIN, "launch", "-n", "2", "examples/train.py", "--epochs", "8"], env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "resumed from checkpoint" in out.stdout and first_epoch(out.stdout) == 4
    assert_trained_in_sync(out.stdout, workers=2)
    assert not (tmp_path / "ckpt" / "chief").exists()  # a completed fit removes its backup


@pytest.mark.parametrize("family", SIGNALLED)
def test_sigterm_checkpoints_every_rank_and_exits_75_then_resumes(tmp_path, family):
    # other --epochs on the rerun: a named run (DISTRAIN_RUN) continues whatever its arguments
    env = keras_env(family, DISTRAIN_CHECKPOINT_DIR=str(tmp_path / "ckpt"), DISTRAIN_RUN="digits")
    proc = start_launch(env, "--epochs", "30")
    proc.until("Epoch 3/")
    proc.send_signal(signal.SIGTERM)
    rest = proc.rest()
    assert proc.wait(timeout=60) == 75, rest
    assert rest.count("stopped on SIGTERM after saving a checkpoint") == 2
    at = re.search(r"rerun to resume at (epoch (\d+), step \d+)", rest)  # a seeded tf.data shuffle: positioned
    stopped_in = int(at[2])
    assert stopped_in >= 3  # the signal came during epoch 3: epochs 1-2 were complete
    out = run([DISTRAIN, "launch", "-n", "2", "examples/train.py", "--epochs", str(stopped_in + 2)], env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert first_epoch(out.stdout) == stopped_in and f"training goes on at {at[1]}" in out.stdout  # not redone
    assert_trained_in_sync(out.stdout, workers=2)


def forget_in_tf_keras_record(chief, stem: str) -> None:
    """What a kill between TensorFlow's write of ckpt-N and its CheckpointManager's record leaves: N unrecorded."""
    record = chief / "checkpoint"
    lines = record.read_text().splitlines()
    previous = re.findall(r'all_model_checkpoint_paths: "([^"]+)"', "\n".join(lines))[-2]
    kept = [f'model_checkpoint_path: "{previous}"' if line.startswith("model_checkpoint_path") else line
            for line in lines if not line.startswith("all_model") or f'"{stem}"' not in line]
    record.write_text("\n".join(kept) + "\n")


@pytest.mark.parametrize("family, recorded", [("keras3", True), ("legacy", True), ("legacy", False)])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path, family, recorded):
    ckpt = tmp_path / "ckpt"
    env = keras_env(family, DISTRAIN_CHECKPOINT_DIR=str(ckpt), DISTRAIN_RUN="digits")
    proc = Watched([DISTRAIN, "run", "examples/train.py", "--epochs", "50"], env)
    proc.until("Epoch 5/")
    proc.kill()
    proc.wait()
    chief = ckpt / "chief"
    done = "ckpt-*.index" if family == "legacy" else "ckpt-*.json"  # tf_keras's layout, distrain's for Keras 3
    newest = max(chief.glob(done), key=lambda p: int(p.name.split("-")[1].split(".")[0]))
    stem = newest.name.split(".")[0]
    for data in [*chief.glob(f"{stem}.data-*"), *chief.glob(f"{stem}.weights.h5")]:
        data.write_bytes(b"\0" * 64)  # truncated garbage, as a crash mid-write leaves it
    if not recorded:
        forget_in_tf_keras_record(chief, stem)
    out = run([DISTRAIN, "run", "examples/train.py", "--epochs", "6"], env=env)
    print("OUT>>", (chief / "checkpoint").read_text(), out.stdout[-2500:])
    assert "is unreadable" in out.stdout and "falling back" in out.stdout
    # the input was positioned for ckpt-4: it stops rather than train from the wrong batch (exit 75: requeue)
    assert out.returncode == 75 and "rerun to resume exactly from the previous one" in out.stdout, out.stdout[-3000:]
    out = run([DISTRAIN, "run", "examples/train.py", "--epochs", "6"], env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    # ckpt-N (N epochs done) was bad: resume from ckpt-(N-1) at epoch N. N is 4 or, where epoch 5 ended between
    # its first line and the kill (a few ms of MNIST digits), 5
    assert first_epoch(out.stdout) == int(stem.split("-")[1])


def test_concurrent_saves_to_one_path_always_leave_a_loadable_model(tmp_path):
    """Two launches (2 and 4 workers) save to the same path over and over while a reader keeps loading it."""
    target = tmp_path / "shared.keras"
    writer = ("import os, sys; os.environ['TF_USE_LEGACY_KERAS'] = '1'  # a tf_keras script: distrain keeps it\n"
              "import entrypoint as dt, tensorflow as tf\n"
              "model = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(256),"
              " tf.keras.layers.Dense(10)])\n"
              "for _ in range(15):\n    dt.save(model, sys.argv[1])\n")
    script = tmp_path / "saver.py"
    script.write_text(writer)
    # the same command twice at once is one run twice, which distrain refuses: these saves need no run state
    launches = [Watched([DISTRAIN, "launch", "-n", str(n), str(script), str(target)],
                        env=clean_env(DISTRAIN_CHECKPOINT="0")) for n in (2, 4)]
    reader = ("import os, sys, time; os.environ['TF_USE_LEGACY_KERAS'] = '1'\nimport tensorflow as tf\n"
              "loads = 0\nend = time.time() + 25\n"
              "while time.time() < end and loads < 40:\n"
              "    if os.path.exists(sys.argv[1]):\n"
              "        tf.keras.models.load_model(sys.argv[1]); loads += 1\n"
              "print('LOADS', loads)\n")
    read = run(["python", "-c", reader, str(target)], env=clean_env(), timeout=120)
    for launch in launches:  # read as they run (a thread each), their own sessions ended past the deadline
        assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    assert read.returncode == 0, read.stdout[-3000:]
    assert int(re.search(r"LOADS (\d+)", read.stdout).group(1)) > 0
    assert sorted(os.listdir(tmp_path)) == ["saver.py", "shared.keras"]  # no temp files left
