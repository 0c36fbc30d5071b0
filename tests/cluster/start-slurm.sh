#!/usr/bin/env bash
# start-slurm.sh - (distrain test fixture) idempotently bring up a real single-machine Slurm "cluster"
# (Debian 12 slurm-wlm 22.05 + munge, no systemd, runs as root) that emulates
# $SLURM_NODES nodes (one slurmd per node, multiple-slurmd build) with fake CPUs
# and fake GPUs (GRES whose File= entries are symlinks to /dev/null).
#
# Usage:  tests/cluster/start-slurm.sh      then: source $SLURM_ROOT/env.sh (the slurm tests do both)
# Adapted from the team's worked example (shared/reference). Tunables (env): SLURM_ROOT SLURM_NODES
#                 SLURM_NODE_FIRST SLURM_CPUS SLURM_GPUS SLURM_MEM SLURM_SELECT
#                 SLURM_PARTITIONS SLURM_NODE_PORT_BASE SLURM_CTLD_PORT SLURM_FIRST_JOB_ID SLURM_LINK_ETC
# A second cluster beside the first (another SLURM_ROOT, nodes, ports and first job id, SLURM_LINK_ETC=0) runs
# alongside it: tests/slurm/test_eight_nodes.py's 8 emulated nodes.
set -euo pipefail

SLURM_ROOT=${SLURM_ROOT:-/tmp/distrain-slurm}
SLURM_NODE_FIRST=${SLURM_NODE_FIRST:-9}     # emulated nodes n9, n10: string order differs from numeric order
SLURM_NODES=${SLURM_NODES:-2}
SLURM_CPUS=${SLURM_CPUS:-8}              # CPUs per node (may exceed real cores)
SLURM_GPUS=${SLURM_GPUS:-4}              # fake GPUs per node (0 = no GRES)
SLURM_MEM=${SLURM_MEM:-128000}           # RealMemory per node in MB (may exceed real RAM)
SLURM_SELECT=${SLURM_SELECT:-select/cons_tres}  # select/cons_res: a site that takes GPUs only as --gres
SLURM_PARTITIONS=${SLURM_PARTITIONS:-"debug gpu"}   # first one is the default
SLURM_NODE_PORT_BASE=${SLURM_NODE_PORT_BASE:-17001}
SLURM_CTLD_PORT=${SLURM_CTLD_PORT:-6817}
SLURM_LINK_ETC=${SLURM_LINK_ETC:-1}      # 1: symlink /etc/slurm/{slurm,gres}.conf so SLURM_CONF is optional
SLURM_MIN_JOB_AGE=${SLURM_MIN_JOB_AGE:-4} # 2..4 => 'sbatch --wait' polls every 2 s (else 2,8,32 s steps)
# job ids of a second cluster apart from the first's: distrain derives MWM ports from the job id (ports.py), and
# both clusters' nodes are this one host
SLURM_FIRST_JOB_ID=${SLURM_FIRST_JOB_ID:-1}
HOSTS_MARK="# fake-slurm-nodes"; [ "$SLURM_ROOT" = /tmp/distrain-slurm ] || HOSTS_MARK="$HOSTS_MARK of $SLURM_ROOT"

[ "$(id -u)" = 0 ] || { echo "start-slurm.sh: must run as root" >&2; exit 1; }
CONF=$SLURM_ROOT/etc/slurm.conf
export SLURM_CONF=$CONF
LAST=$((SLURM_NODE_FIRST + SLURM_NODES - 1))
NODES=(); for i in $(seq "$SLURM_NODE_FIRST" "$LAST"); do NODES+=("n$i"); done
NODELIST="n[$SLURM_NODE_FIRST-$LAST]"; [ "$SLURM_NODES" = 1 ] && NODELIST=n$SLURM_NODE_FIRST
HOST=$(hostname -s)

# ---- 1. packages -------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
                    slurmctld slurmd slurm-client munge; }
  apt_install || { apt-get -o DPkg::Lock::Timeout=600 update -q && apt_install; }
fi

# ---- 2. host names of the emulated nodes (TF's SlurmClusterResolver connects to them)
missing=0; for n in "${NODES[@]}"; do getent hosts "$n" >/dev/null || missing=1; done
if [ $missing = 1 ]; then
  # rewrite in place (no sed -i: /etc/hosts is often a bind mount)
  grep -v "$HOSTS_MARK$" /etc/hosts > "/tmp/.hosts.$$" || true
  echo "127.0.0.1 ${NODES[*]} $HOSTS_MARK" >> "/tmp/.hosts.$$"
  cat "/tmp/.hosts.$$" > /etc/hosts; rm -f "/tmp/.hosts.$$"
fi

# ---- 3. munge (must run as the munge user: as root it rejects the munge-owned key)
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key --force; \
                                   chown munge:munge /etc/munge/munge.key; chmod 0600 /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
  mkdir -p "$SLURM_ROOT/run" && touch "$SLURM_ROOT/run/munged.started-by-us"
  for _ in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# ---- 4. config -----------------------------------------------------------------
mkdir -p "$SLURM_ROOT"/{etc,state,log,run,dev,spool}
for n in "${NODES[@]}"; do mkdir -p "$SLURM_ROOT/spool/$n" "$SLURM_ROOT/tmp/$n"; done
GRES_NODE=""; GRES_TYPES=""
if [ "$SLURM_GPUS" -gt 0 ]; then
  for g in $(seq 0 $((SLURM_GPUS - 1))); do
    # must stat() as a char/block device: with plain files the GRES is counted but slurmd logs
    # "not a valid character or block device" and CUDA_VISIBLE_DEVICES/SLURM_STEP_GPUS stay empty.
    # A symlink to /dev/null works and needs no mknod privilege. Index = trailing number.
    ln -sfn /dev/null "$SLURM_ROOT/dev/nvidia$g"
  done
  GRES_NODE="Gres=gpu:$SLURM_GPUS"; GRES_TYPES="GresTypes=gpu"
fi
PORTS="$SLURM_NODE_PORT_BASE"; [ "$SLURM_NODES" -gt 1 ] && PORTS="[$SLURM_NODE_PORT_BASE-$((SLURM_NODE_PORT_BASE + SLURM_NODES - 1))]"

NEWCONF=$(cat <<EOF
# generated by start-slurm.sh
ClusterName=fake
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job may restart only once its previous credential expired (default 120 s): keep tests quick, with
# 5x the seconds a step's credential takes from slurmctld to slurmd on a busy 2-core VM
AuthInfo=cred_expire=10
SlurmctldPort=$SLURM_CTLD_PORT
FirstJobId=$SLURM_FIRST_JOB_ID
StateSaveLocation=$SLURM_ROOT/state
SlurmdSpoolDir=$SLURM_ROOT/spool/%n
# per-node temp dir: PMIx (srun --mpi=pmix) creates spmix_appdir_<uid>_<job>.<step> there, which would collide
# between emulated nodes sharing one host's /tmp
TmpFS=$SLURM_ROOT/tmp/%n
SlurmctldPidFile=$SLURM_ROOT/run/slurmctld.pid
SlurmdPidFile=$SLURM_ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$SLURM_ROOT/log/slurmctld.log
SlurmdLogFile=$SLURM_ROOT/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=$SLURM_SELECT
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a requeued job becomes eligible when its old credential expires, an event no scheduler pass follows: it would
# wait for the next periodic pass (backfill 30 s, main 60 s by default)
SchedulerParameters=bf_interval=1,sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
KillOnBadExit=1
# a step's tasks get SIGTERM, then SIGKILL this many s later (default 30): a worker Slurm ends after another was
# killed (srun --kill-on-bad-exit under Open MPI) waits it out; distrain's own stops do not (they signal the tasks)
KillWait=10
# finished jobs are purged >= MinJobAge s after the end; <=4 keeps 'sbatch --wait' polling every 2 s
MinJobAge=$SLURM_MIN_JOB_AGE
$GRES_TYPES
NodeName=$NODELIST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$PORTS CPUs=$SLURM_CPUS RealMemory=$SLURM_MEM $GRES_NODE State=UNKNOWN
EOF
)
first=1
for p in $SLURM_PARTITIONS; do
  d=NO; [ $first = 1 ] && d=YES; first=0
  NEWCONF+=$'\n'"PartitionName=$p Nodes=ALL Default=$d MaxTime=INFINITE State=UP"
done
NEWGRES="AutoDetect=off"
[ "$SLURM_GPUS" -gt 0 ] && NEWGRES+=$'\n'"NodeName=$NODELIST Name=gpu File=$SLURM_ROOT/dev/nvidia[0-$((SLURM_GPUS - 1))]"

# ---- 5. already running with this exact config? then nothing to do -------------
# pid file names a live (non-zombie) process; PID 1 here may reap exited daemons late
alive() { local p; [ -s "$1" ] && p=$(cat "$1" 2>/dev/null) && [ -r "/proc/$p/status" ] && ! grep -qs '^State:[[:space:]]*Z' "/proc/$p/status"; }
# ...and that process really is a slurm daemon (guards against stale pid files / pid reuse)
ours() { local p; alive "$1" && p=$(cat "$1" 2>/dev/null) && grep -qsE '^slurm(ctld|d)' "/proc/$p/comm"; }
all_alive() {
  alive "$SLURM_ROOT/run/slurmctld.pid" || return 1
  for n in "${NODES[@]}"; do alive "$SLURM_ROOT/run/slurmd-$n.pid" || return 1; done
}
if [ -f "$CONF" ] && [ "$NEWCONF" = "$(cat "$CONF")" ] && [ "$NEWGRES" = "$(cat "$SLURM_ROOT/etc/gres.conf" 2>/dev/null)" ] \
   && all_alive && scontrol ping 2>/dev/null | grep -q UP; then
  echo "start-slurm.sh: already running ($NODELIST)"; sinfo -o '%P %D %c %G %T %N'; exit 0
fi

# ---- 6. (re)start ----------------------------------------------------------------
# stop leftovers of a previous run (only our own daemons, found via our pid files)
for f in "$SLURM_ROOT"/run/slurmd-*.pid "$SLURM_ROOT/run/slurmctld.pid"; do
  ours "$f" && kill "$(cat "$f")" 2>/dev/null || true
done
for f in "$SLURM_ROOT"/run/slurmd-*.pid "$SLURM_ROOT/run/slurmctld.pid"; do
  for _ in $(seq 1 50); do alive "$f" || break; sleep 0.1; done
  rm -f "$f"
done
printf '%s\n' "$NEWCONF" > "$CONF"
printf '%s\n' "$NEWGRES" > "$SLURM_ROOT/etc/gres.conf"
if [ "$SLURM_LINK_ETC" = 1 ]; then
  mkdir -p /etc/slurm
  for f in slurm.conf gres.conf; do
    if [ ! -e /etc/slurm/$f ] || [ -L /etc/slurm/$f ]; then ln -sfn "$SLURM_ROOT/etc/$f" /etc/slurm/$f; fi
  done
fi
cat > "$SLURM_ROOT/env.sh" <<EOF
export SLURM_CONF=$CONF
EOF

touch "$SLURM_ROOT/run/slurm.started-by-us"
slurmctld -f "$CONF" -c -i            # -c: start with a clean state (no old jobs/nodes)
for n in "${NODES[@]}"; do slurmd -f "$CONF" -N "$n"; done

for _ in $(seq 1 300); do            # up to 30 s
  up=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -cE ' (idle|mixed|allocated)$' || true)
  [ "$up" = "$SLURM_NODES" ] && break
  sleep 0.1
done
if [ "$up" != "$SLURM_NODES" ]; then
  echo "start-slurm.sh: nodes did not become idle" >&2; sinfo -N >&2 || true
  tail -n 20 "$SLURM_ROOT"/log/*.log >&2; exit 1
fi
sinfo -o '%P %D %c %G %T %N'
echo "start-slurm.sh: up. SLURM_CONF=$CONF (source $SLURM_ROOT/env.sh)"
