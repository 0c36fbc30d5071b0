"""Which of a script's callbacks can stop training from a batch hook (fit/stop_reach.py): only those pay the
all-reduce after every step that keeps the ranks' stops at one step. A timer does not; every way a callback's
code can reach `stop_training` does."""

import json
import sys
import time
import types

import pytest

from entrypoint.fit.stop_reach import can_stop_training, lambdas_can_stop_training


class Callback:  # Keras' Callback's place: the base the walk stops at
    def __init__(self) -> None:
        self.model = None

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        pass


class StepTimer(Callback):
    """The benchmark's kind: a clock and a list, a line of JSON at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        self.stamps.append(time.perf_counter())

    def on_train_end(self, logs=None):  # noqa: ANN001, ANN201
        print(json.dumps({"steps": len(self.stamps)}))


class StopsItself(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        if batch == 3:
            self.model.stop_training = True


def end_the_fit(model) -> None:  # noqa: ANN001
    model.stop_training = True


class StopsThroughAHelper(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        if logs and logs.get("loss", 1.0) < 0.1:
            end_the_fit(self.model)


class Budget:
    def __init__(self, model) -> None:  # noqa: ANN001
        self.model = model

    def spend(self) -> None:
        self.model.stop_training = True


class StopsThroughAnObject(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        Budget(self.model).spend()


class OwnModel:
    def halt(self) -> None:
        self.stop_training = True


class StopsThroughTheModelsMethod(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        self.model.halt()


class StopsByAComputedName(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        setattr(self.model, "stop_" + "training", True)


class StopsInALambda(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        (lambda model: model.__setattr__("stop_training", True))(self.model)


class StopsInItsBase(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        self.stop_now()

    def stop_now(self) -> None:
        self.model.stop_training = True


class TimerOnAStoppingBase(StopsInItsBase):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        super().on_train_batch_end(batch, logs)


def made_in_a_function() -> type:
    def stop(model) -> None:  # noqa: ANN001
        model.stop_training = True

    class FromAClosure(Callback):
        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
            stop(self.model)

    return FromAClosure


def test_a_timer_cannot_stop_training_so_its_fit_needs_no_per_step_round() -> None:
    assert not can_stop_training(StepTimer, Callback)


@pytest.mark.parametrize("callback", [StopsItself, StopsThroughAHelper, StopsThroughAnObject,
                                      StopsThroughTheModelsMethod, StopsByAComputedName, StopsInALambda,
                                      TimerOnAStoppingBase, made_in_a_function()],
                         ids=lambda c: c.__name__)
def test_every_way_a_callbacks_code_reaches_stop_training_is_seen(callback: type) -> None:
    assert can_stop_training(callback, Callback)


class Lambdas:
    """LambdaCallback's shape: its hooks are its instance's own attributes."""

    def __init__(self, **hooks) -> None:  # noqa: ANN003
        self.model = None
        self.__dict__.update(hooks)


def test_the_keras_docs_printing_lambda_cannot_stop_training_and_a_stopping_one_can() -> None:
    assert not lambdas_can_stop_training(Lambdas(on_batch_begin=lambda batch, logs: print(batch)))
    assert lambdas_can_stop_training(Lambdas(on_train_batch_end=lambda batch, logs: end_the_fit(None)))
    assert lambdas_can_stop_training(Lambdas(on_batch_end=print)), "code it cannot read: taken to stop"


def test_a_scripts_own_module_named_as_a_standard_library_one_is_read(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """The script's own trace.py is not the standard library's trace: its callback's code is read (by the
    module's place, not its name); the same class placed in the standard library's module is not followed."""
    import trace  # the standard library's

    class StopsFromItsModule(Callback):
        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
            self.model.stop_training = True

    StopsFromItsModule.__module__ = "trace"
    assert not can_stop_training(StopsFromItsModule, Callback), "in the standard library's module: not followed"
    own = types.ModuleType("trace")
    own.__file__ = str(tmp_path / "trace.py")
    monkeypatch.setitem(sys.modules, "trace", own)
    assert can_stop_training(StopsFromItsModule, Callback)
    assert trace is not own


def test_one_name_in_two_modules_is_followed_in_each() -> None:
    """`tidy` is harmless in one module of the script's and stops training in the other: each function's name is
    looked up in its own globals."""
    quiet, stopping = types.ModuleType("quiet_helpers"), types.ModuleType("stopping_helpers")
    exec("def tidy(model):\n    return model\n\ndef first(model):\n    return tidy(model)\n", vars(quiet))
    exec("def tidy(model):\n    model.stop_training = True\n\ndef second(model):\n    tidy(model)\n", vars(stopping))

    # the functions reached by name, not through their modules; the harmless one read first (a closure's
    # variables come in the order of their names), so that the stopping `tidy` is reached second
    also_stops, quietly = stopping.second, quiet.first

    class CallsBoth(Callback):
        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
            quietly(self.model)
            also_stops(self.model)

    assert can_stop_training(CallsBoth, Callback)
