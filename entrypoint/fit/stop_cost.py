"""What a stop costs this run, measured, against the warning the job gives before it is killed.

A stop signal (a job's `--signal=B:USR1@120`, `docker stop`) at an epoch's last step waits for that epoch's end:
validation, the script's epoch-end callbacks, the epoch's checkpoint; elsewhere it costs one checkpoint. Both are
measured here, the longest of each kept in the run's state (`stop-cost.json`, shown by `distrain runs show`),
with this attempt's checkpoint writes in order (the first carries Keras' save warm-up; benchmarks read them). The
rule: the signal lead must exceed the agreement on the stop (DISTRAIN_STOP_CHECK_SECONDS) plus the longest epoch
end (its checkpoint included), plus one write where a checkpoint may still be in flight (written off
the training's path: the stop's own waits for it). A job declares its lead (DISTRAIN_STOP_LEAD, set by jobs/lib.sh
from the job file's STOP_LEAD beside its `--signal` line); the chief warns once when the measured cost exceeds it:
then the kill comes before the checkpoint and the stop costs the epoch.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..runs import STOP_COST_FILE as FILE
from ..runs import write_private_json

WRITES_KEPT = 64  # checkpoint writes recorded per attempt (the longest is always kept)


class StopCost:
    """Told of every step's end (steps.ObservesSteps), every checkpoint's write (BackupHooks.wrote, by the thread
    that wrote it) and the time it held the training (.blocked) and every epoch's end after all other callbacks (the
    fit hook's last callback)."""

    def __init__(self, state_dir: str | None, lead: float | None, agree_seconds: float,
                 warn: Callable[[str], None], writes_behind: bool = False) -> None:
        self.path = os.path.join(state_dir, FILE) if state_dir else None
        self.lead, self.agree_seconds, self.warn = lead, agree_seconds, warn
        self.known = read(state_dir) if state_dir else {}  # an earlier attempt's longest: still this run's cost
        self.last_step: float | None = None
        self.warned = False
        self.writes: list[float] = []  # this attempt's checkpoint writes, seconds, in order (the first WRITES_KEPT)
        self.blocks: list[float] = []  # how long each held the training (its snapshot; the write too, in place)
        self.writes_behind = writes_behind  # a write may be in flight when a stop comes: it waits for it
        self._lock = threading.Lock()  # the writer's thread and the training's both keep figures

    def step_ended(self) -> None:
        self.last_step = time.monotonic()

    def wrote(self, seconds: float) -> None:
        with self._lock:
            if len(self.writes) < WRITES_KEPT:
                self.writes.append(round(seconds, 4))
                self.known = {**self.known, "checkpoint_writes": list(self.writes)}
            self._keep("checkpoint_seconds", seconds, always=len(self.writes) <= WRITES_KEPT)

    def blocked(self, seconds: float) -> None:
        with self._lock:
            if len(self.blocks) < WRITES_KEPT:
                self.blocks.append(round(seconds, 4))
                self.known = {**self.known, "checkpoint_blocked": list(self.blocks)}

    def epoch_ended(self) -> None:
        with self._lock:
            if self.last_step is not None:
                self._keep("epoch_end_seconds", time.monotonic() - self.last_step)
            self.last_step = None
            self._judge()

    def _keep(self, name: str, seconds: float, always: bool = False) -> None:
        longer = seconds > self.known.get(name, 0.0)
        if longer:
            self.known = {**self.known, name: round(seconds, 3), "lead_seconds": self.lead}
        if (longer or always) and self.path:
            write_private_json(self.path, self.known)

    def _judge(self) -> None:
        epoch_end = self.known.get("epoch_end_seconds", 0.0)
        write = self.known.get("checkpoint_seconds", 0.0)
        needed = self.agree_seconds + max(epoch_end, write) + (write if self.writes_behind else 0.0)
        if self.warned or self.lead is None or needed <= self.lead:
            return
        self.warned = True
        self.warn(f"a stop now needs up to {needed:.0f} s (an epoch's end took {epoch_end:.1f} s: validation, "
                  f"epoch-end callbacks, checkpoint), more than the {self.lead:.0f} s the job's signal gives "
                  "(DISTRAIN_STOP_LEAD): a stop at an epoch's last step would be killed before its checkpoint; "
                  "raise the job's --signal=B:USR1@N and STOP_LEAD together")


def read(state_dir: str) -> dict[str, Any]:
    """A run's measured stop cost ({} before its first epoch end)."""
    try:
        with open(os.path.join(state_dir, FILE)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def make_callback(keras: Any, cost: StopCost) -> Any:
    """The callback that sees each epoch's end after every other one (validation and the checkpoint done)."""

    class MeasureStopCost(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            cost.epoch_ended()

    return MeasureStopCost()
