"""A stuck rank is named in minutes, not waited on for hours.

A rank alive but stuck (a blocked read, a deadlocked input pipeline) leaves the others waiting in a collective
forever: TensorFlow's MWM has no collective timeout by default, and its coordination service's heartbeat runs in
C++, so a stuck Python rank still looks alive. distrain watches progress itself, on every rank:

- a watchdog thread sees the steps end (steps.py tells it, after each call of the train function; its callback,
  placed first among fit's callbacks, sees an epoch's end before any of the script's own epoch-end callbacks).
  In steady training, a step that has not ended within max(10 x the median step time,
  DISTRAIN_STALL_SECONDS=120) is a stall. The first step of each epoch (compilation, reshuffling), validation
  and epoch-end callbacks (a chief writing a report) get DISTRAIN_STALL_PAUSE_SECONDS (30 min).
  A rank that is only slower makes every step slower: not a stall.
- on a stall every rank prints its Python stacks (all threads), prefixed with its rank, and looks for a thread
  inside the script's own code (a tf.data `numpy_function`, a generator, a callback): that is where a stuck rank
  is stuck, while the ranks waiting for it sit in TensorFlow. The ranks leave what they found in the run's state
  directory (shared by every node), so each names the stuck rank and its host in one last line, and exits 4:
  `srun --kill-on-bad-exit` and `distrain launch` end the rest, a `--requeue` job can be requeued.

Keras runs a step (the input's next batch included) inside one TensorFlow function, so which rank did not reach
a collective cannot be read from Python step counts: the ranks waiting and the rank stuck have all begun the
same step. Their stacks tell them apart.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .. import endings
from ..errors import EXIT_WORKER_FAILED
from ..plan import Plan
from ..runs import write_private_json
from . import checkpoint_snapshot

if TYPE_CHECKING:
    from .steps import TrainingPosition

PEERS_REPORT_WAIT_SECONDS = 10.0  # how long a stalled rank waits for the others' notes before it names the stuck

_LIBRARY_ROOTS = tuple({os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                      sysconfig.get_paths()["platlib"],
                                                      os.path.dirname(os.path.dirname(__file__)))})  # all of distrain


def _is_library(filename: str) -> bool:
    path = os.path.realpath(filename)
    return filename.startswith("<") or path.startswith(_LIBRARY_ROOTS) or "site-packages" in path \
        or "dist-packages" in path


_FRAMEWORKS = ("/tensorflow/", "/keras/", "/tf_keras/", "/horovod/", f"{os.sep}entrypoint{os.sep}")


def stuck_in_user_code(skip: set[int]) -> str | None:
    """Where a thread of this process is inside the script's own code ('file:line in function'), or None.

    From the innermost frame outwards, script code must come before any framework frame: the main thread waiting
    in TensorFlow has the script's `model.fit(...)` line at its bottom, which is where it called in, not where it
    is stuck; a tf.data thread running the script's `numpy_function` has the script's code innermost.
    """
    # patch: stalls.stack_dump
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        while frame is not None:
            filename = frame.f_code.co_filename
            if any(part in filename for part in _FRAMEWORKS):
                break
            if not _is_library(filename):
                return f"{os.path.basename(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
    return None


class Progress:
    """What the watchdog reads: the fit's position (steps.py), when its last step ended, and whether fit is in a
    pause (first step, epoch end)."""

    def __init__(self, position: TrainingPosition) -> None:
        self.position = position
        self.last = time.monotonic()
        self.paused = True
        self.durations: deque[float] = deque(maxlen=200)
        self.watching = False
        self.ended = threading.Event()  # fit ended: the watchdog stops at once, not at its next deadline


def make_callback(plan: Plan, keras: Any, position: TrainingPosition) -> Any:
    progress = Progress(position)
    floor, pause = plan.stall_seconds, plan.stall_pause_seconds

    class WatchForStalls(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True
            self._watchdog: threading.Thread | None = None

        def on_train_begin(self, logs: Any = None) -> None:
            if plan.checkpoint_dir:  # an earlier stall's finding is not this one's (every rank starts fit first)
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(plan.checkpoint_dir, "stall", f"rank{plan.rank}.json"))
            progress.watching, progress.paused, progress.last = True, True, time.monotonic()
            self._watchdog = threading.Thread(target=_watch, args=(plan, progress, floor, pause), daemon=True,
                                              name="distrain-stall-watchdog")
            self._watchdog.start()

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            progress.paused, progress.last = True, time.monotonic()

        def step_ended(self) -> None:
            """Called after each train-function call (steps.py): a batch hook would cost every step."""
            now = time.monotonic()
            if not progress.paused:
                progress.durations.append(now - progress.last)
            progress.last, progress.paused = now, False

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            progress.paused, progress.last = True, time.monotonic()  # validation and epoch-end callbacks follow

        def on_train_end(self, logs: Any = None) -> None:
            progress.watching = False
            progress.ended.set()

    return WatchForStalls()


def _limit(progress: Progress, floor: float, pause: float) -> float:
    if progress.paused or not progress.durations:
        return pause
    return max(10 * statistics.median(progress.durations), floor)


def _watch(plan: Plan, progress: Progress, floor: float, pause: float) -> None:
    """Wake at the deadline of the step in progress, or after min(floor, pause) if that is sooner, not every
    second: a wake-up costs 0.2-1 ms of CPU on a VM. No deadline is missed: one set while the watchdog sleeps (a
    step ended, a pause began) is at least min(floor, pause) after the sleep began, so never before its end."""
    while progress.watching:
        waited = time.monotonic() - progress.last
        limit = _limit(progress, floor, pause)
        if waited > limit:
            _report_and_exit(plan, progress, waited)
        progress.ended.wait(min(limit - waited, floor, pause) + 0.01)


def _report_and_exit(plan: Plan, progress: Progress, waited: float) -> None:
    """Stacks of every thread, prefixed with the rank; where the script is stuck, shared with the other ranks;
    one last line naming the stuck rank(s); exit 4."""
    prefix = plan.line_prefix
    where = stuck_in_user_code({threading.get_ident()})
    with tempfile.TemporaryFile() as dump:
        faulthandler.dump_traceback(file=dump, all_threads=True)
        dump.seek(0)
        stacks = dump.read().decode(errors="replace").splitlines()
    position = progress.position
    step = f"epoch {position.epoch + 1} step {position.batch + 2}"  # the step in progress, 1-based
    lines = [f"{prefix}distrain: stall: no progress at {step} for {waited:.0f} s; this rank's Python stacks:"]
    lines += [f"{prefix}  {line}" for line in stacks]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
    found = _share(plan, {"rank": plan.rank, "host": plan.node, "where": where})
    stuck = [f"rank {r['rank']} (node {r['host']}) is stuck in your code at {r['where']}" for r in found
             if r.get("where")]
    silent = sorted(set(range(plan.size)) - {r["rank"] for r in found}) if plan.size > 1 else []
    if stuck:
        verdict = "; ".join(stuck)
    elif silent:
        verdict = (f"rank(s) {', '.join(map(str, silent))} did not report (stuck outside Python, e.g. in I/O or "
                   "the GPU, or their node is gone)")
    else:
        verdict = "no rank is in your code: the wait is inside TensorFlow or the collective library (NCCL, Gloo)"
    sys.stderr.write(f"{prefix}distrain: error: stalled at {step}: {verdict}; nothing ended for {waited:.0f} s "
                     f"(DISTRAIN_STALL_SECONDS); stacks above\n")
    sys.stderr.flush()
    sys.stdout.flush()
    if plan.checkpoint_dir:
        endings.ended(plan.checkpoint_dir, plan.rank, EXIT_WORKER_FAILED, f"stalled at {step}: {verdict}",
                      endings.KIND_STALL)
    checkpoint_snapshot.finish_writes()
    os._exit(EXIT_WORKER_FAILED)


def _share(plan: Plan, mine: dict, wait: float = PEERS_REPORT_WAIT_SECONDS) -> list[dict]:
    """Leave this rank's finding in the run's state dir and collect the others' (all ranks stall together)."""
    if not plan.checkpoint_dir or plan.size == 1:
        return [mine]
    directory = os.path.join(plan.checkpoint_dir, "stall")
    with contextlib.suppress(OSError):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        write_private_json(os.path.join(directory, f"rank{plan.rank}.json"), {**mine, "time": time.time()})
    deadline = time.monotonic() + wait
    found: dict[int, dict] = {}
    while time.monotonic() < deadline:
        for rank in range(plan.size):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(directory, f"rank{rank}.json")) as handle:
                    data = json.load(handle)
                if time.time() - data.get("time", 0) < 600:  # this stall's, not an earlier one's
                    found[rank] = data
        if len(found) == plan.size:
            break
        time.sleep(0.5)
    return [found[r] for r in sorted(found)]
