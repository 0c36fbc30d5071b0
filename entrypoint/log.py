"""Rank-prefixed logging: every line distrain prints says which process wrote it."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

_LOGGER = logging.getLogger("distrain")


def configure(prefix: str) -> logging.Logger:
    """Send distrain's messages to stderr as '<prefix>distrain: message' (the Plan's `line_prefix`: '[rank/size] ',
    or nothing under `distrain launch`)."""
    _LOGGER.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OnItsOwnLine(f"{prefix}distrain: %(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    return _LOGGER


def get() -> logging.Logger:
    return _LOGGER


class _OnItsOwnLine(logging.Formatter):
    """distrain's line, after a newline where the script's output stopped mid-line (a progress bar's)."""

    def format(self, record: logging.LogRecord) -> str:
        return line_start() + super().format(record)


class _LineEnd:
    """sys.stdout as it was, remembering whether what was last written through it ended a line."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.at_line_start = stream, True

    def write(self, text: str) -> int:
        if text:
            self.at_line_start = text.endswith(("\n", "\r"))
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def track_stdout() -> None:
    """Remember where the script's output stands (its progress bar mid-line), for distrain's lines: a progress
    bar's line left unfinished in the job's log would otherwise carry distrain's line at its end."""
    if not isinstance(sys.stdout, _LineEnd) and sys.stdout is not None:
        # patch: log.stdout_line_end
        sys.stdout = _LineEnd(sys.stdout)


def line_start() -> str:
    """What a distrain line must begin with to start on a line of its own: a newline after an unfinished one."""
    stdout = sys.stdout
    if isinstance(stdout, _LineEnd) and not stdout.at_line_start:
        stdout.flush()
        return "\n"
    return ""


# TensorFlow's and gRPC's C++ INFO lines (absl format: `I0000 00:00:1795334957.019023    4995 file.cc:464] ...`)
# and absl's "before InitializeLog" notice. No environment variable silences them on TF 2.17/2.21 (checked:
# TF_CPP_MIN_LOG_LEVEL=3, GRPC_VERBOSITY=NONE, GLOG_minloglevel): they are dropped on the way to stderr.
# Warnings (W...) and errors (E..., F...) pass.
CPP_CHATTER = rb"^(I\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] |WARNING: All log messages before absl::InitializeLog)"

_FILTER = f"""
import re, signal, sys
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)  # the job's signals are for the worker; this filter ends at EOF
chatter = re.compile({CPP_CHATTER!r})
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not chatter.match(line):
        out.write(line)
        out.flush()
"""


_FILTERED_IN: int | None = None  # the process whose stderr goes through the filter (a forked child: not it)


def quiet_native_logs(verbose: bool = False) -> None:
    """Send this process's stderr (fd 2) through a filter that drops C++ INFO chatter; verbose (the Plan's
    DISTRAIN_VERBOSE=1) keeps it.

    A separate process, not a thread: it outlives this one (os._exit, SIGKILL) long enough to pass on every line
    written before, and ignores the TERM that Slurm and the launcher send to the whole step.
    """
    import subprocess

    global _FILTERED_IN
    if verbose or os.getpid() == _FILTERED_IN:
        return
    sys.stderr.flush()
    filt = subprocess.Popen([sys.executable, "-S", "-c", _FILTER], stdin=subprocess.PIPE, stdout=2,
                            start_new_session=True)
    os.dup2(filt.stdin.fileno(), 2)
    filt.stdin.close()
    _FILTERED_IN = os.getpid()
    _FILTER_PIDS.add(filt.pid)


_FILTER_PIDS: set[int] = set()  # the filter processes: spared when a worker ends its descendants (descendants.py)


def filter_processes() -> frozenset[int]:
    """The log filter's process (a child of this one), which must outlive it to pass on its last lines."""
    return frozenset(_FILTER_PIDS)
