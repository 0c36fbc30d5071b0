"""Stop within seconds of a signal, and checkpoint on a timer, with every rank at the same step.

SIGTERM, SIGUSR1 and a first Ctrl-C set a flag. The ranks compare notes in one small all-reduce ([any flag,
mean step time, the chief's "a timed checkpoint is due"]) about every `DISTRAIN_STOP_CHECK_SECONDS` (2 s) of
wall time. Wall time cannot pick the step by itself (each rank's clock would pick another one, and mismatched
collectives hang), so each check also sets the next one: `ceil(2 s / the agreed mean step time)` steps later,
the same number on every rank. 5 ms steps check every 400 steps, 0.6 s steps every 4, steps over 2 s every step,
and the first step of every epoch checks as well (epoch ends pause for validation and callbacks): no per-step
synchronisation, and a stop within about 2 s plus one step. Slurm's KillWait (30 s from SIGTERM to
SIGKILL) leaves room for the checkpoint.

A stop or timed checkpoint agreed at an epoch's last step waits for that epoch's end (its validation, the
script's epoch-end callbacks, the step in which a dataset of unknown length finds its end): a checkpoint taken
before them would resume at the next epoch's start without them, and the run never stopped had them. Every
rank says whether the step is its epoch's last in the same all-reduce, so all of them wait or none does.

A `stop_training` the script sets (EarlyStopping, a callback's time budget) is agreed too: otherwise a rank that
stops while another trains on leaves it waiting in a collective that never comes. At an epoch's end every rank
says whether it stops, and all stop if any does (one small all-reduce an epoch); where a script's callback can set
it in a batch hook (a class of its own or a LambdaCallback whose code reaches the name: stop_reach.py;
TerminateOnNaN), at every step, so that a stop every rank takes at the same step stays at that step, as in one
process.

A signal outside `fit` (data loading, the script's own loop) ends the run at once with exit 75, as before
distrain: nothing of distrain's is half-done there. A second Ctrl-C interrupts at once (KeyboardInterrupt).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from .. import runs, startup_stop
from ..errors import RunStopped
from ..log import get as log
from ..plan import Plan
from . import stop_input, stop_reach

if TYPE_CHECKING:
    from .checkpoint import Backup
    from .steps import TrainingPosition

CHIEF_CHECKPOINT_WAIT_SECONDS = 5.0  # how long the other ranks wait for the chief's stop checkpoint to appear


class Preempted(RunStopped):
    def __init__(self, signame: str, where: str | None, checkpoints_on: bool = False,
                 before_training: bool = False) -> None:
        if before_training:
            said = f"stopped on {signame} before the script's first fit: nothing was lost; the same command resumes"
        elif where is not None:
            said = f"stopped on {signame} after saving a checkpoint; rerun to resume at {where}"
        elif checkpoints_on:
            said = (f"stopped on {signame}; the checkpoint could not be written (see above), so a rerun resumes "
                    "from the previous one")
        else:
            said = (f"stopped on {signame}; distrain saved nothing (its checkpoints are off: DISTRAIN_CHECKPOINT=0 "
                    "or your own BackupAndRestore, or the signal came outside fit), so a rerun resumes only from "
                    "what your script saved")
        super().__init__(said)


class StoppedForRerun(RunStopped):
    """A stop no signal asked for: what this attempt found (a checkpoint set aside as unreadable) means only a
    fresh start resumes right. Exit 75, requeued and restarted like a preemption."""

    def __init__(self, why: str) -> None:
        super().__init__(why)


def stop_for_rerun(why: str) -> NoReturn:
    """Stop this attempt for a rerun (StoppedForRerun), with the exit code a requeue reads, whatever comes later."""
    ignore_stop_signals()
    raise StoppedForRerun(why)


class SignalFlag:
    """Records SIGTERM/SIGUSR1/SIGINT instead of dying at a random point; `fit` reacts at an agreed step."""

    def __init__(self) -> None:
        self.signame: str | None = None
        self.in_fit = False
        self.fits_begun = 0
        self.last_step = time.monotonic()  # when the fit's last step ended (stop_input.py)

    def install(self) -> None:
        for sig in startup_stop.STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.signame == "SIGINT":
            raise KeyboardInterrupt  # the second Ctrl-C: now
        self.signame = name
        if not self.in_fit:
            ignore_stop_signals()
            raise Preempted(name, None, before_training=self.fits_begun == 0)
        more = " (Ctrl-C again to interrupt at once)" if signum == signal.SIGINT else ""
        log().warning(f"received {name}: will checkpoint and stop within seconds, at a step all ranks agree on{more}")


def install(plan: Plan) -> SignalFlag:
    """Catch the stop signals (SignalFlag), for the fits' stop callbacks to read. Not under Horovod elastic
    (plan.elastic): there a signal ends only the worker it reached, and the others go on without it, as Horovod
    promises."""
    flag = SignalFlag()
    if not plan.elastic:
        flag.install()
    startup_stop.hand_over(handlers_installed=not plan.elastic)
    if not plan.elastic:  # after hand_over, which gives the start-up's wakeup pipe back
        stop_input.listen(plan, lambda: flag.in_fit, lambda: flag.last_step)
    return flag


def ignore_stop_signals() -> None:
    """The stop is decided: a later TERM must not turn this rank's exit 75 into "killed". It does come: srun
    --kill-on-bad-exit terminates the other tasks as soon as the first one exits 75, and the job script would
    then miss the 75 it requeues on."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


class AgreedStop:
    """What the stop callback does, apart from Keras: every DISTRAIN_STOP_CHECK_SECONDS of steps (counted in the
    training position's train-function calls) asks every rank at once (one small all-reduce) whether any got a
    signal and whether a timed checkpoint is due; then stops all of them at that step (checkpoint first), or
    writes the checkpoint."""

    def __init__(self, plan: Plan, reduce_sum: Callable[[list[float]], list[float]], backup: Backup | None,
                 flag: SignalFlag, position: TrainingPosition) -> None:
        self.plan, self.reduce_sum, self.backup, self.flag = plan, reduce_sum, backup, flag
        self.position = position
        self.timed = plan.checkpoint_minutes * 60 if backup is not None else 0.0
        self.at_epoch_end: tuple[bool, bool] | None = None  # (stop, checkpoint) agreed at the epoch's last step
        self.next_check = 1  # the first call (compilation) is measured too
        self.since = time.monotonic()
        self.steps_since = 0
        self.saved_at = time.monotonic()

    def train_begin(self) -> None:
        self.flag.in_fit = True
        self.flag.fits_begun += 1
        if self.flag.signame:  # a signal that came while fit was starting
            self.flag.in_fit = False
            ignore_stop_signals()
            raise Preempted(self.flag.signame, None, before_training=self.flag.fits_begun == 1)

    def epoch_end(self) -> None:
        """After every other callback's epoch end (the stop callback comes last): a stop or timed checkpoint
        agreed at the epoch's last step is done here."""
        # an epoch end's pauses (validation, callbacks, the checkpoint) are time the step count does not see: the
        # next epoch's first step checks too, so a stop never waits for several short epochs
        self.next_check = min(self.next_check, self.position.calls + 1)
        stop, checkpoint_due = self.at_epoch_end or (False, False)
        self.at_epoch_end = None
        if stop:
            self._stop()
        if self.backup is not None and self.backup.save_freq == "epoch":
            self.saved_at = time.monotonic()  # the backup wrote its epoch-end checkpoint just before
        elif checkpoint_due:
            self._timed_checkpoint()

    def step_ended(self) -> None:
        """Called after each train-function call (steps.py): a batch hook would cost every step."""
        self.steps_since += 1
        self.flag.last_step = time.monotonic()
        calls = self.position.calls
        if calls < self.next_check:
            return
        plan, now = self.plan, time.monotonic()
        step_time = (now - self.since) / self.steps_since
        due = 1.0 if plan.is_chief and self.timed and now - self.saved_at >= self.timed else 0.0
        # a count of ones, not plan.size: under MWM each local replica of a worker adds its copy
        signalled = 1.0 if self.flag.signame else 0.0
        last = 1.0 if self.position.ends_epoch() else 0.0
        stop, step_times, checkpoint_due, count, lasts = self.reduce_sum([signalled, step_time, due, 1.0, last])
        mean_step = step_times / count
        every = plan.stop_check_seconds
        self.next_check = calls + max(1, min(100_000, math.ceil(every / max(mean_step, 1e-6))))
        self.since, self.steps_since = time.monotonic(), 0
        if (stop > 0 or checkpoint_due > 0) and lasts == count:  # every rank's epoch ends here: wait for its end
            self.at_epoch_end = (stop > 0, checkpoint_due > 0)
            return
        if stop > 0:  # after this step's batch hooks (the script's too), before the next step: as it ran through
            self.position.do_before_next_call(self._stop)
            return
        if checkpoint_due > 0:
            self._timed_checkpoint()

    def _timed_checkpoint(self) -> None:
        minutes = self.plan.checkpoint_minutes

        def said(where: str) -> None:  # once written (Keras 3's: off the training's path, a stop's waits for it)
            if self.plan.is_chief:
                log().info(f"timed checkpoint (every {minutes:g} min): resumes at {where}")

        self.backup.save_now(then=said)
        self.saved_at = time.monotonic()

    def _stop(self) -> None:
        plan, backup = self.plan, self.backup
        waits_for_chief = backup is not None and plan.size > 1 and not plan.is_chief
        before = _newest_number(plan) if waits_for_chief else 0
        where = backup.save_now() if backup is not None else None
        if waits_for_chief:
            _wait_for_chief_checkpoint(plan, before)
        ignore_stop_signals()
        raise Preempted(self.flag.signame or "a signal on another rank", where, backup is not None)


def stops_in_batch_hooks(callback: Any, keras: Any) -> bool:
    """Whether a script's callback can set `stop_training` in a batch hook: Keras' own callbacks do only in
    TerminateOnNaN; a LambdaCallback whose functions reach the name, and a class of the script's own with a batch
    hook whose code does (stop_reach.py: not a timer's, a logger's, the Keras docs' `print(batch)`)."""
    if isinstance(callback, keras.callbacks.TerminateOnNaN):
        return True
    if isinstance(callback, keras.callbacks.LambdaCallback):
        return stop_reach.lambdas_can_stop_training(callback)
    own = type(callback).__module__.split(".")[0] not in ("keras", "tf_keras", "horovod", "entrypoint")
    base = keras.callbacks.Callback
    return own and any(getattr(type(callback), hook, None) is not getattr(base, hook, None)
                       for hook in ("on_train_batch_end", "on_batch_end")) \
        and stop_reach.can_stop_training(type(callback), base)


def make_callback(plan: Plan, keras: Any, tf: Any, engine: Any, backup: Backup | None, flag: SignalFlag,
                  position: TrainingPosition, script_callbacks: tuple = ()) -> Any:
    """The callback that stops every rank at the same step once any rank got a signal (checkpoint first), and
    writes the timed checkpoints (DISTRAIN_CHECKPOINT_MINUTES) at steps all ranks agree on (AgreedStop). Under
    Horovod elastic, a callback that does nothing: no agreed stop, no checkpoints of distrain's (see `install`).
    Placed after every other callback: its epoch end comes last."""
    if plan.elastic:
        return keras.callbacks.Callback()  # no step_ended: nothing is done per step
    reduce_sum = engine.sum_over_ranks()
    logic = AgreedStop(plan, reduce_sum, backup, flag, position)
    agreed = plan.size > 1

    def agree_on_stop_training(model: Any) -> None:
        wanted = 1.0 if model.stop_training else 0.0
        model.stop_training = reduce_sum([wanted, 0.0, 0.0, 0.0, 0.0])[0] > 0  # the stop check's shape

    class StopAndCheckpoint(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True  # its epoch hooks read no logs: none converted to numpy for it
            self.step_ended = logic.step_ended

        def on_train_begin(self, logs: Any = None) -> None:
            logic.train_begin()

        def on_train_end(self, logs: Any = None) -> None:
            flag.in_fit = False

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if agreed:
                agree_on_stop_training(self.model)
            logic.epoch_end()

    class StopAndCheckpointEveryStep(StopAndCheckpoint):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            agree_on_stop_training(self.model)

    if agreed and any(stops_in_batch_hooks(c, keras) for c in script_callbacks):
        return StopAndCheckpointEveryStep()
    return StopAndCheckpoint()


def _newest_number(plan: Plan) -> int:
    newest = runs.newest_checkpoint(runs.chief_dir(plan.checkpoint_dir))
    return runs.checkpoint_number(newest) if newest else 0


def _wait_for_chief_checkpoint(plan: Plan, before: int, timeout: float = CHIEF_CHECKPOINT_WAIT_SECONDS) -> None:
    """A worker that leaves as soon as the stop is agreed can take the chief's last collective with it: TensorFlow's
    ring pulls each chunk from its sender (RecvBuf), so the chief, still receiving the stop check's result, fails
    with "Socket closed" and a lost worker (seen on TensorFlow 2.21). The others leave once the chief's checkpoint
    is there: by then it needs nothing from them (it saves with local reads). The race lasts milliseconds, so a
    chief whose write fails or takes long (a full disk, a large model, a state dir on another node's disk) is not
    waited for longer than `timeout`."""
    deadline = time.monotonic() + timeout
    while _newest_number(plan) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
