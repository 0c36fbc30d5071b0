#!/usr/bin/env bash
# image.sh - build or pull the distrain Apptainer image (distrain image ..., through spython), for users who
# have the checkout but not distrain on PATH. Examples:
#   scripts/image.sh build distrain.sif --base-image nvcr.io/nvidia/tensorflow:25.02-tf2-py3
#   scripts/image.sh pull docker://registry.example/distrain:0.1.0 distrain.sif
# The Apptainer cache goes to $DISTRAIN_CACHE, $SCRATCH or $WORK (never $HOME): see `distrain image --help`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if command -v distrain >/dev/null 2>&1; then exec distrain image "$@"; fi
[ -x "$here/.venv/bin/distrain" ] && exec "$here/.venv/bin/distrain" image "$@"
exec python3 -m entrypoint image "$@"
