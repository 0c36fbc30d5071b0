"""The distribution engines behind one small interface: build(plan, tf) -> Engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..plan import Plan


@dataclass
class Engine:
    """What setup built: a tf.distribute strategy (None = TensorFlow's default) and, for Horovod, its module."""

    plan: Plan
    strategy: Any = None
    hvd: Any = None
    peers: tuple[str, ...] = ()  # host:port per rank that answers while that rank lives (plan.cluster for MWM)
    tf: Any = None  # the tensorflow module and the Keras setup chose (runtime.setup): what the hooks patch
    keras: Any = None

    @property
    def rank(self) -> int:
        return int(self.hvd.rank()) if self.hvd else self.plan.rank

    @property
    def size(self) -> int:
        return int(self.hvd.size()) if self.hvd else self.plan.size

    @property
    def local_rank(self) -> int:
        return int(self.hvd.local_rank()) if self.hvd else self.plan.local_rank

    @property
    def replicas(self) -> int:
        """How many replicas share each global batch: the strategy's, Horovod's ranks, or 1."""
        if self.strategy is not None:
            return int(self.strategy.num_replicas_in_sync)
        return self.size if self.hvd else 1

    def differ_between_ranks(self, values: list[int]) -> list[bool]:
        """For each of this rank's `values` (ints below 2**20), whether some other rank holds another. Every rank
        calls it at the same point: one collective, Horovod's all-gather or the strategy's all-reduce."""
        if self.size < 2:
            return [False] * len(values)
        if self.hvd is not None:
            from horovod.tensorflow import allgather_object

            gathered = allgather_object(list(values), name="distrain_compare")
            return [len({ranks_values[i] for ranks_values in gathered}) > 1 for i in range(len(values))]
        tf, strategy = self.tf, self.strategy
        # sums of v and v**2 over the replicas: all equal exactly where n * sum(v**2) == sum(v)**2 (exact in float64)
        local = [float(v) for v in values] + [float(v) ** 2 for v in values]
        total = tf.function(lambda: strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
            lambda: tf.constant(local, tf.float64)), axis=None))().numpy()
        n, count = self.replicas, len(values)
        return [n * total[count + i] != total[i] ** 2 for i in range(count)]


def build(plan: Plan, tf, before_distributing: Callable[[Any, int], Any] | None = None) -> Engine:  # noqa: ANN001
    """The engine of this plan (tf: the tensorflow module). `before_distributing(dataset, replicas)`: what the
    strategy, if any, does to every dataset it distributes first (fit/batches.before_distributing)."""
    if plan.mode == "horovod":
        from . import horovod

        hvd = horovod.init(plan, tf)
        # elastic: Horovod's driver handles a lost worker, and the ranks change after each reset
        return Engine(plan, hvd=hvd, peers=() if plan.elastic else horovod.liveness_addresses(hvd))
    if plan.mode == "mwm":
        from . import mwm

        strategy = mwm.build(plan, tf, _distributing(tf.distribute.MultiWorkerMirroredStrategy, before_distributing))
        return Engine(plan, strategy=strategy, peers=plan.cluster)
    if plan.mode == "mirrored":
        return Engine(plan, strategy=_mirrored(plan, tf, _distributing(tf.distribute.MirroredStrategy,
                                                                       before_distributing)))
    return Engine(plan, strategy=None)  # single: TensorFlow's default strategy, zero overhead


def _distributing(strategy_class: type, before: Callable[[Any, int], Any] | None) -> type:
    """`strategy_class`, or where `before` is given its subclass (same name: log lines and `isinstance` read as
    TensorFlow's) whose `experimental_distribute_dataset` hands `before` the dataset first."""
    if before is None:
        return strategy_class

    def experimental_distribute_dataset(self: Any, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        return strategy_class.experimental_distribute_dataset(self, before(dataset, self.num_replicas_in_sync),
                                                              *args, **kwargs)

    return type(strategy_class.__name__, (strategy_class,), {
        "experimental_distribute_dataset": experimental_distribute_dataset, "__module__": __name__,
        "__doc__": f"{strategy_class.__name__} whose input is first made to split between its replicas."})


def _mirrored(plan: Plan, tf, strategy_class: type):  # noqa: ANN001, ANN202
    cross = None
    if plan.collective == "ring":
        cross = tf.distribute.HierarchicalCopyAllReduce()
    elif plan.collective == "nccl":
        cross = tf.distribute.NcclAllReduce()
    return strategy_class(cross_device_ops=cross)
