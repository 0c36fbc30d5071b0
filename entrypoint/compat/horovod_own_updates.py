"""Zero-code Horovod averages the gradients of the optimizer a script gives `compile`
(HorovodEngine.adapt_optimizer); an optimizer it never compiled would update each rank's variables with that
rank's gradients alone: the ranks drift apart, silently, and rank 0 saves its own model.

- Within `fit` (a `train_step` with optimizers of its own, as the Keras GAN guide's two, or a distillation's), each
  such update averages its gradients over the ranks first, as the compiled optimizer's are: each rank's gradient
  is of its share of the global batch, their mean the global batch's (`within_fit`, set by the fit hook).
- Outside `fit` (a custom loop under `strategy.run`, as TensorFlow's custom-training tutorial writes it) the update
  is refused at its first call with one line naming MWM, where the script's strategy makes the same loop
  distributed (compat/adopt.py).

Scripts that use Horovod themselves (`hvd.DistributedGradientTape`) are not watched, nor updates after the script's
tape came from distrain's `dt.distributed_tape`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import EnvironmentProblem
from . import registry


def averaged(optimizer: Any, is_horovods: Callable[[Any], bool]) -> bool:
    """Whether this optimizer's gradients are averaged over the ranks: distrain's or Horovod's wrapping
    (`is_horovods`), or the optimizer a LossScaleOptimizer (mixed precision) wraps is."""
    if getattr(optimizer, "_distrain_wrapped", False) or is_horovods(optimizer):
        return True
    inner = getattr(optimizer, "inner_optimizer", None)
    return inner is not None and averaged(inner, is_horovods)


_TAPES = {"average": False}  # the script's tapes average its gradients (distrain's dt.distributed_tape recipe)
_FITS = {"depth": 0}  # fits in progress: their train_step's own optimizers average their gradients


@contextlib.contextmanager
def within_fit() -> Iterator[None]:
    """Around the script's fit (the fit hook): an update by an optimizer of the model's own averages its gradients."""
    _FITS["depth"] += 1
    try:
        yield
    finally:
        _FITS["depth"] -= 1


def the_scripts_tapes_average() -> None:
    """The script averages its gradients in its tapes (dt.distributed_tape): its optimizers' updates are trusted."""
    _TAPES["average"] = True


class UnaveragedUpdate(EnvironmentProblem):
    """Raised where the update is traced, inside the script's tf.function: autograph re-raises an error carrying
    `ag_pass_through` as it is (tensorflow/python/autograph/impl/api.py), not as a StagingError wall."""

    ag_pass_through = True


def refusal(ranks: int) -> EnvironmentProblem:
    return UnaveragedUpdate(
        f"the script updates variables with an optimizer it did not give compile() outside fit (a custom loop): "
        f"under zero-code Horovod its {ranks} ranks would each train alone; written for a "
        f"strategy (`strategy.run`), run it under MWM (`distrain launch`, jobs/mwm.job), where it is distributed; "
        f"else average its gradients with hvd.DistributedGradientTape, or run it as one process (`distrain run`)")


def install(updates: tuple[str, ...], ranks: int, is_horovods: Callable[[Any], bool]) -> None:
    """Refuse an update by an optimizer whose gradients no one averages over the `ranks` Horovod ranks. `updates`:
    the family's `module:Class.method`s that apply gradients (KerasFamily.optimizer_updates)."""
    for update in updates:  # one absent: tf_keras without its legacy optimizers
        registry.replace(("horovod_own_updates.keras3_optimizers", "horovod_own_updates.tf_keras_optimizers"),
                         update, lambda original: _guarded(original, ranks, is_horovods))


def _guarded(original: Any, ranks: int, is_horovods: Callable[[Any], bool]) -> Any:
    pairs = original.__name__ == "apply_gradients"  # tf_keras: (gradient, variable) pairs; Keras 3's apply: grads

    @functools.wraps(original)
    def update(self: Any, first: Any, *args: Any, **kwargs: Any) -> Any:
        if _TAPES["average"] or averaged(self, is_horovods):
            return original(self, first, *args, **kwargs)
        if not _FITS["depth"]:
            raise refusal(ranks)
        if pairs:
            pairs_given = list(first)
            grads = averaged_over_ranks([g for g, _ in pairs_given], getattr(self, "name", "optimizer"))
            return original(self, list(zip(grads, [v for _, v in pairs_given])), *args, **kwargs)
        return original(self, averaged_over_ranks(list(first), getattr(self, "name", "optimizer")), *args, **kwargs)

    return update


def averaged_over_ranks(grads: list, optimizer_name: str) -> list:
    """`grads` averaged over the Horovod ranks (None stays None), in one grouped all-reduce."""
    import horovod.tensorflow as hvd

    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return grads
    means = hvd.grouped_allreduce([grads[i] for i in present], op=hvd.Average,
                                  name=f"distrain_own_{optimizer_name}")
    grads = list(grads)
    for i, mean in zip(present, means):
        grads[i] = mean
    return grads
