"""The processes a worker leaves behind when it ends: none.

A script's data workers (a PyDataset's or Sequence's process pool, its own multiprocessing) are this process's
descendants. Under plain python the job's signal ends them with it; distrain catches that signal to checkpoint
first, and its exits (`os._exit`: the interpreter's teardown can hang in MWM's collectives) run no pool's cleanup:
pool workers outlived a stopped run for 45 minutes. Before such an exit every descendant is killed, but the log
filter (log.py), which passes on the last lines and ends by itself at end of input.
"""

from __future__ import annotations

import contextlib
import os
import signal


def _children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int | None = None) -> list[int]:
    """The processes descended from `pid` (this one), children first."""
    children, found, todo = _children_by_parent(), [], [pid or os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(spare: frozenset[int] = frozenset()) -> int:
    """SIGKILL every descendant of this process but `spare` and theirs; how many were killed."""
    killed = 0
    for pid in descendants():
        if pid in spare:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
