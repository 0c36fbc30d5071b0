"""`tf.train.Checkpoint`, `tf.train.CheckpointManager` and `tf.saved_model.save` written once, by the chief, with
several ranks.

A script that checkpoints as TensorFlow's guides do (`manager.save()` each epoch, `checkpoint.restore(
manager.latest_checkpoint)`) calls them on every rank. Under MWM x2 and Horovod x2 every rank then wrote the same
files at once: `MergeV2Checkpoints` failed on a part another rank had already merged ("did not exist"), and the
other rank hung in its next collective (#69). Here the checkpoint's files go through the script's saves
(fit/saves.py): the chief writes them, reading ON_READ variables locally under MWM; another rank waits for the
chief's save of the same number and returns its path, or writes its own copy where its path is not the chief's
(TensorFlow's multi-worker tutorial gives the other workers temporary directories). Where a rank left a
directory's checkpoints to the chief, the chief alone writes that directory's `checkpoint` state file and
deletes its old checkpoints (CheckpointManager's `max_to_keep`): the others keep their managers' state in memory.
`tf.saved_model.save` (TensorFlow's save-and-load tutorial, by every worker) goes the way of `model.save`: the chief
writes a temporary sibling and renames it, the others wait for it (#84: tf_keras MWM x2, MergeV2Checkpoints: a part
'did not exist').
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class OneWriter(Protocol):
    """What routes the script's saves (fit/saves.py's ScriptSaves)."""

    def write_checkpoint(self, prefix: str, write: Callable[[str], Any]) -> Any: ...

    def relies_on_the_chief(self, path: str) -> bool: ...

    def save(self, model: Any, path: str, save: Callable[..., Any], *args: Any, **kwargs: Any) -> None: ...


CHECKPOINT = "tensorflow.python.checkpoint.checkpoint"
MANAGEMENT = "tensorflow.python.checkpoint.checkpoint_management"
SAVED_MODEL = "tensorflow.python.saved_model.save"


def install(script_saves: OneWriter) -> None:
    """Route every tf.train.Checkpoint write (`write`, `save`, CheckpointManager's `save`) through
    `script_saves`, for the rest of the process (runner.py: with several ranks)."""
    import importlib

    checkpoint, management = importlib.import_module(CHECKPOINT), importlib.import_module(MANAGEMENT)
    write, update_state, delete = (checkpoint.Checkpoint._write, management.update_checkpoint_state_internal,
                                   management._delete_file_if_exists)

    def _write(self: Any, file_prefix: Any, options: Any = None) -> Any:
        if not isinstance(file_prefix, str):  # a tensor (graph mode): left as TensorFlow writes it
            return write(self, file_prefix, options=options)
        return script_saves.write_checkpoint(file_prefix, lambda prefix: write(self, prefix, options=options))

    def update_checkpoint_state_internal(save_dir: Any, *args: Any, **kwargs: Any) -> Any:
        if script_saves.relies_on_the_chief(f"{save_dir}/checkpoint"):
            return None  # the chief's state file
        return update_state(save_dir, *args, **kwargs)

    def _delete_file_if_exists(filespec: Any) -> Any:
        if script_saves.relies_on_the_chief(str(filespec)):
            return None  # the chief's old checkpoint: the chief deletes it
        return delete(filespec)

    # patch: tf_checkpoint.one_writer
    checkpoint.Checkpoint._write = _write
    management.update_checkpoint_state_internal = update_checkpoint_state_internal
    management._delete_file_if_exists = _delete_file_if_exists
    _save_saved_models_once(script_saves, importlib.import_module(SAVED_MODEL))


def _save_saved_models_once(script_saves: OneWriter, saved_model: Any) -> None:
    """tf.saved_model.save (the public name and its module's) through the script's saves."""
    import functools

    import tensorflow as tf

    original = saved_model.save

    @functools.wraps(original)
    def save(obj: Any, export_dir: Any, *args: Any, **kwargs: Any) -> None:
        script_saves.save(obj, export_dir, original, *args, **kwargs)

    # patch: tf_checkpoint.one_writer
    saved_model.save = save
    if tf.saved_model.save is original:
        tf.saved_model.save = save
