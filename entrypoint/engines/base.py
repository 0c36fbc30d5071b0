"""The engine of one process on TensorFlow's default strategy (single): the interface every mode's engine refines
(engines/__init__.py says what differs between them)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..compat import adopt
from ..plan import Plan


@dataclass
class Engine:
    """One process, TensorFlow's default strategy: nothing to split, average or agree on."""

    plan: Plan
    strategy: Any = None  # the tf.distribute strategy (None: TensorFlow's default)
    hvd: Any = None  # Horovod's module, where the mode is Horovod
    peers: tuple[str, ...] = ()  # host:port per rank that answers while that rank lives (plan.cluster for MWM)
    tf: Any = None  # the tensorflow module and the Keras setup chose (runtime.setup): what the hooks patch
    keras: Any = None

    @classmethod
    def check_installed(cls) -> None:
        """Before TensorFlow is imported: refuse a mode whose library is absent (one line)."""

    @classmethod
    def fix_libraries(cls, plan: Plan, tf: Any) -> None:
        """After TensorFlow is imported, before the engine is built: the mode's fixes of Keras (compat/)."""

    @classmethod
    def create(cls, plan: Plan, tf: Any, before_distributing: Callable[[Any, int], Any] | None = None) -> Engine:
        """The engine of `plan` (engines.build): single is TensorFlow's default strategy, zero overhead."""
        return cls(plan)

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def size(self) -> int:
        return self.plan.size

    @property
    def local_rank(self) -> int:
        return self.plan.local_rank

    @property
    def replicas(self) -> int:
        """How many replicas share each global batch."""
        return 1

    def differ_between_ranks(self, values: list[int]) -> list[bool]:
        """For each of this rank's `values` (ints below 2**20), whether some other rank holds another. Every rank
        calls it at the same point: one collective."""
        return [False] * len(values)

    def sum_over_ranks(self) -> Callable[[list[float]], list[float]]:
        """A function summing a short list of floats over all ranks (the agreed stop's collective)."""
        return lambda values: values

    def averager(self) -> Callable[[list], None] | None:
        """A function setting each of these variables to its mean over the ranks (all call it together); None
        where there is one rank."""
        return None

    def adapt_optimizer(self, keras: Any, arguments: dict) -> None:
        """compile's optimizer: the script's own hvd.DistributedOptimizer made to load without Horovod (every
        mode); the gradients' average over the ranks where the mode does not make it itself."""
        if adopt.is_horovod_optimizer(arguments.get("optimizer")):
            adopt.loads_without_horovod(arguments["optimizer"])

    def adapt_compiled(self, model: Any) -> None:
        """After compile: what the mode's replicas need of the compiled model (tf_keras under a strategy)."""

    def fit_callbacks(self, keras: Any, user: list) -> list:
        """The callbacks the mode adds to a fit, before the script's (none the script added itself)."""
        return []

    def splits_batches(self, model: Any, user: list) -> bool:
        """Whether distrain gives each rank its share of every global batch (a strategy splits its own)."""
        return False

    def positions_input(self, model: Any, user: list) -> bool:
        """Whether the ranks train one input that exact resume positions (not each rank its own)."""
        return True

    def input_share(self, own_split: bool) -> tuple[int, int]:
        """(rank, size) of this rank's share of each global batch the positioned input cuts; (0, 1): whole."""
        return 0, 1

    def steps_loop_meets_collectives(self) -> bool:
        """Whether compile's steps_per_execution loop runs the ranks' collectives inside it (MWM's workers)."""
        return False

    def why_xla_cannot_compile_the_collectives(self, gpus: bool) -> str | None:
        """Why XLA cannot compile a step around the ranks' all-reduce here; None where it can (or none is)."""
        return None

    def updates_merge_replicas(self) -> bool:
        """Whether the optimizer's update merges several replicas in one process's graph (a strategy's)."""
        return False

    def logs_are_the_replicas_mean(self) -> bool:
        """Whether a step's logs are the replicas' mean rather than the global batch's (Keras 3 under MWM)."""
        return False

    def metric_read_markers(self, keras: Any, differs: tuple[bool, bool]) -> list:
        """Callbacks first in a fit, telling which metric-log read is which where the states are summed over the
        ranks before they are read (compat/metric_reads.py, compat/horovod_metric_states.py)."""
        return []

    def adopt_the_scripts_distribution(self) -> None:
        """What the script builds to distribute itself made to run as under plain python (compat/adopt.py): in one
        process its Slurm or TF_CONFIG cluster resolver describes one local worker."""
        adopt.adopt_resolvers(self.plan, self.tf)

    def install_script_fixes(self) -> None:
        """The mode's fixes for what a script does itself (Horovod's TensorFlow API under Keras 3, its save
        options' devices), before it runs."""
        if self.uses_horovods_tensorflow_api() and not self.plan.family.horovod_keras_api:
            from ..compat import keras3_horovod

            keras3_horovod.hand_tf_variables_to_horovods_api(self.keras, self.plan.is_chief)

    def uses_horovods_tensorflow_api(self) -> bool:
        """Whether Horovod's TensorFlow API will be handed Keras' variables: where the script calls it itself."""
        return self.plan.script_uses_horovod_tf

    def strategy_in_use(self) -> Any:
        """The tf.distribute strategy the script's model is built under: TensorFlow's default one here."""
        return self.tf.distribute.get_strategy()

    def shards_input_itself(self) -> bool:
        """Whether the mode's strategy shards what fit reads between the workers itself (MWM's auto-sharding)."""
        return False

    def become_default(self) -> None:
        """At setup: the mode's strategy made TensorFlow's default, so that the script's model is built under it."""

    def step_aside(self) -> None:
        """Hooks off (DISTRAIN_HOOKS=0): the script runs as under python, TensorFlow's own default strategy."""

    def local_reads(self) -> contextlib.AbstractContextManager:
        """A context in which reading a variable is no collective (a save by the chief alone, a rank's own state):
        where a read is one (tf_keras' ON_READ variables under MWM), it reads this rank's copy."""
        return contextlib.nullcontext()

    def broadcast_callbacks(self, callbacks: list) -> tuple:
        """Those of a fit's callbacks that broadcast rank 0's variables after its first step (Horovod's)."""
        return ()

    def batch_fit_receives(self, global_batch: int) -> int:
        """The batch a fit fed by hand (distrain's benchmark) receives for `global_batch`: all of it where the
        strategy or nobody splits it."""
        return global_batch

    def shard(self, dataset: Any) -> Any:
        """This rank's share of a dataset the script distributes itself (a strategy shards what fit reads)."""
        return dataset

    def distributed_tape(self, tape: Any) -> Any:
        """A custom loop's tape whose gradients are the ranks' average (a strategy aggregates them itself)."""
        return tape

    def broadcast_variables(self, variables: Any) -> None:
        """Rank 0's values of `variables` on every rank (a strategy's variables are mirrored already)."""
