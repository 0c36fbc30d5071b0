"""`experimental_io_device="/job:localhost"` under MWM: this worker's own host, as in one process.

TensorFlow's save-and-load tutorial writes a SavedModel and a checkpoint to a local directory from a distributed
run with `SaveOptions`/`LoadOptions`/`CheckpointOptions(experimental_io_device="/job:localhost")`: "this host". In
one process that job exists; under MWM every device is `/job:worker/task:N`, and the save failed
(`InvalidArgumentError: /job:localhost/replica:0/task:0/device:CPU:0 unknown device`). The options are made with
the same device on this worker's job instead.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from . import registry

OPTIONS = ("tensorflow.python.saved_model.save_options:SaveOptions.__init__",
           "tensorflow.python.saved_model.load_options:LoadOptions.__init__",
           "tensorflow.python.checkpoint.checkpoint_options:CheckpointOptions.__init__")


def on_this_worker(tf: Any, device: Any, task: int) -> Any:
    """`device` with the job `localhost` made this MWM worker's (`/job:worker/replica:0/task:<task>`)."""
    if not isinstance(device, str) or not device:
        return device
    spec = tf.DeviceSpec.from_string(device)
    if spec.job != "localhost":
        return device
    return spec.replace(job="worker", replica=0, task=task).to_string()


def install(tf: Any, task: int) -> None:
    """Make the three options classes take `/job:localhost` as this worker's job."""
    for spelled in OPTIONS:
        registry.replace("io_device.localhost", spelled, lambda original: _this_workers(original, tf, task))


def _this_workers(original: Any, tf: Any, task: int) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        if "experimental_io_device" in bound.arguments:
            bound.arguments["experimental_io_device"] = on_this_worker(tf, bound.arguments["experimental_io_device"],
                                                                       task)
        original(*bound.args, **bound.kwargs)

    return init
