"""What differs between the modes, behind one interface: build(plan, tf) -> Engine.

`base.Engine` is one process on TensorFlow's default strategy (single); `strategy.StrategyEngine` refines it for a
tf.distribute strategy (mirrored, MWM) and `horovod.HorovodEngine` for Horovod's ranks. Each says, for its mode:
how the ranks are numbered and how many replicas share a global batch, how gradients are averaged (the optimizer
compile gets), which callbacks a fit adds, whether and how a batch is split between the ranks, how metric states
and logs are read over the ranks, how a value is summed or averaged over them (the agreed stop, the
non-trainable state) and how they compare values. The hooks (runner.py, fit/) ask the engine and never the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plan import Plan
from .base import Engine

__all__ = ["Engine", "build", "engine_class"]


def engine_class(plan: Plan) -> type[Engine]:
    """The class of this plan's engine, for what it does before the engine exists (checks, library fixes)."""
    if plan.mode == "horovod":
        from .horovod import HorovodEngine

        return HorovodEngine
    if plan.mode in ("mwm", "mirrored"):
        from .strategy import StrategyEngine

        return StrategyEngine
    return Engine


def build(plan: Plan, tf, before_distributing: Callable[[Any, int], Any] | None = None) -> Engine:  # noqa: ANN001
    """The engine of this plan (tf: the tensorflow module). `before_distributing(dataset, replicas)`: what the
    strategy, if any, does to every dataset it distributes first (fit/batches.before_distributing)."""
    return engine_class(plan).create(plan, tf, before_distributing)
