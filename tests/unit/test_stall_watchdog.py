"""The stall watchdog's clock: distrain's stall callback (stalls.make_callback) with its real watchdog thread, fed
steps as fit feeds them. A step that has not ended by its deadline is reported on time, in steady training and
after a pause; steady training does not wake the watchdog every second; the watchdog ends with fit."""

import time

import pytest

from entrypoint.fit import stalls, steps
from entrypoint.plan import detect


@pytest.fixture(scope="module")
def keras():
    import tf_keras

    return tf_keras


class Watched:
    """WatchForStalls in a fit of its own: the report is recorded (with the wait it names) instead of exiting."""

    def __init__(self, keras, monkeypatch, tmp_path, floor: float, pause: float) -> None:
        self.reported: list[float] = []
        self.wakes = 0
        plan = detect({"DISTRAIN_CHECKPOINT": "0", "DISTRAIN_STALL_SECONDS": str(floor),
                       "DISTRAIN_STALL_PAUSE_SECONDS": str(pause)}, gpus=[])
        original_limit = stalls._limit

        def counted_limit(*args):
            self.wakes += 1
            return original_limit(*args)

        def report(plan, progress, waited):
            self.reported.append(waited)
            progress.watching = False

        monkeypatch.setattr(stalls, "_limit", counted_limit)
        monkeypatch.setattr(stalls, "_report_and_exit", report)
        self.callback = stalls.make_callback(plan, keras, steps.TrainingPosition())
        self.callback.on_train_begin()
        self.callback.on_epoch_begin(0)

    def reported_within(self, seconds: float) -> list[float]:
        self.callback._watchdog.join(timeout=seconds)
        return self.reported


@pytest.fixture
def watched(keras, monkeypatch, tmp_path):
    made = []
    yield lambda floor, pause: made.append(Watched(keras, monkeypatch, tmp_path, floor, pause)) or made[-1]
    for w in made:
        w.callback.on_train_end()


def test_a_stall_after_the_first_steps_is_reported_at_the_steady_limit_not_the_pause(watched):
    w = watched(floor=1.0, pause=30.0)  # the epoch's first step compiles: the pause's limit
    time.sleep(0.2)
    w.callback.step_ended()
    w.callback.step_ended()  # a step time known: the steady limit (the floor) from here
    assert len(w.reported_within(5)) == 1 and 1.0 < w.reported[0] < 1.3, w.reported


def test_steady_steps_are_not_a_stall_and_do_not_wake_the_watchdog_each_step(watched):
    w = watched(floor=1.0, pause=30.0)
    for _ in range(40):  # 4 s of 0.1 s steps
        w.callback.step_ended()
        time.sleep(0.1)
    assert not w.reported
    assert w.wakes <= 8, w.wakes  # about one a second (the floor); 40 with a tick as short as a step


def test_epoch_end_callbacks_get_the_pause_limit(watched):
    w = watched(floor=1.0, pause=2.0)
    for _ in range(3):
        w.callback.step_ended()
    w.callback.on_epoch_end(0)  # the script's epoch-end callbacks now take long
    assert len(w.reported_within(5)) == 1 and 2.0 < w.reported[0] < 2.3, w.reported


def test_the_watchdog_ends_with_fit(watched):
    w = watched(floor=60.0, pause=600.0)
    w.callback.on_train_end()
    w.callback._watchdog.join(timeout=1)
    assert not w.callback._watchdog.is_alive() and not w.reported
