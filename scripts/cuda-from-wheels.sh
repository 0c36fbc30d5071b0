#!/usr/bin/env bash
# cuda-from-wheels.sh - lay out a CUDA toolkit directory (include/, lib64/, bin/, nvvm/libdevice) from the
# NVIDIA packages that `pip install tensorflow[and-cuda]` put into a Python environment, for compiling Horovod's
# NCCL operations without NVIDIA's apt repository. PyPI's nvidia-cuda-nvcc-cu12 has ptxas and libdevice but no
# nvcc and no fatbinary, so the CUDA compiler is clang (build-horovod.sh), as for TensorFlow's own CUDA kernels,
# and the fatbinary that packs clang's images comes from PyPI's CUDA 13 nvcc package: bin/fatbinary translates
# clang 19's --image=profile=... (which CUDA 13's fatbinary no longer takes) into --image3; bin/nvcc only tells
# CMake the toolkit's version.
#
# Usage: scripts/cuda-from-wheels.sh PYTHON DIR     (prints DIR; the files are links into PYTHON's site-packages)
# Env:   FATBINARY_FROM (13.0.88: the nvidia-cuda-nvcc release whose bin/fatbinary is used); PIP_* as for pip
set -euo pipefail
PY=$1
DIR=$(realpath -m "$2")
FATBINARY_FROM=${FATBINARY_FROM:-13.0.88}
NV=$("$PY" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) \
  || { echo "cuda-from-wheels.sh: $PY has no NVIDIA packages: pip install 'tensorflow[and-cuda]'" >&2; exit 1; }
# curand and cuda_cccl: clang's CUDA wrapper headers include curand_mtgp32_kernel.h, which includes <nv/target>.
PARTS=(cuda_runtime cuda_nvcc cuda_cccl nccl curand)
for part in "${PARTS[@]}"; do
  [ -d "$NV/$part/include" ] || { echo "cuda-from-wheels.sh: $NV/$part is missing (nvidia-$part-cu12)" >&2; exit 1; }
done
rm -rf "$DIR"
mkdir -p "$DIR/include" "$DIR/lib64" "$DIR/bin" "$DIR/nvvm"
for part in "${PARTS[@]}"; do
  for f in "$NV/$part/include"/*; do ln -sfn "$f" "$DIR/include/"; done
done
for f in "$NV"/cuda_runtime/lib/* "$NV"/nccl/lib/libnccl.so.*; do ln -sfn "$f" "$DIR/lib64/"; done
ln -sfn libcudart.so.12 "$DIR/lib64/libcudart.so"
ln -sfn libnccl.so.2 "$DIR/lib64/libnccl.so"
ln -sfn "$NV/cuda_nvcc/bin/ptxas" "$DIR/bin/ptxas"
ln -sfn "$NV/cuda_nvcc/nvvm/libdevice" "$DIR/nvvm/libdevice"
"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DIR/cu13" "nvidia-cuda-nvcc==$FATBINARY_FROM"
cat > "$DIR/bin/fatbinary" <<SHIM
#!/bin/sh
# clang 19's fatbinary call, for CUDA 13's fatbinary (written by scripts/cuda-from-wheels.sh)
for a; do
  shift
  case "\$a" in
    --image=profile=sm_*) a=\$(echo "\$a" | sed 's/^--image=profile=sm_\([0-9a-z]*\),/--image3=kind=elf,sm=\1,/') ;;
    --image=profile=compute_*) a=\$(echo "\$a" | sed 's/^--image=profile=compute_\([0-9a-z]*\),/--image3=kind=ptx,sm=\1,/') ;;
  esac
  set -- "\$@" "\$a"
done
exec "$DIR/cu13/nvidia/cu13/bin/fatbinary" "\$@"
SHIM
# No compiler: CMake (3.25) finds a toolkit for clang by running its `nvcc --version`, and only that.
version=$("$PY" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime-cu12"))')
cat > "$DIR/bin/nvcc" <<SHIM
#!/bin/sh
# Not a compiler: answers CMake's \`nvcc --version\` for this toolkit (written by scripts/cuda-from-wheels.sh)
[ "\$1" = --version ] || { echo "nvcc: not here: this CUDA toolkit from PyPI's wheels compiles with clang" >&2; exit 1; }
echo "Cuda compilation tools, release ${version%.*}, V$version (the CUDA of PyPI's nvidia-cuda-runtime-cu12)"
SHIM
chmod +x "$DIR/bin/fatbinary" "$DIR/bin/nvcc"
echo "$DIR"
