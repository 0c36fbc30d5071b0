"""A stop signal while distrain starts (TensorFlow's import, the MWM rendezvous, the script's own set-up before its
first `fit`) ends the run at once with exit 75 and one line: nothing was trained, so nothing is lost, and the job
script requeues on 75. Without this, SIGTERM kills the process with 143 and no line, and a job preempted while it
starts is never requeued.

Installed at `distrain run`'s first line (`install`), handed over to the fit hooks' agreed stop when the script
starts (`hand_over`). Python runs a signal handler only when the main thread is back in the interpreter, and
TensorFlow's import and the rendezvous hold it in C++ for seconds: the C-level handler also writes the signal's
number to a pipe (`signal.set_wakeup_fd`), and a thread blocked on that pipe ends the process from there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .errors import EXIT_PREEMPTED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class _StartupStop:
    """The process's one start-up stop: active from install until hand_over."""

    def __init__(self) -> None:
        self.active = False
        self.lock = threading.RLock()  # re-entered by a signal handled while hand_over holds it
        self.on_stop: Callable[[str], None] | None = None  # records the worker's end (commands._Ending)
        self.previous_fd = -1


_STOP = _StartupStop()


def install() -> None:
    """Catch the stop signals from now until `hand_over`: each ends the process with exit 75 and one line."""
    if _STOP.active or threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handle)
    read_fd, _STOP.previous_fd = wakeup_pipe()
    _STOP.active = True
    threading.Thread(target=_watch, args=(read_fd,), name="distrain-startup-stop", daemon=True).start()
    os.register_at_fork(before=_hold_stop_signals, after_in_parent=_release_stop_signals,
                        after_in_child=_python_defaults_in_a_forked_child)


_BLOCKED_FOR_FORK: dict[int, set] = {}  # by thread: the stop signals it blocked around its fork (not already blocked)


def _hold_stop_signals() -> None:
    """Before a fork: the forking thread blocks the stop signals, so a child it forks holds any that arrive before
    its handlers are Python's defaults again. Keras 3.3's PyDataset terminates a pool it has just forked when an
    epoch ends as the next starts: a SIGTERM that came before the child's reset was caught by Python's C-level
    handler, whose Python handler was SIG_DFL by the time it ran (Python then drops the signal), and the child lived
    on while its parent joined it for ever (#69). The process's other threads still take the parent's signals."""
    already = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _BLOCKED_FOR_FORK[threading.get_ident()] = set(STOP_SIGNALS) - already


def _release_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED_FOR_FORK.pop(threading.get_ident(), ()))


def _python_defaults_in_a_forked_child() -> None:
    """A process the script forks (PyDataset's `use_multiprocessing`, a multiprocessing Pool) is not a worker: its
    stop signals are Python's defaults again, as under plain python, so its parent's `pool.terminate()` ends it.
    With distrain's handlers it lived on, its pool's parent waiting on it for ever (#69). A signal held since the
    fork (`_hold_stop_signals`) is delivered now, to the defaults."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    _release_stop_signals()


def when_stopped(record: Callable[[str], None]) -> None:
    """What a stop at start-up records before the process ends (the worker's ending, for `distrain runs`)."""
    _STOP.on_stop = record


def hand_over(handlers_installed: bool) -> None:
    """The script starts: the fit hooks' agreed stop (fit/stopping.install) has its handlers in place, or, where it
    installs none (Horovod elastic), the signals' defaults come back."""
    with _STOP.lock:
        if not _STOP.active:
            return
        _STOP.active = False
        signal.set_wakeup_fd(_STOP.previous_fd)
    if not handlers_installed:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _handle(signum: int, frame: Any) -> None:  # noqa: ARG001
    _stop(signum)


def wakeup_pipe() -> tuple[int, int]:
    """A pipe Python's C-level signal handler writes each signal's number to, even while the main thread is held
    in C++ (its Python handler then waits): its read end, and the wakeup fd it replaces."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    # patch: startup_stop.wakeup_fd
    return read_fd, signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)


def signals_from(read_fd: int) -> Iterator[int]:
    """The signal numbers written to a wakeup pipe, as they come; ends with the pipe."""
    while True:
        try:
            data = os.read(read_fd, 1)
        except OSError:
            return
        if not data:
            return
        yield data[0]


def _watch(read_fd: int) -> None:
    for signum in signals_from(read_fd):
        if signum in STOP_SIGNALS:
            _stop(signum)


def _stop(signum: int) -> None:
    with _STOP.lock:
        if not _STOP.active:
            return  # handed over: the agreed stop's handler has it
        name = signal.Signals(signum).name
        message = f"stopped on {name} while starting, before any training: nothing was lost; the same command resumes"
        if _STOP.on_stop is not None:
            with contextlib.suppress(Exception):  # the record is for `distrain runs`; the exit matters more
                _STOP.on_stop(message)
        sys.stderr.write(f"distrain: {message}\n")
        sys.stderr.flush()
        os._exit(EXIT_PREEMPTED)
