"""Horovod: init, check the ranks against the Plan, pin the GPU by hvd.local_rank(); its mode's engine."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from ..compat import adopt
from ..errors import ConfigError, EnvironmentProblem
from ..plan import Plan
from .base import Engine

MISSING = (
    "Horovod is not installed here but DISTRAIN_MODE=horovod: use the distrain image, build it into this "
    "environment with scripts/build-horovod.sh, or use DISTRAIN_MODE=mwm"
)


def check_installed() -> None:
    """Fail before the TensorFlow import when Horovod cannot be there."""
    if importlib.util.find_spec("horovod") is None:
        raise EnvironmentProblem(MISSING)


def init(plan: Plan, tf):  # noqa: ANN001, ANN201 - tensorflow module in, horovod module out
    """hvd.init() and pin one GPU per process. The Keras alias (setup) must be in place first."""
    try:  # Horovod's Keras API drives tf_keras only; Keras 3 goes through horovod.tensorflow (compat.keras3_horovod)
        hvd = importlib.import_module("horovod.tensorflow.keras" if plan.family.horovod_keras_api
                                      else "horovod.tensorflow")
    except ImportError as exc:  # installed but broken (built against another TensorFlow, MPI missing)
        raise EnvironmentProblem(f"Horovod does not load ({exc}); rebuild it with scripts/build-horovod.sh") from None
    hvd.init()
    if (hvd.rank(), hvd.size()) != (plan.rank, plan.size):
        raise ConfigError(
            f"Horovod reports rank {hvd.rank()} of {hvd.size()} but the launcher's variables said "
            f"{plan.rank} of {plan.size}: launch with one launcher (srun --mpi=pmix, mpirun or horovodrun)"
        )
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        # Horovod's documented pinning: by hvd.local_rank(); a CUDA_VISIBLE_DEVICES narrowed to one GPU per task
        # (srun --gpus-per-task=1) leaves exactly one, which is then the one to use.
        gpu = gpus[0] if len(gpus) == 1 else gpus[hvd.local_rank()]
        tf.config.set_visible_devices(gpu, "GPU")
    return hvd


def liveness_addresses(hvd) -> tuple[str, ...]:  # noqa: ANN001 - the horovod module
    """Open a listening port on every rank and share the addresses, so a survivor can tell which rank died.

    Horovod's errors for a lost peer (Gloo: "Connection closed by peer [ip]:port", MPI: aborted) do not say
    which rank it was. The socket is never accepted from or read: the kernel completes a connection to it while
    the process lives and refuses one after it died. (One port per rank: see README, Security.)
    """
    import socket

    from horovod.tensorflow import allgather_object

    if hvd.size() < 2:
        return ()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("", 0))
    listener.listen(64)
    _KEEP.append(listener)
    mine = f"{socket.gethostname()}:{listener.getsockname()[1]}"
    return tuple(allgather_object(mine, name="distrain_liveness"))


_KEEP: list = []  # the listening sockets live as long as the process


class HorovodEngine(Engine):
    """Horovod's ranks, one replica each. Zero-code: the optimizer's gradients averaged over the ranks, rank 0's
    variables broadcast and the metrics averaged by Horovod's callbacks, each rank given its share of every
    global batch (fit/batches.py), metric states summed over the ranks before they are read where their data
    differ. A script written for Horovod (its own DistributedOptimizer or callbacks) chose its per-rank batches
    itself and is left alone."""

    @classmethod
    def check_installed(cls) -> None:
        check_installed()

    @classmethod
    def create(cls, plan: Plan, tf: Any, before_distributing: Callable[[Any, int], Any] | None = None) -> Engine:
        hvd = init(plan, tf)
        # elastic: Horovod's driver handles a lost worker, and the ranks change after each reset
        return cls(plan, hvd=hvd, peers=() if plan.elastic else liveness_addresses(hvd))

    @property
    def rank(self) -> int:
        return int(self.hvd.rank())

    @property
    def size(self) -> int:
        return int(self.hvd.size())

    @property
    def local_rank(self) -> int:
        return int(self.hvd.local_rank())

    @property
    def replicas(self) -> int:
        return self.size

    def differ_between_ranks(self, values: list[int]) -> list[bool]:
        if self.size < 2:
            return [False] * len(values)
        from horovod.tensorflow import allgather_object

        gathered = allgather_object(list(values), name="distrain_compare")
        return [len({ranks_values[i] for ranks_values in gathered}) > 1 for i in range(len(values))]

    def sum_over_ranks(self) -> Callable[[list[float]], list[float]]:
        if self.size == 1:
            return lambda values: values
        tf, hvd = self.tf, self.hvd

        def horovod_sum(values: list[float]) -> list[float]:
            total = hvd.allreduce(tf.constant(values, tf.float32), op=hvd.Sum, name="distrain_stop_check")
            return [float(v) for v in total.numpy()]

        return horovod_sum

    def averager(self) -> Callable[[list], None] | None:
        import horovod.tensorflow as hvd  # its Keras module (tf_keras runs) has no grouped_allreduce

        tf = self.tf

        def average_over_horovod(variables: list) -> None:
            values = hvd.grouped_allreduce([tf.identity(v) for v in variables], op=hvd.Average, name="distrain_state")
            for variable, value in zip(variables, values):
                variable.assign(value)

        return average_over_horovod

    def adapt_optimizer(self, keras: Any, arguments: dict) -> None:
        if adopt.is_horovod_optimizer(arguments.get("optimizer")):  # the script's own (or an earlier compile's)
            super().adapt_optimizer(keras, arguments)
            return
        arguments["optimizer"] = self._averaging(keras.optimizers.get(arguments.get("optimizer", "rmsprop")))

    def _averaging(self, optimizer: Any) -> Any:
        """The optimizer with its gradients averaged across the ranks, once however often compile is called."""
        if getattr(optimizer, "_distrain_wrapped", False):
            return optimizer
        if not self.plan.family.horovod_keras_api:
            from ..compat import keras3_horovod

            return keras3_horovod.wrap_optimizer(optimizer, self.hvd)
        optimizer = self.hvd.DistributedOptimizer(optimizer)
        adopt.loads_without_horovod(optimizer)
        # patch: horovod.distributed_optimizer
        optimizer._distrain_wrapped = True
        return optimizer

    def why_xla_cannot_compile_the_collectives(self, gpus: bool) -> str | None:
        return "Horovod's all-reduce has no XLA kernels"

    def fit_callbacks(self, keras: Any, user: list) -> list:
        """Rank 0's variables broadcast before the first step, metrics averaged per epoch."""
        if not self.plan.family.horovod_keras_api:
            from ..compat import keras3_horovod

            return keras3_horovod.callbacks(keras, self.hvd)
        return [make() for name, make in (
            ("BroadcastGlobalVariablesCallback", lambda: self.hvd.callbacks.BroadcastGlobalVariablesCallback(0)),
            ("MetricAverageCallback", self.hvd.callbacks.MetricAverageCallback),
        ) if not adopt.has_horovod_callback(user, name)]

    def splits_batches(self, model: Any, user: list) -> bool:
        if self.size < 2:
            return False
        optimizer = getattr(model, "optimizer", None)
        own_optimizer = adopt.is_horovod_optimizer(optimizer) and not getattr(optimizer, "_distrain_wrapped", False)
        return not (own_optimizer or any(type(c).__module__.startswith("horovod") for c in user))

    def positions_input(self, model: Any, user: list) -> bool:
        return self.size < 2 or self.splits_batches(model, user)  # else each rank reads its own, as it chose

    def input_share(self, own_split: bool) -> tuple[int, int]:
        return (0, 1) if own_split else (self.rank, self.size)

    def metric_read_markers(self, keras: Any, differs: tuple[bool, bool]) -> list:
        if not any(differs):
            return []
        from ..compat import horovod_metric_states

        horovod_metric_states.install(self.tf, self.plan.family.metric_logs_read)
        return [horovod_metric_states.reads_over_ranks(keras, *differs)]

    def adopt_the_scripts_distribution(self) -> None:
        """The script's MirroredStrategy is the default one (its replicas are the ranks); every optimizer it
        applies averages over the ranks (compat/adopt.py)."""
        adopt.refuse_reconfiguring(self.plan, self.tf)
        adopt.adopt_mirrored_under_horovod(self.plan, self.tf)
        adopt.zero_code_horovod_updates(self.plan, self.size)

    def install_script_fixes(self) -> None:
        """Keras 3 variables for Horovod's TensorFlow API (the base's); a custom loop's moving statistics averaged."""
        super().install_script_fixes()
        if self.size > 1 and self.plan.script_uses_horovod_tf:
            import horovod.tensorflow as hvd_tf

            from ..compat import horovod_loop_statistics

            horovod_loop_statistics.install(hvd_tf, self.tf)

    def uses_horovods_tensorflow_api(self) -> bool:
        return True  # zero-code Horovod drives Keras 3 through it (compat/keras3_horovod.py)

    def broadcast_callbacks(self, callbacks: list) -> tuple:
        return tuple(c for c in callbacks if hasattr(c, "register_local_var"))

    def batch_fit_receives(self, global_batch: int) -> int:
        return global_batch // self.size

    def shard(self, dataset: Any) -> Any:
        return dataset.shard(self.size, self.rank) if self.size > 1 else dataset

    def distributed_tape(self, tape: Any) -> Any:
        import horovod.tensorflow as hvd_tf

        from ..compat import horovod_own_updates
        from ..compat.keras3_horovod import TapeOverTFVariables

        horovod_own_updates.the_scripts_tapes_average()
        return TapeOverTFVariables(hvd_tf.DistributedGradientTape(tape))

    def broadcast_variables(self, variables: Any) -> None:
        import horovod.tensorflow as hvd_tf

        from ..compat.keras3_horovod import broadcastable

        hvd_tf.broadcast_variables(broadcastable(variables), root_rank=0)
