"""distrain's strategy stays the default after `clear_session()`.

distrain makes its strategy the default for the whole script (`tf.distribute.experimental_set_strategy`), which
TensorFlow keeps on the default graph. `keras.backend.clear_session()` (both Keras families; k-fold and
hyper-parameter loops call it before each model) resets the default graph with `tf.compat.v1.reset_default_graph()`,
and with it the strategy: every model built afterwards is this process's alone, and each rank trains the whole
dataset by itself, in sync with no one, printing one process's numbers as if distributed. A script's own
MWM strategy scope (`with strategy.scope():` inside the loop, the guides' pattern) never noticed; distrain's
default scope did. The reset is wrapped: after it, distrain's strategy is the default again.

TensorFlow keeps the default strategy's scope in the setting thread's local storage only. A process the script forks
from another thread (PyDataset's `use_multiprocessing` forks from its enqueuer's) loses the main thread's storage,
and with it the scope's suspended `variable_creator_scope`, whose exit then fails in that thread: "Exception ignored
in: <generator object variable_creator_scope>" and an AttributeError, a traceback per child per epoch (#69). Plain
python's `with strategy.scope():` is held by the frame instead. distrain holds the scope too (`make_default`).

`tf.saved_model.load` under a strategy's scope restores the SavedModel's variables as distributed ones, whose
functions must be called through `strategy.run`: a script that exports a model and serves it back
(`model.export`, `tf.saved_model.load(path).serve(x)`, as Keras' and TensorFlow's serving guides do) failed under
MWM ("a graph generated from the cross-replica context in an in-replica context", #69), where plain `python` loads
it plain. Outside the script's own `with strategy.scope():`, it loads with no strategy, as under plain `python`.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

# the two module objects TensorFlow exports reset_default_graph from (Keras 3 calls one, tf_keras the other)
COMPAT_V1_MODULES = ("tensorflow.compat.v1", "tensorflow.compat.v2.compat.v1")


_HELD: list = []  # the default strategy's scope object, referenced from outside the main thread's local storage


def make_default(tf: Any, strategy: Any) -> None:
    """`tf.distribute.experimental_set_strategy(strategy)` (None: no default), its scope held by this module."""
    from tensorflow.python.framework import ops

    tf.distribute.experimental_set_strategy(strategy)
    # patch: default_strategy.scope_held
    _HELD[:] = [ops.get_default_graph()._global_distribute_strategy_scope]


def keep_after_resets(tf: Any, strategy: Any) -> None:
    """Wrap `tf.compat.v1.reset_default_graph` so that `strategy` is the default again after it."""
    # patch: default_strategy.reset_default_graph
    for name in COMPAT_V1_MODULES:
        module = importlib.import_module(name)
        module.reset_default_graph = _resetting_keeps(module.reset_default_graph, tf, strategy)


def _resetting_keeps(original: Any, tf: Any, strategy: Any) -> Any:
    @functools.wraps(original)
    def reset_default_graph() -> None:
        original()
        if not tf.distribute.has_strategy():
            make_default(tf, strategy)

    return reset_default_graph


def load_saved_models_plain(tf: Any, strategy: Any) -> None:
    """Wrap `tf.saved_model.load` so that, where distrain's default scope is the only strategy scope, it loads
    with no strategy (the module doc); inside the script's own scope it loads as TensorFlow does there."""
    from tensorflow.python.framework import ops

    original = tf.saved_model.load

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        # patch: default_strategy.saved_model_load
        graph = ops.get_default_graph()
        only_the_default = getattr(graph, "_global_distribute_strategy_scope", None) is not None and \
            len(getattr(graph, "_distribution_strategy_stack", ())) == 1
        if not only_the_default or tf.distribute.get_strategy() is not strategy:
            return original(*args, **kwargs)
        make_default(tf, None)
        try:
            return original(*args, **kwargs)
        finally:
            make_default(tf, strategy)

    # patch: default_strategy.saved_model_load
    tf.saved_model.load = load

