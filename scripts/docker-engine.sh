#!/usr/bin/env bash
# A Docker engine for the container suite: `start` uses one that answers (DOCKER_HOST, else
# /var/run/docker.sock) or else starts Debian's dockerd with its data, sockets and pid file
# under .docker/ (gitignored); `stop` stops only a dockerd this script started, by its pid.
#
#   eval "$(bash scripts/docker-engine.sh start)"   # prints `export DOCKER_HOST=...`, and
#                                                   # DOCKER_ENGINE_STARTED=1 when it started one
#   bash scripts/docker-engine.sh stop
#
# The private engine publishes container ports on 127.0.0.1 unless a port names another
# address (`--ip`), so nothing a test starts listens on all interfaces.
set -euo pipefail
cd "$(dirname "$0")/.."

state="$PWD/.docker"
pidfile="$state/dockerd.pid"
socket="$state/docker.sock"

answers() { docker -H "$1" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start() {
  if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then
    echo "export DOCKER_HOST=$DOCKER_HOST"
    echo "Docker engine at $DOCKER_HOST (not started here)" >&2
    return
  fi
  if [ -S /var/run/docker.sock ] && answers unix:///var/run/docker.sock; then
    echo "export DOCKER_HOST=unix:///var/run/docker.sock"
    echo "Docker engine at /var/run/docker.sock (not started here)" >&2
    return
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "installing docker.io (Debian package)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >&2
  fi
  mkdir -p "$state/data" "$state/run"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && answers "unix://$socket"; then
    echo "export DOCKER_HOST=unix://$socket"
    echo "Docker engine already started here (pid $(cat "$pidfile"))" >&2
    return
  fi
  dockerd --data-root "$state/data" --exec-root "$state/run" --pidfile "$pidfile" \
    -H "unix://$socket" --ip 127.0.0.1 >"$state/dockerd.log" 2>&1 &
  for _ in $(seq 1 120); do
    if answers "unix://$socket"; then
      echo "export DOCKER_HOST=unix://$socket DOCKER_ENGINE_STARTED=1"
      echo "started dockerd $(dockerd --version | sed 's/^Docker version //') (pid $(cat "$pidfile")), data in $state/data" >&2
      return
    fi
    sleep 0.5
  done
  echo "error: dockerd did not answer within 60 s; its log:" >&2
  tail -n 30 "$state/dockerd.log" >&2
  exit 1
}

stop() {
  [ -f "$pidfile" ] || { echo "no dockerd started here" >&2; return; }
  local pid
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "dockerd $pid did not stop in 30 s: SIGKILL" >&2
      kill -9 "$pid"
    fi
    echo "stopped dockerd (pid $pid)" >&2
  fi
  rm -f "$pidfile"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
