"""Horovod custom loops' BatchNormalization statistics, averaged over the ranks in each step's gradient call.

Custom loops written for Horovod (`hvd.DistributedGradientTape`, `hvd.broadcast_variables(model.variables)`, a
rank-0 save, as Horovod's TF2 examples do) have no epoch end distrain sees and save on rank 0 alone, which can
join no collective: each rank would keep, and rank 0 save, its own moving statistics. Averaged in each step's
gradient call instead, where every rank is: the moving averages are linear in the batch statistics, so averaging
them every step gives what averaging once at the end would; they are tiny beside the gradients and Horovod fuses
their all-reduce with the gradients'.
"""

from __future__ import annotations

from typing import Any

from .keras3_horovod import tf_variables

MOVING_STATISTICS = ("moving_mean", "moving_variance")  # BatchNormalization's, in tf_keras and Keras 3


def install(hvd: Any, tf: Any) -> bool:
    """Make `hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)` also average the moving
    statistics of that model, found among the variables the script broadcast (`hvd.broadcast_variables(
    model.variables, 0)`, which Horovod's examples require for correctness anyway). True if installed."""
    if getattr(hvd, "_distrain_loop_statistics", False):
        return False
    broadcast, make_tape = hvd.broadcast_variables, hvd.DistributedGradientTape
    broadcast_groups: dict[tuple, list] = {}

    def broadcast_variables(variables: Any, root_rank: int, *args: Any, **kwargs: Any) -> Any:
        variables = list(variables)
        broadcast_groups.setdefault(tuple(id(v) for v in tf_variables(variables)), variables)
        return broadcast(variables, root_rank, *args, **kwargs)

    def statistics_of(sources: Any) -> list:
        """The moving statistics broadcast together with `sources` (the same model's), as tf.Variables."""
        sources = {id(v) for v in tf_variables(list(sources))}
        for ids, variables in broadcast_groups.items():
            if sources & set(ids):
                return [v for v in tf_variables(variables) if v.dtype.is_floating and not v.trainable
                        and v.name.split(":")[0].rsplit("/", 1)[-1] in MOVING_STATISTICS]
        return []

    def distributed_gradient_tape(gradtape: Any, *args: Any, **kwargs: Any) -> Any:
        tape = make_tape(gradtape, *args, **kwargs)
        gradient = tape.gradient

        def gradient_and_statistics(target: Any, sources: Any, *a: Any, **k: Any) -> Any:
            grads = gradient(target, sources, *a, **k)
            statistics = statistics_of(sources) if isinstance(sources, (list, tuple)) else []
            if statistics:
                values = hvd.grouped_allreduce([tf.identity(v) for v in statistics], op=hvd.Average,
                                               name="distrain_moving_statistics")
                for variable, value in zip(statistics, values):
                    variable.assign(value)
            return grads

        # patch: horovod_loop_statistics.tape
        tape.gradient = gradient_and_statistics
        return tape

    # patch: horovod_loop_statistics.tape
    hvd.broadcast_variables, hvd.DistributedGradientTape = broadcast_variables, distributed_gradient_tape
    hvd._distrain_loop_statistics = True
    return True
