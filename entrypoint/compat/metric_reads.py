"""The metric states summed over workers or ranks (keras3_mwm across Keras 3 MWM's workers, horovod_metric_states
across Horovod's ranks): which states, which of Keras' reads is which, and a step's logs from the sums.

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
from collections.abc import Callable
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


def summable_metric_states(model: Any) -> list:
    """The model's metric states as tf.Variables (Keras 3 wraps one in `.value`), the numeric ones: what a sum over
    workers or ranks adds up (here across Keras 3 MWM's workers; horovod_metric_states.py across Horovod's ranks,
    in both families)."""
    states = getattr(model, "metrics_variables", None)
    if states is None:  # tf_keras: its metrics' own tf.Variables
        variables = [v for metric in model.metrics for v in metric.variables]
    else:
        variables = [getattr(v, "value", v) for v in states]
    return [v for v in variables if v.dtype.is_floating or v.dtype.is_integer]


_METRIC_SUMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (its variables, their sum)


def all_sum(model: Any, strategy: Any, variables: list, tf: Any) -> Any:
    """The sum of `variables` over every replica, one tf.function per model and set of variables. The variables
    are the function's closure, not its arguments: a tf.function given distributed variables as arguments kept
    reading the first ones it was traced with, so a script's second model reported the first model's metrics."""
    key = (id(strategy), tuple(v.ref() for v in variables))
    cached = _METRIC_SUMS.get(model)
    if cached is None or cached[0] != key:
        @tf.function
        def all_sum() -> list:
            local = strategy.run(lambda: [tf.identity(v) for v in variables])
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in local]

        cached = _METRIC_SUMS[model] = (key, all_sum)
    return cached[1]


def step_logs_from_summed_states(keras: Any, tf: Any, model: Any, totals: Callable[[list], list],
                                 otherwise: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A step's logs (the progress bar's, a batch hook's) as plain python's, where each worker's or rank's metrics
    count its own share: the results of the states' `totals` over all of them, the own states set back after the
    read. Where every metric is a mean (the loss, accuracy), `otherwise` (a mean of the logs, exact over equal
    shares, and cheaper) stays; so it does for a train_step's own logs (Keras' rule for its reads). Before (#69),
    Horovod x2 and Keras 3 MWM x2 showed Precision within an epoch as the mean of the ranks' (0.1 for 0.125)."""

    def from_summed_states(logs: Any) -> Any:
        variables = summable_metric_states(model) if isinstance(logs, dict) else []
        if not variables or all(isinstance(m, keras.metrics.Mean) for m in _leaf_metrics(keras, model.metrics)):
            return otherwise(logs)
        own = [tf.identity(v) for v in variables]
        for variable, total in zip(variables, totals(variables)):
            variable.assign(tf.cast(total, variable.dtype))
        try:
            results = model.get_metrics_result()
        finally:
            for variable, value in zip(variables, own):
                variable.assign(value)
        if set(results) != set(logs):  # alike on every rank: the same model and code
            return otherwise(logs)
        return {key: tf.cast(results[key], getattr(value, "dtype", tf.float32)) for key, value in logs.items()}

    return from_summed_states


def step_logs_over_workers(keras: Any, tf: Any, model: Any, strategy: Any) -> Callable[[Any], Any]:
    """Keras 3 under MWM: its step logs are the replicas' mean (keras3_mwm's reduction), from the sums instead."""
    return step_logs_from_summed_states(keras, tf, model, lambda variables: all_sum(model, strategy, variables, tf)(),
                                        lambda logs: logs)


def any_worker(tf: Any, strategy: Any, flag: bool) -> bool:
    """Whether `flag` holds on some worker (every worker calls it, at the same point: a collective)."""
    total = tf.function(lambda: strategy.reduce(tf.distribute.ReduceOp.SUM,
                                                strategy.run(lambda: tf.constant(int(flag))), axis=None))()
    return int(total) > 0


def _leaf_metrics(keras: Any, metrics: list) -> list:
    """The metric objects themselves, inside Keras 3's CompileMetrics containers."""
    leaves = []
    for metric in metrics:
        inner = getattr(metric, "metrics", None)
        if inner and type(metric).__name__ == "CompileMetrics":
            leaves += _leaf_metrics(keras, list(inner))
        elif isinstance(metric, keras.metrics.Metric):
            leaves.append(metric)
    return leaves
