"""Run an unmodified user script under the engine, with the zero-code hooks.

The hooks patch the Keras `Model` class in use (tf_keras by default): `compile` wraps the optimizer for Horovod,
`fit` adds the broadcast / metric-average / checkpoint / signal callbacks (their per-step work observes the train
function instead of a batch hook: steps.py) and silences progress on non-chief ranks, `save` goes through the
atomic, chief-only `checkpoint.save_model`. DISTRAIN_HOOKS=0 turns them all off (for scripts that already
distribute themselves); the public API works either way.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import os
import runpy
import sys
import threading
from typing import Any

from . import runs
from .compat import adopt
from .engines import Engine
from .fit import batches, callback_state, checkpoint, resume, stages, stalls, steps, stopping, sync
from .log import configure as configure_log
from .log import get as log

_inside = threading.local()


def _once(method):  # noqa: ANN001, ANN202
    """Apply a hook only at the outermost call (a subclass's fit calling super().fit is one fit)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN202
        key = method.__name__
        if getattr(_inside, key, False):
            return wrapper.__wrapped_original__(self, *args, **kwargs)
        setattr(_inside, key, True)
        try:
            return method(self, *args, **kwargs)
        finally:
            setattr(_inside, key, False)

    return wrapper


def install_hooks(engine: Engine, keras: Any, tf: Any) -> None:
    plan = engine.plan
    model_cls = keras.Model
    if getattr(model_cls, "_distrain_hooked", False):
        return
    orig_fit, orig_compile, orig_save = model_cls.fit, model_cls.compile, model_cls.save
    fit_sig = inspect.signature(orig_fit)
    compile_sig = inspect.signature(orig_compile)

    fits = itertools.count(1)  # the script's fits in call order: each a stage of the run, its own checkpoints

    @_once
    def fit(self, *args, **kwargs):  # noqa: ANN001, ANN202
        bound = fit_sig.bind(self, *args, **kwargs)
        args_ = bound.arguments
        user = list(args_.get("callbacks") or [])
        stage_number = next(fits)
        stage = _stage_plan(plan, stage_number)
        own_backup = any(isinstance(c, keras.callbacks.BackupAndRestore) for c in user)
        fit_signature = stages.signature(args_)  # before anything rewrites the arguments
        if stage.checkpoint_dir and not own_backup:
            finished = stages.recorded(stage.checkpoint_dir, fit_signature, lambda line: _say(engine, line))
            if finished is not None:
                _say(engine, f"fit {stage_number} finished in an earlier attempt: its end state is restored, "
                             "not trained again")
                resume.build_from_input(self, args_)
                return stages.restore(stage.checkpoint_dir, finished, self, keras, engine.rank)
        before, after = _horovod_callbacks(engine, keras, user), []
        broadcasts = tuple(c for c in before + user if hasattr(c, "register_local_var")) if engine.hvd else ()
        average = sync.make_callback(keras, tf, engine, stage, broadcasts) if engine.size > 1 else None
        if average is not None:  # identical BN statistics on every rank; before Horovod's broadcast callbacks,
            before.insert(0, average)  # to keep that state out of them (sync.py)
        backup = position = None
        if stage.checkpoint_dir and not own_backup:
            position = _position_input(engine, stage, self, args_, user)
            own = (average.save_own, average.restore_own) if average is not None else (None, None)
            backup = checkpoint.make_backup_callback(stage, keras, stage_number, tuple(user),
                                                     checkpoint.BackupHooks(position, *own))
            for lost in callback_state.not_restorable(user):
                _say(engine, f"a resume cannot give back {lost}: they are those of the epochs since it")
            after.append(backup)
        stop = stopping.make_callback(stage, keras, tf, engine, backup)
        after.append(stop)
        if plan.elastic:  # the ranks now: Horovod elastic renumbers them in a reset (never under distrain launch)
            configure_log(f"[{engine.rank}/{engine.size}] ")
        watch = stalls.make_callback(plan, keras)
        timed_backup = [backup.step_ended] if hasattr(backup, "step_ended") else []  # DISTRAIN_CHECKPOINT_EVERY
        step_ends = steps.StepEnds([watch.step_ended, *timed_backup, stop.step_ended])  # no batch callback
        # first of all: an epoch's end is a pause for the stall watchdog before the script's callbacks run
        args_["callbacks"] = [steps.make_callback(keras, step_ends), watch, *before, *user, *after]
        _adapt_input(engine, keras, self, args_, user)
        if backup is not None:
            resume.build_before_restore(self, args_, stage.checkpoint_dir)
        if engine.rank != 0:
            args_["verbose"] = 0
        elif "verbose" not in args_ and not sys.stdout.isatty():
            args_["verbose"] = 2  # one line per epoch in batch logs instead of a progress bar per step
        with resume.starting_at(plan.keras, self, position), steps.observed(self, step_ends):
            history = orig_fit(*bound.args, **bound.kwargs)
        if backup is not None:
            try:
                stages.record(stage.checkpoint_dir, history, fit_signature, engine.rank,
                              lambda path: checkpoint.save_weights_locally(plan, self, path), plan.keras == "keras3")
            except Exception as exc:  # noqa: BLE001 - OSError, h5py's and TensorFlow's own errors for a full disk
                log().warning(f"fit {stage_number}'s end state was not recorded ({checkpoint.why(exc)}): a rerun "
                              "trains it again")
        return history

    @_once
    def compile(self, *args, **kwargs):  # noqa: ANN001, ANN202, A001
        if engine.hvd is not None:
            bound = compile_sig.bind(self, *args, **kwargs)
            optimizer = keras.optimizers.get(bound.arguments.get("optimizer", "rmsprop"))
            bound.arguments["optimizer"] = _horovod_optimizer(engine, plan, optimizer)
            return orig_compile(*bound.args, **bound.kwargs)
        return orig_compile(self, *args, **kwargs)

    def save(self, filepath, *args, **kwargs):  # noqa: ANN001, ANN202
        checkpoint.save_model(engine, self, filepath, orig_save, *args, **kwargs)

    fit.__wrapped_original__ = orig_fit
    compile.__wrapped_original__ = orig_compile
    model_cls.fit, model_cls.compile, model_cls.save = fit, compile, functools.wraps(orig_save)(save)
    model_cls._distrain_hooked = True


def _horovod_optimizer(engine: Engine, plan: Any, optimizer: Any) -> Any:
    """The optimizer with its gradients averaged across Horovod ranks (once, however often compile is called, and
    not again when the script wrapped it in hvd.DistributedOptimizer itself)."""
    if getattr(optimizer, "_distrain_wrapped", False):
        return optimizer
    if adopt.is_horovod_optimizer(optimizer):  # the script's own: keep it, but saved so it loads without Horovod
        type(optimizer).__module__ = type(optimizer).__mro__[1].__module__
        return optimizer
    if plan.keras == "keras3":
        from .compat import keras3_horovod

        return keras3_horovod.wrap_optimizer(optimizer, engine.hvd)
    base = type(optimizer)
    optimizer = engine.hvd.DistributedOptimizer(optimizer)
    # Horovod's wrapper is a subclass made on the fly in module horovod._keras: a model saved with it would not
    # load without Horovod. Saved under the original class's module, it loads anywhere as the user's optimizer.
    type(optimizer).__module__ = base.__module__
    optimizer._distrain_wrapped = True
    return optimizer


def _horovod_callbacks(engine: Engine, keras: Any, user: list) -> list:
    """Rank 0's variables broadcast before the first step, metrics averaged per epoch (nothing outside Horovod;
    nothing the script already added itself)."""
    if engine.hvd is None:
        return []
    if engine.plan.keras == "keras3":
        from .compat import keras3_horovod

        return keras3_horovod.callbacks(keras, engine.hvd)
    return [make() for name, make in (
        ("BroadcastGlobalVariablesCallback", lambda: engine.hvd.callbacks.BroadcastGlobalVariablesCallback(0)),
        ("MetricAverageCallback", engine.hvd.callbacks.MetricAverageCallback),
    ) if not adopt.has_horovod_callback(user, name)]


def _say(engine: Engine, line: str) -> None:
    if engine.plan.is_chief:
        log().info(line)


def _note_input(engine: Engine, line: str) -> None:
    """One line on what was done with fit's input, from the chief, once."""
    if engine.plan.is_chief and not getattr(_inside, "noted_input", False):
        _inside.noted_input = True
        log().info(f"input: {line}")


def _splits_batches_between_ranks(engine: Engine, model: Any, user_callbacks: list) -> bool:
    """Zero-code Horovod: each rank trains on its share of every global batch (batches.py). A script written for
    Horovod (its own DistributedOptimizer or Horovod callbacks) chose per-rank batches itself and is left alone."""
    if engine.hvd is None or engine.size < 2:
        return False
    optimizer = getattr(model, "optimizer", None)
    own_optimizer = adopt.is_horovod_optimizer(optimizer) and not getattr(optimizer, "_distrain_wrapped", False)
    return not (own_optimizer or any(type(c).__module__.startswith("horovod") for c in user_callbacks))


def _adapt_input(engine: Engine, keras: Any, model: Any, arguments: dict, user_callbacks: list) -> None:
    if _splits_batches_between_ranks(engine, model, user_callbacks):
        batches.adapt_fit_arguments(arguments, keras, rank=engine.rank, size=engine.size,
                                    note=lambda line: _note_input(engine, line))


def _stage_plan(plan: Any, stage: int) -> Any:
    """The plan of the script's fit number `stage`: the run's, with that fit's own checkpoint directory."""
    if not plan.checkpoint_dir or stage == 1:
        return plan
    directory = runs.stage_dir(plan.checkpoint_dir, stage)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return dataclasses.replace(plan, checkpoint_dir=directory)


def _position_input(engine: Engine, plan: Any, model: Any, arguments: dict,
                    user_callbacks: list) -> resume.Position | None:
    """Exact resume's input (resume.py), cut into this rank's shares where zero-code Horovod splits batches."""
    if engine.hvd is not None and engine.size > 1 and not _splits_batches_between_ranks(engine, model,
                                                                                          user_callbacks):
        return None  # each rank reads its own data, as the script chose: nothing shared to position
    rank, size = (engine.rank, engine.size) if engine.hvd is not None else (0, 1)
    return resume.position_input(arguments, keras_family=plan.keras, checkpoint_dir=plan.checkpoint_dir,
                                 rank=rank, size=size, replicas=engine.replicas,
                                 note=lambda line: _note_input(engine, line))


def _adopt_horovod_tensorflow_api(engine: Engine) -> None:
    """Keras 3 variables for Horovod's TensorFlow API (compat/keras3_horovod), in any mode the script uses it."""
    from .compat import keras3_horovod
    from .runtime import STATE

    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return  # the script's own import will say so
    if keras3_horovod.adopt_tensorflow_api(hvd, STATE.keras) and engine.plan.is_chief:
        log().info("Keras 3 variables handed to Horovod's TensorFlow API as tf.Variables (no .ref())")


def run_script(script: str, argv: list[str], engine: Engine | None) -> None:
    """Execute `script` as __main__ with sys.argv = [script, *argv], like `python script args`."""
    from .runtime import STATE

    if engine is not None and engine.plan.hooks:
        install_hooks(engine, STATE.keras, STATE.tf)
        adopt.install_strategy_adoption(engine, engine.plan, STATE.tf)
        if engine.strategy is not None:
            batches.even_out_input(engine.strategy)
        if engine.plan.keras == "keras3" and (engine.hvd is not None or engine.plan.script_uses_horovod_tf):
            _adopt_horovod_tensorflow_api(engine)
        if engine.hvd is not None and engine.size > 1 and engine.plan.script_uses_horovod_tf:
            import horovod.tensorflow as hvd

            sync.average_moving_statistics_in_custom_loops(hvd, STATE.tf)
        if engine.plan.gpus_visible:
            from .compat import script_gpu_pinning

            script_gpu_pinning.install(STATE.tf, engine.local_rank)
        stopping.install(engine.plan)
    elif engine is not None and engine.strategy is not None:
        STATE.tf.distribute.experimental_set_strategy(None)
        log().info("hooks off: the script runs as is, without the default strategy or hooks")
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    if engine is not None and engine.plan.hooks and engine.plan.is_chief and engine.plan.checkpoint_dir:
        stages.clear(engine.plan.checkpoint_dir)  # the script ended: running it again trains again
