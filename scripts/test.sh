#!/usr/bin/env bash
# test.sh [--full] [PYTEST ARGS] - the project's test command (README, .ci/run): set up (idempotent), lint
# (ruff and shellcheck), then every test suite: unit, integration (real multi-process TensorFlow), horovod,
# slurm (a real local Slurm), container, bench, on TensorFlow 2.17 (.venv); beside them the `core` tests on
# TensorFlow 2.21 (.venv-tf221). Prints each stage's wall time at its end (CI's budget: README, Develop).
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
# however the run ends; the 2.21 stage beside the 2.17 one (its own session) ends with it
trap 'print_stages; [ -z "${newest_pid:-}" ] || kill -- "-$newest_pid" 2>/dev/null' EXIT
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
# The core of the suite (marker `core`) again on the newest TensorFlow line, in a full run: beside the 2.17 stage,
# one worker of its own (the 2.17 stage's waits leave a sixth of the cores idle: user+sys 67.5 of 80.3
# core-minutes at 40:09 with the stages one after the other), its own temporary directory. --full: all of it,
# after the 2.17 stage, with its workers.
NEWEST_VENV=${NEWEST_VENV-.venv-tf221}
newest_pid=
newest_stage() {
  "$NEWEST_VENV/bin/python" -m pytest "$@" -p no:cacheprovider --basetemp "$newest_temp/t"
}
if [ $# -eq 0 ] && [ -n "$NEWEST_VENV" ]; then
  newest_temp=$(mktemp -d "${TMPDIR:-/tmp}/distrain-tf221-tests.XXXXXX")
  newest_start=$SECONDS
  if [ "$DISTRAIN_TEST_TIER" != full ]; then
    export -f newest_stage
    export NEWEST_VENV newest_temp
    setsid bash -c 'newest_stage -n 1 -m core' >"$newest_temp/log" 2>&1 &
    newest_pid=$!
  fi
fi
"$VENV/bin/python" -m pytest -n "$WORKERS" "$@"
rc=$?
stage_done "TensorFlow 2.17 (${*:-all tests})"
if [ "$rc" = 5 ]; then echo "test.sh: pytest collected no tests: failing" >&2; exit 1; fi
if [ $# -eq 0 ] && [ -n "$NEWEST_VENV" ]; then
  echo "test.sh: the core tests again on $("$NEWEST_VENV/bin/python" -c 'import tensorflow as t, keras as k; print(f"TensorFlow {t.__version__}, Keras {k.__version__}")' 2>/dev/null)"
  if [ -n "$newest_pid" ]; then
    wait "$newest_pid"
    newest=$?
    newest_pid=
    cat "$newest_temp/log"
    stage_start=$newest_start
    stage_done "TensorFlow 2.21 (-m core, beside it)"
  else
    newest_stage -n "$WORKERS"
    newest=$?
    stage_done "TensorFlow 2.21 (all tests)"
  fi
  rm -rf "$newest_temp"
  if [ "$newest" = 5 ]; then echo "test.sh: no core tests collected: failing" >&2; exit 1; fi
  [ "$rc" = 0 ] && rc=$newest
fi
exit "$rc"
