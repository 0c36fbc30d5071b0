"""distrain's public API: `import entrypoint as dt`. Valid in every mode, with or without `distrain run`.

Outside `distrain run` the first call detects the Plan from the environment and sets up (so import this
before TensorFlow if you want distrain's GPU pinning).
"""

from __future__ import annotations

import os
from typing import Any

from .plan import Plan

__version__ = "0.1.0"
__all__ = [
    "plan", "strategy", "rank", "size", "local_rank", "is_chief", "scale_lr", "shard", "save", "distributed_tape",
    "broadcast_variables",
]


def plan() -> Plan:
    """The Plan of this process (see `distrain plan`)."""
    from .runtime import current_plan

    return current_plan()


def _engine():  # noqa: ANN202
    from .runtime import setup

    return setup()


def strategy() -> Any:
    """The tf.distribute strategy in use (TensorFlow's default strategy in single and Horovod mode)."""
    return _engine().strategy_in_use()


def rank() -> int:
    """Global rank: hvd.rank() under Horovod, the worker index under MWM, else 0."""
    return _engine().rank


def size() -> int:
    """Number of workers (processes)."""
    return _engine().size


def local_rank() -> int:
    """Rank among the workers on this host."""
    return _engine().local_rank


def is_chief() -> bool:
    """True on the one process that logs, checkpoints and saves."""
    return rank() == 0


def scale_lr(lr: float, warmup_epochs: int = 0) -> Any:
    """Linear scaling: lr × number of replicas, optionally reached over `warmup_epochs` (Goyal et al.).

    Returns a float, or (with warm-up) a dict {"lr": target, "callback": keras callback} to pass to fit.
    """
    engine = _engine()
    target = lr * engine.replicas
    if not warmup_epochs:
        return target
    keras = engine.keras

    class Warmup(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch < warmup_epochs:
                value = lr + (target - lr) * (epoch + 1) / warmup_epochs
                self.model.optimizer.learning_rate.assign(value)  # a variable in tf_keras and Keras 3 alike

    return {"lr": target, "callback": Warmup()}


def shard(dataset: Any) -> Any:
    """Give this worker its share of a tf.data dataset.

    MWM and mirrored auto-shard datasets passed to fit, so this is a no-op there; Horovod (and a custom loop
    under MWM that does not distribute the dataset) needs an explicit shard by rank.
    """
    return _engine().shard(dataset)


def save(model: Any, path: str | os.PathLike, **kwargs: Any) -> None:
    """Save `model` so that only the chief's complete copy lands at `path` (atomic: temp + rename)."""
    from .fit import saves

    engine = _engine()
    original = getattr(type(model).save, "__wrapped__", type(model).save)
    saves.save_model(engine, model, path, original, **kwargs)


def distributed_tape(tape: Any) -> Any:
    """For custom training loops: under Horovod, a tape whose gradients are averaged across ranks.

    Call `tape.gradient(loss, model.trainable_variables)` as usual; under Horovod also broadcast the initial
    variables once (`dt.broadcast_variables(model.variables)`). Other modes return the tape unchanged (the
    strategy aggregates gradients itself).
    """
    return _engine().distributed_tape(tape)


def broadcast_variables(variables: Any) -> None:
    """Under Horovod, copy rank 0's values of `variables` to every rank (a no-op elsewhere)."""
    _engine().broadcast_variables(variables)

