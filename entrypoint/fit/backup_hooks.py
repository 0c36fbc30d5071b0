"""What both Keras families' backups (checkpoint.py, checkpoint_tf_keras.py) are given by the fit hook and share:
the hooks into the fit's other concerns, a checkpoint's input record, a restore's hand-back of each rank's own
state, the reason an attempt stops when the newest checkpoint is set aside, and the wait for a write in flight."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from .. import runs
from ..log import get as log
from ..plan import Plan
from . import epoch_metrics

if TYPE_CHECKING:
    from .checkpoint_snapshot import Writer
    from .steps import TrainingPosition


@dataclass(frozen=True)
class BackupHooks:
    """What the fit hook gives a backup when it builds it: the fit's training position (steps.py), where the
    resume is expected to start (the positioned input, resume.py; None: not positioned, so no exact resume), each
    rank's own state to keep before a mid-epoch write and give back after a restore (sync.py, rank_state.py), and
    how to stop this attempt for a rerun (stopping.stop_for_rerun) when the checkpoint the fit was started for is
    set aside."""
    position: TrainingPosition
    stop_for_rerun: Callable[[str], NoReturn]
    expected: Any = None
    before_write: Callable[[runs.Position], None] | None = None
    after_restore: Callable[[runs.Position], None] | None = None
    wrote: Callable[[float], None] | None = None  # told how long each write took (stop_cost.py)
    blocked: Callable[[float], None] | None = None  # told how long each checkpoint held the training
    local_reads: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # Engine.local_reads

    @property
    def exact(self) -> bool:
        return self.expected is not None


def input_record(hooks: BackupHooks, position: runs.Position) -> dict | None:
    """What a checkpoint keeps of the input beside its position (resume.Start.to_record)."""
    return hooks.expected.to_record(position.epoch, position.step) if hooks.exact else None


def restored_at(backup: Any, position: runs.Position) -> None:
    """Each rank's own state kept at a mid-epoch `position` given back: sync.py's, the epoch's metrics."""
    if backup.hooks.after_restore is not None:
        backup.hooks.after_restore(position)
    say = (lambda line: log().info(line)) if backup.plan.is_chief else (lambda line: None)
    epoch_metrics.add_after_first_step(backup.plan, position, backup.model, say, backup.hooks.position.observers)


def set_aside(plan: Plan) -> str:
    """Why an attempt stops when the newest checkpoint is unreadable: the fit was started for it (the positioned
    input, resume.py; Keras 3's first epoch) and the previous one starts elsewhere. Rather than train from the
    wrong batch, the rerun starts the fit for the previous one."""
    return (f"the newest checkpoint in {plan.checkpoint_dir} was unreadable and is set aside; rerun to resume "
            "exactly from the previous one")


def waited(writer: Writer) -> bool:
    """Wait for the write in flight; False if a write since the last wait failed."""
    return None not in writer.wait()


def told(write: Callable[[], float | None], hooks: BackupHooks) -> Callable[[], float | None]:
    """`write`, its time told (stop_cost.py) by the thread that wrote it: the run's stop-cost file is written
    there, off the training's path."""

    def write_and_tell() -> float | None:
        seconds = write()
        if seconds is not None and hooks.wrote is not None:
            hooks.wrote(seconds)
        return seconds

    return write_and_tell


def ranks_own_write(write: Callable[[], None]) -> Callable[[], float | None]:
    """A rank's own file kept beside a checkpoint (epoch_metrics.py), as a write for its writer: None if it failed
    (said), as a checkpoint's write."""

    def timed() -> float | None:
        began = time.monotonic()
        try:
            write()
        except OSError as exc:
            log().warning(f"this rank's metric states were not kept beside the checkpoint ({exc})")
            return None
        return time.monotonic() - began

    return timed
