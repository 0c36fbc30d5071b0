#!/usr/bin/env bash
# test.sh [--full] [PYTEST ARGS] - the project's test command (README, .ci/run): set up (idempotent), lint
# (ruff and shellcheck), then every test suite: unit, integration (real multi-process TensorFlow), horovod,
# slurm (a real local Slurm), container, bench, on TensorFlow 2.17 (.venv); then the `core` tests on TensorFlow
# 2.21 (.venv-tf221). Prints each stage's wall time at its end (CI's budget: README, Develop).
# --full: the developer's tier (DISTRAIN_TEST_TIER=full): the whole product of combinations where CI covers them
# pairwise, and every test on both TensorFlow lines. Extra arguments go to pytest (e.g. scripts/test.sh -m unit)
# and skip the second line. --next: the `core` tests on the newest TensorFlow on PyPI (scripts/test-next.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export DISTRAIN_TEST_TIER=default
if [ "${1:-}" = --next ]; then shift; exec scripts/test-next.sh "$@"; fi
if [ "${1:-}" = --full ]; then DISTRAIN_TEST_TIER=full; shift; fi
stages=()
stage_start=$SECONDS
stage_done() { stages+=("$(printf '%-34s %3d min %02d s' "$1" $(((SECONDS - stage_start) / 60)) $(((SECONDS - stage_start) % 60)))"); stage_start=$SECONDS; }
# shellcheck disable=SC2329 # invoked by the EXIT trap
print_stages() {
  echo "test.sh: wall time by stage ($DISTRAIN_TEST_TIER tier)"
  printf '  %s\n' "${stages[@]}"
  printf '  %-34s %3d min %02d s\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
}
trap print_stages EXIT  # however the run ends
scripts/install.sh || exit 1
stage_done "install"
VENV=${DISTRAIN_VENV:-.venv}
"$VENV/bin/ruff" check entrypoint tests examples benchmarks image || exit 1
"$VENV/bin/shellcheck" .ci/run scripts/*.sh image/*.sh jobs/*.job jobs/lib.sh bin/distrain tests/cluster/*.sh tests/gpu/*.sh || exit 1
stage_done "lint"
# 3 pytest-xdist workers on CI's 2 cores: the Slurm and container tests (tests/conftest.py keeps them together on
# one worker) wait on Slurm's timers and the image builds much of their time, and with 2 workers a fifth of the
# CPUs idled (user+sys 69.5 of 86.6 core-minutes); measured since, the 2.17 stage takes about as long with 3
# (41:25 with a few more tests than 41:05's, benchmarks/ci-timings.md). DISTRAIN_TEST_WORKERS=0: one process.
WORKERS=${DISTRAIN_TEST_WORKERS:-3}
"$VENV/bin/python" -m pytest -n "$WORKERS" "$@"
rc=$?
stage_done "TensorFlow 2.17 (${*:-all tests})"
if [ "$rc" = 5 ]; then echo "test.sh: pytest collected no tests: failing" >&2; exit 1; fi
# The core of the suite (marker `core`; --full: all of it) again on the newest TensorFlow line, in a full run.
NEWEST_VENV=${NEWEST_VENV-.venv-tf221}
if [ $# -eq 0 ] && [ -n "$NEWEST_VENV" ]; then
  echo "test.sh: the core tests again on $("$NEWEST_VENV/bin/python" -c 'import tensorflow as t, keras as k; print(f"TensorFlow {t.__version__}, Keras {k.__version__}")' 2>/dev/null)"
  select=(-m core)
  [ "$DISTRAIN_TEST_TIER" = full ] && select=()
  "$NEWEST_VENV/bin/python" -m pytest -n "$WORKERS" "${select[@]}" -p no:cacheprovider
  newest=$?
  stage_done "TensorFlow 2.21 (${select[*]:-all tests})"
  if [ "$newest" = 5 ]; then echo "test.sh: no core tests collected: failing" >&2; exit 1; fi
  [ "$rc" = 0 ] && rc=$newest
fi
exit "$rc"
