#!/usr/bin/env bash
# stop-slurm.sh - (distrain test fixture) stop what start-slurm.sh started (only via its pid files).
# STOP_MUNGE=1 also stops munged if start-slurm.sh started it; PURGE=1 deletes $SLURM_ROOT.
set -uo pipefail
SLURM_ROOT=${SLURM_ROOT:-/tmp/distrain-slurm}
HOSTS_MARK="# fake-slurm-nodes"; [ "$SLURM_ROOT" = /tmp/distrain-slurm ] || HOSTS_MARK="$HOSTS_MARK of $SLURM_ROOT"
export SLURM_CONF=$SLURM_ROOT/etc/slurm.conf
# pid file names a live (non-zombie) process; PID 1 here may reap exited daemons late
ours() { local p; alive "$1" && p=$(cat "$1" 2>/dev/null) && grep -qsE '^slurm(ctld|d)' "/proc/$p/comm"; }
alive() { local p; [ -s "$1" ] && p=$(cat "$1" 2>/dev/null) && [ -r "/proc/$p/status" ] && ! grep -qs '^State:[[:space:]]*Z' "/proc/$p/status"; }

[ -f "$SLURM_CONF" ] && scontrol shutdown >/dev/null 2>&1     # asks slurmctld + all slurmd to exit
for f in "$SLURM_ROOT"/run/slurmd-*.pid "$SLURM_ROOT/run/slurmctld.pid"; do
  [ -e "$f" ] || continue
  for _ in $(seq 1 50); do alive "$f" || break; sleep 0.1; done
  if ours "$f"; then kill "$(cat "$f")" 2>/dev/null; sleep 1; ours "$f" && kill -9 "$(cat "$f")" 2>/dev/null; fi
  rm -f "$f"
done
if [ "${STOP_MUNGE:-0}" = 1 ] && [ -e "$SLURM_ROOT/run/munged.started-by-us" ]; then
  runuser -u munge -- /usr/sbin/munged --stop 2>/dev/null || true
  rm -f "$SLURM_ROOT/run/munged.started-by-us"
fi
for f in slurm.conf gres.conf; do
  [ -L /etc/slurm/$f ] && [ "$(readlink /etc/slurm/$f)" = "$SLURM_ROOT/etc/$f" ] && rm -f /etc/slurm/$f
done
if grep -q "$HOSTS_MARK$" /etc/hosts 2>/dev/null; then
  grep -v "$HOSTS_MARK$" /etc/hosts > "/tmp/.hosts.$$"; cat "/tmp/.hosts.$$" > /etc/hosts; rm -f "/tmp/.hosts.$$"
fi
[ "${PURGE:-0}" = 1 ] && rm -rf "$SLURM_ROOT"
echo "stop-slurm.sh: stopped"
