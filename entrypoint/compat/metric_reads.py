"""Which of Keras' metric-log reads is which, for the modules that sum metric states over workers or ranks
(keras3_mwm across MWM's workers, horovod_metric_states across Horovod's ranks).

Keras reads an epoch's logs, and an evaluate's, from the metric states once the steps are done, and resets the
states before each epoch and each evaluate, never after. An evaluate the script runs itself within an epoch (a
callback watching its validation data in long epochs) therefore leaves its states in place, and plain python's
epoch logs count that evaluation once, then the steps after it. A sum over workers that left the evaluation's total
on every worker would count it once per worker at the epoch's read: with the evaluate, Keras 3 MWM x2 logged
precision 0.25 where plain python logs 0.30769 (#69). `within_epoch` tells such a read from fit's own validation.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

_WITHIN_EPOCH: weakref.WeakSet = weakref.WeakSet()  # models whose fit is in an epoch's steps (not its validation)


def reader() -> str:
    """The name of the function that called the read this is called from: `fit` or `evaluate`, whose own bodies
    call it (the wrapper of the read calls this)."""
    frame = inspect.currentframe()
    wrapper = frame.f_back if frame is not None else None
    caller = wrapper.f_back if wrapper is not None else None
    return caller.f_code.co_name if caller is not None else ""


def within_epoch(model: Any) -> bool:
    """Whether the model's fit is in an epoch's steps: a read by `evaluate` there is the script's own."""
    return model in _WITHIN_EPOCH


def epoch_steps_marker(keras: Any) -> Any:
    """The fit's callback that marks its model as in an epoch's steps, from the epoch's start (the states were just
    reset) to its validation or its end."""

    class EpochStepsMarker(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            _WITHIN_EPOCH.add(self.model)

        def on_test_begin(self, logs: Any = None) -> None:  # fit's own validation: its callbacks are fit's
            _WITHIN_EPOCH.discard(self.model)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            _WITHIN_EPOCH.discard(self.model)

        def on_train_end(self, logs: Any = None) -> None:
            _WITHIN_EPOCH.discard(self.model)

    return EpochStepsMarker()
