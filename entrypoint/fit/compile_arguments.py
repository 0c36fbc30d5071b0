"""compile's arguments with several ranks, where upstream cannot do what the script asks: changed where the
numbers stay the same (said once), refused with one line where they cannot (exit 3, at compile(), before any
step). Each is proven against plain python by the conformance suite (tests/conformance)."""

from __future__ import annotations

from ..engines import Engine
from ..errors import EnvironmentProblem
from ..log import get as log


def adapt(engine: Engine, arguments: dict) -> None:
    """compile's bound arguments, adapted or refused for this engine."""
    _one_step_per_execution_where_the_loop_fails(engine, arguments)
    _xla_where_it_works(engine, arguments)
    _no_accumulation_under_a_strategy(engine, arguments)


def _say(engine: Engine, line: str) -> None:
    if engine.plan.is_chief:
        log().info(line)


def _one_step_per_execution_where_the_loop_fails(engine: Engine, arguments: dict) -> None:
    """compile's steps_per_execution as 1 under MWM where Keras' multi-step loop fails with its collectives
    (compat/keras3_mwm.py, fix 10): the same numbers, one step a call."""
    steps = arguments.get("steps_per_execution", 1)
    plan = engine.plan
    if not (isinstance(steps, int) and steps > 1 and engine.steps_loop_meets_collectives()) \
            or plan.family.horovod_keras_api:
        return
    from ..compat import keras3_mwm

    if keras3_mwm.multi_step_loop_fails():
        arguments["steps_per_execution"] = 1
        _say(engine, f"steps_per_execution={steps} runs one step at a time: this Keras' multi-step loop fails under "
                     "MWM (keras3_mwm, fix 10); the numbers are the same")


def _xla_where_it_works(engine: Engine, arguments: dict) -> None:
    """compile's jit_compile with several ranks where XLA cannot compile the step around their all-reduce: under
    Horovod (its ops have no XLA kernels: InvalidArgumentError) and under MWM on CPUs (TensorFlow's XLA has no CPU
    collectives, b/194942685: UnimplementedError), True is refused with one line; Keras 3's "auto", which turns
    XLA on wherever there is a GPU and no tf.distribute strategy (Horovod's case), is False under Horovod, said
    once. MWM with XLA on GPUs is left to run (`distrain selftest` checks it on the hardware)."""
    plan, jit = engine.plan, arguments.get("jit_compile", "auto")
    gpus = bool(engine.tf.config.list_physical_devices("GPU"))
    why = engine.why_xla_cannot_compile_the_collectives(gpus)
    if engine.size < 2 or jit is False or jit is None or why is None:
        return
    if jit is True:
        raise EnvironmentProblem(f"compile(jit_compile=True) under {plan.mode} with {engine.size} ranks cannot work: "
                                 f"{why}; drop jit_compile (the numbers are the same without XLA)")
    if gpus and plan.family.auto_jit_compiles_without_a_strategy:
        arguments["jit_compile"] = False
        _say(engine, "jit_compile='auto' is off: Keras would compile the step with XLA around Horovod's all-reduce, "
                     "which has no XLA kernels")


def _no_accumulation_under_a_strategy(engine: Engine, arguments: dict) -> None:
    """An optimizer's gradient_accumulation_steps under MWM with several ranks: Keras updates the variables inside a
    tf.cond there, where a strategy's replicas cannot merge ("merge_call called while defining a new graph"; plain
    Keras 3.3 and 3.15 under a two-replica MirroredStrategy fail the same). Refused with one line; Horovod's ranks
    accumulate as one process does."""
    optimizer = arguments.get("optimizer")
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if engine.updates_merge_replicas() and steps:
        raise EnvironmentProblem(
            f"gradient_accumulation_steps={steps} under {engine.plan.mode} with {engine.replicas} replicas cannot "
            "work: Keras updates the variables inside a tf.cond, where a strategy's replicas cannot merge (plain "
            "Keras fails the same); drop it and raise the batch size, or run under Horovod")
