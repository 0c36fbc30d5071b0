"""Safe saves, backup-and-restore, and stopping cleanly on a signal.

- `save_model`: atomic (temp path beside the target, then rename), chief-only. In MWM reading ON_READ variables
  is collective, so the chief reads them locally (compat/adopt.local_reads): a chief-only save completes.
- `Backup`: Keras' BackupAndRestore (it already gives MWM's chief/worker dirs and mid-epoch resume), plus a
  fallback to the previous checkpoint when the newest is corrupt, and Horovod's "rank 0 writes" rule.
- `StopOnSignal`: SIGTERM/SIGUSR1 set a flag; ranks agree on it with one small all-reduce every few steps so all
  stop at the same step; then a checkpoint is written and `Preempted` ends the run with EXIT_PREEMPTED.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable
from typing import Any

from . import workdirs
from .errors import EXIT_PREEMPTED, DistrainError, EnvironmentProblem
from .log import get as log
from .plan import Plan


class Preempted(DistrainError):
    def __init__(self, signame: str, where: str | None) -> None:
        if where is None:
            said = (f"stopped on {signame}; distrain saved nothing (its checkpoints are off: DISTRAIN_CHECKPOINT=0 "
                    "or your own BackupAndRestore), so a rerun resumes only from what your script saved")
        else:
            said = f"stopped on {signame} after saving a checkpoint at {where}; rerun to resume"
        super().__init__(said, EXIT_PREEMPTED)


def _temp_sibling(path: str, tag: str) -> str:
    """A hidden path beside `path` with the same suffix (Keras picks the format from it)."""
    parent, name = os.path.split(os.path.abspath(path))
    stem, suffix = os.path.splitext(name)
    if suffix not in (".keras", ".h5", ".hdf5"):
        stem, suffix = name, ""
    return os.path.join(parent, f".{stem}.{tag}-{os.getpid()}{suffix}")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def replace_atomically(tmp: str, path: str) -> None:
    """Move a finished file or directory onto `path`; the old one stays until the new one is in place."""
    if os.path.isdir(path) and not os.path.islink(path):
        old = _temp_sibling(path, "old")
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


def save_model(plan: Plan, model: Any, path: str | os.PathLike, save: Callable[..., Any], *args: Any,
               **kwargs: Any) -> None:
    """Save so that only the chief's complete copy ever appears at `path`."""
    path = os.fspath(path)
    if not plan.is_chief:
        # Horovod: plain per-process copies. MWM: the chief saves with local reads (compat/adopt.local_reads), so
        # nothing collective is left for the others to join, and a chief-only save in the script completes too.
        return
    parent = os.path.dirname(os.path.abspath(path))
    check_writable(parent, "the model's directory")
    tmp = _temp_sibling(path, "tmp")
    try:
        with _local_reads(plan):
            save(model, tmp, *args, **kwargs)
        replace_atomically(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise EnvironmentProblem(
            f"could not save the model to {path} ({exc.strerror or exc}): free space or choose another path; "
            f"{'the previous model there is unchanged' if os.path.exists(path) else 'nothing was written there'}"
        ) from None
    except BaseException:
        _remove(tmp)
        raise
    log().info(f"saved model to {path}")


def _local_reads(plan: Plan) -> Any:
    """Under MWM, read ON_READ variables locally while saving (see compat/adopt.local_reads)."""
    if plan.mode != "mwm" or plan.size < 2:
        return contextlib.nullcontext()
    import tensorflow as tf

    from .compat.adopt import local_reads

    return local_reads(tf)


def make_backup_callback(plan: Plan, keras: Any) -> Any:
    """A backup-and-restore callback for this plan (built lazily: it needs the Keras module setup chose)."""
    if plan.keras == "keras3":
        return _keras3_backup(plan, keras)

    class Backup(keras.callbacks.BackupAndRestore):
        """BackupAndRestore that survives a corrupt newest checkpoint and follows Horovod's rank-0 rule."""

        def on_train_begin(self, logs: Any = None) -> None:
            self._restore_guarded(super().on_train_begin)
            state = self._training_state
            if plan.mode == "horovod" and not plan.is_chief:
                state.back_up = lambda *a, **k: None  # only rank 0 writes
                state.delete_backup = lambda: None
            for manager in {id(m): m for m in (state.read_checkpoint_manager, state.write_checkpoint_manager)}.values():
                manager._max_to_keep = 2  # keep one older checkpoint to fall back to

        def _backup(self, epoch: int, batch: int = 0) -> None:
            super()._backup(epoch=epoch, batch=batch)
            workdirs.make_tree_private(self.backup_dir)  # TensorFlow writes with the umask: make it 0600/0700

        def _restore_guarded(self, begin: Callable[..., Any]) -> None:
            chief_dir = os.path.join(self.backup_dir, "chief")
            while True:
                try:
                    begin()
                    break
                except Exception as exc:  # noqa: BLE001 - TF raises many types for a corrupt checkpoint
                    newest = newest_checkpoint(chief_dir)
                    if newest is None:
                        raise
                    log().warning(f"checkpoint {newest} is unreadable ({type(exc).__name__}); falling back")
                    _drop_checkpoint(chief_dir, newest)
            epoch = int(self._training_state._ckpt_saved_epoch.numpy())
            if epoch >= 0 and plan.is_chief:
                log().info(f"resumed from checkpoint in {chief_dir} (epoch {epoch + 1} done)")

        def stop_now(self, epoch: int, batch: int) -> str:
            """Write a checkpoint that resumes at the right place after a signal."""
            if self.save_freq == "epoch":
                # epoch-level resume restarts at saved_epoch + 1: mark the interrupted epoch as not done
                self._training_state._ckpt_saved_epoch.assign(epoch - 1)
                self._backup(epoch=epoch - 1)
                return f"the start of epoch {epoch + 1}, with its partial progress"
            self._backup(epoch=epoch, batch=batch)
            return f"epoch {epoch + 1} step {batch + 1}"

    save_freq: Any = plan.checkpoint_every or "epoch"
    return Backup(backup_dir=plan.checkpoint_dir, save_freq=save_freq)


def _keras3_backup(plan: Plan, keras: Any) -> Any:
    """distrain's backup-and-restore for Keras 3, whose own BackupAndRestore writes one file from every worker at
    once, not atomically, and keeps no older copy to fall back to. Same layout and rules as the tf_keras one:
    `<dir>/chief/ckpt-N.weights.h5` (weights and optimizer state) + `ckpt-N.json` (epochs done), written by the
    chief only (temp + rename), the last two kept, an unreadable newest one moved aside. Resume is at an epoch
    start: with DISTRAIN_CHECKPOINT_EVERY, an interrupted epoch restarts with its partial progress."""
    chief_dir = os.path.join(plan.checkpoint_dir, "chief")

    class Keras3Backup(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.save_freq: Any = plan.checkpoint_every or "epoch"
            self._epoch = 0
            self._steps = 0

        def on_train_begin(self, logs: Any = None) -> None:
            while True:
                newest = newest_checkpoint(chief_dir)
                if newest is None:
                    return
                try:
                    optimizer = self.model.optimizer
                    if optimizer is not None and not optimizer.built:
                        optimizer.build(self.model.trainable_variables)
                    self.model.load_weights(newest + ".weights.h5")
                    with open(newest + ".json") as handle:
                        done = int(json.load(handle)["epochs_done"])
                    break
                except Exception as exc:  # noqa: BLE001 - h5py/json/Keras raise many types for a bad file
                    log().warning(f"checkpoint {newest} is unreadable ({type(exc).__name__}); falling back")
                    _drop_checkpoint(chief_dir, newest)
            self.model._initial_epoch = done
            if plan.is_chief:
                log().info(f"resumed from checkpoint in {chief_dir} (epoch {done} done)")

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._steps += 1
            if self.save_freq != "epoch" and self._steps % self.save_freq == 0:
                self._save(self._epoch)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self.save_freq == "epoch":
                self._save(epoch + 1)

        def on_train_end(self, logs: Any = None) -> None:
            if plan.is_chief:
                shutil.rmtree(chief_dir, ignore_errors=True)

        def _save(self, epochs_done: int) -> None:
            if not plan.is_chief:
                return  # the chief reads locally: nothing collective for the others to join
            os.makedirs(chief_dir, mode=0o700, exist_ok=True)
            newest = newest_checkpoint(chief_dir)
            number = int(newest.rsplit("-", 1)[1]) + 1 if newest else 1
            prefix = os.path.join(chief_dir, f"ckpt-{number}")
            tmp = os.path.join(chief_dir, f".tmp-{os.getpid()}.weights.h5")
            with _local_reads(plan):
                self.model.save_weights(tmp)
            os.replace(tmp, prefix + ".weights.h5")
            with open(prefix + ".json.tmp", "w") as handle:
                json.dump({"epochs_done": epochs_done}, handle)
            os.replace(prefix + ".json.tmp", prefix + ".json")  # last: a checkpoint without it does not exist
            for old in sorted(glob.glob(os.path.join(chief_dir, "ckpt-*.json")), key=_number)[:-2]:
                for path in glob.glob(old[: -len(".json")] + ".*"):
                    _remove(path)
            workdirs.make_tree_private(chief_dir)

        def stop_now(self, epoch: int, batch: int) -> str:  # noqa: ARG002 - same interface as the tf_keras one
            self._save(epoch)
            return f"the start of epoch {epoch + 1}, with its partial progress"

    return Keras3Backup()


def _number(path: str) -> int:
    return int(re.search(r"ckpt-(\d+)\.", os.path.basename(path)).group(1))


def newest_checkpoint(directory: str) -> str | None:
    """The newest complete checkpoint's path prefix (tf_keras: ckpt-N.index; Keras 3: ckpt-N.json), or None."""
    done = glob.glob(os.path.join(directory, "ckpt-*.index")) + glob.glob(os.path.join(directory, "ckpt-*.json"))
    if not done:
        return None
    return os.path.splitext(max(done, key=_number))[0]


def _drop_checkpoint(directory: str, prefix: str) -> None:
    """Move a bad checkpoint aside and point the index at the newest remaining one."""
    for path in glob.glob(prefix + ".*"):
        os.replace(path, path + ".corrupt")
    remaining = newest_checkpoint(directory)
    index = os.path.join(directory, "checkpoint")
    if remaining is None:
        _remove(index)
        return
    name = os.path.basename(remaining)
    with open(index + ".tmp", "w") as handle:
        handle.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    os.replace(index + ".tmp", index)


class SignalFlag:
    """Records SIGTERM/SIGUSR1 instead of dying at a random point; the training loop reacts at a step end."""

    def __init__(self) -> None:
        self.signame: str | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.signame = signal.Signals(signum).name
        log().warning(f"received {self.signame}: will checkpoint and stop at the next agreed step")


FLAG = SignalFlag()


def make_stop_callback(plan: Plan, keras: Any, tf: Any, engine: Any, backup: Any) -> Any:
    """Stop every rank at the same step once any rank got a signal, with a checkpoint first."""
    # each check is one small all-reduce, a sync point: every 50 steps keeps its cost near 0.1% of a step and
    # still stops within seconds of the signal (Slurm's --signal warns minutes ahead)
    every = max(1, int(os.environ.get("DISTRAIN_SIGNAL_CHECK_EVERY", "50")))
    sync = None
    if plan.size > 1 and engine.hvd is None:
        strategy = engine.strategy

        @tf.function
        def sync(flag):  # noqa: ANN001, ANN202 - in-graph: an eager collective costs far more than the step
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(flag)), axis=None)

    def agreed() -> bool:
        local = tf.constant(1.0 if FLAG.signame else 0.0)
        if plan.size == 1:
            return bool(FLAG.signame)
        if engine.hvd is not None:
            return bool(engine.hvd.allreduce(local, op=engine.hvd.Sum, name="distrain_stop").numpy() > 0)
        return bool(sync(local).numpy() > 0)  # ReduceOp has no MAX: any rank's flag makes the sum > 0

    class StopOnSignal(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True  # no per-step conversion of logs to numpy (a sync point)
            self._epoch = 0
            self._steps = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._steps += 1
            if self._steps % every or not agreed():
                return
            where = backup.stop_now(self._epoch, batch) if backup is not None else None
            # The stop is decided and saved: a later TERM must not turn this rank's exit 75 into "killed". It
            # does come: srun --kill-on-bad-exit terminates the other tasks as soon as the first one exits 75,
            # and the job script then misses the 75 it requeues on.
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_IGN)
            raise Preempted(FLAG.signame or "a signal on another rank", where)

    return StopOnSignal()
