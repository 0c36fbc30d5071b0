"""A stop that its input cannot reach: exit 75 within seconds all the same, nothing left behind.

The job's SIGTERM reaches the whole process group (scancel, a preemption, Slurm's time limit): a PyDataset's or
Sequence's pool workers (`use_multiprocessing=True`) die of it at once, as under plain python, and the batches
they were making never come. distrain's own handler waits for the next step to checkpoint, and that step waited
for ever on the lost batch (the stall watchdog blamed TensorFlow half an hour later); Python's handler itself
never ran, the main thread held in TensorFlow's C++ waiting for that batch. Here the C-level handler's wakeup pipe
(`signal.set_wakeup_fd`) tells a thread of a stop signal in fit; it then looks every POLL_SECONDS: where no step
has ended for STOP_INPUT_WAIT_SECONDS and a thread waits on a pool's result inside Keras' enqueuer, the run stops
now, without a new checkpoint (the last one is whole: the rerun resumes there), its descendants killed
(descendants.py), exit 75.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from .. import descendants, endings, startup_stop
from ..errors import EXIT_PREEMPTED
from ..log import filter_processes
from ..plan import Plan
from . import checkpoint_snapshot

STOP_INPUT_WAIT_SECONDS = 10.0  # no step for this long after a stop signal, waiting on a pool: the input is lost
POLL_SECONDS = 0.5
# a thread waiting on a process pool's result inside Keras' enqueuers (Keras 3's PyDataset, tf_keras' Sequence)
_POOL_WAIT = ("multiprocessing/pool.py", ("wait", "get"))
_ENQUEUERS = ("py_dataset_adapter.py", "data_utils.py")


def waits_on_a_pool() -> bool:
    """Whether a thread of this process waits on a pool's result for Keras' enqueuer."""
    # patch: stalls.stack_dump
    for frame in sys._current_frames().values():
        in_pool = in_enqueuer = False
        while frame is not None:
            name = frame.f_code.co_filename
            in_pool = in_pool or (name.endswith(_POOL_WAIT[0]) and frame.f_code.co_name in _POOL_WAIT[1])
            in_enqueuer = in_enqueuer or name.endswith(_ENQUEUERS)
            frame = frame.f_back
        if in_pool and in_enqueuer:
            return True
    return False


def listen(plan: Plan, in_fit: Callable[[], bool], last_step: Callable[[], float]) -> None:
    """From now on, a stop signal that comes while `in_fit()` starts the watch (`last_step`: when the fit's last
    step ended)."""
    read_fd, _ = startup_stop.wakeup_pipe()
    threading.Thread(target=_listen, args=(read_fd, plan, in_fit, last_step), daemon=True,
                     name="distrain-stop-input").start()


def _listen(read_fd: int, plan: Plan, in_fit: Callable[[], bool], last_step: Callable[[], float]) -> None:
    for signum in startup_stop.signals_from(read_fd):
        if signum in startup_stop.STOP_SIGNALS and in_fit():
            _watch(plan, signal.Signals(signum).name, last_step, time.monotonic())
            return


def _watch(plan: Plan, signame: str, last_step: Callable[[], float], since: float) -> None:
    while True:
        time.sleep(POLL_SECONDS)
        quiet = time.monotonic() - max(since, last_step())
        if quiet >= STOP_INPUT_WAIT_SECONDS and waits_on_a_pool():
            _stop_now(plan, signame, quiet)


def _stop_now(plan: Plan, signame: str, quiet: float) -> None:
    why = (f"stopped on {signame} without a new checkpoint: no step for {quiet:.0f} s, its input waiting on data "
           f"workers the same signal ended; a rerun resumes from the last checkpoint, if any")
    sys.stdout.flush()
    sys.stderr.write(f"{plan.line_prefix}distrain: {why}\n")
    sys.stderr.flush()
    if plan.checkpoint_dir:
        endings.ended(plan.checkpoint_dir, plan.rank, EXIT_PREEMPTED, why, endings.KIND_STOPPED)
    descendants.kill_all(filter_processes())
    checkpoint_snapshot.finish_writes()
    os._exit(EXIT_PREEMPTED)
