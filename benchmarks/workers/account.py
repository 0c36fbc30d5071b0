"""Run a command confined to some cores and account for the CPU of every process it starts.

    python benchmarks/workers/account.py CORES COMMAND...        (CORES: "0" or "0,1")

The command and everything it starts inherit the core mask. This process is their child subreaper, so processes
that outlive their parent (distrain's log filter) are reaped here too: the last line, `ACCOUNT {"cpu_s": ...,
"returncode": ...}`, holds the user + system CPU seconds of them all, from the kernel's accounting.
"""

import ctypes
import json
import os
import resource
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    os.sched_setaffinity(0, {int(core) for core in sys.argv[1].split(",")})
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    returncode = subprocess.call(sys.argv[2:])
    while True:  # orphans reparented here
        try:
            os.wait()
        except ChildProcessError:
            break
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print("ACCOUNT " + json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "returncode": returncode}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
