"""Keras 3's TensorFlow trainer class, under the name each Keras 3 gives it: `TensorFlowTrainer` up to 3.15,
`Trainer` in 3.16 (the `keras-nightly` that TensorFlow 2.22's pre-release requires). What distrain corrects or
positions in it (compat/keras3_mwm.py, fit/resume.py) is the same method on either."""

from __future__ import annotations

import importlib
from typing import Any

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
CLASS_NAMES = ("TensorFlowTrainer", "Trainer")


def trainer_class() -> Any:
    """The class, or AttributeError (ImportError where the module moved) naming what was looked for."""
    # patch: keras3_trainer.class
    module = importlib.import_module(TRAINER_MODULE)
    for name in CLASS_NAMES:
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
    raise AttributeError(f"{TRAINER_MODULE} has none of {', '.join(CLASS_NAMES)}")

