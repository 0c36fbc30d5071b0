"""The script's own saves, made safe in every mode: written by the chief alone, complete when they appear (a
temporary path beside the target, then a rename), and, under MWM, with no collective left for the other workers
to join (ON_READ variables read locally: compat/adopt.local_reads). The backups (checkpoint.py) write the same way.

Visible to every rank when that rank's call returns: a script that saves and loads back (a curriculum in phases,
`ModelCheckpoint(save_best_only=True)` then `load_model`) reads on every rank what the chief wrote. The other ranks
count their saves as the chief does, and the k-th one waits for the chief's k-th, which the chief records in the
run's state directory (its outcome: done, or the one line its failure said). Where a rank's path is not the chief's
(TensorFlow's tutorials give the other workers temporary directories) or the chief's file is not visible there (a
node's own disk), that rank then writes its own complete copy, as it would under plain MWM. Without a state
directory (DISTRAIN_CHECKPOINT=0) or under Horovod elastic (whose chief can change), the others return at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import runs
from ..engines import Engine
from ..errors import EnvironmentProblem
from ..log import get as log

CHIEF_SAVE_WAIT_SECONDS = 1800.0  # how long another rank waits for the chief's save of the same call (large models)
POLL_SECONDS = (0.02, 0.5)  # the first and the longest pause between two looks at the chief's record
_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")
_saving = threading.local()  # a save within a save (Keras' save calling save_weights) is the outer one's


def temp_sibling(path: str, tag: str) -> str:
    """A hidden path beside `path` with the same suffix (Keras picks the format from it; Keras 3's weights need
    `.weights.h5`)."""
    parent, name = os.path.split(os.path.abspath(path))
    suffix = ".weights.h5" if name.endswith(".weights.h5") else os.path.splitext(name)[1]
    if suffix not in (".weights.h5", *_FILE_SUFFIXES):
        suffix = ""
    stem = name[:len(name) - len(suffix)] if suffix else name
    return os.path.join(parent, f".{stem}.{tag}-{os.getpid()}{suffix}")


def remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def replace_atomically(tmp: str, path: str) -> None:
    """Move a finished file or directory onto `path`; the old one stays until the new one is in place."""
    if os.path.isdir(path) and not os.path.islink(path):
        old = temp_sibling(path, "old")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def check_writable(directory: str, what: str) -> None:
    """Fail with one clear line when `directory` cannot be created or written (before any training)."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".distrain-probe-"):
            pass
    except OSError as exc:
        raise EnvironmentProblem(
            f"{what} {directory} is not writable ({exc.strerror}): choose a writable directory"
        ) from None


class ScriptSaves:
    """The script's saves through Keras (`Model.save`, `Model.save_weights`, ModelCheckpoint's calls of them) and
    TensorFlow (`tf.train.Checkpoint`, its CheckpointManager: compat/tf_checkpoint.py), in the order this rank
    makes them (the module doc)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.made = 0
        self.chiefs_directories: set[str] = set()  # where this rank relies on the chief's files: not its to touch

    def save(self, model: Any, path: str | os.PathLike, save: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if getattr(_saving, "active", False):  # within a save (Keras' own or distrain's): not the script's
            save(model, path, *args, **kwargs)
            return
        with distrains_own():  # what this save calls is not counted again
            engine = self.engine
            self._written_once(os.fspath(path), lambda p: write_complete(engine, model, p, save, *args, **kwargs),
                               os.path.exists)

    def write_checkpoint(self, prefix: str, write: Callable[[str], Any]) -> Any:
        """A TensorFlow checkpoint `prefix` (its files `prefix.index`, `prefix.data-*`), written in place by
        `write(prefix)`; what `write` returns, or `prefix` where this rank left it to the chief."""
        if getattr(_saving, "active", False):
            return write(prefix)
        with distrains_own():
            def written(path: str) -> Any:
                with self.engine.local_reads():
                    return write(path)

            found = self._written_once(prefix, written, lambda path: os.path.exists(path + ".index"))
        if found is None:
            self.chiefs_directories.add(os.path.dirname(os.path.abspath(prefix)))
            return prefix
        self.chiefs_directories.discard(os.path.dirname(os.path.abspath(prefix)))
        return found

    def relies_on_the_chief(self, path: str) -> bool:
        """Whether `path` is in a directory whose checkpoints this rank left to the chief."""
        return os.path.dirname(os.path.abspath(path)) in self.chiefs_directories

    def _written_once(self, path: str, write: Callable[[str], Any], visible: Callable[[str], bool]) -> Any:
        """The chief writes `path` and records it; another rank waits for the chief's save of the same number and
        writes its own copy only where its path is not the chief's or the chief's is not visible to it. What this
        rank's own `write` returned; None where it wrote nothing."""
        engine, plan = self.engine, self.engine.plan
        record = os.path.join(plan.checkpoint_dir, runs.SAVES_RECORD) if plan.checkpoint_dir else None
        waits = record is not None and engine.size > 1 and not plan.elastic
        self.made += 1
        if engine.rank == 0:
            try:
                result = write(path)
            except BaseException as exc:
                if waits:
                    said = str(exc)
                    runs.write_private_json(record, {"made": self.made, "path": os.path.abspath(path),
                                                     "failed": said.splitlines()[0] if said else repr(exc)})
                raise
            if waits:
                runs.write_private_json(record, {"made": self.made, "path": os.path.abspath(path)})
            return result
        if not waits:
            return None
        chief_path = wait_for_the_chief(record, self.made, path)
        if chief_path != os.path.abspath(path) or not visible(path):
            return write(path)  # this rank's own path: its own copy
        return None


def wait_for_the_chief(record: str, made: int, path: str, timeout: float = CHIEF_SAVE_WAIT_SECONDS) -> str:
    """Wait until the chief has made its `made`-th save; return the path it saved to, or fail with its line."""
    deadline, pause = time.monotonic() + timeout, POLL_SECONDS[0]
    while True:
        with contextlib.suppress(OSError, ValueError):
            with open(record) as handle:
                done = json.load(handle)
            if done["made"] > made or (done["made"] == made and "failed" not in done):
                return done["path"]
            if done["made"] == made:
                raise EnvironmentProblem(f"the chief's save of {done['path']} failed: {done['failed']}")
        if time.monotonic() > deadline:
            raise EnvironmentProblem(
                f"waited {timeout:.0f} s for the chief to save {path} (the script's save number {made}): the chief "
                "is stuck or saves in another order than this rank (a save on some ranks only?)")
        time.sleep(pause)
        pause = min(pause * 2, POLL_SECONDS[1])


def save_model(engine: Engine, model: Any, path: str | os.PathLike, save: Callable[..., Any], *args: Any,
               **kwargs: Any) -> None:
    """Save so that only the chief's complete copy ever appears at `path`. The chief is rank 0 now (engine.rank:
    under Horovod elastic a survivor can become rank 0 after a reset)."""
    if engine.rank == 0:
        write_complete(engine, model, os.fspath(path), save, *args, **kwargs)


def write_complete(engine: Engine, model: Any, path: str, save: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Write through a temporary sibling and a rename, so that `path` holds the previous save or this one, whole.
    A TensorFlow checkpoint prefix (tf_keras' save_weights without .h5) is several files: written in place."""
    parent = os.path.dirname(os.path.abspath(path))
    check_writable(parent, "the model's directory")
    suffix_known = os.path.splitext(path)[1] in _FILE_SUFFIXES
    in_place = not suffix_known and getattr(save, "__name__", "") == "save_weights"
    tmp = path if in_place else temp_sibling(path, "tmp")
    try:
        with engine.local_reads():  # a chief's save joins no collective
            save(model, tmp, *args, **kwargs)
        if not in_place:
            replace_atomically(tmp, path)
    except OSError as exc:
        if not in_place:
            remove_path(tmp)
        raise EnvironmentProblem(
            f"could not save the model to {path} ({exc.strerror or exc}): free space or choose another path; "
            f"{'the previous model there is unchanged' if os.path.exists(path) else 'nothing was written there'}"
        ) from None
    except BaseException:
        if not in_place:
            remove_path(tmp)
        raise
    log().info(f"saved model to {path}")


@contextlib.contextmanager
def callback_files_aside(engine: Engine, keras: Any, callbacks: list) -> Iterator[None]:
    """On every rank but the chief, the script's TensorBoard and CSVLogger write into a private temporary directory
    removed after the fit: their files are the chief's alone, as one process leaves them (every rank wrote its own
    event files into the script's log directory, and one CSV file at once). The chief makes ModelCheckpoint's
    directory first."""
    if engine.size > 1 and engine.rank == 0:
        make_checkpoint_directories(keras, callbacks)
    with _own_backups_written_by_the_chief(engine, keras, callbacks), _aside(engine, keras, callbacks):
        yield


@contextlib.contextmanager
def _own_backups_written_by_the_chief(engine: Engine, keras: Any, callbacks: list) -> Iterator[None]:
    """The script's own Keras 3 BackupAndRestore with several ranks: every rank reads the backup when the fit
    starts (they resume alike), the chief alone writes it and deletes it at the end, uncounted among the script's
    saves (distrains_own). Each rank wrote and removed it: `FileExistsError` from one rank's check-then-mkdir of the
    backup directory, one file written by all (#69). tf_keras' own keeps its per-worker files (Keras' MWM rules)."""
    own = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore) and hasattr(c, "_save_model")]
    if engine.size == 1 or not own:
        yield
        return
    chief = engine.rank == 0
    for callback in own:
        save, end = callback._save_model, callback.on_train_end

        def chief_save(save: Callable[[], None] = save) -> None:
            with distrains_own():
                save()

        # patch: saves.own_backup
        callback._save_model = chief_save if chief else (lambda: None)
        callback.on_train_end = end if chief else (lambda logs=None: None)
    try:
        yield
    finally:
        for callback in own:
            # patch: saves.own_backup
            del callback._save_model, callback.on_train_end  # the class's methods again


@contextlib.contextmanager
def _aside(engine: Engine, keras: Any, callbacks: list) -> Iterator[None]:
    if engine.rank == 0 or engine.size == 1:
        yield
        return
    # patch: saves.callback_files
    kinds = ((keras.callbacks.TensorBoard, "log_dir"), (keras.callbacks.CSVLogger, "filename"))
    moved = [(callback, attribute, getattr(callback, attribute)) for callback in callbacks
             for kind, attribute in kinds if isinstance(callback, kind)]
    if not moved:
        yield
        return
    aside = tempfile.mkdtemp(prefix=f"distrain-rank{engine.rank}-")  # 0700
    for number, (callback, attribute, path) in enumerate(moved):
        os.mkdir(os.path.join(aside, str(number)))
        setattr(callback, attribute, os.path.join(aside, str(number), os.path.basename(str(path))))
    try:
        yield
    finally:
        for callback, attribute, path in moved:
            setattr(callback, attribute, path)
        shutil.rmtree(aside, ignore_errors=True)


def make_checkpoint_directories(keras: Any, callbacks: list) -> None:
    """The chief makes ModelCheckpoint's directory before the fit's first step: Keras makes it at the first save,
    on every rank at once, where one rank's check-then-mkdir can fail on the other's (FileExistsError)."""
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.ModelCheckpoint):
            directory = os.path.dirname(os.path.abspath(os.fspath(callback.filepath)))
            if "{" not in directory:
                os.makedirs(directory, exist_ok=True)


@contextlib.contextmanager
def distrains_own() -> Iterator[None]:
    """distrain's own saves (the backups, a fit's end state): not the script's, never counted or waited for."""
    before = getattr(_saving, "active", False)
    _saving.active = True
    try:
        yield
    finally:
        _saving.active = before


def save_weights_locally(engine: Engine, model: Any, path: str) -> None:
    """The chief's model.save_weights, with no collective for the other ranks to join (Engine.local_reads)."""
    with engine.local_reads(), distrains_own():
        model.save_weights(path)
