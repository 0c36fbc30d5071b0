"""Rank-prefixed logging: every line distrain prints says which process wrote it."""

from __future__ import annotations

import logging
import os
import sys

_LOGGER = logging.getLogger("distrain")


def configure(prefix: str) -> logging.Logger:
    """Send distrain's messages to stderr as '<prefix>distrain: message' (the Plan's `line_prefix`: '[rank/size] ',
    or nothing under `distrain launch`)."""
    _LOGGER.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}distrain: %(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    return _LOGGER


def get() -> logging.Logger:
    return _LOGGER


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
