"""A custom training loop written for one process (the Keras guide "Writing a training loop from scratch": a
GradientTape and `optimizer.apply_gradients` in a plain Python loop, no `strategy.run`), run where distrain's
strategy spreads the variables over several replicas (MWM, MirroredStrategy over several GPUs).

Its model's variables are then distributed, and TensorFlow refuses to use them outside a replica context, deep in
the script's step: Keras 3 with `DistributedVariable.handle is not available outside the replica context`, tf_keras
with its loss reduction's `Reduction.SUM` advice. Plain `python` runs such a loop as one process; distrain cannot
split its work without `strategy.run` (or Horovod's tape). The run ends with one line saying so, not a traceback
wall. Under zero-code Horovod the same loop is refused at its first update (compat/horovod_own_updates.py).
"""

from __future__ import annotations

# TensorFlow's and tf_keras' words for a distributed variable or loss used outside `strategy.run`, and what they mean
SIGNS = {"DistributedVariable.handle is not available outside the replica context":
         "its model's variables are used outside the replicas",
         "for loss reduction when losses are used with `tf.distribute.Strategy`":
         "its Keras loss is reduced outside the replicas"}


def outside_the_strategy(exc: BaseException, mode: str, replicas: int) -> str | None:
    """The one line for a script's error that says its loop ran outside the strategy's replicas, else None."""
    said = next((meaning for sign, meaning in SIGNS.items() if sign in str(exc)), None)
    if mode == "horovod" or replicas < 2 or said is None:
        return None
    return (f"the script trains outside `strategy.run` ({said}, {type(exc).__name__}): under {mode} its variables "
            f"are mirrored on {replicas} replicas, which a loop written for one process cannot update; run it as "
            f"one process (`distrain run`), or write its step for a strategy (TensorFlow's custom training "
            f"tutorial: `strategy.run`; distrain's strategy is the default one)")
