"""The script's own saves, made safe in every mode: written by the chief alone, complete when they appear (a
temporary path beside the target, then a rename), and, under MWM, with no collective left for the other workers
to join (ON_READ variables read locally: compat/adopt.local_reads). The backups (checkpoint.py) write the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from ..engines import Engine
from ..errors import EnvironmentProblem
from ..log import get as log
from ..plan import Plan


def temp_sibling(path: str, tag: str) -> str:
    """A hidden path beside `path` with the same suffix (Keras picks the format from it)."""
    parent, name = os.path.split(os.path.abspath(path))
    stem, suffix = os.path.splitext(name)
    if suffix not in (".keras", ".h5", ".hdf5"):
        stem, suffix = name, ""
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


def save_model(engine: Engine, model: Any, path: str | os.PathLike, save: Callable[..., Any], *args: Any,
               **kwargs: Any) -> None:
    """Save so that only the chief's complete copy ever appears at `path`. The chief is rank 0 now (engine.rank:
    under Horovod elastic a survivor can become rank 0 after a reset)."""
    plan, path = engine.plan, os.fspath(path)
    if engine.rank != 0:
        # Horovod: plain per-process copies. MWM: the chief saves with local reads (compat/adopt.local_reads), so
        # nothing collective is left for the others to join, and a chief-only save in the script completes too.
        return
    parent = os.path.dirname(os.path.abspath(path))
    check_writable(parent, "the model's directory")
    tmp = temp_sibling(path, "tmp")
    try:
        with local_reads_for(plan):
            save(model, tmp, *args, **kwargs)
        replace_atomically(tmp, path)
    except OSError as exc:
        remove_path(tmp)
        raise EnvironmentProblem(
            f"could not save the model to {path} ({exc.strerror or exc}): free space or choose another path; "
            f"{'the previous model there is unchanged' if os.path.exists(path) else 'nothing was written there'}"
        ) from None
    except BaseException:
        remove_path(tmp)
        raise
    log().info(f"saved model to {path}")


def save_weights_locally(plan: Plan, model: Any, path: str) -> None:
    """The chief's model.save_weights, with no collective for the other ranks to join (see local_reads_for)."""
    with local_reads_for(plan):
        model.save_weights(path)


def local_reads_for(plan: Plan) -> Any:
    """Under MWM, read ON_READ variables locally while saving (see compat/adopt.local_reads)."""
    if plan.mode != "mwm" or plan.size < 2:
        return contextlib.nullcontext()
    import tensorflow as tf

    from ..compat.adopt import local_reads

    return local_reads(tf)
