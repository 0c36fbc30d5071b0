#!/usr/bin/env bash
# build-test-base.sh - a CPU stand-in for the NGC TensorFlow base image, built without network inside any
# container (HTTPS to PyPI fails there): Debian 12 from debootstrap, with tensorflow-cpu, tf-keras, the
# Horovod wheel from build-horovod.sh's cache, typer and spython installed by the HOST's pip into the root
# filesystem. The project's Dockerfile / Apptainer.def are then built unchanged with BASE_IMAGE pointing at it.
#
# Usage: scripts/build-test-base.sh ROOTFS_TAR          (writes a tarball for `docker import`; reused if present)
# TF_VERSION=none: the OS alone (Debian 12 with Python and Open MPI), the plain base of the pypi flavour.
# Env:   TF_VERSION (2.17.1)  KERAS_VERSION (3.3.2: NGC 25.02's)  DEBIAN_MIRROR (from apt's sources)  VENV (.venv: whose pip/python do the install)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1
TF_VERSION=${TF_VERSION:-2.17.1}
VENV=${VENV:-.venv}
[ -s "$OUT" ] && { echo "build-test-base.sh: reusing $OUT"; exit 0; }
mkdir -p "$(dirname "$OUT")"
MIRROR=${DEBIAN_MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
WHEEL=none
if [ "$TF_VERSION" != none ]; then
  WHEEL=$(find "${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distrain/wheels}/tf-$TF_VERSION-cpu" \
            -name 'horovod-*.whl' 2>/dev/null | head -n 1)
  [ -n "$WHEEL" ] || { echo "build-test-base.sh: no cached Horovod wheel for TF $TF_VERSION: run scripts/install.sh" >&2; exit 1; }
fi
ROOT=$(mktemp -d /var/tmp/distrain-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "build-test-base.sh: debootstrap bookworm into $ROOT"
debootstrap --variant=minbase \
  --include=python3,python3-pip,python3-setuptools,python3-wheel,libopenmpi3,openmpi-bin,libgomp1,procps,ca-certificates \
  bookworm "$ROOT" "$MIRROR" >/dev/null
# The NGC stand-in's Python packages: TensorFlow, Keras, Horovod and distrain's requirements.
install_python_packages() {
  SITE=$ROOT/usr/local/lib/python3.11/dist-packages
  PY=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$PY" = 3.11 ] || { echo "build-test-base.sh: the host venv is Python $PY; Debian 12's is 3.11" >&2; exit 1; }
  echo "build-test-base.sh: installing tensorflow-cpu $TF_VERSION and friends into the image's site-packages"
  pipi() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --target "$SITE" "$@" 2>&1 \
             | grep -v "is ignored: it is neither" || true; }
  pipi "tensorflow-cpu==$TF_VERSION" "keras==${KERAS_VERSION:-3.3.2}" typer spython cloudpickle psutil pyyaml packaging scikit-learn
  pipi --no-deps "tf-keras==${TF_VERSION%.*}.0" "$WHEEL"
  "$VENV/bin/python" - "$SITE" <<'PYEOF'
import importlib.metadata as m, sys
names = {d.metadata["Name"].lower().replace("_", "-") for d in m.distributions(path=[sys.argv[1]])}
missing = {"tensorflow-cpu", "tf-keras", "horovod", "typer", "spython"} - names
sys.exit(f"missing in the base image: {missing}" if missing else 0)
PYEOF
  rm -rf "${SITE:?}/bin"
}
if [ "$TF_VERSION" != none ]; then install_python_packages; fi
rm -rf "$ROOT/var/cache/apt/archives"/*.deb "$ROOT/var/lib/apt/lists"/*
echo "build-test-base.sh: packing $OUT"
tar -C "$ROOT" -cf "$OUT.tmp" . && mv "$OUT.tmp" "$OUT"
du -h "$OUT"
