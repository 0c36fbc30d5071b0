"""Adopt a script that distributes itself, as the user guides teach, instead of breaking it.

A guide's MWM script builds its own `MultiWorkerMirroredStrategy(cluster_resolver=SlurmClusterResolver(...),
communication_options=...)` and a guide's Horovod script wraps its own optimizer. Under distrain, which already
built the strategy for the Plan's cluster (and made it the default), that fails: "Mixing different
tf.distribute.Strategy objects", or a second gRPC server that waits forever, or TensorFlow's resolver on string-
sorted hosts and shared ports (see slurm.py), or a Horovod optimizer wrapped twice (RecursionError).

- `adopt_strategies`: calling `tf.distribute.MultiWorkerMirroredStrategy(...)`, `MirroredStrategy(...)` or
  `OneDeviceStrategy(...)` (TensorFlow's save-and-load tutorial) returns distrain's strategy where there is one
  (the classes stay classes: `isinstance` still works); the script's `CommunicationOptions` are applied where the
  hardware allows (NCCL needs GPUs); `SlurmClusterResolver(...)` and `TFConfigClusterResolver(...)` return a
  resolver that answers with the Plan's cluster, rank and GPUs. One log line says what was adopted and what was
  ignored.
- `is_horovod_optimizer` / `has_horovod_callback`: the script's own Horovod wrapping, recognised so that distrain
  does not add it again.
- `local_reads`: under MWM a save runs collectives, so a chief-only save (`if task_id == 0: model.save(...)`, the
  guides' rule) waits for workers that never join: it reads ON_READ variables (metrics, tf_keras BatchNormalization
  statistics) with an all-reduce, and Keras 3's saving builds a throwaway `Optimizer(1.0)`
  (saving_lib.get_attr_skipset) whose variables MWM initialises with a broadcast. During distrain's saves those
  variables are read locally and new variables are created plainly; every worker's copy is made equal at each
  epoch end and at the end of training first (sync.py), so the local value is the global one.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from ..errors import EnvironmentProblem
from ..log import get as log
from ..plan import Plan
from . import horovod_own_updates, horovod_sync_batchnorm, script_devices

_STRATEGIES = (("distribute", "MultiWorkerMirroredStrategy"), ("distribute", "MirroredStrategy"),
               ("distribute.experimental", "MultiWorkerMirroredStrategy"), ("distribute", "OneDeviceStrategy"))
_RESOLVERS = ("SlurmClusterResolver", "TFConfigClusterResolver")


def _adopting(original: type, make: Any) -> type:
    """A stand-in for `original` whose call returns make(...), and which `isinstance`/`issubclass` treat as
    `original`. Not a subclass of it: an ABC walks its subclasses in issubclass, and would recurse into ours."""

    class Adopting(type):
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            return make(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, original)

        def __getattr__(cls, name: str) -> Any:  # class attributes and static methods of the original
            return getattr(original, name)

    return Adopting(original.__name__, (), {"__module__": original.__module__, "__doc__": original.__doc__,
                                            "_distrain_adopts": original})


def _module(tf: Any, dotted: str) -> Any:
    module = tf
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _describe(args: tuple, kwargs: dict) -> str:
    shown = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()]
    return ", ".join(shown)


def refuse_reconfiguring(plan: Plan, tf: Any) -> None:
    """Where distrain started TensorFlow before the script (every mode with ranks or a strategy): the script's
    logical device configuration is skipped (script_devices.py) and its ParameterServerStrategy refused."""
    script_devices.install(plan.mode)
    _refuse_parameter_servers(plan, tf)


def zero_code_horovod_updates(plan: Plan, size: int) -> None:
    """Zero-code Horovod: every optimizer the script applies averages its gradients over the ranks, and its
    synchronized BatchNormalization reads the ranks' moments (horovod_own_updates, horovod_sync_batchnorm)."""
    if size > 1 and not plan.script_uses_horovod:
        horovod_own_updates.install(plan.family.optimizer_updates, size, is_horovod_optimizer)
        horovod_sync_batchnorm.install(plan.family.synchronized_moments)


def adopt_resolvers(plan: Plan, tf: Any) -> None:
    """The script's `SlurmClusterResolver(...)`/`TFConfigClusterResolver(...)` answer with the Plan's cluster; in
    one process they describe one local worker (outside Slurm TensorFlow's raises)."""
    resolvers = tf.distribute.cluster_resolver
    # patch: adopt.resolvers
    for name in _RESOLVERS:
        original = getattr(resolvers, name, None)
        if original is None or hasattr(original, "_distrain_adopts"):
            continue
        setattr(resolvers, name, _adopting(original, lambda *a, _n=name, **k: _plan_resolver(plan, tf, _n, k)))


def adopt_strategies(engine: Any, plan: Plan, tf: Any) -> None:
    """The script's own strategy constructors return distrain's strategy (MWM and mirrored modes), the script's
    CommunicationOptions applied where the hardware allows."""

    def adopt(name: str, args: tuple, kwargs: dict) -> Any:
        ignored = [f"{k}" for k in kwargs if k not in ("communication_options", "cluster_resolver")] + (
            ["positional arguments"] if args else [])
        resolver = kwargs.get("cluster_resolver")
        if resolver is not None and not getattr(resolver, "_distrain_plan", False):
            ignored.append(f"cluster_resolver ({type(resolver).__name__})")
        applied = _apply_options(engine.strategy, kwargs.get("communication_options"), plan, tf)
        if plan.is_chief:
            where = " ".join(plan.cluster) if plan.cluster else ",".join(plan.devices) or "CPU"
            log().info(f"adopted the script's {name}({_describe(args, kwargs)}): distrain's "
                       f"{type(engine.strategy).__name__} on {where}" + (f"; {applied}" if applied else "")
                       + (f"; ignored: {', '.join(ignored)}" if ignored else ""))
        return engine.strategy

    # patch: adopt.strategies
    for dotted, name in _STRATEGIES:
        module = _module(tf, dotted)
        original = getattr(module, name, None)
        if original is None or hasattr(original, "_distrain_adopts"):
            continue
        setattr(module, name, _adopting(original, lambda *a, _n=name, **k: adopt(_n, a, k)))


def _refuse_parameter_servers(plan: Plan, tf: Any) -> None:
    """A `ParameterServerStrategy` is a cluster of its own (a coordinator, workers, parameter servers: TensorFlow's
    tutorial starts them in its one process): under distrain's ranks each would run it whole, the work done once per
    rank. Refused where it is built, with one line; in one process (`distrain run`) it runs as under plain python."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise EnvironmentProblem(
            f"the script builds its own ParameterServerStrategy, a cluster of its own that distrain's {plan.mode} "
            f"cannot run as its ranks; run it in one process (DISTRAIN_MODE=single) or as TensorFlow's parameter "
            f"server guide launches it")

    # patch: adopt.parameter_servers
    for namespace in (tf.distribute, tf.distribute.experimental):
        original = getattr(namespace, "ParameterServerStrategy", None)
        if original is not None and not hasattr(original, "_distrain_adopts"):
            namespace.ParameterServerStrategy = _adopting(original, refuse)


def adopt_mirrored_under_horovod(plan: Plan, tf: Any) -> None:
    """Under Horovod each rank is one replica and Horovod's ranks share each global batch: a script's own
    `MirroredStrategy(...)` (over the logical devices it made, or all GPUs) is the default strategy there, so that
    its replicas are the ranks, as distrain's MWM adopts it. Its `OneDeviceStrategy` and MWM are left as written."""
    original = tf.distribute.MirroredStrategy
    if hasattr(original, "_distrain_adopts"):
        return

    def default(*args: Any, **kwargs: Any) -> Any:
        if plan.is_chief:
            log().info(f"adopted the script's MirroredStrategy({_describe(args, kwargs)}): Horovod's ranks are its "
                       f"replicas (one device each)")
        return tf.distribute.get_strategy()

    # patch: adopt.strategies
    tf.distribute.MirroredStrategy = _adopting(original, default)


def _plan_resolver(plan: Plan, tf: Any, name: str, kwargs: dict) -> Any:
    """A resolver that answers with the Plan's values (TensorFlow's SlurmClusterResolver sorts hosts as strings,
    shares ports between nodes and runs nvidia-smi; see slurm.py)."""
    cluster = {"worker": list(plan.cluster)} if plan.cluster else {}  # {}: one local worker
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="worker", task_id=plan.rank,
        num_accelerators={"GPU": len(plan.devices)}, rpc_layer="grpc")
    # patch: adopt.resolvers
    resolver._distrain_plan = True
    if plan.is_chief:
        ignored = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        log().info(f"adopted the script's {name}: it answers with distrain's cluster and ranks"
                   + (f"; ignored: {ignored}" if ignored else ""))
    return resolver


def _apply_options(strategy: Any, options: Any, plan: Plan, tf: Any) -> str:
    """Honour the script's CommunicationOptions on distrain's strategy where this machine allows it."""
    if options is None:
        return ""
    implementation = options.implementation
    nccl = tf.distribute.experimental.CommunicationImplementation.NCCL
    if implementation == nccl and not plan.devices:
        options = options.merge(tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.AUTO))
        note = "NCCL requested but no GPU here: AUTO (ring), as TensorFlow falls back"
    else:
        note = f"communication: {implementation.name}"
    extended = strategy.extended
    # patch: adopt.communication_options
    if not hasattr(extended, "_communication_options"):
        return f"communication options not applied ({type(strategy).__name__} takes none)"
    extended._communication_options = options
    for attribute in ("_cross_device_ops", "_host_cross_device_ops"):
        ops = getattr(extended, attribute, None)
        if ops is not None and hasattr(ops, "_options"):
            ops._options = options
    return note


def is_horovod_optimizer(optimizer: Any) -> bool:
    """hvd.DistributedOptimizer's product: a subclass made on the fly whose methods come from horovod._keras."""
    return any((getattr(member, "__module__", None) or "").startswith("horovod")  # Keras 3 has some set to None
               for member in vars(type(optimizer)).values() if callable(member))


def loads_without_horovod(optimizer: Any) -> None:
    """hvd.DistributedOptimizer's class is made in module horovod._keras: a model saved with it does not load
    without Horovod ("Could not locate class 'Adam'"), in whatever mode it was trained. Saved under its base
    class's module, it loads anywhere as the script's own optimizer."""
    # patch: horovod.distributed_optimizer
    type(optimizer).__module__ = type(optimizer).__mro__[1].__module__


def has_horovod_callback(callbacks: list, name: str) -> bool:
    return any(type(c).__name__ == name and type(c).__module__.startswith("horovod") for c in callbacks)


@contextlib.contextmanager
def plain_variables(tf: Any) -> Iterator[None]:
    """Within: new variables are plain ResourceVariables of this process, the strategy's creator (and under MWM
    its initial-value broadcast, a collective every worker must join) skipped."""
    from tensorflow.python.ops import resource_variable_ops

    # patch: adopt.local_reads
    accepted = set(inspect.signature(resource_variable_ops.ResourceVariable.__init__).parameters) - {"self"}

    def plain(next_creator: Any, **kwargs: Any) -> Any:  # noqa: ARG001 - the strategy's creator is skipped
        return resource_variable_ops.ResourceVariable(**{k: v for k, v in kwargs.items() if k in accepted})

    with tf.variable_creator_scope(plain):
        yield


@contextlib.contextmanager
def local_reads(tf: Any) -> Iterator[None]:
    """Within: ON_READ (SyncOnRead) variables read their local value in cross-replica context, no collective;
    new variables are plain (`plain_variables`)."""
    from tensorflow.python.distribute import values

    # patch: adopt.local_reads
    original = getattr(values.SyncOnReadVariable, "_get_cross_replica", None)
    if original is None:
        yield
        return

    def local(self: Any) -> Any:
        return tf.identity(self._get_on_device_or_primary())

    values.SyncOnReadVariable._get_cross_replica = local
    try:
        with plain_variables(tf):
            yield
    finally:
        values.SyncOnReadVariable._get_cross_replica = original
