#!/usr/bin/env bash
# install.sh - set up everything distrain's tests need on Debian 12, idempotently (run as root):
#   apt packages (Slurm + munge, Open MPI, build tools, container tooling), a virtualenv .venv with CPU
#   TensorFlow 2.17.1 + tf-keras + distrain + test tools, and Horovod 0.28.1 built against that TensorFlow
#   (cached per TensorFlow version, so a second install takes seconds).
# Env: DISTRAIN_VENV (.venv)  TF_VERSION (2.17.1)  INSTALL_CONTAINERS (1: docker.io, apptainer, debootstrap)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DISTRAIN_VENV:-.venv}
TF_VERSION=${TF_VERSION:-2.17.1}
INSTALL_CONTAINERS=${INSTALL_CONTAINERS:-1}
say() { echo "install.sh: $*"; }

# ---- apt -------------------------------------------------------------------------------------------------
APT=(slurmctld slurmd slurm-client munge libopenmpi-dev openmpi-bin cmake g++ python3-venv)
[ "$INSTALL_CONTAINERS" = 1 ] && APT+=(docker.io debootstrap squashfs-tools uidmap patchelf fuse-overlayfs docker-registry)
missing=()
for p in "${APT[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "install.sh: run as root to install: ${missing[*]}" >&2; exit 1; }
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
  apt_install || { apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null && apt_install; }
fi
if [ "$INSTALL_CONTAINERS" = 1 ]; then
  scripts/setup-apptainer.sh
fi

# ---- virtualenv --------------------------------------------------------------------------------------------
PY=python3
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
have() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
if ! have tensorflow-cpu "$TF_VERSION"; then say "installing tensorflow-cpu $TF_VERSION"; pip install "tensorflow-cpu==$TF_VERSION"; fi
# tf-keras must match TensorFlow; --no-deps, or it pulls the full `tensorflow` package over tensorflow-cpu
TFK=$(echo "$TF_VERSION" | awk -F. '{print $1"."$2".0"}')
have tf-keras "$TFK" || pip install --no-deps "tf-keras==$TFK"
if ! "$VENV/bin/python" -c "import importlib.metadata as m, entrypoint, typer, spython, pytest, sklearn; m.version('distrain')" 2>/dev/null; then
  say "installing distrain (editable) and test tools"; pip install -e ".[test]"
fi
have tensorflow-cpu "$TF_VERSION" || { echo "install.sh: tensorflow-cpu $TF_VERSION got replaced" >&2; exit 1; }

# ---- Horovod -----------------------------------------------------------------------------------------------
TF_USE_LEGACY_KERAS=1 scripts/build-horovod.sh "$VENV/bin/python" 2>&1 | grep -v "is ignored: it is neither\|cpu_feature_guard\|To enable the following\|oneDNN custom" || true
"$VENV/bin/python" -c "import horovod.tensorflow" 2>/dev/null || { echo "install.sh: Horovod failed to install" >&2; exit 1; }
say "ready: $VENV (tensorflow-cpu $TF_VERSION, tf-keras $TFK, horovod)"
