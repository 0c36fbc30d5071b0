"""fit's step ends, seen without a per-batch Keras callback.

distrain's per-step work (the stall watchdog's clock, the stop check's step count) runs after each call of the
model's train function, in a thin wrapper installed for the length of one `fit`: each observer gets the index of
the last batch that call ran. Not in an `on_train_batch_end` hook, because on tf_keras a callback with a
per-batch hook costs every step even when nothing is due: tf_keras runs its CallbackList batch machinery (log
processing, timing checks) only when some callback implements a batch hook (`_should_call_train_batch_hooks`), so
a script with none has no per-batch callback work at all. (Keras 3 on TensorFlow calls every callback's batch
hooks at every step anyway: 904 Python calls a step against 908, benchmarks/workers/observer_ways.py.) With
steps_per_execution above 1 the index is the true one, where Keras' report differs by version (Keras 3.3 passes a
call's first batch, Keras 3.15 its last as if the call ran full). The stop check's collective and checkpoint run
on the training thread, between steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

StepObserver = Callable[[int], None]


@runtime_checkable
class ObservesSteps(Protocol):
    """A fit concern with per-step work (the stall watchdog's clock, the stop check, a backup counting steps):
    told after each train-function call, with the last batch it ran."""

    def step_ended(self, batch: int) -> None: ...


class StepEnds:
    """The batch index within the epoch that the last train-function call ended at, and who wants to know."""

    def __init__(self, observers: list[StepObserver], resumed_at: tuple[int, int] | None = None) -> None:
        """resumed_at: (epoch, step) a resumed fit starts at; the steps of that epoch before it are counted as
        done, so that a step's index is the same whether the epoch was interrupted or not."""
        self.observers = observers
        self.batch = -1  # no step ended yet in this epoch
        self.steps_per_epoch: int | None = None
        self.steps_per_call = 1
        self.resumed_at = resumed_at

    def epoch_began(self, epoch: int, steps_per_epoch: int | None) -> None:
        resumed_epoch, resumed_step = self.resumed_at or (-1, 0)
        self.batch = resumed_step - 1 if epoch == resumed_epoch else -1
        self.steps_per_epoch, self.resumed_at = steps_per_epoch, None  # later epochs start at their first step

    def call_ended(self) -> None:
        batch = self.batch + self.steps_per_call
        if self.steps_per_epoch:  # an epoch's last call runs only the steps left (Keras truncates it)
            batch = min(batch, self.steps_per_epoch - 1)
        self.batch = batch
        for observer in self.observers:
            observer(batch)


def make_callback(keras: Any, step_ends: StepEnds) -> Any:
    """Resets the count at each epoch's start (an epoch hook: no per-batch callback work)."""

    class CountStepsPerEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            step_ends.epoch_began(epoch, (self.params or {}).get("steps"))

    return CountStepsPerEpoch()


def steps_per_call(model: Any) -> int:
    """How many batches one train-function call runs: compile's steps_per_execution (a tf.Variable on tf_keras,
    an int on Keras 3)."""
    # patch: steps.train_function
    value = getattr(model, "_steps_per_execution", None)
    if value is None:
        value = getattr(model, "steps_per_execution", 1)
    return max(1, int(value.numpy() if hasattr(value, "numpy") else value or 1))


@contextlib.contextmanager
def observed(model: Any, step_ends: StepEnds) -> Iterator[None]:
    """For the length of one fit: the train function fit makes (both Keras families call `make_train_function`
    and then use `model.train_function`) calls `step_ends` after each call. Afterwards the model has its own
    train function back, so `train_on_batch` and a later fit see no trace of this one."""
    # patch: steps.train_function
    make_original = model.make_train_function  # the class's, a subclass's override, or the instance's own
    own = vars(model).get("make_train_function")

    def make_train_function(*args: Any, **kwargs: Any) -> Any:
        # patch: steps.train_function
        make_original(*args, **kwargs)  # sets model.train_function (Keras 3.3 returns nothing)
        function = getattr(model.train_function, "_distrain_unobserved", model.train_function)
        step_ends.steps_per_call = steps_per_call(model)

        def train_function(*call_args: Any, **call_kwargs: Any) -> Any:
            logs = function(*call_args, **call_kwargs)
            step_ends.call_ended()
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
