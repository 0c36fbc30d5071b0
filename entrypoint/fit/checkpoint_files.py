"""The chief's checkpoint directory: a write guarded against a full disk (what it left half-written removed, the
previous checkpoint untouched), a bad checkpoint set aside with TensorFlow's record pointed at the one before, the
records of checkpoints tf_keras' CheckpointManager has since deleted dropped."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import time
from collections.abc import Callable
from typing import Any

from ..log import get as log
from ..runs import newest_checkpoint
from .saves import remove_path

CORRUPT = ".corrupt"  # the suffix of a checkpoint's files set aside


def drop_orphan_sidecars(chief_dir: str) -> None:
    """What distrain wrote beside a tf_keras checkpoint its CheckpointManager has since deleted (the position, the
    callbacks' state, EarlyStopping's best weights: a model's size each)."""
    for path in glob.glob(os.path.join(chief_dir, "ckpt-*.*")):
        prefix = path[: path.index(".", len(chief_dir) + 1)]
        if not glob.glob(prefix + ".index"):
            remove_path(path)


def drop_checkpoint(directory: str, prefix: str) -> None:
    """Move a bad checkpoint aside and point the index at the newest remaining one. Every rank that found it bad
    does so, at once on a shared filesystem: a file another rank moved first is left to it."""
    for path in glob.glob(glob.escape(prefix) + ".*"):
        if not path.endswith(CORRUPT):
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, path + CORRUPT)
    remaining = newest_checkpoint(directory)
    index = os.path.join(directory, "checkpoint")
    if remaining is None:
        remove_path(index)
        return
    name = os.path.basename(remaining)
    temporary = f"{index}.tmp-{os.getpid()}"  # each rank its own: none renames another's
    with open(temporary, "w") as handle:
        handle.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    os.replace(temporary, index)


def write_guarded(write: Callable[[], Any], chief_dir: str, wrote: Callable[[float], None] | None) -> bool:
    """Run the chief's checkpoint write (`wrote` told how long it took); if it fails (a full disk, a quota), remove
    what it left half-written in `chief_dir`, say so in one line and go on training: the previous checkpoint is
    untouched. True if written."""
    existing = set(glob.glob(os.path.join(chief_dir, "ckpt-*")))
    try:
        started = time.monotonic()
        write()
        if wrote is not None:
            wrote(time.monotonic() - started)
        return True
    except Exception as exc:  # noqa: BLE001 - OSError, h5py's and TensorFlow's own errors for ENOSPC/EDQUOT
        for path in set(glob.glob(os.path.join(chief_dir, "ckpt-*"))) - existing:
            remove_path(path)
        previous = newest_checkpoint(chief_dir)
        log().warning(f"checkpoint not written ({why(exc)}): "
                      + (f"the previous one ({previous}) stays; " if previous else "no earlier checkpoint; ")
                      + "training goes on: free space in the checkpoint directory")
        return False


def why(exc: BaseException) -> str:
    """The reason a write failed in a few words: h5py and TensorFlow bury strerror in a long message."""
    text = getattr(exc, "strerror", None) or str(exc)
    for known in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), os.strerror(errno.EACCES),
                  os.strerror(errno.EROFS)):
        if known in text:
            return known
    return text.splitlines()[0][:160] if text else type(exc).__name__
