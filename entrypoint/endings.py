"""How each worker of a run ended, recorded in the run's state directory: `workers/rank<R>.json`.

A worker writes its record when it starts (host, pid, start time) and completes it when it ends (exit code, kind,
one line of why). What ended a step is then known after the fact, whoever started it: a worker killed by a signal
(the OOM killer, a lost node) never completes its record; the others say they lost a peer (exit 4); the script's
own error says exit 1. The launcher and the job scripts' restart rule (restarts.py) read them, and `distrain
runs` shows them. Records from before a step's start are an earlier step's and are ignored by their reader.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import socket
import time

from .runs import write_private_json

FOLDER = "workers"

# What a worker's exit code says, for the restart rule: a fault (restart) or the run's own end (never retried).
KIND_DONE, KIND_SCRIPT, KIND_INPUT, KIND_MACHINE = "done", "script error", "bad input", "machine"
KIND_LOST_PEER, KIND_STALL, KIND_STOPPED = "lost peer", "stall", "stopped"
KINDS_BY_CODE = {0: KIND_DONE, 1: KIND_SCRIPT, 2: KIND_INPUT, 3: KIND_MACHINE, 4: KIND_LOST_PEER, 75: KIND_STOPPED}


def _path(state_dir: str, rank: int) -> str:
    return os.path.join(state_dir, FOLDER, f"rank{rank}.json")


def started(state_dir: str, rank: int, size: int, node: str | None = None) -> None:
    """This worker's record: running on `node` (the Plan's: the name Slurm users know), since now."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.join(state_dir, FOLDER), mode=0o700, exist_ok=True)
        record = {"rank": rank, "size": size, "host": node or socket.gethostname(), "pid": os.getpid(),
                  "started": time.time()}
        write_private_json(_path(state_dir, rank), record)


# TensorFlow's graph errors wrap the error in where the op was defined: "Graph execution error:", "Detected at node",
# the traceback's File lines and their code, "[[{{node ...}}]] [Op:...]". None of it says what failed.
_TRACE = re.compile(r"^(Graph execution error:|Detected at node |File \"|Traceback \(most recent call last\)"
                    r"|\[\[|\[Op:)")
_NAMED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*:")


def one_line(exc: BaseException) -> str:
    """What failed, in one line: `Type: message`; of a multi-line message (TensorFlow's graph errors), its last line
    that is not where-it-happened (a py_function's `KeyError: 'IDS_LOG'`, an op's own message)."""
    lines = str(exc).splitlines()
    said: list[str] = []
    code_follows = False  # a traceback's File line is followed by its source line
    for raw in lines:
        line = raw.strip()
        if not line or code_follows or not line.strip("^~ "):  # a source line, or Python's ^^^ under it
            code_follows = False
            continue
        if _TRACE.match(line):
            code_follows = line.startswith("File ")
            continue
        said.append(line)
    message = said[-1] if said else (lines[0].strip() if lines else "")
    return message if len(lines) > 1 and _NAMED.match(message) else f"{type(exc).__name__}: {message}"


def ended(state_dir: str, rank: int, code: int, why: str = "", kind: str | None = None) -> None:
    """Complete this worker's record: its exit code, what kind of end that is, and why (one line)."""
    path = _path(state_dir, rank)
    with contextlib.suppress(OSError, ValueError):
        with open(path) as handle:
            record = json.load(handle)
        if record.get("pid") != os.getpid():  # another process's record (a later start): not ours to complete
            return
        kind = kind or KINDS_BY_CODE.get(code, KIND_SCRIPT)
        write_private_json(path, {**record, "code": code, "kind": kind, "why": why[:500], "ended": time.time()})


def read(state_dir: str, since: float = 0.0) -> dict[int, dict]:
    """rank -> record, for the workers started at or after `since` (a step's start: earlier records are another
    step's)."""
    records: dict[int, dict] = {}
    for path in glob.glob(os.path.join(state_dir, FOLDER, "rank*.json")):
        match = re.search(r"rank(\d+)\.json$", path)
        with contextlib.suppress(OSError, ValueError):
            with open(path) as handle:
                record = json.load(handle)
            if match and record.get("started", 0) >= since:
                records[int(match.group(1))] = record
    return records
