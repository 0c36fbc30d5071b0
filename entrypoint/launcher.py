"""`distrain launch -n N`: N local MWM workers with TF_CONFIG, rank-prefixed output, and a watchdog.

Like horovodrun's launcher: if any worker fails, the others are terminated (then killed) and the launcher
exits non-zero within seconds, naming the rank. A worker that is killed by a signal counts as failed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import closing

from .errors import EXIT_PREEMPTED, EXIT_WORKER_FAILED, ConfigError


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free now (bind to :0, read, close): measured reliable on one host."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _port_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def worker_env(base: dict[str, str], workers: list[str], index: int, run_id: str) -> dict[str, str]:
    env = dict(base)
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
    env["DISTRAIN_MODE"] = "mwm"
    env["DISTRAIN_LAUNCHER"] = "1"
    env.setdefault("DISTRAIN_RUN_ID", run_id)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _pump(stream, prefix: str, out) -> None:  # noqa: ANN001
    for line in iter(stream.readline, b""):
        out.buffer.write(prefix.encode() + line)
        out.flush()
    stream.close()


def launch(n: int, script: str, args: list[str], port: int | None = None, grace: float = 5.0,
           run_id: str | None = None) -> int:
    """Run N workers; return 0 if all succeeded, else the first failure's code (EXIT_WORKER_FAILED if killed)."""
    if n < 1:
        raise ConfigError(f"-n {n}: need at least one worker")
    if port is not None:
        ports = list(range(port, port + n))
        busy = [p for p in ports if not _port_free(p)]
        if busy:
            raise ConfigError(f"port(s) {', '.join(map(str, busy))} already in use: choose another --port")
    else:
        ports = free_ports(n)
    workers = [f"localhost:{p}" for p in ports]
    run_id = run_id or f"launch-{os.getpid()}"
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    for index in range(n):
        env = worker_env(dict(os.environ), workers, index, run_id)
        command = ["bench"] if script == "bench" else ["run", script]  # `distrain launch -n 2 bench ...`
        proc = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", *command, *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        procs.append(proc)
        prefix = f"[{index}/{n}] " if n > 1 else ""
        thread = threading.Thread(target=_pump, args=(proc.stdout, prefix, sys.stdout), daemon=True)
        thread.start()
        pumps.append(thread)

    def forward(signum: int, frame) -> None:  # noqa: ANN001, ARG001 - preemption reaches every worker
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, forward)

    failed: tuple[int, int] | None = None
    while True:
        codes = [p.poll() for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            failed = bad[0]
            break
        if all(c == 0 for c in codes):
            break
        time.sleep(0.1)
    if failed is not None:
        _stop_all(procs, grace)
    for thread in pumps:
        thread.join(timeout=2)
    if failed is None:
        return 0
    rank, code = failed
    if code < 0:  # killed: the last line says so, after everything the workers printed
        sys.stderr.write(f"distrain: error: lost worker {rank} ({workers[rank]}): killed by "
                         f"{signal.Signals(-code).name}; the other workers were stopped; rerun to resume from the "
                         "last checkpoint\n")
        return EXIT_WORKER_FAILED
    how = f"exited with code {code}"
    if code == EXIT_PREEMPTED:
        how = "stopped after a checkpoint (exit 75: rerun to resume)"
    sys.stderr.write(f"distrain launch: worker {rank} {how}; the other workers were stopped\n")
    return code


def _stop_all(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
