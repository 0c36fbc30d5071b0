#!/usr/bin/env bash
# test.sh - the project's test command (README, .ci/run): set up (idempotent), lint, then every test suite:
# unit, integration (real multi-process TensorFlow), horovod, slurm (a real local Slurm), container, bench.
# Extra arguments go to pytest (e.g. scripts/test.sh -m unit).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
scripts/install.sh || exit 1
VENV=${DISTRAIN_VENV:-.venv}
"$VENV/bin/ruff" check entrypoint tests examples benchmarks || exit 1
"$VENV/bin/python" -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then echo "test.sh: pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
