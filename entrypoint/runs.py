"""What a run is, and its state directory: a run only ever resumes itself.

A run is its script and its arguments (plus the Slurm job name and array task), or the name in `DISTRAIN_RUN`:
the same command resumes (a requeue, a resubmission, a rerun); a different one starts fresh in its own
directory. Keying the state by the job id (as before) made a resubmitted job start over, and keying it by the
script's name alone let `train.py --lr 0.5` resume the checkpoint of `train.py --lr 0.01`.

The identity is decided in `detect` (pure); `open_run` is the one place that touches the directory at start-up:
a per-rank lock (a run whose state a live process holds is refused, never trained on twice at once), the
identity check for a directory the user named, `DISTRAIN_RESUME=0`, and the first log line of the run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

IDENTITY_FILE = "run.json"
POSITION_SUFFIX = ".position"  # ckpt-N.position beside each checkpoint: where a resume from it starts
CHIEF_DIR = "chief"  # <stage>/chief/: the chief's checkpoints (ckpt-N.*), the only rank that writes them
STAGE_PREFIX = "fit-"  # fit-<K>/: the checkpoints of the script's K-th fit (the first fit's are in the run dir)
SAVES_RECORD = ".saves"  # how many of the script's saves the chief has made, and the last one's outcome (fit/saves.py)
STOP_COST_FILE = "stop-cost.json"  # what a stop of the run costs, measured (fit/stop_cost.py)


@dataclass(frozen=True)
class Position:
    """Where a fit is, or where a resume from a checkpoint starts, in the one convention every reader keeps
    (checkpoint, resume, stop, stall watchdog, `distrain runs`): `epoch` epochs done, so the 0-based epoch in
    progress; `step` steps of it trained. Recorded beside each checkpoint (`ckpt-N.position`, JSON) with what the
    input keeps there (resume.Start.to_record)."""

    epoch: int
    step: int = 0

    def describe(self, stage: int = 1) -> str:
        """1-based, as the progress bar counts, in the script's fit number `stage` (named from the second on)."""
        fit = f"fit {stage}, " if stage > 1 else ""
        return f"{fit}epoch {self.epoch + 1}, step {self.step + 1}" if self.step else \
            f"{fit}the start of epoch {self.epoch + 1}"


@dataclass(frozen=True)
class RunIdentity:
    name: str  # readable: the script's stem and a digest of the command, or DISTRAIN_RUN
    key: str  # what must match for a resume: the digest of the command, or the DISTRAIN_RUN name
    why: str


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "run"


_LONG_OPTION_WITH_VALUE = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)=(.*)", re.DOTALL)


def spelled_alike(argv: Sequence[str]) -> list[str]:
    """The arguments with `--name=value` spelled `--name value`, as argparse reads both, up to a bare `--` (after
    it every argument is the script's verbatim): retyping a resume command in the other spelling is the same run.
    The other way round cannot be sure (`--flag value` may be a flag and a positional)."""
    spelled: list[str] = []
    for index, argument in enumerate(argv):
        if argument == "--":
            return spelled + list(argv[index:])
        match = _LONG_OPTION_WITH_VALUE.fullmatch(argument)
        spelled += [match[1], match[2]] if match else [argument]
    return spelled


def identity(env: Mapping[str, str], script: str | None, argv: Sequence[str]) -> RunIdentity:
    """The run this command is. Pure: from the environment, the script path and its arguments (option spellings
    argparse reads alike count as one: spelled_alike)."""
    array = env.get("SLURM_ARRAY_TASK_ID")
    suffix = f"-task{_safe(array)}" if array else ""
    named = (env.get("DISTRAIN_RUN") or "").strip()
    if named:
        return RunIdentity(_safe(named) + suffix, "name:" + named + suffix,
                           "named by DISTRAIN_RUN: resumes whatever the arguments")
    command = [os.path.abspath(script) if script else "", *spelled_alike(argv)]
    parts = [*command, "\0job:" + env.get("SLURM_JOB_NAME", ""), "\0array:" + (array or "")]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]
    stem = Path(script).stem if script else "script"
    why = "the script and its arguments" + (" and the Slurm job name" if env.get("SLURM_JOB_NAME") else "")
    return RunIdentity(f"{_safe(stem)}-{digest}{suffix}", digest + suffix, why)


def resume_wanted(env: Mapping[str, str]) -> bool:
    value = (env.get("DISTRAIN_RESUME") or "1").strip().lower()
    if value not in ("0", "1", "no", "yes", "false", "true", "off", "on"):
        raise ConfigError(f"DISTRAIN_RESUME={env['DISTRAIN_RESUME']!r}: expected 1 (resume, the default) or 0")
    return value in ("1", "yes", "true", "on")


_LOCKS: dict[str, int] = {}  # lock path -> file descriptor, held for the life of the process


def _not_held_by_forked_children() -> None:
    """A forked child (a PyDataset's pool worker) shares the lock's open file: one that outlived the run held it,
    and the rerun was refused as "in use" by a dead process. The child lets go of its reference."""
    for fd in _LOCKS.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCKS.clear()


os.register_at_fork(after_in_child=_not_held_by_forked_children)


def _lock(directory: str, rank: int) -> None:
    """Hold `.lock-rank<r>` for the life of this process; refuse if a live process holds it."""
    path = os.path.join(directory, f".lock-rank{rank}")
    if path in _LOCKS:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            holder = Path(path).read_text().strip() or "another process"
            raise ConfigError(
                f"this run's state in {directory} is in use by {holder} (the same command is already running): "
                "wait for it, stop it, or give this one another name with DISTRAIN_RUN") from None
        return  # a filesystem without locks (some Lustre mounts): run unlocked rather than not at all
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode())
    _LOCKS[path] = fd


def chief_dir(state_dir: str) -> str:
    """Where the chief's checkpoints of a fit's state directory are."""
    return os.path.join(state_dir, CHIEF_DIR)


def stage_dir(run_dir: str, stage: int) -> str:
    """Where fit number `stage` of the script (1-based, in call order) keeps its checkpoints: a fine-tuning script's
    second fit never resumes from the first one's, nor the first from the second's. The first fit's is the run
    directory itself, the next ones `fit-<K>` in it."""
    return run_dir if stage == 1 else os.path.join(run_dir, f"{STAGE_PREFIX}{stage}")


def resume_point(run_dir: str) -> tuple[int, Position | None] | None:
    """The fit a rerun resumes in (the highest with a checkpoint) and its recorded position, or None."""
    stages = [1] + [int(m[1]) for m in (re.fullmatch(rf"{STAGE_PREFIX}(\d+)", os.path.basename(d))
                                          for d in glob.glob(os.path.join(run_dir, f"{STAGE_PREFIX}*"))) if m]
    for stage in sorted(stages, reverse=True):
        directory = stage_dir(run_dir, stage)
        if newest_checkpoint(chief_dir(directory)):
            return stage, read_position(directory)
    return None


def checkpoint_number(path: str) -> int:
    """N of a checkpoint's prefix `.../ckpt-N` or of one of its files `.../ckpt-N.<suffix>`."""
    return int(re.match(r"ckpt-(\d+)", os.path.basename(path)).group(1))


def newest_checkpoint(directory: str) -> str | None:
    """The newest complete checkpoint's path prefix (tf_keras: ckpt-N.index; Keras 3: ckpt-N.json), or None."""
    done = glob.glob(os.path.join(directory, "ckpt-*.index")) + glob.glob(os.path.join(directory, "ckpt-*.json"))
    if not done:
        return None
    return os.path.splitext(max(done, key=checkpoint_number))[0]


def read_position(state_dir: str) -> Position | None:
    """The position of the newest complete checkpoint, or None when it records none. Read from the checkpoint's
    own record: one set aside as unreadable takes it along."""
    found = read_checkpoint_record(state_dir)
    return found[0] if found else None


def read_checkpoint_record(state_dir: str) -> tuple[Position, dict] | None:
    """The newest complete checkpoint's position and what it keeps of the input there (write_position), or None
    where it records none."""
    prefix = newest_checkpoint(chief_dir(state_dir))
    if prefix is None:
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(prefix + POSITION_SUFFIX) as handle:
            data = json.load(handle)
        kept = {key: value for key, value in data.items() if key not in ("epoch", "step")}
        return Position(int(data["epoch"]), int(data["step"])), kept
    return None


def write_private_json(path: str, data: dict) -> None:
    """Atomically (temp + rename), 0600 like every file distrain writes in a work dir."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def write_position(checkpoint_prefix: str, position: Position, input_record: Mapping | None = None) -> None:
    """Record beside a checkpoint where a resume from it starts (before the file that marks it complete), and
    what it keeps of the input there (resume.Start.to_record: an unknown length once learnt, the last batch's
    digest)."""
    write_private_json(checkpoint_prefix + POSITION_SUFFIX, {**(input_record or {}), "epoch": position.epoch,
                                                              "step": position.step})


def _recorded(state_dir: str) -> dict | None:
    with contextlib.suppress(OSError, ValueError), open(os.path.join(state_dir, IDENTITY_FILE)) as handle:
        return json.load(handle)
    return None


def _has_state(state_dir: str) -> bool:
    chief = chief_dir(state_dir)
    return resume_point(state_dir) is not None or (os.path.isdir(chief) and bool(os.listdir(chief)))


def open_run(state_dir: str, run: RunIdentity, rank: int, command: Sequence[str], resume: bool,
             user_named_dir: bool, about: Mapping[str, str] | None = None, chosen_by: str = "") -> str:
    """Lock, check and (chief) record the run's state dir; return the run's first log line, which says where the
    state is and why there (`chosen_by`). `about`: what `distrain runs` shows of it (the command that resumes it,
    its Slurm job).

    The chief clears the state for DISTRAIN_RESUME=0 before the engine starts: the strategy's (or Horovod's)
    rendezvous then orders this before any rank's fit reads a checkpoint.
    """
    _lock(state_dir, rank)
    recorded = _recorded(state_dir)
    # DISTRAIN_RUN naming a run that was not named (the name `distrain runs` and a new run's hint show) adopts it
    adopted = bool(recorded) and run.key.startswith("name:") and recorded.get("name") == run.name
    if recorded and recorded.get("key") != run.key and not adopted and resume and _has_state(state_dir):
        where = "DISTRAIN_CHECKPOINT_DIR " if user_named_dir else ""
        raise ConfigError(
            f"{where}{state_dir} holds the state of another run ({recorded.get('name')}: "
            f"{' '.join(recorded.get('command', []))}), not of this one: give this run its own "
            "DISTRAIN_CHECKPOINT_DIR, name both the same with DISTRAIN_RUN to continue it with other arguments, "
            "or set DISTRAIN_RESUME=0 to start over there")
    if rank == 0:
        with contextlib.suppress(FileNotFoundError):  # an earlier attempt's count of the script's saves (fit/saves.py)
            os.unlink(os.path.join(state_dir, SAVES_RECORD))
        if not resume:  # the checkpoints, each rank's own state beside them (rank_state.py), the later fits'
            for kept in (CHIEF_DIR, "ranks", *map(os.path.basename, glob.glob(os.path.join(state_dir, "fit-*")))):
                shutil.rmtree(os.path.join(state_dir, kept), ignore_errors=True)
        write_private_json(os.path.join(state_dir, IDENTITY_FILE),
                            {"name": run.name, "key": run.key, "command": list(command), **(about or {})})
    point = resume_point(state_dir) if resume else None
    state = f"state in {state_dir}{', ' + chosen_by if chosen_by else ''}"
    if point is None:
        again = " (DISTRAIN_RESUME=0: earlier state removed)" if not resume else ""
        return f"new run {run.name}{again} ({state}; the same command resumes it)"
    stage, position = point
    if position is None:
        return f"resuming run {run.name} from its last checkpoint{' in fit ' + str(stage) if stage > 1 else ''} " \
               f"({state})"
    return f"resuming run {run.name} at {position.describe(stage)} ({state})"


def unfinished_alike(state_dir: str, run: RunIdentity, script: str) -> str | None:
    """For a new run that DISTRAIN_RUN does not name: the newest unfinished run of the same script with other
    arguments beside it, and how to continue that one instead; None where there is none. Other arguments are
    another run, and a user who changed `--epochs 50` to `100` expects a continuation: one line says so."""
    if run.key.startswith("name:"):
        return None
    found = []
    for path in glob.glob(os.path.join(os.path.dirname(state_dir), "*", IDENTITY_FILE)):
        directory = os.path.dirname(path)
        recorded = _recorded(directory)
        if directory == state_dir or not recorded or recorded.get("key") == run.key or \
                (recorded.get("command") or [""])[0] != script or (point := resume_point(directory)) is None:
            continue
        found.append((os.path.getmtime(path), recorded, point))
    if not found:
        return None
    _, recorded, (stage, position) = max(found, key=lambda item: item[0])
    where = position.describe(stage) if position else "its last checkpoint"
    arguments = " ".join(recorded["command"][1:]) or "none"
    return (f"run {recorded['name']} of this script with other arguments ({arguments}) stopped unfinished at "
            f"{where}: this is a new run; to continue that one with these arguments, set "
            f"DISTRAIN_RUN={recorded['name']}")
