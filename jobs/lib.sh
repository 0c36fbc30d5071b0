# shellcheck shell=bash
# lib.sh - what every distrain job script shares: defaults, site hooks, pre-flight checks, the launch line and
# the requeue-on-preemption rule. Sourced by jobs/*.job; each job only sets its mode and #SBATCH header.
#
# Usage: sbatch [SBATCH OPTIONS] jobs/MODE.job SCRIPT [SCRIPT ARGS]   e.g. sbatch jobs/mwm.job train.py --lr 0.1
#   SCRIPT is relative to the directory you submit from; `bench` runs `distrain bench` with its options. sbatch
#   options on the command line (--nodes, --time, --account, --partition) override the job's #SBATCH header.
#
# Configuration (environment variables, all optional; export them or pass `sbatch --export=ALL,VAR=...`):
#   DISTRAIN_HOME     the distrain checkout holding jobs/ (default: found from the job file's own path)
#   DISTRAIN_SITE     the site's defaults, sourced first (default: $DISTRAIN_HOME/jobs/site.sh, if it exists)
#   DISTRAIN_IMAGE    the .sif image (default: $DISTRAIN_HOME/distrain.sif)
#   USE_CONTAINER     1: srun apptainer run --nv IMAGE (default) | 0: the virtualenv DISTRAIN_VENV
#   DISTRAIN_VENV     virtualenv for USE_CONTAINER=0 (default: $DISTRAIN_HOME/.venv; jobs/venv_build.job makes it)
#   TRAIN_SCRIPT      the training script, instead of the first argument (then every argument is the script's);
#                     without either, the example $DISTRAIN_HOME/examples/train.py
#   DISTRAIN_OUTPUT_DIR  where checkpoints go (default, as distrain's own: $SCRATCH/distrain, $WORK/distrain,
#                     else $SLURM_SUBMIT_DIR/distrain-output, said in the log); bound into the image
#   DISTRAIN_DATA_DIR    a data directory to bind into the image (optional)
#   DISTRAIN_BIND     extra bind paths, comma-separated (apptainer --bind syntax)
#   DISTRAIN_MODULES  modules to load after `module purge` (when `module` exists), e.g. "cuda/12.4 openmpi"
#   DISTRAIN_MPI      Horovod only: srun --mpi plugin (default: pmix if `srun --mpi=list` has it, else pmi2)
#   APPTAINER         the apptainer binary (default: apptainer, else singularity)
#   DISTRAIN_MAX_RESTARTS  restarts of a step that ended in a fault, in the same allocation (default 3; 0: none)
#   DISTRAIN_STOP_LEAD  seconds between the job's stop signal and its kill (default: the job file's STOP_LEAD,
#                     its --signal's @N); set it with `sbatch --signal=B:USR1@N` on the command line
#
# Exit codes (the job's, as sacct shows them): 0 done; 1 the script failed (or its own code); 2 bad input or
# configuration (this file's checks too, before srun); 3 this machine cannot run it (no GPU, no Horovod,
# unwritable directory); 4 a worker died or stalled; 75 stopped after a checkpoint: the same command resumes.

distrain_die() {
  echo "distrain job: error: $*" >&2
  exit 2
}

distrain_defaults() {
  distrain_site
  DISTRAIN_HOME=${DISTRAIN_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
  DISTRAIN_IMAGE=${DISTRAIN_IMAGE:-$DISTRAIN_HOME/distrain.sif}
  USE_CONTAINER=${USE_CONTAINER:-1}
  DISTRAIN_VENV=${DISTRAIN_VENV:-$DISTRAIN_HOME/.venv}
  export DISTRAIN_HOME DISTRAIN_IMAGE USE_CONTAINER DISTRAIN_VENV
  export DISTRAIN_PRINT_PLAN=1   # rank 0 prints its Plan at the top of the job log
  export DISTRAIN_STOP_LEAD=${DISTRAIN_STOP_LEAD:-${STOP_LEAD:-}}  # the job file's: a run warns if a stop needs more
  distrain_output_dir
}

# Site defaults an admin sets once, kept out of the checkout's tracked files (an upgrade keeps them): jobs/site.sh
# (jobs/site.sh.example shows the form: defaults that the user's own environment still overrides).
distrain_site() {
  local site=${DISTRAIN_SITE:-${DISTRAIN_HOME:-.}/jobs/site.sh}
  if [ -r "$site" ]; then
    # shellcheck source=/dev/null
    source "$site" || distrain_die "$site failed: fix it or set DISTRAIN_SITE to another file"
  fi
  return 0
}

# Outputs off $HOME (small quotas), in distrain's own order; the last resort is the submit dir, which every node
# sees (distrain's own last resort, /tmp, is node-local: no good for a multi-node job).
distrain_output_dir() {
  if [ -n "${DISTRAIN_OUTPUT_DIR:-}" ]; then OUTPUT_DIR=$DISTRAIN_OUTPUT_DIR
  elif [ -n "${SCRATCH:-}" ]; then OUTPUT_DIR=$SCRATCH/distrain
  elif [ -n "${WORK:-}" ]; then OUTPUT_DIR=$WORK/distrain
  else
    OUTPUT_DIR=${SLURM_SUBMIT_DIR:-$PWD}/distrain-output
    export DISTRAIN_OUTPUT_DIR=$OUTPUT_DIR
    case "$OUTPUT_DIR/" in
      "${HOME:-/nonexistent}"/*)
        echo "distrain job: warning: outputs go to $OUTPUT_DIR, under \$HOME (small quotas on most clusters): set DISTRAIN_OUTPUT_DIR (or SCRATCH) to a scratch directory" >&2 ;;
      *) echo "distrain job: outputs go to $OUTPUT_DIR, the submit directory's: no DISTRAIN_OUTPUT_DIR, SCRATCH or WORK set" >&2 ;;
    esac
  fi
}

# The script is the first argument (or TRAIN_SCRIPT; else the example), relative to the submit dir; sets
# TRAIN_SCRIPT (absolute) and SCRIPT_ARGS.
distrain_script() {
  SCRIPT_ARGS=("$@")
  if [ -z "${TRAIN_SCRIPT:-}" ]; then
    if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
      TRAIN_SCRIPT=$1
      SCRIPT_ARGS=("${@:2}")
    else
      TRAIN_SCRIPT=$DISTRAIN_HOME/examples/train.py
      echo "distrain job: no script given (sbatch JOB train.py ARGS): training the example $TRAIN_SCRIPT"
    fi
  fi
  if [ "$TRAIN_SCRIPT" != bench ]; then
    case $TRAIN_SCRIPT in /*) ;; *) TRAIN_SCRIPT=${SLURM_SUBMIT_DIR:-$PWD}/$TRAIN_SCRIPT ;; esac
    [ -f "$TRAIN_SCRIPT" ] || distrain_die "training script $TRAIN_SCRIPT not found: give its path relative to the directory you submit from (or absolute)"
  fi
  export TRAIN_SCRIPT
}

# Site hooks the user guides do by hand: modules, XLA's CUDA path.
distrain_site_hooks() {
  if [ -n "${DISTRAIN_MODULES:-}" ]; then
    if command -v module >/dev/null 2>&1 || declare -F module >/dev/null; then
      module purge
      # shellcheck disable=SC2086  # a list of module names
      module load $DISTRAIN_MODULES || distrain_die "module load $DISTRAIN_MODULES failed"
    else
      echo "distrain job: DISTRAIN_MODULES is set but this system has no 'module' command; ignored" >&2
    fi
  fi
  if [ -n "${CUDA_PATH:-}" ]; then
    export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_cuda_data_dir=$CUDA_PATH"
  fi
}

# Fail in seconds, in the job log, instead of after the queue wait and a container start.
distrain_preflight() {
  local mode=$1
  if [ "$USE_CONTAINER" = 1 ]; then
    [ -f "$DISTRAIN_IMAGE" ] || distrain_die "image $DISTRAIN_IMAGE not found: build it (distrain image build) or set DISTRAIN_IMAGE"
    APPTAINER=${APPTAINER:-$(command -v apptainer || command -v singularity || true)}
    [ -n "$APPTAINER" ] || distrain_die "no apptainer/singularity on this node: load its module (DISTRAIN_MODULES) or use USE_CONTAINER=0"
  else
    [ -x "$DISTRAIN_VENV/bin/distrain" ] || distrain_die "no distrain in $DISTRAIN_VENV: run jobs/venv_build.job or set DISTRAIN_VENV"
  fi
  (umask 077 && mkdir -p "$OUTPUT_DIR") 2>/dev/null && [ -w "$OUTPUT_DIR" ] \
    || distrain_die "output directory $OUTPUT_DIR is not writable: set DISTRAIN_OUTPUT_DIR"
  [ -z "${DISTRAIN_DATA_DIR:-}" ] || [ -d "$DISTRAIN_DATA_DIR" ] \
    || distrain_die "DISTRAIN_DATA_DIR=$DISTRAIN_DATA_DIR is not a directory on this node: set it to your data's directory"
  if [ "$mode" = mwm ] || [ "$mode" = horovod ]; then
    # --gres=gpu:G shares a node's G GPUs among its tasks: Horovod needs one task per GPU; MWM takes G/tasks
    # each (one task per node mirrors over all of them). --gpus-per-task=1 gives each task its own.
    local tasks gpus
    tasks=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE%%(*}}
    gpus=${SLURM_GPUS_ON_NODE:-0}
    if [ -z "${SLURM_GPUS_PER_TASK:-}" ] && [ "$gpus" -gt 0 ] && [ -n "$tasks" ]; then
      if [ "$mode" = horovod ] && [ "$tasks" != "$gpus" ]; then
        distrain_die "$tasks tasks per node but $gpus GPUs per node: Horovod runs one task per GPU: make --ntasks-per-node equal to the GPUs per node, or use --gpus-per-task=1"
      elif [ $((gpus % tasks)) != 0 ]; then
        distrain_die "$tasks tasks per node but $gpus GPUs per node: the GPUs must split evenly among the tasks: make the GPUs per node a multiple of --ntasks-per-node, or use --gpus-per-task=1"
      fi
    fi
  fi
  if [ "$mode" = single ] && [ "${SLURM_GPUS_ON_NODE:-0}" -gt 1 ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%%,*}   # one GPU: otherwise XLA spreads over all of them
    export CUDA_VISIBLE_DEVICES
  fi
}

# The command each task runs: the image's runscript, or the venv's distrain. Both take `SCRIPT ARGS` (run) or
# `bench ARGS`.
distrain_task_command() {
  if [ "$USE_CONTAINER" = 1 ]; then
    local bind="$OUTPUT_DIR"
    case $TRAIN_SCRIPT in bench | selftest-worker) ;; *) bind="$bind,$(dirname "$(realpath "$TRAIN_SCRIPT")")" ;; esac
    [ -n "${DISTRAIN_DATA_DIR:-}" ] && bind="$bind,$DISTRAIN_DATA_DIR"
    [ -n "${DISTRAIN_BIND:-}" ] && bind="$bind,$DISTRAIN_BIND"
    TASK_COMMAND=("$APPTAINER" run --nv --bind "$bind" "$DISTRAIN_IMAGE")
  else
    TASK_COMMAND=("$DISTRAIN_VENV/bin/distrain")
  fi
}

distrain_mpi_plugin() {
  if [ -n "${DISTRAIN_MPI:-}" ]; then echo "$DISTRAIN_MPI"; return; fi
  if srun --mpi=list 2>&1 | grep -qw pmix; then echo pmix; else echo pmi2; fi
}

# Forward a signal the batch shell got (--signal=B:USR1@120, scancel --batch, preemption) to the step: srun
# passes it on to every task, whose entrypoint checkpoints and exits 75.
distrain_forward() {
  echo "distrain job: got SIG$1, forwarding it to the training step"
  STOPPED_BY=$1
  [ -n "${STEP_PID:-}" ] && kill -s "$1" "$STEP_PID" 2>/dev/null
  return 0
}

# Run the step in the background so the shell can forward signals. A step that ended in a fault (a worker killed,
# a lost peer: distrain restart-check reads why each worker ended) runs again in this allocation, from the run's
# last checkpoint, up to DISTRAIN_MAX_RESTARTS times (default 3); a step none of whose workers started (a node down)
# and a stop after a checkpoint (exit 75) requeue the job when it may be requeued (--requeue), and it resumes.
distrain_launch() {
  local mode=$1
  shift
  export DISTRAIN_MODE=$mode
  if [ "$mode" = mwm ]; then
    unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY   # gRPC would send MWM traffic to the proxy
  fi
  distrain_task_command
  JOB_INFO=$(scontrol show job "${SLURM_JOB_ID:-none}" 2>/dev/null || true)  # read once: log, time limit, requeue
  distrain_resume_command "$@"
  local srun_args=(--kill-on-bad-exit=1)
  [ "$mode" = horovod ] && srun_args+=("--mpi=$(distrain_mpi_plugin)")
  echo "distrain job: $mode, $SLURM_NTASKS task(s) on ${SLURM_JOB_NODELIST:-?}: srun ${srun_args[*]} ${TASK_COMMAND[*]} $TRAIN_SCRIPT $*"
  local log
  log=$(sed -n 's/^ *StdOut=//p' <<<"$JOB_INFO")
  echo "distrain job: checkpoints: $OUTPUT_DIR/runs/ (one directory per run: the same command resumes it); log: ${log:-stdout}; saved models: where the script saves them (relative paths: ${SLURM_SUBMIT_DIR:-$PWD})"
  trap 'distrain_forward TERM' TERM
  trap 'distrain_forward USR1' USR1
  local rc=0 since verdict answer restarts=0
  while :; do
    since=$(date +%s)
    STOPPED_BY=
    distrain_step "${srun_args[@]}" -- "$@"
    rc=$STEP_RC
    if [ "$rc" = 0 ] || [ "$rc" = 75 ] || [ -n "$STOPPED_BY" ] || [ "$TRAIN_SCRIPT" = bench ]; then break; fi
    verdict=$("${TASK_COMMAND[@]}" restart-check --code "$rc" --since "$since" --killed-first "${STEP_KILLED_FIRST:--1}" "$TRAIN_SCRIPT" "$@" 2>&1) && answer=0 || answer=$?
    [ -n "$verdict" ] && echo "distrain job: $verdict"
    [ "$answer" = 0 ] && restarts=$((restarts + 1)) && continue
    [ "$answer" = 10 ] && distrain_requeue "the step could not start" && rc=75
    break
  done
  if [ "$restarts" -gt 0 ] && [ "$rc" = 0 ]; then echo "distrain job: finished after $restarts restart(s)"; fi
  # a step that ended after a signal this shell forwarded was stopped, whatever its code: a task killed before
  # its stop handler was in place says 128 + the signal, srun may say 1; the run resumes from its last checkpoint
  if [ -n "$STOPPED_BY" ] && [ "$rc" != 0 ] && [ "$rc" != 75 ]; then
    echo "distrain job: the step ended with exit $rc after SIG$STOPPED_BY: taken as a stop (exit 75)"
    rc=75
  fi
  if [ "$rc" = 75 ] && [ -z "${REQUEUED:-}" ]; then
    distrain_requeue "stopped" \
      || echo "distrain job: stopped; to resume, submit it again: $DISTRAIN_RESUME_COMMAND"
  fi
  return "$rc"
}

# The command that submits this job again as it was (its allocation's sbatch options, its job name: the run's
# identity), from the directory it was submitted from: the log's last line after a stop, and `distrain runs`.
distrain_resume_command() {
  local opts=(--nodes="${SLURM_JOB_NUM_NODES:-1}") limit
  [ -n "${SLURM_NTASKS_PER_NODE:-}" ] && opts+=(--ntasks-per-node="$SLURM_NTASKS_PER_NODE")
  [ -z "${SLURM_NTASKS_PER_NODE:-}" ] && opts+=(--ntasks="${SLURM_NTASKS:-1}")
  if [ -n "${SLURM_GPUS_PER_TASK:-}" ]; then opts+=(--gpus-per-task="$SLURM_GPUS_PER_TASK")
  elif [ "${SLURM_GPUS_ON_NODE:-0}" -gt 0 ]; then opts+=(--gres="gpu:$SLURM_GPUS_ON_NODE")
  fi
  [ -n "${SLURM_CPUS_PER_TASK:-}" ] && opts+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
  [ -n "${SLURM_JOB_PARTITION:-}" ] && opts+=(--partition="$SLURM_JOB_PARTITION")
  [ -n "${SLURM_JOB_ACCOUNT:-}" ] && opts+=(--account="$SLURM_JOB_ACCOUNT")
  limit=$(sed -n 's/.*TimeLimit=\([^ ]*\).*/\1/p' <<<"${JOB_INFO:-}")
  [ -n "$limit" ] && [ "$limit" != UNLIMITED ] && opts+=(--time="$limit")
  opts+=(--job-name="${SLURM_JOB_NAME:-distrain}")
  local script=()
  [ "$TRAIN_SCRIPT" = bench ] || script=("$TRAIN_SCRIPT")
  DISTRAIN_RESUME_COMMAND="cd $(printf '%q' "${SLURM_SUBMIT_DIR:-$PWD}") && sbatch$(printf ' %q' "${opts[@]}" "${DISTRAIN_JOB_FILE:-JOB}" "${script[@]}" "$@")"
  export DISTRAIN_RESUME_COMMAND
}

# One srun step in the background, waited for through trapped signals; sets STEP_RC, and STEP_KILLED_FIRST to
# the task srun reported ended by a signal first ("srun: error: n10: task 1: Killed"): the root cause when Slurm's
# KillWait also kills the others before they can record that they lost a peer. srun's errors still reach the log.
distrain_step() {
  local args=() errors
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  errors=$(mktemp "${TMPDIR:-/tmp}/distrain-srun.XXXXXX")
  srun "${args[@]}" "${TASK_COMMAND[@]}" "$TRAIN_SCRIPT" "$@" 2> >(trap '' TERM USR1 INT; tee -a "$errors" >&2) &
  STEP_PID=$!
  while :; do
    wait "$STEP_PID" && STEP_RC=0 || STEP_RC=$?
    kill -0 "$STEP_PID" 2>/dev/null || break   # wait also returns when a trapped signal arrives
  done
  STEP_KILLED_FIRST=$(grep -E '^srun: error: [^:]+: tasks? [0-9]+' "$errors" | grep -v 'Exited with exit code' \
    | sed -E 's/^srun: error: [^:]+: tasks? ([0-9]+).*/\1/' | head -n 1 || true)
  rm -f "$errors"
}

# Requeue this job if it may be (--requeue): it resumes from the run's last checkpoint.
distrain_requeue() {
  grep -qw "Requeue=1" <<<"${JOB_INFO:-}" || return 1
  echo "distrain job: $1; requeueing job $SLURM_JOB_ID to resume"
  REQUEUED=1
  scontrol requeue "$SLURM_JOB_ID"
}

# What every job does, in order.
# A job file run by hand (`bash jobs/mwm.job`) instead of submitted: say so before anything is written.
distrain_require_slurm() {
  [ -n "${SLURM_JOB_ID:-}" ] || distrain_die "this is a Slurm job script: submit it with sbatch (sbatch ${DISTRAIN_JOB_FILE:-jobs/JOB.job} train.py ...); to run without Slurm: distrain run train.py, or distrain launch -n N train.py"
}

distrain_job() {
  local mode=$1
  shift
  distrain_require_slurm
  distrain_defaults
  distrain_script "$@"
  distrain_site_hooks
  distrain_preflight "$mode"
  distrain_launch "$mode" "${SCRIPT_ARGS[@]}"
}

# jobs/selftest.job: the selftest's training in each mode as srun steps over the allocation (each rank writes
# what it saw), then `distrain selftest --from-dir` judges them and checks the environment: a table and a verdict.
distrain_selftest_job() {
  distrain_require_slurm
  distrain_defaults
  TRAIN_SCRIPT=selftest-worker
  distrain_site_hooks
  distrain_preflight mwm
  local dir="$OUTPUT_DIR/selftest-${SLURM_JOB_ID:-local}" mode
  (umask 077 && mkdir -p "$dir")
  distrain_task_command
  export DISTRAIN_CHECKPOINT=0 NCCL_DEBUG=${NCCL_DEBUG:-INFO}
  echo "distrain job: selftest over $SLURM_NTASKS task(s) on ${SLURM_JOB_NODELIST:-?}; step logs in $dir"
  for mode in single mwm horovod; do
    local srun_args=(--kill-on-bad-exit=1)
    [ "$mode" = single ] && srun_args+=(--nodes=1 --ntasks=1)
    [ "$mode" = horovod ] && srun_args+=("--mpi=$(distrain_mpi_plugin)")
    echo "distrain job: selftest step: $mode"
    local start=$SECONDS
    (
      [ "$mode" = mwm ] && unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY
      DISTRAIN_MODE=$mode srun "${srun_args[@]}" "${TASK_COMMAND[@]}" run selftest-worker --out "$dir/$mode"
    ) >"$dir/$mode.log" 2>&1 || echo "distrain job: the $mode step failed (exit $?): see $dir/$mode.log"
    echo $((SECONDS - start)) >"$dir/$mode.seconds"
  done
  "${TASK_COMMAND[@]}" selftest --from-dir "$dir" --json "$dir/selftest.json"
}
