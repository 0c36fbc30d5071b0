"""Every `fit` of a script is a stage of its run: a rerun passes through the fits that had finished.

Fine-tuning, progressive resizing and curriculum scripts call `fit` more than once. Each fit has its own
checkpoints (runs.stage_dir); when one finishes, its end state is recorded in `<its dir>/finished/`: the weights
and optimizer state (written by the chief), the History it returned, and each rank's global random state
(Python's, NumPy's, TensorFlow's and Keras 3's global generators). A rerun's fit with such a record trains
nothing: it restores that state and returns the recorded History, so what the script does between fits sees what
it saw before, and the interrupted fit resumes exactly from its own checkpoint. A fit whose arguments differ from
the record's starts fresh, said in one line. When the script ends, the records go (a finished run's rerun trains
again, as before).

Not restored: random state inside the model (a Dropout layer's generator) and TensorFlow's op-level random
ops (`tf.random.uniform` after `tf.random.set_seed`), whose kernels keep a counter no API reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from typing import Any

from .. import runs, workdirs

FINISHED = "finished"  # <stage dir>/finished/: the end state of a fit that completed


def signature(arguments: dict) -> dict:
    """What must match for a recorded fit to stand for this one: its length and the shape of its input."""
    x = arguments.get("x")
    shape = list(getattr(x, "shape", ()) or ())
    length = int(x.cardinality()) if hasattr(x, "cardinality") else None
    return {"epochs": int(arguments.get("epochs") or 1), "initial_epoch": int(arguments.get("initial_epoch") or 0),
            "batch_size": arguments.get("batch_size"), "steps_per_epoch": arguments.get("steps_per_epoch"),
            "x": type(x).__name__, "shape": shape, "length": length}


def _directory(stage_dir: str) -> str:
    return os.path.join(stage_dir, FINISHED)


def recorded(stage_dir: str, fit_signature: dict, note: Callable[[str], None]) -> dict | None:
    """The record of this fit, if it finished in an earlier attempt with the same arguments."""
    path = os.path.join(_directory(stage_dir), "record.json")
    try:
        with open(path) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if record.get("signature") != json.loads(json.dumps(fit_signature)):
        note("this fit's arguments differ from the ones it finished with before: it trains again")
        return None
    return record


def record(stage_dir: str, history: Any, fit_signature: dict, rank: int, save_weights: Callable[[str], None],
           end_weights: str) -> None:
    """After a fit completed: every rank its random state, the chief the weights and the record (last: without it
    there is no record)."""
    import numpy as np  # not at import time: distrain's front door runs without numpy

    directory = _directory(stage_dir)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with open(os.open(os.path.join(directory, f"random-rank{rank}.pkl"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                      0o600), "wb") as handle:
        pickle.dump({"python": random.getstate(), "numpy": np.random.get_state(),
                     **{name: variable.numpy() for name, variable in _global_generators().items()}}, handle)
    if rank != 0:
        return
    weights = os.path.join(directory, end_weights)  # the family's name for it (keras_family.py)
    save_weights(weights)
    workdirs.make_tree_private(directory)  # Keras writes with the umask
    runs.write_private_json(os.path.join(directory, "record.json"), {
        "signature": fit_signature, "weights": os.path.basename(weights),
        "history": _plain(getattr(history, "history", {})), "epoch": list(getattr(history, "epoch", [])),
        "params": _plain(getattr(history, "params", {}) or {})})


def _plain(value: Any) -> Any:
    """JSON-safe: numpy numbers as Python numbers."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def restore(stage_dir: str, record: dict, model: Any, keras: Any, rank: int) -> Any:
    """The fit's end state back (weights, optimizer state, this rank's random state), and its History."""
    import numpy as np  # not at import time: distrain's front door runs without numpy

    directory = _directory(stage_dir)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and hasattr(optimizer, "built") and not optimizer.built:
        optimizer.build(model.trainable_variables)  # Keras 3 loads optimizer variables into a built optimizer
    model.load_weights(os.path.join(directory, record["weights"]))
    with contextlib.suppress(OSError), open(os.path.join(directory, f"random-rank{rank}.pkl"), "rb") as handle:
        state = pickle.load(handle)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        for name, variable in _global_generators().items():
            if name in state:
                variable.assign(state[name])
    # patch: stages.history
    history = keras.callbacks.History()
    history.set_model(model)
    history.history, history.epoch, history.params = record["history"], record["epoch"], record["params"]
    with contextlib.suppress(AttributeError):
        model.history = history
    return history


def _global_generators() -> dict[str, Any]:
    """The state variables of the global random generators that exist in this process: TensorFlow's
    `tf.random.get_global_generator()` and Keras 3's global SeedGenerator (keras.random without a seed). Looked
    up, not created: creating one would draw a seed the run never stopped does not draw."""
    found = {}
    with contextlib.suppress(ImportError, AttributeError):
        from tensorflow.python.ops import stateful_random_ops

        if stateful_random_ops.global_generator is not None:
            found["tensorflow"] = stateful_random_ops.global_generator.state
    with contextlib.suppress(ImportError, AttributeError):
        from keras.src.backend.common import global_state

        generator = global_state.get_global_attribute("global_seed_generator")
        if generator is not None:
            found["keras"] = generator.state.value if hasattr(generator.state, "value") else generator.state
    return found


def clear(run_dir: str) -> None:
    """The script ended: its fits' records go, so that running it again trains again."""
    stage = 1
    while os.path.isdir(runs.stage_dir(run_dir, stage)) or stage == 1:
        shutil.rmtree(_directory(runs.stage_dir(run_dir, stage)), ignore_errors=True)
        stage += 1
