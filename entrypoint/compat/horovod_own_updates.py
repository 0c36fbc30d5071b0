"""Zero-code Horovod averages the gradients of the optimizer a script gives `compile` (runner._adapt_optimizer); an
optimizer it never compiled (a custom loop under `strategy.run`, as TensorFlow's custom-training tutorial writes
it, or a `train_step` with optimizers of its own, as the Keras GAN guide's) updates each rank's variables with that
rank's gradients alone: the ranks drift apart, silently, and rank 0 saves its own model. Under MWM the script's
strategy makes the same loop distributed (compat/adopt.py), so such a script is refused at its first update, with
one line naming MWM. Scripts that use Horovod themselves (`hvd.DistributedGradientTape`) are not watched, nor
updates after the script's tape came from distrain's `dt.distributed_tape`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import EnvironmentProblem
from . import targets


def averaged(optimizer: Any, is_horovods: Callable[[Any], bool]) -> bool:
    """Whether this optimizer's gradients are averaged over the ranks: distrain's or Horovod's wrapping
    (`is_horovods`), or the optimizer a LossScaleOptimizer (mixed precision) wraps is."""
    if getattr(optimizer, "_distrain_wrapped", False) or is_horovods(optimizer):
        return True
    inner = getattr(optimizer, "inner_optimizer", None)
    return inner is not None and averaged(inner, is_horovods)


_TAPES = {"average": False}  # the script's tapes average its gradients (distrain's dt.distributed_tape recipe)


def the_scripts_tapes_average() -> None:
    """The script averages its gradients in its tapes (dt.distributed_tape): its optimizers' updates are trusted."""
    _TAPES["average"] = True


class UnaveragedUpdate(EnvironmentProblem):
    """Raised where the update is traced, inside the script's tf.function: autograph re-raises an error carrying
    `ag_pass_through` as it is (tensorflow/python/autograph/impl/api.py), not as a StagingError wall."""

    ag_pass_through = True


def refusal(ranks: int) -> EnvironmentProblem:
    return UnaveragedUpdate(
        f"the script updates variables with an optimizer it did not give compile() (a custom loop, or a train_step "
        f"with optimizers of its own): under zero-code Horovod its {ranks} ranks would each train alone; written for a "
        f"strategy (`strategy.run`), run it under MWM (`distrain launch`, jobs/mwm.job), where it is distributed; "
        f"else average its gradients with hvd.DistributedGradientTape, or run it as one process (`distrain run`)")


def install(updates: tuple[str, ...], ranks: int, is_horovods: Callable[[Any], bool]) -> None:
    """Refuse an update by an optimizer whose gradients no one averages over the `ranks` Horovod ranks. `updates`:
    the family's `module:Class.method`s that apply gradients (KerasFamily.optimizer_updates)."""
    for update in updates:
        found = targets.first(update)
        if found is None:
            continue  # tf_keras without its legacy optimizers
        owner, method, _ = found
        original = getattr(owner, method)
        if not getattr(original, "_distrain_refuses_unaveraged", False):
            # patch: horovod_own_updates.keras3_optimizers
            # patch: horovod_own_updates.tf_keras_optimizers
            setattr(owner, method, _guarded(original, ranks, is_horovods))


def _guarded(original: Any, ranks: int, is_horovods: Callable[[Any], bool]) -> Any:
    @functools.wraps(original)
    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _TAPES["average"] and not averaged(self, is_horovods):
            raise refusal(ranks)
        return original(self, *args, **kwargs)

    # patch: horovod_own_updates.keras3_optimizers
    update._distrain_refuses_unaveraged = True
    return update
