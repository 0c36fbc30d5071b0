"""Keras 3 checkpoints off the training's path: the weights and optimizer state read into a snapshot on the
training thread, the file written by a thread while training goes on (DISTRAIN_CHECKPOINT_ASYNC, on by default).

Why a snapshot of tensors holds: reading a variable (`tf.convert_to_tensor`) shares its buffer, and TensorFlow's
update ops copy a buffer another tensor still holds before they write it (copy on write). On the host the snapshot
keeps the values it read for the price of one copy of the model's state, made by the next step's updates at the
memory's speed. A variable on a GPU is copied to the host instead (the training waits for that copy, at the bus's
speed, not the disk's): a copy kept on the GPU could exhaust its memory in the next step. One write in flight (the
next snapshot, a stop's write and the fit's end wait for it): host memory bounded by one copy of the state
(`distrain doctor` says how much there is).

Keras writes the file: `model.save_weights` runs with its `H5IOStore` replaced by a recorder of what it is given
(which groups in which order, with which arrays), and the writer replays that into Keras' own `H5IOStore`: the
file is the one `save_weights` writes, `load_weights` reads it as ever. tf_keras' checkpoint is TensorFlow's
(CheckpointManager's `save`): it runs with TensorFlow's file-writing ops replaced by a recorder (`take_tensorflow`),
and the writer runs the recorded calls: the data, the index that completes it, then the manager's state file that
names it and its deletion of the checkpoint before the two kept. The files are the ones `save` writes, with the
values TensorFlow read for them (a variable's read is a host tensor sharing its buffer, a GPU's copied to the host
by TensorFlow itself).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..compat import registry
from ..log import get as log

H5_STORE = "keras.src.saving.saving_lib:H5IOStore"
OPTIMIZER_SAVE = "keras.src.optimizers.base_optimizer:BaseOptimizer.save_own_variables"
KNOWN_OPTIMIZER_SAVE = ("enumerate", "variables", "numpy", "str")  # `store[str(i)] = variable.numpy()`, no more
TF_WRITES = ("tensorflow.python.ops.io_ops:save_v2", "tensorflow.python.ops.gen_io_ops:merge_v2_checkpoints",
             "tensorflow.python.checkpoint.checkpoint_management:update_checkpoint_state_internal",
             "tensorflow.python.checkpoint.checkpoint_management:_delete_file_if_exists")
EXIT_WAIT_SECONDS = 300.0  # how long a process leaving at once (os._exit) waits for a checkpoint being written
_IN_FLIGHT: set[threading.Event] = set()  # each set once its write has ended
_EXIT_WAIT_REGISTERED = False


class Snapshot:
    """What `model.save_weights` gave Keras' store, in order: (group path, its metadata, {name: value})."""

    def __init__(self, store: Any = None) -> None:
        self.groups: list[tuple[str, Any, dict[str, Any]]] = []
        self.store: Any = store  # Keras' own H5IOStore, as it was when the snapshot was taken

    def write(self, path: str) -> None:
        """The weights file Keras would have written at `path`, made from the snapshot, flushed to the disk."""
        store = self.store(path, mode="w")
        try:
            for group, metadata, values in self.groups:
                entry = store.make(group) if metadata is None else store.make(group, metadata=metadata)
                for name, value in values.items():
                    entry[name] = value  # Keras' own conversion: the host copy, here
        finally:
            store.close()
        sync_file(path)


class Layout:
    """Which variables `model.save_weights` gave its store where, as a walk of the model found them: replayed
    (each variable read again) while the model, its optimizer and their variables are the same objects. Keras'
    walk reads every attribute of every layer (`dir()`): 70 ms of ResNet50's training thread; the replay, its
    reads alone. Only a walk that gave variables alone, each the model's or its optimizer's, is kept (a value
    computed by a layer's `save_own_variables` is taken anew each time)."""

    def __init__(self, key: tuple, groups: list[tuple[str, Any, list[tuple[str, Any]]]], held: list,
                 store: Any) -> None:
        self.key, self.groups, self.store = key, groups, store
        self._held = held  # the objects whose ids make the key, kept alive: an id is not reused meanwhile

    def read(self) -> Snapshot:
        snapshot = Snapshot(self.store)
        for path, metadata, variables in self.groups:
            snapshot.groups.append((path, metadata, {name: _held(variable) for name, variable in variables}))
        return snapshot


def layout_key(model: Any) -> tuple[tuple, list]:
    """What a layout is valid for: the model's and its optimizer's variables, by identity (and the objects)."""
    optimizer = getattr(model, "optimizer", None)
    held = [model, optimizer, *model.variables, *(getattr(optimizer, "variables", None) or [])]
    return tuple(id(obj) for obj in held), held


def take(model: Any, layout: Layout | None = None) -> tuple[Snapshot, Layout | None]:
    """The model's weights and optimizer state as `model.save_weights` reads them, without a file: tensors that
    share the variables' buffers (copied on the variables' next update); and the layout that replays this walk
    (`layout`, where it still holds, is replayed instead of walking the model)."""
    key, held = layout_key(model)
    if layout is not None and layout.key == key:
        return layout.read(), layout
    snapshot, groups = _walked(model)
    owned = {id(getattr(obj, "value", obj)) for obj in held}
    if groups is None or any(id(v) not in owned for _, _, variables in groups for _, v in variables):
        return snapshot, None
    return snapshot, Layout(key, groups, held, snapshot.store)


def _held(variable: Any) -> Any:
    """A variable's value as a tensor sharing its buffer (on the host: an accelerator's copied there)."""
    import tensorflow as tf

    held = tf.convert_to_tensor(variable)
    if on_accelerator(held.device):
        with tf.device("/cpu:0"):
            held = tf.identity(held)
    return held


def _walked(model: Any) -> tuple[Snapshot, list[tuple[str, Any, list[tuple[str, Any]]]] | None]:
    """Keras' own walk (`save_weights` with its store recorded): the snapshot, and which variable went where
    (None where a value was not a variable)."""
    import tensorflow as tf

    snapshot = Snapshot()
    only_variables = True

    class Entry(dict):
        def __init__(self) -> None:
            super().__init__()
            self.variables: list[tuple[str, Any]] = []

        def __setitem__(self, name: str, value: Any) -> None:
            nonlocal only_variables
            value = getattr(value, "value", value)  # a Keras variable: its TensorFlow (or distributed) variable
            only_variables = only_variables and isinstance(value, tf.Variable)
            if not isinstance(value, (tf.Variable, tf.Tensor)):
                super().__setitem__(name, _copied(value))
                return
            self.variables.append((name, value))
            super().__setitem__(name, _held(value))

    class Recorder:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def make(self, path: str, metadata: Any = None) -> Entry:
            entry = Entry()
            snapshot.groups.append((path, metadata, entry))
            return entry

        def close(self) -> None:
            pass

    # patch: checkpoint_snapshot.h5_store
    with registry.replaced("checkpoint_snapshot.h5_store", H5_STORE, Recorder) as snapshot.store, \
            registry.replaced("checkpoint_snapshot.h5_store", OPTIMIZER_SAVE, make=_variables_not_copies):
        model.save_weights(os.path.join(os.sep, "distrain-snapshot.weights.h5"))  # a name it checks, never opened
    if not only_variables:
        return snapshot, None
    return snapshot, [(path, metadata, entry.variables) for path, metadata, entry in snapshot.groups]


def _variables_not_copies(original: Callable[..., Any]) -> Callable[..., Any]:
    """Keras' optimizer gives its store each variable's `numpy()`: two copies of its state (TensorFlow's
    `numpy()` copies, the snapshot copies an array it is given) on the training thread, 20 ms of a 100 MB model's
    24. Given the variables, the snapshot reads them as tensors, as it does a layer's. Where Keras' method is not
    the one known (`KNOWN_OPTIMIZER_SAVE`), it is left as it is: the same file, slower."""
    # patch: checkpoint_snapshot.h5_store
    if tuple(sorted(original.__code__.co_names)) != tuple(sorted(KNOWN_OPTIMIZER_SAVE)):
        return original

    def save_own_variables(self: Any, store: Any) -> None:
        for i, variable in enumerate(self.variables):
            store[str(i)] = variable

    return save_own_variables


class TensorFlowSnapshot:
    """The file-writing calls a TensorFlow checkpoint's save made, in order, with the tensors it read."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.calls: list[tuple[str, Callable[..., Any], tuple, dict]] = []  # (which of TF_WRITES, the call, its args)

    def write(self) -> None:
        """The checkpoint's data and its index (complete from here), flushed to the disk; then what the save does
        once its files are there: the state file naming it, the deletion of the oldest."""
        import tensorflow as tf

        synced = False
        with tf.device("/cpu:0"):
            for spelled, call, args, kwargs in self.calls:
                if not synced and spelled not in TF_WRITES[:2]:
                    for path in glob.glob(glob.escape(self.prefix) + ".*"):
                        sync_file(path)
                    synced = True
                call(*args, **kwargs)


def take_tensorflow(save: Callable[[], Any], prefix: str) -> TensorFlowSnapshot:
    """What `save()` (a CheckpointManager's, whose next checkpoint is `prefix`) would write, without writing it:
    TensorFlow's save ops recorded with the tensors they were given. Where TensorFlow saves in a graph (several
    tasks: a function it traces), the ops run as they are: written in place."""
    from tensorflow.python.eager import context

    snapshot = TensorFlowSnapshot(prefix)

    def recorder(spelled: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def record(*args: Any, **kwargs: Any) -> Any:
                if not context.executing_eagerly():
                    return original(*args, **kwargs)
                snapshot.calls.append((spelled, original, args, kwargs))
                return None

            return record

        return make

    with contextlib.ExitStack() as stack:
        for spelled in TF_WRITES:
            # patch: checkpoint_snapshot.tf_writes
            stack.enter_context(registry.replaced("checkpoint_snapshot.tf_writes", spelled, make=recorder(spelled)))
        save()
    return snapshot


def on_accelerator(device: str) -> bool:
    """Whether a tensor's device (`/job:localhost/replica:0/task:0/device:GPU:0`) is not the host's."""
    return device.rsplit("device:", 1)[-1].split(":")[0].upper() not in ("CPU", "")


def _copied(value: Any) -> Any:
    import numpy as np

    return np.array(value, copy=True)


def sync_file(path: str) -> None:
    """Flush a written file to the disk (off the training's path, a checkpoint survives a node's crash too)."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class Writer:
    """One checkpoint write at a time, on a thread of its own for the fit (a thread started per write cost the
    training its start, 0.3 ms); what each reports (its seconds, or None: failed) read back on the training thread
    at the next `wait`. A write in flight when the interpreter exits (the script ended or failed meanwhile) ends
    whole first (`finish_writes`, at exit)."""

    def __init__(self, in_background: bool) -> None:
        self.in_background = in_background
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._in_flight: threading.Event | None = None
        self._done: list[float | None] = []

    def start(self, write: Callable[[], float | None]) -> None:
        """Run `write` (on the writer's thread where the plan says so); the previous write must have been waited
        for."""
        assert self._in_flight is None, "one write in flight"
        if not self.in_background:
            self._done.append(write())
            return
        if self._thread is None:
            _wait_at_exit()
            self._thread = threading.Thread(target=self._run, name="distrain-checkpoint", daemon=True)
            self._thread.start()
        self._in_flight = written = threading.Event()
        _IN_FLIGHT.add(written)
        self._writes.put((write, written))

    def _run(self) -> None:
        while True:
            write, written = self._writes.get()
            if write is None:
                return
            try:
                self._done.append(write())
            except Exception as exc:  # noqa: BLE001 - the thread serves the fit's next writes
                log().warning(f"a checkpoint's write failed ({type(exc).__name__}: {exc})")
                self._done.append(None)
            finally:
                _IN_FLIGHT.discard(written)
                written.set()

    def wait(self) -> list[float | None]:
        """Wait for the write in flight; the writes ended since the last wait, each its seconds (None: failed)."""
        if self._in_flight is not None:
            self._in_flight.wait()
            self._in_flight = None
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """At the fit's end, once waited for: the writer's thread leaves."""
        if self._thread is not None:
            self._writes.put((None, None))
            self._thread = None


def _wait_at_exit() -> None:
    """The interpreter's exit waits for a write in flight (the writer's thread is a daemon: an idle one never holds
    the exit)."""
    global _EXIT_WAIT_REGISTERED
    if not _EXIT_WAIT_REGISTERED:
        atexit.register(finish_writes)
        _EXIT_WAIT_REGISTERED = True


def finish_writes(timeout: float = EXIT_WAIT_SECONDS) -> None:
    """Before a process leaves with os._exit (a stop its input cannot reach, a lost peer, a stall): the checkpoint
    being written ends whole first, within `timeout` (an interpreter's own exit waits for it anyway)."""
    deadline = time.monotonic() + timeout
    for written in list(_IN_FLIGHT):
        written.wait(max(0.0, deadline - time.monotonic()))
