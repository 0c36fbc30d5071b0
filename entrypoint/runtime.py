"""setup(plan): apply the Plan to this process, once, and keep what it built for the public API.

Order matters: environment variables (visibility, legacy Keras, TF_CONFIG, proxies) must be in place before
TensorFlow is imported; the engine is built after.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import devices, log
from .engines import Engine, build, engine_class
from .errors import EnvironmentProblem
from .plan import Plan, detect


@dataclass
class _ThisProcess:
    """What setup applied and built, once a process: read through current_plan, setup and startup_phases only (the
    public API in __init__, and the benchmarks); everything inside a run is given the Engine instead."""
    plan: Plan | None = None
    engine: Engine | None = None  # its tf and keras too (Engine.tf, Engine.keras)
    phases: dict[str, float] = field(default_factory=dict)  # wall time each start-up phase ended


_THIS_PROCESS = _ThisProcess()


def current_plan(script: str | None = None) -> Plan:
    """The Plan of this process: the one setup applied, else detected now from os.environ."""
    if _THIS_PROCESS.plan is None:
        _THIS_PROCESS.plan = detect(os.environ, script=script)
    return _THIS_PROCESS.plan


def startup_phases() -> dict[str, float]:
    """The wall time each start-up phase ended (plan, tensorflow, strategy): the benchmarks' start-up suite."""
    return dict(_THIS_PROCESS.phases)


def apply_checks(plan: Plan) -> None:
    """Refusals that need no TensorFlow: no GPU where one is required, Horovod asked for but absent."""
    devices.check_required_before_import(plan)
    engine_class(plan).check_installed()


def apply_environment(plan: Plan) -> None:
    """Everything that has to happen before `import tensorflow` (the checks are setup's)."""
    early = {"CUDA_VISIBLE_DEVICES", "TF_USE_LEGACY_KERAS"} & {name for name, _ in plan.env_set}
    if "tensorflow" in sys.modules and early:
        log.get().warning("TensorFlow was imported before distrain's setup: GPU pinning and legacy Keras may not apply")
    for name in plan.env_unset:
        os.environ.pop(name, None)
    if plan.env_unset:
        log.get().info(f"unset {' '.join(plan.env_unset)} (gRPC would route MWM traffic through the proxy)")
    os.environ.update(dict(plan.env_set))
    if not plan.verbose:  # DISTRAIN_VERBOSE=1: TensorFlow's own INFO lines too
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def setup(plan: Plan | None = None, checked: bool = False,
          before_distributing: Callable[[Any, int], Any] | None = None) -> Engine:
    """Apply the Plan and build the engine (idempotent). `checked`: the caller ran apply_checks already (the
    commands do, before a run's state is touched); `before_distributing`: what the strategy does to a dataset
    first (engines.build; a run with its hooks on: fit/batches.before_distributing)."""
    if _THIS_PROCESS.engine is not None:
        return _THIS_PROCESS.engine
    _THIS_PROCESS.phases["plan"] = time.time()
    plan = plan or current_plan()
    _THIS_PROCESS.plan = plan
    log.configure(plan.line_prefix)
    if not checked:
        apply_checks(plan)
    apply_environment(plan)
    if plan.family.aliased_as_keras:
        from .compat.tf_keras_alias import alias_keras_to_tf_keras

        try:
            alias_keras_to_tf_keras()
        except ImportError:
            raise EnvironmentProblem(
                "legacy Keras (tf_keras) is not installed: `pip install --no-deps tf-keras==<your TF version>`, "
                "or DISTRAIN_KERAS=keras3 to run it on Keras 3"
            ) from None
    import tensorflow as tf

    _THIS_PROCESS.phases["tensorflow"] = time.time()
    from .compat import registry

    registry.verify(plan.keras, plan.mode)  # every patch this run makes finds what it knows, or one line here
    engine_class(plan).fix_libraries(plan, tf)
    devices.configure(plan, tf)
    engine = dataclasses.replace(build(plan, tf, before_distributing), tf=tf, keras=tf.keras)
    engine.become_default()
    _THIS_PROCESS.engine = engine
    _THIS_PROCESS.phases["strategy"] = time.time()  # MWM: the workers have all joined (the rendezvous is in build)
    for warning in plan.warnings:
        log.get().warning(warning)
    return engine
