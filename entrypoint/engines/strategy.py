"""A tf.distribute strategy's mode: MirroredStrategy over one process's GPUs, MultiWorkerMirroredStrategy over
workers (mwm.py builds it). The strategy averages the gradients and splits each global batch between its replicas
itself; what distrain adds: tf_keras' logs and a script's own steps as one process's (compat/tf_keras_mwm.py),
Keras 3's metric states and logs summed over the workers (compat/keras3_mwm.py, metric_reads.py), and the
collectives of the agreed stop and of the non-trainable state's average.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from ..compat import adopt, default_strategy, metric_reads, tf_keras_mwm
from ..log import get as log
from ..plan import Plan
from .base import Engine


class StrategyEngine(Engine):
    @classmethod
    def create(cls, plan: Plan, tf: Any, before_distributing: Callable[[Any, int], Any] | None = None) -> Engine:
        return cls(plan, strategy=build(plan, tf, before_distributing),
                   peers=plan.cluster if plan.mode == "mwm" else ())

    @classmethod
    def fix_libraries(cls, plan: Plan, tf: Any) -> None:
        """Keras 3's distributed fit and saving (compat/keras3_mwm.py, keras3_saving.py), tf_keras' own steps
        (compat/tf_keras_mwm.py), where there are several replicas."""
        if plan.replicas < 2:
            return
        if plan.family.needs_strategy_fit_fixes:
            from ..compat import keras3_mwm, keras3_saving

            fixes = keras3_mwm.apply(tf) + keras3_saving.apply(tf)
            if fixes and plan.is_chief:
                log().info(f"Keras {sys.modules['keras'].__version__} fixes for distributed fit: {'; '.join(fixes)}")
        if plan.family.sums_own_steps_gradients:
            tf_keras_mwm.apply()

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    def strategy_in_use(self) -> Any:
        return self.strategy

    def shards_input_itself(self) -> bool:
        return True

    def become_default(self) -> None:
        default_strategy.make_default(self.tf, self.strategy)
        default_strategy.keep_after_resets(self.tf, self.strategy)
        default_strategy.load_saved_models_plain(self.tf, self.strategy)

    def step_aside(self) -> None:
        default_strategy.make_default(self.tf, None)
        log().info("hooks off: the script runs as is, without the default strategy or hooks")

    def adopt_the_scripts_distribution(self) -> None:
        """The script's own strategy and resolvers are distrain's (compat/adopt.py)."""
        adopt.refuse_reconfiguring(self.plan, self.tf)
        super().adopt_the_scripts_distribution()
        adopt.adopt_strategies(self, self.plan, self.tf)

    def local_reads(self) -> contextlib.AbstractContextManager:
        if self.plan.mode == "mwm" and self.size > 1:
            return adopt.local_reads(self.tf)
        return contextlib.nullcontext()

    def differ_between_ranks(self, values: list[int]) -> list[bool]:
        if self.size < 2:
            return [False] * len(values)
        tf, strategy = self.tf, self.strategy
        # sums of v and v**2 over the replicas: all equal exactly where n * sum(v**2) == sum(v)**2 (exact in float64)
        local = [float(v) for v in values] + [float(v) ** 2 for v in values]
        total = tf.function(lambda: strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
            lambda: tf.constant(local, tf.float64)), axis=None))().numpy()
        n, count = self.replicas, len(values)
        return [n * total[count + i] != total[i] ** 2 for i in range(count)]

    def sum_over_ranks(self) -> Callable[[list[float]], list[float]]:
        if self.size == 1:
            return lambda values: values
        tf, launcher = self.tf, one_device_launcher(self.strategy)
        if launcher is None:
            return public_sum_over_ranks(self.strategy, tf)
        options = _communication_options(self.strategy)

        def eager_sum(values: list[float]) -> list[float]:
            total = launcher.all_reduce(tf.constant(values, tf.float32), options=options)
            return [float(v) for v in total.numpy()]

        return eager_sum

    def averager(self) -> Callable[[list], None] | None:
        tf, strategy = self.tf, self.strategy

        @tf.function
        def mean(variables: list) -> Any:
            local = strategy.run(lambda: [tf.identity(v) for v in variables])
            return [strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None) for value in local]

        def average_over_the_strategy(variables: list) -> None:
            for variable, value in zip(variables, mean(variables)):
                variable.assign(value)

        return average_over_the_strategy

    def adapt_compiled(self, model: Any) -> None:
        family = self.plan.family
        if family.sums_own_steps_gradients:
            tf_keras_mwm.one_process_custom_steps(model)
        if family.sums_step_logs_over_workers and self.plan.mode == "mwm" and self.size > 1:
            tf_keras_mwm.first_replicas_logs(model)

    def steps_loop_meets_collectives(self) -> bool:
        return self.plan.mode == "mwm" and self.size > 1

    def why_xla_cannot_compile_the_collectives(self, gpus: bool) -> str | None:
        if self.plan.mode == "mwm" and not gpus:
            return "TensorFlow's XLA has no collectives on CPUs (b/194942685)"
        return None

    def updates_merge_replicas(self) -> bool:
        return self.replicas > 1

    def logs_are_the_replicas_mean(self) -> bool:
        return self.size > 1 and self.plan.family.needs_strategy_fit_fixes

    def metric_read_markers(self, keras: Any, differs: tuple[bool, bool]) -> list:
        return [metric_reads.epoch_steps_marker(keras)] if self.logs_are_the_replicas_mean() else []

    def install_script_fixes(self) -> None:
        super().install_script_fixes()
        if self.size > 1:
            from ..compat import io_device

            io_device.install(self.tf, self.rank)


def build(plan: Plan, tf: Any, before_distributing: Callable[[Any, int], Any] | None) -> Any:
    """The plan's strategy: MWM's (mwm.py) or MirroredStrategy with the plan's collective."""
    if plan.mode == "mwm":
        from . import mwm

        return mwm.build(plan, tf, _distributing(tf.distribute.MultiWorkerMirroredStrategy, before_distributing))
    cross = {"ring": tf.distribute.HierarchicalCopyAllReduce, "nccl": tf.distribute.NcclAllReduce}.get(
        plan.collective)
    return _distributing(tf.distribute.MirroredStrategy, before_distributing)(
        cross_device_ops=cross() if cross else None)


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


def public_sum_over_ranks(strategy: Any, tf: Any) -> Callable[[list[float]], list[float]]:
    """The stop check's sum through the strategy's public API (`in_graph_sum`), its result as floats."""
    in_graph = in_graph_sum(strategy, tf)

    def public_sum(values: list[float]) -> list[float]:
        return [float(v) for v in in_graph(tf.constant(values, tf.float32)).numpy()]

    return public_sum


def in_graph_sum(strategy: Any, tf: Any) -> Any:
    """The sum through the strategy's public API, in a tf.function (eager, `strategy.run` costs twice as much).
    Traced without autograph: there is no Python control flow to convert, and converting it doubled the first
    check's CPU (38 → 19 ms a worker, #21)."""

    @tf.function(autograph=False)
    def in_graph(values):  # noqa: ANN001, ANN202
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(values)), axis=None)

    return in_graph


def one_device_launcher(strategy: Any) -> Any:
    """MWM's own all-reduce launcher (`CollectiveReplicaLauncher`) where a worker has one device, else None.

    Called eagerly, it costs a check 2.3-2.6 ms of a worker's CPU (1.2 on the training thread) against 3.3-3.9
    (1.9-2.1) through `in_graph_sum`'s tf.function, which resolves its arguments and captures its instance key
    through a Python callback at every call (benchmarks/workers/allreduce.py --stop-checks, two workers on a 2-vCPU VM;
    benchmarks/results/comm.json).
    Its keys come from the strategy's own allocator, one per call as the tf.function's do, so no key is shared
    with the strategy's own collectives and every rank draws the same one. A private layout of TensorFlow's
    (tensorflow/python/distribute/cross_device_ops.py, the same on 2.17 and 2.21): where it differs, or a worker
    has several devices (one launcher each), None, and the check takes the public way."""
    # patch: stopping.strategy_launchers
    cross_device_ops = getattr(getattr(strategy, "extended", None), "_cross_device_ops", None)
    launchers = getattr(cross_device_ops, "_launchers", None)
    if isinstance(launchers, list) and len(launchers) == 1 and callable(getattr(launchers[0], "all_reduce", None)):
        return launchers[0]
    return None


def _communication_options(strategy: Any) -> Any:
    """The options the public way would merge in: the strategy's, which adopting a script's own may have
    replaced."""
    # patch: stopping.strategy_launchers
    return getattr(strategy.extended, "_communication_options", None)
