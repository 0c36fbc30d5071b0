"""Zero-code Horovod, Keras 3: fit's epoch and validation logs read from the metric states summed over the ranks.

Each rank's metrics count its own share of the data. Horovod's way, averaging the ranks' results (its
MetricAverageCallback; `keras3_horovod.AverageMetrics`), is exact for means over equal shares (the loss,
accuracy) but not for a result that is a ratio or curve of counts: Precision, Recall, AUC, F1Score (Horovod x2, 2
epochs: precision 0.43413 where plain python and MWM x2 log 0.4359, val_auc 0.56927 for 0.57467; #69). Keras 3
reads an epoch's logs, and its validation's, from the metric states (`Trainer._get_metrics_result_or_logs`, eager):
just before those two reads the states are summed over the ranks, as `keras3_mwm.metric_states` does across MWM's
workers, so every result is the global data's. Only where the ranks' data differ (split by distrain, or sharded by
the script: `batches.adapt_fit_arguments`); a read the script makes itself (an `evaluate` in a callback, on data
every rank holds whole) is left alone: it joins no collective. The next epoch and the next evaluate reset the
states. tf_keras logs its epochs from the last step's results instead: not done there (fit/sync.py says so).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from .keras3_mwm import summable_metric_states

TRAINER = "keras.src.trainers.trainer"

# whether the next `_get_metrics_result_or_logs` is one to sum (the epoch's training logs, fit's own validation's),
# set by the fit's ReadsOverRanks callback; any other read is left alone
_SUM_NEXT_READ = {"on": False}


def install(hvd: Any, tf: Any) -> bool:
    """Wrap Keras 3's metric-log read once a process; False where this Keras has no such read."""
    module = importlib.import_module(TRAINER)
    trainer_cls = getattr(module, "Trainer", None) or getattr(module, "BaseTrainer", None)  # keras-nightly: BaseTrainer
    original = getattr(trainer_cls, "_get_metrics_result_or_logs", None)
    if original is None:
        return False
    if getattr(original, "_distrain_over_ranks", False):
        return True

    @functools.wraps(original)
    def _get_metrics_result_or_logs(self: Any, logs: Any) -> Any:
        if _SUM_NEXT_READ["on"]:
            _SUM_NEXT_READ["on"] = False
            variables = summable_metric_states(self)
            if variables:
                totals = hvd.grouped_allreduce([tf.identity(v) for v in variables], op=hvd.Sum,
                                               name="distrain_metric_states")
                for variable, total in zip(variables, totals):
                    variable.assign(tf.cast(total, variable.dtype))
        return original(self, logs)

    _get_metrics_result_or_logs._distrain_over_ranks = True  # type: ignore[attr-defined]
    # patch: horovod_metric_states.summed_reads
    trainer_cls._get_metrics_result_or_logs = _get_metrics_result_or_logs
    return True


def reads_over_ranks(keras: Any, training_differs: bool, validation_differs: bool) -> Any:
    """The fit's callback that marks its next read as one to sum: the epoch's (read after its last step, before
    any validation), where the ranks' training data differ, and its validation's, where theirs do. Every rank marks
    alike: the sum is a collective."""

    class ReadsOverRanks(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            _SUM_NEXT_READ["on"] = training_differs

        def on_test_begin(self, logs: Any = None) -> None:  # fit's own validation: its callbacks are fit's
            _SUM_NEXT_READ["on"] = validation_differs

        def on_test_end(self, logs: Any = None) -> None:
            _SUM_NEXT_READ["on"] = False

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            _SUM_NEXT_READ["on"] = False

        def on_train_end(self, logs: Any = None) -> None:
            _SUM_NEXT_READ["on"] = False

    return ReadsOverRanks()
