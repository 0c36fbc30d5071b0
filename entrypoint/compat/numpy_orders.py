"""The orders Keras' own `fit` draws of numpy input with `shuffle=True`, drawn by Keras' own array adapter, so
that distrain's array pipeline (fit/arrays.py) trains plain `python`'s batches of a seeded script in every mode
(#69 finding 8: a seeded script with `fit(x, y, shuffle=True)` trained another order under distrain, and a seed
sweep saw one order).

Both families shuffle with `tf.random.shuffle` in a dataset function, its seeds taken from TensorFlow's global
seed; a stateful kernel, fresh in every iterator made of the dataset (measured on Keras 3.3.2, 3.15.1, tf_keras
2.17 and 2.21):
- Keras 3 makes a new iterator of its adapter's dataset every epoch: a seeded script trains the same
  permutation in every epoch of every fit.
- tf_keras' adapter repeats the permutation for the fit's `epochs - initial_epoch` epochs in one iterator: epoch
  `initial_epoch + k` trains the kernel's (k+1)th draw, and every fit starts again at the first.
Without a global seed Keras draws new orders in every process, which no resumed process could draw again:
fit/arrays.py then keeps its own (seed, epoch) orders.
"""

from __future__ import annotations

from typing import Any

from ..keras_family import KerasFamily

KERAS3_ADAPTER = "keras.src.trainers.data_adapters.array_data_adapter"
TF_KERAS_ADAPTER = "tf_keras.src.engine.data_adapter"


def global_seed() -> int | None:
    """TensorFlow's global seed (tf.random.set_seed, keras.utils.set_random_seed), read without drawing an
    operation seed: `tf.compat.v1.get_seed` would advance the script's own eager random sequence."""
    # patch: numpy_orders.global_seed
    from tensorflow.python.eager import context

    return context.global_seed()


def keras_orders(family: KerasFamily, samples: int, *, first_epoch: int, epochs: int, fit_first_epoch: int) -> Any:
    """A dataset of the permutations (int64 vectors of `samples`) plain `fit(epochs=epochs,
    initial_epoch=fit_first_epoch)` trains in epochs first_epoch .. epochs - 1 of numpy input shuffled; None
    where TensorFlow has no global seed (see the module doc)."""
    if global_seed() is None:
        return None
    import numpy as np
    import tensorflow as tf

    indices = np.arange(samples, dtype=np.int64)
    if family.draws_numpy_orders_in_one_iterator:
        draws = _tf_keras_draws(indices, epochs - fit_first_epoch)
        return draws.map(lambda *element: tf.nest.flatten(element)[0]).skip(first_epoch - fit_first_epoch)
    first = tf.nest.flatten(next(iter(_keras3_draws(indices))))[0]
    return tf.data.Dataset.from_tensors(first).repeat(epochs - first_epoch)


def _keras3_draws(indices: Any) -> Any:
    """Keras 3's dataset of one epoch of `indices` in one batch: its first element is the epoch's permutation."""
    # patch: numpy_orders.keras3_adapter
    import importlib

    adapter = importlib.import_module(KERAS3_ADAPTER).ArrayDataAdapter
    return adapter(indices, batch_size=len(indices), shuffle=True).get_tf_dataset()


def _tf_keras_draws(indices: Any, epochs: int) -> Any:
    """tf_keras' dataset of `epochs` epochs of `indices`, one batch each: each element an epoch's permutation."""
    # patch: numpy_orders.tf_keras_adapter
    import importlib

    adapter = importlib.import_module(TF_KERAS_ADAPTER).TensorLikeDataAdapter
    return adapter(indices, batch_size=len(indices), epochs=epochs, shuffle=True).get_dataset()
