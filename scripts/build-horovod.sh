#!/usr/bin/env bash
# build-horovod.sh - build Horovod 0.28.1 against the TensorFlow installed in a Python environment and
# install it there. The wheel links that exact TensorFlow (libtensorflow_framework.so.2) and Open MPI, so it
# is cached per TensorFlow version: the first build takes ~4 minutes on 2 cores, every later one seconds.
#
# Usage: scripts/build-horovod.sh [PYTHON]        (default: python3 on PATH; a venv's bin/python works)
# Env:   HOROVOD_VERSION (0.28.1)  HOROVOD_WHEEL_CACHE (${XDG_CACHE_HOME:-~/.cache}/distrain/wheels)
#        HOROVOD_GPU_OPERATIONS=NCCL (+ HOROVOD_NCCL_HOME) on GPU sites; MAKEFLAGS (-j<cores>, default -j2)
#        HOROVOD_CUDA_CLANG (clang++-19): with NCCL, no HOROVOD_CUDA_HOME and TensorFlow's CUDA from PyPI, the
#        CUDA toolkit is laid out from PYTHON's NVIDIA wheels (cuda-from-wheels.sh: tensorflow[and-cuda]) and
#        Horovod's few CUDA kernels are compiled by clang, for HOROVOD_BUILD_CUDA_CC_LIST (60,70,75,80,86,89,90:
#        Pascal to Hopper, as TensorFlow 2.21)
# Needs: cmake, g++, Open MPI headers (Debian: cmake g++ libopenmpi-dev openmpi-bin); clang-19 for the above.
set -euo pipefail

PY=${1:-python3}
VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distrain/wheels}

die() { echo "build-horovod.sh: $*" >&2; exit 1; }
command -v "$PY" >/dev/null || die "python '$PY' not found"
TF=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
  || die "TensorFlow is not importable by $PY: install it first (pip install tensorflow-cpu==2.17.1)"

# With NCCL, for a TensorFlow whose CUDA comes from PyPI (tensorflow[and-cuda]) and no HOROVOD_CUDA_HOME: that
# very CUDA, laid out from PYTHON's NVIDIA wheels, with clang as the CUDA compiler (the wheels have no nvcc; an
# nvcc elsewhere on the machine may be another CUDA than TensorFlow's). NCCL linked shared, found beside
# Horovod's library in site-packages (rpath).
cuda_from_wheels() {
  local src=$1 cuda=$2 clang=${HOROVOD_CUDA_CLANG:-clang++-19} archs=${HOROVOD_BUILD_CUDA_CC_LIST:-60,70,75,80,86,89,90}
  if [ -n "${HOROVOD_CUDA_HOME:-}" ] || ! "$PY" -c 'import nvidia.cuda_runtime' 2>/dev/null; then return 0; fi
  command -v "$clang" >/dev/null || die "no nvcc, and no $clang to compile CUDA with (apt-get install clang-19)"
  "$(dirname "$0")/cuda-from-wheels.sh" "$PY" "$cuda" >/dev/null
  # Horovod passes nvcc's own flags (-gencode, -Xcompiler): clang takes the architectures from CUDAARCHS
  # shellcheck disable=SC2016 # a literal CMake variable
  sed -i 's/SHELL:${HVD_NVCC_COMPILE_FLAGS}/-O3/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
  export CUDACXX=$clang CUDAFLAGS="--cuda-path=$cuda -Wno-unknown-cuda-version" CUDAARCHS=${archs//,/;}
  export CUDAToolkit_ROOT=$cuda HOROVOD_NCCL_HOME=$cuda HOROVOD_NCCL_LINK=SHARED
  export LDFLAGS="${LDFLAGS:-} -Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib"
  # and no run path into this build's temporary toolkit (CMake adds the linked libraries' directories)
  sed -i '/^project(/a set(CMAKE_SKIP_BUILD_RPATH TRUE)' "$src/CMakeLists.txt"
}

variant=cpu; [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && variant=nccl
DIR="$CACHE/tf-$TF-$variant"
mkdir -p "$DIR"
wheel=$(find "$DIR" -maxdepth 1 -name "horovod-$VERSION-*.whl" | head -n 1)
have=$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ -n "$wheel" ] && [ "$have" = "$VERSION" ] && "$PY" -c "import horovod.tensorflow as hvd, sys
sys.exit(0 if '$variant' == 'cpu' or hvd.nccl_built() else 1)" 2>/dev/null; then
  echo "build-horovod.sh: horovod $VERSION ($variant) already works with TensorFlow $TF"; exit 0
fi
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
      # (xla_mpi_ops.cc is built with GPU operations only; its xla::StatusOr is absl::StatusOr there)
      sed -i -e 's#"tensorflow/compiler/xla/client/xla_builder.h"#"tensorflow/compiler/xla/hlo/builder/xla_builder.h"#' \
        -e 's/::xla::StatusOr</absl::StatusOr</g' "$SRC/horovod/tensorflow/xla_mpi_ops.cc"
      export CXXFLAGS="${CXXFLAGS:-} -I$TFI/external/highwayhash -I$TFI/external/farmhash_archive/src"
      # With GPU operations: TensorFlow no longer exports stream_executor::gpu::AsGpuStreamValue, which Horovod
      # declares and calls for the CUDA stream of a TensorFlow stream: defined here from the stream's own handle.
      "$PY" - "$SRC/horovod/tensorflow/mpi_ops.cc" <<'EOF'
import re, sys
path = sys.argv[1]
source = open(path).read()
declared = re.search(r"// Forward declaration of AsGpuStreamValue\n.*?#endif // TENSORFLOW_VERSION >= 2011000000\n",
                     source, re.S)
assert declared, "Horovod's AsGpuStreamValue declaration moved: see scripts/build-horovod.sh"
open(path, "w").write(source.replace(declared[0], """#include "tensorflow/compiler/xla/stream_executor/stream.h"
namespace stream_executor {
namespace gpu {
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
} // namespace gpu
} // namespace stream_executor
"""))
EOF
      ;;
  esac
  [ "$variant" = nccl ] && cuda_from_wheels "$SRC" "$WORK/cuda"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS=${MAKEFLAGS:--j$(nproc 2>/dev/null || echo 2)}
  # --no-build-isolation: Horovod's build must see (and link) the installed TensorFlow.
  "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir "$SRC" -w "$WORK/out"
  wheel=$(find "$WORK/out" -maxdepth 1 -name "horovod-*.whl" | head -n 1)
  [ -n "$wheel" ] || die "the build produced no wheel"
fi
# --no-deps: Horovod's own requirements (cloudpickle, psutil, pyyaml, packaging) are installed separately so
# pip never swaps the installed tensorflow-cpu for a different TensorFlow.
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging
"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
"$PY" -c 'import horovod, horovod.tensorflow as hvd; hvd.init(); print("build-horovod.sh: horovod", horovod.__version__, "ok; mpi:", hvd.mpi_built(), "gloo:", hvd.gloo_built(), "nccl:", hvd.nccl_built())' \
  || die "the Horovod wheel $wheel does not load with TensorFlow $TF (above)"
if [ "$(dirname "$wheel")" != "$DIR" ]; then  # a new build that loads: cached, never a partial or broken entry
  cp "$wheel" "$DIR/.tmp.whl" && mv "$DIR/.tmp.whl" "$DIR/$(basename "$wheel")"
fi
