"""distrain's one training position (steps.py) is told fit's steps by the train function, not a batch callback:
the last batch each call really ran (what Keras hands `on_train_batch_end` with one step a call; with more, Keras'
report differs by version), and no per-step callback work asked of Keras."""

import importlib

import numpy as np
import pytest

from entrypoint import runs
from entrypoint.engines import Engine
from entrypoint.fit import stalls, steps, stopping
from entrypoint.plan import detect

FAMILIES = ["keras", "tf_keras"]


def watching(position):
    """The batches the position's observers are told of."""
    seen = []
    position.observers.append(lambda: seen.append(position.batch))
    return seen


def test_each_call_ends_at_the_last_batch_it_ran():
    position = steps.TrainingPosition()
    seen = watching(position)
    position.steps_per_call = 3
    position.epoch_began(0, 10)
    for _ in range(4):
        position.call_ended()
    assert seen == [2, 5, 8, 9]  # the epoch's last call runs the one step left
    assert (position.steps, position.calls, position.ends_epoch(), position.after()) == \
        (10, 4, True, runs.Position(1, 0))
    position.epoch_began(1, None)  # unknown length: nothing to cap at
    position.call_ended()
    assert seen[-1] == 2
    assert (position.ends_epoch(), position.after()) == (False, runs.Position(1, 3))


def test_an_epoch_of_unknown_length_ends_where_its_learnt_length_says():
    """A dataset of unknown length learns its length at its first epoch's end (unknown_length.py): from then on the
    checkpoint, the stop and the stall watchdog see its last step as the epoch's last, as with fit's steps."""
    learnt = [None]
    position = steps.TrainingPosition(learnt_length=lambda: learnt[0])
    position.epoch_began(0, None)
    for _ in range(7):
        position.call_ended()
    assert not position.ends_epoch() and position.after() == runs.Position(0, 7)  # not known yet: mid-epoch
    learnt[0] = 7
    position.epoch_began(1, None)
    for _ in range(7):
        position.call_ended()
    assert position.ends_epoch() and position.after() == runs.Position(2, 0)


def test_a_resumed_epoch_counts_its_steps_from_where_it_resumed():
    """A fit resumed at epoch 3, step 4 runs that epoch's steps 4..: a second stop in it must say so (before
    stop 64 it counted from 0, and a second stop in the same epoch recorded a position before the first's)."""
    position = steps.TrainingPosition(resumed_at=runs.Position(3, 4))
    seen = watching(position)
    position.epoch_began(3, 10)
    position.call_ended()
    position.epoch_began(4, 10)
    position.call_ended()
    assert seen == [4, 0]


@pytest.fixture(scope="module", params=FAMILIES)
def keras(request):
    return importlib.import_module(request.param)


def tiny_model(keras, steps_per_execution):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


@pytest.mark.core
@pytest.mark.filterwarnings("ignore:Your input ran out of data")  # Keras 3.3 warns at a partial last call
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_the_observers_see_the_batches_fit_ran(keras, steps_per_execution):
    class Reported(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = []

        def on_train_batch_end(self, batch, logs=None):
            self.batches.append(batch)

    x, y = np.ones((40, 4), "float32"), np.ones((40, 1), "float32")
    model = tiny_model(keras, steps_per_execution)
    for _ in range(2):  # a second fit: observed once, not twice
        reported, position = Reported(), steps.TrainingPosition()
        observed = watching(position)
        with steps.observed(model, position):
            model.fit(x, y, batch_size=4, epochs=2, verbose=0,
                      callbacks=[steps.make_callback(keras, position), reported])
        # Keras reports a call's first batch (Keras 3.3) or its last as if the call ran full (3.15): the observers
        # get the last batch it really ran
        spe = steps_per_execution
        assert observed == [min(batch - batch % spe + spe - 1, 9) for batch in reported.batches]
        assert len(observed) >= 2 * (10 // spe)
    assert "make_train_function" not in vars(model)
    assert not hasattr(model.train_function, "_distrain_unobserved")  # the model's own function is back
    if steps_per_execution == 1:  # (tf_keras' train_on_batch runs steps_per_execution batches)
        model.train_on_batch(x[:4], y[:4])


@pytest.mark.core
def test_distrains_callbacks_ask_keras_for_no_per_step_work(keras, tmp_path, monkeypatch):
    """tf_keras then skips its batch machinery; Keras 3 calls no batch hook of distrain's."""
    plan = detect({"DISTRAIN_CHECKPOINT": "0"}, gpus=[])
    model = tiny_model(keras, 1)
    position = steps.TrainingPosition()
    watch = stalls.make_callback(plan, keras, position)
    stop = stopping.make_callback(plan, keras, None, Engine(plan), None, stopping.SignalFlag(), position)
    position.observers = [watch.step_ended, stop.step_ended]
    distrains = [steps.make_callback(keras, position), watch, stop]

    class PerBatch(keras.callbacks.Callback):  # the negative control: a callback with a batch hook
        def on_train_batch_end(self, batch, logs=None):
            pass

    for callbacks, per_step in ((distrains, False), ([*distrains, PerBatch()], True)):
        if keras.__name__ == "tf_keras":
            listed = keras.callbacks.CallbackList(callbacks, model=model, add_history=True, add_progbar=True,
                                                  verbose=2, epochs=1, steps=10)
            assert listed._should_call_train_batch_hooks is per_step
        else:
            hooks = [type(c).on_train_batch_end is not keras.callbacks.Callback.on_train_batch_end for c in callbacks]
            assert any(hooks) is per_step
