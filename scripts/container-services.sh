#!/usr/bin/env bash
# container-services.sh - start/stop what the container tests need, idempotently and only what it started:
# Debian's docker.io daemon (no iptables, no bridge: builds and runs use the host network) on its own socket
# and data root, and a local registry (Debian's docker-registry) on 127.0.0.1:5000 for `apptainer pull`.
# Usage: scripts/container-services.sh start|stop|env     (`env` prints DOCKER_HOST=... for the tests)
set -euo pipefail
STATE=${DISTRAIN_CONTAINER_STATE:-/var/lib/distrain-containers}
RUN=/run/distrain-containers
SOCK=$RUN/docker.sock
REGISTRY_ADDR=${DISTRAIN_REGISTRY:-127.0.0.1:5000}
DOCKER=/usr/bin/docker   # Debian's client: another `docker` earlier in PATH may not match this daemon

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$(cat "$1")/status"; }

start() {
  mkdir -p "$STATE/docker" "$STATE/registry" "$RUN"
  if ! alive "$RUN/dockerd.pid"; then
    dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2 \
      --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" -H "unix://$SOCK" \
      >"$RUN/dockerd.log" 2>&1 &
    for _ in $(seq 1 100); do "$DOCKER" -H "unix://$SOCK" info >/dev/null 2>&1 && break; sleep 0.2; done
    "$DOCKER" -H "unix://$SOCK" info >/dev/null 2>&1 || { tail -20 "$RUN/dockerd.log" >&2; exit 1; }
  fi
  if ! alive "$RUN/registry.pid"; then
    cat > "$RUN/registry.yml" <<YML
version: 0.1
storage:
  filesystem:
    rootdirectory: $STATE/registry
http:
  addr: $REGISTRY_ADDR
YML
    docker-registry serve "$RUN/registry.yml" >"$RUN/registry.log" 2>&1 &
    echo $! > "$RUN/registry.pid"
    for _ in $(seq 1 50); do curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
    curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null || { tail -20 "$RUN/registry.log" >&2; exit 1; }
  fi
  echo "container-services.sh: dockerd on $SOCK, registry on $REGISTRY_ADDR"
}

stop() {
  for name in registry dockerd; do
    if alive "$RUN/$name.pid"; then
      kill "$(cat "$RUN/$name.pid")"
      for _ in $(seq 1 50); do alive "$RUN/$name.pid" || break; sleep 0.2; done
    fi
    rm -f "$RUN/$name.pid"
  done
  umount "$RUN/exec/netns/default" 2>/dev/null || true
  echo "container-services.sh: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "DOCKER_HOST=unix://$SOCK" ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
