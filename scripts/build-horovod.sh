#!/usr/bin/env bash
# build-horovod.sh - build Horovod 0.28.1 against the TensorFlow installed in a Python environment and
# install it there. The wheel links that exact TensorFlow (libtensorflow_framework.so.2) and Open MPI, so it
# is cached per TensorFlow version: the first build takes ~4 minutes on 2 cores, every later one seconds.
#
# Usage: scripts/build-horovod.sh [PYTHON]        (default: python3 on PATH; a venv's bin/python works)
# Env:   HOROVOD_VERSION (0.28.1)  HOROVOD_WHEEL_CACHE (${XDG_CACHE_HOME:-~/.cache}/distrain/wheels)
#        HOROVOD_GPU_OPERATIONS=NCCL (+ HOROVOD_NCCL_HOME) on GPU sites; MAKEFLAGS (-j<cores>, default -j2)
# Needs: cmake, g++, Open MPI headers (Debian: cmake g++ libopenmpi-dev openmpi-bin).
set -euo pipefail

PY=${1:-python3}
VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distrain/wheels}

die() { echo "build-horovod.sh: $*" >&2; exit 1; }
command -v "$PY" >/dev/null || die "python '$PY' not found"
TF=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
  || die "TensorFlow is not importable by $PY: install it first (pip install tensorflow-cpu==2.17.1)"
have=$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ "$have" = "$VERSION" ] && "$PY" -c 'import horovod.tensorflow' 2>/dev/null; then
  echo "build-horovod.sh: horovod $VERSION already works with TensorFlow $TF"; exit 0
fi

variant=cpu; [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && variant=nccl
DIR="$CACHE/tf-$TF-$variant"
mkdir -p "$DIR"
wheel=$(find "$DIR" -maxdepth 1 -name "horovod-$VERSION-*.whl" | head -n 1)
if [ -z "$wheel" ]; then
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then die "needs cmake and g++ (apt-get install cmake g++)"; fi
  command -v mpicxx >/dev/null || die "needs Open MPI (apt-get install libopenmpi-dev openmpi-bin)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  echo "build-horovod.sh: building horovod $VERSION for TensorFlow $TF ($variant); this takes a few minutes"
  "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
  tar xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
  SRC=$WORK/horovod-$VERSION
  # horovod.tensorflow.keras does `from keras import backend as K`: with TF >= 2.16 that is Keras 3, which
  # Horovod does not support. Point it at tf.keras (= tf_keras when TF_USE_LEGACY_KERAS=1).
  sed -i 's/^\(\s*\)from keras import backend as K/\1from tensorflow.keras import backend as K/' \
    "$SRC/horovod/tensorflow/keras/__init__.py" "$SRC/horovod/tensorflow/keras/callbacks.py"
  TFI=$("$PY" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())')
  case "$TF" in
    2.1[0-8].*) ;;   # builds unchanged (measured with 2.17.1)
    *)  # TF >= 2.19 moved xla_builder.h and needs extra vendored include paths (measured with 2.21)
      sed -i 's#"tensorflow/compiler/xla/client/xla_builder.h"#"tensorflow/compiler/xla/hlo/builder/xla_builder.h"#' \
        "$SRC/horovod/tensorflow/xla_mpi_ops.cc"
      export CXXFLAGS="${CXXFLAGS:-} -I$TFI/external/highwayhash -I$TFI/external/farmhash_archive/src" ;;
  esac
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS=${MAKEFLAGS:--j$(nproc 2>/dev/null || echo 2)}
  # --no-build-isolation: Horovod's build must see (and link) the installed TensorFlow.
  "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir "$SRC" -w "$WORK/out"
  wheel=$(find "$WORK/out" -maxdepth 1 -name "horovod-*.whl" | head -n 1)
  [ -n "$wheel" ] || die "the build produced no wheel"
  cp "$wheel" "$DIR/.tmp.whl" && mv "$DIR/.tmp.whl" "$DIR/$(basename "$wheel")"   # never a partial cache entry
  wheel=$DIR/$(basename "$wheel")
fi
# --no-deps: Horovod's own requirements (cloudpickle, psutil, pyyaml, packaging) are installed separately so
# pip never swaps the installed tensorflow-cpu for a different TensorFlow.
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging
"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
"$PY" -c 'import horovod, horovod.tensorflow as hvd; hvd.init(); print("build-horovod.sh: horovod", horovod.__version__, "ok; mpi:", hvd.mpi_built(), "gloo:", hvd.gloo_built(), "nccl:", hvd.nccl_built())'
