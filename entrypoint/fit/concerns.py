"""The fit hook's concerns, composed for one fit: sync (identical non-trainable state), the backup (checkpoint.py)
on the positioned input (resume.py), the agreed stop (stopping.py), the stall watchdog (stalls.py), what a stop
costs (stop_cost.py), each reading the one training position (steps.py); the input split as the engine's mode
splits it, the step's logs made the global batch's; and the script's fits as stages of the run (stages.py).
runner.py's `fit` calls them in order."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from .. import runs
from ..engines import Engine
from ..log import configure as configure_log
from ..log import get as log
from . import batches, checkpoint, checkpoint_files, resume, saves, stages, stalls, steps, stop_cost, stopping, sync


def restore_finished_stage(engine: Engine, keras: Any, stage: Any, stage_number: int, model: Any, arguments: dict,
                            finished: Any) -> Any:
    """A fit that finished in an earlier attempt: its end state restored (stages.py), its History returned."""
    say(engine, f"fit {stage_number} finished in an earlier attempt: its end state is restored, not trained again")
    resume.build_from_input(model, arguments)
    return stages.restore(stage.checkpoint_dir, finished, model, keras, engine.rank)


def record_stage(engine: Engine, stage: Any, stage_number: int, model: Any, history: Any, signature: Any) -> None:
    """A fit that ended: its end state recorded (stages.py), so that a rerun restores it instead of training it."""
    plan = engine.plan
    try:
        stages.record(stage.checkpoint_dir, history, signature, engine.rank,
                      lambda path: saves.save_weights_locally(engine, model, path), plan.family.end_weights)
    except Exception as exc:  # noqa: BLE001 - OSError, h5py's and TensorFlow's own errors for a full disk
        log().warning(f"fit {stage_number}'s end state was not recorded ({checkpoint_files.why(exc)}): a rerun "
                      "trains it again")


@dataclasses.dataclass(frozen=True)
class FitCallbacks:
    """What one fit runs with: its callbacks in order, its training position (told by the train function), the
    backup and where the positioned input starts."""
    callbacks: list
    training: steps.TrainingPosition
    backup: checkpoint.Backup | None
    position: resume.Start | None


@dataclasses.dataclass(frozen=True)
class InputFacts:
    """Where what is learnt of fit's input goes: one line for the log, the datasets made evened."""
    note: Callable[[str], None]
    evened: batches.EvenedInputs
    own_split: bool = False  # the ranks' training inputs differ already (fit/own_shards.py): each positioned whole


def compose_callbacks(engine: Engine, keras: Any, tf: Any, stage: Any, stage_number: int, model: Any,
                       arguments: dict, user: list, own_backup: bool, facts: InputFacts,
                       signals: stopping.SignalFlag) -> FitCallbacks:
    """Each concern built with all it needs: sync (identical non-trainable state), the backup (checkpoint.py) on
    the positioned input (resume.py), the agreed stop (stopping.py), the stall watchdog (stalls.py), all reading the
    one training position (steps.py); those with per-step work (steps.ObservesSteps) are told by the train
    function, not a batch callback."""
    before, after = engine.fit_callbacks(keras, user), []
    broadcasts = engine.broadcast_callbacks(before + user)
    average = sync.make_callback(keras, tf, engine, stage, broadcasts) if engine.size > 1 else None
    if average is not None:  # identical BN statistics on every rank; before Horovod's broadcast callbacks,
        before.insert(0, average)  # to keep that state out of them (sync.py)
    backup = position = None
    checkpoints = bool(stage.checkpoint_dir) and not own_backup
    if checkpoints:
        position = position_input(engine, stage, model, arguments, user, facts)
    elif not own_backup and batches.is_array_input(arguments.get("x")) and engine.splits_batches(model, user):
        # zero-code Horovod's shares of numpy input, checkpoints or not: the positioned pipeline's, which draws
        # Keras' own orders of a seeded script (compat/numpy_orders.py); nothing to say of a resume
        position = position_input(engine, stage, model, arguments, user,
                                   dataclasses.replace(facts, note=lambda line: None))
    training = steps.TrainingPosition(position,
                                      position.learnt_length if position is not None else None)
    if position is not None and position.script_input is not None:  # a PyDataset resumed mid-epoch: its epoch's end
        training.epoch_observers.append(position.script_input.epoch_began)
    plan = engine.plan
    cost = stop_cost.StopCost(plan.checkpoint_dir if plan.is_chief else None, plan.stop_lead_seconds,
                              plan.stop_check_seconds, log().warning, writes_behind=plan.checkpoint_async)
    if checkpoints:
        own = (average.save_own, average.restore_own) if average is not None else (None, None)
        backup = checkpoint.make_backup_callback(
            stage, keras, stage_number, tuple(user),
            checkpoint.BackupHooks(training, stopping.stop_for_rerun, position, *own, wrote=cost.wrote,
                                   blocked=cost.blocked, local_reads=engine.local_reads))
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


def say(engine: Engine, line: str) -> None:
    if engine.plan.is_chief:
        log().info(line)


class InputNote:
    """One line on what was done with fit's input, from the chief, once in the run (whatever the fits)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.said = engine, False

    def __call__(self, line: str) -> None:
        if self.engine.plan.is_chief and not self.said:
            self.said = True
            log().info(f"input: {line}")


def logs_of_the_global_batch(engine: Engine, keras: Any, model: Any, verbose: Any, user_callbacks: list,
                              training_differs: bool) -> Callable[[Any], Any] | None:
    """What turns a step's logs into the global batch's, where they are a rank's or the replicas' mean (fit/sync.py)."""
    if engine.splits_batches(model, user_callbacks):
        return sync.batch_logs_over_horovod(keras, engine.tf, verbose, user_callbacks, model, training_differs,
                                            engine.plan.family.horovod_keras_api)
    if engine.logs_are_the_replicas_mean():
        return sync.batch_logs_over_workers(keras, engine.tf, verbose, user_callbacks, model)
    return None


def adapt_input(engine: Engine, keras: Any, model: Any, arguments: dict, user_callbacks: list,
                 note: Callable[[str], None], position: resume.Start | None,
                 own_split: tuple[bool, bool]) -> tuple[bool, bool]:
    """Zero-code Horovod's split of the data; whether the ranks' training and validation data now differ."""
    if not engine.splits_batches(model, user_callbacks):
        return False, False
    return batches.adapt_fit_arguments(arguments, keras, rank=engine.rank, size=engine.size, note=note,
                                       rank_share=position is not None and position.rank_share, own_split=own_split)


def stage_plan(plan: Any, stage: int) -> Any:
    """The plan of the script's fit number `stage`: the run's, with that fit's own checkpoint directory."""
    if not plan.checkpoint_dir or stage == 1:
        return plan
    directory = runs.stage_dir(plan.checkpoint_dir, stage)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return dataclasses.replace(plan, checkpoint_dir=directory)


def position_input(engine: Engine, plan: Any, model: Any, arguments: dict, user_callbacks: list,
                    facts: InputFacts) -> resume.Start | None:
    """Exact resume's input (resume.py), cut into this rank's shares where zero-code Horovod splits batches."""
    if not engine.positions_input(model, user_callbacks):
        return None  # each rank reads its own data, as the script chose: nothing shared to position
    rank, size = engine.input_share(facts.own_split)
    return resume.position_input(arguments, family=plan.family, checkpoint_dir=plan.checkpoint_dir,
                                 rank=rank, size=size, replicas=engine.replicas,
                                 note=facts.note, evened=facts.evened)
