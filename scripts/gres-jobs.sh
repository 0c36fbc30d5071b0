#!/usr/bin/env bash
# gres-jobs.sh [DIR] - the job files for a site whose Slurm takes GPUs only as --gres=gpu:N (select/cons_res, or a
# submit filter that rejects --gpus-per-task): copies of jobs/*.job in DIR (default: jobs-gres/ in the checkout),
# each `#SBATCH --gpus-per-task=1` replaced by `#SBATCH --gres=gpu:G`, G its --ntasks-per-node (one GPU a task,
# as before). sbatch reads #SBATCH lines before any site file runs, so the header itself must change. The copies
# find the checkout's jobs/lib.sh wherever DIR is; rerun after an upgrade of the checkout.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-$checkout/jobs-gres}
mkdir -p "$target"
for job in "$checkout"/jobs/*.job; do
  name=$(basename "$job")
  tasks=$(sed -n 's/^#SBATCH --ntasks-per-node=\([0-9]*\).*/\1/p' "$job")
  rewrite=()
  if grep -q '^#SBATCH --gpus-per-task=1$' "$job"; then
    [ -n "$tasks" ] || { echo "gres-jobs.sh: error: $name asks --gpus-per-task=1 without --ntasks-per-node" >&2; exit 2; }
    # a comment line of its own: sbatch would read a comment after the option as more arguments
    rewrite=(-e "s|^#SBATCH --gpus-per-task=1\$|# --gres=gpu:N below is --ntasks-per-node: change both together\n#SBATCH --gres=gpu:$tasks|")
  fi  # without it (single.job, mirrored.job ask --gres already) the header is unchanged
  # the copy finds lib.sh in this checkout, not beside itself
  sed "${rewrite[@]}" \
      -e "s|^DISTRAIN_HOME=\${DISTRAIN_HOME:-.*|DISTRAIN_HOME=\${DISTRAIN_HOME:-$checkout}  # written by scripts/gres-jobs.sh|" \
      "$job" > "$target/$name"
done
echo "gres-jobs.sh: $(find "$target" -maxdepth 1 -name '*.job' | wc -l) job files in $target, GPUs as --gres=gpu:N"
