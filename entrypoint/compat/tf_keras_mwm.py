"""tf_keras under MultiWorkerMirroredStrategy: the values a train or test step returns are the global ones already
(its metrics' results are synchronised across the workers), and `reduce_per_replica`'s multi-worker branch sums
them once more over the workers when `distribute_reduction_method` is "auto", which tf_keras reads as "sum"
outside TPUs (keras-team/keras#16664, seen there in keras-team/keras#16922): `train_on_batch`, `test_on_batch` and
every batch log a callback reads say N x the loss (fit's History and `evaluate` read the metrics again, and are
right). A model whose steps are tf_keras' own gets "first", the value every worker holds; a model whose script set
a reduction, or wrote its own train_step or test_step, is left as it is.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from typing import Any

_SUMS_OVER_WORKERS = re.compile(
    r"""if _collective_all_reduce_multi_worker\(strategy\):(.|\n)*?strategy\.reduce\(\s*["']SUM["']""")
TRAINING_MODULE = "tf_keras.src.engine.training"


@functools.cache
def sums_synchronised_logs() -> bool:
    """Whether this tf_keras' reduce_per_replica has the multi-worker sum (read from its source)."""
    training = importlib.import_module(TRAINING_MODULE)
    return bool(_SUMS_OVER_WORKERS.search(inspect.getsource(training.reduce_per_replica)))


def first_replicas_logs(model: Any) -> None:
    """Set the model's reduction to "first" where it is tf_keras' "auto" and its steps are tf_keras' own (and this
    tf_keras still sums: fixed upstream, this does nothing)."""
    if not sums_synchronised_logs():
        return
    # patch: tf_keras_mwm.first_replica_logs
    base = importlib.import_module(TRAINING_MODULE).Model
    own_steps = all(getattr(type(model), step) is getattr(base, step) for step in ("train_step", "test_step"))
    if own_steps and model.distribute_reduction_method == "auto":
        model.distribute_reduction_method = "first"
