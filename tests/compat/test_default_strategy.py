"""compat/default_strategy.py, for real on each TensorFlow line (`core`): `clear_session()`, which k-fold loops call
before each model, keeps distrain's strategy the default in both Keras families; without the wrapper (the negative
control) TensorFlow's graph reset drops it, which is what the wrapper is for (once it no longer does, delete it)."""

import sys

import pytest

from helpers import ROOT, run

CHECK = """
import sys
import tensorflow as tf, keras, tf_keras
from entrypoint.compat import default_strategy
strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
tf.distribute.experimental_set_strategy(strategy)
if sys.argv[1] == "wrapped":
    default_strategy.keep_after_resets(tf, strategy)
for clear in (keras.backend.clear_session, tf_keras.backend.clear_session, tf.compat.v1.reset_default_graph):
    clear()
    print(clear.__module__, "kept" if tf.distribute.get_strategy() is strategy else "dropped")
    tf.distribute.experimental_set_strategy(None)
    tf.distribute.experimental_set_strategy(strategy)
"""


@pytest.mark.core
@pytest.mark.parametrize(("how", "state"), [("wrapped", "kept"), ("bare", "dropped")])
def test_clear_session_keeps_distrains_strategy_in_both_families_and_without_the_wrapper_drops_it(how, state):
    out = run([sys.executable, "-c", CHECK, how], cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.endswith(("kept", "dropped"))]
    assert len(lines) == 3 and all(line.endswith(state) for line in lines), out.stdout[-3000:]
