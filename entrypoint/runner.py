"""Run an unmodified user script under the engine, with the zero-code hooks.

The hooks patch the Keras `Model` class in use (tf_keras by default): `compile` wraps the optimizer for Horovod,
`fit` adds the broadcast / metric-average / checkpoint / signal callbacks (their per-step work observes the train
function instead of a batch hook: steps.py) and silences progress on non-chief ranks, `save` and `save_weights`
go through the atomic, chief-only writes of saves.ScriptSaves, visible to every rank when its call returns.
DISTRAIN_HOOKS=0 turns them all off (for scripts that already distribute themselves); the public API works either
way.
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
from collections.abc import Callable
from typing import Any

from . import runs, startup_stop
from .compat import adopt, horovod_own_updates, tf_checkpoint, tf_keras_mwm
from .engines import Engine
from .fit import (
    batches,
    checkpoint,
    compile_arguments,
    own_shards,
    progress,
    resume,
    saves,
    stages,
    stalls,
    starting,
    steps,
    stop_cost,
    stopping,
    sync,
)
from .log import configure as configure_log
from .log import get as log
from .log import track_stdout


def _outermost_only(inside: threading.local):  # noqa: ANN202
    """Apply a hook only at the outermost call (a subclass's fit calling super().fit is one fit); `inside`: the
    hooks' own record of the calls in progress, per thread."""

    def decorate(method):  # noqa: ANN001, ANN202
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN202
            key = method.__name__
            if getattr(inside, key, False):
                return wrapper.__wrapped_original__(self, *args, **kwargs)
            setattr(inside, key, True)
            try:
                return method(self, *args, **kwargs)
            finally:
                setattr(inside, key, False)

        return wrapper

    return decorate


def install_hooks(engine: Engine, keras: Any, tf: Any, evened: batches.EvenedInputs,
                  signals: stopping.SignalFlag) -> None:
    """Patch keras.Model's fit, compile and save for this engine (the module doc). `evened`: exact resume's inputs
    (batches.before_distributing); `signals`: the stop signals caught (stopping.install)."""
    plan = engine.plan
    model_cls = keras.Model
    if getattr(model_cls, "_distrain_hooked", False):
        return
    orig_fit = model_cls.fit
    fit_sig = inspect.signature(orig_fit)

    fits = itertools.count(1)  # the script's fits in call order: each a stage of the run, its own checkpoints
    _once = _outermost_only(threading.local())
    note_input = _InputNote(engine)

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
                return _restore_finished_stage(engine, keras, stage, stage_number, self, args_, finished)
        own_split = own_shards.kept(engine, args_, note_input, engine.strategy is not None or
                                    _splits_batches_between_ranks(engine, self, user))
        fit_callbacks = _compose_callbacks(engine, keras, tf, stage, stage_number, self, args_, user, own_backup,
                                           _InputFacts(note_input, evened, own_split[0]), signals)
        args_["callbacks"] = fit_callbacks.callbacks
        differs = _adapt_input(engine, keras, self, args_, user, note_input, fit_callbacks.position, own_split)
        args_["callbacks"] = [*_metric_read_markers(engine, keras, differs), *args_["callbacks"]]
        backup = fit_callbacks.backup
        if backup is not None:
            resume.build_before_restore(self, args_, stage.checkpoint_dir)
        progress.from_the_chief_only(engine.rank, args_)
        global_logs = _logs_of_the_global_batch(engine, keras, self, args_.get("verbose", "auto"), user, differs[0])
        with starting.starting_at(plan.family, self, fit_callbacks.position), \
                steps.observed(self, fit_callbacks.training, global_logs), \
                saves.callback_files_aside(engine, keras, user), horovod_own_updates.within_fit():
            history = orig_fit(*bound.args, **bound.kwargs)
        if backup is not None:
            _record_stage(engine, stage, stage_number, self, history, fit_signature)
        return history

    fit.__wrapped_original__ = orig_fit
    # patch: runner.model_hooks
    model_cls.fit = fit
    _hook_compile(engine, keras, model_cls)
    _hook_saves(engine, model_cls)
    if engine.size > 1:
        progress.hook_evaluate_and_predict(lambda: engine.rank, model_cls)
    model_cls._distrain_hooked = True


def _hook_compile(engine: Engine, keras: Any, model_cls: type) -> None:
    """compile: the optimizer adapted (_adapt_optimizer); tf_keras' logs under MWM, and a script's own steps'
    gradients and logs under a strategy, as one process's (compat/tf_keras_mwm.py). Patched where Keras defines it
    (Keras 3: its base Trainer): a loaded model's compile_from_config compiles only where `compile` is that class's
    own, and left load_model's model uncompiled."""
    plan, orig_compile = engine.plan, model_cls.compile
    compile_sig = inspect.signature(orig_compile)

    @_outermost_only(threading.local())
    def compile(self, *args, **kwargs):  # noqa: ANN001, ANN202, A001
        bound = compile_sig.bind(self, *args, **kwargs)
        _adapt_optimizer(engine, keras, bound.arguments)
        compile_arguments.adapt(engine, bound.arguments)
        compiled = orig_compile(*bound.args, **bound.kwargs)
        if plan.family.sums_own_steps_gradients and plan.mode in ("mwm", "mirrored"):
            tf_keras_mwm.one_process_custom_steps(self)
        if plan.family.sums_step_logs_over_workers and plan.mode == "mwm" and engine.size > 1:
            tf_keras_mwm.first_replicas_logs(self)
        return compiled

    compile.__wrapped_original__ = orig_compile
    # patch: runner.model_hooks
    next(cls for cls in model_cls.__mro__ if "compile" in vars(cls)).compile = compile


def _hook_saves(engine: Engine, model_cls: type) -> None:
    """save, save_weights and export (and, with several ranks, tf.train.Checkpoint's writes:
    compat/tf_checkpoint.py) through saves.ScriptSaves: written once, seen by every rank when its call returns."""
    script_saves = saves.ScriptSaves(engine)
    orig_save, orig_save_weights = model_cls.save, model_cls.save_weights

    def save(self, filepath, *args, **kwargs):  # noqa: ANN001, ANN202
        script_saves.save(self, filepath, orig_save, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):  # noqa: ANN001, ANN202
        script_saves.save(self, filepath, orig_save_weights, *args, **kwargs)

    # patch: runner.model_hooks
    model_cls.save = functools.wraps(orig_save)(save)
    model_cls.save_weights = functools.wraps(orig_save_weights)(save_weights)
    orig_export = getattr(model_cls, "export", None)
    if orig_export is not None:
        def export(self, filepath, *args, **kwargs):  # noqa: ANN001, ANN202
            script_saves.save(self, filepath, orig_export, *args, **kwargs)

        model_cls.export = functools.wraps(orig_export)(export)
    if engine.size > 1:
        tf_checkpoint.install(script_saves)


def _restore_finished_stage(engine: Engine, keras: Any, stage: Any, stage_number: int, model: Any, arguments: dict,
                            finished: Any) -> Any:
    """A fit that finished in an earlier attempt: its end state restored (stages.py), its History returned."""
    _say(engine, f"fit {stage_number} finished in an earlier attempt: its end state is restored, not trained again")
    resume.build_from_input(model, arguments)
    return stages.restore(stage.checkpoint_dir, finished, model, keras, engine.rank)


def _record_stage(engine: Engine, stage: Any, stage_number: int, model: Any, history: Any, signature: Any) -> None:
    """A fit that ended: its end state recorded (stages.py), so that a rerun restores it instead of training it."""
    plan = engine.plan
    try:
        stages.record(stage.checkpoint_dir, history, signature, engine.rank,
                      lambda path: saves.save_weights_locally(plan, model, path), plan.family.end_weights)
    except Exception as exc:  # noqa: BLE001 - OSError, h5py's and TensorFlow's own errors for a full disk
        log().warning(f"fit {stage_number}'s end state was not recorded ({checkpoint.why(exc)}): a rerun trains it "
                      "again")


@dataclasses.dataclass(frozen=True)
class FitCallbacks:
    """What one fit runs with: its callbacks in order, its training position (told by the train function), the
    backup and where the positioned input starts."""
    callbacks: list
    training: steps.TrainingPosition
    backup: checkpoint.Backup | None
    position: resume.Start | None


@dataclasses.dataclass(frozen=True)
class _InputFacts:
    """Where what is learnt of fit's input goes: one line for the log, the datasets made evened."""
    note: Callable[[str], None]
    evened: batches.EvenedInputs
    own_split: bool = False  # the ranks' training inputs differ already (fit/own_shards.py): each positioned whole


def _compose_callbacks(engine: Engine, keras: Any, tf: Any, stage: Any, stage_number: int, model: Any,
                       arguments: dict, user: list, own_backup: bool, facts: _InputFacts,
                       signals: stopping.SignalFlag) -> FitCallbacks:
    """Each concern built with all it needs: sync (identical non-trainable state), the backup (checkpoint.py) on
    the positioned input (resume.py), the agreed stop (stopping.py), the stall watchdog (stalls.py), all reading the
    one training position (steps.py); those with per-step work (steps.ObservesSteps) are told by the train
    function, not a batch callback."""
    before, after = _horovod_callbacks(engine, keras, user), []
    broadcasts = tuple(c for c in before + user if hasattr(c, "register_local_var")) if engine.hvd else ()
    average = sync.make_callback(keras, tf, engine, stage, broadcasts) if engine.size > 1 else None
    if average is not None:  # identical BN statistics on every rank; before Horovod's broadcast callbacks,
        before.insert(0, average)  # to keep that state out of them (sync.py)
    backup = position = None
    checkpoints = bool(stage.checkpoint_dir) and not own_backup
    if checkpoints:
        position = _position_input(engine, stage, model, arguments, user, facts)
    elif not own_backup and batches.is_array_input(arguments.get("x")) and \
            _splits_batches_between_ranks(engine, model, user):
        # zero-code Horovod's shares of numpy input, checkpoints or not: the positioned pipeline's, which draws
        # Keras' own orders of a seeded script (compat/numpy_orders.py); nothing to say of a resume
        position = _position_input(engine, stage, model, arguments, user,
                                   dataclasses.replace(facts, note=lambda line: None))
    training = steps.TrainingPosition(position,
                                      position.learnt_length if position is not None else None)
    if position is not None and position.script_input is not None:  # a PyDataset resumed mid-epoch: its epoch's end
        training.epoch_observers.append(position.script_input.epoch_began)
    plan = engine.plan
    cost = stop_cost.StopCost(plan.checkpoint_dir if plan.is_chief else None, plan.stop_lead_seconds,
                              plan.stop_check_seconds, log().warning)
    if checkpoints:
        own = (average.save_own, average.restore_own) if average is not None else (None, None)
        backup = checkpoint.make_backup_callback(
            stage, keras, stage_number, tuple(user),
            checkpoint.BackupHooks(training, stopping.stop_for_rerun, position, *own, wrote=cost.wrote))
        script_epoch = int(arguments.get("initial_epoch") or 0)
        if (first := backup.first_epoch(script_epoch)) != script_epoch:  # fit's own argument, set only to resume
            arguments["initial_epoch"] = first
        after.append(backup)
    stop = stopping.make_callback(stage, keras, tf, engine, backup, signals, training, tuple(user))
    after.append(stop)
    if engine.plan.elastic:  # the ranks now: Horovod elastic renumbers them in a reset (never under distrain launch)
        configure_log(f"[{engine.rank}/{engine.size}] ")
    watch = stalls.make_callback(engine.plan, keras, training)
    training.observers.extend(c.step_ended for c in (watch, backup, stop, cost) if isinstance(c, steps.ObservesSteps))
    # first of all: the position's epoch before anyone reads it; an epoch's end is a pause for the stall watchdog
    # before the script's callbacks run; last, what that epoch's end cost (validation and checkpoint included)
    callbacks = [steps.make_callback(keras, training), watch, *before, *user, *after,
                 stop_cost.make_callback(keras, cost)]
    return FitCallbacks(callbacks, training, backup, position)


def _adapt_optimizer(engine: Engine, keras: Any, arguments: dict) -> None:
    """compile's optimizer: the script's own hvd.DistributedOptimizer made to load without Horovod in every mode;
    under Horovod, one whose gradients are averaged across ranks."""
    # the script's own hvd.DistributedOptimizer (or distrain's, from an earlier compile): kept as it is
    if adopt.is_horovod_optimizer(arguments.get("optimizer")):
        adopt.loads_without_horovod(arguments["optimizer"])
    elif engine.hvd is not None:
        optimizer = keras.optimizers.get(arguments.get("optimizer", "rmsprop"))
        arguments["optimizer"] = _horovod_optimizer(engine, engine.plan, optimizer)


def _horovod_optimizer(engine: Engine, plan: Any, optimizer: Any) -> Any:
    """The optimizer with its gradients averaged across Horovod ranks (once, however often compile is called; an
    hvd.DistributedOptimizer, the script's own, never reaches here: _adapt_optimizer keeps it)."""
    if getattr(optimizer, "_distrain_wrapped", False):
        return optimizer
    if not plan.family.horovod_keras_api:
        from .compat import keras3_horovod

        return keras3_horovod.wrap_optimizer(optimizer, engine.hvd)
    optimizer = engine.hvd.DistributedOptimizer(optimizer)
    adopt.loads_without_horovod(optimizer)
    # patch: horovod.distributed_optimizer
    optimizer._distrain_wrapped = True
    return optimizer


def _horovod_callbacks(engine: Engine, keras: Any, user: list) -> list:
    """Rank 0's variables broadcast before the first step, metrics averaged per epoch (nothing outside Horovod;
    nothing the script already added itself)."""
    if engine.hvd is None:
        return []
    if not engine.plan.family.horovod_keras_api:
        from .compat import keras3_horovod

        return keras3_horovod.callbacks(keras, engine.hvd)
    return [make() for name, make in (
        ("BroadcastGlobalVariablesCallback", lambda: engine.hvd.callbacks.BroadcastGlobalVariablesCallback(0)),
        ("MetricAverageCallback", engine.hvd.callbacks.MetricAverageCallback),
    ) if not adopt.has_horovod_callback(user, name)]


def _say(engine: Engine, line: str) -> None:
    if engine.plan.is_chief:
        log().info(line)


class _InputNote:
    """One line on what was done with fit's input, from the chief, once in the run (whatever the fits)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.said = engine, False

    def __call__(self, line: str) -> None:
        if self.engine.plan.is_chief and not self.said:
            self.said = True
            log().info(f"input: {line}")


def _splits_batches_between_ranks(engine: Engine, model: Any, user_callbacks: list) -> bool:
    """Zero-code Horovod: each rank trains on its share of every global batch (batches.py). A script written for
    Horovod (its own DistributedOptimizer or Horovod callbacks) chose per-rank batches itself and is left alone."""
    if engine.hvd is None or engine.size < 2:
        return False
    optimizer = getattr(model, "optimizer", None)
    own_optimizer = adopt.is_horovod_optimizer(optimizer) and not getattr(optimizer, "_distrain_wrapped", False)
    return not (own_optimizer or any(type(c).__module__.startswith("horovod") for c in user_callbacks))


def _logs_of_the_global_batch(engine: Engine, keras: Any, model: Any, verbose: Any, user_callbacks: list,
                              training_differs: bool) -> Callable[[Any], Any] | None:
    """What turns a step's logs into the global batch's, where they are a rank's or the replicas' mean (fit/sync.py)."""
    if _splits_batches_between_ranks(engine, model, user_callbacks):
        return sync.batch_logs_over_horovod(keras, engine.tf, verbose, user_callbacks, model, training_differs)
    if engine.hvd is None and engine.size > 1 and engine.plan.family.needs_strategy_fit_fixes:
        return sync.batch_logs_over_workers(keras, engine.tf, verbose, user_callbacks, model)
    return None


def _adapt_input(engine: Engine, keras: Any, model: Any, arguments: dict, user_callbacks: list,
                 note: Callable[[str], None], position: resume.Start | None,
                 own_split: tuple[bool, bool]) -> tuple[bool, bool]:
    """Zero-code Horovod's split of the data; whether the ranks' training and validation data now differ."""
    if not _splits_batches_between_ranks(engine, model, user_callbacks):
        return False, False
    return batches.adapt_fit_arguments(arguments, keras, rank=engine.rank, size=engine.size, note=note,
                                       rank_share=position is not None and position.rank_share, own_split=own_split)


def _metric_read_markers(engine: Engine, keras: Any, differs: tuple[bool, bool]) -> list:
    """First in the fit's callbacks, before any of the script's reads the metrics: which metric-log read is which,
    for the sums of the metric states over Keras 3 MWM's workers (compat/metric_reads.py) and, where the ranks'
    data differ, over Horovod's ranks (compat/horovod_metric_states.py)."""
    from .compat import horovod_metric_states, metric_reads

    if engine.hvd is None:
        return [metric_reads.epoch_steps_marker(keras)] if engine.size > 1 and \
            engine.plan.family.needs_strategy_fit_fixes else []
    if not any(differs):
        return []
    horovod_metric_states.install(engine.tf, engine.plan.family.metric_logs_read)
    return [horovod_metric_states.reads_over_ranks(keras, *differs)]


def _stage_plan(plan: Any, stage: int) -> Any:
    """The plan of the script's fit number `stage`: the run's, with that fit's own checkpoint directory."""
    if not plan.checkpoint_dir or stage == 1:
        return plan
    directory = runs.stage_dir(plan.checkpoint_dir, stage)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return dataclasses.replace(plan, checkpoint_dir=directory)


def _position_input(engine: Engine, plan: Any, model: Any, arguments: dict, user_callbacks: list,
                    facts: _InputFacts) -> resume.Start | None:
    """Exact resume's input (resume.py), cut into this rank's shares where zero-code Horovod splits batches."""
    if engine.hvd is not None and engine.size > 1 and not _splits_batches_between_ranks(engine, model,
                                                                                          user_callbacks):
        return None  # each rank reads its own data, as the script chose: nothing shared to position
    rank, size = (engine.rank, engine.size) if engine.hvd is not None and not facts.own_split else (0, 1)
    return resume.position_input(arguments, family=plan.family, checkpoint_dir=plan.checkpoint_dir,
                                 rank=rank, size=size, replicas=engine.replicas,
                                 note=facts.note, evened=facts.evened)


def _adopt_horovod_tensorflow_api(engine: Engine) -> None:
    """Keras 3 variables for Horovod's TensorFlow API (compat/keras3_horovod), in any mode the script uses it."""
    from .compat import keras3_horovod

    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return  # the script's own import will say so
    if keras3_horovod.adopt_tensorflow_api(hvd, engine.keras) and engine.plan.is_chief:
        log().info("Keras 3 variables handed to Horovod's TensorFlow API as tf.Variables (no .ref())")


def _downloads_take_turns(engine: Engine) -> None:
    """keras.utils.get_file: one rank per cache downloads and extracts (compat/downloads.py), keyed by this launch."""
    from .compat import downloads

    launch = "|".join((*engine.peers, engine.plan.job_id or "", engine.plan.run_key or ""))
    downloads.install(engine.plan.family.get_file, engine.plan.family.module, launch)


def run_script(script: str, argv: list[str], engine: Engine | None, evened: batches.EvenedInputs) -> None:
    """Execute `script` as __main__ with sys.argv = [script, *argv], like `python script args`. `evened`: where
    the datasets exact resume makes go, for the engine's strategy to leave them as they are
    (batches.before_distributing)."""
    if engine is not None and engine.plan.hooks:
        signals = stopping.install(engine.plan)
        install_hooks(engine, engine.keras, engine.tf, evened, signals)
        adopt.install_strategy_adoption(engine, engine.plan, engine.tf)
        if not engine.plan.family.horovod_keras_api and (engine.hvd is not None or engine.plan.script_uses_horovod_tf):
            _adopt_horovod_tensorflow_api(engine)
        if engine.hvd is not None and engine.size > 1 and engine.plan.script_uses_horovod_tf:
            import horovod.tensorflow as hvd

            sync.average_moving_statistics_in_custom_loops(hvd, engine.tf)
        if engine.size > 1:
            _downloads_take_turns(engine)
        if engine.strategy is not None and engine.size > 1:
            from .compat import io_device

            io_device.install(engine.tf, engine.rank)
        if engine.plan.gpus_visible:
            from .compat import script_gpu_pinning

            script_gpu_pinning.install(engine.tf, engine.local_rank)
    elif engine is not None and engine.strategy is not None:
        from .compat import default_strategy

        default_strategy.make_default(engine.tf, None)
        log().info("hooks off: the script runs as is, without the default strategy or hooks")
    startup_stop.hand_over(handlers_installed=False)  # hooks off: the script gets the signals' defaults
    if engine is not None and engine.plan.hooks and engine.plan.is_chief:  # hooks off: sys.stdout is python's
        track_stdout()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    if engine is not None and engine.plan.hooks and engine.plan.is_chief and engine.plan.checkpoint_dir:
        stages.clear(engine.plan.checkpoint_dir)  # the script ended: running it again trains again
