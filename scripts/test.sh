#!/usr/bin/env bash
# test.sh - the project's test command (README, .ci/run): set up (idempotent), lint (ruff, shellcheck), then every
# test suite: unit, integration (real multi-process TensorFlow), horovod, slurm (a real local Slurm), container,
# bench, on TensorFlow 2.17 (.venv); then the `core` tests on TensorFlow 2.21 (.venv-tf221).
# Extra arguments go to pytest (e.g. scripts/test.sh -m unit) and skip the second line.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
scripts/install.sh || exit 1
VENV=${DISTRAIN_VENV:-.venv}
"$VENV/bin/ruff" check entrypoint tests examples benchmarks || exit 1
"$VENV/bin/shellcheck" .ci/run scripts/*.sh jobs/*.job jobs/lib.sh tests/cluster/*.sh tests/gpu/*.sh || exit 1
# 2 workers (pytest-xdist): much of the suite waits on timers, rendezvous and Slurm; tests/conftest.py keeps
# the Slurm and container tests together on one of them. `-n 0` runs it all in one process.
"$VENV/bin/python" -m pytest -n 2 "$@"
rc=$?
if [ "$rc" = 5 ]; then echo "test.sh: pytest collected no tests: failing" >&2; exit 1; fi
# The core of the suite (marker `core`) again on the newest TensorFlow line, in a full run.
NEWEST_VENV=${NEWEST_VENV-.venv-tf221}
if [ $# -eq 0 ] && [ -n "$NEWEST_VENV" ]; then
  echo "test.sh: the core tests again on $("$NEWEST_VENV/bin/python" -c 'import tensorflow as t, keras as k; print(f"TensorFlow {t.__version__}, Keras {k.__version__}")' 2>/dev/null)"
  "$NEWEST_VENV/bin/python" -m pytest -n 2 -m core -p no:cacheprovider
  newest=$?
  if [ "$newest" = 5 ]; then echo "test.sh: no core tests collected: failing" >&2; exit 1; fi
  [ "$rc" = 0 ] && rc=$newest
fi
exit "$rc"
