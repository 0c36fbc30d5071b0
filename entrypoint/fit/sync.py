"""Keep the ranks' non-trainable state identical: BatchNormalization's moving statistics and the like.

Gradients are averaged, so trainable weights stay identical; non-trainable state is updated by each rank from its
own batches. tf_keras under MWM creates it ON_READ with MEAN aggregation, so reading it averages across workers,
but with a collective that a chief-only save never completes (compat/adopt.local_reads reads it locally, so the
local copies must be equal). Keras 3's TensorFlow variables do not aggregate (3.3.x ignores `aggregation`, later
3.x default to "none"), and Horovod never did: each rank keeps, and the chief saves, its own moving mean. This
callback averages the floating-point non-trainable variables across ranks at every epoch end (and at the end of
a fit that ended mid-epoch), before the checkpoint and user callbacks that read them, so every rank ends with
the same model and the chief's epoch-end checkpoint holds everyone's state. Within an epoch each rank keeps its
own: a checkpoint written mid-epoch keeps every rank's copy beside it (rank_state.py), and a resume there gives
each rank its own back.

Custom loops written for Horovod have no epoch end distrain sees: compat/horovod_loop_statistics.py averages
their moving statistics in each step's gradient call instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import runs
from ..compat.keras3_horovod import tf_variables
from ..log import get as log
from . import rank_state


def make_callback(keras: Any, tf: Any, engine: Any, plan: Any, broadcasts: tuple = ()) -> Any:
    """plan: this fit's (its checkpoint directory: runner._stage_plan); broadcasts: this fit's Horovod broadcast
    callbacks (distrain's, the script's)."""
    logic = KeptOutOfBroadcasts if broadcasts else AverageNonTrainableState
    callback = type(logic.__name__, (logic, keras.callbacks.Callback), {})  # the Keras family setup chose
    return callback(tf, engine, plan, engine.averager(), broadcasts)


def _state(model: Any) -> list:
    """The model's floating-point non-trainable variables (as tf.Variables under Keras 3). A model built on its
    first batch has none before it; a model never called itself (a GAN's, whose train_step calls its parts) is
    never `built`, yet has its parts' and its metric trackers' (tf_keras: counted among its variables)."""
    try:
        variables = model.non_trainable_variables
    except (AttributeError, ValueError):  # not built yet
        return []
    return [v for v in tf_variables(variables) if v.dtype.is_floating]


class AverageNonTrainableState:
    """The callback's logic, mixed into the Keras family's Callback class by `make_callback`."""

    def __init__(self, tf: Any, engine: Any, plan: Any, average: Callable[[list], None], broadcasts: tuple) -> None:
        super().__init__()
        self.tf, self.engine, self.plan, self.average = tf, engine, plan, average
        self._stepped = False  # an epoch began since the last average
        self._kept_out = False  # this state is registered with the broadcasts (Horovod)
        self.broadcasts = list(broadcasts)

    def on_train_begin(self, logs: Any = None) -> None:
        self._kept_out = False
        self.keep_out_of_broadcasts()

    def keep_out_of_broadcasts(self) -> None:
        """Horovod broadcasts rank 0's variables after a fit's first step. For this state that would drop the
        other ranks' first step, at a resumed fit's first step instead of the run's: a resumed run would end
        with other moving statistics than the run never stopped. Equal at this point (initial values, or
        restored from the one checkpoint), averaged here: kept out of that broadcast. A model built on its
        first batch has its variables only after that step: then at its end, before the broadcast (this
        callback comes before Horovod's)."""
        variables = _state(self.model) if self.broadcasts and not self._kept_out else []
        for broadcast in self.broadcasts:
            for variable in variables:
                broadcast.register_local_var(variable)
        self._kept_out = self._kept_out or bool(variables)

    def average_now(self) -> None:
        variables = _state(self.model)
        if variables:
            self.average(variables)

    def save_own(self, position: runs.Position) -> None:
        """Before a checkpoint written mid-epoch (checkpoint.py's `before_write`), which every rank reaches:
        the chief's holds its own state, so each rank keeps its own beside it (rank_state.py)."""
        variables = _state(self.model)
        if variables and self.plan.checkpoint_dir:
            rank_state.save(self.plan.checkpoint_dir, position, self.engine.rank, self.engine.size,
                            rank_state.local_values(variables, self.tf, self.engine.local_reads))

    def restore_own(self, position: runs.Position) -> None:
        """After the checkpoint at `position` was restored (checkpoint.py's `after_restore`)."""
        variables = _state(self.model)
        if not variables or not self.plan.checkpoint_dir:
            return

        def assign(values: list) -> None:
            for variable, value in zip(variables, values):
                variable.assign(value)

        done = rank_state.restore(self.plan.checkpoint_dir, position, self.engine.rank, self.engine.size, assign)
        if done and self.plan.is_chief and "averaged" in done:
            log().info(done)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._stepped = True

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.average_now()
        self._stepped = False

    def on_train_end(self, logs: Any = None) -> None:
        if self._stepped:  # a fit that ended mid-epoch; after an epoch's end the state is already averaged
            self.average_now()
        if self.plan.checkpoint_dir:
            rank_state.remove(self.plan.checkpoint_dir, self.engine.rank)


class KeptOutOfBroadcasts(AverageNonTrainableState):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # Horovod's broadcast callback asks for batch hooks anyway; no batch hook where nothing broadcasts
        if not self._kept_out:
            self.keep_out_of_broadcasts()


BATCH_LOG_HOOKS = ("on_train_batch_end", "on_batch_end")  # a callback with one reads every batch's logs


def batch_logs_over_horovod(keras: Any, tf: Any, verbose: Any, callbacks: list, model: Any,
                            states_differ: bool, horovod_keras_api: bool) -> Callable[[Any], Any] | None:
    """Zero-code Horovod: the logs of each step averaged over the ranks (`_averaged_logs`) where some rank reads
    them: its progress bar (verbose 1 or "auto", after the chief-only rule) or a script's callback with a batch-end
    hook. The ranks agree on it once a fit (one all-reduce), so that every rank joins every step's; a fit whose
    batch logs nobody reads (the one-line-an-epoch default of a batch job) pays that one all-reduce alone, where
    the averaging after the step costs 2.8 ms a step (0.84 of hand-written Horovod's throughput, benchmarks/
    README.md): where Keras' own step runs with distrain's optimizer, it is averaged within the gradients'
    all-reduce instead (compat/horovod_fused_logs.py), for the rest of the process. Where the
    ranks' data differ (`states_differ`) and a metric is no mean (Precision, AUC: a mean of the ranks' results is
    not the global counts'), the logs are read from the metric states summed over the ranks instead
    (compat/horovod_metric_states.step_logs_over_ranks)."""
    import horovod.tensorflow as hvd

    reads = reads_batch_logs(keras.callbacks.Callback, verbose, callbacks)
    some_rank_reads = int(hvd.allreduce(tf.constant(int(reads)), op=hvd.Sum, name="distrain_batch_logs_read")) > 0
    if not some_rank_reads:
        return None
    from ..compat import horovod_fused_logs, horovod_metric_states

    fused = horovod_fused_logs.fusable(model, keras.Model.train_step, horovod_keras_api)
    if fused:
        horovod_fused_logs.install(model, tf, hvd, horovod_keras_api)  # averaged within the step
    averaged = (lambda logs: logs) if fused else _averaged_logs(tf)
    if not states_differ:
        return None if fused else averaged
    return horovod_metric_states.step_logs_over_ranks(keras, tf, model, averaged)


def batch_logs_over_workers(keras: Any, tf: Any, verbose: Any, callbacks: list,
                            model: Any) -> Callable[[Any], Any] | None:
    """Keras 3 under MWM: its step logs are the replicas' mean, exact for means over equal shares, not for Precision
    or AUC: where some worker reads them (agreed as under Horovod), from the metric states summed over the workers
    (compat/metric_reads.step_logs_over_workers), where some metric is no mean."""
    from ..compat import metric_reads

    strategy = model.distribute_strategy
    if not metric_reads.any_worker(tf, strategy, reads_batch_logs(keras.callbacks.Callback, verbose, callbacks)):
        return None
    return metric_reads.step_logs_over_workers(keras, tf, model, strategy)


def reads_batch_logs(base: type, verbose: Any, callbacks: list) -> bool:
    """Whether this rank's fit reads every batch's logs: a progress bar (verbose 1 or "auto") or a callback whose
    class (or, as LambdaCallback's, the instance) has a batch-end hook of its own (`base`: Keras' Callback)."""
    return verbose in (1, "auto") or any(hook in vars(callback) or getattr(type(callback), hook, None) is not
                                         getattr(base, hook, None)
                                         for callback in callbacks for hook in BATCH_LOG_HOOKS)


def _averaged_logs(tf: Any) -> Callable[[Any], Any]:
    """Zero-code Horovod: the logs of each step averaged over the ranks, every step. Each rank's train step logs
    its own share of the global batch (its loss, its metrics' running means), and Horovod's metric averaging comes
    at an epoch's end only: the progress bar and every `on_train_batch_end` read rank 0's own numbers, not those
    of the global batch plain `python` reports (#69: loss 0.78046 and 0.88983 on the two ranks for plain python's
    0.83515). Every rank's share of a global batch is the same size or one apart (batches.py), so the mean of the
    ranks' means is the global batch's, exactly where the shares are equal. One grouped all-reduce of the scalars a
    step: every rank runs every step (the gradients' all-reduce already waits for all of them)."""
    import horovod.tensorflow as hvd  # its Keras module (tf_keras runs) has no grouped_allreduce

    def averaged(logs: Any) -> Any:
        if not isinstance(logs, dict):
            return logs
        keys = [key for key in sorted(logs) if getattr(logs[key], "shape", None) == ()
                and getattr(getattr(logs[key], "dtype", None), "is_floating", False)]
        if not keys:
            return logs
        means = hvd.grouped_allreduce([tf.cast(logs[key], tf.float64) for key in keys], op=hvd.Average,
                                      name="distrain_batch_logs")
        return {**logs, **{key: tf.cast(mean, logs[key].dtype) for key, mean in zip(keys, means)}}

    return averaged
