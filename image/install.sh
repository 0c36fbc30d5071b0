#!/bin/sh
# install.sh FLAVOUR - the image's install steps, run as root by the Dockerfile's RUN and Apptainer.def's %post
# alike (one copy of them). FLAVOUR:
#   ngc   the base is NGC's TensorFlow image: its TensorFlow, Keras 3 and Horovod are kept; tf-keras is added
#         (matching its TensorFlow, --no-deps so TensorFlow stays) only when the base lacks it.
#   pypi  the base is a plain Debian 12: Python and Open MPI from Debian's packages (installed only where the base
#         lacks them: a login node's build can reach Debian's mirrors), then TensorFlow 2.21 with PyPI's CUDA
#         libraries, Keras 3, tf_keras and Horovod with NCCL, offline from /opt/distrain/wheelhouse
#         (image/pypi-requirements.txt, pinned); the build fails unless TensorFlow is a CUDA build and Horovod
#         has NCCL, MPI and Gloo.
# Then the versions the base must carry, checked (image/expect.py; EXPECT, the second argument: "flavour" for the
# flavour's own, the README's), failing the build otherwise.
# Then distrain itself into site-packages (not PYTHONPATH/WORKDIR: Apptainer ignores WORKDIR; --no-build-isolation:
# the base's setuptools builds it) and `distrain doctor`, whose output is the build's record of what the image holds.
set -eu
FLAVOUR=${1:?usage: install.sh ngc|pypi [EXPECT]}
EXPECT=${2:-flavour}
HERE=/opt/distrain
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
die() { echo "image/install.sh: $*" >&2; exit 2; }

case "$FLAVOUR" in
  ngc)
    python3 -m pip install --no-build-isolation "$HERE"
    python3 -c "import tf_keras" 2>/dev/null \
      || python3 -m pip install --no-deps \
           "tf-keras==$(python3 -c 'import tensorflow as tf; print(tf.__version__.rsplit(".", 1)[0])').0"
    ;;
  pypi)
    if python3 -c "import tensorflow" 2>/dev/null; then
      die "FLAVOUR=pypi installs TensorFlow on a plain OS base, and this base has one: build with BASE_IMAGE=debian:12 (or FLAVOUR=ngc)"
    fi
    ls "$HERE"/wheelhouse/tensorflow-*.whl >/dev/null 2>&1 \
      || die "no wheels in the build's wheelhouse/: fill it first (scripts/gpu-wheelhouse.sh wheelhouse)"
    if ! python3 -m pip --version >/dev/null 2>&1 || ! command -v mpirun >/dev/null; then
      apt-get update
      apt-get install -y --no-install-recommends python3 python3-pip python3-setuptools openmpi-bin libopenmpi3 \
        libgomp1 procps ca-certificates
      rm -rf /var/lib/apt/lists/*
    fi
    python3 -m pip install --no-index --find-links "$HERE/wheelhouse" -r "$HERE/image/pypi-requirements.txt"
    python3 -m pip install --no-index --find-links "$HERE/wheelhouse" --no-build-isolation "$HERE"
    TF_CPP_MIN_LOG_LEVEL=2 python3 - <<'EOF'
import sys

import horovod.tensorflow as hvd
import tensorflow as tf

build = tf.sysconfig.get_build_info()
checks = {"TensorFlow is a CUDA build": tf.test.is_built_with_cuda(), "Horovod has NCCL": hvd.nccl_built(),
          "Horovod has MPI": hvd.mpi_built(), "Horovod has Gloo": hvd.gloo_built()}
for name, answer in checks.items():
    print(f"image/install.sh: {name}: {answer}")
print(f"image/install.sh: built with CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')}, "
      f"for {' '.join(build.get('cuda_compute_capabilities', []))}")
sys.exit(0 if all(checks.values()) else "image/install.sh: the pypi flavour's checks failed (above)")
EOF
    # the NCCL library Horovod's TensorFlow ops load: PyPI's, beside them in site-packages (their rpath)
    ops=$(python3 -c 'import glob, os, horovod; print(glob.glob(os.path.dirname(horovod.__file__) + "/tensorflow/mpi_lib*.so")[0])')
    linked=$(ldd "$ops")
    echo "$linked" | grep nccl | sed 's/^\s*/image\/install.sh: Horovod links /'
    if echo "$linked" | grep -E "(nccl|cuda|mpi).*not found"; then die "Horovod's $ops misses libraries (above)"; fi
    ;;
  *) die "unknown FLAVOUR=$FLAVOUR: ngc (NVIDIA's TensorFlow image) or pypi (TensorFlow 2.21 from PyPI)" ;;
esac
if [ "$EXPECT" = flavour ]; then
  case "$FLAVOUR" in
    ngc) EXPECT="tensorflow=2.17 keras=3.3 tf_keras=2.17 horovod=0.28.1 cuda nccl" ;;
    pypi) EXPECT="tensorflow=2.21 keras=3.15 tf_keras=2.21 horovod=0.28.1 cuda nccl" ;;
  esac
fi
python3 "$HERE/image/expect.py" "$EXPECT" || die "the base's contents are not the expected ones (above)"
rm -rf "$HERE/wheelhouse"
TF_CPP_MIN_LOG_LEVEL=2 DISTRAIN_REQUIRE_GPU=0 distrain doctor
