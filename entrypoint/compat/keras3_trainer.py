"""Keras 3's TensorFlow trainer class, under the name each Keras 3 gives it: `TensorFlowTrainer` up to 3.15,
`Trainer` in 3.16 (the `keras-nightly` that TensorFlow 2.22's pre-release requires). What distrain corrects or
positions in it (compat/keras3_mwm.py, fit/resume.py) is the same method on either. And how many iterators its
epoch iterator makes of a dataset of known length an epoch, which fit/resume.py reproduces."""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from typing import Any

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
CLASS_NAMES = ("TensorFlowTrainer", "Trainer")
EPOCH_ITERATOR_MODULE = "keras.src.trainers.epoch_iterator"
# after an epoch that read all its batches, a new iterator for the next epoch, which then makes its own again
_NEW_ITERATOR_AT_THE_END = re.compile(
    r"if self\._num_batches and self\._steps_seen >= self\._num_batches:\s*\n\s*self\._current_iterator = iter\(")


def trainer_class() -> Any:
    """The class, or AttributeError (ImportError where the module moved) naming what was looked for."""
    # patch: keras3_trainer.class
    module = importlib.import_module(TRAINER_MODULE)
    for name in CLASS_NAMES:
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
    raise AttributeError(f"{TRAINER_MODULE} has none of {', '.join(CLASS_NAMES)}")


@functools.cache
def iterators_per_epoch() -> int:
    """How many iterators Keras 3's fit makes of a dataset of known length each epoch (without steps_per_epoch):
    1 (Keras 3.3), or 2 where the epoch iterator makes one at each epoch's end and another at the next one's start
    (Keras 3.15: a seeded reshuffle trains its orders 1, 3, 5, ...). Each iterator made draws the next order."""
    # patch: keras3_trainer.iterators_per_epoch
    try:
        module = importlib.import_module(EPOCH_ITERATOR_MODULE)
        source = inspect.getsource(module.EpochIterator._enumerate_iterator)
    except (ImportError, AttributeError, OSError, TypeError):
        return 1  # Keras 3.3: TFEpochIterator.enumerate_epoch, one iterator an epoch
    return 2 if _NEW_ITERATOR_AT_THE_END.search(source) else 1
