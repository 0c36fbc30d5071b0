"""What `distrain runs` shows: each run under an output directory, read from its state directory alone.

A run's directory holds what it is (`run.json`: its command, the command that resumes it, its Slurm job), how each
worker ended (`workers/`, endings.py), where a resume starts (the newest checkpoint's position, runs.py) and its
restarts (`restarts.json`). A run is live when a worker's lock is held by a process on this host, or when `squeue`
shows its job; only then is it "running". Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import glob
import json
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass

from . import endings, restarts, runs

SQUEUE_TIMEOUT = 10.0  # seconds: a slow slurmctld must not hang the listing


@dataclass(frozen=True)
class RunView:
    name: str
    directory: str
    command: list[str]
    resume: str  # the command that resumes it, as its start recorded it
    state: str  # running (as job J / pid P on host H), finished, stopped at ..., failed with exit X, ...
    live: bool
    last_checkpoint: float | None  # when the newest checkpoint was written (seconds since the epoch)
    size_bytes: int
    restarts: int  # in total, over its launches and jobs
    job: str | None
    stop_cost: dict  # the longest epoch end and checkpoint write measured (fit/stop_cost.py), and the job's lead

    def as_json(self) -> dict:
        return asdict(self)


def _json(path: str) -> dict:
    with contextlib.suppress(OSError, ValueError), open(path) as handle:
        return json.load(handle)
    return {}


def _lock_held(path: str) -> bool:
    """A worker's `.lock-rank<R>` held by a live process on this host (runs._lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EACCES)
    finally:
        os.close(fd)


def _queued_jobs() -> set[str]:
    """The ids of this user's jobs Slurm still holds (one squeue for the whole listing). %A: a job array's task
    is listed by the id it has in SLURM_JOB_ID, not as base_index. Inside the image (bin/distrain on a login node)
    there is no squeue: the host's list comes in DISTRAIN_QUEUED_JOBS."""
    if not shutil.which("squeue"):
        return set(os.environ.get("DISTRAIN_QUEUED_JOBS", "").split())
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run(["squeue", "-u", getpass.getuser(), "-h", "-o", "%A"], capture_output=True, text=True,
                             timeout=SQUEUE_TIMEOUT)
        return set(out.stdout.split())
    return set()


def _size(directory: str) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _last_checkpoint(directory: str) -> float | None:
    pattern = os.path.join(directory, "**", runs.CHIEF_DIR, "ckpt-*")
    found = [os.path.getmtime(p) for p in glob.glob(pattern, recursive=True)]
    return max(found) if found else None


NO_CHECKPOINT = "no checkpoint yet"


def describe_stop_cost(cost: dict) -> str:
    """What a stop of this run needs, measured: the rule for a job's --signal lead (README, Reliability)."""
    if "epoch_end_seconds" not in cost and "checkpoint_seconds" not in cost:
        return "not measured yet (after its first epoch)"
    lead, writes = cost.get("lead_seconds"), cost.get("checkpoint_writes") or []
    typical = f" (a write {statistics.median(writes[1:]):.2f} s, the first {writes[0]:.2f} s with Keras' " \
              "warm-up)" if len(writes) > 1 else ""
    blocks = cost.get("checkpoint_blocked") or []  # the first apart too: it carries the warm-up
    held = f", training held {statistics.median(blocks[1:] or blocks):.2f} s by each" if blocks else ""
    return (f"an epoch's end up to {cost.get('epoch_end_seconds', 0):.1f} s (validation, callbacks, checkpoint), "
            f"a checkpoint up to {cost.get('checkpoint_seconds', 0):.1f} s{typical}{held}"
            + (f"; the job's signal lead {lead:.0f} s" if lead else ""))
# A finished run keeps no checkpoint to resume from (fit/stages.py): its command, run again, trains it again.
RERUN_OF_FINISHED = "nothing to resume: it finished; its command, run again, trains it again from the start"


def _where(directory: str) -> str:
    point = runs.resume_point(directory)
    if point is None:
        return NO_CHECKPOINT
    stage, position = point
    return f"at {position.describe(stage)}" if position else \
        f"at its last checkpoint{' in fit ' + str(stage) if stage > 1 else ''}"


def _state(directory: str, records: dict[int, dict], live: bool, job: str | None) -> str:
    size = max((int(r.get("size", 1)) for r in records.values()), default=1)
    codes = [r.get("code") for r in records.values()]
    if not live and records and all(code == 0 for code in codes) and len(records) >= size:
        return f"finished {age(max(r.get('ended', 0) for r in records.values()))}"
    where = _where(directory)
    if live:
        running = [r for r in records.values() if "code" not in r]
        first = min(running or records.values(), key=lambda r: r.get("rank", 0), default={})
        who = f"as job {job}" if job else f"as pid {first.get('pid', '?')}"
        return f"running {who} on {first.get('host', '?')} ({where})"
    if not records:
        return f"not started ({where})" if where == NO_CHECKPOINT else f"stopped ({where})"
    ended = restarts.step_ended(records, size, next((c for c in codes if c not in (None, 0)), 1))
    if ended.stopped:
        return f"stopped {where}"
    if ended.vanished or (ended.raw is not None and ended.raw < 0) or ended.rank is None:
        return f"ended without a word: killed? ({where})"
    why = records.get(ended.rank, {}).get("why", "")
    return f"failed with exit {ended.code} on rank {ended.rank}{': ' + why if why else ''} ({where})"


def view(directory: str, queued: set[str]) -> RunView:
    """One run, from its directory; `queued`: the job ids squeue still shows (_queued_jobs)."""
    about = _json(os.path.join(directory, runs.IDENTITY_FILE))
    records = endings.read(directory)
    job = about.get("job")
    live = any(_lock_held(p) for p in glob.glob(os.path.join(directory, ".lock-rank*"))) or job in queued
    return RunView(
        name=about.get("name", os.path.basename(directory)), directory=directory,
        command=list(about.get("command", [])), resume=about.get("resume", ""),
        state=_state(directory, records, live, job), live=live, last_checkpoint=_last_checkpoint(directory),
        size_bytes=_size(directory), restarts=int(_json(os.path.join(directory, restarts.COUNT_FILE)).get("total", 0)),
        job=job, stop_cost=_json(os.path.join(directory, runs.STOP_COST_FILE)))


def find(output_dir: str) -> list[RunView]:
    """Every run under `output_dir` (its `runs/` folder), the most recently changed first."""
    directories = [d for d in glob.glob(os.path.join(output_dir, "runs", "*")) if os.path.isdir(d)]
    queued = _queued_jobs() if directories else set()
    views = [view(d, queued) for d in directories]
    return sorted(views, key=lambda v: -(v.last_checkpoint or os.path.getmtime(v.directory)))


def one(found: list[RunView], name: str) -> RunView | None:
    """Of the runs `found`, the one named `name`: its directory's name, its DISTRAIN_RUN name, or a unique prefix
    of either."""
    exact = [v for v in found if name in (v.name, os.path.basename(v.directory))]
    prefixed = [v for v in found if v.name.startswith(name) or os.path.basename(v.directory).startswith(name)]
    match = exact or (prefixed if len(prefixed) == 1 else [])
    return match[0] if match else None


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"


def age(when: float | None) -> str:
    if when is None:
        return "-"
    seconds = max(0, int(time.time() - when))
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds // length} {unit} ago"
    return f"{seconds} s ago"
