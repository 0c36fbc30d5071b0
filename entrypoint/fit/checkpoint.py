"""Backup-and-restore (the script's own saves: saves.py); tf_keras' in checkpoint_tf_keras.py, Keras 3's here.

- `Backup`: Keras' BackupAndRestore (it already gives mid-epoch resume), plus a fallback to the previous checkpoint
  when the newest is corrupt, written by the chief alone in every mode (tf_keras has every MWM worker write).
- Both backups record each checkpoint's position (epochs done, steps into the next: runs.write_position), for
  exact resume (resume.py) and the run's first log line, and survive a failed write (a full disk, a quota): the
  previous checkpoint stays, training goes on. `save_now` is what a stop on a signal (stopping.py) and a timed
  checkpoint call. With `exact` set (the input is positioned), a mid-epoch checkpoint resumes at its step;
  without, at the start of its epoch with its partial progress.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, Protocol

from .. import runs, workdirs
from ..log import get as log
from ..plan import Plan
from ..runs import checkpoint_number, newest_checkpoint
from . import callback_state, checkpoint_files, checkpoint_snapshot, epoch_metrics
from .backup_hooks import BackupHooks, input_record, ranks_own_write, restored_at, set_aside, told, waited
from .checkpoint_tf_keras import TfKerasBackup
from .saves import distrains_own, remove_path

__all__ = ["Backup", "BackupHooks", "make_backup_callback"]


class Backup(Protocol):
    """What the fit hook and the stop (stopping.py) use of a backup callback, whichever Keras family's (a
    `steps.ObservesSteps` too where it counts steps): its schedule, and a checkpoint written now that says where
    a resume starts (None: not written)."""

    save_freq: Any  # "epoch", or DISTRAIN_CHECKPOINT_EVERY's number of steps

    def first_epoch(self, script_initial_epoch: int) -> int: ...

    def save_now(self, then: Callable[[str], None] | None = None) -> str | None: ...


def make_backup_callback(plan: Plan, keras: Any, stage: int, script_callbacks: tuple,
                         hooks: BackupHooks) -> Backup:
    """A backup-and-restore callback for this plan (built lazily: it needs the Keras module setup chose), for the
    script's fit number `stage`, whose checkpoints are in plan.checkpoint_dir (runner.py: runs.stage_dir); the
    counters of `script_callbacks` go with every checkpoint (callback_state.py); `hooks`: what the fit hook knows
    when it builds it."""
    # patch: checkpoint.tf_keras_backup
    if plan.family.subclasses_backup_and_restore:
        logic, base = TfKerasBackup, keras.callbacks.BackupAndRestore
    else:
        logic, base = (Keras3TimedBackup if plan.checkpoint_every else Keras3Backup), keras.callbacks.Callback
    return type(logic.__name__, (logic, base), {})(plan, stage, script_callbacks, hooks)


class Keras3Backup:
    """distrain's backup-and-restore for Keras 3 (mixed into its Callback class by `make_backup_callback`), whose
    own BackupAndRestore writes one file from every worker at once, not atomically, and keeps no older copy to
    fall back to. Same layout and rules as the tf_keras one: `<dir>/chief/ckpt-N.weights.h5` (weights and
    optimizer state) + `ckpt-N.json` (epochs done), written by the chief only (temp + rename), off the training's
    path (checkpoint_snapshot.py; a stop's waited for), the last two kept, an unreadable newest one moved aside.
    Resume is at an epoch start: with DISTRAIN_CHECKPOINT_EVERY, an interrupted epoch restarts with its partial
    progress."""

    def __init__(self, plan: Plan, stage: int, script_callbacks: tuple, hooks: BackupHooks) -> None:
        super().__init__()
        self.plan, self.stage, self.script_callbacks = plan, stage, script_callbacks
        self.chief_dir = runs.chief_dir(plan.checkpoint_dir)
        self.save_freq: Any = self.plan.checkpoint_every or "epoch"
        self._counted = 0  # the fit's steps when the last step ended
        self._due = False  # DISTRAIN_CHECKPOINT_EVERY steps passed since the last timed checkpoint
        self.hooks = hooks
        self.logged, self.earlier = callback_state.EpochLogs(), callback_state.EpochLogs()
        self.writer = checkpoint_snapshot.Writer(in_background=plan.checkpoint_async)
        self._layout: checkpoint_snapshot.Layout | None = None  # the model's walk, replayed while it holds
        self._number: int | None = None  # the newest checkpoint's N, read from the directory once a fit

    def first_epoch(self, script_initial_epoch: int) -> int:
        """The epochs the newest checkpoint has done, as fit's `initial_epoch` (Keras' `self._initial_epoch or
        initial_epoch`). Keras 3's own BackupAndRestore sets `model._initial_epoch` instead, which no fit resets:
        the script's next fit would start at that epoch too."""
        newest = newest_checkpoint(self.chief_dir)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if newest is not None:
                return _epochs_done(newest) or script_initial_epoch
        return script_initial_epoch  # unreadable: on_train_begin sets it aside and stops for a rerun

    def on_train_begin(self, logs: Any = None) -> None:
        while True:
            newest = newest_checkpoint(self.chief_dir)
            if newest is None:
                return
            try:
                optimizer = self.model.optimizer
                if optimizer is not None and not optimizer.built:
                    optimizer.build(self.model.trainable_variables)
                self.model.load_weights(newest + ".weights.h5")
                done = _epochs_done(newest)
                break
            except Exception as exc:  # noqa: BLE001 - h5py/json/Keras raise many types for a bad file
                log().warning(f"checkpoint {newest} is unreadable ({type(exc).__name__}); falling back")
                checkpoint_files.drop_checkpoint(self.chief_dir, newest)
                # fit was started at the newest one's epoch (first_epoch): a rerun starts at the previous one's
                self.hooks.stop_for_rerun(set_aside(self.plan))
        callback_state.restore(newest, self.script_callbacks)
        self.earlier = callback_state.logged_before(newest)
        self.logged = self.earlier.copy()
        position = runs.read_position(self.plan.checkpoint_dir) if self.hooks.exact else None
        if position:
            restored_at(self, position)
        if self.plan.is_chief:
            at = (position or runs.Position(done)).describe(self.stage)
            log().info(f"resumed from checkpoint in {self.chief_dir}: training goes on at {at}")

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.logged.add(epoch, logs)
        if self.save_freq == "epoch":
            self._save(runs.Position(epoch + 1), averaged=True)  # sync.py's callback averaged just before

    def on_train_end(self, logs: Any = None) -> None:
        self._waited()
        self.writer.close()
        self.earlier.put_before(getattr(self.model, "history", None))
        epoch_metrics.remove(self.plan)
        if self.plan.is_chief:
            shutil.rmtree(self.chief_dir, ignore_errors=True)

    def _save(self, position: runs.Position, averaged: bool = False, wait: bool = False,
              then: Callable[[], None] | None = None) -> bool:
        """A checkpoint at `position`: its snapshot now, its file written by the writer (checkpoint_snapshot.py),
        waited for with `wait` (a stop), `then()` once written; False if it is known to have failed."""
        if self.hooks.before_write is not None and not averaged:
            self.hooks.before_write(position)  # every rank is here: a timed checkpoint, a stop
        metrics = epoch_metrics.kept(self.plan, position, self.model, self.hooks.local_reads) \
            if self.hooks.exact else None
        started = time.monotonic()
        self._waited()  # one write in flight: the one before ends first
        if not self.plan.is_chief:  # the chief reads locally: nothing collective for the others to join
            if metrics is not None:
                self.writer.start(ranks_own_write(metrics))
            return self._waited() if wait else True
        if self._number is None:
            newest = newest_checkpoint(self.chief_dir)
            self._number = checkpoint_number(newest) if newest else 0
        self._number += 1
        prefix = os.path.join(self.chief_dir, f"ckpt-{self._number}")
        with self.hooks.local_reads(), distrains_own():
            weights, self._layout = checkpoint_snapshot.take(self.model, self._layout)
        records, kept_input = callback_state.capture(self.script_callbacks, self.logged), input_record(
            self.hooks, position)

        def write() -> None:
            os.makedirs(self.chief_dir, mode=0o700, exist_ok=True)
            tmp = os.path.join(self.chief_dir, f".tmp-{os.getpid()}.weights.h5")
            try:
                if metrics is not None:
                    metrics()
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))  # private even if killed
                weights.write(tmp)
                os.replace(tmp, prefix + ".weights.h5")
                runs.write_position(prefix, position, kept_input)
                records(prefix)
                runs.write_private_json(prefix + ".json", {"epochs_done": position.epoch})  # last: the checkpoint
            finally:
                remove_path(tmp)

        def write_and_tidy() -> float | None:
            began = time.monotonic()
            if not checkpoint_files.write_guarded(write, self.chief_dir, None):
                return None
            for old in sorted(glob.glob(os.path.join(self.chief_dir, "ckpt-*.json")), key=checkpoint_number)[:-2]:
                for path in glob.glob(old[: -len(".json")] + ".*"):
                    remove_path(path)
            workdirs.make_tree_private(self.chief_dir)
            seconds = time.monotonic() - began
            if then is not None:
                then()
            return seconds

        self.writer.start(told(write_and_tidy, self.hooks))
        if self.hooks.blocked is not None:
            self.hooks.blocked(time.monotonic() - started)
        return self._waited() if wait else True

    def _waited(self) -> bool:
        return waited(self.writer)

    def save_now(self, then: Callable[[str], None] | None = None) -> str | None:
        """A checkpoint now, saying where a resume from it starts: a stop's waited for (None if it failed); with
        `then`, written in the background where the plan says so, `then(where)` once it is."""
        position = self.hooks.position
        after = position.after() if self.hooks.exact else runs.Position(position.epoch)
        where = after.describe(self.stage) if self.hooks.exact else \
            f"the start of epoch {position.epoch + 1}, with its partial progress"
        written = self._save(after, wait=then is None, then=None if then is None else lambda: then(where))
        return where if written else None


class Keras3TimedBackup(Keras3Backup):
    """With DISTRAIN_CHECKPOINT_EVERY: a step observer (runner.py adds it to the training position's observers) and
    a batch hook, which the epoch-only backup does without."""

    def step_ended(self) -> None:
        """After each train-function call (steps.py): with steps_per_execution above 1, Keras 3.3's batch hooks
        run once a call with the call's first batch, so the steps are counted from the position."""
        before, self._counted = self._counted, self.hooks.position.steps
        self._due = self._due or before // self.save_freq != self._counted // self.save_freq

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # written here, after the script's own batch-end callbacks, as a callback placed last would; at the
        # epoch's last step (an epoch of unknown length's too, once learnt), after its end
        position = self.hooks.position
        if self._due and not position.ends_epoch():
            self._due = False
            self._save(position.after() if self.hooks.exact else runs.Position(position.epoch))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self._due:
            self._due = False
            self._save(runs.Position(epoch + 1), averaged=True)  # sync.py's callback averaged just before


def _epochs_done(prefix: str) -> int:
    """The epochs done that a Keras 3 checkpoint records (its .json, written last)."""
    with open(prefix + ".json") as handle:
        return int(json.load(handle)["epochs_done"])
