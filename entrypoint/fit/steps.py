"""The one training position of a fit, and fit's step ends seen without a per-batch Keras callback.

`TrainingPosition` is where a fit is: the epoch in progress, the last batch of it a step ended at, the steps trained,
and how long an epoch is (fit's steps per epoch, which Keras' `params` give, or the length a dataset of unknown
length has learnt: unknown_length.py). The checkpoint, the agreed stop, the stall watchdog and the resume read it
and nothing else, so "the epoch's last step" and "where a resume starts" are decided once, for all of them.

distrain's per-step work (the stall watchdog's clock, the stop check's step count, a timed checkpoint's count)
runs after each call of the model's train function, in a thin wrapper installed for the length of one `fit`:
not in an `on_train_batch_end` hook, because on tf_keras a callback with a per-batch hook costs every step even
when nothing is due: tf_keras runs its CallbackList batch machinery (log processing, timing checks) only when some
callback implements a batch hook (`_should_call_train_batch_hooks`), so a script with none has no per-batch
callback work at all. (Keras 3 on TensorFlow calls every callback's batch hooks at every step anyway: 904 Python
calls a step against 908, benchmarks/workers/observer_ways.py.) With steps_per_execution above 1 the position's
batch is the true one, where Keras' report differs by version (Keras 3.3 passes a call's first batch, Keras 3.15
its last as if the call ran full). The stop check's collective and checkpoint run on the training thread, between
steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from .. import runs

StepObserver = Callable[[], None]


@runtime_checkable
class ObservesSteps(Protocol):
    """A fit concern with per-step work (the stall watchdog's clock, the stop check, a backup counting steps):
    told after each train-function call; it reads the position it was built with."""

    def step_ended(self) -> None: ...


class TrainingPosition:
    """Where one fit is (see the module doc), kept here alone; told by the train function (`observed`) and by the
    epoch callback (`make_callback`), which runs before every other callback."""

    def __init__(self, resumed_at: runs.Position | None = None,
                 learnt_length: Callable[[], int | None] | None = None) -> None:
        """resumed_at: (epoch, step) a resumed fit starts at; the steps of that epoch before it are counted as
        done, so that a step's index is the same whether the epoch was interrupted or not. learnt_length: the
        epochs' length of a dataset of unknown length, once learnt (None until then)."""
        self.observers: list[StepObserver] = []
        self.epoch_observers: list[Callable[[int], None]] = []  # told each epoch's start (0-based)
        # done before the next train-function call, once: a stop agreed at a step, after that step's batch hooks
        self.before_next_call: Callable[[], None] | None = None
        self.epoch = 0  # 0-based: the epoch in progress
        self.batch = -1  # the last batch of it that a step ended at (-1: none yet)
        self.steps = 0  # batches trained in this fit
        self.calls = 0  # train-function calls in this fit
        self.steps_per_call = 1
        self._keras_steps: int | None = None  # fit's steps per epoch, where Keras knows them
        self._resumed_at = resumed_at
        self._learnt_length = learnt_length
        self._learnt: int | None = None

    @property
    def epoch_length(self) -> int | None:
        """Batches an epoch has: fit's steps per epoch, else the length learnt (fixed once learnt), else None."""
        if self._keras_steps:
            return self._keras_steps
        if self._learnt is None and self._learnt_length is not None:
            self._learnt = self._learnt_length()
        return self._learnt

    def ends_epoch(self) -> bool:
        """Whether the last step ended is its epoch's last: the same on every rank. A checkpoint taken there would
        resume at the next epoch's start without this one's end (its validation, the script's epoch-end
        callbacks), which the run never stopped had: the backups write it after that end, and the stop waits
        for it too."""
        length = self.epoch_length
        return length is not None and self.batch + 1 >= length

    def after(self) -> runs.Position:
        """Where a resume starts once the last step ended is done: the next step, or the next epoch's start."""
        return runs.Position(self.epoch + 1) if self.ends_epoch() else runs.Position(self.epoch, self.batch + 1)

    def epoch_began(self, epoch: int, keras_steps: int | None) -> None:
        resumed = self._resumed_at or runs.Position(-1)
        resumed_epoch, resumed_step = resumed.epoch, resumed.step
        self.epoch, self._keras_steps = epoch, keras_steps
        self.batch = resumed_step - 1 if epoch == resumed_epoch else -1
        self._resumed_at = None  # later epochs start at their first step
        for observer in self.epoch_observers:
            observer(epoch)

    def do_before_next_call(self, action: Callable[[], None]) -> None:
        """Do `action` once, before the next train-function call (after this step's batch hooks)."""
        self.before_next_call = action

    def call_begins(self) -> None:
        pending, self.before_next_call = self.before_next_call, None
        if pending is not None:
            pending()

    def call_ended(self) -> None:
        batch = self.batch + self.steps_per_call
        if self._keras_steps:  # an epoch's last call runs only the steps left (Keras truncates it)
            batch = min(batch, self._keras_steps - 1)
        self.steps += batch - self.batch
        self.calls += 1
        self.batch = batch
        for observer in tuple(self.observers):  # an observer may leave once done (epoch_metrics')
            observer()


def make_callback(keras: Any, position: TrainingPosition) -> Any:
    """Tells the position each epoch's start and length (an epoch hook: no per-batch callback work). The only
    reader of Keras' `params`."""

    class KeepTrainingPosition(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            position.epoch_began(epoch, (getattr(self, "params", None) or {}).get("steps"))

    return KeepTrainingPosition()


def steps_per_call(model: Any) -> int:
    """How many batches one train-function call runs: compile's steps_per_execution (a tf.Variable on tf_keras,
    an int on Keras 3)."""
    # patch: steps.train_function
    value = getattr(model, "_steps_per_execution", None)
    if value is None:
        value = getattr(model, "steps_per_execution", 1)
    return max(1, int(value.numpy() if hasattr(value, "numpy") else value or 1))


@contextlib.contextmanager
def observed(model: Any, position: TrainingPosition,
             logs_of_the_global_batch: Callable[[Any], Any] | None = None) -> Iterator[None]:
    """For the length of one fit: the train function fit makes (both Keras families call `make_train_function`
    and then use `model.train_function`) tells `position` after each call, and returns its logs through
    `logs_of_the_global_batch` where each rank's are its own share's (sync.batch_logs_over_horovod), before any
    callback reads them. Afterwards the model has its own train function back, so `train_on_batch` and a later
    fit see no trace of this one."""
    # patch: steps.train_function
    make_original = model.make_train_function  # the class's, a subclass's override, or the instance's own
    own = vars(model).get("make_train_function")

    def make_train_function(*args: Any, **kwargs: Any) -> Any:
        # patch: steps.train_function
        make_original(*args, **kwargs)  # sets model.train_function (Keras 3.3 returns nothing)
        function = getattr(model.train_function, "_distrain_unobserved", model.train_function)
        position.steps_per_call = steps_per_call(model)

        def train_function(*call_args: Any, **call_kwargs: Any) -> Any:
            position.call_begins()
            logs = function(*call_args, **call_kwargs)
            if logs_of_the_global_batch is not None:
                logs = logs_of_the_global_batch(logs)
            position.call_ended()
            return logs

        train_function._distrain_unobserved = function
        model.train_function = train_function
        return train_function

    object.__setattr__(model, "make_train_function", make_train_function)  # no Keras attribute tracking
    try:
        yield
    finally:
        object.__delattr__(model, "make_train_function")
        if own is not None:
            object.__setattr__(model, "make_train_function", own)
        unobserved = getattr(getattr(model, "train_function", None), "_distrain_unobserved", None)
        if unobserved is not None:
            model.train_function = unobserved
