"""Zero-code Horovod: fit's epoch and validation logs read from the metric states summed over the ranks.

Each rank's metrics count its own share of the data. Horovod's way, averaging the ranks' results (its
MetricAverageCallback; `keras3_horovod.AverageMetrics`), is exact for means over equal shares (the loss,
accuracy) but not for a result that is a ratio or curve of counts: Precision, Recall, AUC, F1Score (Horovod x2, 2
epochs: precision 0.43413 where plain python and MWM x2 log 0.4359, val_auc 0.56927 for 0.57467; #69). Both
families read an epoch's logs, and its validation's, from the metric states once its steps are done (Keras 3's
`_get_metrics_result_or_logs`, tf_keras' `_validate_and_get_metrics_result`, eager, called by fit's and evaluate's
own bodies): just before those two reads the states are summed over the ranks, as `keras3_mwm.metric_states` does
across MWM's workers, so every result is the global data's, and the averaging after it averages equal values.
Only where the ranks' data differ (split by distrain, or sharded by the script: `batches.adapt_fit_arguments`).
An `evaluate` the script runs itself, in a callback within an epoch or on rank 0 alone, is another reader
(evaluate, not fit) outside fit's validation: left alone, it joins no collective. The next epoch and the next
evaluate reset the states.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from . import metric_reads, registry

# the reads to sum next, set by the fit's ReadsOverRanks callback: the epoch's (a read by fit itself) and its
# validation's (a read by the evaluate fit's validation runs); a read the script makes itself is left alone
_SUM_NEXT = {"fit": False, "evaluate": False}
# model -> the metric states the script's own evaluate left within the epoch being summed (_sum_over_ranks)
_LEFT_BY_OWN_READ: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def install(tf: Any, metric_logs_read: str) -> bool:
    """Wrap the family's metric-log read (KerasFamily.metric_logs_read) once a process; False where this Keras has
    none (registry.verify has refused a Keras it does not know)."""
    import horovod.tensorflow as hvd  # its Keras module (tf_keras runs) has no grouped_allreduce

    def over_ranks(original: Callable) -> Callable:
        @functools.wraps(original)
        def read_over_ranks(self: Any, logs: Any) -> Any:
            reader = metric_reads.reader()
            if _SUM_NEXT.get(reader):
                _SUM_NEXT[reader] = False
                _sum_over_ranks(hvd, tf, self, _LEFT_BY_OWN_READ.pop(self, None) if reader == "fit" else None)
            elif _SUM_NEXT["fit"]:  # the script's own evaluate within an epoch: the states it leaves, whole data's
                _LEFT_BY_OWN_READ[self] = [tf.identity(v) for v in metric_reads.summable_metric_states(self)]
            return original(self, logs)

        return read_over_ranks

    return registry.replace(("horovod_metric_states.summed_reads", "horovod_metric_states.tf_keras_summed_reads"),
                            metric_logs_read, over_ranks) is not None


def _sum_over_ranks(hvd: Any, tf: Any, model: Any, left: list | None) -> None:
    """Set the model's metric states to their sum over the ranks (`_totals`)."""
    variables = metric_reads.summable_metric_states(model)
    for variable, total in zip(variables, _totals(hvd, tf, variables, left) if variables else []):
        variable.assign(total)


def _totals(hvd: Any, tf: Any, variables: list, left: list | None) -> list:
    """The sum of these metric states over the ranks. `left`: the states an evaluate of the script's own left
    within this epoch (Keras does not reset them after it: plain python's epoch logs count it once, then the steps
    after it). Each rank evaluated the whole data, so they are counted once, from the ranks that ran it (every rank
    alike: the same tensors everywhere, zeros where none)."""
    own = [tf.cast(v, tf.float64) for v in variables]  # one dtype: a grouped all-reduce takes no mixture
    left = [tf.cast(v, tf.float64) for v in left] if left is not None and len(left) == len(own) else None
    bases = left or [tf.zeros_like(v) for v in own]
    sums = hvd.grouped_allreduce([value - base for value, base in zip(own, bases)] + bases
                                 + [tf.constant(float(left is not None), tf.float64)],
                                 op=hvd.Sum, name="distrain_metric_states")
    count, holders = len(own), tf.maximum(sums[-1], 1.0)
    return [tf.cast(steps + base / holders, variable.dtype)
            for variable, steps, base in zip(variables, sums[:count], sums[count:2 * count])]


def step_logs_over_ranks(keras: Any, tf: Any, model: Any, averaged: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A step's logs from the states summed over the ranks (metric_reads.step_logs_from_summed_states), an evaluate
    of the script's own within the epoch counted once; `averaged`: sync.py's mean of the ranks' logs."""
    import horovod.tensorflow as hvd  # its Keras module (tf_keras runs) has no grouped_allreduce

    return metric_reads.step_logs_from_summed_states(
        keras, tf, model, lambda variables: _totals(hvd, tf, variables, _LEFT_BY_OWN_READ.get(model)), averaged)


def reads_over_ranks(keras: Any, training_differs: bool, validation_differs: bool) -> Any:
    """The fit's callback that marks the reads to sum: the epoch's, where the ranks' training data differ, and
    its validation's, where theirs do. Every rank marks alike: the sum is a collective."""

    class ReadsOverRanks(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            _SUM_NEXT["fit"] = training_differs

        def on_test_begin(self, logs: Any = None) -> None:  # fit's own validation: its callbacks are fit's
            _SUM_NEXT["evaluate"] = validation_differs

        def on_test_end(self, logs: Any = None) -> None:
            _SUM_NEXT["evaluate"] = False

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            _SUM_NEXT.update(fit=False, evaluate=False)
            _LEFT_BY_OWN_READ.pop(self.model, None)

        def on_train_end(self, logs: Any = None) -> None:
            _SUM_NEXT.update(fit=False, evaluate=False)

    return ReadsOverRanks()
