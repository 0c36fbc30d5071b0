#!/usr/bin/env bash
# gpu-wheelhouse.sh DIR - fill DIR with every wheel the image's pypi flavour installs (image/pypi-requirements.txt:
# TensorFlow 2.21 with PyPI's CUDA 12 libraries, Keras, tf_keras, distrain's and Horovod's requirements), and a
# Horovod 0.28.1 with NCCL built here for that TensorFlow (build-horovod.sh, clang as the CUDA compiler on the
# toolkit the wheels provide). The image's build then needs no network: `distrain image build --flavour pypi
# --wheelhouse DIR`. About 3.3 GB; the Horovod build takes about 10 minutes on 2 cores, once (cached).
#
# Run it on a host with the image's Python (3.11: Debian 12's) on x86_64, where pip reaches PyPI.
# Needs: cmake, g++, Open MPI headers, clang-19 (Debian 12: apt-get install cmake g++ libopenmpi-dev clang-19).
# Env:   BUILD_VENV (/var/tmp/distrain-gpu-build): the environment Horovod is built in (TensorFlow with its CUDA)
#        HOROVOD_WHEEL_CACHE: as for build-horovod.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: scripts/gpu-wheelhouse.sh DIR" >&2; exit 2; }
DIR=$(realpath -m "$1")
VENV=${BUILD_VENV:-/var/tmp/distrain-gpu-build}
REQUIREMENTS=image/pypi-requirements.txt
CCCL=nvidia-cuda-cccl-cu12==12.9.27   # CUDA's C++ headers (<nv/target>) for compiling Horovod's kernels only
die() { echo "gpu-wheelhouse.sh: $*" >&2; exit 1; }

PY=$(command -v python3.11 || true)
[ -n "$PY" ] || die "needs Python 3.11 (the image's, Debian 12's) to fetch wheels for it"
[ "$(uname -m)" = x86_64 ] || die "the wheels are fetched for this machine's platform, and the image is x86_64"
for tool in cmake g++ mpicxx clang++-19; do
  command -v "$tool" >/dev/null || die "needs $tool (Debian 12: apt-get install cmake g++ libopenmpi-dev clang-19)"
done
mkdir -p "$DIR"
echo "gpu-wheelhouse.sh: fetching the pinned wheels into $DIR"
without_horovod=$(mktemp)
trap 'rm -f "$without_horovod"' EXIT
grep -v '^horovod==' "$REQUIREMENTS" > "$without_horovod"
"$PY" -m pip download -q --disable-pip-version-check --only-binary :all: -d "$DIR" -r "$without_horovod" "$CCCL"
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
echo "gpu-wheelhouse.sh: TensorFlow with its CUDA into $VENV, to build Horovod against"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$DIR" \
  -r "$without_horovod" "$CCCL"
HOROVOD_GPU_OPERATIONS=NCCL scripts/build-horovod.sh "$VENV/bin/python"
wheel=$(find "${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distrain/wheels}" \
          -path "*/tf-$("$VENV/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)-nccl/*" \
          -name 'horovod-*.whl' | head -n 1)
[ -n "$wheel" ] || die "build-horovod.sh left no NCCL wheel in its cache"
cp "$wheel" "$DIR/"
echo "gpu-wheelhouse.sh: $DIR has $(find "$DIR" -name '*.whl' | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"
