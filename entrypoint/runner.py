"""Run an unmodified user script under the engine, with the zero-code hooks.

The hooks patch the Keras `Model` class in use: `compile` adapts the optimizer and the compiled model as the
engine's mode needs (engines/), `fit` runs with the concerns fit/concerns.py composes (the mode's callbacks,
checkpoint, stop, stall watchdog: their per-step work observes the train function instead of a batch hook,
steps.py) and silences progress on non-chief ranks, `save` and `save_weights` go through the atomic, chief-only
writes of saves.ScriptSaves, visible to every rank when its call returns.
DISTRAIN_HOOKS=0 turns them all off (for scripts that already distribute themselves); the public API works either
way.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import runpy
import sys
import threading
from typing import Any

from . import startup_stop
from .compat import horovod_own_updates, tf_checkpoint
from .engines import Engine
from .fit import (
    batches,
    compile_arguments,
    concerns,
    own_shards,
    progress,
    resume,
    saves,
    stages,
    starting,
    steps,
    stopping,
)
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
    note_input = concerns.InputNote(engine)

    @_once
    def fit(self, *args, **kwargs):  # noqa: ANN001, ANN202
        bound = fit_sig.bind(self, *args, **kwargs)
        args_ = bound.arguments
        user = list(args_.get("callbacks") or [])
        stage_number = next(fits)
        stage = concerns.stage_plan(plan, stage_number)
        own_backup = any(isinstance(c, keras.callbacks.BackupAndRestore) for c in user)
        fit_signature = stages.signature(args_)  # before anything rewrites the arguments
        if stage.checkpoint_dir and not own_backup:
            finished = stages.recorded(stage.checkpoint_dir, fit_signature, lambda line: concerns.say(engine, line))
            if finished is not None:
                return concerns.restore_finished_stage(engine, keras, stage, stage_number, self, args_, finished)
        own_split = own_shards.kept(engine, args_, note_input, engine.shards_input_itself() or
                                    engine.splits_batches(self, user))
        facts = concerns.InputFacts(note_input, evened, own_split[0])
        fit_callbacks = concerns.compose_callbacks(engine, keras, tf, stage, stage_number, self, args_, user,
                                                   own_backup, facts, signals)
        args_["callbacks"] = fit_callbacks.callbacks
        differs = concerns.adapt_input(engine, keras, self, args_, user, note_input, fit_callbacks.position, own_split)
        args_["callbacks"] = [*engine.metric_read_markers(keras, differs), *args_["callbacks"]]
        backup = fit_callbacks.backup
        if backup is not None:
            resume.build_before_restore(self, args_, stage.checkpoint_dir)
        progress.from_the_chief_only(engine.rank, args_)
        global_logs = concerns.logs_of_the_global_batch(engine, keras, self, args_.get("verbose", "auto"), user,
                                                        differs[0])
        with starting.starting_at(plan.family, self, fit_callbacks.position), \
                steps.observed(self, fit_callbacks.training, global_logs), \
                saves.callback_files_aside(engine, keras, user), horovod_own_updates.within_fit():
            history = orig_fit(*bound.args, **bound.kwargs)
        if backup is not None:
            concerns.record_stage(engine, stage, stage_number, self, history, fit_signature)
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
    """compile: the optimizer and the compiled model as the engine's mode needs them (engines/), the arguments
    as the ranks can run them (fit/compile_arguments.py). Patched where Keras defines it (Keras 3: its base
    Trainer): a loaded model's compile_from_config compiles only where `compile` is that class's own, and left
    load_model's model uncompiled."""
    orig_compile = model_cls.compile
    compile_sig = inspect.signature(orig_compile)

    @_outermost_only(threading.local())
    def compile(self, *args, **kwargs):  # noqa: ANN001, ANN202, A001
        bound = compile_sig.bind(self, *args, **kwargs)
        engine.adapt_optimizer(keras, bound.arguments)
        compile_arguments.adapt(engine, bound.arguments)
        compiled = orig_compile(*bound.args, **bound.kwargs)
        engine.adapt_compiled(self)
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
        engine.adopt_the_scripts_distribution()
        if engine.size > 1:
            _downloads_take_turns(engine)
        engine.install_script_fixes()
        if engine.plan.gpus_visible:
            from .compat import script_gpu_pinning

            script_gpu_pinning.install(engine.tf, engine.local_rank)
    elif engine is not None:
        engine.step_aside()
    startup_stop.hand_over(handlers_installed=False)  # hooks off: the script gets the signals' defaults
    if engine is not None and engine.plan.hooks and engine.plan.is_chief:  # hooks off: sys.stdout is python's
        track_stdout()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    if engine is not None and engine.plan.hooks and engine.plan.is_chief and engine.plan.checkpoint_dir:
        stages.clear(engine.plan.checkpoint_dir)  # the script ended: running it again trains again
