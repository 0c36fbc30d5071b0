#!/usr/bin/env bash
# test-next.sh [PYTEST ARGS] - try the next TensorFlow before users do (scripts/test.sh --next; not in CI's budget):
# a virtualenv (.venv-next) with the newest TensorFlow on PyPI, pre-releases included, and the Keras its metadata
# requires (a pre-release requires keras-nightly), tf_keras where a build for it installs, distrain and its test
# tools, Horovod 0.28.1 built against it (scripts/build-horovod.sh), then the `core` tests on it. Record the line's
# result in docs/versions.md. About 20 minutes on 2 cores the first time (TensorFlow, Horovod's build).
# Env: NEXT_VENV (.venv-next)  NEXT_TENSORFLOW (the newest: e.g. tensorflow==2.22.0rc0 to pin one)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
VENV=${NEXT_VENV:-.venv-next}
say() { echo "test-next.sh: $*"; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || exit 1
"$VENV/bin/python" -m pip -q --disable-pip-version-check install uv || exit 1
uv_install() { "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" "$@"; }
say "installing ${NEXT_TENSORFLOW:-the newest TensorFlow} (pre-releases included) into $VENV"
uv_install --prerelease allow "${NEXT_TENSORFLOW:-tensorflow}" tensorboard || exit 1
tf=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow"))') || exit 1
line=$(echo "$tf" | awk -F. '{print $1"."$2}')
# tf_keras is released after TensorFlow: a build for this line, else none (its tests are then refused in one line)
uv_install --no-deps --prerelease allow "tf-keras~=$line.0" 2>/dev/null \
  || uv_install --no-deps --prerelease allow tf-keras-nightly 2>/dev/null \
  || say "no tf_keras for TensorFlow $line on PyPI: tf_keras scripts are refused (exit 3)"
uv_install -e ".[test]" || exit 1
TF_USE_LEGACY_KERAS=1 scripts/build-horovod.sh "$VENV/bin/python" || say "Horovod did not build against TensorFlow $tf"
say "$("$VENV/bin/python" -c 'import tensorflow as t, keras as k; print(f"TensorFlow {t.__version__}, Keras {k.__version__}")' 2>/dev/null)"
"$VENV/bin/python" -m pytest -n "${DISTRAIN_TEST_WORKERS:-3}" -m core -p no:cacheprovider "$@"
