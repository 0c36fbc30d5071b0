"""Keras 3 `fit`/`evaluate`/`predict` under MultiWorkerMirroredStrategy (and MirroredStrategy) with >1 replica.

Keras 3's TensorFlow trainer (`keras/src/backend/tensorflow/trainer.py`) fails there in up to four places. Each
fix below checks, from the source of what it corrects, that the defect is really there and does nothing where
it is not (fixed upstream: delete the fix). Where Keras' internals are not the ones these fixes know, `apply`
raises, so the run is refused at start-up with one line rather than failing later or training out of sync.

1. `reduce_per_replica(..., "mean")` calls `strategy.reduce("MEAN", v, axis=0)` for every logged value under
   MWM, which fails on scalar losses and metrics ("Invalid reduction dimension 0 for input with 0 dimensions").
   tensorflow/tensorflow#72388, keras-team/keras#20585. A scalar needs `axis=None`.
2. `_maybe_symbolic_build` (newer Keras 3) reads the first distributed *input* batch and reduces it with
   `strategy.reduce("MEAN", batch, axis=None)` to build the model symbolically; MWM cannot reduce a PerReplica of
   input tensors ("Attempt to convert a value (PerReplica...)"), keras-team/keras#20585. Reading it costs the
   script's input too: a Python generator or PyDataset loses the batches read (and prefetched), and a seeded
   reshuffling dataset draws its first order for that read, so `fit` trains other batches than one process
   (Keras 3.15). The model is built from the input's element spec (shapes and dtypes), read from nothing; where
   the input has none, from the first local replica's batch.
3. `SeedGenerator` (Dropout and every seeded layer) keeps its state in a uint32 variable, which MWM's
   collective initialisation cannot broadcast ("Value for attr 'T' of uint32 is not in the list of allowed
   values"). Fixed upstream by keras-team/keras#19928 (int64 seeds on TensorFlow); older Keras 3 (3.3.x, the one
   NGC's TensorFlow images carry) gets an int64 state the same way.
4. The TensorFlow optimizer all-reduces the gradients inside its `merge_call`, in cross-replica context, where
   `get_replica_context()` is None: the gradients are never aggregated and every replica applies its own, so
   workers silently drift apart (keras-team/keras#19969 moved the all-reduce out). Those Keras versions do not
   scale the loss by the number of replicas either, so the gradients are averaged (not summed) before the
   merge call: the gradient of the global batch's mean loss, as one process would compute it.
5. The TensorFlow backend creates every variable without the `aggregation` Keras declares (fixed in later 3.x,
   which pass it on): metric states ("sum" aggregation) stay per worker, so `fit` logs and `evaluate` returns
   each worker's own share. Their states are summed across workers just before the results are read.
6. Gradient clipping (`clipnorm`, `clipvalue`, `global_clipnorm`) runs in the replica's `apply`, before the
   gradients are summed across replicas (Keras 3.3 to 3.16's nightlies): each replica clips its own share,
   so N replicas train with other gradients than one process, and `global_clipnorm` hardly clips at all. Where
   the optimizer clips, the gradients are all-reduced just before the clip, and the optimizer's own all-reduce
   after it is skipped for those gradients: the clip acts on the global batch's gradient, as in one process.
7. The loss is averaged with a plain division by the batch size: a replica handed an empty batch (the last global
   batch smaller than the replicas) computes 0/0 = NaN, which the loss tracker keeps (NaN x weight 0), so the
   logged loss reads `nan` (tensorflow/tensorflow#36224). Later Keras 3 divides with `divide_no_nan`; so does
   this fix.
8. `predict_on_batch` hands its batch, undistributed, to every replica and concatenates what they return: under N
   replicas it returns N copies of the predictions, one after the other (Keras 3.3 to 3.16). The first replica's
   copy is the one process's answer.
9. Keras versions that scale each replica's loss by 1/replicas (`scale_loss_for_distribution`, for the gradients'
   sum) unscale it again before their own train and test steps log it; a custom `train_step` as Keras' guide
   "Customizing what happens in fit()" writes it hands `compute_loss`'s value to the "loss" metric as it is: N
   replicas log 1/N of the loss (Keras 3.15, 3.16). A `Mean` metric given that very value takes it unscaled; any
   other value (the script's own `loss * num_replicas_in_sync`, Keras' own unscaled one) is left as it is.
10. `compile(steps_per_execution=N)` runs N steps in a `tf.while_loop` over `get_next_as_optional` whose `tf.cond`
   holds the step (Keras 3.15); under MWM its collectives fail there ("You must feed a value for placeholder
   tensor 'while/body/.../while/cond/Placeholder' with dtype int32", plain Keras with the fixes above, TF 2.21).
   Keras 3.3's loop of steps works. Where the loop is the failing one (`multi_step_loop_fails`), distrain's
   compile hook runs the steps one at a time and says so in one line: the numbers are the same.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import threading
from collections import deque
from typing import Any

from ..errors import EnvironmentProblem
from . import keras3_trainer, metric_reads

_MEAN_AXIS_0 = re.compile(r"""strategy\.reduce\(\s*["']MEAN["'],\s*v,\s*axis=0\s*\)""")
_REDUCE_INPUT_BATCH = re.compile(r"""\.reduce\(\s*["']MEAN["'],\s*maybe_distributed_data_batch""")
_UINT32_STATE = re.compile(r"""dtype=["']uint32["']""")
_REDUCE_IN_MERGE_CALL = re.compile(r"""grads_and_vars = self\._all_reduce_sum_gradients\(""")
_CLIPS_BEFORE_REDUCE = re.compile(r"""grads = self\._clip_gradients\(grads\)""")
_PREDICT_UNDISTRIBUTED = re.compile(r"""self\.predict_function\(\[\(x,\)\]\)""")
_STEP_LOOP_IN_WHILE = re.compile(r"tf\.while_loop\(")
_SCALED_LOSSES_KEPT = 8  # compute_loss values remembered (the traces of one step: train, test, several models)


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _refuse(keras_version: str, what: str) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"Keras {keras_version}: {what}, so distrain cannot make multi-worker fit() work with it: use "
        "DISTRAIN_KERAS=legacy (tf_keras), or a Keras 3 that distrain was proven with (3.3.2 to 3.15.1)"
    )


def apply(tf: Any) -> list[str]:
    """Install the fixes whose defect is present; return their names. Raises EnvironmentProblem (refusal): also
    where a module, class or method these fixes read has moved (the run stops there, before any training)."""
    import keras

    version = keras.__version__
    try:
        return _apply(tf, version)
    except (ImportError, AttributeError) as exc:
        raise _refuse(version, f"its internals are not where distrain expects them ({exc})") from None


def _apply(tf: Any, version: str) -> list[str]:
    # patch: keras3_trainer.class
    trainer = importlib.import_module(keras3_trainer.TRAINER_MODULE)
    trainer_cls = keras3_trainer.trainer_class()
    seeds = importlib.import_module("keras.src.random.seed_generator")
    reduce_fn = getattr(trainer, "reduce_per_replica", None)
    # patch: keras3_mwm.scalar_reduce
    multi_worker = getattr(trainer, "_collective_all_reduce_multi_worker", None)
    if reduce_fn is None or multi_worker is None or list(inspect.signature(reduce_fn).parameters)[:3] != [
            "values", "strategy", "reduction"]:
        raise _refuse(version, "its trainer has no reduce_per_replica(values, strategy, reduction)")
    applied = []
    if _MEAN_AXIS_0.search(_source(reduce_fn)):
        trainer.reduce_per_replica = _scalar_safe_reduce(reduce_fn, multi_worker, tf)
        applied.append("reduce_per_replica axis=None for scalars (tf#72388)")
    # patch: keras3_mwm.symbolic_build
    build = getattr(trainer_cls, "_maybe_symbolic_build", None)
    if build is not None and _REDUCE_INPUT_BATCH.search(_source(build)):
        trainer_cls._maybe_symbolic_build = _build_from_local_batch(build, multi_worker, tf)
        applied.append("symbolic build from the local batch (keras#20585)")
    optimizer_cls = getattr(importlib.import_module("keras.src.backend.tensorflow.optimizer"), "TFOptimizer", None)
    # Keras versions that scale each replica's loss by 1/replicas want the gradients summed, the others averaged
    scaled = hasattr(importlib.import_module("keras.src.losses.loss"), "scale_loss_for_distribution")
    # patch: keras3_mwm.reduce_before_merge
    update = getattr(optimizer_cls, "_distributed_tf_update_step", None)
    if update is not None and _REDUCE_IN_MERGE_CALL.search(_source(update)):
        optimizer_cls._backend_update_step = _reduce_before_merge(optimizer_cls._backend_update_step, scaled, tf)
        applied.append(f"gradients {'summed' if scaled else 'averaged'} across replicas (keras#19969)")
    # patch: keras3_mwm.metric_states
    variable_cls = importlib.import_module("keras.src.backend.tensorflow").Variable  # .core's, 3.16: .ops.core's
    results = getattr(trainer_cls, "_get_metrics_result_or_logs", None)
    if "aggregation" not in _source(variable_cls._initialize) and results is not None:
        trainer_cls._get_metrics_result_or_logs = _sum_metric_states(results, multi_worker, tf)
        applied.append("metric states summed across workers (variables created without aggregation)")
    base = importlib.import_module("keras.src.optimizers.base_optimizer").BaseOptimizer
    # patch: keras3_mwm.clip_after_reduce
    clip = getattr(base, "_clip_gradients", None)
    if clip is None or not _CLIPS_BEFORE_REDUCE.search(_source(base.apply) + _source(
            getattr(base, "_backend_apply_gradients", None))):
        raise _refuse(version, "its optimizer clips gradients somewhere distrain does not know")
    reducer = getattr(optimizer_cls, "_all_reduce_sum_gradients", None)
    if reducer is None:
        raise _refuse(version, "its TensorFlow optimizer has no _all_reduce_sum_gradients")
    base._clip_gradients = _clip_after_reduce(clip, scaled, tf)
    optimizer_cls._all_reduce_sum_gradients = _unless_reduced(reducer)
    applied.append("gradients clipped after the all-reduce, not per replica")
    # patch: keras3_mwm.mean_no_nan
    losses = importlib.import_module("keras.src.losses.loss")
    if hasattr(losses, "reduce_values") and "divide_no_nan" not in _source(losses.reduce_values):
        losses.reduce_values = _mean_no_nan(losses.reduce_values)
        applied.append("empty-batch losses are 0, not NaN (tf#36224)")
    applied += _one_copy_from_predict_on_batch(trainer_cls, tf)
    if scaled:
        applied += _custom_steps_log_the_unscaled_loss(tf)
    # patch: keras3_mwm.int64_seeds
    if _UINT32_STATE.search(_source(seeds.SeedGenerator.__init__)):
        seeds.SeedGenerator.__init__ = _int64_seed_state(seeds.SeedGenerator.__init__)
        applied.append("int64 SeedGenerator state (keras#19928)")
    return applied


def _one_copy_from_predict_on_batch(trainer_cls: type, tf: Any) -> list[str]:
    # patch: keras3_mwm.predict_on_batch
    predict_on_batch = getattr(trainer_cls, "predict_on_batch", None)
    if predict_on_batch is None or not _PREDICT_UNDISTRIBUTED.search(_source(predict_on_batch)):
        return []
    trainer_cls.predict_on_batch = _first_replicas_copy(predict_on_batch, tf)
    return ["predict_on_batch returns one copy of its predictions, not one per replica"]


@functools.cache
def multi_step_loop_fails() -> bool:
    """Fix 10's test: whether this Keras runs steps_per_execution's steps in the `tf.while_loop` MWM fails in."""
    # patch: keras3_mwm.one_step_per_execution
    make_function = getattr(keras3_trainer.trainer_class(), "_make_function", None)  # Keras 3.3 has none
    return make_function is not None and bool(_STEP_LOOP_IN_WHILE.search(_source(make_function)))


def _custom_steps_log_the_unscaled_loss(tf: Any) -> list[str]:
    """Fix 9: compute_loss's values are remembered (the tensors themselves, a few: they are made when a step is
    traced), and a Mean metric updated with one of them is updated with it times the replicas."""
    # patch: keras3_mwm.custom_step_loss
    trainers = importlib.import_module("keras.src.trainers.trainer")
    trainer_base = getattr(trainers, "Trainer", None) or trainers.BaseTrainer  # 3.16: BaseTrainer
    mean_cls = importlib.import_module("keras.src.metrics.reduction_metrics").Mean
    scaled: deque = deque(maxlen=_SCALED_LOSSES_KEPT)
    compute_loss, update_state = trainer_base.compute_loss, mean_cls.update_state

    @functools.wraps(compute_loss)
    def remembering_compute_loss(self: Any, *args: Any, **kwargs: Any) -> Any:
        loss = compute_loss(self, *args, **kwargs)
        if loss is not None and tf.distribute.get_strategy().num_replicas_in_sync > 1:
            scaled.append(loss)
        return loss

    @functools.wraps(update_state)
    def unscaling_update_state(self: Any, values: Any, *args: Any, **kwargs: Any) -> Any:
        if any(values is loss for loss in scaled):
            values = values * tf.cast(tf.distribute.get_strategy().num_replicas_in_sync, values.dtype)
        return update_state(self, values, *args, **kwargs)

    trainer_base.compute_loss = remembering_compute_loss
    mean_cls.update_state = unscaling_update_state
    return ["a custom train_step's loss metric gets the loss unscaled, as Keras' own step logs it"]


def _first_replicas_copy(original: Any, tf: Any) -> Any:
    @functools.wraps(original)
    def predict_on_batch(self: Any, x: Any) -> Any:
        outputs = original(self, x)
        replicas = self.distribute_strategy.num_replicas_in_sync
        if replicas == 1:
            return outputs
        rows = len(tf.nest.flatten(x)[0])
        return tf.nest.map_structure(lambda array: array[:rows] if len(array) == rows * replicas else array, outputs)

    return predict_on_batch


def _rank(value: Any, tf: Any) -> int | None:
    if isinstance(value, tf.distribute.DistributedValues):
        value = value.values[0]
    shape = getattr(value, "shape", None)
    return None if shape is None or shape.rank is None else shape.rank


def _scalar_safe_reduce(original: Any, multi_worker: Any, tf: Any) -> Any:
    @functools.wraps(original)
    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if reduction in ("auto", "mean") and multi_worker(strategy):
            def mean(value: Any) -> Any:
                return strategy.reduce("MEAN", value, axis=None if _rank(value, tf) == 0 else 0)

            return tf.nest.map_structure(mean, values)
        return original(values, strategy, reduction)

    return reduce_per_replica


def _input_spec(epoch_iterator: Any, tf: Any) -> Any:
    """The element spec of the input an epoch iterator reads (a new, unread dataset from its adapter), or None."""
    adapter = getattr(epoch_iterator, "data_adapter", None)
    try:
        spec = adapter.get_tf_dataset().element_spec
    except Exception:  # noqa: BLE001 - an adapter without a tf.data form, a distributed dataset: read a batch
        return None
    specs = tf.nest.flatten(spec)
    return spec if specs and all(isinstance(s, tf.TensorSpec) for s in specs) else None


def _build_from_local_batch(original: Any, multi_worker: Any, tf: Any) -> Any:
    # patch: keras3_mwm.symbolic_build
    @functools.wraps(original)
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = self.distribute_strategy
        if iterator is not None and self._distribute_strategy is not None:
            spec = _input_spec(iterator, tf)
            if spec is not None:
                return original(self, iterator=None, data_batch=spec)
        if iterator is not None and self._distribute_strategy is not None and multi_worker(strategy):
            for step in iterator:
                batch = next(step[-1])  # (begin, end, iterator) in Keras 3.15; the iterator is always last
                data_batch = tf.nest.map_structure(
                    lambda x: strategy.experimental_local_results(x)[0]
                    if isinstance(x, tf.distribute.DistributedValues) else x, batch)
                break
            iterator = None
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build


def _reduce_before_merge(original: Any, scaled: bool, tf: Any) -> Any:
    @functools.wraps(original)
    def _backend_update_step(self: Any, grads: Any, trainable_variables: Any, learning_rate: Any) -> Any:
        context = tf.distribute.get_replica_context()
        if context is not None and tf.distribute.get_strategy().num_replicas_in_sync > 1 and \
                not _CLIPPED.taken(grads):
            grads = list(grads)
            present = [i for i, g in enumerate(grads) if g is not None]
            op = tf.distribute.ReduceOp.SUM if scaled else tf.distribute.ReduceOp.MEAN
            reduced = context.all_reduce(op, [grads[i] for i in present]) if present else []
            for i, value in zip(present, reduced):
                grads[i] = value
        # the original's own all-reduce runs in cross-replica context, where it is a no-op
        return original(self, grads, trainable_variables, learning_rate)

    return _backend_update_step


class _ClippedGradients(threading.local):
    """The gradients `_clip_after_reduce` reduced and clipped in this replica's trace (MirroredStrategy traces
    each local replica in a thread of its own), until the optimizer's all-reduce meets them and skips them."""

    grads: list | None = None

    def hold(self, grads: list) -> None:
        self.grads = [g for g in grads if g is not None]

    def taken(self, grads: Any) -> bool:
        """Whether `grads` are those held (the very tensors): then they are reduced already; forgotten either way."""
        held, self.grads = self.grads, None
        present = [g for g in grads if g is not None]
        return held is not None and len(held) == len(present) and all(a is b for a, b in zip(held, present))


_CLIPPED = _ClippedGradients()


def _clips(optimizer: Any) -> bool:
    return any((getattr(optimizer, name, None) or 0) > 0 for name in ("clipnorm", "clipvalue", "global_clipnorm"))


def _clip_after_reduce(original: Any, scaled: bool, tf: Any) -> Any:
    @functools.wraps(original)
    def _clip_gradients(self: Any, grads: Any) -> Any:
        context = tf.distribute.get_replica_context()
        if not _clips(self) or context is None or tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return original(self, grads)
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        op = tf.distribute.ReduceOp.SUM if scaled else tf.distribute.ReduceOp.MEAN
        for i, value in zip(present, context.all_reduce(op, [grads[i] for i in present]) if present else []):
            grads[i] = value
        clipped = original(self, grads)
        _CLIPPED.hold(clipped)
        return clipped

    return _clip_gradients


def _unless_reduced(original: Any) -> Any:
    @functools.wraps(original)
    def _all_reduce_sum_gradients(self: Any, grads_and_vars: Any) -> Any:
        grads_and_vars = list(grads_and_vars)
        if _CLIPPED.taken([g for g, _ in grads_and_vars]):
            return grads_and_vars
        return original(self, grads_and_vars)

    return _all_reduce_sum_gradients


def _sum_metric_states(original: Any, multi_worker: Any, tf: Any) -> Any:
    @functools.wraps(original)
    def _get_metrics_result_or_logs(self: Any, logs: Any) -> Any:
        strategy = self.distribute_strategy
        variables = metric_reads.summable_metric_states(self) if multi_worker(strategy) else []
        if not variables:
            return original(self, logs)
        # the script's own evaluate within an epoch: its states stay this worker's, counted on into the epoch's
        # logs, and summed once there (metric_reads.py)
        own = [tf.identity(v) for v in variables] if metric_reads.reader() == "evaluate" and \
            metric_reads.within_epoch(self) else []
        for variable, total in zip(variables, metric_reads.all_sum(self, strategy, variables, tf)()):
            variable.assign(tf.cast(total, variable.dtype))
        results = original(self, logs)
        for variable, value in zip(variables, own):
            variable.assign(value)
        return results

    return _get_metrics_result_or_logs


def _mean_no_nan(original: Any) -> Any:
    from keras import ops

    @functools.wraps(original)
    def reduce_values(values: Any, *args: Any, **kwargs: Any) -> Any:
        reduction = kwargs.get("reduction", args[-1] if args else "sum_over_batch_size")
        if reduction != "sum_over_batch_size" or tuple(values.shape) in ((), (0,)):
            return original(values, *args, **kwargs)
        count = ops.cast(ops.prod(ops.convert_to_tensor(ops.shape(values), dtype="int32")), values.dtype)
        return ops.divide_no_nan(ops.sum(values), count)

    return reduce_values


class _Int64Seeds:
    """The backend as SeedGenerator sees it, with its uint32 seed variables created as int64."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def Variable(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the backend's name
        if kwargs.get("dtype") == "uint32":
            kwargs["dtype"] = "int64"
        return self._backend.Variable(*args, **kwargs)

    def convert_to_tensor(self, value: Any, dtype: Any = None, **kwargs: Any) -> Any:
        return self._backend.convert_to_tensor(value, dtype="int64" if dtype == "uint32" else dtype, **kwargs)


def _int64_seed_state(original: Any) -> Any:
    from keras.src import backend

    @functools.wraps(original)
    def __init__(self: Any, seed: Any = None, name: Any = None, **kwargs: Any) -> None:  # noqa: N807
        kwargs.setdefault("backend", _Int64Seeds(backend))
        original(self, seed, name, **kwargs)

    return __init__
