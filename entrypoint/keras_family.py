"""The two Keras families distrain drives, Keras 3 (`keras`) and tf_keras (legacy Keras 2): which one a script
gets (`choose`, for the Plan: the one plain `python train.py` would get here), and what differs between them,
declared once (`KerasFamily`); every other module reads `plan.family` for what it needs, never the family's name.

Each field names a difference the code acts on, and where: keeping them here means a third family (or a Keras 3
that behaves like tf_keras in one respect) is one new row, not a search through the package.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError
from .settings import flag


@dataclass(frozen=True)
class KerasFamily:
    name: str  # the Plan's value: keras3 | legacy
    module: str  # the package its scripts import (and its patches' targets are in: compat/registry.py)
    # runtime.setup: `import keras` must be made to mean the loaded tf_keras (compat/tf_keras_alias.py)
    aliased_as_keras: bool
    # runtime.setup: compat/keras3_mwm.py's fixes for fit under a strategy with several replicas
    needs_strategy_fit_fixes: bool
    # Horovod's Keras API (horovod.tensorflow.keras: DistributedOptimizer, its callbacks) drives this family; the
    # other goes through horovod.tensorflow (compat/keras3_horovod.py, horovod#4290)
    horovod_keras_api: bool
    # fit/checkpoint.py: the family's own BackupAndRestore is subclassed (tf_keras), or distrain's own callback
    # (Keras 3's cannot resume mid-epoch under a strategy)
    subclasses_backup_and_restore: bool
    # fit/resume.py: a resumed fit starts mid-epoch by passing over the epoch iterator's first steps (Keras 3), or
    # by answering tf_keras' own question for its first epoch and step
    starts_by_skipping_steps: bool
    # fit/unknown_length.py: the data handler keeps an epoch's length from the first epoch on (tf_keras), where
    # Keras 3's epoch iterator reads until the data ends in every epoch
    keeps_the_first_epochs_length: bool
    # fit/stages.py: a finished fit's weights, as `save_weights` names them (Keras 3 needs .weights.h5; tf_keras
    # writes a TensorFlow checkpoint)
    end_weights: str
    # runner.py's compile: under MWM the steps' synchronised logs are summed again over the workers unless the
    # model's reduction is "first" (compat/tf_keras_mwm.py)
    sums_step_logs_over_workers: bool
    # runner.py's compile: under a strategy, a script's own train_step sums its replicas' gradients of a loss tf_keras
    # did not scale (compat/tf_keras_mwm.py's one_process_custom_steps)
    sums_own_steps_gradients: bool
    # runner.py's compile: jit_compile="auto" (the default) turns XLA on wherever there is a GPU and no tf.distribute
    # strategy: Horovod's case (Keras 3; tf_keras has no "auto")
    auto_jit_compiles_without_a_strategy: bool
    # compat/numpy_orders.py: fit's numpy pipeline draws its epochs' orders in one iterator (tf_keras: epoch k of a
    # fit trains the (k+1)th draw), or a new iterator every epoch (Keras 3: a seeded script's every epoch the first)
    draws_numpy_orders_in_one_iterator: bool
    # compat/epoch_iterators.py: fit's epochs come from a DataHandler (tf_keras) or an EpochIterator (Keras 3)
    epochs_come_from_a_data_handler: bool
    # compat/horovod_own_updates.py: where its optimizers apply gradients (`module:Class.method`, those that exist)
    optimizer_updates: tuple[str, ...]
    # compat/horovod_metric_states.py: where fit and evaluate read an epoch's logs from the metric states, once its
    # steps are done (`module:Class.method`; `a|b`: where one Keras or another has it)
    metric_logs_read: str
    # compat/horovod_sync_batchnorm.py: where `BatchNormalization(synchronized=True)` sums its moments over the
    # replicas (`module:function` or `module:Class.method`; `a|b`: where one Keras or another has it)
    synchronized_moments: str
    # compat/downloads.py: the download every keras.datasets loader calls (`module:function`), taking turns per cache
    get_file: str


KERAS3 = KerasFamily("keras3", "keras", aliased_as_keras=False, needs_strategy_fit_fixes=True,
                     horovod_keras_api=False, subclasses_backup_and_restore=False, starts_by_skipping_steps=True,
                     keeps_the_first_epochs_length=False, end_weights="end.weights.h5",
                     sums_step_logs_over_workers=False, sums_own_steps_gradients=False,
                     auto_jit_compiles_without_a_strategy=True, draws_numpy_orders_in_one_iterator=False,
                     epochs_come_from_a_data_handler=False,
                     optimizer_updates=("keras.src.optimizers.base_optimizer:BaseOptimizer.apply",),
                     metric_logs_read="keras.src.trainers.trainer:Trainer._get_metrics_result_or_logs"
                                      "|keras.src.trainers.trainer:BaseTrainer._get_metrics_result_or_logs",
                     synchronized_moments="keras.src.backend.tensorflow.nn:_compute_moments_sync"
                                          "|keras.src.backend.tensorflow.ops.nn:_compute_moments_sync",
                     get_file="keras.src.utils.file_utils:get_file")
TF_KERAS = KerasFamily("legacy", "tf_keras", aliased_as_keras=True, needs_strategy_fit_fixes=False,
                       horovod_keras_api=True, subclasses_backup_and_restore=True, starts_by_skipping_steps=False,
                       keeps_the_first_epochs_length=True, end_weights="end", sums_step_logs_over_workers=True,
                       sums_own_steps_gradients=True, auto_jit_compiles_without_a_strategy=False,
                       draws_numpy_orders_in_one_iterator=True, epochs_come_from_a_data_handler=True,
                       optimizer_updates=("tf_keras.src.optimizers.optimizer:Optimizer.apply_gradients",
                                          "tf_keras.src.optimizers.legacy.optimizer_v2:OptimizerV2.apply_gradients"),
                       metric_logs_read="tf_keras.src.engine.training:Model._validate_and_get_metrics_result",
                       synchronized_moments="tf_keras.src.layers.normalization.batch_normalization"
                                            ":BatchNormalizationBase._sync_calculate_mean_and_var",
                       get_file="tf_keras.src.utils.data_utils:get_file")
FAMILIES = {family.name: family for family in (KERAS3, TF_KERAS)}


# the distributions the Keras decision depends on, by normalised name (PEP 503), and the package each one is: a
# pre-release of TensorFlow requires `keras-nightly`, which installs the package `keras` too
_VERSIONED = {"tensorflow": "tensorflow", "tensorflow_cpu": "tensorflow", "tf_nightly": "tensorflow",
              "tf_nightly_cpu": "tensorflow", "keras": "keras", "keras_nightly": "keras", "tf_keras": "tf_keras",
              "tf_keras_nightly": "tf_keras"}
# where a Keras package says its own version, for one installed without the metadata expected
_VERSION_FILES = {"keras": ("keras/src/version.py", "keras/version.py"), "tf_keras": ("tf_keras/__init__.py",)}
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def installed_versions(paths: list[str] | None = None) -> dict[str, str]:
    """Versions of the packages the Keras decision depends on, without importing them: from the names of their
    `NAME-VERSION.dist-info` directories on sys.path (the wheel format puts both there), the first on the path
    winning, as for imports. What importlib.metadata reads, without its import (20 ms of CPU in every worker)."""
    found: dict[str, str] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            dist, _, version = stem.partition("-")
            package = _VERSIONED.get(re.sub(r"[-_.]+", "_", dist).lower())
            if dot and kind in ("dist-info", "egg-info") and package and version and package not in found:
                found[package] = version.split("-")[0]
        for package, files in _VERSION_FILES.items():
            version = next(filter(None, (_version_in(entry, f) for f in files)), None) \
                if package not in found and package in names else None
            if version:
                found[package] = version
    return found


def _version_in(entry: str, relative: str) -> str | None:
    try:
        with open(os.path.join(entry or ".", relative)) as handle:
            match = _VERSION_LINE.search(handle.read(4096))
    except OSError:
        return None
    return match.group(1) if match else None


def _major_minor(version: str | None) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# A script asks for tf_keras by importing it, or by setting TF_USE_LEGACY_KERAS itself before importing TensorFlow
# (os.environ["TF_USE_LEGACY_KERAS"] = "1", os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")).
_SETS_TF_USE_LEGACY_KERAS = re.compile(r"TF_USE_LEGACY_KERAS['\"]\s*(\]\s*=|,)\s*['\"](1|true|True)['\"]")


def imported_modules(source: str) -> frozenset[str]:
    """Every module the script imports anywhere (`import a, b.c`, `from a import b` gives a and a.b), read from its
    syntax, so `import numpy as np, tf_keras as keras` and imports inside functions count; none if it does not
    parse (it then fails as under plain python)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def _imports(modules: frozenset[str], package: str) -> bool:
    return any(name == package or name.startswith(package + ".") for name in modules)


def _fallback_order(source: str) -> tuple[str, str] | None:
    """(tried, fallback) where the script imports one Keras in a `try` and the other in its `except ImportError`
    (`try: import tf_keras as keras` / `except ImportError: import keras`): plain python gets the first installed."""
    import ast

    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Try):
            continue
        tried = imported_modules(ast.unparse(node.body))
        fallen = imported_modules("\n".join(ast.unparse(handler.body) for handler in node.handlers))
        for first, second in (("tf_keras", "keras"), ("keras", "tf_keras")):
            if _imports(tried, first) and _imports(fallen, second):
                return first, second
    return None


def _tf_keras_first(source: str, versions: Mapping[str, str]) -> bool:
    """A script that imports both Keras gets tf_keras from plain python where it tries tf_keras first and tf_keras
    is installed; it gets keras where it tries keras first (it is installed with TensorFlow). Otherwise which one
    trains is decided as it runs (an `if` on its arguments), after distrain must have chosen: the user says."""
    order = _fallback_order(source)
    if order is None:
        raise ConfigError("the script imports both keras (Keras 3) and tf_keras: say which one it trains with, "
                          "DISTRAIN_KERAS=keras3 or DISTRAIN_KERAS=legacy (tf_keras)")
    return order[0] == "tf_keras" and "tf_keras" in versions


def horovod_use(source: str) -> dict[str, bool]:
    """The Plan's fields on the script's own Horovod: `script_uses_horovod` (any part of it: its Keras API, its
    TensorFlow API; it averages what it means to) and `script_uses_horovod_tf` (`import horovod.tensorflow`, `from
    horovod.tensorflow import ...`, `from horovod import tensorflow`: then, with Keras 3, compat/keras3_horovod
    adapts it, whatever the mode; a Horovod script also runs as one process)."""
    modules = imported_modules(source)
    return {"script_uses_horovod": _imports(modules, "horovod"),
            "script_uses_horovod_tf": "horovod.tensorflow" in modules}


def choose(env: Mapping[str, str], source: str, versions: Mapping[str, str]) -> tuple[str, str]:
    """("keras3" | "legacy", why): the Keras that `python train.py` would get here, unless DISTRAIN_KERAS says."""
    requested = (env.get("DISTRAIN_KERAS") or "auto").strip().lower()
    if requested not in ("auto", "legacy", "keras3"):
        raise ConfigError(f"unknown DISTRAIN_KERAS={requested!r}: use auto, legacy (tf_keras) or keras3")
    if requested != "auto":
        return requested, f"DISTRAIN_KERAS={requested}"
    if flag(env, "TF_USE_LEGACY_KERAS"):
        return "legacy", "TF_USE_LEGACY_KERAS=1 is set: tf.keras is tf_keras"
    modules = imported_modules(source)
    both = _imports(modules, "tf_keras") and _imports(modules, "keras")
    if both and _tf_keras_first(source, versions):
        return "legacy", "the script imports tf_keras where it is installed (else keras)"
    if (not both and _imports(modules, "tf_keras")) or _SETS_TF_USE_LEGACY_KERAS.search(source):
        return "legacy", "the script imports tf_keras or sets TF_USE_LEGACY_KERAS"
    # Horovod's Keras API (horovod.tensorflow.keras, horovod.keras) drives tf_keras only: with Keras 3 its callbacks
    # fail and its DistributedOptimizer silently averages nothing (horovod#4290)
    if _imports(modules, "horovod.keras") or _imports(modules, "horovod.tensorflow.keras"):
        return "legacy", "the script uses Horovod's Keras API, which drives tf_keras only (horovod#4290)"
    # Horovod's TensorFlow API with tf.keras models, as Horovod's TF2 examples and docs write it
    # (hvd.DistributedGradientTape, hvd.broadcast_variables(model.variables), opt.variables()): Keras 2 idioms, and
    # Keras 3 variables have no .ref() for Horovod. A script that imports Keras 3 itself (`import keras`) keeps it.
    if "horovod.tensorflow" in modules and not _imports(modules, "keras"):
        return "legacy", ("the script uses Horovod's TensorFlow API with tf.keras, written for Keras 2 "
                          "(opt.variables(), variables with .ref())")
    tf = versions.get("tensorflow")
    if tf and _major_minor(tf) < (2, 16):
        return "legacy", f"TensorFlow {tf} < 2.16: tf.keras is Keras 2"
    if _major_minor(versions.get("keras"))[0] < 3:
        return "legacy", "Keras 3 is not installed"
    return "keras3", f"Keras {versions['keras']}: what `python train.py` gets with TensorFlow {tf or '?'}"
