"""Two MultiWorkerMirrored workers with a TF_CONFIG written by hand, the way the user guides start them.

    python benchmarks/workers/by_hand_mwm.py PYTHON SCRIPT ARGS...

Prints worker 0's output, then the others'.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile

from entrypoint.ports import free_ports  # a port-picking helper, not distribution code


def main() -> int:
    workers = [f"localhost:{port}" for port in free_ports(2)]
    with contextlib.ExitStack() as stack:
        outputs = [stack.enter_context(tempfile.TemporaryFile()) for _ in workers]
        procs = []
        for index, output in enumerate(outputs):
            config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            procs.append(subprocess.Popen(sys.argv[1:], stdout=output, stderr=subprocess.STDOUT,
                                          env={**os.environ, "TF_CONFIG": config}))
        codes = [proc.wait() for proc in procs]
        for output in outputs:
            output.seek(0)
            sys.stdout.buffer.write(output.read())
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
