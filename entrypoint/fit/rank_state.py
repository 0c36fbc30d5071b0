"""Each rank's own non-trainable state (BatchNormalization's moving statistics), kept with a mid-epoch checkpoint.

Within an epoch each rank updates its moving statistics from its own batches; sync.py averages them at the
epoch's end. A checkpoint written mid-epoch (a stop, DISTRAIN_CHECKPOINT_EVERY) holds the chief's copy only, and
averaging them there would change what the run never stopped computes. So every rank writes its own copy beside
it, `<state dir>/ranks/e<E>-s<S>.rank<R>-of<N>.npz` (E epochs done, S steps into the next), and a resume at that
position restores it per rank: a stop is then invisible in every weight. Resumed on another number of ranks, the
copies are averaged (what the epoch's end would have done), said in one line.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import runs

if TYPE_CHECKING:
    import numpy as np


KEEP = 2  # positions kept per rank: as many as the checkpoints kept (checkpoint.py)
_NAME = re.compile(r"e(\d+)-s(\d+)\.rank(\d+)-of(\d+)\.npz$")


def _directory(state_dir: str, folder: str = "ranks") -> str:
    return os.path.join(state_dir, folder)


def _path(state_dir: str, position: runs.Position, rank: int, size: int, folder: str = "ranks") -> str:
    epoch, step = position.epoch, position.step
    return os.path.join(_directory(state_dir, folder), f"e{epoch}-s{step}.rank{rank}-of{size}.npz")


def save(state_dir: str, position: runs.Position, rank: int, size: int, values: list[np.ndarray],
         folder: str = "ranks") -> None:
    """Write this rank's values for a checkpoint at `position` (temp + rename, 0600 in a 0700 directory); keep
    this rank's newest KEEP positions. `folder`: what they are (epoch_metrics.py keeps its own)."""
    import numpy as np  # not at import time: distrain's front door runs without numpy

    directory = _directory(state_dir, folder)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = _path(state_dir, position, rank, size, folder)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.path.basename(path)}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
        np.savez(handle, *values)
    os.replace(tmp, path)
    mine = sorted(glob.glob(os.path.join(directory, f"e*-s*.rank{rank}-of*.npz")), key=os.path.getmtime)
    for old in mine[:-KEEP]:
        os.unlink(old)


def _load(path: str) -> list[np.ndarray]:
    import numpy as np  # not at import time: distrain's front door runs without numpy

    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def restore(state_dir: str, position: runs.Position, rank: int, size: int,
            assign: Callable[[list[np.ndarray]], None]) -> str | None:
    """Give this rank its own values of the checkpoint at `position` (through `assign`), or their average when
    the checkpoint was written by another number of ranks. What was done, in a few words; None where nothing was
    kept at that position (an epoch's end: the state is averaged there)."""
    import numpy as np  # not at import time: distrain's front door runs without numpy

    epoch, step = position.epoch, position.step
    found: dict[int, dict[int, str]] = {}
    for path in glob.glob(os.path.join(_directory(state_dir), f"e{epoch}-s{step}.rank*-of*.npz")):
        match = _NAME.search(path)
        if match:
            found.setdefault(int(match[4]), {})[int(match[3])] = path
    if size in found and rank in found[size]:
        assign(_load(found[size][rank]))
        return "each rank's own moving statistics restored"
    if not found:
        return None
    written_by, paths = max(found.items(), key=lambda item: len(item[1]))
    copies = [_load(path) for path in paths.values()]
    assign([np.mean(np.stack(values), axis=0).astype(values[0].dtype) for values in zip(*copies)])
    return (f"moving statistics averaged over the {len(copies)} ranks that wrote the checkpoint ({written_by} "
            f"then, {size} now)")


def remove(state_dir: str, rank: int, folder: str = "ranks") -> None:
    """This rank's copies, once its fit has ended: nothing is resumed from them."""
    for path in glob.glob(os.path.join(_directory(state_dir, folder), f"e*-s*.rank{rank}-of*.npz")):
        os.unlink(path)


def own(state_dir: str, position: runs.Position, rank: int, size: int, folder: str) -> list[np.ndarray] | None:
    """This rank's own values kept at `position` by as many ranks, or None."""
    path = _path(state_dir, position, rank, size, folder)
    return _load(path) if os.path.exists(path) else None


def local_values(variables: list, tf: Any, local_reads: Callable[[], contextlib.AbstractContextManager]) -> list[
        np.ndarray]:
    """The variables' values on this rank, with no collective: within `local_reads` (Engine.local_reads) tf_keras'
    ON_READ variables under MWM read their local copy, as the chief's checkpoint write does."""
    with local_reads():
        return [tf.identity(v).numpy() for v in variables]
