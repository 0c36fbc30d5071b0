"""The benchmarks' process harness: how a variant is run, confined to a core and accounted for by the kernel, and
how its result is read back (a `BENCH`-like JSON line from its chief). The suites (benchmarks/suites/) build on
it; the scripts it runs are in benchmarks/workers/."""

from __future__ import annotations

import compileall
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "benchmarks" / "workers"
BIN = Path(sys.executable).parent
DISTRAIN = str(BIN / "distrain")
WORKLOAD = str(WORKERS / "workload.py")
ACCOUNT = str(WORKERS / "account.py")
BY_HAND_MWM = str(WORKERS / "by_hand_mwm.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-x", "PATH", "-mca", "btl_tcp_if_include", "lo",
          "-mca", "oob_tcp_if_include", "lo"]


# one intra-op thread per worker and fixed pool sizes, so a pool is sized the same whether TensorFlow started
# before the workload pinned its threads (under distrain) or after (by hand)
PINNED = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "1"}



def env() -> dict[str, str]:
    skip = ("SLURM_", "OMPI_", "PMI", "HOROVOD_", "DISTRAIN_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    base.pop("TF_CONFIG", None)
    base.update(PATH=f"{BIN}:{base.get('PATH', '')}", TF_CPP_MIN_LOG_LEVEL="2", DISTRAIN_CHECKPOINT="0",
                PYTHONUNBUFFERED="1")
    return base


def children_cpu() -> float:
    """User + system CPU seconds of every child process that ended so far, and of theirs (the kernel's account)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_line(cmd: list[str], tag: str = "BENCH", extra_env: dict | None = None) -> tuple[dict, float]:
    """Run a command; return the JSON its chief printed after `tag` (with `cpu_s`: the CPU seconds of all its
    processes) and the wall time it was started at."""
    started, cpu = time.time(), children_cpu()
    out = subprocess.run(cmd, env={**env(), **(extra_env or {})}, cwd=ROOT, text=True, timeout=900,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in out.stdout.splitlines():
        if f"{tag} " in line:
            return {**json.loads(line.split(f"{tag} ", 1)[1]), "cpu_s": children_cpu() - cpu}, started
    raise RuntimeError(f"{' '.join(cmd)} printed no {tag} line (exit {out.returncode}):\n{out.stdout[-3000:]}")


def alternate(variants: dict, reps: int) -> dict[str, list]:
    samples: dict[str, list] = {name: [] for name in variants}
    for _ in range(reps):
        for name, run in variants.items():
            samples[name].append(run())
    return samples


def last_error(output: str) -> str:
    errors = [line for line in output.splitlines() if "Error" in line]
    return (errors or output.splitlines() or ["?"])[-1][:300]


def account_line(output: str) -> dict:
    """What benchmarks/account.py printed last (`ACCOUNT {"cpu_s", "returncode"}`), or {} where it printed none."""
    lines = output.splitlines()
    return json.loads(lines[-1].split("ACCOUNT ", 1)[1]) if lines and "ACCOUNT " in lines[-1] else {}


def side_by_side(first: tuple[list[str], dict], second: tuple[list[str], dict],
                 swap: bool = True) -> tuple[list[dict], list[dict]]:
    """Run two commands at once, each confined to one core (benchmarks/account.py), twice: then on each other's
    core (`swap=False`, for smoke runs: once). Both live through the same seconds of the machine (a VM's
    neighbours and clock move both alike, which alternating runs cannot give: a pure-Python loop run alone varies
    by 6-10% from run to run here, two at once on the two cores by 2%), and a difference between the cores
    cancels out, as does which side starts first. Returns each command's BENCH lines, one per pass, each with
    `cpu_s`: the CPU seconds of all its processes, `wall_s`: its wall time, and `core`."""
    results: list[list[dict]] = [[], []]
    orders = ((0, 1), (1, 0)) if (os.cpu_count() or 1) > 1 else ((0, 0), (0, 0))
    for cores in orders if swap else orders[:1]:
        with tempfile.TemporaryFile(mode="w+") as out_first, tempfile.TemporaryFile(mode="w+") as out_second:
            outputs = (out_first, out_second)
            started = time.monotonic()
            procs: dict[int, subprocess.Popen] = {}
            # the side on the lower core starts first, a few ms ahead: over both orders, each side once
            for side in sorted(range(2), key=lambda side: cores[side]):
                cmd, extra = (first, second)[side]
                procs[side] = subprocess.Popen([sys.executable, ACCOUNT, str(cores[side]), *cmd],
                                               env={**env(), **extra}, cwd=ROOT, text=True, stdout=outputs[side],
                                               stderr=subprocess.STDOUT)
            walls = wait_all([procs[0], procs[1]], started, timeout=1800)
            for output, result, (cmd, _), core, wall in zip(outputs, results, (first, second), cores, walls):
                output.seek(0)
                result.append(accounted_pass(cmd, output.read(), wall, core))
    return results[0], results[1]


def accounted_pass(cmd: list[str], output: str, wall: float, core: int | str) -> dict:
    """One pass of a command run under benchmarks/account.py: its chief's BENCH line, with `cpu_s` (the CPU seconds
    of all its processes), `wall_s` and `core`; a RuntimeError with the output's tail where it printed no BENCH
    line or failed."""
    lines = output.splitlines()
    bench = [line.split("BENCH ", 1)[1] for line in lines if "BENCH " in line]
    account = account_line(output)
    if not bench or account.get("returncode"):
        raise RuntimeError(f"{' '.join(cmd)} printed no BENCH line (exit {account.get('returncode')}):\n"
                           + "\n".join(lines[-40:]))
    return {**json.loads(bench[0]), "cpu_s": account["cpu_s"], "wall_s": wall, "core": core}


def one_after_other(first: tuple[list[str], dict], second: tuple[list[str], dict],
                    swap: bool = True) -> tuple[list[dict], list[dict]]:
    """Run two commands one after the other, each alone on every core, a worker to a core (workload.py --pin):
    first then second, then (`swap`) second then first. For Horovod: two of its ranks on one core, as
    `side_by_side` gives them, make its coordination bistable. Each rank's background thread negotiates with the
    other every HOROVOD_CYCLE_TIME (1 ms); where a round trip through the shared core takes longer than that, the
    threads never sleep and Gloo's receiving loop spins (perf: gloo::transport::tcp::Loop in epoll_wait, 8-9 CPU s
    of a 300-step run against 1-1.5 s). A run falls into that state or not at random, distrain's or not: CPU per
    run 52 or 89 s for the same steps. A core to each rank, as on a real node, never shows it."""
    results: list[list[dict]] = [[], []]
    cores = ",".join(str(core) for core in range(os.cpu_count() or 1))
    order = ((0, first), (1, second))
    for index, (cmd, extra) in (*order, *reversed(order)) if swap else order:
        started = time.monotonic()
        out = subprocess.run([sys.executable, ACCOUNT, cores, *cmd], env={**env(), **extra}, cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
        results[index].append(accounted_pass(cmd, out.stdout, time.monotonic() - started, cores))
    return results[0], results[1]


def wait_all(procs: list[subprocess.Popen], started: float, timeout: float) -> list[float]:
    """Wait for every process; return each one's wall time from `started` (monotonic), to 0.1 s."""
    ended: dict[int, float] = {}
    while len(ended) < len(procs):
        if time.monotonic() - started > timeout:
            raise subprocess.TimeoutExpired([str(p.args) for p in procs], timeout)
        ended.update({i: time.monotonic() - started for i, proc in enumerate(procs)
                      if i not in ended and proc.poll() is not None})
        time.sleep(0.1)
    return [ended[i] for i in range(len(procs))]


def machine() -> dict:
    import tensorflow as tf  # noqa: F401 - version only

    cpu = platform.machine()
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return {"host": platform.node(), "cpu": names[0] if names else cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "tensorflow": tf.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def compile_as_installed() -> None:
    """Give distrain's modules the bytecode an installed distrain has. `pip install` (the image) compiles it; an
    editable install under PYTHONDONTWRITEBYTECODE=1 (this machine's shell sets it) has none, so every process
    would compile distrain from source, about 23 ms of CPU each (3 in a 2-worker MWM run), which no user pays and
    no hand-written baseline does."""
    compileall.compile_dir(str(ROOT / "entrypoint"), quiet=1)

