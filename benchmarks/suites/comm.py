"""comm: all-reduce time against tensor size, MWM ring against Horovod Gloo and MPI, and the stop check."""

from __future__ import annotations

from harness import DISTRAIN, MPIRUN, WORKERS, bench_line

from . import Options


def run(options: Options) -> dict:
    smoke = options.smoke
    script = str(WORKERS / "allreduce.py")
    work = ["--sizes", "1000,100000" if smoke else "1000,100000,1000000,4000000", "--reps", "3" if smoke else "20",
            "--stop-checks", "10" if smoke else "100"]
    runs = {
        "mwm ring": ([DISTRAIN, "launch", "-n", "2", script, *work], {"DISTRAIN_COLLECTIVE": "ring"}),
        "horovod gloo": (["horovodrun", "-np", "2", "--gloo", DISTRAIN, "run", script, *work], {}),
        "horovod mpi": ([*MPIRUN, DISTRAIN, "run", script, *work], {}),
    }
    table: dict[str, dict] = {}
    stop_check: dict = {}
    for name, (cmd, extra) in runs.items():
        line = bench_line(cmd, "ALLREDUCE", extra)[0]
        table[name] = line["ms"]
        stop_check = stop_check or line.get("stop_check") or {}
    # the stop check's CPU per call (process, the chief): distrain's eager launcher against the public tf.function
    return {"allreduce_ms_by_elements": table, "stop_check (mwm)": stop_check}

