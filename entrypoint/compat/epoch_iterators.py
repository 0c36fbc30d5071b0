"""How many iterators each Keras family's `fit` makes of a dataset of known length given without
`steps_per_epoch`, read or not: each one made draws the next order of a seeded `shuffle(reshuffle_each_iteration=
True)`, so fit/resume.py's positioned pipeline makes as many, unread, for each epoch to train the order plain
`python` trains. Read from the source of the code that makes them; where it is not the code known, one an epoch.

- Keras 3.3: one an epoch. Keras 3.15's epoch iterator makes another at each epoch's end (never read, the next
  epoch makes its own): two an epoch, plain Keras trains orders 1, 3, 5.
- tf_keras: its DataHandler makes one before the first epoch and a new one for every epoch: one unread first,
  plain tf_keras trains orders 2, 3, 4.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re

from ..keras_family import FAMILIES

KERAS3_EPOCH_ITERATOR = "keras.src.trainers.epoch_iterator"
TF_KERAS_DATA_ADAPTER = "tf_keras.src.engine.data_adapter"
# Keras 3: after an epoch that read all its batches, a new iterator, which the next epoch replaces with its own
_NEW_ITERATOR_AT_THE_END = re.compile(
    r"if self\._num_batches and self\._steps_seen >= self\._num_batches:\s*\n\s*self\._current_iterator = iter\(")
# tf_keras: one made before the epochs' loop, then one for each epoch
_ONE_BEFORE_THE_EPOCHS = re.compile(
    r"data_iterator = iter\(self\._dataset\)\s*\n\s*for epoch in range\((.|\n)*?"
    r"if self\._adapter\.should_recreate_iterator\(\):\s*\n\s*data_iterator = iter\(self\._dataset\)")


def _source(module: str, qualified: str) -> str:
    try:
        owner = importlib.import_module(module)
        for part in qualified.split("."):
            owner = getattr(owner, part)
        return inspect.getsource(owner)
    except (ImportError, AttributeError, OSError, TypeError):
        return ""  # Keras 3.3 has no such epoch iterator: one an epoch


@functools.cache
def made(family: str) -> tuple[int, int]:
    """(iterators made before the first epoch and never read, iterators made each epoch) by `family`'s fit."""
    if FAMILIES[family].epochs_come_from_a_data_handler:
        # patch: epoch_iterators.tf_keras
        source = _source(TF_KERAS_DATA_ADAPTER, "DataHandler.enumerate_epochs")
        return (1 if _ONE_BEFORE_THE_EPOCHS.search(source) else 0), 1
    # patch: epoch_iterators.keras3
    source = _source(KERAS3_EPOCH_ITERATOR, "EpochIterator._enumerate_iterator")
    return 0, 2 if _NEW_ITERATOR_AT_THE_END.search(source) else 1
