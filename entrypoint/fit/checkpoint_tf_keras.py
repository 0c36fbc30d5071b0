"""tf_keras' backup-and-restore: its own BackupAndRestore (TensorFlow's CheckpointManager) made to survive a corrupt
newest checkpoint, written by the chief alone, and off the training's path: the save's writes recorded on the
training thread and run by a thread (checkpoint_snapshot.take_tensorflow, DISTRAIN_CHECKPOINT_ASYNC)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .. import runs, workdirs
from ..log import get as log
from ..plan import Plan
from ..runs import newest_checkpoint
from . import callback_state, checkpoint_files, checkpoint_snapshot, epoch_metrics
from .backup_hooks import BackupHooks, input_record, ranks_own_write, restored_at, set_aside, told, waited
from .saves import distrains_own


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
        self.writer = checkpoint_snapshot.Writer(in_background=plan.checkpoint_async)
        self._wait, self._then = False, None  # a stop's checkpoint is waited for; a timed one says when written
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
        waited(self.writer)  # tf_keras deletes the checkpoints next
        self.writer.close()
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
        metrics = epoch_metrics.kept(self.plan, self._position, self.model, self.hooks.local_reads) \
            if self.hooks.exact else None
        if not self.plan.is_chief:
            # only the chief writes. Under MWM tf_keras has every worker write a copy (to a temp dir it then
            # deletes), because reading an ON_READ variable is a collective all must join; the chief reads
            # them locally instead (compat/adopt.local_reads): metrics, reset at every epoch's start, and
            # the moving statistics, averaged just before. A write costs the others 2 ms, the chief 0.17 s,
            # where every worker writing cost each 0.2 s of CPU (cProfile)
            waited(self.writer)
            if metrics is not None:
                self.writer.start(ranks_own_write(metrics))
            self.written = waited(self.writer) if self._wait else True
            return
        started = time.monotonic()
        waited(self.writer)  # one write in flight: the one before ends first
        if self._batch_begun is not None:
            self._training_state._ckpt_saved_batch.assign(self._batch_begun)  # as tf_keras' own hook left it
        manager = self._training_state.write_checkpoint_manager
        position, then, self._then = self._position, self._then, None
        records = callback_state.capture(self.script_callbacks, self.logged)
        with self.hooks.local_reads(), distrains_own():  # its CheckpointManager's save is not the script's
            # numbered save_counter + 1; the counter made on first use, within the local reads (MWM: no broadcast)
            coming = os.path.join(manager.directory, f"ckpt-{int(manager.checkpoint.save_counter.numpy()) + 1}")
            snapshot = checkpoint_snapshot.take_tensorflow(
                lambda: super(TfKerasBackup, self)._backup(epoch=epoch, batch=batch), coming)

        def write() -> None:  # distrain's records first: the checkpoint is complete once TensorFlow's index is there
            os.makedirs(manager.directory, mode=0o700, exist_ok=True)
            if metrics is not None:
                metrics()
            runs.write_position(coming, position, input_record(self.hooks, position))
            records(coming)
            snapshot.write()

        def write_and_tidy() -> float | None:
            began = time.monotonic()
            if not checkpoint_files.write_guarded(write, self.chief_dir, None):
                return None
            checkpoint_files.drop_orphan_sidecars(self.chief_dir)
            workdirs.make_tree_private(self.backup_dir)  # TensorFlow writes with the umask: make it 0600/0700
            seconds = time.monotonic() - began
            if then is not None:
                then()
            return seconds

        self.writer.start(told(write_and_tidy, self.hooks))
        if self.hooks.blocked is not None:
            self.hooks.blocked(time.monotonic() - started)
        self.written = waited(self.writer) if self._wait else True

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
                    self.hooks.stop_for_rerun(set_aside(self.plan))
        epoch = int(self._training_state._ckpt_saved_epoch.numpy())
        if epoch < 0:
            return
        callback_state.restore(restored, self.script_callbacks)
        self.earlier = callback_state.logged_before(restored)
        self.logged = self.earlier.copy()
        position = runs.read_position(self.plan.checkpoint_dir)
        if position and self.hooks.exact:
            restored_at(self, position)
        if self.plan.is_chief:
            at = position.describe(self.stage) if position else f"the end of epoch {epoch + 1}"
            log().info(f"resumed from checkpoint in {self.chief_dir}: training goes on at {at}")

    def save_now(self, then: Callable[[str], None] | None = None) -> str | None:
        """A checkpoint now, saying where a resume from it starts: a stop's waited for (None if it failed); with
        `then`, written in the background where the plan says so, `then(where)` once it is."""
        position = self.hooks.position
        epoch, batch = position.epoch, position.batch
        if self.save_freq == "epoch" and not self.hooks.exact:
            # epoch-level resume restarts at saved_epoch + 1: mark the interrupted epoch as not done
            self._training_state._ckpt_saved_epoch.assign(epoch - 1)
            self._position = runs.Position(epoch)
            where, at = f"the start of epoch {epoch + 1}, with its partial progress", (epoch - 1, 0)
        else:
            self._position = position.after()
            where, at = self._position.describe(self.stage), (epoch, batch)
        self._wait, self._then = then is None, None if then is None else lambda: then(where)
        try:
            self._backup(*at)
        finally:
            self._wait, self._then = False, None
        return where if self.written else None
