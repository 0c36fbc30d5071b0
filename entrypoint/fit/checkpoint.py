"""Backup-and-restore (the script's own saves: saves.py).

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from .. import runs, workdirs
from ..log import get as log
from ..plan import Plan
from ..runs import checkpoint_number, newest_checkpoint
from . import callback_state, checkpoint_files, checkpoint_snapshot, epoch_metrics
from .saves import distrains_own, remove_path

if TYPE_CHECKING:
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


class TfKerasBackup:
    """tf_keras' BackupAndRestore (mixed in by `make_backup_callback`) that survives a corrupt newest checkpoint
    and is written by the chief alone."""

    def __init__(self, plan: Plan, stage: int, script_callbacks: tuple, hooks: BackupHooks) -> None:
        import tensorflow as tf

        super().__init__(backup_dir=plan.checkpoint_dir, save_freq=plan.checkpoint_every or "epoch")
        # patch: checkpoint.tf_keras_backup
        # a script's own OneDeviceStrategy scope (TensorFlow's save-and-load tutorial): tf_keras refuses it only
        # because its list omits it; one device checkpoints as the default strategy does
        self._supported_strategies = (*self._supported_strategies, tf.distribute.OneDeviceStrategy)
        self.plan, self.stage, self.script_callbacks = plan, stage, script_callbacks
        self.chief_dir = runs.chief_dir(plan.checkpoint_dir)
        self._position, self.written, self._averaged = runs.Position(0), False, False
        self._holding, self._held = False, None  # a checkpoint due at an epoch's last step, held for its end
        self.hooks = hooks
        self.logged, self.earlier = callback_state.EpochLogs(), callback_state.EpochLogs()

    def first_epoch(self, script_initial_epoch: int) -> int:
        """tf_keras' fit reads its counters from this callback's checkpoint itself: the script's epoch stands."""
        return script_initial_epoch

    def on_train_begin(self, logs: Any = None) -> None:
        self._batch_begun: int | None = None
        self._restore_guarded(super().on_train_begin)
        # patch: checkpoint.tf_keras_backup
        state = self._training_state
        if not self.plan.is_chief:
            state.delete_backup = lambda: None  # the chief's directory (Horovod: the one all ranks share)
        for manager in {id(m): m for m in (state.read_checkpoint_manager, state.write_checkpoint_manager)}.values():
            manager._max_to_keep = 2  # keep one older checkpoint to fall back to

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.logged.add(epoch, logs)
        self._position, self._averaged = runs.Position(epoch + 1), True  # sync.py's callback averaged just before
        try:
            super().on_epoch_end(epoch, logs)
            if self._held is not None:  # due at the epoch's last step (on_train_batch_end): written now
                held, self._held = self._held, None
                self._backup(*held)
        finally:
            self._averaged = False

    def on_train_end(self, logs: Any = None) -> None:
        self.earlier.put_before(getattr(self.model, "history", None))
        epoch_metrics.remove(self.plan)
        super().on_train_end(logs)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        # tf_keras assigns the step to its saved-batch variable before every step: an eager op (on a mirrored
        # variable under MWM: 0.4 ms, 4% of a small model's step on two CPU workers) for a value only read
        # back from a checkpoint. Kept as a number here, and assigned in `_backup`, once per checkpoint.
        # patch: checkpoint.tf_keras_backup
        if hasattr(self._training_state, "_ckpt_saved_batch"):
            self._batch_begun = batch
        else:  # a tf_keras that records it otherwise: leave it as it is
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.save_freq == "epoch":
            # tf_keras asks for no batch hooks then (_implements_train_batch_hooks); they run only because
            # another callback wants them. The position is set where a checkpoint is written (on_epoch_end,
            # save_now): 15 µs a step saved in place
            return
        self._position = self.hooks.position.after()
        self._holding = self.hooks.position.ends_epoch()  # a checkpoint due here waits for the epoch's end
        try:
            super().on_train_batch_end(batch, logs)
        finally:
            self._holding = False

    def _backup(self, epoch: int, batch: int = 0) -> None:
        # patch: checkpoint.tf_keras_backup
        if self._holding:  # tf_keras' step count says a checkpoint is due at the epoch's last step:
            # TrainingPosition.ends_epoch
            self._held = (epoch, batch)
            return
        if self.hooks.before_write is not None and not self._averaged:
            self.hooks.before_write(self._position)  # every rank is here: a timed checkpoint, a stop (stopping.py)
        if self.hooks.exact:
            epoch_metrics.save(self.plan, self._position, self.model, self.hooks.local_reads)
        if not self.plan.is_chief:
            # only the chief writes. Under MWM tf_keras has every worker write a copy (to a temp dir it then
            # deletes), because reading an ON_READ variable is a collective all must join; the chief reads
            # them locally instead (compat/adopt.local_reads): metrics, reset at every epoch's start, and
            # the moving statistics, averaged just before. A write costs the others 2 ms, the chief 0.17 s,
            # where every worker writing cost each 0.2 s of CPU (cProfile)
            self.written = True
            return
        if self._batch_begun is not None:
            self._training_state._ckpt_saved_batch.assign(self._batch_begun)  # as tf_keras' own hook left it
        manager = self._training_state.write_checkpoint_manager

        def write() -> None:  # distrain's records first: the checkpoint is complete once TensorFlow's index is there
            # patch: checkpoint.tf_keras_backup
            # numbered save_counter + 1; the counter made on first use, within the local reads (MWM: no broadcast)
            coming = os.path.join(manager.directory, f"ckpt-{int(manager.checkpoint.save_counter.numpy()) + 1}")
            os.makedirs(manager.directory, mode=0o700, exist_ok=True)
            runs.write_position(coming, self._position, _input_record(self.hooks, self._position))
            callback_state.write(coming, self.script_callbacks, self.logged)
            super(TfKerasBackup, self)._backup(epoch=epoch, batch=batch)

        with self.hooks.local_reads(), distrains_own():  # its CheckpointManager's save is not the script's
            self.written = checkpoint_files.write_guarded(write, self.chief_dir, self.hooks.wrote)
        if self.written:
            checkpoint_files.drop_orphan_sidecars(self.chief_dir)
            workdirs.make_tree_private(self.backup_dir)  # TensorFlow writes with the umask: make it 0600/0700

    def _restore_the_newest(self) -> str | None:
        """A kill after TensorFlow wrote ckpt-N but before its CheckpointManager recorded it leaves N complete (its
        index and distrain's records) and the record naming N-1, or none: tf_keras restored that one, where
        distrain's position is N's. Every rank restores N then, as the position says. Returns the newest."""
        newest, manager = newest_checkpoint(self.chief_dir), self._training_state.read_checkpoint_manager
        if newest and os.path.basename(manager.latest_checkpoint or "") != os.path.basename(newest):
            manager.checkpoint.restore(newest)
        return newest

    def _restore_guarded(self, begin: Callable[..., Any]) -> None:
        # patch: checkpoint.tf_keras_backup
        while True:
            try:
                begin()
                restored = self._restore_the_newest() or ""  # a corrupt unrecorded newest falls back too
                break
            except Exception as exc:  # noqa: BLE001 - TF raises many types for a corrupt checkpoint
                newest = newest_checkpoint(self.chief_dir)
                if newest is None:
                    raise
                log().warning(f"checkpoint {newest} is unreadable ({type(exc).__name__}); falling back")
                checkpoint_files.drop_checkpoint(self.chief_dir, newest)
                if self.hooks.exact:  # tf_keras' own counters follow the previous one; the positioned input does not
                    self.hooks.stop_for_rerun(_set_aside(self.plan))
        epoch = int(self._training_state._ckpt_saved_epoch.numpy())
        if epoch < 0:
            return
        callback_state.restore(restored, self.script_callbacks)
        self.earlier = callback_state.logged_before(restored)
        self.logged = self.earlier.copy()
        position = runs.read_position(self.plan.checkpoint_dir)
        if position and self.hooks.exact:
            _restored_at(self, position)
        if self.plan.is_chief:
            at = position.describe(self.stage) if position else f"the end of epoch {epoch + 1}"
            log().info(f"resumed from checkpoint in {self.chief_dir}: training goes on at {at}")

    def save_now(self, then: Callable[[str], None] | None = None) -> str | None:
        """Write a checkpoint now (a signal, a timed checkpoint); say where a resume starts, None if it failed;
        `then(where)` once it is written (tf_keras' is written in place: before this returns)."""
        where = self._save_now()
        if where is not None and then is not None:
            then(where)
        return where

    def _save_now(self) -> str | None:
        position = self.hooks.position
        epoch, batch = position.epoch, position.batch
        if self.save_freq == "epoch" and not self.hooks.exact:
            # epoch-level resume restarts at saved_epoch + 1: mark the interrupted epoch as not done
            self._training_state._ckpt_saved_epoch.assign(epoch - 1)
            self._position = runs.Position(epoch)
            self._backup(epoch=epoch - 1)
            where = f"the start of epoch {epoch + 1}, with its partial progress"
        else:
            self._position = position.after()
            self._backup(epoch=epoch, batch=batch)
            where = self._position.describe(self.stage)
        return where if self.written else None



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
                self.hooks.stop_for_rerun(_set_aside(self.plan))
        callback_state.restore(newest, self.script_callbacks)
        self.earlier = callback_state.logged_before(newest)
        self.logged = self.earlier.copy()
        position = runs.read_position(self.plan.checkpoint_dir) if self.hooks.exact else None
        if position:
            _restored_at(self, position)
        if self.plan.is_chief:
            at = (position or runs.Position(done)).describe(self.stage)
            log().info(f"resumed from checkpoint in {self.chief_dir}: training goes on at {at}")

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.logged.add(epoch, logs)
        if self.save_freq == "epoch":
            self._save(runs.Position(epoch + 1), averaged=True)  # sync.py's callback averaged just before

    def on_train_end(self, logs: Any = None) -> None:
        self._waited()
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
        if self.hooks.exact:
            epoch_metrics.save(self.plan, position, self.model, self.hooks.local_reads)
        if not self.plan.is_chief:
            return True  # the chief reads locally: nothing collective for the others to join
        started = time.monotonic()
        self._waited()  # one write in flight: the one before ends first
        newest = newest_checkpoint(self.chief_dir)
        prefix = os.path.join(self.chief_dir, f"ckpt-{checkpoint_number(newest) + 1 if newest else 1}")
        with self.hooks.local_reads(), distrains_own():
            weights = checkpoint_snapshot.take(self.model)
        records, input_record = callback_state.capture(self.script_callbacks, self.logged), _input_record(
            self.hooks, position)

        def write() -> None:
            os.makedirs(self.chief_dir, mode=0o700, exist_ok=True)
            tmp = os.path.join(self.chief_dir, f".tmp-{os.getpid()}.weights.h5")
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))  # private even if killed
                weights.write(tmp)
                os.replace(tmp, prefix + ".weights.h5")
                runs.write_position(prefix, position, input_record)
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

        self.writer.start(write_and_tidy)
        if self.hooks.blocked is not None:
            self.hooks.blocked(time.monotonic() - started)
        return self._waited() if wait else True

    def _waited(self) -> bool:
        """Wait for the write in flight, its time told (stop_cost.py); False if a write since the last wait failed."""
        done = self.writer.wait()
        for seconds in done:
            if seconds is not None and self.hooks.wrote is not None:
                self.hooks.wrote(seconds)
        return None not in done

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


def _input_record(hooks: BackupHooks, position: runs.Position) -> dict | None:
    """What a checkpoint keeps of the input beside its position (resume.Start.to_record)."""
    return hooks.expected.to_record(position.epoch, position.step) if hooks.exact else None


def _epochs_done(prefix: str) -> int:
    """The epochs done that a Keras 3 checkpoint records (its .json, written last)."""
    with open(prefix + ".json") as handle:
        return int(json.load(handle)["epochs_done"])


def _restored_at(backup: Any, position: runs.Position) -> None:
    """Each rank's own state kept at a mid-epoch `position` given back: sync.py's, the epoch's metrics."""
    if backup.hooks.after_restore is not None:
        backup.hooks.after_restore(position)
    say = (lambda line: log().info(line)) if backup.plan.is_chief else (lambda line: None)
    epoch_metrics.add_after_first_step(backup.plan, position, backup.model, say, backup.hooks.position.observers)


def _set_aside(plan: Plan) -> str:
    """Why an attempt stops when the newest checkpoint is unreadable: the fit was started for it (the positioned
    input, resume.py; Keras 3's first epoch) and the previous one starts elsewhere. Rather than train from the
    wrong batch, the rerun starts the fit for the previous one."""
    return (f"the newest checkpoint in {plan.checkpoint_dir} was unreadable and is set aside; rerun to resume "
            "exactly from the previous one")
