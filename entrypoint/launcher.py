"""`distrain launch -n N`: N local MWM workers with TF_CONFIG, rank-prefixed output, and a watchdog.

Like horovodrun's launcher: if any worker fails, the others are terminated (then killed) and the launcher
exits non-zero within seconds, naming the rank. A worker that is killed by a signal counts as failed.

It always stops: the first SIGTERM/SIGUSR1/Ctrl-C is forwarded (the workers checkpoint and exit 75); workers
still running `DISTRAIN_KILL_WAIT` seconds later (30, Slurm's KillWait) are killed, and a second Ctrl-C kills
them at once. A worker that exits 75 leaves the others the same time to finish their own checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from . import restarts
from .errors import EXIT_PREEMPTED, EXIT_WORKER_FAILED, ConfigError
from .plan import launch_settings
from .ports import port_free, reserved_ports
from .restarts import Ended


def worker_env(base: dict[str, str], workers: list[str], index: int) -> dict[str, str]:
    env = dict(base)
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
    env["DISTRAIN_MODE"] = "mwm"
    env["DISTRAIN_LAUNCHER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _pump(stream, prefix: str, out) -> None:  # noqa: ANN001
    for line in iter(stream.readline, b""):
        out.buffer.write(prefix.encode() + line)
        out.flush()
    stream.close()


def _own_process_group() -> dict:
    """Popen arguments that make the child lead a process group of its own, in this session (`process_group`
    from Python 3.11; before it, setpgrp in the child)."""
    return {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def launch(n: int, script: str, args: list[str], port: int | None = None, grace: float = 5.0) -> int:
    """Run N workers; return 0 if all succeeded, else the first failure's code (EXIT_WORKER_FAILED if killed).
    A fault (a worker killed, a lost peer) restarts them all from the run's last checkpoint (restarts.py)."""
    if n < 1:
        raise ConfigError(f"-n {n}: need at least one worker")
    settings = launch_settings(os.environ)
    run = restarts.RunOfLaunch.detect(script, args)
    resume = shlex.join(["distrain", "launch", "-n", str(n), os.path.abspath(script) if script != "bench" else script,
                         *args])
    extra: dict[str, str] = {"DISTRAIN_RESUME_COMMAND": settings.resume_command or resume}
    while True:
        ended = _attempt(n, script, args, port, grace, settings.kill_wait, extra)
        why = run.restart_reason(ended)
        if why is None:
            break
        sys.stderr.write(f"distrain launch: {why}\n")
        sys.stderr.flush()
        extra["DISTRAIN_RESUME"] = "1"  # a restart resumes, even a run started over with DISTRAIN_RESUME=0
    _say_how_it_ended(ended, settings.kill_wait)
    if run.count:
        sys.stderr.write(f"distrain launch: {run.summary(ended.code)}\n")
    return ended.code


def _attempt(n: int, script: str, args: list[str], port: int | None, grace: float, wait_after_signal: float,
             extra: dict[str, str]) -> Ended:
    if port is not None:
        chosen = list(range(port, port + n))
        busy = [p for p in chosen if not port_free(p)]
        if busy:
            raise ConfigError(f"port(s) {', '.join(map(str, busy))} already in use: choose another --port")
        reservation: contextlib.AbstractContextManager[list[int]] = contextlib.nullcontext(chosen)
    else:
        reservation = reserved_ports(n)  # held until the workers end: no other launch draws them meanwhile; a
    with reservation as ports:  # restart draws fresh ones (the old ones may linger in TIME_WAIT)
        return _run_workers(script, args, [f"localhost:{p}" for p in ports], grace, wait_after_signal, extra)


def _say_how_it_ended(ended: Ended, wait_after_signal: float) -> None:
    """The launch's last line, after everything the workers printed."""
    if ended.rank is None:
        return
    if ended.raw is not None and ended.raw < 0:
        sys.stderr.write(f"distrain: error: lost worker {ended.rank} ({ended.workers[ended.rank]}): killed by "
                         f"{signal.Signals(-ended.raw).name}; the other workers were stopped; rerun to resume from "
                         "the last checkpoint\n")
        return
    how = f"exited with code {ended.raw}"
    if ended.raw == EXIT_PREEMPTED:
        how = "stopped (exit 75: the same command resumes)"
    sys.stderr.write(f"distrain launch: worker {ended.rank} {how}; the other workers were stopped\n")


def _run_workers(script: str, args: list[str], workers: list[str], grace: float, wait_after_signal: float,
                 extra: dict[str, str]) -> Ended:
    procs, pumps = _start_workers(script, args, workers, extra)
    forward = _Forwarder(procs)
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, forward)
    failed, codes, killed_after_signal = _watch(procs, forward, wait_after_signal)
    if failed is not None and not killed_after_signal:
        _stop_all(procs, grace)
    for thread in pumps:
        thread.join(timeout=2)
    stopped = bool(forward.signalled)
    if forward.interrupted:
        sys.stderr.write("distrain launch: interrupted (a second Ctrl-C): the workers were killed\n")
        return Ended(130, stopped=True)
    if killed_after_signal:
        stuck = [i for i, c in enumerate(codes) if c is None]
        sys.stderr.write(f"distrain launch: worker(s) {', '.join(map(str, stuck))} had not stopped "
                         f"{wait_after_signal:g} s after the stop (DISTRAIN_KILL_WAIT): killed\n")
        first_signal = forward.signalled[0][0] if forward.signalled else None
        code = failed[1] if failed and failed[1] == EXIT_PREEMPTED else 128 + first_signal if first_signal else 137
        return Ended(code, stopped=True)
    if failed is None:
        return Ended(0, stopped=stopped)
    rank, code = failed
    return Ended(EXIT_WORKER_FAILED if code < 0 else code, rank, code, tuple(workers), stopped)


def _start_workers(script: str, args: list[str], workers: list[str],
                   extra: dict[str, str]) -> tuple[list[subprocess.Popen], list[threading.Thread]]:
    """Start one worker per address, each with its TF_CONFIG, and a thread that prefixes its output."""
    n = len(workers)
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    for index in range(n):
        env = worker_env({**os.environ, **extra}, workers, index)
        command = ["bench"] if script == "bench" else ["run", script]  # `distrain launch -n 2 bench ...`
        # each worker leads a process group of its own (Ctrl-C reaches the launcher alone, which forwards it; a
        # stop signals the worker's whole group) but stays in the launcher's session: a session each puts each
        # worker in a scheduler autogroup of its own, and workers sharing cores then preempt each other 2-3 times
        # as often (2 workers on one core: 44,000 involuntary switches in 20 s against 16,000-19,000, #21). No
        # terminal input: a background group that reads the terminal would be stopped (SIGTTIN)
        proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", *command, *args], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **_own_process_group(),
        )
        procs.append(proc)
        prefix = f"[{index}/{n}] " if n > 1 else ""
        thread = threading.Thread(target=_pump, args=(proc.stdout, prefix, sys.stdout), daemon=True)
        thread.start()
        pumps.append(thread)
    return procs, pumps


class _Forwarder:
    """The launcher's handler of SIGTERM, SIGUSR1 and Ctrl-C: passed on to every worker (preemption reaches them
    all); a second Ctrl-C kills them at once."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self.signalled: list[tuple[int, float]] = []  # (signal, when) the launcher got
        self.interrupted = False  # a second Ctrl-C

    def __call__(self, signum: int, frame: object) -> None:  # noqa: ARG002
        if signum == signal.SIGINT and any(s == signal.SIGINT for s, _ in self.signalled):
            self.interrupted = True
            _kill_all(self.procs)  # the second Ctrl-C: now
            return
        self.signalled.append((signum, time.monotonic()))
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)


def _watch(procs: list[subprocess.Popen], forward: _Forwarder,
           wait_after_signal: float) -> tuple[tuple[int, int] | None, list[int | None], bool]:
    """Wait until the workers end, one fails (its root cause), or a stop outlasts DISTRAIN_KILL_WAIT (killed).
    Returns (the failure, the exit codes, whether they were killed after a stop)."""
    failed: tuple[int, int] | None = None
    stopping_since: float | None = None  # a worker exited 75: the others are finishing their checkpoint
    with _woken_by_signals() as wait:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if all(c is not None for c in codes):
                return failed or _root_cause(bad), codes, False
            if bad and failed is None:
                failed = _root_cause(bad)
                if failed[1] != EXIT_PREEMPTED:
                    return failed, codes, False
                stopping_since = time.monotonic()
            started = [t for _, t in forward.signalled] + ([stopping_since] if stopping_since else [])
            left = min(started) + wait_after_signal - time.monotonic() if started else None
            if left is not None and left < 0:
                _kill_all(procs)
                return failed, codes, True
            wait(left)  # until a worker exits or a signal comes: no wake-ups while they train


@contextlib.contextmanager
def _woken_by_signals() -> Iterator[Callable[[float | None], None]]:
    """A wait (of at most some seconds, or None: as long as it takes) that ends at once when a signal comes in: a
    worker's exit (SIGCHLD) or a stop to forward. The signal's byte waits in a pipe (signal.set_wakeup_fd), so
    none is missed between a poll and the wait. Nothing else wakes the launcher: on a VM a wake-up costs 0.2-1 ms
    of CPU (measured: a 1 s poll cost 1.2 ms a second idle, 3 ms a second beside two training workers on their
    core, 0.3 s of a 90 s run; polling 10 times a second cost 2 ms a second)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd)
    previous_handler = signal.signal(signal.SIGCHLD, lambda *_: None)  # the default ignores it: no byte written

    def wait(seconds: float | None) -> None:
        select.select([read_fd], [], [], None if seconds is None else max(seconds, 0.0))
        with contextlib.suppress(BlockingIOError):
            while os.read(read_fd, 512):
                pass

    try:
        yield wait
    finally:
        signal.signal(signal.SIGCHLD, previous_handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)


def _root_cause(bad: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Of the workers that failed at once, the one killed by a signal, else one that did not only lose a peer:
    the others' exit 4 (a lost peer) follows from it."""
    def blame(rank_code: tuple[int, int]) -> tuple[bool, bool, int]:
        rank, code = rank_code
        return code >= 0, code == EXIT_WORKER_FAILED, rank

    return min(bad, key=blame) if bad else None


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.killpg(proc.pid, sig)


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _signal_group(p, signal.SIGKILL)
    for p in procs:
        p.wait()


def _stop_all(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    _kill_all(procs)
