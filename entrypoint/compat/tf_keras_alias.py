"""Make `import keras` mean tf_keras when distrain runs legacy Keras.

TF_USE_LEGACY_KERAS=1 only redirects `tf.keras`. Scripts that `import keras` directly, and Horovod's own
`from keras import backend as K`, would still get Keras 3, whose `fit` breaks under MWM (keras-team/keras#20585)
and which Horovod's Keras API does not support. A meta-path alias (not just `sys.modules["keras"] = tf_keras`,
which would re-import `keras.layers` from tf_keras's files as a second, different module) maps `keras` and every
`keras.x` to the already-loaded `tf_keras` modules.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _KerasAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib protocol
        if fullname == "keras" or fullname.startswith("keras."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):  # noqa: ANN001
        return importlib.import_module("tf_keras" + spec.name[len("keras") :])

    def exec_module(self, module) -> None:  # noqa: ANN001 - already executed as tf_keras
        return None


def alias_keras_to_tf_keras() -> None:
    """Install the alias (idempotent). Raises ImportError when tf_keras is missing."""
    # patch: tf_keras_alias.keras_is_tf_keras
    importlib.import_module("tf_keras")
    if any(isinstance(f, _KerasAlias) for f in sys.meta_path):
        return
    for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
        del sys.modules[name]  # a Keras 3 imported earlier (by TensorFlow itself) must not shadow the alias
    sys.meta_path.insert(0, _KerasAlias())
