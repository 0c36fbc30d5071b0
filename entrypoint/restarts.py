"""Faults survived without a person: `distrain launch` restarts its workers from the run's last checkpoint.

The most common way a multi-worker job dies is one worker failing (the OOM killer, a segfault in a native
library, a lost connection): the others then fail inside a collective. The launcher tells such a fault (a worker
killed by a signal, a lost peer: exit 4) from the script's own end (exit 1 or its own code), bad input (2), a
machine that cannot run it (3), a stop (75, or a signal the launcher was sent) and restarts every worker on fresh
ports, up to DISTRAIN_MAX_RESTARTS times (default 3; 0: end as before). A stall (exit 4 after a stuck rank was
named) is retried once. The restart resumes exactly from the last checkpoint, so the run ends as the run never
interrupted would (exact resume); it costs the work since that checkpoint, which each restart's line states.
Only with checkpoints on: without them there is nothing to restart from.
"""

from __future__ import annotations

import glob
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from . import runs
from .errors import EXIT_WORKER_FAILED

STALLS_RETRIED = 1  # a stuck rank may be the script's own deadlock: retried once, then the run ends


def fault(ended: Any, stalled: bool) -> str | None:
    """What went wrong, in words, if the way the workers ended is a fault a restart can survive; else None."""
    if ended.stopped or ended.rank is None or ended.raw is None:
        return None
    worker = f"worker {ended.rank} ({ended.workers[ended.rank]})" if ended.workers else f"worker {ended.rank}"
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
    """One launch's restarts: how many are allowed and made, and the run's state directory they resume from."""
    max_restarts: int
    state_dir: str | None
    count: int = 0
    stalls: int = 0
    reasons: list[str] = field(default_factory=list)

    @classmethod
    def detect(cls, script: str, args: list[str]) -> RunOfLaunch:
        """The run the workers will detect (the same script, arguments and environment), without TensorFlow."""
        from .plan import detect

        path = None if script == "bench" else os.path.abspath(script)
        plan = detect(dict(os.environ), script=path, argv=args)
        return cls(plan.max_restarts if plan.checkpoint_dir else 0, plan.checkpoint_dir)

    def _stalled(self) -> bool:
        return bool(self.state_dir and glob.glob(os.path.join(self.state_dir, "stall", "rank*.json")))

    def restart_reason(self, ended: Any) -> str | None:
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
        return f"{what}; restart {self.count} of {self.max_restarts} {self._from_where()}"

    def _from_where(self) -> str:
        point = runs.resume_point(self.state_dir) if self.state_dir else None
        if point is None:
            return "from the start (no checkpoint yet)"
        stage, position = point
        newest = runs.newest_checkpoint(os.path.join(runs.stage_dir(self.state_dir, stage), "chief"))
        at = f" at {runs.describe(**position, stage=stage)}" if position else ""
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
