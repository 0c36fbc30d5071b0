"""Faults survived without a person: `distrain launch` restarts its workers from the run's last checkpoint.

The most common way a multi-worker job dies is one worker failing (the OOM killer, a segfault in a native
library, a lost connection): the others then fail inside a collective. The launcher tells such a fault (a worker
killed by a signal, a lost peer: exit 4) from the script's own end (exit 1 or its own code), bad input (2), a
machine that cannot run it (3), a stop (75, or a signal the launcher was sent) and restarts every worker on fresh
ports, up to DISTRAIN_MAX_RESTARTS times (default 3; 0: end as before). A stall (exit 4 after a stuck rank was
named) is retried once. The restart resumes exactly from the last checkpoint, so the run ends as the run never
interrupted would (exact resume); it costs the work since that checkpoint, which each restart's line states.
Only with checkpoints on: without them there is nothing to restart from.

Under the job scripts (jobs/lib.sh) the same rule decides, after a Slurm step ended, from what each worker recorded
of its end (endings.py): `distrain restart-check` runs the step again in the same allocation, or asks for a
requeue when no worker started at all (a node down), or ends the job. The count is kept in the run's state
(`restarts.json`): per launch or per job allocation, and in total for `distrain runs`.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import time
from dataclasses import dataclass, field

from . import endings, runs
from .errors import EXIT_PREEMPTED, EXIT_WORKER_FAILED
from .runs import write_private_json

STALLS_RETRIED = 1  # a stuck rank may be the script's own deadlock: retried once, then the run ends
COUNT_FILE = "restarts.json"  # in the run's state dir: this launch's (or job's) restarts and the run's total
CLOCK_SKEW = 2.0  # seconds: a worker's start time on another node, read against the batch host's clock


@dataclass(frozen=True)
class Ended:
    """How one attempt's workers ended: the exit code the launch would have, and the worker that caused it."""
    code: int
    rank: int | None = None  # the root cause's worker
    raw: int | None = None  # its own exit status (negative: the signal that killed it)
    workers: tuple[str, ...] = ()
    stopped: bool = False  # a stop the launcher was sent (a signal, Ctrl-C): never a fault
    vanished: bool = False  # it ended without a word (no exit status known: killed, or its node lost)
    started: bool = True  # False: no worker of the step started (the step could not get its nodes)


def step_ended(records: dict[int, dict], size: int, code: int, killed_first: int | None = None) -> Ended:
    """How a Slurm step ended, from srun's exit code and what its workers recorded (endings.py): the script's
    own end first (the others' lost peer follows from it), then a worker that ended without a word, then a lost
    peer. When several ended without a word (Slurm's KillWait ends the survivor before it can say it lost a peer),
    the root cause is the task srun reported killed first (`killed_first`, from its log), not the lowest rank."""
    if code == 0:
        return Ended(0)
    if not records:
        return Ended(code, started=False)
    hosts = tuple(str(records.get(rank, {}).get("host", "?")) for rank in range(size))
    own = sorted((rank, r["code"]) for rank, r in records.items() if r.get("code") not in (None, 0, EXIT_WORKER_FAILED,
                                                                                         EXIT_PREEMPTED))
    if own:
        return Ended(own[0][1], own[0][0], own[0][1], hosts)
    silent = sorted(rank for rank in range(size) if "code" not in records.get(rank, {}))
    if silent:
        signal_number = code - 128 if 128 < code < 128 + 65 else None  # srun: 128 + the signal of a killed task
        cause = killed_first if killed_first in silent else silent[0]
        return Ended(EXIT_WORKER_FAILED, cause, -signal_number if signal_number else None, hosts,
                     vanished=signal_number is None)
    lost = sorted(rank for rank, r in records.items() if r.get("code") == EXIT_WORKER_FAILED)
    if lost:
        return Ended(EXIT_WORKER_FAILED, lost[0], EXIT_WORKER_FAILED, hosts)
    stopped = sorted(rank for rank, r in records.items() if r.get("code") == EXIT_PREEMPTED)
    return Ended(code, stopped[0] if stopped else None, code, hosts, stopped=bool(stopped))


EXIT_RESTART, EXIT_END, EXIT_REQUEUE = 0, 1, 10  # `distrain restart-check`'s answers to jobs/lib.sh


def step_verdict(script: str, args: list[str], code: int, since: float,
                 killed_first: int | None) -> tuple[int, str | None]:
    """jobs/lib.sh's question after a Slurm step failed (`distrain restart-check`, in the batch shell): restart it,
    end the job or requeue it, and the one line that says why."""
    from .plan import batch_shell

    shell = batch_shell(os.environ)
    run = RunOfLaunch.detect(script, args, session=shell.session)
    records = run.step_records(since)
    ended = step_ended(records, shell.tasks or max(records, default=0) + 1, code, killed_first)
    if not ended.started:
        return EXIT_REQUEUE, f"no worker of the step started (srun exit {code}: a node down?)"
    why = run.restart_reason(ended)
    if why is not None:
        return EXIT_RESTART, why
    return EXIT_END, run.summary(ended.code) if run.count or run.reasons else None


def fault(ended: Ended, stalled: bool) -> str | None:
    """What went wrong, in words, if the way the workers ended is a fault a restart can survive; else None."""
    worker = f"worker {ended.rank} ({ended.workers[ended.rank]})" if ended.workers else f"worker {ended.rank}"
    if ended.vanished and not ended.stopped:
        return f"{worker} ended without a word (killed, or its node was lost)"
    if ended.stopped or ended.rank is None or ended.raw is None:
        return None
    if ended.raw < 0:
        name = signal.Signals(-ended.raw).name
        return f"{worker} was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    if ended.raw == EXIT_WORKER_FAILED:
        return f"a rank stalled ({worker} ended it)" if stalled else f"{worker} lost a peer"
    return None


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


@dataclass
class RunOfLaunch:
    """One launch's (or job allocation's) restarts: how many are allowed and made, and the run's state directory
    they resume from and keep their count in."""
    max_restarts: int
    state_dir: str | None
    session: str = ""  # whose count this is: a launch (its pid) or a job allocation (job id, requeue count)
    count: int = 0
    stalls: int = 0
    reasons: list[str] = field(default_factory=list)

    @classmethod
    def detect(cls, script: str, args: list[str], session: str = "") -> RunOfLaunch:
        """The run the workers will detect (the same script, arguments and environment), without TensorFlow; its
        count so far in this session (a job's earlier steps)."""
        from .plan import detect

        path = None if script == "bench" else os.path.abspath(script)
        env = dict(os.environ)
        if session.startswith("job "):  # the batch shell: not a step's task; only the run and its settings count
            env["DISTRAIN_MODE"] = "single"
        plan = detect(env, script=path, argv=args)
        allowed = plan.max_restarts if plan.checkpoint_dir else 0
        run = cls(allowed, plan.checkpoint_dir, session or f"launch {os.getpid()}")
        kept = run._kept()
        if kept.get("session") == run.session:
            run.count, run.stalls, run.reasons = kept.get("count", 0), kept.get("stalls", 0), kept.get("reasons", [])
        return run

    def _kept(self) -> dict:
        if not self.state_dir:
            return {}
        with contextlib.suppress(OSError, ValueError), open(os.path.join(self.state_dir, COUNT_FILE)) as handle:
            return json.load(handle)
        return {}

    def _keep(self) -> None:
        if self.state_dir:
            total = self._kept().get("total", 0) + 1
            with contextlib.suppress(OSError):
                write_private_json(os.path.join(self.state_dir, COUNT_FILE), {
                    "session": self.session, "count": self.count, "stalls": self.stalls, "reasons": self.reasons,
                    "total": total, "time": time.time()})

    def step_records(self, since: float) -> dict[int, dict]:
        """What the workers of the step started at `since` recorded of their end."""
        return endings.read(self.state_dir, since - CLOCK_SKEW) if self.state_dir else {}

    def _stalled(self) -> bool:
        return bool(self.state_dir and glob.glob(os.path.join(self.state_dir, "stall", "rank*.json")))

    def restart_reason(self, ended: Ended) -> str | None:
        """The line that announces a restart, or None when the run ends here."""
        stalled = self._stalled()
        what = fault(ended, stalled)
        if what is None or self.count >= self.max_restarts or (stalled and self.stalls >= STALLS_RETRIED):
            if what is not None:
                self.reasons.append(what)
            return None
        self.count += 1
        self.stalls += stalled
        self.reasons.append(what)
        self._keep()
        return f"{what}; restart {self.count} of {self.max_restarts} {self._from_where()}"

    def _from_where(self) -> str:
        point = runs.resume_point(self.state_dir) if self.state_dir else None
        if point is None:
            return "from the start (no checkpoint yet)"
        stage, position = point
        newest = runs.newest_checkpoint(runs.chief_dir(runs.stage_dir(self.state_dir, stage)))
        at = f" at {position.describe(stage)}" if position else ""
        written = [os.path.getmtime(p) for p in glob.glob(f"{newest}.*")] if newest else []
        lost = f" (lost: the work since it, {_duration(time.time() - max(written))})" if written else ""
        return f"from the checkpoint{at}{lost}"

    def summary(self, code: int) -> str:
        """The launch's last line when it restarted: how many restarts it took, or that it gave up."""
        if code == 0:
            return f"finished after {self.count} restart(s) ({'; '.join(self.reasons)})"
        if self.count >= self.max_restarts and self.reasons and len(self.reasons) > self.count:
            return f"gave up after {self.count} restart(s) (DISTRAIN_MAX_RESTARTS={self.max_restarts}): " \
                   f"{self.reasons[-1]}"
        return f"ended with exit {code} after {self.count} restart(s)"
