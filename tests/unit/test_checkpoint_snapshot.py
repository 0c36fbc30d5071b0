"""A Keras 3 checkpoint off the training's path (entrypoint/fit/checkpoint_snapshot.py): the snapshot holds the
values of the moment it was taken while training goes on, and the writer makes the file `save_weights` makes."""

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from entrypoint.fit import checkpoint_snapshot
from entrypoint.fit.stop_cost import StopCost
from entrypoint.runs_view import describe_stop_cost
from entrypoint.tools.hostcheck import checkpoint_memory

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.core  # Keras 3.3 and the newest Keras: the store's interface changed between them


@pytest.fixture(scope="module")
def keras():
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip("Keras 3's checkpoints")
    return keras


def trained_model(keras):
    # no seed set: TensorFlow's global seed would outlive this test in its process (test_own_shards reads it unset)
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(16), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((32, 8)), np.ones((32, 1)), verbose=0)
    return model


def layout(path):
    found = []
    with h5py.File(path) as handle:
        handle.visititems(lambda name, item: found.append((name, getattr(item, "shape", None), dict(item.attrs))))
    return found


def test_the_snapshot_keeps_the_values_of_its_moment_while_training_goes_on(keras, tmp_path):
    model = trained_model(keras)
    then = [np.array(v) for v in [*model.weights, *model.optimizer.variables]]
    snapshot, _ = checkpoint_snapshot.take(model)
    model.fit(np.ones((32, 8)), np.zeros((32, 1)), verbose=0)  # every weight and Adam's slots move
    assert not np.array_equal(then[0], np.array(model.weights[0]))
    snapshot.write(str(tmp_path / "snap.weights.h5"))
    model.load_weights(str(tmp_path / "snap.weights.h5"))
    now = [np.array(v) for v in [*model.weights, *model.optimizer.variables]]
    assert all(np.array_equal(a, b) for a, b in zip(then, now, strict=True))


def test_negative_control_a_snapshot_of_the_variables_themselves_writes_later_values(keras):
    """Why the snapshot reads tensors: holding the variables, the file would get the weights of the write's time."""
    model = trained_model(keras)
    then = np.array(model.weights[0])
    held = {"kernel": model.weights[0]}
    model.fit(np.ones((32, 8)), np.zeros((32, 1)), verbose=0)
    assert not np.array_equal(then, np.array(held["kernel"]))


def test_the_file_is_the_one_save_weights_writes(keras, tmp_path):
    model = trained_model(keras)
    checkpoint_snapshot.take(model)[0].write(str(tmp_path / "snap.weights.h5"))
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    assert layout(tmp_path / "snap.weights.h5") == layout(tmp_path / "keras.weights.h5")
    assert keras.src.saving.saving_lib.H5IOStore.__name__ == "H5IOStore"  # Keras' own again once taken
    assert "numpy" in keras.src.optimizers.base_optimizer.BaseOptimizer.save_own_variables.__code__.co_names


def test_a_later_snapshot_replays_the_walk_while_the_model_is_the_same_and_writes_the_same_file(keras, tmp_path):
    """Keras' walk of the model (every layer's attributes) is 70 ms of ResNet50's training thread: replayed, each
    variable is read again; the file and the values are those a new walk gives."""
    model = trained_model(keras)
    _, walk = checkpoint_snapshot.take(model)
    model.fit(np.ones((32, 8)), np.zeros((32, 1)), verbose=0)
    replayed, again = checkpoint_snapshot.take(model, walk)
    walked, _ = checkpoint_snapshot.take(model)
    assert walk is not None and again is walk
    replayed.write(str(tmp_path / "replayed.weights.h5"))
    walked.write(str(tmp_path / "walked.weights.h5"))
    assert layout(tmp_path / "replayed.weights.h5") == layout(tmp_path / "walked.weights.h5")
    with h5py.File(tmp_path / "replayed.weights.h5") as one, h5py.File(tmp_path / "walked.weights.h5") as other:
        arrays = []
        one.visititems(lambda name, item: arrays.append(name) if isinstance(item, h5py.Dataset) else None)
        assert arrays and all(np.array_equal(one[name][()], other[name][()]) for name in arrays)


def test_a_changed_model_or_a_value_not_a_variable_is_walked_anew(keras):
    model = trained_model(keras)
    _, walk = checkpoint_snapshot.take(model)
    model.compile(optimizer="sgd", loss="mse")  # another optimizer: its variables are not the walk's
    model.fit(np.ones((32, 8)), np.ones((32, 1)), verbose=0)
    snapshot, fresh = checkpoint_snapshot.take(model, walk)
    assert fresh is not None and fresh is not walk
    assert [group for group, _, _ in snapshot.groups] == [group for group, _, _ in checkpoint_snapshot.take(model)[
        0].groups]

    class Counted(keras.layers.Layer):  # a layer whose saved state is computed, not a variable
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def call(self, inputs):
            return inputs

        def save_own_variables(self, store):
            self.calls += 1
            store["calls"] = np.array(self.calls)

    counted = keras.Sequential([keras.layers.Input((8,)), Counted(), keras.layers.Dense(1)])
    counted.compile(optimizer="adam", loss="mse")
    first, none = checkpoint_snapshot.take(counted)
    second, _ = checkpoint_snapshot.take(counted, none)
    assert none is None
    assert [dict(entry).get("calls") for _, _, entry in second.groups if "calls" in entry] == [2]


def test_the_optimizer_gives_its_variables_where_its_save_is_the_one_known_else_it_is_left_alone():
    def known(self, store):
        for i, variable in enumerate(self.variables):
            store[str(i)] = variable.numpy()

    def changed(self, store):  # another layout: not replaced
        for variable in self.variables:
            store[variable.path] = variable.numpy()

    class Optimizer:
        variables = ["m", "v"]

    store = {}
    checkpoint_snapshot._variables_not_copies(known)(Optimizer(), store)
    assert store == {"0": "m", "1": "v"}
    assert checkpoint_snapshot._variables_not_copies(changed) is changed


def test_a_gpus_variables_are_copied_to_the_host_the_hosts_are_shared():
    assert checkpoint_snapshot.on_accelerator("/job:localhost/replica:0/task:0/device:GPU:0")
    assert checkpoint_snapshot.on_accelerator("/job:worker/replica:0/task:1/device:GPU:3")
    assert not checkpoint_snapshot.on_accelerator("/job:localhost/replica:0/task:0/device:CPU:0")
    assert not checkpoint_snapshot.on_accelerator("")


def test_doctor_says_the_host_memory_a_snapshot_has_and_warns_when_short(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemAvailable:    2097152 kB\n")
    line, warning = checkpoint_memory(True, str(meminfo))
    assert "(2.0 GiB available)" in line and "DISTRAIN_CHECKPOINT_ASYNC=0" in warning
    meminfo.write_text("MemAvailable:   67108864 kB\n")
    assert checkpoint_memory(True, str(meminfo))[1] is None
    assert checkpoint_memory(False, str(meminfo)) == ("checkpoints: written in place (DISTRAIN_CHECKPOINT_ASYNC=0)",
                                                      None)


def test_one_write_in_flight_its_time_read_back_at_the_next_wait():
    writer, release, order = checkpoint_snapshot.Writer(in_background=True), threading.Event(), []

    def slow() -> float:
        assert release.wait(timeout=30)
        order.append("written")
        return 0.5

    writer.start(slow)
    with pytest.raises(AssertionError, match="one write in flight"):
        writer.start(lambda: 0.1)
    order.append("training goes on")
    release.set()
    assert writer.wait() == [0.5] and order == ["training goes on", "written"]
    assert writer.wait() == []
    writer.start(lambda: None)  # a failed write (a full disk): None
    checkpoint_snapshot.finish_writes(timeout=30)
    assert writer.wait() == [None]


def test_one_thread_serves_the_fits_writes_a_failed_one_reported_and_the_next_written():
    writer, threads = checkpoint_snapshot.Writer(in_background=True), []

    def written(seconds: float) -> Callable[[], float]:
        return lambda: threads.append(threading.get_ident()) or seconds

    def fails() -> float:
        raise OSError("No space left on device")

    writer.start(written(0.1))
    assert writer.wait() == [0.1]
    writer.start(fails)
    assert writer.wait() == [None]
    writer.start(written(0.2))
    assert writer.wait() == [0.2]
    assert len(set(threads)) == 1 and threading.get_ident() not in threads
    writer.close()


def test_the_interpreters_exit_waits_for_a_write_in_flight(tmp_path):
    """The writer's thread is a daemon (an idle one never holds the exit): a script ending while a checkpoint is
    being written leaves once it is whole."""
    script = tmp_path / "ends.py"
    script.write_text(
        "import time\n"
        "from entrypoint.fit import checkpoint_snapshot\n"
        "def write():\n"
        "    time.sleep(1.0)\n"
        f"    open({str(tmp_path / 'whole')!r}, 'w').close()\n"
        "    return 1.0\n"
        "checkpoint_snapshot.Writer(in_background=True).start(write)\n")
    ended = subprocess.run([sys.executable, str(script)], cwd=ROOT, timeout=60, capture_output=True, text=True)
    assert ended.returncode == 0, ended.stderr
    assert (tmp_path / "whole").exists()


def test_in_place_the_write_is_done_on_the_training_thread_before_start_returns():
    writer, threads = checkpoint_snapshot.Writer(in_background=False), []
    writer.start(lambda: threads.append(threading.get_ident()) or 0.25)
    assert threads == [threading.get_ident()] and writer.wait() == [0.25]


def test_a_stop_that_may_wait_for_a_write_in_flight_counts_it_against_the_lead(tmp_path):
    warned = []
    for behind, expected in ((False, 0), (True, 1)):
        (tmp_path / str(behind)).mkdir()
        cost = StopCost(str(tmp_path / str(behind)), lead=5.0, agree_seconds=2.0, warn=warned.append,
                        writes_behind=behind)
        cost.wrote(2.0)
        cost.blocked(0.01)
        cost.step_ended()
        cost.epoch_ended()  # 2 s agreeing + a 2 s write: within 5 s; with one in flight too, 6 s: not
        assert len(warned) == expected, warned
        assert cost.known["checkpoint_blocked"] == [0.01]
    assert "training held 0.01 s by each" in describe_stop_cost(cost.known)
